"""Where the operator's event-loop thread spends its CPU, from a cProfile of the operator process.

cProfile sees only the thread it runs in: the event loop, which runs kopf (its watch streams, its processing of
every watch event, the indexes), every policy reconcile and the metrics. The API requests' own threads are not in
it; bench/operator_scale.py measures them apart (/proc/<pid>/task). Each function's own time (not cumulative, so
nothing counts twice) is put in the first group whose pattern its file or built-in name matches; the time the loop
sleeps in epoll waiting for the network is left out, so the shares are of the time the loop was busy.
"""

from __future__ import annotations

import pstats
from pathlib import Path

IDLE = "select.epoll"
# (group, substrings of a function's file path, or of a built-in's name); the first match wins.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metainfer planning (core: validate, plan, run keys, slimming)", ("/metainfer/core/", "/main/core/")),
    ("metainfer operator shell (handlers, apply, config, metrics)", ("/metainfer/operator/", "/main/operator/")),
    ("kopf (watch-event processing, indexes, daemons, toggles)", ("/kopf/",)),
    ("pydantic validation and serialisation", ("pydantic",)),
    ("JSON decode and encode", ("/json/", "_json")),
    ("TLS and socket reads (watch streams)", ("_ssl.", "_socket.", "/ssl.py", "/aiohttp/", "/yarl/", "/multidict/")),
    ("asyncio event loop, tasks and locks", ("/asyncio/", "_contextvars", "_asyncio")),
    ("prometheus_client", ("/prometheus_client/",)),
    ("kubernetes client and urllib3", ("/kubernetes/", "/urllib3/")),
    ("logging", ("/logging/",)),
)
OTHER = "other (stdlib, built-ins)"


def group_of(filename: str, function: str) -> str:
    where = function if filename == "~" else filename
    for group, patterns in GROUPS:
        if any(p in where for p in patterns):
            return group
    return OTHER


def summarize(path: Path) -> dict[str, float]:
    """Busy seconds of the profiled thread per group (profiler overhead included), largest first."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]  # a documented attribute without a stub
    busy: dict[str, float] = {}
    for (filename, _line, function), (_cc, _nc, own, _cum, _callers) in stats.items():
        if IDLE in function:
            continue
        group = group_of(filename, function)
        busy[group] = busy.get(group, 0.0) + own
    return dict(sorted(busy.items(), key=lambda kv: -kv[1]))
