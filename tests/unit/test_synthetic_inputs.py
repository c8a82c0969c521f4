"""A policy without data: seeded random samples shaped like the model's inputs (agent.inputs.synthetic_dataset)."""

from __future__ import annotations

import numpy as np
import pytest

from metainfer.agent.inputs import synthetic_dataset, synthetic_note
from metainfer.core.api.policy import InputSpec
from metainfer.core.engine.errors import DataError
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


def test_the_note_names_the_open_axes_random_inputs_gave_length_one_and_how_to_set_them() -> None:
    model = _model(
        TensorInfo(name="pixel_values", dtype="float32", shape=("batch", 3, "height", "width")),
        TensorInfo(name="mask", dtype="int64", shape=("batch", None)),
    )
    data = synthetic_dataset(model, [], seed=0, n=4)
    note = synthetic_note(model, [], data, "spec.model.inputs")
    assert note.startswith("quality measured against FP32's outputs on 4 seeded random inputs (not task accuracy)")
    assert (
        "pixel_values axis 2 (height), pixel_values axis 3 (width), mask axis 1 (set them with spec.model.inputs)"
        in note
    )
    shaped = [InputSpec(name="pixel_values", shape=[-1, 3, 8, 8]), InputSpec(name="mask", shape=[-1, 5])]
    assert "open" not in synthetic_note(model, shaped, synthetic_dataset(model, shaped, seed=0, n=4), "x")


def test_a_shape_for_an_input_the_model_lacks_is_refused_not_ignored() -> None:
    """A typo in spec.model.inputs (or --input-shape) left the input it meant at length 1, unsaid."""
    model = _model(TensorInfo(name="x", dtype="float32", shape=("N", "T")))
    with pytest.raises(DataError, match=r"--input-shape: \['y'\] are not model inputs; the model's inputs are \['x'\]"):
        synthetic_dataset(model, [InputSpec(name="y", shape=[-1, 4])], seed=0, field="--input-shape")
