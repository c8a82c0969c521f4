"""When a per-layer sensitivity scan is worth its time.

Keeping the most sensitive layers in float (mixed precision) only ever trades speed for quality, and choosing
those layers takes a scan of every large layer, which on a detector took 319 of 589 s of search and then went
unused. So the scan runs only where it can change the pick: after the all-int8 version of the same point was
measured and missed the quality budget. Before that, the search measures that all-int8 version instead; where it
met the budget (or failed for a reason float layers do not cure), the mixed-precision point is passed over.

The converse: an all-int8 trial that missed only the quality budget, and not by far, while running faster than
every candidate within it, is the one case where keeping a few layers in float is likely to change the pick. Its
mixed-precision counterpart is measured next (``rescue``) rather than left to the searcher, which is never told of
a peer's miss (NNCF's default int8 on a hand-landmark net: 1.23x faster than the pick at 0.987 cosine, 0.99
allowed, and the 24 trials of that search never proposed NNCF with layers kept in float).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from metainfer.core.engine.evaluate import QUALITY_SCREEN_FACTOR
from metainfer.core.engine.knobs.base import as_int
from metainfer.core.engine.knobs.quantizer import ranking_key
from metainfer.core.engine.search.space import Point, Scalar
from metainfer.core.engine.trial import Trial

KEEP_FLOAT = "keep_float"


@dataclass(frozen=True)
class ScanDecision:
    """``measure``: the point as asked; ``instead``: its all-int8 counterpart (``point``); ``pass_over``: neither."""

    action: Literal["measure", "instead", "pass_over"]
    point: Point
    why: str = ""


def decide(
    point: Point,
    trials: Sequence[Trial],
    scanned_modes: Collection[str],
    max_quality_drop: float,
    allowed: Callable[[Point], bool],
) -> ScanDecision:
    """What to measure for ``point`` given the ``trials`` so far and the modes whose scan was already paid for."""
    kept = point.get(KEEP_FLOAT)
    mode = ranking_key(point)
    if not kept or mode in scanned_modes:
        return ScanDecision("measure", point)
    counterpart = {**point, KEEP_FLOAT: 0}
    if not allowed(counterpart):
        return ScanDecision("measure", point)
    measured = next((t for t in trials if t.point == counterpart), None)
    if measured is None:
        return ScanDecision("instead", counterpart, "its all-int8 version first: a scan pays off only if that misses")
    if measured.metrics is None:
        return ScanDecision("pass_over", point, f"its all-int8 version failed ({measured.error or 'no result'})")
    drop = measured.metrics.quality.drop
    if drop <= max_quality_drop:
        return ScanDecision("pass_over", point, f"its all-int8 version already meets the quality budget ({drop:.4f})")
    return ScanDecision("measure", point)


def rescue(
    trial: Trial,
    leader_p50_ms: float | None,
    band: float,
    max_quality_drop: float,
    kept_counts: Sequence[Scalar],
    allowed: Callable[[Point], bool],
) -> Point | None:
    """The mixed-precision counterpart of ``trial`` (the fewest layers kept in float that the space allows) when
    keeping layers in float could make it the pick, else None: ``trial`` is all-int8, measured, missed the quality
    budget alone and by at most the quality screen's factor, and its median is ahead of ``leader_p50_ms`` (the
    fastest candidate within every constraint) by more than the timing noise ``band``."""
    metrics = trial.metrics
    if metrics is None or trial.point.get(KEEP_FLOAT) or not trial.violations:
        return None
    if not all(v.startswith("quality:") for v in trial.violations):
        return None  # float layers cost speed and memory: they cure only a quality miss
    if metrics.quality.drop > QUALITY_SCREEN_FACTOR * max_quality_drop:
        return None
    if leader_p50_ms is not None and metrics.latency.p50_ms * (1 + band) >= leader_p50_ms:
        return None
    for kept in sorted(as_int(c) for c in kept_counts if as_int(c) > 0):
        counterpart = {**trial.point, KEEP_FLOAT: kept}
        if allowed(counterpart):
            return counterpart
    return None
