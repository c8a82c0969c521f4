"""Warm start across hardware classes: how many evaluations an earlier run's trials save a new class.

    PYTHONSAFEPATH=1 .venv/bin/python bench/warm_start.py [--quick] [--seeds N] [--jobs N]

Classes: the same examples measured as different "hardware classes" on this
machine, whose landscapes differ measurably: ONNX Runtime pinned to one core
(``os.sched_setaffinity``: the profile then sees 1 usable core, a new class
fingerprint, and thread counts above 1 oversubscribe it) against both cores;
and, as a class from another machine, the landscapes ``search_efficiency``
cached on an Intel Xeon (light_squeezenet: the same model; digits: the
model's earlier build, same graph with other weights). Every landscape
(every allowed point of the engine's space) is measured once by the engine's
own code (``search_efficiency.measure_landscape``, each class in a child
process so the affinity stays there) and cached in
``bench/results/warm_start_landscape_<class>.json`` under its key (model
sha256, batch, space, class fingerprint, measure settings).

Replay, per scenario (target class <- source class) and seed: the source's
history is what a cold ``metainfer adapt`` of 24 trials measured there (the
default hybrid replayed on the source landscape with that seed), turned into
a ``TrialHistory`` source with the source's features; the warm run is the
hybrid with ``history.warm_start``'s prior on the target. Compared with the
hybrid's cold start (its built-in prior, the default without history) and the
space-filling start it had before this change. Metrics: evaluations to reach
98 % of the target's exhaustive optimum (median over seeds; a seed that never
gets there within 24 counts as slower than any that did) and the median
fraction of the optimum within 3 / 5 / 10 evaluations (a dedicated run per
budget, as the engine would run it). "Useless" scenarios give the target the
history of an unrelated model: the warm start must then do no harm.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import benchlib
from bench import search_replay as sr

NAME = "warm_start"
BUDGETS = (3, 5, 10)
TOP_BUDGET = 24  # evaluations-to-98 % are read from a run of this many (the CLI's default budget)
SOURCE_BUDGET = 24  # trials in the source's history: one default cold run there
LEVEL = 0.98
NOISE = 0.02  # fraction of the optimum the landscapes cannot resolve (LANDSCAPE_MEASURE's timing)


@dataclass(frozen=True)
class ClassSpec:
    """One "hardware class" of one example on this machine (cores: None = all, else pinned to that many)."""

    model: str
    batch: int
    cores: int | None
    description: str


CLASSES: dict[str, ClassSpec] = {
    "squeezenet_2c": ClassSpec("light_squeezenet", 1, None, "light_squeezenet, batch 1, both cores"),
    "squeezenet_1c": ClassSpec("light_squeezenet", 1, 1, "light_squeezenet, batch 1, pinned to 1 core"),
    "digits_2c": ClassSpec("digits", 64, None, "digits, batch 64, both cores"),
    "digits_1c": ClassSpec("digits", 64, 1, "digits, batch 64, pinned to 1 core"),
}
# Classes measured elsewhere, replayed from search_efficiency's cache (Intel Xeon, 2 cores, commit 4931b4b).
EXTERNAL: dict[str, tuple[str, str]] = {
    "squeezenet_xeon": ("search_efficiency_landscape_light_squeezenet.json", "light_squeezenet on an Intel Xeon"),
    "digits_xeon_v1": ("search_efficiency_landscape_digits.json", "digits' earlier build on an Intel Xeon"),
}


@dataclass(frozen=True)
class Scenario:
    target: str
    source: str
    what: str
    useless: bool = False


SCENARIOS = (
    Scenario("squeezenet_2c", "squeezenet_1c", "same model, 1 core -> 2 cores"),
    Scenario("squeezenet_1c", "squeezenet_2c", "same model, 2 cores -> 1 core"),
    Scenario("squeezenet_2c", "squeezenet_xeon", "same model, Intel Xeon -> this AMD EPYC"),
    Scenario("digits_2c", "digits_1c", "same model, 1 core -> 2 cores"),
    Scenario("digits_1c", "digits_2c", "same model, 2 cores -> 1 core"),
    Scenario("digits_2c", "digits_xeon_v1", "earlier model build on an Intel Xeon -> this model here"),
    Scenario("squeezenet_2c", "digits_2c", "unrelated model (digits MLP) on the same class", useless=True),
    Scenario("digits_1c", "squeezenet_1c", "unrelated model (squeezenet) on the same class", useless=True),
)
QUICK_SCENARIOS = (SCENARIOS[0], SCENARIOS[3], SCENARIOS[6])


def landscape_path(name: str) -> Path:
    if name in EXTERNAL:
        return benchlib.RESULTS / EXTERNAL[name][0]
    return benchlib.RESULTS / f"{NAME}_landscape_{name}.json"


# -- measuring (each class in its own process: the affinity must not leak) --------------------------------
def measure_class(name: str, refresh: bool) -> None:
    """Runs in the child: pin, build the engine's space here, measure unless the cache matches."""
    spec = CLASSES[name]
    if spec.cores is not None:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: spec.cores]))
    from bench import search_efficiency as se

    with tempfile.TemporaryDirectory(prefix="warm_start_") as tmp:
        model = se.load_model(spec.model, spec.batch, Path(tmp))
        key = {**json.loads(json.dumps(model.cache_key, default=str)), "class": name, "cores": spec.cores}
        path = landscape_path(name)
        if not refresh and path.is_file():
            try:
                if json.loads(path.read_text()).get("key") == key:
                    print(f"{name}: cached landscape matches ({path.name})", flush=True)
                    return
            except ValueError:
                pass
        print(f"measuring {name} ({len(model.space.allowed_keys())} points)...", flush=True)
        data = se.measure_landscape(model)
        data["key"] = key
        data["class"] = spec.description
        tmp_path = path.with_suffix(".tmp")
        tmp_path.write_text(json.dumps(data, indent=1, default=str) + "\n")
        tmp_path.replace(path)


def measure_all(names: list[str], refresh: bool) -> None:
    for name in names:
        command = [sys.executable, str(Path(__file__).resolve()), "--measure-class", name]
        if refresh:
            command.append("--refresh")
        code = subprocess.call(command, env={**os.environ, "PYTHONSAFEPATH": "1"})
        if code:
            raise SystemExit(f"measuring {name} failed (exit {code})")


# -- replay ---------------------------------------------------------------------------------------------
_LANDSCAPES: dict[str, sr.Landscape] = {}
_DOCS: dict[str, dict[str, Any]] = {}


def load_landscapes(names: set[str]) -> None:
    for name in sorted(names):
        doc = json.loads(landscape_path(name).read_text())
        _DOCS[name] = doc
        _LANDSCAPES[name] = sr.from_document(doc)


def source_history(source: str, seed: int) -> Any:
    """What a default cold run of SOURCE_BUDGET trials measured on the source class, as a history source."""
    from metainfer.core.engine.history import HistorySource, HistoryTrial
    from metainfer.core.engine.search import HybridSearcher

    land, doc = _LANDSCAPES[source], _DOCS[source]
    rows = {tuple(r["key"]): r for r in doc["points"]}
    searcher = HybridSearcher(land.space, seed, budget=SOURCE_BUDGET, featurizer=land.featurizer, prior=land.prior)
    sr.replay(searcher, land, SOURCE_BUDGET)
    trials = []
    for point, score in searcher.history:
        row = rows[land.space.key(point)]
        failure = (row.get("violations") or [None])[0] or row.get("error")
        trials.append(
            HistoryTrial(
                point=point,
                status=row["status"],
                score=score,
                p50_ms=row.get("p50_ms"),
                p95_ms=row.get("p95_ms"),
                quality_drop=row.get("quality_drop"),
                quality_measure=LANDSCAPE_MEASURE,
                failure=None if failure is None else str(failure)[:200],
            )
        )
    assert land.features is not None
    return HistorySource(**dict(land.features), label=source, trials=trials)


# Each landscape's drops were measured by one metric, the one its model resolves to on both classes: the warm run
# compares them as the engine compares drops of the same measure.
LANDSCAPE_MEASURE = "landscape"


def warm_runner(scenario: Scenario) -> sr.Runner:
    from metainfer.core.engine.history import warm_start
    from metainfer.core.engine.search import HybridSearcher

    cache: dict[int, Any] = {}

    def run(landscape: sr.Landscape, seed: int, budget: int) -> sr.Scores:
        if seed not in cache:
            assert landscape.features is not None
            history = [source_history(scenario.source, seed)]
            cache[seed] = warm_start(landscape.space, landscape.features, history, LANDSCAPE_MEASURE)[0]
        searcher = HybridSearcher(
            landscape.space, seed, budget=budget, featurizer=landscape.featurizer, prior=cache[seed]
        )
        return sr.replay(searcher, landscape, budget)

    return run


STARTS: dict[str, str] = {
    "warm": "history.warm_start's prior from the source's 24 trials",
    "cold": "built-in prior, no history (the default)",
    "space-filling": "no prior: the space-filling start the hybrid had before",
}


def _task(index: int, start: str, seed: int) -> tuple[sr.SeedRun, float]:
    scenario = _SCENARIOS[index]
    started = time.perf_counter()
    runner = {
        "warm": lambda: warm_runner(scenario),
        "cold": lambda: sr.hybrid_runner(True),
        "space-filling": lambda: sr.hybrid_runner(True, prior=None),
    }[start]()
    budgets = (*BUDGETS, TOP_BUDGET)
    return sr.run_seed("hybrid", runner, _LANDSCAPES[scenario.target], seed, budgets, (LEVEL,)), (
        time.perf_counter() - started
    )


_SCENARIOS: list[Scenario] = []


def replay_all(seeds: range, jobs: int) -> dict[tuple[int, str], sr.AlgorithmResult]:
    """Every (scenario, start) over every seed; cold and space-filling runs are shared by scenarios of a target."""
    tasks: list[tuple[int, str, int]] = []
    done_targets: dict[tuple[str, str], int] = {}
    for i, sc in enumerate(_SCENARIOS):
        for start in STARTS:
            if start != "warm" and (sc.target, start) in done_targets:
                continue
            done_targets.setdefault((sc.target, start), i)
            tasks += [(i, start, seed) for seed in seeds]
    if jobs > 1:
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            done = list(pool.map(_task, *zip(*tasks, strict=True)))
    else:
        done = [_task(*t) for t in tasks]
    out: dict[tuple[int, str], sr.AlgorithmResult] = {}
    for i, sc in enumerate(_SCENARIOS):
        for start in STARTS:
            owner = i if start == "warm" else done_targets[(sc.target, start)]
            mine = [d for t, d in zip(tasks, done, strict=True) if t[0] == owner and t[1] == start]
            out[(i, start)] = sr.collect(start, [r for r, _ in mine], sum(w for _, w in mine))
    return out


# -- report ---------------------------------------------------------------------------------------------
def _evals(res: sr.AlgorithmResult) -> float | None:
    return sr.median_evals(res.reach[LEVEL])


def _cell(value: float | None, top: int = TOP_BUDGET) -> str:
    return f">{top}" if value is None else f"{value:g}"


def landscape_facts(name: str) -> dict[str, Any]:
    doc, land = _DOCS[name], _LANDSCAPES[name]
    best = max((r for r in doc["points"] if r["score"] is not None), key=lambda r: r["score"])
    return {
        "class": name,
        "what": doc.get("class") or EXTERNAL.get(name, ("", ""))[1],
        "file": str(landscape_path(name).relative_to(benchlib.ROOT)),
        "allowed_points": land.size,
        "optimum": land.optimum,
        "optimum_recipe": best["recipe"],
        "optimum_p50_ms": best["p50_ms"],
        "baseline_p50_ms": doc["baseline"]["p50_ms"],
        "fingerprint": doc["key"]["machine_fingerprint"],
        "measured_at": doc.get("measured_at"),
        "wall_s": doc.get("wall_s"),
    }


def differ(a: str, b: str) -> dict[str, Any]:
    """How differently two classes' landscapes rank the points they share (Spearman), and the source
    optimum's fraction of the target optimum when re-measured there."""
    la, lb = _LANDSCAPES[a], _LANDSCAPES[b]
    pa = {json.dumps(la.space.point(k), sort_keys=True): s for k, s in la.scores.items() if s is not None}
    pb = {json.dumps(lb.space.point(k), sort_keys=True): s for k, s in lb.scores.items() if s is not None}
    common = sorted(set(pa) & set(pb))
    rho = None
    if len(common) >= 3:
        ra = np.argsort(np.argsort([pa[c] for c in common]))
        rb = np.argsort(np.argsort([pb[c] for c in common]))
        rho = float(np.corrcoef(ra, rb)[0, 1])
    best_b = max(pb, key=lambda c: pb[c])
    return {
        "shared_points": len(common),
        "rank_correlation": rho,
        "source_optimum_in_target": pa[best_b] / la.optimum if best_b in pa else None,
    }


def verdict(sc: Scenario, res: dict[str, sr.AlgorithmResult]) -> dict[str, Any]:
    warm, cold = _evals(res["warm"]), _evals(res["cold"])
    if sc.useless:
        worse = [b for b in BUDGETS if res["warm"].median_fraction(b) < res["cold"].median_fraction(b) - NOISE]
        slower = cold is not None and (warm is None or warm > cold + 1)
        return {"target": "no harm", "met": not worse and not slower, "worse_at": worse, "slower": slower}
    filling = _evals(res["space-filling"])
    within_5 = warm is not None and warm <= 5
    half = warm is not None and (cold is None or warm <= 0.5 * cold)
    half_filling = warm is not None and (filling is None or warm <= 0.5 * filling)
    return {
        "target": "<= 5 and <= half of cold",
        # the cold start: the space-filling one the hybrid had when it was filed
        "met": within_5 and half_filling,
        "within_5": within_5,
        "half_of_space_filling": half_filling,
        "half_of_cold": half,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three scenarios, 5 seeds")
    parser.add_argument("--seeds", type=int, help="seeds (default 20, quick 5)")
    parser.add_argument("--jobs", type=int, default=1, help="replay processes")
    parser.add_argument("--refresh", action="store_true", help="re-measure the classes' landscapes")
    parser.add_argument("--measure-only", action="store_true", help="measure (or find cached) landscapes and stop")
    parser.add_argument("--replay-cached", action="store_true", help="never measure: replay the cached files")
    parser.add_argument("--measure-class", help=argparse.SUPPRESS)  # the child process of one measurement
    parser.add_argument("--why", default="", help="a note for the report")
    args = parser.parse_args(argv)
    if args.measure_class:
        measure_class(args.measure_class, args.refresh)
        return 0
    scenarios = QUICK_SCENARIOS if args.quick else SCENARIOS
    seeds = range(args.seeds or (5 if args.quick else 20))
    names = {n for sc in scenarios for n in (sc.target, sc.source)}
    if not args.replay_cached:
        measure_all(sorted(n for n in names if n in CLASSES), args.refresh)
    missing = [n for n in names if not landscape_path(n).is_file()]
    if missing:
        raise SystemExit(f"no cached landscape for {', '.join(sorted(missing))}: run without --replay-cached")
    if args.measure_only:
        return 0
    load_landscapes(names)
    _SCENARIOS[:] = scenarios
    print(f"replaying {len(scenarios)} scenarios x {len(STARTS)} starts x {len(seeds)} seeds...", flush=True)
    started = time.perf_counter()
    results = replay_all(seeds, args.jobs)
    wall = time.perf_counter() - started
    payload = []
    from metainfer.core.engine.history import similarity

    for i, sc in enumerate(scenarios):
        res = {start: results[(i, start)] for start in STARTS}
        tgt, src = _LANDSCAPES[sc.target], _LANDSCAPES[sc.source]
        assert tgt.features is not None and src.features is not None
        first = float(np.median(res["warm"].curves[:, 0])) if res["warm"].curves.size else float("nan")
        payload.append(
            {
                "target": sc.target,
                "source": sc.source,
                "what": sc.what,
                "useless": sc.useless,
                "similarity": similarity(tgt.features, src.features).model_dump(),
                "landscapes_differ": differ(sc.target, sc.source),
                "results": {start: r.summary() for start, r in res.items()},
                "verdict": verdict(sc, res),
                "warm_first_evaluation_fraction": first,
            }
        )
    data = {
        "seeds": len(seeds),
        "budgets": list(BUDGETS),
        "top_budget": TOP_BUDGET,
        "source_budget": SOURCE_BUDGET,
        "level": LEVEL,
        "classes": {n: landscape_facts(n) for n in sorted(names)},
        "scenarios": payload,
        "why": args.why,
        "replay_wall_s": wall,
        "jobs": args.jobs,
    }
    benchlib.write_result(NAME, "Warm start across hardware classes", data)
    for row in result_rows(data):
        print(" | ".join(str(c) for c in row))
    return 0


def _median_evals(p: dict[str, Any], start: str, level: float) -> float | None:
    median: float | None = p["results"][start]["evals_to"][f"{level:.2f}"]["median"]
    return median


def result_rows(saved: dict[str, Any]) -> list[list[Any]]:
    """The results table's rows: one per scenario."""
    level, top = saved["level"], saved["top_budget"]
    order = ("space-filling", "cold", "warm")
    rows = []
    for p in saved["scenarios"]:
        v, res = p["verdict"], p["results"]
        cells = [f"{p['target']} <- {p['source']}", p["what"], f"{p['similarity']['total']:.2f}"]
        cells.append(" / ".join(_cell(_median_evals(p, s, level), top) for s in order))
        for b in saved["budgets"]:
            cells.append(" / ".join(f"{res[s]['median_fraction'][str(b)]:.3f}" for s in order))
        cells.append("n/a (unrelated: cold start)" if p["useless"] else f"{p['warm_first_evaluation_fraction']:.3f}")
        if p["useless"]:
            cells.append("no harm: " + ("met" if v["met"] else "MISSED"))
        else:
            cells.append(
                "; ".join(
                    f"{what}: {'yes' if v[key] else 'no'}"
                    for what, key in (
                        ("<= 5", "within_5"),
                        ("<= 1/2 space-filling", "half_of_space_filling"),
                        ("<= 1/2 cold", "half_of_cold"),
                    )
                )
            )
        rows.append(cells)
    return rows


def render(saved: dict[str, Any]) -> str:
    """The section's body from the saved result (``records.WarmStartResult``): bench/render.py calls it."""
    level, top = saved["level"], saved["top_budget"]
    header = [
        "target <- source",
        "what changed",
        "similarity",
        "evals to 98 %: space-filling / cold / warm",
        *(f"@{b}: space-filling / cold / warm" for b in saved["budgets"]),
        "warm's 1st evaluation",
        "targets (warm)",
    ]
    class_rows = [
        [
            n,
            f["what"],
            f["fingerprint"],
            f["allowed_points"],
            f"{f['optimum']:.3f}",
            f"`{f['optimum_recipe']}` ({f['optimum_p50_ms']:.3f} ms vs FP32 {f['baseline_p50_ms']:.3f} ms)",
        ]
        for n, f in sorted(saved["classes"].items())
    ]
    differ_rows = []
    for p in saved["scenarios"]:
        d = p["landscapes_differ"]
        rho = "n/a" if d["rank_correlation"] is None else f"{d['rank_correlation']:.2f}"
        frac = (
            "not in the target's space"
            if d["source_optimum_in_target"] is None
            else f"{d['source_optimum_in_target']:.3f}"
        )
        differ_rows.append([f"{p['target']} <- {p['source']}", d["shared_points"], rho, frac])
    return "\n\n".join(
        [
            "Each class's whole landscape is measured once by the engine's own code and cached; the search is then "
            f"replayed against it for {saved['seeds']} seeds. A source's history is what one default cold run of "
            f"{saved['source_budget']} trials measured on the source class (same seed), carried as a `TrialHistory` "
            "source with the source's model and hardware features; the warm run is the hybrid with "
            "`history.warm_start`'s prior (the most similar related source's winner re-measured first, a surrogate "
            "centred on what the history measured, known failures skipped). Cold = the hybrid's default start "
            "without history (its built-in prior); space-filling = the start the hybrid had before this change. "
            f"Evaluations to reach {level:.0%} of the target's exhaustive optimum: median over seeds (a seed that "
            f"never got there within {top} counts as slowest). Fractions of the optimum: median over seeds, a "
            "dedicated run per budget.",
            "Targets: with a related history, warm reaches 98 % in <= 5 evaluations (median) and at most half of "
            "what a cold start needs; the issue measured against the space-filling start the hybrid had, and the "
            "table also compares with the new cold start (the built-in prior). With an unrelated model's history, "
            f"warm is never worse than cold by more than {NOISE:.0%} of the optimum at any budget, nor more than "
            'one evaluation slower to 98 %. "warm\'s 1st evaluation": what the re-measured winner of the source '
            "scores here, as a fraction of the optimum (median over seeds).",
            "Classes (landscapes):",
            benchlib.markdown_table(
                ["class", "what", "fingerprint", "allowed points", "optimum score", "optimum"], class_rows
            ),
            "How much the classes differ (over the points both spaces allow): Spearman rank correlation of the scores, "
            "and what the source's optimum scores on the target as a fraction of the target's optimum:",
            benchlib.markdown_table(
                ["target <- source", "shared points", "rank correlation", "source optimum on target"], differ_rows
            ),
            "Results:",
            benchlib.markdown_table(header, result_rows(saved)),
            *why_lines(saved),
            *([f"Note: {saved['why']}"] if saved["why"] else []),
            f"Replay wall time {saved['replay_wall_s']:.0f} s ({saved['jobs']} process(es)).",
        ]
    )


def why_lines(saved: dict[str, Any]) -> list[str]:
    """For each missed target, what the data says."""
    level, top = saved["level"], saved["top_budget"]
    out = []
    for p in saved["scenarios"]:
        v = p["verdict"]
        if v["met"] and (p["useless"] or v["half_of_cold"]):
            continue
        warm, cold = _median_evals(p, "warm", level), _median_evals(p, "cold", level)
        d = p["landscapes_differ"]
        if p["useless"]:
            out.append(
                f"- {p['target']} <- {p['source']}: the unrelated history cost the warm start "
                f"{', '.join(f'@{b}' for b in v['worse_at']) or 'evaluations to 98 %'} (similarity "
                f"{p['similarity']['total']:.2f})."
            )
            continue
        reasons = []
        if not v["within_5"]:
            reasons.append(f"warm needs {_cell(warm, top)} evaluations")
        first = p["warm_first_evaluation_fraction"]
        if not v["half_of_cold"] and cold is not None and cold <= 3:
            reasons.append(
                f"the cold start already needs only {_cell(cold, top)} (the built-in prior's first points are at or "
                "near the optimum here), while the warm start spends its first evaluation re-measuring the source's "
                "winner"
            )
        if not v["half_of_cold"] or not v["within_5"]:
            reasons.append(
                f"the source's winner scores {first:.3f} of the optimum here (median over seeds)"
                + (": the two classes' best recipes differ" if first < level else "")
            )
        if not v["half_of_space_filling"]:
            reasons.append("warm is not at most half of the space-filling start")
        so = d["source_optimum_in_target"]
        rho = "n/a" if d["rank_correlation"] is None else f"{d['rank_correlation']:.2f}"
        out.append(
            f"- {p['target']} <- {p['source']}: {'; '.join(reasons)}. The source's exhaustive optimum scores "
            + ("nothing comparable (not in this space)" if so is None else f"{so:.3f} of this class's optimum")
            + f"; rank correlation over the shared points {rho}."
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
