"""The sensitivity scan runs only where keeping layers in float can change the pick."""

from __future__ import annotations

from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.scan_gate import decide, rescue
from metainfer.core.engine.trial import LatencyStats, Quality, Trial, TrialMetrics, TrialStatus

MIXED = {"quantization": "int8_static", "keep_float": 2, "threads": 1}
ALL_INT8 = {**MIXED, "keep_float": 0}


def _allowed(point: dict[str, object]) -> bool:
    return True


def test_a_mixed_point_waits_for_its_all_int8_version_and_a_failed_one_is_not_cured_by_float_layers() -> None:
    first = decide(MIXED, [], set(), 0.01, _allowed)
    assert (first.action, first.point) == ("instead", ALL_INT8)
    failed = Trial(index=1, point=ALL_INT8, recipe=Recipe(), status=TrialStatus.FAILED, error="no kernel")
    assert decide(MIXED, [failed], set(), 0.01, _allowed).action == "pass_over"
    assert decide(MIXED, [], {"int8_static"}, 0.01, _allowed).action == "measure", "a scan already paid for is used"
    assert decide(ALL_INT8, [], set(), 0.01, _allowed).action == "measure"
    assert decide(MIXED, [], set(), 0.01, lambda p: False).action == "measure", "no all-int8 version to try"


def _missed(p50_ms: float, drop: float, violations: list[str], point: dict[str, object] = ALL_INT8) -> Trial:
    metrics = TrialMetrics(
        latency=LatencyStats(p50_ms=p50_ms, p95_ms=p50_ms * 1.2, p99_ms=p50_ms * 1.3, mean_ms=p50_ms, runs=50,
                             warmup_runs=5, throughput_per_s=1000 / p50_ms),
        quality=Quality(metric="cosine_similarity", value=1 - drop, reference=1.0, drop=drop, samples=64),
        peak_memory_mib=40.0, model_size_mib=1.0,
    )  # fmt: skip
    return Trial(index=3, point=point, recipe=Recipe(), status=TrialStatus.INFEASIBLE, metrics=metrics,
                 violations=violations)  # fmt: skip


QUALITY_MISS = ["quality: cosine_similarity drop 0.0130 > budget 0.01"]


def test_a_faster_all_int8_trial_that_missed_only_the_quality_budget_gets_its_mixed_version_measured_next() -> None:
    """The hand-landmark net: NNCF's int8 at 2.0 ms and 0.013 drop against the pick's 2.47 ms at 0.01 allowed."""
    hand_landmark = _missed(2.0, 0.013, QUALITY_MISS)
    assert rescue(hand_landmark, 2.47, 0.05, 0.01, (0, 3, 9), _allowed) == {**ALL_INT8, "keep_float": 3}
    only_some = lambda p: p["keep_float"] != 3  # noqa: E731 - the fewest the space allows
    assert rescue(hand_landmark, 2.47, 0.05, 0.01, (0, 3, 9), only_some) == {**ALL_INT8, "keep_float": 9}
    assert rescue(hand_landmark, None, 0.05, 0.01, (0, 3), _allowed) is not None, "no candidate within it yet"


def test_no_rescue_where_float_layers_cannot_change_the_pick() -> None:
    assert rescue(_missed(2.0, 0.013, QUALITY_MISS), 2.05, 0.05, 0.01, (0, 3), _allowed) is None, "within noise"
    assert rescue(_missed(2.0, 0.025, QUALITY_MISS), 2.47, 0.05, 0.01, (0, 3), _allowed) is None, "missed by far"
    slow = ["latency: p95 9.00 ms > SLO 5 ms", *QUALITY_MISS]
    assert rescue(_missed(2.0, 0.013, slow), 2.47, 0.05, 0.01, (0, 3), _allowed) is None, "float costs speed"
    assert rescue(_missed(2.0, 0.005, []), 2.47, 0.05, 0.01, (0, 3), _allowed) is None, "it met the budget"
    assert rescue(_missed(2.0, 0.013, QUALITY_MISS, MIXED), 2.47, 0.05, 0.01, (0, 3), _allowed) is None
    assert rescue(_missed(2.0, 0.013, QUALITY_MISS), 2.47, 0.05, 0.01, (0,), _allowed) is None, "no float layers"
    failed = Trial(index=1, point=ALL_INT8, recipe=Recipe(), status=TrialStatus.FAILED, error="no kernel")
    assert rescue(failed, 2.47, 0.05, 0.01, (0, 3), _allowed) is None
