"""Time every contender of one model in one process, interleaved; runs inside the OpenVINO venv.

bench/export_matrix.py starts it as

    OPENVINO_VENV/bin/python bench/peers_driver.py REQUEST.json

so that ONNX Runtime sessions (FP32, the naive one-liner, metainfer's variant) and
OpenVINO compiled models (FP32, NNCF INT8) are timed by this one loop, in rotated
interleaved rounds, on the same batches. The venv pins the same onnxruntime as the
project. REQUEST.json:

    {"data": NPZ, "batch": 8, "calibration_samples": 64, "rounds": 10, "round_seconds": 1.0,
     "round_min_runs": 4, "outputs": NPZ_OUT, "transformer": true,
     "contenders": [{"name": ..., "kind": "ort", "model": PATH, "session": {...}},
                    {"name": ..., "kind": "openvino", "model": ONNX_PATH, "nncf": bool, "config": {...}}]}

An OpenVINO contender compiles with its "config" (metainfer's pick: its recipe's compile settings), else with the
LATENCY hint alone.

It writes every contender's outputs on all samples to NPZ_OUT (the first as NAME, the
k-th as NAME.k; the caller scores quality with metainfer's own code) and prints one JSON line: per contender, the
per-batch times in ms and how long preparing it took (NNCF's quantization).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

# OpenVINO posts a Google Analytics event on import, and NNCF one per quantization, through openvino_telemetry;
# both fall back to stubs when it cannot be imported (what metainfer.core.runtime_telemetry does in metainfer's own
# processes, which this peer interpreter does not import). ONNX Runtime's switch comes in the environment.
sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]


def _ort(contender: dict[str, Any]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    session = contender.get("session") or {}
    options.intra_op_num_threads = int(session.get("intra_op_num_threads", 0))
    options.inter_op_num_threads = int(session.get("inter_op_num_threads", 0))
    levels = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    options.graph_optimization_level = levels[session.get("graph_optimization_level", "all")]
    if session.get("execution_mode") == "parallel":
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    model = ort.InferenceSession(contender["model"], options, providers=["CPUExecutionProvider"])
    return lambda feed: model.run(None, feed)


def _openvino(contender: dict[str, Any], calibration: list[dict[str, Any]], transformer: bool) -> Any:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(contender["model"])
    if contender.get("nncf"):
        import nncf

        model = nncf.quantize(
            model,
            nncf.Dataset(calibration),
            subset_size=len(calibration),
            model_type=nncf.ModelType.TRANSFORMER if transformer else None,
        )
    compiled = core.compile_model(model, "CPU", contender.get("config") or {"PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)

    def run(feed: dict[str, Any]) -> list[Any]:
        result = request.infer(feed)
        return [result[o].copy() for o in outputs]

    return run


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: peers_driver.py REQUEST.json", file=sys.stderr)
        return 2
    import numpy as np

    request = json.loads(Path(argv[0]).read_text())
    with np.load(request["data"]) as npz:
        data = {k: npz[k] for k in npz.files}
    batch = int(request["batch"])
    samples = next(iter(data.values())).shape[0]
    batches = [{k: v[i : i + batch] for k, v in data.items()} for i in range(0, samples - batch + 1, batch)]
    calibration = [{k: v[i : i + 1] for k, v in data.items()} for i in range(request["calibration_samples"])]
    runners: dict[str, Any] = {}
    prepare_s: dict[str, float] = {}
    errors: dict[str, str] = {}
    for contender in request["contenders"]:
        started = time.perf_counter()
        try:
            if contender["kind"] == "ort":
                runners[contender["name"]] = _ort(contender)
            else:
                runners[contender["name"]] = _openvino(contender, calibration, bool(request["transformer"]))
        except Exception as exc:  # one peer failing must not hide the others
            errors[contender["name"]] = f"{type(exc).__name__}: {exc}"[:500]
        prepare_s[contender["name"]] = time.perf_counter() - started
    outputs: dict[str, Any] = {}
    for name, run in runners.items():  # quality first: this also warms every contender up
        chunks = [run(feed) for feed in batches]
        for k in range(len(chunks[0])):  # every output: the engine's quality metric reads them all
            outputs[name if k == 0 else f"{name}.{k}"] = np.concatenate([c[k] for c in chunks])
    np.savez(request["outputs"], **outputs)
    names = list(runners)
    times: dict[str, list[float]] = {n: [] for n in names}
    for round_ in range(int(request["rounds"])):
        for name in [names[(round_ + k) % len(names)] for k in range(len(names))]:
            run = runners[name]
            run(batches[0])
            started, count = time.perf_counter(), 0
            while count < request["round_min_runs"] or time.perf_counter() - started < request["round_seconds"]:
                t0 = time.perf_counter()
                run(batches[count % len(batches)])
                times[name].append((time.perf_counter() - t0) * 1e3)
                count += 1
    print(json.dumps({"times_ms": times, "prepare_s": prepare_s, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
