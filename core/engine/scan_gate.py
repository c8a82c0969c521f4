"""When a per-layer sensitivity scan is worth its time.

Keeping the most sensitive layers in float (mixed precision) only ever trades speed for quality, and choosing
those layers takes a scan of every large layer, which on a detector took 319 of 589 s of search and then went
unused. So the scan runs only where it can change the pick: after the all-int8 version of the same point was
measured and missed the quality budget. Before that, the search measures that all-int8 version instead; where it
met the budget (or failed for a reason float layers do not cure), the mixed-precision point is passed over.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from metainfer.core.engine.knobs.quantizer import ranking_key
from metainfer.core.engine.search.space import Point
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
