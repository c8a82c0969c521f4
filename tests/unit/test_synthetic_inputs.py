"""A policy without data: seeded random samples shaped like the model's inputs (agent.inputs.synthetic_dataset)."""

from __future__ import annotations

import numpy as np

from metainfer.agent.inputs import synthetic_dataset
from metainfer.core.api.policy import InputSpec
from metainfer.core.engine.modelinfo import ModelInfo, TensorInfo


def _model(*inputs: TensorInfo) -> ModelInfo:
    return ModelInfo(
        path="model.onnx",
        sha256="0" * 64,
        size_bytes=1,
        opset=17,
        inputs=inputs,
        outputs=(TensorInfo(name="y", dtype="float32", shape=("N", 4)),),
        op_counts={"MatMul": 1},
        parameters=64,
    )


def test_dynamic_axes_past_the_first_become_one_and_the_same_seed_gives_the_same_samples() -> None:
    model = _model(
        TensorInfo(name="image", dtype="float32", shape=("N", 3, "H", "W")),
        TensorInfo(name="ids", dtype="int64", shape=("N", 12)),
    )
    data = synthetic_dataset(model, [], seed=3, n=20)
    assert data.inputs["image"].shape == (20, 3, 1, 1) and data.inputs["ids"].shape == (20, 12)
    assert set(np.unique(data.inputs["ids"])) <= {0, 1}  # valid token ids, masks and segment ids alike
    again = synthetic_dataset(model, [], seed=3, n=20)
    assert all(np.array_equal(data.inputs[k], again.inputs[k]) for k in data.inputs)
    assert not np.array_equal(synthetic_dataset(model, [], seed=4, n=20).inputs["image"], data.inputs["image"])


def test_a_scalar_beside_batched_inputs_is_one_setting_so_runs_hold_many_samples() -> None:
    """A detector's score threshold: random per sample, it made every run hold one sample, and a policy's
    production batch could not be measured without data."""
    model = _model(
        TensorInfo(name="x", dtype="float32", shape=("N", 16)),
        TensorInfo(name="threshold", dtype="float32", shape=()),
    )
    data = synthetic_dataset(model, [], seed=0, n=10)
    assert data.per_run == {"threshold"} and not data.one_sample_per_run and data.n_samples == 10
    assert data.batch(0, 8)["threshold"].shape == ()


def test_a_model_that_takes_only_a_scalar_gets_one_per_sample() -> None:
    model = _model(TensorInfo(name="t", dtype="float32", shape=()))
    data = synthetic_dataset(model, [], seed=0, n=6)
    assert data.n_samples == 6 and data.one_sample_per_run
    assert len({float(feed["t"]) for feed, _ in data.batches(1)}) == 6


def test_a_policy_override_gives_the_shape_and_type_the_model_does_not_say() -> None:
    model = _model(TensorInfo(name="x", dtype="float32", shape=("N", "T")))
    data = synthetic_dataset(model, [InputSpec(name="x", shape=[-1, 7], dtype="float32")], seed=0, n=5)
    assert data.inputs["x"].shape == (5, 7)
