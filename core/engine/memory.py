"""Peak resident memory of a block of work, measured by the kernel.

Linux keeps a high-water mark of resident memory (VmHWM) that writing "5" to
/proc/self/clear_refs resets, so the peak of one trial can be measured without
sampling threads. Elsewhere we fall back to the RSS growth seen at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


class PeakMemory:
    mib: float = 0.0


def _vm_hwm_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@contextmanager
def track_peak_memory() -> Iterator[PeakMemory]:
    """Yield an object whose ``mib`` is, after the block, the peak RSS growth in MiB."""
    result = PeakMemory()
    process = psutil.Process()
    baseline = process.memory_info().rss
    hwm_ok = _reset_hwm()
    try:
        yield result
    finally:
        peak = _vm_hwm_bytes() if hwm_ok else None
        if peak is None:
            peak = process.memory_info().rss
        result.mib = max(0.0, (peak - baseline) / (1 << 20))
