"""Runtime choice: per model, does the search pick the faster runtime, ONNX Runtime or OpenVINO?

For each model the engine behind ``metainfer adapt`` runs with batch 1, a fixed
trial budget and seed 0, with both runtimes in its space. Then six contenders
are timed in one interleaved loop (same samples, same warm-up, rounds that
alternate, so background load hits all alike): ONNX Runtime FP32 with default
session options, OpenVINO FP32 (CPU plugin, latency hint), OpenVINO + NNCF
(NNCF's default int8 on the same calibration samples), the fastest feasible
candidate the search measured on each runtime, and the variant it shipped.
The row says which runtime it shipped and whether that is the fastest
contender within the timing noise (5 %).

    PYTHONSAFEPATH=1 .venv/bin/python bench/runtime_choice.py [--quick] [--trials N] [--only NAME ...]

``--quick``: Inception v2 and digits, 8 trials each (a few minutes).

Models: the onnx package's light Inception v1/v2 and SqueezeNet (real shapes,
constant weights: latency evidence), the digits example, the trained
YOLOX-style text detector of the CNN matrix when its wheel is cached, and, with
the bench extra, all-MiniLM-L6-v2 at batch 8 on passages that fill all 128
tokens (a transformer with no padding to remove).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import benchlib
from metainfer.agent.zoo import build_examples
from metainfer.agent.zoo.light import build_light_inputs, light_model_path, load_light_model
from metainfer.core.engine.data import Dataset, load_npz
from metainfer.core.engine.evaluate import MeasureSettings, measure_interleaved
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile import load_or_measure
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import quality_of, run_all
from metainfer.core.engine.report import AdaptSettings, Report
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.scoring import Constraints
from metainfer.core.engine.transforms import build_variant
from metainfer.core.engine.trial import TrialStatus

NAME = "runtime_choice"
TITLE = "Runtime choice: ONNX Runtime or OpenVINO, per model"
LIGHT = ("light_inception_v1", "light_inception_v2", "light_squeezenet")
FULL_LENGTH = "minilm_l6_full_length"  # a transformer with every token real, at batch 8
BATCHES = {FULL_LENGTH: 8}
NOISE = 0.05
TIMER_FLOOR_MS = 0.01  # below this, differences of a few microseconds are not a model's speed (digits: 0.02 ms)
QUALITY_BUDGET = Constraints().max_quality_drop  # the adaptation's default budget, which the search ran under
CONTENDERS = ("ort_fp32", "openvino_fp32", "openvino_nncf", "best_ort", "best_openvino", "metainfer")
LABELS = {
    "ort_fp32": "ORT FP32",
    "openvino_fp32": "OpenVINO FP32",
    "openvino_nncf": "OpenVINO + NNCF",
    "best_ort": "best on ORT",
    "best_openvino": "best on OpenVINO",
    "metainfer": "metainfer's pick",
}
TIMING = MeasureSettings(warmup_runs=5, min_runs=60, max_runs=600, max_seconds=6.0)


def _models(work: Path, only: list[str] | None) -> dict[str, tuple[Path, Dataset]]:
    models: dict[str, tuple[Path, Dataset]] = {}
    for name in LIGHT:
        path = light_model_path(name)
        models[name] = (path, Dataset(inputs=build_light_inputs(load_light_model(name), 16)))
    digits = build_examples(work, ["digits"])["digits"]
    models["digits"] = (digits.model_path, load_npz(digits.data_path, inspect_model(digits.model_path)))
    try:
        from testkit.cnn_models import NETS, feed_for

        detector = next(n for n in NETS if n.name == "yolox_ddddocr_det")
        path = detector.path()
        models[detector.name] = (path, Dataset(inputs=feed_for(detector, 16)))
    except Exception as exc:  # the wheel may be absent (no index) or the helper renamed: the row is left out
        print(f"yolox_ddddocr_det left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        models[FULL_LENGTH] = _minilm_full_length(work)
    except Exception as exc:  # needs the bench extra's checkpoint and tokenizer (`make bench-deps`)
        print(f"{FULL_LENGTH} left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    return {k: v for k, v in models.items() if not only or k in only}


def _minilm_full_length(work: Path) -> tuple[Path, Dataset]:
    """all-MiniLM-L6-v2 on passages that fill all 128 tokens: no padding for the search to remove."""
    from metainfer.agent.zoo.minilm import build_minilm, build_texts, tokenize

    built = build_minilm(work / FULL_LENGTH)
    sentences = build_texts(48 * 12, seed=1)
    feed = tokenize([" ".join(sentences[i * 12 : (i + 1) * 12]) for i in range(48)])
    if not feed["attention_mask"].all():
        raise ValueError("a passage is shorter than 128 tokens: the row would have padding to remove")
    return built.model_path, Dataset(inputs=feed)


def _fastest(report: Report, runtime: str) -> Recipe | None:
    feasible = [
        t for t in report.trials
        if t.status == TrialStatus.FEASIBLE and t.metrics is not None and t.recipe.session.runtime == runtime
    ]  # fmt: skip
    if not feasible:
        return None
    return min(feasible, key=lambda t: t.metrics.latency.p50_ms if t.metrics else float("inf")).recipe


def run_model(
    name: str,
    path: Path,
    data: Dataset,
    trials: int,
    profile: Any,
    batch: int = 1,
    built: dict[str, tuple[bytes | str, Recipe]] | None = None,
    task_quality: Callable[[dict[str, np.ndarray]], dict[str, dict[str, float]]] | None = None,
) -> dict[str, Any]:
    """Adapt ``path`` on ``data``, then time the contenders interleaved and score them on the quality samples.

    ``built``: models made outside the engine (the naive one-liners, Olive's pick; bytes or a path) with the
    session settings they run with.
    ``task_quality``: task metrics from every contender's first output on all of ``data`` (FP32's is "ort_fp32").
    """
    base = path.read_bytes()
    info = inspect_model(path)
    settings = AdaptSettings(batch=batch, budget_trials=trials, seed=0)
    started = time.perf_counter()
    adaptation = Adaptation(base, info, data, profile, settings)
    report, _ = adaptation.run()
    adapt_s = time.perf_counter() - started
    pick = report.best.recipe if report.best is not None else Recipe()
    recipes: dict[str, Recipe | None] = {
        "ort_fp32": Recipe(),
        "openvino_fp32": Recipe.model_validate({"session": {"runtime": "openvino"}}),
        # The peer an OpenVINO user runs: NNCF's default int8 on the same calibration samples, latency hint.
        "openvino_nncf": Recipe.model_validate(
            {
                "transform": {"quantization": {"mode": "int8_static", "quantizer": "nncf"}},
                "session": {"runtime": "openvino"},
            }
        ),
        "best_ort": _fastest(report, "onnxruntime"),
        "best_openvino": _fastest(report, "openvino"),
        "metainfer": pick,
    }
    timed = {k: r for k, r in recipes.items() if r is not None}
    sessions = {
        k: create_session(build_variant(base, r.transform, adaptation.calibration), r) for k, r in timed.items()
    }
    sessions |= {k: create_session(model, recipe) for k, (model, recipe) in (built or {}).items()}
    stats = measure_interleaved(list(sessions.values()), data, batch, TIMING, rounds=6)
    latency = {k: {"p50_ms": s.p50_ms, "p95_ms": s.p95_ms} for k, s in zip(sessions, stats, strict=True)}
    assert adaptation.reference is not None
    quality = {
        k: quality_of(run_all(session, adaptation.quality_data, batch), adaptation.reference).value
        for k, session in sessions.items()
    }
    task = task_quality({k: run_all(s, data, batch)[0] for k, s in sessions.items()}) if task_quality else None
    fastest = min(latency, key=lambda k: latency[k]["p50_ms"])
    return {
        "model": name,
        "adapt_s": round(adapt_s, 1),
        "scan_s": round(report.sensitivity_wall_s, 1),
        "trials": len(report.trials),
        "openvino_trials": sum(t.recipe.session.runtime == "openvino" for t in report.trials),
        "nncf_trials": sum(t.recipe.transform.quantization.quantizer == "nncf" for t in report.trials),
        "picked_runtime": pick.session.runtime,
        "final_race": [e.model_dump() for e in report.final.runoff] if report.final is not None else [],
        "final_note": report.final.note if report.final is not None else "",
        "picked": pick.describe(),
        "quality_drop": report.best.metrics.quality.drop if report.best and report.best.metrics else None,
        "recipes": {k: r.describe() for k, r in timed.items()},
        "latency": latency,
        "quality_metric": adaptation.reference.metric,
        "quality": quality,
        "fastest": fastest,
        "pick_within_noise": latency["metainfer"]["p50_ms"] <= latency[fastest]["p50_ms"] * (1 + NOISE),
        "batch": batch,
        **({"task_quality": task} if task is not None else {}),
    }


def _same_as_pick(row: dict[str, Any]) -> list[str]:
    """The searched contenders whose recipe is the pick's own (timed twice: their gap is timing noise)."""
    pick = row["recipes"]["metainfer"]
    return [c for c in ("best_ort", "best_openvino") if row["recipes"].get(c) == pick]


def within_budget(row: dict[str, Any]) -> list[str]:
    """The contenders whose quality is within the adaptation's budget of ORT FP32's (all, in rows without quality)."""
    quality = row.get("quality")
    if not quality:
        return list(row["latency"])
    return [c for c in row["latency"] if quality["ort_fp32"] - quality[c] <= QUALITY_BUDGET + 1e-9]


def fastest_within_budget(row: dict[str, Any]) -> str:
    return min(within_budget(row), key=lambda c: row["latency"][c]["p50_ms"])


def pick_is_fastest(row: dict[str, Any]) -> bool:
    """Within the noise of the fastest contender at equal quality budget, timed as the pick or as its own recipe's
    second timing."""
    latency = row["latency"]
    best_of_pick = min(latency[c]["p50_ms"] for c in ("metainfer", *_same_as_pick(row)))
    fastest = latency[fastest_within_budget(row)]["p50_ms"]
    return bool(best_of_pick <= max(fastest * (1 + NOISE), fastest + TIMER_FLOOR_MS))


def _full_length_sentence(row: dict[str, Any]) -> str:
    latency, quality = row["latency"], row["quality"]
    speedup = latency["ort_fp32"]["p50_ms"] / latency["metainfer"]["p50_ms"]
    best_ort = latency["ort_fp32"]["p50_ms"] / latency["best_ort"]["p50_ms"] if "best_ort" in latency else None
    return (
        f"{FULL_LENGTH}: a transformer with no padding to remove (every one of the 128 tokens real, batch"
        f" {row.get('batch', 1)}): the pick is {speedup:.2f}x ORT FP32 at p50, quality {quality['metainfer']:.4f}"
        + (f"; the fastest ONNX Runtime variant the search measured is {best_ort:.2f}x." if best_ort else ".")
    )


def render(data: dict[str, Any]) -> str:
    header = [
        "model", "picked", *(LABELS[c] for c in CONTENDERS), "fastest", "adapt s (scan s; OpenVINO, NNCF trials)"
    ]  # fmt: skip
    rows = []
    for row in data["rows"]:
        cells = []
        for c in CONTENDERS:
            lat = row["latency"].get(c)
            q = row.get("quality", {}).get(c)
            cells.append(
                f"{lat['p50_ms']:.2f} / {lat['p95_ms']:.2f}" + (f" · {q:.4f}" if q is not None else "") if lat else "—"
            )
        same = "".join(f" (= {LABELS[c]})" for c in _same_as_pick(row))
        mark = "" if pick_is_fastest(row) else " (pick not fastest)"
        over = [LABELS[c] for c in row["latency"] if c not in within_budget(row)]
        mark += f"; over the quality budget: {', '.join(over)}" if over else ""
        rows.append(
            [row["model"], f"{row['picked_runtime']}: {row['picked']}{same}", *cells,
             LABELS[fastest_within_budget(row)] + mark,
             f"{row['adapt_s']:.0f} ({row.get('scan_s', 0):.0f}; {row['openvino_trials']}, {row.get('nncf_trials', 0)}"
             f" of {row['trials']})"]
        )  # fmt: skip
    misses = [r["model"] for r in data["rows"] if not pick_is_fastest(r)]
    text = [
        "p50 / p95 ms · quality (FP32's metric: top-1 with labels, else cosine to ORT FP32, mean-pooled over the"
        " tokens for a sentence encoder, on the adaptation's"
        " quality samples)."
        f" p50 / p95 ms at batch 1 ({FULL_LENGTH}: 8 passages of 128 real tokens), timed interleaved after a"
        f" {data['trials']}-trial search (seed 0) with both runtimes"
        f' in the space; "fastest" is the contender with the lowest p50 among those within the quality budget'
        f" ({QUALITY_BUDGET} of ORT FP32's value, the adaptation's budget), and the pick counts as fastest within"
        f" {NOISE:.0%} (or {TIMER_FLOOR_MS} ms), as itself or as its own recipe timed a second time"
        ' ("= best on ..."; the gap between'
        " the two timings of one recipe is this machine's noise).",
        benchlib.markdown_table(header, rows),
        "Rows where the pick is not the fastest contender: " + (", ".join(misses) if misses else "none") + ".",
        "OpenVINO here is the CPU plugin of `openvino`; its precision knob offers bf16 only where the CPU computes"
        " it natively (avx512_bf16 or amx_bf16 in the machine line), and every OpenVINO contender names its"
        " precision (OpenVINO FP32 is f32, not the plugin's default, which is bf16 on such a CPU). The light nets"
        " have constant weights, so their quality is no evidence: their logits are all equal, and where the output"
        " is a softmax over them (SqueezeNet: 1/1000 each) rounding in the last place moves it (OpenVINO's f32"
        " kernels put 1/8 on eight classes: cosine 0.71), which the quality gate then refuses. OpenVINO + NNCF is"
        " NNCF's default int8 (same calibration samples) compiled with the latency hint; metainfer's space holds"
        " it and its variations (NNCF with the ONNX Runtime runtime, threads, hints, mixed precision). Not measured"
        " here: Olive, the naive one-liners (the CNN matrix and bench/ocr_matrix.py have them).",
    ]
    text += [_full_length_sentence(row) for row in data["rows"] if row["model"] == FULL_LENGTH]
    return "\n\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--quick", action="store_true", help="Inception v2 and digits, 8 trials each")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.only = 8, args.only or ["light_inception_v2", "digits"]
    profile = load_or_measure()
    with tempfile.TemporaryDirectory(prefix="metainfer-runtime-choice-") as tmp:
        rows = []
        for name, (path, data) in _models(Path(tmp), args.only).items():
            print(f"{name}: adapting ({args.trials} trials) and timing", file=sys.stderr, flush=True)
            rows.append(run_model(name, path, data, args.trials, profile, BATCHES.get(name, 1)))
            print(f"  picked {rows[-1]['picked_runtime']}: {rows[-1]['picked']}", file=sys.stderr, flush=True)
    command = None  # write_result's default: this command line
    if args.only:  # a partial rerun replaces its rows in the saved section and keeps the others
        rows, command = benchlib.merge_into_saved(NAME, rows, "model")
    benchlib.write_result(NAME, TITLE, {"trials": args.trials, "rows": rows}, command=command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
