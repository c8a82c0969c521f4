"""Search algorithms: allowed and unique proposals, exhaustion, determinism,
resume, surrogate ranking, and the hybrid beating random on a realistic landscape."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics

import numpy as np
import pytest

from metainfer.core.engine.search import (
    ALGORITHMS,
    Dimension,
    HybridSearcher,
    SearchContext,
    Searcher,
    Space,
    Surrogate,
    builtin_prior,
    make_searcher,
)

QUANT = ("fp32", "fp16", "int8_dynamic", "int8_static", "mixed")
FAST = {"hybrid": {"budget": 12}}  # keeps the fine (Bayesian) phase short in unit tests


def ort_space(threads: tuple[int, ...] = (1, 2, 4, 0)) -> Space:
    """The shape of the engine's space: per_channel only makes sense for int8 modes."""
    dims = [
        Dimension("quantization", QUANT),
        Dimension("per_channel", (False, True)),
        Dimension("graph_opt", ("disable", "basic", "extended", "all")),
        Dimension("threads", threads),
        Dimension("execution_mode", ("sequential", "parallel")),
        Dimension("fusion", ("none", "transformer")),
        Dimension("layout", ("NCHW", "NHWC")),
    ]
    return Space(dims, lambda p: p["per_channel"] is False or p["quantization"] not in ("fp32", "fp16"))


def _u(*parts: object) -> float:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big") / 2**64


def ort_landscape(variant: int = 0):
    """score = 1/latency; latency is a product of per-knob factors with interactions
    (QDQ folding needs high opt levels, NHWC pays off only for static int8, fusion
    depends on the numeric format, inter-op parallelism only helps single-threaded
    kernels), +-1.5 % deterministic noise, and infeasible points (accuracy budget,
    a failing fused fp16 kernel, 3 % flaky builds)."""
    r = np.random.default_rng(variant)

    def j() -> float:
        return float(np.exp(r.normal(0, 0.08)))

    q = {"fp32": 1.0 * j(), "fp16": 1.35 * j(), "int8_dynamic": 0.58 * j(), "int8_static": 0.5 * j()}
    q["mixed"] = 0.64 * j()
    opt = {"disable": 1.7 * j(), "basic": 1.2 * j(), "extended": 1.0, "all": 0.97 * j()}
    thr = {1: 1.85 * j(), 2: 1.0, 4: 1.12 * j(), 0: 1.03 * j()}
    fuse = {"fp32": 0.82 * j(), "fp16": 0.85 * j(), "int8_dynamic": 0.9 * j(), "int8_static": 1.0}
    fuse["mixed"] = 0.92 * j()
    nhwc_static = 0.93 * j()

    def score(p: dict) -> float | None:
        m = p["quantization"]
        if m == "int8_static" and not p["per_channel"] and p["fusion"] == "none":
            return None
        if m == "fp16" and p["fusion"] == "transformer":
            return None
        if _u(variant, "fail", *sorted(p.items())) < 0.03:
            return None
        lat = q[m] * opt[p["graph_opt"]] * thr[p["threads"]]
        if m in ("int8_static", "mixed") and p["graph_opt"] in ("disable", "basic"):
            lat *= 1.5
        if p["per_channel"]:
            lat *= 1.04
        if p["execution_mode"] == "parallel":
            lat *= 0.96 if p["threads"] == 1 else 1.08
        if p["fusion"] == "transformer" and p["graph_opt"] != "disable":
            lat *= fuse[m]
        if p["layout"] == "NHWC":
            lat *= nhwc_static if m == "int8_static" else 1.06
        lat *= math.exp(0.015 * (2 * _u(variant, "noise", *sorted(p.items())) - 1))
        return 1.0 / lat

    return score


def build(algorithm: str, space: Space, seed: int, **params: object) -> Searcher:
    return ALGORITHMS[algorithm](space, seed, **{**FAST.get(algorithm, {}), **params})


def drive(s: Searcher, score, budget: int, batch: int = 1) -> list[dict]:
    asked: list[dict] = []
    while len(asked) < budget:
        pts = s.ask(min(batch, budget - len(asked)))
        if not pts:
            break
        for p in pts:
            asked.append(p)
            s.tell(p, score(p))
    return asked


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_proposals_are_allowed_unique_and_exhaust_cleanly(algorithm: str) -> None:
    space = Space(
        [Dimension("q", ("fp32", "int8")), Dimension("pc", (False, True)), Dimension("t", (1, 2, 4))],
        lambda p: not (p["q"] == "fp32" and p["pc"]),
    )
    allowed = space.allowed_points()
    assert len(allowed) == 9
    s = build(algorithm, space, 3)
    asked = drive(s, lambda p: None if p["t"] == 4 else float(p["t"]), budget=50, batch=2)
    keys = [space.key(p) for p in asked]
    assert len(keys) == len(set(keys)) == 9
    assert all(space.is_allowed(p) for p in asked)
    assert s.ask(3) == []


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_pending_points_are_not_proposed_again(algorithm: str) -> None:
    s = build(algorithm, ort_space(), 1)
    first, second = s.ask(3), s.ask(3)
    keys = [s.space.key(p) for p in first + second]
    assert len(set(keys)) == 6


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_an_excluded_point_is_never_proposed_and_teaches_nothing(algorithm: str) -> None:
    space = Space(
        [Dimension("q", ("fp32", "int8")), Dimension("pc", (False, True)), Dimension("t", (1, 2, 4))],
        lambda p: not (p["q"] == "fp32" and p["pc"]),
    )
    s = build(algorithm, space, 3)
    excluded = space.allowed_points()[0]
    s.exclude(excluded)
    assert s.history == []
    asked = drive(s, lambda p: float(p["t"]), budget=50, batch=2)
    assert excluded not in asked and len(asked) == len(space.allowed_points()) - 1


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_deterministic_resumable_and_json_state(algorithm: str) -> None:
    space, score = ort_space(), ort_landscape(0)
    a, b = build(algorithm, space, 7), build(algorithm, space, 7)
    assert drive(a, score, 10, batch=2) == drive(b, score, 10, batch=2)
    resumed = type(a).resume(space, 7, a.history, **a.params())
    assert resumed.ask(2) == a.ask(2)
    state = json.loads(json.dumps(a.state()))
    assert state["algorithm"] == algorithm and state["seed"] == 7 and len(state["history"]) == 10
    again = type(a).resume(
        space, state["seed"], [(h["point"], h["score"]) for h in state["history"]], **state["params"]
    )
    assert again.history == a.history


def test_other_seed_other_proposals() -> None:
    space = ort_space()
    assert make_searcher("random", space, 1, 10).ask(5) != make_searcher("random", space, 2, 10).ask(5)


def test_space_encoding_and_validation() -> None:
    space = ort_space()
    p = {"quantization": "fp16", "per_channel": False, "graph_opt": "all", "threads": 4}
    p |= {"execution_mode": "sequential", "fusion": "none", "layout": "NHWC"}
    x = space.encode(p)
    assert x.shape == (space.n_features,) == (5 + 2 + 4 + 4 + 1 + 2 + 2 + 2,)
    assert x[1] == 1 and x[5] == 1  # one-hot: fp16, per_channel False
    assert x[11 + 2] == 1 and x[15] == pytest.approx(1.0)  # threads 4: one-hot and scaled max
    assert space.contains(p) and space.is_allowed(p)
    assert not space.is_allowed(p | {"per_channel": True})
    assert not space.contains(p | {"threads": 3}) and not space.contains({"quantization": "fp32"})
    assert space.size == 1280 and len(space.allowed_points()) == 1024
    assert next(space.enumerate())["quantization"] == "fp32"
    with pytest.raises(ValueError):
        Dimension("x", (1, 1))


def test_surrogate_ranks_a_linear_landscape() -> None:
    space = Space([Dimension("a", (0, 1, 2, 3)), Dimension("b", ("x", "y", "z")), Dimension("c", (False, True))])

    def f(p: dict) -> float:
        return 10 + 2 * p["a"] + {"x": 0, "y": 3, "z": 1}[p["b"]] - 1.5 * p["c"]

    rng = np.random.default_rng(0)
    pts = space.allowed_points()
    train = [pts[int(i)] for i in rng.choice(len(pts), 10, replace=False)]
    sur = Surrogate(space).fit([(p, f(p)) for p in train])
    ranked = sur.rank(pts)
    assert ranked[0][0] == {"a": 3, "b": "y", "c": False}
    truth = [f(p) for p, _ in ranked]
    assert np.corrcoef(truth, [s for _, s in ranked])[0, 1] > 0.98
    assert Surrogate(space).fit([(pts[0], 1.0)]).rank(pts[:3]) == [(p, None) for p in pts[:3]]


def test_surrogate_uses_extra_features() -> None:
    # An engine feature (predicted cost) lets the surrogate rank choices it never saw.
    space = Space([Dimension("a", tuple("pqrstu"))])
    cost = dict(zip("pqrstu", (3.0, 1.0, 2.0, 2.5, 0.5, 4.0), strict=True))
    history = [({"a": a}, -cost[a]) for a in "pqrt"]
    unseen = [{"a": "s"}, {"a": "u"}]
    plain = Surrogate(space).fit(history).predict(unseen)
    assert plain[0] == pytest.approx(plain[1])  # one-hot alone cannot tell unseen choices apart
    sur = Surrogate(space, featurizer=lambda p: np.array([cost[p["a"]]])).fit(history)
    assert [p for p, _ in sur.rank(unseen)] == unseen  # cheap "s" ahead of costly "u"


def test_hybrid_records_predictions() -> None:
    space, score = ort_space(), ort_landscape(1)
    s = HybridSearcher(space, 0, budget=12)
    asked = drive(s, score, 10)
    preds = [s.predicted_score(p) for p in asked]
    assert preds[0] is None and all(isinstance(v, float) for v in preds[-3:])


def test_hybrid_beats_random_at_budget_20() -> None:
    """Median fraction of the exhaustive optimum over two landscapes x four seeds."""
    space, budget = ort_space(), 20
    fractions: dict[str, list[float]] = {"hybrid": [], "random": []}
    for variant in (0, 1):
        score = ort_landscape(variant)
        optimum = max(v for v in map(score, space.allowed_points()) if v is not None)
        for alg, runs in fractions.items():
            for seed in range(4):
                asked = drive(make_searcher(alg, space, seed, budget), score, budget)
                runs.append(max(v for v in map(score, asked) if v is not None) / optimum)
    medians = {alg: statistics.median(runs) for alg, runs in fractions.items()}
    assert medians["hybrid"] > medians["random"], medians


def test_every_algorithm_name_has_exactly_one_searcher() -> None:
    from metainfer.core.engine.algorithms import ALGORITHM_NAMES
    from metainfer.core.engine.search import ALGORITHMS

    assert sorted(ALGORITHMS) == sorted(ALGORITHM_NAMES)
    assert all(cls.algorithm == name for name, cls in ALGORITHMS.items())


def test_importing_the_agent_and_the_search_loads_no_scikit_learn_until_a_searcher_needs_it() -> None:
    """skopt, scikit-learn and scipy behind them cost 1.5-2.5 s of CPU to import: every agent Job and CLI process
    paid that, a random search included. scikit-learn is imported where a surrogate is built, skopt where a
    Bayesian model is first fitted."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import metainfer.agent.run, metainfer.core.engine.search, metainfer.core.control.trial_history\n"
        "def heavy(): return sorted(m for m in sys.modules if m.split('.')[0] in ('skopt', 'sklearn', 'scipy'))\n"
        "print(bool(heavy()))\n"
        "from metainfer.core.engine.search import Dimension, Space, make_searcher\n"
        "make_searcher('random', Space([Dimension('a', (1, 2))]), seed=0, budget=2).ask(1)\n"
        "print(bool(heavy()))\n"
        "make_searcher('hybrid', Space([Dimension('a', (1, 2))]), seed=0, budget=2)\n"
        "print('skopt' in sys.modules, 'sklearn' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False", "True"], out


def engine_space() -> Space:
    """Knobs named as the engine names them, so the built-in prior has opinions on them."""
    dims = [
        Dimension("quantization", ("fp32", "fp16", "int8_dynamic", "int8_static")),
        Dimension("per_channel", (False, True)),
        Dimension("graph_optimization_level", ("all", "extended", "basic")),
        Dimension("intra_op_num_threads", (1, 2, 4)),
        Dimension("execution_mode", ("sequential", "parallel")),
    ]
    return Space(
        dims, lambda p: (p["quantization"].startswith("int8") or not p["per_channel"]) and p["quantization"] != "fp16"
    )


def test_the_built_in_prior_prefers_defaults_and_int8_only_where_the_profile_says_it_pays() -> None:
    space = engine_space()
    fast_int8 = builtin_prior(space, SearchContext.from_peaks(100, 400, 4, 4, False))
    slow_int8 = builtin_prior(space, SearchContext.from_peaks(100, 50, 4, 4, False))
    best = space.point(fast_int8.best_keys(space, 1, set())[0])
    assert best == {
        "quantization": "int8_dynamic",
        "per_channel": False,
        "graph_optimization_level": "all",
        "intra_op_num_threads": 4,  # the physical cores, ONNX Runtime's own default
        "execution_mode": "sequential",
    }
    assert space.point(slow_int8.best_keys(space, 1, set())[0])["quantization"] == "fp32"


def test_the_cold_start_climbs_from_the_prior_best_one_untried_knob_at_a_time() -> None:
    space = engine_space()
    prior = builtin_prior(space, SearchContext.from_peaks(100, 400, 4, 4, False))
    s = HybridSearcher(space, 0, budget=10, prior=prior)
    first = s.ask(1)[0]
    s.tell(first, 1.0)
    second = s.ask(1)[0]
    changed = [k for k in first if first[k] != second[k]]
    assert changed == ["intra_op_num_threads"]  # the knob the prior is least sure of goes first
    s.tell(second, 2.0)  # better: the next move starts from it
    third = s.ask(1)[0]
    assert third["intra_op_num_threads"] == second["intra_op_num_threads"]
    assert sum(third[k] != second[k] for k in third) in (1, 2)


def test_a_prior_centres_the_surrogate_before_any_measurement() -> None:
    space = engine_space()
    prior = builtin_prior(space, SearchContext.from_peaks(100, 400, 4, 4, False))
    sur = Surrogate(space, prior=prior.mean_keys)
    pts = space.allowed_points()
    ranked = sur.rank(pts)
    assert ranked[0][0]["quantization"] == "int8_dynamic" and ranked[0][1] is not None
    # measurements that contradict the prior move the ranking
    history = [(p, 5.0 if p["quantization"] == "fp32" else 1.0) for p in pts[:: max(1, len(pts) // 12)]]
    assert sur.fit(history).rank(pts)[0][0]["quantization"] == "fp32"


# -- enumerating a large space ------------------------------------------------------------------------------


def test_depth_first_enumeration_finds_exactly_the_allowed_points() -> None:
    dims = [Dimension(f"d{i}", tuple(range(n))) for i, n in enumerate((3, 2, 4, 2, 3))]
    rules = [
        lambda p: p["d0"] != 1 or p["d3"] == 0,  # reads a late dimension
        lambda p: p["d1"] == 0 or p["d2"] in (1, 3),
        lambda p: p["d4"] <= p["d0"],
    ]
    space = Space(dims, constraint=lambda p: all(rule(p) for rule in rules), rules=rules)
    brute = [k for k in itertools.product(*(range(len(d.choices)) for d in dims)) if space.is_allowed(space.point(k))]
    assert space.allowed_keys() == brute and 0 < len(brute) < space.size


def test_a_space_of_millions_of_combinations_enumerates_its_few_allowed_points() -> None:
    dims = [Dimension("mode", ("fp32", "int8")), *(Dimension(f"int8_{i}", (0, 1, 2)) for i in range(8)),
            *(Dimension(f"w_{i}", (0, 1, 2)) for i in range(8))]  # fmt: skip
    int8_only = [lambda p, i=i: p["mode"] == "int8" or p[f"int8_{i}"] == 0 for i in range(8)]
    fp32_only = [lambda p, i=i: p["mode"] == "fp32" or p[f"w_{i}"] == 0 for i in range(8)]
    rules = [*int8_only, *fp32_only]
    space = Space(dims, constraint=lambda p: all(rule(p) for rule in rules), rules=rules)
    assert space.size > 10**7
    assert len(space.allowed_keys()) == 2 * 3**8
