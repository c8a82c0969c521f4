"""Run the single-op probes and the peak benchmarks on real ONNX Runtime sessions.

Where a node ran comes from ORT's own profiler: each node event carries the
``provider`` it was executed on, which is the documented way to see CPU
fallback. On the CPU EP the "fallback" is emulation: for a dtype without a
kernel ORT's InsertCastTransformer wraps the node in Casts named
``InsertedPrecisionFreeCast_*`` and runs it in fp32, which is slower than
native fp32, so the search must not mistake it for fp16 support.

Probe latency is the median over timed runs of the summed kernel times of one
run (from the same profile), so Python call overhead does not drown small ops.
Peak numbers are wall-clock best-of-N with bound, pre-allocated outputs.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from metainfer.core.engine.profile.opcases import OpCase
from metainfer.core.engine.profile.opmodels import Built, add_model, gemm_model
from metainfer.core.engine.profile.types import CPU_PROVIDER, BenchConfig, Dtype, OpSupport, SupportStatus

INSERTED_CAST_PREFIX = "InsertedPrecisionFreeCast_"
# EPs that do not compute locally (Azure forwards requests to a remote endpoint):
# there is nothing on this machine to measure.
NON_COMPUTE_PROVIDERS = frozenset({"AzureExecutionProvider"})


def compute_providers(available: list[str], wanted: list[str] | None = None) -> list[str]:
    """The EPs to profile, in ORT's priority order; CPU is always there."""
    chosen = [p for p in available if p not in NON_COMPUTE_PROVIDERS and (wanted is None or p in wanted)]
    return chosen or [CPU_PROVIDER]


def session_options(config: BenchConfig, profile_prefix: Path | None = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 4  # failures are results here, not log noise
    so.intra_op_num_threads = config.intra_op_num_threads
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    return so


def make_session(built: Built, provider: str, so: ort.SessionOptions) -> ort.InferenceSession:
    providers = [provider] if provider == CPU_PROVIDER else [provider, CPU_PROVIDER]
    return ort.InferenceSession(built[0].SerializeToString(), so, providers=providers)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def probe(case: OpCase, provider: str, config: BenchConfig, workdir: Path, rng: np.random.Generator) -> OpSupport:
    """Classify and time one op case on one provider."""
    base: dict[str, Any] = {"op_type": case.op_type, "dtype": case.dtype, "variant": case.variant, "provider": provider}
    built = case.build(rng)
    prefix = workdir / f"{case.op_type}_{case.dtype}_{case.variant}_{provider}"
    try:
        sess = make_session(built, provider, session_options(config, prefix))
    except Exception as exc:  # any ORT failure to load is the finding
        return OpSupport(**base, status="unsupported", detail=first_line(exc))
    error = None
    try:
        for _ in range(config.op_warmup + config.op_runs):
            sess.run(None, built[1])
    except Exception as exc:  # loads but cannot run (e.g. a kernel rejects the shapes)
        error = first_line(exc)
    events = _read_events(Path(sess.end_profiling()))
    if error is not None:
        return OpSupport(**base, status="unsupported", detail=error)
    status, detail = classify(events, case.op_type, case.dtype, provider)
    runs = kernel_us_per_run(events, skip=config.op_warmup)
    latency, best = (statistics.median(runs), min(runs)) if runs else (None, None)
    return OpSupport(**base, status=status, latency_us=latency, best_us=best, detail=detail)


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
    return data if isinstance(data, list) else data.get("traceEvents", [])


def _kernels(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]


def classify(events: list[dict[str, Any]], op_type: str, dtype: str, provider: str) -> tuple[SupportStatus, str | None]:
    """native/fallback from the executed nodes' providers and inserted precision Casts."""
    kernels = _kernels(events)
    ran = sorted({str(k.get("args", {}).get("op_name", "?")) for k in kernels})
    off_ep = sorted(
        {
            str(k["args"].get("op_name", "?"))
            for k in kernels
            if k.get("args", {}).get("provider", provider) != provider
            and not str(k["args"].get("op_name", "")).startswith("Memcpy")
        }
    )
    shape = "" if op_type in ran else f"; ran as {', '.join(ran)}"
    if provider != CPU_PROVIDER and off_ep:
        return "fallback", f"placed on {CPU_PROVIDER}: {', '.join(off_ep)}{shape}"[:300]
    if any(str(k.get("name", "")).startswith(INSERTED_CAST_PREFIX) for k in kernels):
        return "fallback", f"no {dtype} kernel: ORT runs it in fp32 between inserted Casts{shape}"[:300]
    return "native", (shape[2:] or None)


def kernel_us_per_run(events: list[dict[str, Any]], skip: int) -> list[float]:
    """Summed kernel durations (µs) inside each ``model_run`` event, after ``skip`` warm-up runs."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run" and "dur" in e)
    kernels = [(k["ts"], k["dur"]) for k in _kernels(events) if "dur" in k]
    return [float(sum(d for ts, d in kernels if start <= ts <= end)) for start, end in runs[skip:]]


def best_seconds(built: Built, config: BenchConfig, repeats: int, min_seconds: float = 0.0) -> float:
    """Best wall time of ``repeats`` runs (and of ``min_seconds`` of runs) after one warm-up, outputs bound."""
    sess = make_session(built, CPU_PROVIDER, session_options(config))
    binding = sess.io_binding()
    for name, value in built[1].items():
        binding.bind_cpu_input(name, value)
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cpu")
    sess.run_with_iobinding(binding)  # warm-up: allocates the output once, packs weights
    outputs = binding.get_outputs()
    for out, value in zip(sess.get_outputs(), outputs, strict=True):
        binding.bind_ortvalue_output(out.name, value)
    best = float("inf")
    runs, began = 0, time.perf_counter()
    while runs < repeats or time.perf_counter() - began < min_seconds:
        start = time.perf_counter()
        sess.run_with_iobinding(binding)
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best


def peak_gemm_gflops(config: BenchConfig, dtype: Dtype, rng: np.random.Generator) -> float:
    """2 n^3 operations over the best time of an n^3 GEMM (fp32 MatMul or u8s8 MatMulInteger)."""
    n = config.gemm_n
    built = gemm_model(n, dtype, rng)
    seconds = best_seconds(built, config, config.gemm_repeats, config.gemm_min_seconds)
    return 2.0 * n**3 / seconds / 1e9


def memory_bandwidth_gbps(config: BenchConfig, rng: np.random.Generator) -> float:
    """Bytes moved by an fp32 Add of two large tensors (read x, read z, write y) over the best time."""
    elements = config.bandwidth_mib * (1 << 20) // 4
    seconds = best_seconds(add_model(elements, rng), config, config.bandwidth_repeats)
    return 3 * elements * 4 / seconds / 1e9
