"""Search efficiency: how close each algorithm gets to the exhaustive optimum on a real landscape.

    PYTHONSAFEPATH=1 .venv/bin/python bench/search_efficiency.py [--quick]

Step 1, the landscape: for each model, every allowed point of the space the
engine would search (``Adaptation``'s own space for that model, batch and this
machine's hardware profile) is turned into a recipe and measured and scored by
the engine itself (``recipe_for``, ``Adaptation.measure``: hard constraints
first, infeasible = no score, else alpha x speedup + beta x relative quality
against one FP32 baseline). The landscape is cached as
``bench/results/search_efficiency_landscape_<model>.json`` together with the
key it was measured under (model sha256, batch, space, machine fingerprint,
measure settings); a rerun whose key matches reuses it, anything else
re-measures. Points are measured grouped by transform, so each variant is
built once.

Step 2, the replay: every algorithm (``search_replay.runners``) is driven
through ask/tell against the cached scores for 20 seeds, budgets 5/10/20/40,
plus the hybrid at 10 % of the space for its target. Metrics: median fraction
of the optimum reached per budget, and evaluations needed to reach 95 % / 98 %
(median over seeds, a seed that never got there counting as slower than any
that did, and how many got there within 40).

Full mode: digits (batch 64), bert_mini (batch 8), light_squeezenet (batch 1),
20 seeds. ``--quick``: digits only, 5 seeds (reusing its cached landscape).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import benchlib
from bench import search_replay as sr
from metainfer.agent.zoo import build_examples
from metainfer.core.engine.candidates import recipe_for
from metainfer.core.engine.data import load_npz
from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile import load_or_measure
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import make_reference
from metainfer.core.engine.report import AdaptSettings
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.search.hybrid import HybridSearcher
from metainfer.core.engine.search.space import Key, Space
from metainfer.core.engine.trial import Trial

NAME = "search_efficiency"
BUDGETS = (5, 10, 20, 40)
TARGET_FRACTION = 0.98
TARGET_SHARE = 0.10  # of the allowed points
FULL_MODELS = {"digits": 64, "bert_mini": 8, "light_squeezenet": 1}
QUICK_MODELS = {"digits": 64}
# Shorter than the engine's default (3 s cap per trial): hundreds of points per model must fit in minutes.
# Quality still uses every quality sample the example ships (up to 512), as the engine does.
LANDSCAPE_MEASURE = MeasureSettings(warmup_runs=2, round_runs=5, min_runs=15, max_runs=200, max_seconds=0.6)
TRANSFORM_DIMS = (
    "quantization",
    "per_channel",
    "weight_type",
    "activation_type",
    "calibration",
    "keep_float",
    "fusion",
    "layout",
    "padding",
)


@dataclass
class Model:
    """One benchmark model: the engine's adaptation state and its search space."""

    name: str
    batch: int
    adaptation: Adaptation
    space: Space
    sha256: str

    @property
    def cache_key(self) -> dict[str, Any]:
        """Everything a measured landscape depends on; any change means measure again."""
        signature = json.dumps(
            {
                "dims": {d.name: list(d.choices) for d in self.space.dimensions},
                "allowed": self.space.allowed_keys(),
            },
            sort_keys=True,
            default=str,
        )
        return {
            "model": self.name,
            "model_sha256": self.sha256,
            "batch": self.batch,
            "space_sha256": hashlib.sha256(signature.encode()).hexdigest(),
            "machine_fingerprint": self.adaptation.profile.fingerprint,
            "measure": LANDSCAPE_MEASURE.model_dump(),
        }


def load_model(name: str, batch: int, workdir: Path) -> Model:
    """Build the example and the engine's ``Adaptation`` for it (no measurement yet)."""
    example = build_examples(workdir, [name])[name]
    info = inspect_model(example.model_path)
    data = load_npz(example.data_path, info)
    settings = AdaptSettings(batch=batch, measure=LANDSCAPE_MEASURE)
    adaptation = Adaptation(example.model_path.read_bytes(), info, data, load_or_measure(), settings)
    # The engine's own space for this model, batch and profile (private: the bench must search what run() searches).
    space, _notes = adaptation._space()
    return Model(name, batch, adaptation, space, example.sha256)


def landscape_path(name: str) -> Path:
    return benchlib.RESULTS / f"{NAME}_landscape_{name}.json"


def measure_landscape(model: Model, log: bool = True) -> dict[str, Any]:
    """Measure and score every allowed point exactly as ``Adaptation.run`` measures a search trial."""
    a, space = model.adaptation, model.space
    started, load_before = time.perf_counter(), os.getloadavg()
    baseline_recipe = Recipe(batch=model.batch)
    a.reference = make_reference(create_session(a.base, baseline_recipe), a.quality_data, model.batch)
    baseline = a.measure(0, {}, baseline_recipe, None)
    if baseline.metrics is None:
        raise RuntimeError(f"{model.name}: the FP32 model does not run: {baseline.error}")
    keys = sorted(space.allowed_keys(), key=lambda k: tuple(str(space.point(k).get(d)) for d in TRANSFORM_DIMS))
    rows = []
    for i, key in enumerate(keys, start=1):
        point = space.point(key)
        try:
            recipe = recipe_for(point, a.ranked_layers)
        except Exception as exc:  # sensitivity analysis failed: the engine fails this candidate too
            trial = Trial(index=i, point=point, recipe=Recipe(batch=model.batch), status="failed", error=str(exc))
        else:
            trial = a.measure(i, point, recipe, baseline.metrics)
        m = trial.metrics
        rows.append(
            {
                "key": list(key),
                "point": point,
                "score": trial.score,
                "status": trial.status,
                "p50_ms": m.latency.p50_ms if m else None,
                "p95_ms": m.latency.p95_ms if m else None,
                "quality_drop": m.quality.drop if m else None,
                "violations": trial.violations,
                "error": trial.error,
                "recipe": trial.recipe.describe(),
            }
        )
        if log and (i % 25 == 0 or i == len(keys)):
            print(f"  {model.name}: {i}/{len(keys)} points, {time.perf_counter() - started:.0f} s", flush=True)
    assert baseline.metrics is not None
    return {
        "key": model.cache_key,
        # enough to replay the landscape without this machine's engine: the space's dimensions (the allowed
        # points are the rows) and the run's features (surrogate features, built-in prior, history similarity)
        "dimensions": {d.name: list(d.choices) for d in space.dimensions},
        "features": a.features().model_dump(mode="json"),
        "wall_s": time.perf_counter() - started,
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "niceness": os.nice(0),  # a niced measurement loses the CPU to everything else: its timings are suspect
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "baseline": {"p50_ms": baseline.metrics.latency.p50_ms, "score": baseline.score},
        "points": rows,
    }


def get_landscape(model: Model, refresh: bool, may_measure: bool = True) -> tuple[dict[str, Any], bool]:
    """The cached landscape if its key matches this model/space/machine/settings, else a new measurement."""
    path = landscape_path(model.name)
    if not refresh and path.exists():
        with contextlib.suppress(ValueError, OSError):
            cached = json.loads(path.read_text())
            if cached.get("key") == json.loads(json.dumps(model.cache_key, default=str)):
                return cached, True
    if not may_measure:
        raise SystemExit(
            f"{path} is missing or was measured for another model, space, machine or settings; "
            "run without --render-only to measure it"
        )
    print(f"measuring the {model.name} landscape ({len(model.space.allowed_keys())} points)...", flush=True)
    data = measure_landscape(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)
    return data, False


def to_landscape(data: dict[str, Any]) -> sr.Landscape:
    """The landscape as the engine's searchers see it, from the file alone (``search_replay.from_document``)."""
    if "dimensions" not in data or "features" not in data:
        raise SystemExit("a landscape file without its dimensions and features cannot be replayed: measure it again")
    return sr.from_document(data)


@dataclass
class Cached:
    """A model known only from its cached landscape file (``--replay-cached``): no engine, no measuring."""

    name: str
    batch: int
    cache_key: dict[str, Any]


def load_cached(name: str) -> tuple[Cached, dict[str, Any]]:
    path = landscape_path(name)
    if not path.is_file():
        raise SystemExit(f"--replay-cached: {path} does not exist; run without --replay-cached to measure it")
    data = json.loads(path.read_text())
    return Cached(name, int(data["key"]["batch"]), data["key"]), data


# -- replay, possibly on both cores ------------------------------------------------------------------------
_LANDSCAPES: dict[str, sr.Landscape] = {}  # filled before forking so workers inherit (featurizers are closures)


def _seed_task(model: str, algorithm: str, seed: int, budgets: tuple[int, ...]) -> tuple[sr.SeedRun, float]:
    started = time.perf_counter()
    include_tpe = algorithm == "tpe"
    run = sr.runners(include_tpe)[algorithm]
    return sr.run_seed(algorithm, run, _LANDSCAPES[model], seed, budgets), time.perf_counter() - started


def replay_all(
    model: str, algorithms: list[str], seeds: range, budgets: tuple[int, ...], jobs: int
) -> dict[str, sr.AlgorithmResult]:
    tasks = [(model, alg, seed, budgets) for alg in algorithms for seed in seeds]
    if jobs > 1:
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            done = list(pool.map(_seed_task, *zip(*tasks, strict=True)))
    else:
        done = [_seed_task(*t) for t in tasks]
    out: dict[str, sr.AlgorithmResult] = {}
    for alg in algorithms:
        mine = [d for t, d in zip(tasks, done, strict=True) if t[1] == alg]
        out[alg] = sr.collect(alg, [r for r, _ in mine], sum(w for _, w in mine))
        print(f"  {model}: {alg} replayed in {out[alg].wall_s:.0f} s (sum of per-seed wall times)", flush=True)
    return out


# -- report ---------------------------------------------------------------------------------------------
def plot(model: str, results: dict[str, sr.AlgorithmResult], target_budget: int, path: Path) -> None:
    """Median fraction of the optimum after each evaluation, with the inter-quartile band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, res in results.items():
        if res.curves.size == 0:  # reused from a saved summary (--replay): only its per-budget medians exist
            budgets = sorted(res.fractions)
            ax.plot(budgets, [res.median_fraction(b) for b in budgets], ls="--", marker=".", lw=1.0, label=name)
            continue
        x = np.arange(1, res.curves.shape[1] + 1)
        q25, med, q75 = np.percentile(res.curves, [25, 50, 75], axis=0)
        (line,) = ax.plot(x, med, label=name, lw=2.2 if name == "hybrid" else 1.2)
        ax.fill_between(x, q25, q75, color=line.get_color(), alpha=0.12)
        if name.startswith("hybrid"):
            budgets = sorted(res.fractions)
            ax.scatter(budgets, [res.median_fraction(b) for b in budgets], color=line.get_color(), marker="o", s=18)
    ax.axhline(TARGET_FRACTION, color="grey", ls="--", lw=0.8)
    ax.axvline(target_budget, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("evaluations")
    ax.set_ylabel("fraction of the exhaustive optimum (median, IQR band)")
    seeds = len(next(iter(results["random"].fractions.values())))
    ax.set_title(f"{model}: search efficiency ({seeds} seeds)")
    ax.set_ylim(max(0.0, ax.get_ylim()[0]), 1.01)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _evals_cell(summary: dict[str, Any], level: float) -> str:
    """Evaluations to ``level`` of the optimum from a saved ``AlgorithmResult.summary()``."""
    reach = summary["evals_to"][f"{level:.2f}"]
    med = reach["median"]
    shown = f">{max(int(b) for b in summary['median_fraction'])}" if med is None else f"{med:g}"
    return f"{shown} ({reach['reached']}/{len(reach['per_seed'])})"


def verdicts(model: str, results: dict[str, sr.AlgorithmResult], target_budget: int, size: int) -> dict[str, Any]:
    """Both targets of the issue for one model, with the evidence."""
    hybrid = results["hybrid"]
    reached = hybrid.median_fraction(target_budget)
    beaten = [
        {"budget": b, "by": name, "hybrid": hybrid.median_fraction(b), "other": res.median_fraction(b)}
        for b in sorted(hybrid.fractions)
        if b in BUDGETS
        for name, res in results.items()
        if name != "hybrid" and res.median_fraction(b) > hybrid.median_fraction(b) + 1e-12
    ]
    return {
        "model": model,
        "target_budget": target_budget,
        "allowed_points": size,
        "hybrid_fraction_at_target_budget": reached,
        "target_98_at_10pct_met": reached >= TARGET_FRACTION,
        "beaten": beaten,
        "at_least_as_good_met": not beaten,
    }


def landscape_summary(data: dict[str, Any]) -> dict[str, Any]:
    """What the section says of a landscape file (``records.LandscapeSummary``), saved with the replay."""
    points = data["points"]
    feasible = [p for p in points if p["score"] is not None]
    best = max(feasible, key=lambda p: p["score"])
    return {
        "points": len(points),
        "feasible": len(feasible),
        "failed": sum(p["status"] == "failed" for p in points),
        "optimum_score": best["score"],
        "optimum_recipe": best["recipe"],
        "optimum_p50_ms": best["p50_ms"],
        "baseline_p50_ms": data["baseline"]["p50_ms"],
        "measured_at": data["measured_at"],
        "wall_s": data["wall_s"],
        "load_before": data["load_average_before"][0],
        "load_after": data["load_average_after"][0],
        "niceness": data.get("niceness"),
    }


def model_section(name: str, entry: dict[str, Any], algorithms: list[str]) -> str:
    """One model's subsection from its saved entry (``records.SearchModelResult``)."""
    land, verdict, results = entry["landscape_summary"], entry["verdict"], entry["results"]
    budgets = sorted(int(b) for b in results["hybrid"]["median_fraction"])
    header = ["algorithm", *(f"@{b}" for b in budgets), "evals to 95%", "evals to 98%"]
    order = [a for a in algorithms if a in results] + sorted(set(results) - set(algorithms))
    rows = [
        [
            alg,
            *(f"{results[alg]['median_fraction'][str(b)]:.3f}" for b in budgets),
            _evals_cell(results[alg], 0.95),
            _evals_cell(results[alg], 0.98),
        ]
        for alg in order
    ]
    why = why_lines(name, entry["why_beaten"], verdict)
    lines = [
        f"### {name} (batch {entry['batch']})",
        f"Landscape: {land['points']} allowed points of the engine's space, {land['feasible']} feasible, "
        f"{land['failed']} failed; optimum score {land['optimum_score']:.3f} (`{land['optimum_recipe']}`, p50 "
        f"{land['optimum_p50_ms']:.3f} ms vs FP32 {land['baseline_p50_ms']:.3f} ms). Measured {land['measured_at']} "
        f"in {land['wall_s']:.0f} s (1-min load average {land['load_before']:.2f} before, {land['load_after']:.2f} "
        "after)"
        + (f", at niceness {land['niceness']} (timings suspect)" if land["niceness"] else "")
        + (", reused from the cache" if entry["reused"] else "")
        + f"; algorithms replayed on it {entry['replayed_at']}.",
        "Median fraction of the optimum reached at each budget (hybrids: a dedicated run per budget; "
        f"@{verdict['target_budget']} is 10 % of the space); evaluations to 95 % / 98 % of the optimum: "
        "median over seeds (how many seeds got there within 40).",
        benchlib.markdown_table(header, rows),
        *(["\n".join(why)] if why else []),
        f"![{name}](bench/results/{NAME}_{name}.png)",
    ]
    return "\n\n".join(lines)


NEAR_OPTIMUM = 0.95  # "a good point" in the why text: within 5 % of the optimum


def _chance_of_a_near_optimal_point(landscape: sr.Landscape, budget: int) -> tuple[int, float]:
    """How many points are within 5 % of the optimum, and the chance ``budget`` uniform draws include one."""
    good = sum(s is not None and s >= NEAR_OPTIMUM * landscape.optimum for s in landscape.scores.values())
    size = landscape.size
    # hypergeometric: 1 - C(size - good, budget) / C(size, budget)
    miss = math.comb(size - good, budget) / math.comb(size, budget) if budget <= size else 0.0
    return good, 1.0 - miss


def _winner_pick(landscape: sr.Landscape, algorithm: str, budget: int, recipes: dict[Key, str]) -> dict[str, Any]:
    """What the winning algorithm found within ``budget`` on seed 0, and at which evaluation."""
    scores = sr.runners(include_tpe=algorithm == "tpe")[algorithm](landscape, 0, budget)
    feasible = [(s, i) for i, s in enumerate(scores, start=1) if s is not None]
    if not feasible:
        return {"algorithm": algorithm}
    best, at = max(feasible)
    key = next(k for k, v in landscape.scores.items() if v == best)
    found = recipes.get(key, landscape.space.point(key))
    return {"algorithm": algorithm, "found": str(found), "fraction": best / landscape.optimum, "at": at}


def why_facts(
    landscape: sr.Landscape,
    verdict: dict[str, Any],
    baseline_p50_ms: float,
    recipes: dict[Key, str] | None = None,
) -> dict[str, Any] | None:
    """Why the hybrid was beaten where it was, from the landscape and the hybrid's own schedule
    (``records.WhyBeaten``; None when it was not beaten).

    ``recipes`` names points in the text (the landscape file's recipe descriptions); otherwise the raw point.
    """
    recipes = recipes or {}
    if verdict["at_least_as_good_met"]:
        return None
    good, _ = _chance_of_a_near_optimal_point(landscape, 1)
    ranked = sorted((s for s in landscape.scores.values() if s is not None), reverse=True)
    top = ranked[: min(5, len(ranked))]
    budgets = []
    for budget in sorted({b["budget"] for b in verdict["beaten"]}):
        beaten = [b for b in verdict["beaten"] if b["budget"] == budget]
        best_other = max(beaten, key=lambda b: b["other"])
        hybrid = HybridSearcher(landscape.space, 0, budget=budget, prior=landscape.prior)
        budgets.append(
            {
                "budget": budget,
                "n_initial": hybrid.n_initial,
                "start": "prior" if landscape.prior is not None else "space-filling",
                "pick": _winner_pick(landscape, best_other["by"], budget, recipes),
                "chance": _chance_of_a_near_optimal_point(landscape, budget)[1],
            }
        )
    return {
        "near_optimal_points": good,
        "size": landscape.size,
        "top5_spread": top[-1] / top[0],
        "baseline_p50_ms": baseline_p50_ms,
        "budgets": budgets,
    }


def why_lines(name: str, facts: dict[str, Any] | None, verdict: dict[str, Any]) -> list[str]:
    """The why-text of ``why_facts`` (nothing when the hybrid was not beaten)."""
    if facts is None:
        return []
    spread = facts["top5_spread"]
    lines = [
        f"Why the hybrid is beaten on {name}: {facts['near_optimal_points']} of {facts['size']} points lie within 5 % "
        f"of the optimum, and the five best scores span {spread:.3f}-1.000 of it, for a model whose FP32 batch takes "
        f"{facts['baseline_p50_ms']:.3f} ms"
        + (": the ranking among them is within this machine's timing noise." if spread >= NEAR_OPTIMUM else ".")
    ]
    for at in facts["budgets"]:
        budget, pick = at["budget"], at["pick"]
        beaten = [b for b in verdict["beaten"] if b["budget"] == budget]
        by = ", ".join(f"{b['by']} {b['other']:.3f}" for b in beaten)
        start = (
            "its built-in prior's best point, then one-knob moves from the best point measured so far (untried "
            "knobs the prior is least sure of first)"
            if at["start"] == "prior"
            else "its space-filling design (points chosen to cover every level of every dimension, so the surrogate "
            "learns the main effects; not chosen for score)"
        )
        found = (
            f"{pick['algorithm']} found nothing feasible on seed 0"
            if pick["found"] is None
            else f"{pick['algorithm']} (seed 0) found `{pick['found']}` ({pick['fraction']:.3f} of the optimum) at "
            f"evaluation {pick['at']}"
        )
        lines.append(
            f"- @{budget}: hybrid {beaten[0]['hybrid']:.3f} against {by}. The hybrid's first {at['n_initial']} of "
            f"{budget} evaluations are {start}; its guided phase has {budget - at['n_initial']} left. {found}. "
            f"{budget} uniformly random distinct points include one within 5 % of the optimum with probability "
            f"{at['chance']:.2f}."
        )
    return lines


def verdict_lines(all_verdicts: list[dict[str, Any]]) -> str:
    lines = []
    for v in all_verdicts:
        t1 = "met" if v["target_98_at_10pct_met"] else "MISSED"
        lines.append(
            f"- {v['model']}: hybrid reaches {v['hybrid_fraction_at_target_budget']:.3f} of the optimum with "
            f"{v['target_budget']} evaluations (10 % of {v['allowed_points']}): target >= {TARGET_FRACTION} {t1}."
        )
        if v["at_least_as_good_met"]:
            lines.append(f"- {v['model']}: hybrid at least as good as every other algorithm at every budget: met.")
        else:
            worst = ", ".join(f"{b['by']} @{b['budget']} ({b['other']:.3f} vs {b['hybrid']:.3f})" for b in v["beaten"])
            lines.append(
                f"- {v['model']}: hybrid at least as good as every other algorithm: MISSED, beaten by {worst}."
            )
    return "\n".join(lines)


def in_order(models: dict[str, Any]) -> list[dict[str, Any]]:
    """The models' verdicts in the section's order: FULL_MODELS' order, then any other model by name."""
    return [models[name]["verdict"] for name in _model_order(models)]


def _model_order(models: dict[str, Any]) -> list[str]:
    return [m for m in FULL_MODELS if m in models] + sorted(set(models) - set(FULL_MODELS))


def render(saved: dict[str, Any]) -> str:
    """The section's body from the saved result (``records.SearchEfficiencyResult``): bench/render.py calls it."""
    models = saved["models"]
    order = _model_order(models)
    # the timing the landscapes were measured with (their cache key), this module's when no model says
    measure = models[order[0]]["landscape_key"].get("measure") if order else None
    measure = measure or LANDSCAPE_MEASURE.model_dump()
    return "\n\n".join(
        [
            "Each model's whole landscape (every allowed point of the engine's search space) is measured and scored "
            "once by the engine itself, then every algorithm is replayed against those cached scores through "
            f"ask/tell for {saved['seeds']} seeds. Landscape measurements use shorter timing than a real search "
            f"({measure['min_runs']}-{measure['max_runs']} runs, at most "
            f"{measure['max_seconds']:g} s per point), so the optimum can be a point that won by timing noise; "
            "scores within a few per cent of each other are not distinguishable on this machine. TPE is Optuna's "
            "TPESampler over categorical choice indices; forbidden and repeated proposals are told back without "
            "costing an evaluation (see `bench/search_replay.py`). `hybrid` is the default search as the engine runs "
            "it without history: its start follows the engine's built-in prior (the knobs' known-good defaults, int8 "
            "where the profile's int8/fp32 GEMM peaks say it pays, threads at the physical cores; then one untried "
            "knob at a time from the best point so far, see `core/engine/search/prior.py`); `hybrid (space-filling "
            "start)` is the same search with the space-filling start it had before; `hybrid (no surrogate)` takes "
            "the prior's start but not the surrogate filter. Landscapes are replayed from their files alone "
            "(`search_replay.from_document`: the dimensions the engine declared when they were measured, and the "
            "model and hardware features the surrogate and prior read), so they replay exactly as measured on the "
            "machine they name.",
            *saved["notes"],
            "Targets: hybrid reaches >= 98 % of the exhaustive optimum with <= 10 % of the evaluations, and is at "
            "least as good as every other algorithm at every budget (median over seeds).",
            verdict_lines(in_order(models)),
            *([f"Note: {saved['why']}"] if saved["why"] else []),
            *(model_section(name, models[name], saved["algorithms"]) for name in order),
        ]
    )


def load_saved() -> dict[str, Any]:
    path = benchlib.RESULTS / f"{NAME}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def reusable_replay(
    saved: dict[str, Any], name: str, model: Model | Cached, seeds: int, algorithms: list[str]
) -> tuple[dict[str, sr.AlgorithmResult] | None, str]:
    """The saved replay of ``name`` when it was made on this very landscape with these seeds and algorithms."""
    entry = saved.get("models", {}).get(name)
    same = (
        entry is not None
        and entry.get("landscape_key") == json.loads(json.dumps(model.cache_key, default=str))
        and saved.get("seeds") == seeds
        and sorted(saved.get("algorithms", [])) == sorted(algorithms)
    )
    if not same:
        return None, ""
    results = {alg: sr.AlgorithmResult.from_summary(alg, summary) for alg, summary in entry["results"].items()}
    return results, entry.get("replayed_at", saved.get("machine", {}).get("date", "an earlier run"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="digits only, 5 seeds")
    parser.add_argument("--models", nargs="+", choices=sorted(FULL_MODELS), help="override the model list")
    parser.add_argument("--seeds", type=int, help="seeds per algorithm (default 20, quick 5)")
    parser.add_argument("--jobs", type=int, default=1, help="replay processes (replay only; landscapes are serial)")
    parser.add_argument("--refresh", action="store_true", help="re-measure landscapes even when cached")
    parser.add_argument(
        "--replay-cached",
        action="store_true",
        help="replay the cached landscape files as they are (measured on another machine or under an older "
        "knob set too), without building the engine's space on this machine and without measuring",
    )
    parser.add_argument(
        "--replay",
        nargs="+",
        metavar="ALGORITHM",
        help="replay only these algorithms and reuse the saved results of the others (same landscape and seeds)",
    )
    parser.add_argument("--measure-only", action="store_true", help="measure (or load) the landscapes and stop")
    parser.add_argument("--why", default="", help="a note for the report (e.g. how loaded the machine was)")
    parser.add_argument(
        "--reuse-replay",
        action="store_true",
        help="reuse the saved replay of every model whose landscape, seeds and algorithms are unchanged "
        "(replay only the others)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="rebuild the section from the saved replays and cached landscapes, measuring and replaying nothing",
    )
    args = parser.parse_args(argv)
    saved = load_saved() if (args.reuse_replay or args.render_only or args.replay) else {}
    if args.render_only and not saved:
        print(f"--render-only needs {benchlib.RESULTS / NAME}.json; run the benchmark once first", file=sys.stderr)
        return 2
    if args.render_only and not args.models:
        args.models = list(saved["models"])
    models = {m: FULL_MODELS[m] for m in args.models} if args.models else (QUICK_MODELS if args.quick else FULL_MODELS)
    seeds = range(args.seeds or (5 if args.quick else 20))
    algorithms = list(sr.runners(include_tpe=False))
    notes = []
    if sr.optuna_available():
        algorithms.append("tpe")
    else:
        notes.append("Optuna is not installed (bench extra), so the TPE peer was skipped.")
        print("optuna not installed: skipping the TPE peer (pip install -e '.[bench]')", file=sys.stderr)

    if args.replay and saved and saved.get("seeds") == len(seeds):
        # a peer this machine cannot run (TPE without Optuna) keeps its saved results: its code is unchanged
        reused = [a for a in saved.get("algorithms", []) if a not in algorithms]
        algorithms = list(dict.fromkeys([*algorithms, *saved.get("algorithms", [])]))
        notes = [n for n in notes if "TPE" not in n or "tpe" not in reused]
        if reused:
            notes.append(
                f"{', '.join(reused)}: results reused from the replay of {saved.get('machine', {}).get('date', '?')} "
                "on the same landscapes and seeds (not replayable here; its code is unchanged)."
            )
    if args.render_only:
        seeds, algorithms, notes = range(saved["seeds"]), saved["algorithms"], saved.get("notes", [])
    payload: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="search_eff_") as tmp:
        loaded: dict[str, tuple[Model | Cached, dict[str, Any], bool]] = {}
        for name, batch in models.items():
            if args.replay_cached or args.render_only:
                cached, data = load_cached(name)
                loaded[name] = (cached, data, True)
            else:
                model = load_model(name, batch, Path(tmp))
                data, reused = get_landscape(model, args.refresh, may_measure=True)
                loaded[name] = (model, data, reused)
            _LANDSCAPES[name] = to_landscape(data)
        if args.measure_only:
            return 0
        for name, (model, data, reused) in loaded.items():
            landscape = _LANDSCAPES[name]
            target_budget = max(1, math.floor(TARGET_SHARE * landscape.size))
            budgets = tuple(sorted({*BUDGETS, target_budget}))
            results, replayed_at = reusable_replay(saved, name, model, len(seeds), algorithms)
            if results is None and args.render_only:
                print(f"--render-only: no saved replay of {name} on this landscape; run without it", file=sys.stderr)
                return 2
            if results is None and args.replay:
                kept = reusable_replay(saved, name, model, len(seeds), saved.get("algorithms", []))[0] or {}
                replayable = sr.runners(include_tpe=sr.optuna_available())
                todo = [a for a in algorithms if a in replayable and (a in args.replay or a not in kept)]
                print(f"replaying {', '.join(todo)} x {len(seeds)} seeds on {name}; reusing the rest", flush=True)
                fresh = replay_all(name, todo, seeds, budgets, args.jobs)
                results = {a: fresh[a] if a in fresh else kept[a] for a in algorithms if a in fresh or a in kept}
                plot(name, results, target_budget, benchlib.RESULTS / f"{NAME}_{name}.png")
                replayed_at = benchlib.machine()["date"]
            elif results is None:
                print(f"replaying {len(algorithms)} algorithms x {len(seeds)} seeds on {name}...", flush=True)
                results = replay_all(name, algorithms, seeds, budgets, args.jobs)
                plot(name, results, target_budget, benchlib.RESULTS / f"{NAME}_{name}.png")
                replayed_at = benchlib.machine()["date"]
            else:
                print(f"{name}: reusing the replay of {replayed_at}", flush=True)
            verdict = verdicts(name, results, target_budget, landscape.size)
            recipes = {tuple(p["key"]): p["recipe"] for p in data["points"]}
            payload[name] = {
                "batch": model.batch,
                "landscape": str(landscape_path(name).relative_to(benchlib.ROOT)),
                "landscape_key": model.cache_key,
                "landscape_summary": landscape_summary(data),
                "reused": reused,
                "why_beaten": why_facts(landscape, verdict, data["baseline"]["p50_ms"], recipes),
                "allowed_points": landscape.size,
                "optimum": landscape.optimum,
                "results": {alg: res.summary() for alg, res in results.items()},
                "verdict": verdict,
                "plot": f"bench/results/{NAME}_{name}.png",
                "replayed_at": replayed_at,
            }
    result = {
        "seeds": len(seeds),
        "budgets": list(BUDGETS),
        "algorithms": algorithms,
        "models": payload,
        "notes": notes,
        "why": args.why,
    }
    benchlib.write_result(
        NAME,
        "Search efficiency",
        result,
        command=saved.get("command") if args.render_only else None,
        facts=saved.get("machine") if args.render_only else None,
    )
    print(verdict_lines(in_order(payload)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
