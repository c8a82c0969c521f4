"""The final race: which rivals race the search's winner, and how the race re-ranks them."""

from __future__ import annotations

from typing import Any

from fakes import FakeMeasurer

from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runoff import family, kind, race_order, rivals
from metainfer.core.engine.scoring import Constraints, Objective, rank, score, violations
from metainfer.core.engine.trial import LatencyStats, Quality, Trial, TrialMetrics, TrialStatus

OBJECTIVE = Objective()
BAND = 0.02


def _stats(ms: float) -> LatencyStats:
    return FakeMeasurer(latency_ms=lambda r: ms).stats(ms, 1)


def _metrics(ms: float, drop: float = 0.0) -> TrialMetrics:
    quality = Quality(metric="cosine_similarity", value=1.0 - drop, reference=1.0, drop=drop, samples=8)
    return TrialMetrics(latency=_stats(ms), quality=quality, peak_memory_mib=100.0, model_size_mib=1.0)


BASELINE = _metrics(10.0)


def _recipe(mode: str = "fp32", runtime: str = "onnxruntime", threads: int = 0, **openvino: Any) -> Recipe:
    return Recipe.model_validate(
        {
            "transform": {"quantization": {"mode": mode}},
            "session": {"runtime": runtime, "intra_op_num_threads": threads, "openvino": openvino},
        }
    )


def _trial(index: int, recipe: Recipe, ms: float, drop: float = 0.0, budget: float = 0.01) -> Trial:
    metrics = _metrics(ms, drop)
    missed = violations(metrics, Constraints(max_quality_drop=budget))
    return Trial(
        index=index,
        point={},
        recipe=recipe,
        status=TrialStatus.INFEASIBLE if missed else TrialStatus.FEASIBLE,
        metrics=metrics,
        score=None if missed else score(metrics, BASELINE, OBJECTIVE),
        violations=missed,
    )


def test_kinds_tell_runtime_numeric_format_and_openvino_precision_apart_but_not_threads() -> None:
    assert kind(_recipe("int8_dynamic", threads=1)) == kind(_recipe("int8_dynamic", threads=2))
    assert kind(_recipe("int8_dynamic")) != kind(_recipe("fp32"))
    assert kind(_recipe(runtime="openvino")) != kind(_recipe())
    assert kind(_recipe(runtime="openvino", inference_precision="bf16")) != kind(_recipe(runtime="openvino"))


def test_rivals_are_the_best_of_each_other_kind_within_the_margin_then_the_winner_s_runner_up() -> None:
    winner = _trial(1, _recipe("int8_dynamic", threads=2), 5.0)
    same_kind = _trial(2, _recipe("int8_dynamic", threads=1), 5.1)
    openvino_best = _trial(3, _recipe(runtime="openvino"), 5.5)
    openvino_slower = _trial(4, _recipe(runtime="openvino", threads=1), 5.8)
    too_slow = _trial(5, _recipe("fp32", threads=2), 7.0)  # 1.43x behind: slower, not mis-measured
    lossy = _trial(6, _recipe("int8_static"), 4.0, drop=0.2)  # over the quality budget: never raced
    trials = [winner, same_kind, openvino_best, openvino_slower, too_slow, lossy]
    ranked = rank(trials, BASELINE, OBJECTIVE, BAND)
    assert ranked[0] is winner
    assert rivals(ranked, winner, BASELINE, OBJECTIVE) == [openvino_best, same_kind]
    assert rivals(ranked, winner, BASELINE, OBJECTIVE, margin=0.5) == [openvino_best, too_slow, same_kind]
    assert rivals(ranked, winner, BASELINE, OBJECTIVE, margin=0.5, limit=1) == [openvino_best]
    alone = [winner, _trial(7, _recipe("int8_dynamic", threads=1), 7.0), too_slow]
    assert rivals(rank(alone, BASELINE, OBJECTIVE, BAND), winner, BASELINE, OBJECTIVE) == []


def test_each_other_runtime_and_compute_precision_gets_a_seat_within_twice_the_winner_s_time() -> None:
    # PP-OCRv4's detector: the search timed OpenVINO bf16 1.5x behind ONNX Runtime FP32 in a sitting where,
    # minutes later and back to back, it ran 1.5x ahead; a same-runtime rival that far behind is slower.
    winner = _trial(1, _recipe("fp32", threads=2), 20.2)
    ort_int8 = _trial(2, _recipe("int8_dynamic", threads=2), 20.1)
    ov_f32 = _trial(3, _recipe(runtime="openvino"), 20.7)
    ov_bf16 = _trial(4, _recipe(runtime="openvino", inference_precision="bf16"), 30.0)
    ov_bf16_slower = _trial(5, _recipe(runtime="openvino", inference_precision="bf16", threads=1), 31.0)
    ort_fp16 = _trial(6, _recipe("fp16"), 30.0)
    ov_int8_far = _trial(7, _recipe("int8_static", runtime="openvino"), 41.0)  # over 2x: slower on any sitting
    trials = [winner, ort_int8, ov_f32, ov_bf16, ov_bf16_slower, ort_fp16, ov_int8_far]
    ranked = rank(trials, BASELINE, OBJECTIVE, BAND)
    assert rivals(ranked, winner, BASELINE, OBJECTIVE) == [ort_int8, ov_f32, ov_bf16]
    assert rivals(ranked, winner, BASELINE, OBJECTIVE, cross_runtime_margin=0.25) == [ort_int8, ov_f32]
    assert family(_recipe("int8_static", runtime="openvino", inference_precision="bf16")) == ("openvino", "int8")
    assert family(_recipe("int8_dynamic")) == family(_recipe("int8_static")) == ("onnxruntime", "int8")


def test_the_race_reranks_on_its_own_timings_and_drops_an_entrant_it_puts_over_the_slo() -> None:
    winner = _trial(1, _recipe("int8_dynamic"), 5.0)
    rival = _trial(2, _recipe(runtime="openvino"), 5.5)
    other = _trial(3, _recipe(runtime="openvino", inference_precision="bf16"), 6.0)
    race = [(winner, _stats(5.0)), (rival, _stats(4.0)), (other, _stats(4.5))]
    assert race_order(race, BASELINE, OBJECTIVE, Constraints(), BAND) == [1, 2, 0]
    # p95 is 1.2x the median: 4.0 ms runs at 4.8 ms p95, over a 4.9 ms SLO only for the 4.5 and 5.0 ms entrants.
    assert race_order(race, BASELINE, OBJECTIVE, Constraints(slo_p95_ms=4.9), BAND) == [1]
    # Within the noise band the search's quality decides, as in the search's own ranking.
    tied = [(winner, _stats(5.0)), (_trial(2, _recipe(runtime="openvino"), 5.5, drop=0.005), _stats(4.95))]
    assert race_order(tied, BASELINE, OBJECTIVE, Constraints(), BAND) == [0, 1]
