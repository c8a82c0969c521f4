"""What serve learns of a model at load: a seq-major export ([steps, batch, classes] out) is never split by rows,
so each request gets its own outputs; a model over dynamic images warms up at a length its convolutions take."""

from __future__ import annotations

import asyncio
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from metainfer.agent.serve.batching import Batcher
from metainfer.agent.serve.model import ModelSourceArgs, WarmUpFailed, load
from metainfer.core.engine.recipe import Recipe

STEPS = 5


def _model(path: Path, perm: list[int]) -> ModelSourceArgs:
    """x [batch, steps, 3] (both dynamic) -> Softmax -> Transpose(perm): perm [1, 0, 2] is seq-major."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "steps", 3])
    out_dims: list[str | int] = [["batch", "steps", 3][axis] for axis in perm]  # type: ignore[misc]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("Transpose", ["p"], ["y"], perm=perm)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    path.write_bytes(model.SerializeToString())
    return ModelSourceArgs(model_uri=path.as_uri(), model_sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def test_a_seq_major_export_is_served_one_request_per_run_and_a_batch_major_one_is_batched(tmp_path: Path) -> None:
    seq_major = load(_model(tmp_path / "seq.onnx", [1, 0, 2]), Recipe(batch=4), None)
    batch_major = load(_model(tmp_path / "batch.onnx", [0, 1, 2]), Recipe(batch=4), None)
    assert [s.shape for s in seq_major.signature.outputs] == [(-1, -1, 3)]  # dynamic first axis all the same
    assert seq_major.batch_major is False
    assert batch_major.batch_major is True


class SeqMajor:
    """[rows, 3] -> [STEPS, rows, 3]: what a combined run of a seq-major model returns."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    def __call__(
        self, inputs: dict[str, np.ndarray], outputs: list[str], deadline: float | None = None
    ) -> dict[str, np.ndarray]:
        x = inputs["x"]
        self.runs.append(x.shape[0])
        time.sleep(0.005)
        return {"y": np.stack([x * (step + 1) for step in range(STEPS)])}


def test_a_combined_run_whose_outputs_do_not_have_its_rows_first_is_rerun_alone_and_batching_stops() -> None:
    """The batcher's own guard, for what the load-time check could not see."""
    model = SeqMajor()

    async def scenario() -> list:  # type: ignore[type-arg]
        with ThreadPoolExecutor(1) as pool:
            batcher = Batcher(model, pool, workers=1, batch_rows=4, max_delay_s=0.02, batchable=True)
            deadline = time.perf_counter() + 10
            requests = [np.full((1, 3), i, dtype=np.float32) for i in range(12)]
            outcomes = await asyncio.gather(*(batcher.submit({"x": r}, ["y"], deadline) for r in requests))
            rows_after = batcher.batch_rows
            batcher.close()
            return [list(zip(requests, outcomes, strict=True)), rows_after]

    pairs, rows_after = asyncio.run(scenario())
    for request, outcome in pairs:
        assert outcome.results is not None
        assert np.array_equal(outcome.results["y"], np.stack([request * (s + 1) for s in range(STEPS)]))
    assert rows_after == 1
    assert max(model.runs) > 1  # a combined run happened, was seen, and was not split
    assert model.runs[-1] == 1


def _valid_conv(path: Path, kernel: int) -> ModelSourceArgs:
    """x [n, 1, h, w] (all dynamic) -> Conv kernel x kernel without padding: it needs images at least that large."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1, "h2", "w2"])
    weight = numpy_helper.from_array(np.ones((1, 1, kernel, kernel), np.float32), "weight")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "weight"], ["y"])], "g", [x], [y], [weight])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    return ModelSourceArgs(model_uri=path.as_uri(), model_sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def test_a_model_over_dynamic_images_warms_up_at_a_length_its_convolutions_take(tmp_path: Path) -> None:
    """Zeros of length 1 made ONNX Runtime refuse a 3x3 convolution without padding, and the pod never started."""
    loaded = load(_valid_conv(tmp_path / "conv.onnx", 3), Recipe(batch=4), None)
    out = loaded.infer({"x": np.ones((2, 1, 5, 5), np.float32)}, ["y"])["y"]
    assert out.shape == (2, 1, 3, 3) and loaded.batch_major


def test_a_model_no_warm_up_input_runs_fails_its_load_rather_than_serving(tmp_path: Path) -> None:
    with pytest.raises(WarmUpFailed, match=r"none of the warm-up inputs .*\[1, 32, 224, 640\]"):
        load(_valid_conv(tmp_path / "huge.onnx", 700), Recipe(batch=1), None)
