"""Adaptation quality: ORT-default FP32 vs the adapted variant, per example model, with the roofline fraction.

For each model the engine behind ``metainfer adapt`` runs with the production
batch, a fixed trial budget and a fixed seed; the variant it writes is then
measured again here, independently of the engine's own numbers: an ONNX Runtime
session with default ``SessionOptions`` on the FP32 file against the written
variant with its recipe's session options, timed in interleaved rounds of fixed
length so background load hits both alike. Quality is the
engine's metric (top-1 with labels, else mask-weighted mean-pooled cosine or
plain cosine against FP32) over every sample. The roofline fraction says how
much of the machine the variant uses (``bench/roofline.py``).

    PYTHONSAFEPATH=1 .venv/bin/python bench/adaptation.py [--quick] [--only NAME ...]

Full: every bundled example (digits, bert_mini), minilm_l6 when the bench extra
is installed, and the onnx package's nine light_* conv nets. Quick: digits,
bert_mini and two small light nets with 12 trials each (a few minutes).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import metainfer.core  # noqa: F401  # first: it switches ONNX Runtime's telemetry off before the library loads

# isort: split
import numpy as np
import onnx
import onnxruntime as ort

from bench import benchlib
from bench.roofline import ModelCost, achieved_fraction, batch_input_shapes, count_model, roofline
from metainfer.agent.zoo import build_examples, list_light_models
from metainfer.agent.zoo.minilm import minilm_available
from metainfer.core.engine.data import Dataset, load_npz
from metainfer.core.engine.evaluate import latency_stats
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.outputs import MODEL_FILE, RECIPE_FILE, write_outputs
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile import HardwareProfile, load_or_measure
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import make_reference, quality_of, run_all
from metainfer.core.engine.report import AdaptSettings
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.scoring import Constraints
from metainfer.core.engine.trial import LatencyStats

EXAMPLES_DIR = benchlib.ROOT / "build" / "bench" / "examples"
VARIANTS_DIR = benchlib.ROOT / "build" / "bench" / "adaptation"
SEED = 0
MAX_QUALITY_DROP = 0.01  # the CLI's default quality budget
TRANSFORMER_TRIALS, OTHER_TRIALS, QUICK_TRIALS = 40, 24, 12
# The nine light nets run at batch 1 with a small space (no transformer knobs); 12 trials
# each keeps the full run near 40 minutes on 2 cores instead of well over an hour.
LIGHT_TRIALS = 12
QUICK_LIGHT = ("light_squeezenet", "light_shufflenet")  # the two smallest light nets
# The independent comparison: 10 interleaved rounds (order rotated each round); in each, every session runs for
# ROUND_SECONDS and at least ROUND_MIN_RUNS times, so a fast model gets thousands of runs (its p95 means something)
# and a ~1 s VGG-19 run still gets 40. The sessions are warm from the quality pass: one warm-up run per round.
COMPARE_ROUNDS = 10
ROUND_SECONDS = 1.0
ROUND_MIN_RUNS = 4


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    trials: int
    kind: str  # "transformer" | "mlp" | "conv"


def cases(quick: bool, only: list[str] | None) -> tuple[list[Case], list[str]]:
    """The models to adapt, and notes on the ones left out."""
    notes: list[str] = []

    def trials(full: int) -> int:
        return QUICK_TRIALS if quick else full

    chosen = [
        Case("digits", 64, trials(OTHER_TRIALS), "mlp"),
        Case("bert_mini", 8, trials(TRANSFORMER_TRIALS), "transformer"),
    ]
    if not quick:
        if minilm_available():
            chosen.append(Case("minilm_l6", 8, TRANSFORMER_TRIALS, "transformer"))
        else:
            notes.append("minilm_l6 skipped: the bench extra is not installed (`make bench-deps`).")
    light = QUICK_LIGHT if quick else tuple(list_light_models())
    chosen += [Case(name, 1, trials(LIGHT_TRIALS), "conv") for name in light]
    if only:
        left_out = [c.name for c in chosen if c.name not in only]
        chosen = [c for c in chosen if c.name in only]
        if left_out:
            notes.append(f"Not run in this invocation (`--only`): {', '.join(left_out)}.")
        missing = sorted(set(only) - {c.name for c in chosen})
        if missing:
            notes.append(f"not in this mode's model list: {', '.join(missing)}")
    return chosen, notes


def example_paths(name: str) -> tuple[Path, Path]:
    """model.onnx and data.npz of one example, built once under build/bench/examples."""
    directory = EXAMPLES_DIR / name
    model, data = directory / "model.onnx", directory / "data.npz"
    if not (model.is_file() and data.is_file()):
        built = build_examples(EXAMPLES_DIR, [name])[name]
        model, data = built.model_path, built.data_path
    return model, data


def default_session(path: Path) -> ort.InferenceSession:
    """What a user gets without metainfer: ORT's default SessionOptions, CPU EP."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def peak_of(profile: HardwareProfile, dtype: str) -> float:
    """The profile's peak op/s for int8 or fp32 math."""
    return (profile.peak_gemm_gflops_int8 if dtype == "int8" else profile.peak_gemm_gflops_fp32) * 1e9


def peak_for(recipe: Recipe, profile: HardwareProfile) -> tuple[float, str]:
    """Peak op/s for the variant's math: the int8 GEMM peak for int8 recipes, else fp32.

    int8 recipes keep some math in float (attention scores, layers kept float);
    taking the faster peak for all of it keeps the bound a true lower bound.
    """
    dtype = "int8" if recipe.transform.quantization.mode.startswith("int8") else "fp32"
    return peak_of(profile, dtype), dtype


def bound_fields(work_ops: float, bytes_moved: float, peak: float, profile: HardwareProfile, p50_ms: float) -> dict:
    """The roofline bounds of one measured model against ``peak`` op/s and the profile's bandwidth."""
    roof = roofline(work_ops, bytes_moved, peak, profile.memory_bandwidth_gbps * 1e9)
    return {
        "peak_ops_per_s": peak,
        "compute_bound_ms": roof.compute_s * 1e3,
        "memory_bound_ms": roof.memory_s * 1e3,
        "bound_ms": roof.bound_s * 1e3,
        "limited_by": roof.limited_by,
        "achieved_fraction": achieved_fraction(roof.bound_s, p50_ms / 1e3),
    }


def roofline_entry(
    work: ModelCost, moved: ModelCost, peak: float, dtype: str, profile: HardwareProfile, p50_ms: float
) -> dict[str, Any]:
    return {
        "work_ops": work.total_ops,
        "bytes_moved": moved.bytes_moved,
        "parameter_bytes": moved.parameter_bytes,
        "io_bytes": moved.io_bytes,
        "peak_dtype": dtype,
        **bound_fields(work.total_ops, moved.bytes_moved, peak, profile, p50_ms),
        "uncounted": list(moved.uncounted),
    }


def adapt_one(case: Case, profile: HardwareProfile) -> dict[str, Any]:
    model_path, data_path = example_paths(case.name)
    info = inspect_model(model_path)
    data = load_npz(data_path, info)
    settings = AdaptSettings(
        batch=case.batch,
        constraints=Constraints(max_quality_drop=MAX_QUALITY_DROP),
        budget_trials=case.trials,
        seed=SEED,
    )
    report, variant = Adaptation(model_path.read_bytes(), info, data, profile, settings).run()
    out_dir = VARIANTS_DIR / case.name
    write_outputs(out_dir, report, variant)
    result: dict[str, Any] = {
        "model": case.name,
        "kind": case.kind,
        "batch": case.batch,
        "budget_trials": case.trials,
        "trials_run": len(report.trials),
        "trials_feasible": sum(t.status == "feasible" for t in report.trials),
        "trials_failed": sum(t.status == "failed" for t in report.trials),
        "search_wall_s": report.search_wall_s,
        "engine_wall_s": report.total_wall_s,
        "stop_reason": report.stop_reason,
        "samples": data.n_samples,
    }
    if report.final is not None:
        result["engine_speedup_p50"] = report.final.speedup_p50
    if report.best is None or variant is None:
        result["status"] = "no feasible variant"
        return result
    recipe = report.best.recipe
    result["recipe"] = recipe.describe()
    result["recipe_json"] = str((out_dir / RECIPE_FILE).relative_to(benchlib.ROOT))
    result["best_is_baseline"] = report.best.index == 0
    result.update(compare(model_path, out_dir / MODEL_FILE, recipe, data, case.batch))
    result.update(roofline_fractions(model_path, out_dir / MODEL_FILE, recipe, data, case.batch, profile, result))
    result["status"] = "adapted"
    return result


def compare(model_path: Path, variant_path: Path, recipe: Recipe, data: Dataset, batch: int) -> dict[str, Any]:
    """FP32 with default options vs the written variant: interleaved latency, quality on all samples."""
    fp32 = default_session(model_path)
    adapted = create_session(str(variant_path), recipe)
    reference = make_reference(fp32, data, batch)
    quality = quality_of(run_all(adapted, data, batch), reference)
    load_before = os.getloadavg()[0]
    base, best = interleaved_latency([fp32, adapted], data, batch)
    return {
        "fp32_p50_ms": base.p50_ms,
        "fp32_p95_ms": base.p95_ms,
        "fp32_runs": base.runs,
        "variant_p50_ms": best.p50_ms,
        "variant_p95_ms": best.p95_ms,
        "variant_runs": best.runs,
        "speedup_p50": base.p50_ms / best.p50_ms,
        "speedup_p95": base.p95_ms / best.p95_ms,
        "quality_metric": quality.metric,
        "quality_fp32": quality.reference,
        "quality_variant": quality.value,
        "quality_drop": quality.drop,
        "load_1m_before": load_before,
        "load_1m_after": os.getloadavg()[0],
    }


def interleaved_latency(sessions: list[ort.InferenceSession], data: Dataset, batch: int) -> list[LatencyStats]:
    """Per-batch latency of each session, timed in alternating rounds so load changes hit all alike.

    The engine's ``measure_interleaved`` stops a round once its median is stable,
    which suits a search; a benchmark wants a fixed time per round instead.
    """
    feeds = [data.batch(i * batch, batch) for i in range(max(1, min(4, data.n_samples // batch)))]
    times: list[list[float]] = [[] for _ in sessions]
    for round_ in range(COMPARE_ROUNDS):
        for i in [(round_ + k) % len(sessions) for k in range(len(sessions))]:
            sessions[i].run(None, feeds[0])
            started, runs = time.perf_counter(), 0
            while runs < ROUND_MIN_RUNS or time.perf_counter() - started < ROUND_SECONDS:
                t0 = time.perf_counter()
                sessions[i].run(None, feeds[runs % len(feeds)])
                times[i].append(time.perf_counter() - t0)
                runs += 1
    return [latency_stats(np.asarray(t), batch, COMPARE_ROUNDS) for t in times]


def roofline_fractions(
    model_path: Path,
    variant_path: Path,
    recipe: Recipe,
    data: Dataset,
    batch: int,
    profile: HardwareProfile,
    measured: dict[str, Any],
) -> dict[str, Any]:
    """Roofline of the FP32 model (fp32 peak, FP32 bytes) and of the variant (its dtype's peak, its bytes).

    The work is the FP32 model's count for both: quantized ops do the same math,
    and fused ops (ORT's Attention) are counted on the unfused graph this way.
    """
    base_model = onnx.load(model_path)
    shapes = batch_input_shapes(base_model, batch, {k: v.shape[1:] for k, v in data.inputs.items()})
    base_cost = count_model(base_model, shapes)
    variant_cost = count_model(onnx.load(variant_path), shapes)
    if any(u.startswith("graph output") for u in variant_cost.uncounted):  # same interface as the FP32 model
        variant_cost = ModelCost(
            variant_cost.float_flops, variant_cost.int_ops, variant_cost.parameter_bytes, base_cost.io_bytes
        )
    fp32_peak = peak_of(profile, "fp32")
    peak, dtype = peak_for(recipe, profile)
    return {
        "fp32_roofline": roofline_entry(base_cost, base_cost, fp32_peak, "fp32", profile, measured["fp32_p50_ms"]),
        "variant_roofline": roofline_entry(base_cost, variant_cost, peak, dtype, profile, measured["variant_p50_ms"]),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def render(saved: dict[str, Any]) -> str:
    """The section's body from the saved result (``records.AdaptationResult``): bench/render.py calls it."""
    results, profile, notes = saved["results"], saved["profile"], saved["notes"]
    quick = saved["mode"] == "quick"
    rows, roof_rows = [], []
    for r in results:
        if r.get("status") != "adapted":
            rows.append([r["model"], r.get("batch", "—"), r.get("status", "failed"), *["—"] * 7, r.get("error", "")])
            continue
        q_fmt = ".4f" if r["quality_metric"] == "top1_accuracy" else ".5f"
        rows.append(
            [
                r["model"],
                r["batch"],
                r["recipe"] + (" (= baseline)" if r["best_is_baseline"] else ""),
                f"{r['fp32_p50_ms']:.2f} / {r['fp32_p95_ms']:.2f}",
                f"{r['variant_p50_ms']:.2f} / {r['variant_p95_ms']:.2f}",
                f"{r['speedup_p50']:.2f}x",
                f"{_fmt(r.get('engine_speedup_p50'), '.2f')}x",
                f"{r['quality_metric']}: {r['quality_fp32']:{q_fmt}} → {r['quality_variant']:{q_fmt}}",
                f"{r['trials_run']} ({r['trials_feasible']} feasible, {r['trials_failed']} failed)",
                f"{r['search_wall_s']:.0f}",
                "",
            ]
        )
        f, v = r["fp32_roofline"], r["variant_roofline"]
        roof_rows.append(
            [
                r["model"],
                f"{f['work_ops'] / 1e9:.3f}",
                f"{f['bytes_moved'] / 1e6:.2f} / {v['bytes_moved'] / 1e6:.2f}",
                f"{f['compute_bound_ms']:.3f} / {v['compute_bound_ms']:.3f} ({v['peak_dtype']})",
                f"{f['memory_bound_ms']:.3f} / {v['memory_bound_ms']:.3f}",
                f"{f['achieved_fraction']:.1%} ({f['limited_by']})",
                f"{v['achieved_fraction']:.1%} ({v['limited_by']})",
            ]
        )
    table = benchlib.markdown_table(
        [
            "model",
            "batch",
            "adapted recipe",
            "FP32 p50 / p95 ms",
            "adapted p50 / p95 ms",
            "speedup p50",
            "engine's speedup",
            "quality FP32 → adapted",
            "trials",
            "search s",
            "error",
        ],
        rows,
    )
    roof_table = benchlib.markdown_table(
        [
            "model",
            "work GFLOP",
            "bytes MB FP32 / adapted",
            "compute bound ms FP32 / adapted",
            "memory bound ms FP32 / adapted",
            "FP32 roofline fraction",
            "adapted roofline fraction",
        ],
        roof_rows,
    )
    mode = (
        f"quick mode: digits and bert_mini and {', '.join(QUICK_LIGHT)}, {QUICK_TRIALS} trials each"
        if quick
        else f"full: {TRANSFORMER_TRIALS} trials (transformers), {OTHER_TRIALS} (digits), {LIGHT_TRIALS} (light nets)"
    )
    loads = [r["load_1m_before"] for r in results if "load_1m_before" in r]
    load_note = f"1-minute load average before each comparison: {min(loads):.2f}–{max(loads):.2f}." if loads else ""
    definitions = f"""
Setup ({mode}; seed {saved["seed"]}; quality budget {saved["max_quality_drop"]} = 1 pt top-1 or 1 − cosine 0.01; the
engine's default `hybrid` search; no latency SLO). The engine (`metainfer.core.engine.pipeline.Adaptation`,
as `metainfer adapt` runs it) picks the variant; this benchmark then measures it again on its own. Hardware
profile (cached by
machine fingerprint): peak GEMM fp32 {profile["peak_gemm_gflops_fp32"]:.1f} GFLOP/s, int8
{profile["peak_gemm_gflops_int8"]:.1f} GOP/s, memory bandwidth {profile["memory_bandwidth_gbps"]:.1f} GB/s.

{table}

- **FP32**: the base model in an ONNX Runtime session with default `SessionOptions` (CPU EP); **adapted**: the
  written `model.onnx` with its `recipe.json` session options. Latency is per batch at the production batch,
  both sessions timed in {COMPARE_ROUNDS} interleaved rounds of {ROUND_SECONDS:g} s each (at least
  {ROUND_MIN_RUNS} runs), p50/p95 over all runs of all rounds.
- **engine's speedup**: the engine's own back-to-back re-measurement at the end of its run, for comparison;
  the two differ by the machine's noise.
- **quality**: the engine's metric over every sample of the example's data: top-1 accuracy when the data has
  labels (digits), else the cosine of mask-weighted mean-pooled outputs (bert_mini, minilm_l6) or of the raw
  outputs (light_*), against FP32.
- **trials**: candidates the search measured; **search s**: wall time of the search loop (the profile,
  baseline, validation and the final comparison are not included).

Roofline of the best variant (`bench/roofline.py`):

{roof_table}

- **work** counts the matrix products as 2 × multiply-accumulates (MatMul, Gemm, Conv incl. groups, ORT's fused
  Attention; integer ops for the quantized forms), on the **FP32 model** for both columns: quantized ops do the
  same math, and a fused graph is then counted like the unfused one. Element-wise ops, norms, softmax and pooling
  are not counted.
- **bytes** are a lower bound: every parameter read once (initializers, constants, and the light nets'
  ConstantOfShape weight fills) plus the inputs and outputs at the production batch; the adapted column counts the
  variant's own parameters (int8 weights are a quarter of the size).
- **compute bound** = work / peak GEMM (the fp32 peak for FP32 and float variants, the int8 peak for int8 variants;
  int8 variants keep some math in float, so the faster peak keeps the bound a lower bound); **memory bound** =
  bytes / bandwidth; **roofline fraction** = max(compute, memory bound) / measured p50. 100 % would be a run at
  the machine's measured limits; the word in brackets names the binding limit.

{load_note}
"""
    caveats = [
        "The light_* nets come from the onnx package's backend tests: real architectures and FLOPs, but their "
        "weights are constant fills, so every output is the same and any quality check passes trivially; their "
        "batch is fixed at 1, where several of them are small enough for per-op overheads to dominate.",
        "bert_mini has random weights (a structural stand-in); minilm_l6 is the real trained all-MiniLM-L6-v2.",
        "The machine has few cores and may be shared; interleaving keeps the FP32/adapted ratio fair, "
        "but absolute milliseconds move with load.",
        *notes,
    ]
    cores = profile["logical_cores"] or saved["machine"]["logical_cores"]
    if loads and max(loads) > cores:
        caveats.insert(
            0,
            f"**This run was on an oversubscribed machine** (1-minute load up to {max(loads):.1f} on {cores} cores, "
            "other work running). ONNX Runtime's default FP32 session spreads each op over every core and suffers "
            "most from that, while the search favours single-threaded variants under load, so the speedups here "
            "overstate what a quiet machine shows; rerun on an idle machine for product numbers.",
        )
    over = [r["model"] for r in results if r.get("variant_roofline", {}).get("achieved_fraction", 0) > 1]
    over += [r["model"] for r in results if r.get("fp32_roofline", {}).get("achieved_fraction", 0) > 1]
    if over:
        gemm = "one" if profile["gemm_n"] is None else f"one n={profile['gemm_n']}"
        add = "an" if profile["bandwidth_mib"] is None else f"a {profile['bandwidth_mib']} MiB"
        measured = dt.datetime.fromisoformat(profile["measured_at"])
        caveats.append(
            f"A roofline fraction above 100 % ({', '.join(sorted(set(over)))}) means the run beat the profile's "
            f"measured peak: the fraction is relative to the profile's micro-benchmarks ({gemm} "
            f"GEMM, {add} Add; measured {measured:%Y-%m-%d %H:%M} UTC), "
            "which understate the hardware when taken on a loaded machine or when ORT's model kernels (fused, "
            "cache-resident at small sizes) beat the probe. Refresh with `metainfer profile --refresh` on an idle "
            "machine before reading these as absolute."
        )
    return definitions.strip() + "\n\nNotes:\n\n" + "\n".join(f"- {c}" for c in caveats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="digits, bert_mini and two light nets, 12 trials")
    parser.add_argument("--only", nargs="+", help="adapt only these models (of the mode's list)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the finished models of the saved result of the same mode and adapt only the rest "
        "(a full run takes over an hour on 2 cores; it saves after every model)",
    )
    parser.add_argument(
        "--reroof",
        action="store_true",
        help="recompute only the roofline columns of the saved result with this machine's current profile "
        "(after the profile's peaks were re-measured); every latency and choice stays from the saved run",
    )
    args = parser.parse_args(argv)
    if args.reroof:
        return reroof()
    chosen, notes = cases(args.quick, args.only)
    if not chosen:
        print("no model to adapt: " + "; ".join(notes), file=sys.stderr)
        return 2
    started = time.monotonic()
    print("hardware profile (cached per machine)...", flush=True)
    profile = load_or_measure()
    results = resumed(args.quick, chosen, notes) if args.resume else []
    done = {r["model"] for r in results}
    for case in chosen:
        if case.name in done:
            continue
        print(f"== {case.name}: batch {case.batch}, {case.trials} trials", flush=True)
        t0 = time.monotonic()
        try:
            result = adapt_one(case, profile)
        except Exception as exc:  # one model failing must not lose the others' results
            traceback.print_exc()
            result = {"model": case.name, "batch": case.batch, "status": "failed", "error": _first_line(exc)}
        result["bench_wall_s"] = time.monotonic() - t0
        results.append(result)
        summary = {k: result.get(k) for k in ("status", "recipe", "speedup_p50", "quality_variant", "error")}
        print(f"   {summary} in {result['bench_wall_s']:.0f} s", flush=True)
        # Saved after every model, so a long full run that is stopped still leaves its finished models.
        save(results, len(chosen), profile, args.quick, notes, started)
    path = save(results, len(chosen), profile, args.quick, notes, started)
    print(f"wrote {path} in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if any(r.get("status") == "failed" for r in results) else 0


def resumed(quick: bool, chosen: list[Case], notes: list[str]) -> list[dict[str, Any]]:
    """Finished models of the saved result of the same mode, in the order of ``chosen``."""
    path = benchlib.RESULTS / "adaptation.json"
    if not path.is_file():
        return []
    saved = json.loads(path.read_text())
    if saved.get("mode") != ("quick" if quick else "full"):
        return []
    by_name = {r["model"]: r for r in saved.get("results", []) if r.get("status") != "failed"}
    kept = [by_name[c.name] for c in chosen if c.name in by_name]
    if kept:
        started = saved.get("machine", {}).get("date", "an earlier run")
        command = benchlib.retypeable(saved.get("command", "an earlier run"))
        notes.append(
            f"Resumed: {', '.join(r['model'] for r in kept)} carried over (measurements unchanged) from "
            f"`{command}`, saved {started}."
        )
    return kept


def profile_summary(profile: HardwareProfile) -> dict[str, Any]:
    """The profile facts a result depends on, as saved beside it."""
    return {
        "fingerprint": profile.fingerprint,
        "peak_gemm_gflops_fp32": profile.peak_gemm_gflops_fp32,
        "peak_gemm_gflops_int8": profile.peak_gemm_gflops_int8,
        "memory_bandwidth_gbps": profile.memory_bandwidth_gbps,
        "measured_at": profile.measured_at.isoformat(),
        "logical_cores": profile.machine.logical_cores,
        "gemm_n": profile.config.gemm_n,
        "bandwidth_mib": profile.config.bandwidth_mib,
    }


def save(
    results: list[dict[str, Any]],
    planned: int,
    profile: HardwareProfile,
    quick: bool,
    notes: list[str],
    started: float,
) -> Path:
    notes = list(notes)
    if len(results) < planned:
        notes.append(f"Partial: {len(results)} of {planned} models finished when this was written.")
    data = {
        "mode": "quick" if quick else "full",
        "models_planned": planned,
        "seed": SEED,
        "max_quality_drop": MAX_QUALITY_DROP,
        "profile": profile_summary(profile),
        "notes": notes,
        "wall_s": time.monotonic() - started,
        "results": results,
    }
    return benchlib.write_result("adaptation", "Adaptation quality", data)


def reroof() -> int:
    """The saved run's section again, its roofline fractions against the current profile's peaks."""
    path = benchlib.RESULTS / "adaptation.json"
    if not path.is_file():
        print(f"--reroof needs {path}; run the benchmark first", file=sys.stderr)
        return 2
    saved = json.loads(path.read_text())
    profile = load_or_measure()
    if profile.fingerprint != saved["profile"]["fingerprint"]:
        print("--reroof: the saved run was measured on another machine", file=sys.stderr)
        return 2
    results = saved["results"]
    for r in results:
        for key, p50 in (("fp32_roofline", r.get("fp32_p50_ms")), ("variant_roofline", r.get("variant_p50_ms"))):
            entry = r.get(key)
            if not entry or p50 is None:
                continue
            peak = peak_of(profile, entry["peak_dtype"])
            entry.update(bound_fields(entry["work_ops"], entry["bytes_moved"], peak, profile, p50))
    run_profile = saved.get("run_profile", saved["profile"])  # a second --reroof keeps the run's own
    notes = [n for n in saved["notes"] if not n.startswith("Roofline recomputed")]
    notes.append(
        f"Roofline recomputed with the profile measured {profile.measured_at:%Y-%m-%d %H:%M} UTC (peak GEMM fp32 "
        f"{profile.peak_gemm_gflops_fp32:.1f} GFLOP/s, int8 {profile.peak_gemm_gflops_int8:.1f} GOP/s, "
        f"{profile.memory_bandwidth_gbps:.1f} GB/s) after the GEMM probe was made to run for at least 1 s; the run "
        f"itself used the profile measured {run_profile['measured_at'][:16].replace('T', ' ')} UTC (fp32 "
        f"{run_profile['peak_gemm_gflops_fp32']:.1f} GFLOP/s), which read the peak low. Latencies, choices and "
        "everything else are the run's own (`--reroof`)."
    )
    data = {k: v for k, v in saved.items() if k not in ("benchmark", "command", "machine")}
    data.update(
        notes=notes,
        results=results,
        run_profile=run_profile,
        profile=profile_summary(profile),
    )
    benchlib.write_result("adaptation", "Adaptation quality", data, command=saved["command"], facts=saved["machine"])
    print(f"rewrote {path} with the roofline against the profile of {profile.measured_at:%Y-%m-%d %H:%M} UTC")
    return 0


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {(text.splitlines()[0] if text else '')[:300]}"


if __name__ == "__main__":
    sys.exit(main())
