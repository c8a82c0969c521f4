"""Give freed memory back to the system, so that RSS after a burst returns to its baseline.

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), so after one burst of
large bodies and answers the next ones come from the heap arenas, and freed heap memory stays in the process: one
attack of 50 unread answers left 856 MiB behind. Fixing the threshold keeps every large buffer mmapped (returned
on free), two arenas bound the per-thread fragmentation, and ``trim`` hands back what the heaps still hold once the
server is idle. The same settings as the MALLOC_MMAP_THRESHOLD_ / MALLOC_ARENA_MAX environment variables, applied
in the process so that they hold however ``serve`` is started. A no-op off glibc.

The threshold is 64 KiB, not glibc's initial 128 KiB: gRPC keeps an answer it could not send as many slices of
tens of KiB, and a zero-window connection of 50 unread 2 MiB answers left 100 MiB of heap fragments behind at
256 KiB, 44 MiB at 64 KiB or 32 KiB (measured). Python's own cycles matter too: a call cut for a slow reader ends in
an exception whose traceback holds its answer, and the cyclic collector rarely runs a full pass in a process that
allocates little; before each trim a collection runs, cheap because everything alive at startup is frozen out of
it (``freeze_startup_objects``: 0.01 ms instead of 110 ms), and that alone kept 140 MiB per attack from piling up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("metainfer.serve")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 64 << 10
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


def freeze_startup_objects() -> None:
    """Keep what is alive now (modules, the model, the server) out of every later collection: it lives as long as
    the process, and the collections ``trim`` runs then only look at what serving allocated since."""
    gc.collect()
    gc.freeze()


def trim() -> None:
    """Collect unreachable cycles, then return free memory in the heaps to the system (glibc malloc_trim)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
