"""Replay search algorithms against a fully measured landscape, and the metrics over the replays.

Why replay: real evaluations are noisy and slow, so comparing algorithms by
running each one on hardware would mostly compare the noise of different runs.
Measuring every allowed point once gives one fixed landscape; every algorithm
and seed then sees exactly the same score for the same point, the exhaustive
optimum is known, and 20 seeds x 7 algorithms cost seconds of CPU instead of
hours of measurement. The searchers are the engine's own (``make_searcher``,
``HybridSearcher``) driven through ask/tell exactly as ``Adaptation.run`` drives
them: one point asked, its cached score told, ``None`` for infeasible.

Kept free of ONNX Runtime and plotting so the unit tests can exercise it on a
tiny synthetic landscape in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metainfer.core.engine.history import RunFeatures
from metainfer.core.engine.search import Featurizer, HybridSearcher, Prior, Searcher, builtin_prior, make_searcher
from metainfer.core.engine.search.prior import SearchContext, context_features
from metainfer.core.engine.search.space import Dimension, Key, Space

Scores = list[float | None]  # scores in evaluation order; None = infeasible or failed
Runner = Callable[["Landscape", int, int], Scores]  # (landscape, seed, budget) -> scores

LEVELS = (0.95, 0.98)
# Algorithms whose proposals do not depend on the budget: one run to the largest
# budget gives every smaller budget as a prefix.
BUDGET_FREE = ("random", "grid", "evolution", "bayes", "tpe")


@dataclass(frozen=True)
class Landscape:
    """Every allowed point of a space with its engine score (None = infeasible/failed)."""

    space: Space
    scores: dict[Key, float | None]
    featurizer: Featurizer | None = field(default=None, compare=False)
    # the engine's built-in prior for this space on the landscape's hardware (None: the hybrid starts
    # space-filling, as it did before priors existed)
    prior: Prior | None = field(default=None, compare=False)
    features: RunFeatures | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        missing = [k for k in self.space.allowed_keys() if k not in self.scores]
        if missing:
            raise ValueError(f"landscape lacks {len(missing)} allowed points, e.g. {self.space.point(missing[0])}")

    @property
    def optimum(self) -> float:
        """The exhaustive optimum: the best feasible score of any allowed point."""
        feasible = [s for s in self.scores.values() if s is not None]
        if not feasible:
            raise ValueError("no feasible point in the landscape: there is no optimum to reach")
        return max(feasible)

    @property
    def size(self) -> int:
        return len(self.space.allowed_keys())

    def score(self, key: Key) -> float | None:
        return self.scores[key]


def from_document(doc: dict[str, Any]) -> Landscape:
    """A landscape file (``search_efficiency.measure_landscape``'s JSON) as a replayable landscape.

    Needs only the file: its ``dimensions`` (every choice, allowed or not, in the engine's order, so that
    keys and the searchers' random draws are those of the engine's space), its rows (the allowed points
    with their scores) and its ``features`` (the hardware and model facts the engine's surrogate features
    and built-in prior read). No engine, profile or model is rebuilt, so a landscape measured on another
    machine, or under an older knob set, replays exactly as it was measured.
    """
    dims = [Dimension(name, tuple(choices)) for name, choices in doc["dimensions"].items()]
    allowed = {tuple(r["key"]) for r in doc["points"]}
    space = Space(dims)
    space.constraint = lambda p: space.key(p) in allowed
    scores: dict[Key, float | None] = {tuple(r["key"]): r["score"] for r in doc["points"]}
    features = RunFeatures.model_validate(doc["features"]) if doc.get("features") else None
    context = features.context() if features is not None else SearchContext()
    return Landscape(
        space,
        scores,
        featurizer=lambda p: context_features(p, context),
        prior=builtin_prior(space, context) if features is not None else None,
        features=features,
    )


def replay(searcher: Searcher, landscape: Landscape, budget: int) -> Scores:
    """Drive ``searcher`` for ``budget`` evaluations, telling each asked point its cached score."""
    out: Scores = []
    while len(out) < budget:
        asked = searcher.ask(1)
        if not asked:  # space exhausted
            break
        key = landscape.space.key(asked[0])
        value = landscape.score(key)
        searcher.tell(asked[0], value)
        out.append(value)
    return out


def engine_runner(algorithm: str) -> Runner:
    """One of the engine's searchers, built as ``make_searcher`` builds it for the engine."""

    def run(landscape: Landscape, seed: int, budget: int) -> Scores:
        searcher = make_searcher(
            algorithm,  # type: ignore[arg-type]
            landscape.space,
            seed,
            budget,
            featurizer=landscape.featurizer,
            prior=landscape.prior,
        )
        return replay(searcher, landscape, budget)

    return run


def hybrid_runner(use_surrogate: bool, prior: Prior | str | None = "landscape") -> Runner:
    """The hybrid with or without its surrogate filter, told its budget as the engine tells it.

    ``prior``: the landscape's built-in prior (the engine's default), or the given one (None: no prior,
    the space-filling start the hybrid had before).
    """

    def run(landscape: Landscape, seed: int, budget: int) -> Scores:
        searcher = HybridSearcher(
            landscape.space,
            seed,
            budget=budget,
            featurizer=landscape.featurizer,
            use_surrogate=use_surrogate,
            prior=landscape.prior if isinstance(prior, str) else prior,
        )
        return replay(searcher, landscape, budget)

    return run


def optuna_available() -> bool:
    try:
        import optuna  # noqa: F401
    except ImportError:
        return False
    return True


MAX_REJECTIONS = 200  # TPE proposals in a row that are forbidden or already seen before we fall back


def tpe_runner() -> Runner:
    """Optuna's TPE sampler as an outside peer, over the same space and the same rules.

    Mapping: each dimension becomes a ``CategoricalDistribution`` over its choice
    indices (TPE treats categoricals as unordered, as our one-hot surrogate does;
    indices avoid Optuna's restrictions on choice types). Like our searchers, TPE
    never spends an evaluation on a forbidden or repeated point: a forbidden
    proposal is told to Optuna as FAIL (the idiom for "no value"), a repeated one
    gets its known result again, and neither counts as an evaluation. If TPE
    proposes nothing new ``MAX_REJECTIONS`` times in a row, one uniformly random
    unseen allowed point is evaluated instead and added to the study, the same
    top-up our ``Searcher.ask`` does. Infeasible points are told as FAIL too.
    """

    def run(landscape: Landscape, seed: int, budget: int) -> Scores:
        import optuna
        from optuna.distributions import CategoricalDistribution
        from optuna.trial import TrialState, create_trial

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = landscape.space
        dists: dict[str, Any] = {d.name: CategoricalDistribution(list(range(len(d.choices)))) for d in space.dimensions}
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
        rng = np.random.default_rng(seed)
        seen: dict[Key, float | None] = {}
        out: Scores = []

        def tell(trial: Any, value: float | None) -> None:
            if value is None:
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, value)

        while len(out) < budget and len(seen) < landscape.size:
            key: Key | None = None
            for _ in range(MAX_REJECTIONS):
                trial = study.ask(dists)
                proposed = tuple(int(trial.params[d.name]) for d in space.dimensions)
                if not space._key_allowed(proposed):
                    study.tell(trial, state=TrialState.FAIL)
                elif proposed in seen:
                    tell(trial, seen[proposed])
                else:
                    key = proposed
                    break
            if key is None:
                key = space.sample(rng, 1, set(seen))[0]
                value = landscape.score(key)
                params = {d.name: int(i) for d, i in zip(space.dimensions, key, strict=True)}
                state = TrialState.FAIL if value is None else TrialState.COMPLETE
                study.add_trial(create_trial(params=params, distributions=dists, value=value, state=state))
            else:
                value = landscape.score(key)
                tell(trial, value)
            seen[key] = value
            out.append(value)
        return out

    return run


def runners(include_tpe: bool = True) -> dict[str, Runner]:
    """Every algorithm of the benchmark, by the name its tables use."""
    out: dict[str, Runner] = {
        "random": engine_runner("random"),
        "grid": engine_runner("grid"),
        "evolution": engine_runner("evolution"),
        "bayes": engine_runner("bayes"),
        "hybrid": hybrid_runner(use_surrogate=True),
        "hybrid (no surrogate)": hybrid_runner(use_surrogate=False),
        "hybrid (space-filling start)": hybrid_runner(use_surrogate=True, prior=None),
    }
    if include_tpe:
        out["tpe"] = tpe_runner()
    return out


# -- metrics --------------------------------------------------------------------------------------------
def best_so_far(scores: Scores) -> list[float | None]:
    """Running best feasible score after each evaluation (None until the first feasible one)."""
    out: list[float | None] = []
    best: float | None = None
    for s in scores:
        if s is not None and (best is None or s > best):
            best = s
        out.append(best)
    return out


def fraction_curve(scores: Scores, optimum: float, length: int | None = None) -> np.ndarray:
    """Best-so-far as a fraction of the optimum; 0 while nothing feasible was found.

    ``length`` pads a run that stopped early (space exhausted) with its last value.
    """
    if optimum <= 0:
        raise ValueError("fractions of the optimum need a positive optimum score")
    fr = [0.0 if b is None else b / optimum for b in best_so_far(scores)]
    if length is not None and len(fr) < length:
        fr += [fr[-1] if fr else 0.0] * (length - len(fr))
    return np.array(fr[:length] if length is not None else fr, dtype=float)


def fraction_at(scores: Scores, optimum: float, budget: int) -> float:
    """Fraction of the optimum reached within the first ``budget`` evaluations."""
    curve = fraction_curve(scores[:budget], optimum)
    return float(curve[-1]) if len(curve) else 0.0


def evals_to_reach(scores: Scores, optimum: float, level: float) -> int | None:
    """1-based evaluation count at which the best-so-far first reaches ``level`` x optimum; None if never."""
    for i, frac in enumerate(fraction_curve(scores, optimum), start=1):
        if frac >= level - 1e-12:
            return i
    return None


def median_evals(counts: Sequence[int | None]) -> float | None:
    """Median evaluations-to-level over seeds, counting a seed that never got there as infinitely slow.

    None when more than half the seeds never got there (the median is then
    beyond the budget and no number would be honest).
    """
    vals = sorted(math.inf if c is None else float(c) for c in counts)
    if not vals:
        return None
    med = float(np.median(vals))  # inf sorts last, so it only wins when most seeds missed
    return None if math.isinf(med) else med


@dataclass
class AlgorithmResult:
    """All seeds of one algorithm on one landscape."""

    name: str
    fractions: dict[int, list[float]]  # budget -> per-seed fraction of the optimum
    curves: np.ndarray  # (seeds, max budget) fraction after each evaluation, longest run
    reach: dict[float, list[int | None]]  # level -> per-seed evaluations needed (None: not within max budget)
    wall_s: float

    def median_fraction(self, budget: int) -> float:
        return float(np.median(self.fractions[budget]))

    @classmethod
    def from_summary(cls, name: str, summary: dict[str, Any]) -> AlgorithmResult:
        """A saved ``summary()`` back as a result for tables and verdicts (the curves are not saved: no plots)."""
        return cls(
            name,
            {int(b): list(v) for b, v in summary["fractions"].items()},
            np.empty((0, 0)),
            {float(level): list(v["per_seed"]) for level, v in summary["evals_to"].items()},
            float(summary["wall_s"]),
        )

    def summary(self) -> dict[str, Any]:
        return {
            "median_fraction": {str(b): self.median_fraction(b) for b in sorted(self.fractions)},
            "fractions": {str(b): v for b, v in sorted(self.fractions.items())},
            "evals_to": {
                f"{level:.2f}": {
                    "per_seed": counts,
                    "median": median_evals(counts),
                    "reached": sum(c is not None for c in counts),
                }
                for level, counts in self.reach.items()
            },
            "wall_s": self.wall_s,
        }


@dataclass
class SeedRun:
    """One seed of one algorithm: fractions per budget, the longest run's curve and its reach."""

    fractions: dict[int, float]
    curve: np.ndarray
    reach: dict[float, int | None]


def run_seed(
    name: str,
    run: Runner,
    landscape: Landscape,
    seed: int,
    budgets: Sequence[int],
    levels: Sequence[float] = LEVELS,
) -> SeedRun:
    """Replay one algorithm for one seed.

    Budget-free algorithms run once to the largest budget and every budget is
    read off that run. Budget-aware ones (the hybrid places its coarse/fine
    switch by budget) get a dedicated run per budget, as the engine would give
    them, and the evaluations-to-level come from their largest-budget run.
    """
    top = max(budgets)
    optimum = landscape.optimum
    longest = run(landscape, seed, top)
    fractions = {}
    for b in budgets:
        scores = longest if (name in BUDGET_FREE or b == top) else run(landscape, seed, b)
        fractions[b] = fraction_at(scores, optimum, b)
    reach = {lv: evals_to_reach(longest, optimum, lv) for lv in levels}
    return SeedRun(fractions, fraction_curve(longest, optimum, top), reach)


def collect(name: str, runs: Sequence[SeedRun], wall_s: float) -> AlgorithmResult:
    """Stack per-seed runs (in seed order) into one result."""
    budgets = sorted(runs[0].fractions)
    return AlgorithmResult(
        name,
        {b: [r.fractions[b] for r in runs] for b in budgets},
        np.array([r.curve for r in runs]),
        {lv: [r.reach[lv] for r in runs] for lv in runs[0].reach},
        wall_s,
    )


def evaluate_algorithm(
    name: str,
    run: Runner,
    landscape: Landscape,
    seeds: Sequence[int],
    budgets: Sequence[int],
    levels: Sequence[float] = LEVELS,
) -> AlgorithmResult:
    """Replay one algorithm over every seed, in this process."""
    import time

    started = time.perf_counter()
    runs = [run_seed(name, run, landscape, seed, budgets, levels) for seed in seeds]
    return collect(name, runs, time.perf_counter() - started)
