"""Adaptation on encoders as users export them, side by side with the naive one-liner and OpenVINO + NNCF.

For each flavour of testkit/exports.py (all-MiniLM-L6-v2 written by torch's TorchScript
and dynamo exporters and by optimum, from transformers 4.57 and 5.24) at batch 8,
sequence 128, on the 64 padded texts:

- **metainfer**: the engine behind ``metainfer adapt`` (hybrid search, 40 trials,
  seed 1, quality budget 0.01), wall time from start to the written variant;
- **naive**: ``onnxruntime.quantization.quantize_dynamic(per_channel=True)``, the
  one-liner a user tries first;
- **OpenVINO FP32** and **OpenVINO + NNCF INT8** (``nncf.quantize`` with
  ``ModelType.TRANSFORMER`` on 64 calibration samples, compiled for CPU with the
  LATENCY hint): what an Intel-CPU user would pick.

Every contender is timed by one loop in one process (bench/peers_driver.py, in the
OpenVINO venv with the project's onnxruntime), in 10 rotated interleaved rounds of
at least 1 s; quality is metainfer's own metric (cosine of mask-weighted mean-pooled
embeddings against the export's FP32 output) on all 64 samples.

    PYTHONSAFEPATH=1 .venv/bin/python bench/export_matrix.py [--quick] [--only SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench import benchlib, peer_table
from bench.olive_search import olive_contender
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.outputs import MODEL_FILE, write_outputs
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.profile import load_or_measure
from metainfer.core.engine.reference import Reference
from metainfer.core.engine.report import AdaptSettings
from metainfer.core.engine.scoring import Constraints
from testkit import peer_env
from testkit.exports import FLAVOURS, ExportSet, Flavour, build_exports

BENCH = Path(__file__).resolve().parent
DRIVER = BENCH / "peers_driver.py"
WORK = benchlib.ROOT / "build" / "bench" / "export_matrix"
BATCH, TRIALS, QUICK_TRIALS, SEED, MAX_DROP = 8, 40, 8, 1, 0.01
QUICK_FLAVOURS = ("transformers-5.24_torchscript_op14_sdpa", "transformers-4.57_optimum_op17")
ROUNDS, ROUND_SECONDS, ROUND_MIN_RUNS = 10, 1.0, 4
OLIVE_TIMEOUT_S = 3600.0
TITLE = "Adaptation on models as users export them (export matrix)"
# Why the peers land where they do, from this section's data; rewritten when a rerun changes the picture.
EXPLANATIONS: list[str] = [
    "Sittings: 6 flavours on 2026-12-05 03:05-03:38 UTC (commit eddcc0e: a transformer's search measures ONNX"
    " Runtime's own recipe first, core/engine/anchors.py): transformers-4.57_torchscript_op12_eager,"
    " transformers-4.57_torchscript_op14_sdpa, transformers-5.24_torchscript_op12_eager and the three"
    " transformers-5.24_torchscript_op17_sdpa exports. 7 flavours on 2026-12-04 23:27-00:24 UTC (commit fdfdfc8, the"
    " same engine without that anchor), transformers-5.24_dynamo_op18 and transformers-4.57_optimum_op17 at"
    " 21:05-21:14 (commit 5ed6b2e, without the calibration reuse, which static NNCF builds do not use). This machine"
    " ran ORT FP32 at 121-180 ms, against 55-81 ms on 2026-12-01 (its CPU flags no longer list avx_vnni): absolute"
    " milliseconds do not carry across days or sittings, the ratios within a row do.",
    "metainfer ships ONNX Runtime's dynamic int8 per-channel with fused attention and padding removed on 8 flavours"
    " and NNCF int8 on OpenVINO on 7, 2.99-4.68x ORT FP32 at p50, within the budget on every row (cosine"
    " 0.9928-0.9930 on ONNX Runtime, 0.9973-0.9978 on OpenVINO), adapting in 153-258 s.",
    "Against OpenVINO + NNCF (NNCF's default int8, LATENCY hint): metainfer is faster on 10 rows (1.05-1.47x, the"
    " most where padding removal runs: transformers-5.24_torchscript_op17_sdpa, 43.1 against 63.5 ms), level within"
    " 2% on 5 and slower on none. The 5 level rows are all from the sittings before the anchor, and on each the pick"
    " is itself NNCF int8 on OpenVINO with other compile settings. The three rows OpenVINO + NNCF won by 1.05-1.10x"
    " in the sitting before (transformers-5.24_torchscript_op12_eager, transformers-4.57_torchscript_op12_eager,"
    " transformers-4.57_torchscript_op14_sdpa) had picked NNCF on OpenVINO too; with the anchor their search now"
    " ships ONNX Runtime's recipe, 1.06x, 1.32x and 1.29x faster than OpenVINO + NNCF in this loop. OpenVINO + NNCF"
    " keeps a higher cosine where metainfer ships ONNX Runtime's dynamic int8 (0.9973-0.9978 against 0.9928-0.9930),"
    " both inside the budget of a 0.01 drop.",
    "Why the runtime no longer decided those three rows by a few percent: a probe outside this table"
    " (transformers-4.57_torchscript_op14_sdpa, OpenVINO 2026.4.1, NNCF 3.4.0, batch 8, 15 interleaved rounds) timed"
    " NNCF run on the ONNX graph (the engine's way) at 47.9 ms and NNCF run on OpenVINO's own model (the contender's)"
    " at 47.3 ms, and the engine's pick of the sitting before with its own compile settings at 48.0 ms against the"
    " contender's 47.5: the same variant within 1%, so the 5-10% of the sitting before were two timings of one kind"
    " of variant minutes apart, not a lever the engine lacked.",
    "Olive ran on the held-out flavour only (transformers-5.24_torchscript_op14_sdpa, `--olive-trials 8`: 3"
    " candidates evaluated, the rest of its samples ruled invalid by its own space, 104 s). Its pick, dynamic int8"
    " per-channel with reduce_range on one intra-op thread, runs 1.47x ORT FP32 here (122.5 against 180.2 ms; it"
    " was slower than FP32 on 2026-12-01) at cosine 0.9917; metainfer's pick is 2.08x faster than Olive's. ORT's"
    " fuser finds no Attention in this export, so Olive's quantization has no fused attention or padding removal"
    " to build on. Olive on every flavour was not run: at its pace a 24-candidate search on all 15 exports would"
    " take hours on this machine.",
]


def _feed(model_path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    model = onnx.load(str(model_path), load_external_data=False)
    return {
        v.name: inputs[v.name].astype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
        for v in model.graph.input
    }


def _naive(base: Path, out: Path) -> float:
    from onnxruntime.quantization import quantize_dynamic

    started = time.perf_counter()
    quantize_dynamic(str(base), str(out), per_channel=True)
    return time.perf_counter() - started


def run_peers(request: dict[str, Any], work: Path) -> dict[str, Any]:
    """bench/peers_driver.py on ``request`` in the OpenVINO venv (built on first use); its JSON result."""
    python = peer_env.ensure(peer_env.OPENVINO).python
    path = work / "peers.json"
    path.write_text(json.dumps(request))
    env = peer_env.subprocess_env()
    run = subprocess.run([str(python), str(DRIVER), str(path)], capture_output=True, text=True, env=env, cwd="/")
    if run.returncode != 0:
        raise RuntimeError(f"peers driver failed: {' | '.join(run.stderr.strip().splitlines()[-3:])}")
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def measure_flavour(
    flavour: Flavour, exports: ExportSet, trials: int, profile: Any, olive_trials: int = 0
) -> dict[str, Any]:
    export = exports.exports[flavour.name]
    row: dict[str, Any] = {"flavour": flavour.name, "export_s": export.seconds}
    if export.path is None:
        return row | {"status": "export failed", "error": export.error}
    work = WORK / flavour.name
    work.mkdir(parents=True, exist_ok=True)
    feed = _feed(export.path, exports.inputs(flavour.environment))
    data_path = work / "data.npz"
    np.savez(data_path, **feed)
    info = inspect_model(export.path)
    settings = AdaptSettings(
        batch=BATCH, constraints=Constraints(max_quality_drop=MAX_DROP), budget_trials=trials, seed=SEED
    )
    started = time.perf_counter()
    report, variant = Adaptation(export.path.read_bytes(), info, Dataset(feed), profile, settings).run()
    write_outputs(work / "metainfer", report, variant)
    row["metainfer_wall_s"] = time.perf_counter() - started
    row["search_wall_s"] = report.search_wall_s
    row["sensitivity_wall_s"] = report.sensitivity_wall_s
    row["raced"] = sum(t.metrics is not None and t.metrics.early_stop == "raced" for t in report.trials)
    row["screened"] = sum(t.metrics is not None and t.metrics.early_stop == "quality_screen" for t in report.trials)
    row["notes"] = report.space.notes
    row["recipe"] = report.best.recipe.describe() if report.best is not None else None
    row["naive_wall_s"] = _naive(export.path, work / "naive.onnx")
    contenders: list[dict[str, Any]] = [
        {"name": "fp32", "kind": "ort", "model": str(export.path)},
        {"name": "naive", "kind": "ort", "model": str(work / "naive.onnx")},
        {"name": "openvino_fp32", "kind": "openvino", "model": str(export.path), "nncf": False},
        {"name": "openvino_nncf", "kind": "openvino", "model": str(export.path), "nncf": True},
    ]
    if olive_trials:
        try:
            olive, olive_row = olive_contender(
                flavour.name, export.path, data_path, BATCH, olive_trials, work / "olive_peer", OLIVE_TIMEOUT_S
            )
        except Exception as exc:  # Olive failing is a result for its column, not for the whole row
            olive, olive_row = None, {"olive_error": f"{type(exc).__name__}: {exc}"[:300]}
        row.update(olive_row)
        if olive is not None:
            contenders.insert(2, olive)
    if report.best is not None and variant is not None:
        contenders.insert(2, peer_table.metainfer_contender(report.best.recipe, str(work / "metainfer" / MODEL_FILE)))
    request = {
        "data": str(data_path),
        "batch": BATCH,
        "calibration_samples": 64,
        "rounds": ROUNDS,
        "round_seconds": ROUND_SECONDS,
        "round_min_runs": ROUND_MIN_RUNS,
        "outputs": str(work / "outputs.npz"),
        "transformer": True,
        "contenders": contenders,
    }
    peers = run_peers(request, work)
    mask = feed["attention_mask"]
    outputs = peer_table.read_outputs(work / "outputs.npz", every=False)  # the sentence embedding's tokens
    reference = Reference(outputs["fp32"], None, None, mask) if "fp32" in outputs else None
    peer_table.add_timings(row, peers, outputs, reference)
    return row


def peer_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Where a peer beats metainfer on a flavour, by how much (latency at p50, quality)."""
    peers = (("naive", "the naive one-liner"), ("olive", "Olive"), ("openvino_nncf", "OpenVINO + NNCF"))
    return peer_table.peer_wins(rows, "flavour", peers, lambda r, name: True)


def render(rows: list[dict[str, Any]], trials: int, explanations: list[str] | None = None) -> str:
    olive = peer_table.olive_ran(rows)
    names = [("fp32", "FP32 (ORT)"), ("naive", "naive"), ("metainfer", "metainfer")]
    names += [("olive", "Olive")] if olive else []
    names += [("openvino_fp32", "OpenVINO FP32"), ("openvino_nncf", "OpenVINO+NNCF")]
    quality_of_peers = ["naive", "metainfer", *(["olive"] if olive else []), "openvino_nncf"]
    walls_of_peers = ["metainfer", "naive", *(["Olive"] if olive else []), "NNCF"]
    header = ["export", *(f"{label} p50 / p95 ms" for _, label in names), "speedup p50 / p95 (metainfer)"]
    header += [
        "quality " + " / ".join("NNCF" if n == "openvino_nncf" else n for n in quality_of_peers),
        f"adapt wall s ({' / '.join(walls_of_peers)})",
        "metainfer recipe",
    ]
    table = []
    for r in rows:
        if r.get("status") != "measured":
            table.append([r["flavour"], *(["—"] * (len(header) - 2)), r.get("error", r.get("status"))])
            continue
        table.append(
            [
                r["flavour"],
                *(peer_table.latency(r, n, 1) for n, _ in names),
                peer_table.speedup(r),
                peer_table.qualities(r, quality_of_peers),
                peer_table.walls(r, olive),
                r.get("recipe") or "no variant",
            ]
        )
    lines = [
        f"Setup: batch {BATCH}, sequence 128, 64 padded English texts (48 % real tokens); metainfer {trials} trials,"
        f" seed {SEED}, quality budget {MAX_DROP} (1 − cosine of mask-weighted mean-pooled embeddings vs the"
        " export's FP32). Every contender timed by one loop in one process (bench/peers_driver.py), 10 rotated"
        " interleaved rounds of ≥ 1 s each; quality on all 64 samples. metainfer's wall time is the whole"
        " adaptation (baseline, search, sensitivity scans, validation, final comparison); the naive one's is"
        " `quantize_dynamic`; NNCF's is `nncf.quantize` (64 calibration samples) plus compilation.",
        benchlib.markdown_table(header, table),
    ]
    olive_lines = [f"{r['flavour']}: Olive's pick: {r['olive_recipe']}" for r in rows if r.get("olive_recipe")]
    olive_lines += [f"{r['flavour']}: Olive failed: {r['olive_error']}" for r in rows if r.get("olive_error")]
    if olive_lines:
        lines.append(
            "Olive (its quantization and session-tuning search, as in the Olive section):\n\n"
            + "\n".join(f"- {o}" for o in olive_lines)
        )
    wins = peer_notes(rows)
    if wins:
        lines.append("Where a peer wins:\n\n" + "\n".join(f"- {w}" for w in wins))
    if explanations:
        lines.append("\n".join(f"- {e}" for e in explanations))
    return "\n\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"two flavours, {QUICK_TRIALS} trials")
    parser.add_argument("--only", nargs="+", help="flavours whose name contains one of these")
    parser.add_argument("--trials", type=int, help=f"search budget (default {TRIALS}, quick {QUICK_TRIALS})")
    parser.add_argument(
        "--olive-trials",
        type=int,
        default=0,
        help="also run Olive's search with this many candidates per flavour (30-90 s each here; off by default)",
    )
    parser.add_argument(
        "--rerender",
        action="store_true",
        help="write the section again from the saved results (with the current notes); measures nothing",
    )
    args = parser.parse_args(argv)
    if args.rerender:
        saved = json.loads((benchlib.RESULTS / "export_matrix.json").read_text())
        benchlib.write_result(
            "export_matrix",
            TITLE,
            {"trials": saved["trials"], "rows": saved["rows"]},
            command=saved["command"],
            facts=saved["machine"],
        )
        return 0
    trials = args.trials or (QUICK_TRIALS if args.quick else TRIALS)
    chosen = [f for f in FLAVOURS if not args.quick or f.name in QUICK_FLAVOURS]
    if args.only:
        chosen = [f for f in chosen if any(s in f.name for s in args.only)]
    print("exports (cached) ...", flush=True)
    exports = build_exports()
    profile = load_or_measure()
    rows = []
    for flavour in chosen:
        print(f"== {flavour.name}", flush=True)
        try:
            row = measure_flavour(flavour, exports, trials, profile, args.olive_trials)
        except Exception as exc:  # one flavour failing must not lose the others
            traceback.print_exc()
            row = {"flavour": flavour.name, "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "notes"}, default=str)[:600], flush=True)
    measured_all = all(r.get("status") == "measured" for r in rows)
    command = None
    if args.only:  # a partial rerun replaces its rows in the saved section and keeps the others
        rows, command = benchlib.merge_into_saved("export_matrix", rows, "flavour")
    benchlib.write_result("export_matrix", TITLE, {"trials": trials, "rows": rows}, command=command)
    return 0 if measured_all else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        sys.exit(main())
