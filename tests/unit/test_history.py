"""Trial history across runs: loading reports, similarity, and the warm start it gives the search.

The pipeline tests run the real ``Adaptation`` on the digits model with a measurer whose latency and
quality are pure functions of the recipe, so which points a warm-started search measures, in which
order, never depends on the machine's timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeMeasurer, fixed_profile

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.history import (
    MAX_TRIALS,
    HardwareFeatures,
    HistorySource,
    HistoryTrial,
    ModelFeatures,
    RunFeatures,
    SearchSpec,
    TrialHistory,
    bounded_trials,
    load_reports,
    rank,
    similarity,
    warm_start,
)
from metainfer.core.engine.history_use import MAX_SOURCES
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile.types import HardwareProfile, SupportStatus
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.report import AdaptSettings, Report
from metainfer.core.engine.search import HybridSearcher, builtin_prior
from metainfer.core.engine.search.space import Dimension, Point, Space
from metainfer.core.engine.trial import TrialStatus

Digits = tuple[bytes, ModelInfo, Dataset]
# Float weights: the int4 anchors (core.engine.anchors) would be measured before the history's predicted best.
SMALL = {"keep_float": [0], "execution_mode": ["sequential"], "weight_bits": [0]}


def _fake() -> FakeMeasurer:
    """Latency: int8 dynamic with 2 threads and per-channel scales is the one fast point; fp32 is slow."""

    def latency(recipe: Recipe) -> float:
        q = recipe.transform.quantization
        ms = 2.0 if q.mode == "int8_dynamic" else 3.0 if q.mode == "int8_static" else 4.0
        ms *= 0.8 if q.per_channel else 1.0
        ms *= 0.7 if recipe.session.intra_op_num_threads == 2 else 1.0
        ms *= {"all": 1.0, "extended": 1.1, "basic": 1.3}[recipe.session.graph_optimization_level]
        return ms

    return FakeMeasurer(latency_ms=latency, p95_ratio=1.02, p99_ratio=1.05, runs=50)


def _profile(
    fingerprint: str = "0123456789abcdef", cores: int = 2, int8_status: SupportStatus = "native"
) -> HardwareProfile:
    return fixed_profile(fingerprint, cores, int8_status)


def _adapt(digits: Digits, budget: int, history: TrialHistory | None = None, seed: int = 0) -> Report:
    base, info, data = digits
    settings = AdaptSettings(batch=8, budget_trials=budget, overrides=SMALL, seed=seed)  # type: ignore[arg-type]
    report, _ = Adaptation(base, info, data, _profile(), settings, measurer=_fake(), history=history).run()
    return report


@pytest.fixture(scope="module")
def first_run(digits: Digits, tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, Path]:
    report = _adapt(digits, budget=10)
    root = tmp_path_factory.mktemp("history")
    (root / "class-a" / "run1").mkdir(parents=True)
    (root / "class-a" / "run1" / "report.json").write_text(report.model_dump_json())
    return report, root


# -- loading ------------------------------------------------------------------------------------------------
def test_reports_found_under_a_directory_become_sources(first_run: tuple[Report, Path]) -> None:
    report, root = first_run
    (root / "junk").mkdir(exist_ok=True)
    (root / "junk" / "report.json").write_text(json.dumps({"not": "a report"}))
    sources, skipped = load_reports([root])
    assert len(sources) == 1 and len(skipped) == 1 and "junk" in skipped[0]
    src = sources[0]
    assert src.model.sha256 == report.model.sha256 and src.hardware.fingerprint == report.profile.fingerprint
    assert src.spec.batch == 8 and src.label.endswith("run1/report.json")
    assert [t.point for t in src.trials] == [t.point for t in report.trials]
    assert [t.score for t in src.trials] == [t.score for t in report.trials]
    assert all(t.p50_ms is not None and t.status == TrialStatus.FEASIBLE for t in src.trials)
    assert {t.quality_measure for t in src.trials} == {str(report.baseline.metrics.quality.metric)}
    # the operator carries it as JSON: it round-trips and stays small
    text = TrialHistory(sources=sources).model_dump_json()
    assert TrialHistory.model_validate_json(text) == TrialHistory(sources=sources) and len(text) < 20_000
    with pytest.raises(FileNotFoundError):
        load_reports([root / "nowhere"])


def test_history_is_bounded() -> None:
    trials = [HistoryTrial(point={"q": i}, status=TrialStatus.FEASIBLE, score=float(i)) for i in range(100)]
    trials += [HistoryTrial(point={"q": -i}, status=TrialStatus.FAILED) for i in range(1, 40)]
    kept = bounded_trials(trials)
    assert len(kept) == MAX_TRIALS
    assert max(t.score or 0 for t in kept) == 99 and sum(t.score is None for t in kept) == MAX_TRIALS // 4
    source = HistorySource(model=ModelFeatures(sha256="a"), hardware=HardwareFeatures(fingerprint="b"))
    with pytest.raises(ValueError):
        TrialHistory(sources=[source] * (MAX_SOURCES + 1))
    with pytest.raises(ValueError):
        HistorySource(model=ModelFeatures(sha256="a"), hardware=HardwareFeatures(fingerprint="b"), trials=trials)


# -- similarity ---------------------------------------------------------------------------------------------
MLP = ModelFeatures(sha256="m1", parameters=50_000, size_bytes=200_000, op_counts={"MatMul": 3, "Add": 3, "Relu": 2})
MLP_V2 = MLP.model_copy(update={"sha256": "m2", "parameters": 52_000})
CONVNET = ModelFeatures(sha256="c1", parameters=800, size_bytes=15_000, op_counts={"Conv": 26, "Relu": 26, "Concat": 8})


def _features(model: ModelFeatures, profile: HardwareProfile, batch: int = 8) -> RunFeatures:
    return RunFeatures(model=model, hardware=HardwareFeatures.of(profile), spec=SearchSpec(batch=batch))


def test_similarity_ranks_the_same_model_on_similar_hardware_first() -> None:
    here = _features(MLP, _profile())
    assert similarity(here, here).total == 1.0
    candidates = {
        "same model, 1-core class": _features(MLP, _profile("1111111111111111", cores=1)),
        "updated model, this class": _features(MLP_V2, _profile()),
        "same model, other batch": _features(MLP, _profile(), batch=64),
        "conv net, this class": _features(CONVNET, _profile()),
    }
    sources = [HistorySource(**dict(f), label=label) for label, f in candidates.items()]
    ranked = rank(here, sources)
    assert ranked[-1][0].label == "conv net, this class" and ranked[-1][1].total < 0.2
    assert all(sim.total > 0.5 for _, sim in ranked[:-1])
    assert ranked[0][0].label == "updated model, this class"


# -- warm start in the search --------------------------------------------------------------------------------
def _space() -> Space:
    dims = [
        Dimension("quantization", ("fp32", "int8_dynamic", "int8_static")),
        Dimension("per_channel", (False, True)),
        Dimension("graph_optimization_level", ("all", "extended", "basic")),
        Dimension("intra_op_num_threads", (1, 2)),
    ]
    return Space(dims, lambda p: p["quantization"] != "fp32" or not p["per_channel"])


def _source(features: RunFeatures, trials: dict[tuple[str, bool, str, int], float | None], label: str) -> HistorySource:
    names = ("quantization", "per_channel", "graph_optimization_level", "intra_op_num_threads")
    rows = [
        HistoryTrial(
            point=dict(zip(names, k, strict=True)),
            status=TrialStatus.FEASIBLE if s is not None else TrialStatus.FAILED,
            score=s,
        )
        for k, s in trials.items()
    ]
    return HistorySource(**dict(features), label=label, trials=rows)


WINNER: Point = {
    "quantization": "int8_static",
    "per_channel": True,
    "graph_optimization_level": "extended",
    "intra_op_num_threads": 1,
}
TRIALS = {
    ("fp32", False, "all", 2): 1.0,
    ("int8_dynamic", False, "all", 2): 1.2,
    ("int8_static", True, "extended", 1): 2.0,  # the winner: nowhere near the built-in prior's favourite
    ("int8_static", False, "all", 1): 1.5,
    ("int8_dynamic", True, "basic", 1): None,  # failed there
}


def test_warm_start_measures_the_related_winner_first_and_cold_start_the_prior_best() -> None:
    space, here = _space(), _features(MLP, _profile())
    related = _source(_features(MLP, _profile("1111111111111111", cores=1)), TRIALS, "1-core class")
    prior, use = warm_start(space, here, TrialHistory(sources=[related]))
    assert use.warm and use.first_points == [WINNER] and use.sources[0].label == "1-core class"
    assert HybridSearcher(space, 0, budget=10, prior=prior).ask(1) == [WINNER]
    cold = HybridSearcher(space, 0, budget=10, prior=builtin_prior(space, here.context())).ask(1)[0]
    assert cold["quantization"] == "int8_dynamic" and cold["graph_optimization_level"] == "all"  # defaults + int8
    # an unrelated model's history changes nothing: the cold start's first point, no skipped points
    unrelated = _source(_features(CONVNET, _profile()), TRIALS, "conv net")
    prior_u, use_u = warm_start(space, here, [unrelated])
    assert not use_u.warm and not use_u.sources and use_u.ignored
    assert HybridSearcher(space, 0, budget=10, prior=prior_u).ask(1) == [cold]


def _drive_all(searcher: HybridSearcher, space: Space) -> list[Point]:
    asked = []
    for _ in range(len(space.allowed_keys()) - 1):
        (p,) = searcher.ask(1)
        asked.append(p)
        searcher.tell(p, 1.0)
    return asked


def test_known_failures_are_skipped_unless_the_profile_differs_where_it_matters() -> None:
    space, here = _space(), _features(MLP, _profile())
    failed = {
        "quantization": "int8_dynamic",
        "per_channel": True,
        "graph_optimization_level": "basic",
        "intra_op_num_threads": 1,
    }
    same_ops = _source(_features(MLP, _profile("1111111111111111", cores=1)), TRIALS, "agrees on int8 ops")
    prior, use = warm_start(space, here, [same_ops])
    assert use.skipped_known_failures == 1 and space.key(failed) in prior.avoid
    assert failed not in _drive_all(HybridSearcher(space, 0, budget=30, prior=prior), space)
    # the source ran MatMulInteger only as a fallback: its failure says nothing about this hardware
    other_ops = _source(_features(MLP, _profile("2222222222222222", int8_status="fallback")), TRIALS, "other int8")
    prior2, use2 = warm_start(space, here, [other_ops])
    assert use2.warm and use2.skipped_known_failures == 0 and not prior2.avoid
    # another model's failures are not this model's
    prior3, _ = warm_start(space, here, [_source(_features(MLP_V2, _profile()), TRIALS, "v2")])
    assert not prior3.avoid


def test_a_quality_miss_is_a_known_failure_only_in_the_measure_this_run_uses() -> None:
    """One-number outputs were once scored by cosine: a drop kept then is not a drop in relative L2 now."""
    space, here = _space(), _features(MLP, _profile())
    missed = {"quantization": "int8_dynamic", "per_channel": False, "graph_optimization_level": "all",
              "intra_op_num_threads": 2}  # fmt: skip

    def source(measure: str | None) -> HistorySource:
        trial = HistoryTrial(point=missed, status=TrialStatus.INFEASIBLE, quality_drop=0.5, quality_measure=measure)
        return HistorySource(**dict(_features(MLP, _profile("1111111111111111", cores=1))), label="l", trials=[trial])

    prior, use = warm_start(space, here, [source("cosine_similarity")], "cosine_similarity")
    assert use.skipped_known_failures == 1 and space.key(missed) in prior.avoid
    for kept, now in (("cosine_similarity", "relative_l2_similarity"), (None, "cosine_similarity"),
                      ("user_metric:wer", "user_metric:cer"), ("cosine_similarity", None)):  # fmt: skip
        prior, use = warm_start(space, here, [source(kept)], now)
        assert use.warm and use.skipped_known_failures == 0 and not prior.avoid, (kept, now)


# -- the pipeline ----------------------------------------------------------------------------------------------
def test_no_history_and_an_empty_history_search_alike(digits: Digits) -> None:
    cold = _adapt(digits, budget=6)
    empty = _adapt(digits, budget=6, history=TrialHistory())
    assert [t.point for t in empty.trials] == [t.point for t in cold.trials]
    assert cold.history is None and empty.history is not None and not empty.history.warm


def test_a_warm_run_starts_from_the_winner_says_what_it_used_and_stops_early(
    digits: Digits, first_run: tuple[Report, Path]
) -> None:
    report, root = first_run
    assert report.best is not None
    sources, _ = load_reports([root])
    warm = _adapt(digits, budget=24, history=TrialHistory(sources=sources), seed=1)
    h = warm.history
    assert h is not None and h.warm and [u.label for u in h.sources] == [sources[0].label]
    assert h.trials_used == len(report.trials) and h.sources[0].similarity.total == 1.0
    assert warm.trials[0].point == report.best.point and h.first_points == [report.best.point]
    assert warm.stop_reason.startswith("converged") and len(warm.trials) < 24
    assert h.trials_saved == 24 - len(warm.trials) and h.best_found_at is not None
    assert any("warm start" in note for note in warm.space.notes)
