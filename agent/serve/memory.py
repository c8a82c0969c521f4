"""Give freed memory back to the system, so that RSS after a burst returns to its baseline.

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), so after one burst of
large bodies and answers the next ones come from the heap arenas, and freed heap memory stays in the process: one
attack of 50 unread answers left 856 MiB behind. Fixing the threshold keeps every large buffer mmapped (returned
on free), two arenas bound the per-thread fragmentation, and ``trim`` hands back what the heaps still hold once the
server is idle. The same settings as the MALLOC_MMAP_THRESHOLD_ / MALLOC_ARENA_MAX environment variables, applied
in the process so that they hold however ``serve`` is started. A no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("metainfer.serve")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 256 << 10
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


_LIBC = _libc()


def configure() -> bool:
    """Fix the mmap threshold and the arena count; returns whether the allocator took them."""
    if _LIBC is None:
        return False
    ok = bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(_LIBC.mallopt(M_ARENA_MAX, ARENAS))
    if not ok:
        log.warning("the allocator refused mallopt: memory freed after a burst may stay in the process")
    return ok


def trim() -> None:
    """Return the free memory at the top of the heaps to the system (glibc malloc_trim)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
