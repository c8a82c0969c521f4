"""Low-bit weights side by side: the fixed variants users reach for, and metainfer's pick under memory budgets.

Per model, in one process: FP32, ONNX Runtime's int8 dynamic, ONNX Runtime's int4 weight-only (round-to-nearest,
blocks of 32 and 128; HQQ and GPTQ where torch is importable), FP32 and NNCF's int4 weight compression on OpenVINO;
each measured the way the search measures a candidate (warm-up, then timed runs: median and p95), at batch 1 and at
the policy batch, with its weight bytes (the variant's initializers), the memory it takes itself at the policy
batch (the kernel's high-water mark of the process while it loads and runs, above what the process held just
before: what the search bounds with a serving container's limit) and its quality against FP32 (the search's metric:
mean-pooled cosine similarity for these encoders). Without torch, the HQQ and GPTQ rows say why they were not run.

Then ``metainfer adapt``'s pipeline runs three times on the same measurer: without a memory budget, and with the
memory FP32 would take if its weights took half, then a quarter, of their bytes (FP32's own memory less that share
of its weights: activations and arenas do not shrink with the weights' format), as the bound on what a variant
may take (``Constraints.max_variant_memory_mib``, what a serving container's limit sets in a cluster). Each pick must be
within its memory budget and the quality budget, and at least as fast (within the search's timing noise band) as
every listed variant that meets both.

Models: the bundled bert_mini (4 layers, hidden 256, vocabulary 8192), all-MiniLM-L6-v2 (its real weights, from
the bench extra's weights package) and a 2-layer encoder with a 65,536-token vocabulary, whose embedding table is
most of its weights (where GatherBlockQuantized pays).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench import benchlib
from metainfer.core.engine.data import Dataset, load_npz, make_dataset
from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.measurer import OnnxRuntimeMeasurer
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile.cache import load_or_measure
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.report import AdaptSettings
from metainfer.core.engine.scoring import Constraints
from metainfer.core.engine.transforms import build_variant

NAME = "weights"
TITLE = "Low-bit weights and memory budgets"
POLICY_BATCH = 8
MAX_QUALITY_DROP = 0.01
TIMING = MeasureSettings(warmup_runs=3, min_runs=20, max_runs=200, max_seconds=3.0)
BUDGETS = {"none": None, "half of FP32": 0.5, "a quarter of FP32": 0.25}
FIXED: dict[str, dict[str, Any]] = {
    "FP32": {},
    "int8 dynamic": {"transform": {"quantization": {"mode": "int8_dynamic", "per_channel": True}}},
    "ORT int4 RTN, block 32": {"transform": {"weights": {"bits": 4, "block_size": 32}}},
    "ORT int4 RTN, block 128": {"transform": {"weights": {"bits": 4, "block_size": 128}}},
    "ORT int4 RTN, block 32, embeddings too": {
        "transform": {"weights": {"bits": 4, "block_size": 32, "embeddings": True}}
    },
    "FP32 on OpenVINO": {"session": {"runtime": "openvino"}},
    "NNCF int4 on OpenVINO": {
        "transform": {"weights": {"bits": 4, "method": "nncf", "block_size": 128, "symmetric": True}},
        "session": {"runtime": "openvino"},
    },
}  # fmt: skip
# ONNX Runtime's HQQ and GPTQ import torch: measured where the environment has it (the export peers' CPU torch
# layer on PYTHONPATH does), else their rows say why not.
TORCH_ONLY: dict[str, dict[str, Any]] = {
    "ORT int4 HQQ, block 32": {"transform": {"weights": {"bits": 4, "method": "hqq", "block_size": 32}}},
    "ORT int4 GPTQ, block 32": {"transform": {"weights": {"bits": 4, "method": "gptq", "block_size": 32,
                                                          "symmetric": True}}},
}  # fmt: skip
NOT_RUN_WITHOUT_TORCH = "ONNX Runtime's HQQ and GPTQ import torch, which this environment does not have"


def _models(directory: Path, only: list[str] | None) -> dict[str, tuple[bytes, Dataset]]:
    from metainfer.agent.zoo.bert import BertConfig, build_bert_model
    from metainfer.agent.zoo.build import build_examples
    from metainfer.agent.zoo.minilm import minilm_available

    models: dict[str, tuple[bytes, Dataset]] = {}
    names = ["bert_mini", *(["minilm_l6"] if minilm_available() else [])]
    if "minilm_l6" not in names:
        print("all-MiniLM-L6-v2 left out: `make bench-deps` installs its weights", file=sys.stderr)
    for name, example in build_examples(directory, [n for n in names if not only or n in only]).items():
        info = inspect_model(example.model_path)
        models[name] = (example.model_path.read_bytes(), load_npz(example.data_path, info))
    if not only or "big_vocab" in only:
        config = BertConfig(layers=2, hidden=256, heads=4, intermediate=1024, vocab=65536)
        model = build_bert_model(config)
        path = directory / "big_vocab.onnx"
        onnx.save(model, path)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, config.vocab, (64, 128)).astype(np.int64)
        arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        models["big_vocab"] = (path.read_bytes(), make_dataset(arrays, inspect_model(path)))
    return models


def _weight_mib(variant: bytes) -> float:
    return sum(t.ByteSize() for t in onnx.load_from_string(variant).graph.initializer) / (1 << 20)


def _row(label: str, variant: bytes, recipe: Recipe, measurer: OnnxRuntimeMeasurer, data: Dataset,
         references: dict[int, Any]) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"variant": label, "recipe": recipe.describe(), "weight_mib": _weight_mib(variant)}
    for batch in (1, POLICY_BATCH):
        metrics = measurer.measure(variant, recipe.model_copy(update={"batch": batch}), data, data, references[batch],
                                   TIMING)  # fmt: skip
        row[f"b{batch}_p50_ms"], row[f"b{batch}_p95_ms"] = metrics.latency.p50_ms, metrics.latency.p95_ms
        if batch == 1:
            row["quality"], row["metric"] = metrics.quality.value, str(metrics.quality.metric)
        else:  # the batch the picks are made at
            row["peak_mib"] = metrics.variant_memory_mib
    return row


def run_model(name: str, base: bytes, data: Dataset, trials: int) -> dict[str, Any]:
    info = inspect_model(_saved(base))
    profile = load_or_measure()
    measurer = OnnxRuntimeMeasurer()
    references = {b: measurer.reference(base, Recipe(batch=b), data) for b in (1, POLICY_BATCH)}
    calibration = data.head(32)
    # A first measurement warms the process (allocator, thread pools, caches) for every variant alike.
    measurer.measure(base, Recipe(batch=1), data, data, references[1], TIMING)
    rows, failures = [], {}
    from metainfer.core.engine.transforms.weights import torch_available

    fixed = {**FIXED, **TORCH_ONLY} if torch_available() else FIXED
    not_run = {} if torch_available() else {label: NOT_RUN_WITHOUT_TORCH for label in TORCH_ONLY}
    for label, fields in fixed.items():
        recipe = Recipe.model_validate({**fields, "session": {**fields.get("session", {}), "intra_op_num_threads": 2}})
        try:
            variant = build_variant(base, recipe.transform, calibration)
            rows.append(_row(label, variant, recipe, measurer, data, references))
        except Exception as exc:
            failures[label] = f"{type(exc).__name__}: {str(exc)[:200]}"
    fp32_peak, fp32_weights = rows[0]["peak_mib"], rows[0]["weight_mib"]
    picks = []
    for budget_name, share in BUDGETS.items():
        # What FP32 would hold if its weights took only ``share`` of their bytes: its activations and arenas are
        # the same whatever the weights' format, so a budget below them (half of FP32's whole peak, on a small
        # model) no weight format could meet.
        limit = None if share is None else fp32_peak - (1 - share) * fp32_weights
        settings = AdaptSettings(
            batch=POLICY_BATCH,
            constraints=Constraints(max_quality_drop=MAX_QUALITY_DROP, max_variant_memory_mib=limit),
            budget_trials=trials,
            seed=0,
        )
        adaptation = Adaptation(base, info, data, profile, settings, measurer=measurer)
        report, variant = adaptation.run()
        pick: dict[str, Any] = {
            "budget": budget_name,
            "bound_mib": limit,
        }
        if report.best is None or variant is None:
            pick["recipe"] = "none feasible"
        else:
            recipe = report.best.recipe
            pick |= _row(f"pick ({budget_name})", variant, recipe.model_copy(update={"batch": 1}), measurer, data,
                         references)  # fmt: skip
            pick["band"] = report.latency_noise_band
            pick["verdict"] = _verdict(pick, rows, limit, report.latency_noise_band)
        picks.append(pick)
    return {"model": name, "fp32_weight_mib": rows[0]["weight_mib"], "rows": rows, "not_run": not_run,
            "failures": failures, "picks": picks}  # fmt: skip


def _saved(base: bytes) -> Path:
    path = Path(tempfile.mkdtemp(prefix="metainfer-weights-")) / "model.onnx"
    path.write_bytes(base)
    return path


def _verdict(pick: dict[str, Any], rows: list[dict[str, Any]], limit_above: float | None, band: float) -> str:
    """Met when the pick is within both budgets and no listed variant within both is faster beyond the noise."""
    if limit_above is not None and pick["peak_mib"] > limit_above:
        return f"missed: takes {pick['peak_mib']:.0f} MiB, over the {limit_above:.0f} MiB bound"
    if 1 - pick["quality"] > MAX_QUALITY_DROP:
        return "missed: over the quality budget"
    field = f"b{POLICY_BATCH}_p50_ms"
    eligible = [
        r
        for r in rows
        if 1 - r["quality"] <= MAX_QUALITY_DROP and (limit_above is None or r["peak_mib"] <= limit_above)
    ]
    faster = [r for r in eligible if r[field] < pick[field] * (1 - band)]
    if faster:
        best = min(faster, key=lambda r: r[field])
        return f"missed: {best['variant']} ran {pick[field] / best[field]:.2f}x faster at batch {POLICY_BATCH}"
    return "met"


def render(data: dict[str, Any]) -> str:
    parts = [
        f"Latency at batch 1 and {POLICY_BATCH} (p50 / p95 ms, 2 threads), weights (MiB of initializers), peak "
        f"memory the variant takes itself at batch {POLICY_BATCH} (MiB), quality against FP32 "
        f"(quality budget {MAX_QUALITY_DROP}). The picks are `metainfer adapt`'s pipeline at batch {POLICY_BATCH} "
        "under each bound on a variant's own memory: FP32's with its weights at half, then a quarter, of their "
        'bytes; "met": within both budgets and no listed variant within both faster '
        "beyond the search's timing noise band."
    ]
    header = ["variant", "b1 p50", "b1 p95", f"b{POLICY_BATCH} p50", f"b{POLICY_BATCH} p95", "weights MiB",
              "own MiB", "quality"]  # fmt: skip
    for model in data["rows"]:
        rows = [[r["variant"], f"{r['b1_p50_ms']:.2f}", f"{r['b1_p95_ms']:.2f}", f"{r[f'b{POLICY_BATCH}_p50_ms']:.2f}",
                 f"{r[f'b{POLICY_BATCH}_p95_ms']:.2f}", f"{r['weight_mib']:.1f}", f"{r['peak_mib']:.0f}",
                 f"{r['quality']:.4f}"] for r in model["rows"]]  # fmt: skip
        rows += [[label, "not run", "", "", "", "", "", why] for label, why in model["not_run"].items()]
        rows += [[label, "failed", "", "", "", "", "", why] for label, why in model["failures"].items()]
        parts.append(f"### {model['model']}\n\n" + benchlib.markdown_table(header, rows))
        pick_rows = []
        for p in model["picks"]:
            budget = "none" if p["bound_mib"] is None else f"{p['bound_mib']:.0f} MiB"
            if p.get("recipe") == "none feasible":
                pick_rows.append([p["budget"], budget, "none feasible", "", "", "", "", ""])
                continue
            latency = f"{p[f'b{POLICY_BATCH}_p50_ms']:.2f}"
            pick_rows.append([p["budget"], budget, p["recipe"], latency, f"{p['weight_mib']:.1f}",
                              f"{p['peak_mib']:.0f}", f"{p['quality']:.4f}", p["verdict"]])  # fmt: skip
        parts.append(benchlib.markdown_table(
            ["memory budget", "bound", "metainfer's pick", f"b{POLICY_BATCH} p50", "weights MiB", "own MiB",
             "quality", "target"], pick_rows))  # fmt: skip
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="models to run (bert_mini, minilm_l6, big_vocab)")
    parser.add_argument("--trials", type=int, default=24, help="search budget of each pick (default 24)")
    parser.add_argument("--quick", action="store_true", help="bert_mini only, 8 trials a pick")
    args = parser.parse_args(argv)
    only = ["bert_mini"] if args.quick else args.only
    trials = 8 if args.quick else args.trials
    with tempfile.TemporaryDirectory(prefix="metainfer-weights-") as tmp:
        models = _models(Path(tmp), only)
        rows = [run_model(name, base, data, trials) for name, (base, data) in models.items()]
    command = None
    if only:
        rows, command = benchlib.merge_into_saved(NAME, rows, "model")
    benchlib.write_result(NAME, TITLE, {"rows": rows}, command=command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
