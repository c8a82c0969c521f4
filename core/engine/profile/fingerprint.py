"""The local machine's inference-relevant identity and its stable fingerprint.

A profile is reusable on every machine with the same fingerprint, so the hash
covers exactly what changes kernels or their speed class: CPU model, the ISA
features ONNX Runtime dispatches on, usable cores, arch, ORT version and the
available providers. Memory size, hostname and clock jitter are left out, so
the same machine (or an identical node) always gets the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import psutil

from metainfer.core.engine.profile.types import MachineInfo

# Linux /proc/cpuinfo names -> canonical names. x86 names are kept as they are;
# ARM "Features" use other words for the same ideas (asimd is NEON, asimddp dotprod).
_X86_FLAGS = frozenset(
    {
        "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
        "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16",
        "avx_vnni", "avx_vnni_int8", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16",
    }
)  # fmt: skip
_ARM_FLAGS = {
    "asimd": "neon",
    "asimddp": "dotprod",
    "asimdhp": "fp16",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "sme": "sme",
}
_ARCH = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """First value of each key in /proc/cpuinfo; empty where there is none (macOS, Windows)."""
    info: dict[str, str] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info.setdefault(key.strip(), value.strip())
    return info


def relevant_flags(raw: str) -> list[str]:
    """The inference-relevant subset of a raw flag string, canonical names, sorted."""
    out = set()
    for flag in raw.lower().split():
        if flag in _X86_FLAGS:
            out.add(flag)
        elif flag in _ARM_FLAGS:
            out.add(_ARM_FLAGS[flag])
    return sorted(out)


def _cpu_model(info: dict[str, str]) -> str:
    model = info.get("model name") or info.get("Model") or ""
    if not model and "CPU implementer" in info:  # ARM: no marketing name, use the part ids
        model = f"arm-{info['CPU implementer']}-{info.get('CPU part', '?')}"
    return (model or platform.processor() or "unknown")[:128]


def cpu_identity() -> str:
    """The CPU's model and inference-relevant instruction sets, as one line (what compiled kernels depend on)."""
    info = _cpuinfo()
    return f"{_cpu_model(info)}; {' '.join(relevant_flags(info.get('flags') or info.get('Features') or ''))}"


def affinity_cores() -> int:
    """Cores this process may run on (its CPU affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def usable_cores() -> int:
    """Cores this process may use: its CPU affinity, further bounded by a cgroup CPU quota (a container's
    limits.cpu), which the affinity mask does not show. A pod limited to 1 CPU on a 2-core node sees both cores
    in its mask; timing 2-thread candidates there measures CFS throttling, not the recipe (found on a real node)."""
    cores = affinity_cores()
    quota = cgroup_cpu_quota()
    return max(1, min(cores, int(quota))) if quota else cores


def cgroup_cpu_quota() -> float | None:
    """The CPU quota of this process's cgroup in cores (v2 ``cpu.max``, else v1 ``cfs_quota_us``); None: none."""
    try:  # cgroup v2: "max 100000" or "200000 100000"
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def detect_machine() -> MachineInfo:
    """Read the machine's identity from the OS and ONNX Runtime (no benchmarking)."""
    import onnxruntime as ort  # here, not at the top: the operator imports this package and never profiles

    info = _cpuinfo()
    arch = platform.machine().lower()
    logical = usable_cores()
    return MachineInfo(
        cpu_model=_cpu_model(info),
        arch=_ARCH.get(arch, arch),
        logical_cores=logical,
        physical_cores=min(psutil.cpu_count(logical=False) or logical, logical),
        cpu_flags=relevant_flags(info.get("flags") or info.get("Features") or ""),
        total_memory_bytes=psutil.virtual_memory().total,
        onnxruntime_version=ort.__version__,
        execution_providers=list(ort.get_available_providers()),
    )


def fingerprint(machine: MachineInfo) -> str:
    """16 hex digits of sha256 over the identity fields (order-insensitive lists)."""
    identity = {
        "cpu_model": machine.cpu_model,
        "arch": machine.arch,
        "cpu_flags": sorted(machine.cpu_flags),
        "logical_cores": machine.logical_cores,
        "onnxruntime_version": machine.onnxruntime_version,
        "execution_providers": sorted(machine.execution_providers),
    }
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
