"""The search-efficiency benchmark's replay and metrics, on tiny synthetic landscapes.

The benchmark's numbers are only as right as the replay that produces them:
fractions of the optimum, evaluations-to-level, and the rule that every
algorithm sees exactly the cached score of the point it asked for.
"""

from __future__ import annotations

import pytest

from bench import records
from bench import search_replay as sr
from metainfer.core.engine.search import GridSearcher, RandomSearcher
from metainfer.core.engine.search.space import Dimension, Space


def _space() -> Space:
    dims = [Dimension("a", (0, 1, 2, 3)), Dimension("b", ("x", "y", "z"))]
    return Space(dims, constraint=lambda p: not (p["a"] == 3 and p["b"] == "z"))


def _landscape() -> sr.Landscape:
    space = _space()
    scores: dict[tuple[int, ...], float | None] = {}
    for k in space.allowed_keys():
        scores[k] = None if k == (0, 1) else 1.0 + k[0] + 0.5 * k[1]  # optimum 4.5 at (3, 1)
    return sr.Landscape(space, scores)


def test_landscape_must_cover_every_allowed_point() -> None:
    space = _space()
    with pytest.raises(ValueError, match="lacks"):
        sr.Landscape(space, {(0, 0): 1.0})


def test_optimum_is_the_best_feasible_score() -> None:
    assert _landscape().optimum == pytest.approx(4.5)
    assert _landscape().size == 11


def test_fraction_and_evals_to_reach() -> None:
    scores = [None, 2.0, 1.0, 4.8, 5.0]
    assert sr.best_so_far(scores) == [None, 2.0, 2.0, 4.8, 5.0]
    assert list(sr.fraction_curve(scores, 5.0)) == pytest.approx([0.0, 0.4, 0.4, 0.96, 1.0])
    assert sr.fraction_at(scores, 5.0, 3) == pytest.approx(0.4)
    assert sr.evals_to_reach(scores, 5.0, 0.95) == 4
    assert sr.evals_to_reach(scores, 5.0, 0.98) == 5
    assert sr.evals_to_reach(scores[:3], 5.0, 0.95) is None
    # a run that stopped early is padded with its last value
    assert list(sr.fraction_curve(scores[:2], 5.0, length=4)) == pytest.approx([0.0, 0.4, 0.4, 0.4])


def test_median_evals_counts_misses_as_slowest() -> None:
    assert sr.median_evals([3, 5, None]) == 5
    assert sr.median_evals([3, None, None]) is None
    assert sr.median_evals([2, 4]) == 3


def test_replay_tells_cached_scores_and_never_repeats() -> None:
    land = _landscape()
    searcher = RandomSearcher(land.space, seed=1)
    scores = sr.replay(searcher, land, 50)
    assert len(scores) == land.size  # stops when the space is exhausted
    told = {land.space.key(p): s for p, s in searcher.history}
    assert len(told) == land.size
    assert all(land.score(k) == s for k, s in told.items())
    assert sr.fraction_at(scores, land.optimum, land.size) == pytest.approx(1.0)


def test_grid_walks_product_order() -> None:
    land = _landscape()
    scores = sr.replay(GridSearcher(land.space, seed=0), land, 4)
    assert scores == [land.score(k) for k in land.space.allowed_keys()[:4]]


def test_run_seed_reads_budget_free_runs_as_prefixes() -> None:
    land = _landscape()
    run = sr.engine_runner("random")
    one = sr.run_seed("random", run, land, 3, (2, 5))
    full = run(land, 3, 5)
    assert one.fractions[2] == pytest.approx(sr.fraction_at(full, land.optimum, 2))
    assert one.fractions[5] == pytest.approx(sr.fraction_at(full, land.optimum, 5))
    assert one.curve.shape == (5,)
    result = sr.collect("random", [one, sr.run_seed("random", run, land, 4, (2, 5))], 0.0)
    assert result.curves.shape == (2, 5)
    assert set(result.summary()["evals_to"]) == {"0.95", "0.98"}


@pytest.mark.skipif(not sr.optuna_available(), reason="optuna (bench extra) not installed")
def test_tpe_only_spends_evaluations_on_new_allowed_points() -> None:
    land = _landscape()
    scores = sr.tpe_runner()(land, 0, land.size)
    assert len(scores) == land.size  # every allowed point exactly once, none forbidden
    assert sorted((s for s in scores if s is not None), reverse=True)[0] == pytest.approx(land.optimum)


def test_a_saved_summary_reads_back_as_the_same_result() -> None:
    land = _landscape()
    run = sr.engine_runner("random")
    result = sr.collect("random", [sr.run_seed("random", run, land, s, (2, 5)) for s in range(3)], 1.5)
    back = sr.AlgorithmResult.from_summary("random", result.summary())
    assert back.fractions == result.fractions and back.reach == result.reach and back.wall_s == 1.5
    assert back.summary()["median_fraction"] == result.summary()["median_fraction"]


def test_why_lines_explain_each_lost_budget_from_the_landscape() -> None:
    from bench import search_efficiency as se

    land = _landscape()
    # only (3, 1) = 4.5 is within 5 % of the optimum: 5 draws of 11 points include it with probability 5/11
    assert se._chance_of_a_near_optimal_point(land, 5) == (1, pytest.approx(5 / 11))
    assert se._chance_of_a_near_optimal_point(land, 11) == (1, pytest.approx(1.0))
    verdict = {
        "at_least_as_good_met": False,
        "beaten": [
            {"budget": 5, "by": "grid", "hybrid": 0.6, "other": 0.8},
            {"budget": 5, "by": "random", "hybrid": 0.6, "other": 0.7},
        ],
    }
    facts = se.why_facts(land, verdict, baseline_p50_ms=0.05)
    assert facts is not None
    records.WhyBeaten.model_validate(facts)  # what the script saves is what the section is rendered from
    lines = se.why_lines("toy", facts, verdict)
    assert lines[0].startswith("Why the hybrid is beaten on toy: 1 of 11 points lie within 5 % of the optimum")
    (budget_line,) = lines[1:]
    assert budget_line.startswith("- @5: hybrid 0.600 against grid 0.800, random 0.700.")
    assert "first 3 of 5 evaluations are its space-filling design" in budget_line
    assert "grid (seed 0) found" in budget_line and "probability 0.45" in budget_line
    assert se.why_facts(land, {"at_least_as_good_met": True, "beaten": []}, 0.05) is None
    assert se.why_lines("toy", None, {"at_least_as_good_met": True, "beaten": []}) == []


def test_a_landscape_file_replays_without_the_engine() -> None:
    """A landscape file's own dimensions (with a choice nothing allowed) and features rebuild its space."""
    doc = {
        "dimensions": {"quantization": ["fp32", "fp16", "int8_dynamic"], "intra_op_num_threads": [1, 2]},
        "features": {
            "model": {"sha256": "m", "op_counts": {"MatMul": 2}},
            "hardware": {"fingerprint": "h", "peak_gemm_gflops_fp32": 100, "peak_gemm_gflops_int8": 400},
        },
        "points": [
            {"key": [0, 0], "score": 1.0},
            {"key": [0, 1], "score": 1.2},
            {"key": [2, 0], "score": 1.5},
            {"key": [2, 1], "score": None},
        ],
    }
    land = sr.from_document(doc)
    assert land.size == 4 and land.optimum == 1.5
    assert not land.space.is_allowed({"quantization": "fp16", "intra_op_num_threads": 1})
    assert land.prior is not None and land.features is not None
    scores = sr.replay(sr.make_searcher("hybrid", land.space, 0, 4, prior=land.prior), land, 4)
    assert sorted(scores, key=lambda v: -1 if v is None else v) == [None, 1.0, 1.2, 1.5]
    assert scores[0] == 1.5  # the built-in prior's best (int8 on a 4x int8 machine) comes first
