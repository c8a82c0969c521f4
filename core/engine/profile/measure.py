"""Measure a full HardwareProfile of this machine: op matrix, peak GEMM, bandwidth.

Everything is seeded, sized by a ``BenchConfig`` and reported step by step
through ``on_step`` so the CLI can draw a progress bar; nothing here prints.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from metainfer.core.engine.profile import microbench
from metainfer.core.engine.profile.fingerprint import detect_machine, fingerprint
from metainfer.core.engine.profile.opcases import op_cases
from metainfer.core.engine.profile.types import (
    CPU_PROVIDER,
    BenchConfig,
    HardwareProfile,
    OpenVinoAvailability,
    OpSupport,
    UnusableProvider,
)
from metainfer.core.engine.runtime import provider_usability
from metainfer.core.engine.runtime_openvino import openvino_devices, openvino_version

OnStep = Callable[[int, int, str], None]


def measure_profile(config: BenchConfig | None = None, on_step: OnStep | None = None) -> HardwareProfile:
    """Benchmark this machine with ``config`` (defaults: the full matrix, ~30 s on 2 cores)."""
    config = config or BenchConfig()
    started = time.perf_counter()
    machine = detect_machine()
    usability = provider_usability(microbench.compute_providers(machine.execution_providers, config.providers))
    # An EP that falls back to the CPU would profile the CPU under its name (core.engine.runtime).
    providers = [p for p, problem in usability.items() if problem is None] or [CPU_PROVIDER]
    unusable = [UnusableProvider(provider=p, reason=why) for p, why in usability.items() if why is not None]
    cases = [c for c in op_cases() if config.op_types is None or c.op_type in config.op_types]
    total = len(cases) * len(providers) + 3
    done = 0

    def step(label: str) -> None:
        nonlocal done
        done += 1
        if on_step is not None:
            on_step(done, total, label)

    ops: list[OpSupport] = []
    with tempfile.TemporaryDirectory(prefix="metainfer-profile-") as tmp:
        for provider in providers:
            for case in cases:
                # one generator per probe: results do not depend on which probes ran before
                rng = np.random.default_rng(config.seed)
                ops.append(microbench.probe(case, provider, config, Path(tmp), rng))
                step(f"{case.op_type} {case.dtype}{' ' + case.variant if case.variant else ''} on {provider}")
    fp32 = microbench.peak_gemm_gflops(config, "fp32", np.random.default_rng(config.seed))
    step("peak GEMM fp32")
    int8 = microbench.peak_gemm_gflops(config, "int8", np.random.default_rng(config.seed))
    step("peak GEMM int8")
    bandwidth = microbench.memory_bandwidth_gbps(config, np.random.default_rng(config.seed))
    step("memory bandwidth")
    return HardwareProfile(
        fingerprint=fingerprint(machine),
        machine=machine,
        config=config,
        providers_profiled=providers,
        unusable_providers=unusable,
        openvino=probe_openvino(),
        ops=ops,
        peak_gemm_gflops_fp32=fp32,
        peak_gemm_gflops_int8=int8,
        memory_bandwidth_gbps=bandwidth,
        measured_at=datetime.now(UTC),
        duration_s=time.perf_counter() - started,
    )


def probe_openvino() -> OpenVinoAvailability:
    """Whether OpenVINO is installed and its CPU device compiles and runs a one-op model (milliseconds)."""
    version = openvino_version()
    if version is None:
        return OpenVinoAvailability(unusable_reason="OpenVINO is not installed in this image")
    devices, problem = openvino_devices()
    return OpenVinoAvailability(
        version=version[:64],
        devices=[d[:64] for d in devices[:16]],
        unusable_reason=problem[:600] if problem else None,
    )
