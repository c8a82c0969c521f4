"""Keeping the build caches under ~/.cache/metainfer within a disk budget.

The image build caches a RUN layer (its tar and its unpacked tree) per lock, and a wheelhouse per lock: every
dependency change adds gigabytes, and a week's worth of commits filled a CI machine's disk (ENOSPC in pytest's
own capture files). What no build used lately is evicted least recently used first, until the cache fits its budget
and the filesystem keeps a floor of free space for the run that follows (a node cluster and its registry take
about 15 GiB of the temporary directory).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
HOT_S = 3600.0


@dataclass(frozen=True)
class CacheEntry:
    """One evictable unit: the paths that go together (a layer's tar and tree), its bytes and its last use."""

    paths: tuple[Path, ...]
    size_bytes: int
    last_used: float


def tree_bytes(path: Path) -> int:
    """Bytes a file or a directory tree takes (files counted once by inode; links not followed)."""
    if not path.exists() and not path.is_symlink():
        return 0
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            stat = os.lstat(os.path.join(root, name))
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
    return total


def entry(paths: Iterable[Path]) -> CacheEntry:
    existing = tuple(path for path in paths if path.exists() or path.is_symlink())
    last_used = max((path.lstat().st_mtime for path in existing), default=0.0)
    return CacheEntry(existing, sum(tree_bytes(path) for path in existing), last_used)


def to_evict(
    entries: list[CacheEntry], keep: set[Path], budget_bytes: int, free_bytes: int, min_free_bytes: int,
    max_age_s: float, now: float, hot_s: float = HOT_S,
) -> list[CacheEntry]:  # fmt: skip
    """The entries to delete: any not kept and unused for ``max_age_s``; then, least recently used first, until
    the kept and remaining entries fit ``budget_bytes`` and the filesystem has ``min_free_bytes`` free. The floor
    spares what was used within ``hot_s`` (the other flavours this same run built: evicting them would only make
    the next build redo them)."""
    evictable = sorted((e for e in entries if not keep.intersection(e.paths)), key=lambda e: e.last_used)
    total = sum(e.size_bytes for e in entries)
    evicted: list[CacheEntry] = []
    for candidate in evictable:
        idle = now - candidate.last_used
        short_of_space = free_bytes < min_free_bytes and idle > hot_s
        if idle > max_age_s or total > budget_bytes or short_of_space:
            evicted.append(candidate)
            total -= candidate.size_bytes
            free_bytes += candidate.size_bytes
    return evicted


def free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def evict(
    entries: list[CacheEntry], keep: set[Path], *, budget_bytes: int, min_free_bytes: int, max_age_s: float,
    log: Callable[[str], None] = print,
) -> int:  # fmt: skip
    """Delete what ``to_evict`` picks; returns the bytes freed."""
    if not entries:
        return 0
    where = entries[0].paths[0].parent if entries[0].paths else Path.home()
    chosen = to_evict(entries, keep, budget_bytes, free_bytes(where), min_free_bytes, max_age_s, time.time())
    for victim in chosen:
        for path in victim.paths:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    freed = sum(victim.size_bytes for victim in chosen)
    if chosen:
        log(f"evicted {len(chosen)} cache entries no build used lately ({freed / GIB:.1f} GiB) under {where}")
    return freed
