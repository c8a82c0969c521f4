"""Graph levers: what writing spelled-out activations as one operator gives, per model, runtime and format.

Exporters of other ecosystems spell GELU with Erf, HardSwish as x * HardSigmoid(x) and SiLU as x * Sigmoid(x);
``transform.activations: fused`` (core/engine/transforms/activations.py) writes each as one operator. This bench
times every model as exported and rewritten, in FP32 and in static int8 (QDQ on both runtimes, QOperator on ONNX
Runtime), interleaved in one loop (same samples, same warm-up, alternating rounds), and reports the speed-up of the
rewrite and the largest output difference it makes (FP32: rounding only, the rewrites being exact).

Models: three synthetic conv stacks (8 convolutions of 64 channels at 56x56, each followed by one spelled-out
activation, as paddle2onnx / tf2onnx write them), two trained SiLU detectors from the CNN matrix where their
wheel is present (YOLOX from ddddocr, YOLOv8n from nudenet), and PP-OCRv4's recogniser and detector (paddle2onnx,
opset 12, HardSwish as x * Clip(x + 3, 0, 6) / 6; bench/ocr_models.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench import benchlib
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import MeasureSettings, measure_interleaved
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import mean_cosine
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant
from metainfer.core.engine.transforms.activations import fuse_activations

NAME = "graph_levers"
TITLE = "Graph levers: spelled-out activations as one operator"
TIMING = MeasureSettings(warmup_runs=3, min_runs=30, max_runs=300, max_seconds=4.0)
FORMATS = {
    "FP32": {"mode": "fp32"},
    "int8 QDQ": {"mode": "int8_static", "format": "qdq", "per_channel": True},
    "int8 QOperator": {"mode": "int8_static", "format": "qoperator"},
}
RUNTIMES = ("onnxruntime", "openvino")
CHANNELS, SIZE, LAYERS = 64, 56, 8


def _activation(kind: str, x: str, i: int, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> str:
    out = f"a{i}"
    if kind == "hardswish":  # paddle2onnx at opset 14+ still writes x * HardSigmoid(x)
        nodes += [helper.make_node("HardSigmoid", [x], [f"h{i}"], alpha=1 / 6, beta=0.5),
                  helper.make_node("Mul", [x, f"h{i}"], [out])]  # fmt: skip
    elif kind == "silu":
        nodes += [helper.make_node("Sigmoid", [x], [f"s{i}"]), helper.make_node("Mul", [x, f"s{i}"], [out])]
    else:  # GELU with Erf, the 0.5 applied last
        inits += [numpy_helper.from_array(np.array(v, np.float32), f"{n}{i}") for n, v in
                  (("sqrt2_", 1.4142135), ("one_", 1.0), ("half_", 0.5))]  # fmt: skip
        nodes += [
            helper.make_node("Div", [x, f"sqrt2_{i}"], [f"d{i}"]),
            helper.make_node("Erf", [f"d{i}"], [f"e{i}"]),
            helper.make_node("Add", [f"e{i}", f"one_{i}"], [f"p{i}"]),
            helper.make_node("Mul", [x, f"p{i}"], [f"m{i}"]),
            helper.make_node("Mul", [f"m{i}", f"half_{i}"], [out]),
        ]
    return out


def synthetic(kind: str) -> bytes:
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = "input"
    for i in range(LAYERS):
        weight = (rng.standard_normal((CHANNELS, CHANNELS, 3, 3)) * (2 / (9 * CHANNELS)) ** 0.5).astype(np.float32)
        inits += [
            numpy_helper.from_array(weight, f"w{i}"),
            numpy_helper.from_array(np.zeros(CHANNELS, np.float32), f"b{i}"),
        ]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        x = _activation(kind, f"c{i}", i, nodes, inits)
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]).SerializeToString()


def _models() -> dict[str, tuple[bytes, Dataset]]:
    rng = np.random.default_rng(1)
    feed = rng.standard_normal((16, CHANNELS, SIZE, SIZE)).astype(np.float32)
    models = {f"synthetic {k}": (synthetic(k), Dataset(inputs={"input": feed})) for k in ("gelu", "hardswish", "silu")}
    try:
        from testkit.cnn_models import NETS, feed_for

        for net in NETS:
            if net.name in ("yolox_ddddocr_det", "yolov8n_nudenet"):
                models[net.name] = (net.path().read_bytes(), Dataset(inputs=feed_for(net, 16)))
    except Exception as exc:  # the wheels may be absent (no index): those rows are left out
        print(f"trained detectors left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        from bench.ocr_models import MODELS, inputs_and_task_quality

        for ocr in MODELS:
            feed = {name: images[:16] for name, images in inputs_and_task_quality(ocr)[0].items()}
            models[ocr.name] = (ocr.path().read_bytes(), Dataset(inputs=feed))
    except Exception as exc:  # as above: the OCR rows need the rapidocr wheel
        print(f"PP-OCRv4 models left out: {type(exc).__name__}: {exc}", file=sys.stderr)
    return models


def run_model(name: str, base: bytes, data: Dataset) -> dict[str, Any]:
    counts = fuse_activations(onnx.load_from_string(base))[1]
    sessions: dict[tuple[str, str, str], Any] = {}
    failures: dict[str, str] = {}
    for fmt, quantization in FORMATS.items():
        for runtime in RUNTIMES:
            if runtime == "openvino" and quantization.get("format") == "qoperator":
                continue  # ONNX Runtime's integer operators: not what OpenVINO reads
            for activations in ("keep", "fused"):
                recipe = Recipe.model_validate({
                    "transform": {"quantization": quantization, "activations": activations},
                    "session": {"runtime": runtime, "intra_op_num_threads": 2},
                })  # fmt: skip
                try:
                    variant = build_variant(base, recipe.transform, data.head(8))
                    sessions[(fmt, runtime, activations)] = create_session(variant, recipe)
                except Exception as exc:
                    failures[f"{fmt} {runtime} {activations}"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    keys = list(sessions)
    stats = measure_interleaved([sessions[k] for k in keys], data, 1, TIMING, rounds=5)
    p50 = {k: s.p50_ms for k, s in zip(keys, stats, strict=True)}
    one = {n: a[:1] for n, a in data.inputs.items()}
    cells = []
    for fmt in FORMATS:
        for runtime in RUNTIMES:
            keep, fused = (fmt, runtime, "keep"), (fmt, runtime, "fused")
            if keep not in p50 or fused not in p50:
                continue
            out_keep, out_fused = sessions[keep].run(None, one)[0], sessions[fused].run(None, one)[0]
            cells.append({
                "format": fmt, "runtime": runtime, "keep_ms": p50[keep], "fused_ms": p50[fused],
                "speedup": p50[keep] / p50[fused], "cosine": mean_cosine(out_fused, out_keep),
                "max_abs_diff": float(np.abs(out_fused - out_keep).max()),
            })  # fmt: skip
    return {"model": name, "rewrites": counts, "cells": cells, "failures": failures}


def render(data: dict[str, Any]) -> str:
    header = ["model", "rewrites", "format", "runtime", "as exported (ms)", "rewritten (ms)", "speed-up", "cosine"]
    rows = []
    for row in data["rows"]:
        rewrites = ", ".join(f"{n} {k}" for k, n in sorted(row["rewrites"].items())) or "none found"
        for cell in row["cells"]:
            rows.append([row["model"], rewrites, cell["format"], cell["runtime"], f"{cell['keep_ms']:.2f}",
                         f"{cell['fused_ms']:.2f}", f"{cell['speedup']:.2f}x", f"{cell['cosine']:.4f}"])  # fmt: skip
    failed = [f"{r['model']}: {k} ({v})" for r in data["rows"] for k, v in r["failures"].items()]
    text = [
        "p50 ms at batch 1, 2 threads, every variant of a model timed interleaved in one loop; cosine of the"
        " rewritten variant's outputs to the exported one's in the same format and runtime. A speed-up below 1"
        " means the rewrite is slower there: the search offers both (`transform.activations`) and measures.",
        benchlib.markdown_table(header, rows),
    ]
    if failed:
        text.append("Variants that did not build or load: " + "; ".join(failed) + ".")
    return "\n\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args(argv)
    rows = []
    for name, (base, data) in _models().items():
        if args.only and name not in args.only:
            continue
        print(f"{name}: building and timing", file=sys.stderr, flush=True)
        rows.append(run_model(name, base, data))
    command = None  # write_result's default: this command line
    if args.only:  # a partial rerun replaces its rows in the saved section and keeps the others
        rows, command = benchlib.merge_into_saved(NAME, rows, "model")
    benchlib.write_result(NAME, TITLE, {"rows": rows}, command=command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
