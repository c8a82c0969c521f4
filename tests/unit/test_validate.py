"""Validation is honest about what sharing a run does to a variant's outputs (issue 27, item 4).

Dynamic int8 computes each run's activation scales from all of its rows, so a request served beside others gets
different outputs than alone; validation measures by how much, in several companies, and holds every sample's
worst grouping to the quality budget. A variant whose outputs do not depend on their company gets the difference
reported (float noise) and no extra check.
"""

from __future__ import annotations

import numpy as np
import pytest

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import ModelError
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.reference import Reference, make_reference
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms.build import build_variant
from metainfer.core.engine.validate import batch_dependence, validate_variant, worst_per_sample

FP32 = Recipe()
DYNAMIC = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic")))
STATIC = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode="int8_static")))


def test_only_dynamic_quantization_makes_outputs_depend_on_the_run() -> None:
    assert DYNAMIC.batch_dependent()
    assert not FP32.batch_dependent() and not STATIC.batch_dependent()
    fp16 = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode="fp16")))
    assert not fp16.batch_dependent()


def test_the_flag_is_derived_never_read_back_and_keeps_the_recipe_key() -> None:
    dumped = DYNAMIC.model_dump(mode="json")
    assert "batch_dependent" not in dumped  # not part of the recipe's identity: keys, Deployments and runs stay put
    assert Recipe.model_validate({**dumped, "batch_dependent": False}) == DYNAMIC


def _validate(digits: tuple[bytes, ModelInfo, Dataset], recipe: Recipe, budget: float = 0.05):  # type: ignore[no-untyped-def]
    base, _, data = digits
    reference = make_reference(create_session(base, FP32), data, 16)
    variant = build_variant(base, recipe.transform)
    return validate_variant(variant, recipe.model_copy(update={"batch": 8}), data, reference, budget, 64)


def test_a_dynamic_int8_variant_is_run_in_other_company_and_its_worst_grouping_is_held_to_the_budget(
    digits: tuple[bytes, ModelInfo, Dataset],
) -> None:
    report = _validate(digits, DYNAMIC)
    dependence = report.batch_dependence
    assert dependence is not None
    assert dependence.groupings == [
        "alone", "in runs of 8", "in runs of 64", "shuffled in runs of 64", "in runs of 64 with the largest input",
    ]  # fmt: skip
    assert dependence.max_abs_difference > 1e-4  # the reproduction: a row's outputs move with its company
    contiguous = next(c for c in report.checks if c.name == "quality at batch 64 (largest)")
    shared = next(c for c in report.checks if c.name.startswith("quality when sharing runs"))
    assert "outputs move by up to" in shared.detail and "budget 0.05" in shared.detail
    # The worst grouping per sample is never better than any one grouping.
    assert dependence.worst_quality.value <= report.full_data_quality.value
    assert f"{dependence.worst_quality.value:.4f}" in shared.detail and contiguous.passed


def test_the_worst_grouping_fails_validation_when_it_is_over_the_budget(
    digits: tuple[bytes, ModelInfo, Dataset],
) -> None:
    report = _validate(digits, DYNAMIC, budget=0.0)  # int8 loses a little accuracy on digits (0.0028 measured)
    dependence = report.batch_dependence
    assert dependence is not None and dependence.worst_quality.drop > 0
    shared = next(c for c in report.checks if c.name.startswith("quality when sharing runs"))
    assert not shared.passed and not report.passed


def test_a_variant_independent_of_its_company_gets_the_difference_reported_and_no_extra_check(
    digits: tuple[bytes, ModelInfo, Dataset],
) -> None:
    report = _validate(digits, FP32)
    dependence = report.batch_dependence
    assert dependence is not None and dependence.groupings == ["alone", "in runs of 8", "in runs of 64"]
    assert dependence.max_abs_difference < 1e-4  # float noise between kernels of different batch sizes
    assert not any(c.name.startswith("quality when sharing runs") for c in report.checks)


def test_the_worst_grouping_of_each_sample_is_taken_a_wrong_label_first() -> None:
    labels = np.array([0, 1, 2])
    reference_scores = np.eye(3, dtype=np.float32)
    reference = Reference([reference_scores], labels, 1.0)
    alone = [reference_scores.copy()]
    far = reference_scores.copy()
    far[0] = [0.5, 0.0, 0.0]  # far from FP32, still right
    first_flipped = reference_scores.copy()
    first_flipped[0] = [0.9, 1.0, 0.0]  # nearer than ``far``, but the wrong label
    last_flipped = reference_scores.copy()
    last_flipped[2] = [0.0, 1.0, 0.99]
    candidates = [alone, [far], [first_flipped], [last_flipped]]
    worst = worst_per_sample(candidates, reference)[0]
    assert worst[0].tolist() == pytest.approx([0.9, 1.0, 0.0]) and worst[1].tolist() == [0.0, 1.0, 0.0]
    assert worst[2].tolist() == pytest.approx([0.0, 1.0, 0.99])
    groupings = {"alone": alone, "far": [far], "first": [first_flipped], "last": [last_flipped]}
    dependence = batch_dependence(groupings, reference)
    assert dependence.max_abs_difference == pytest.approx(1.0)
    # Each grouping alone reads 2 of 3 right; a client can meet both flips, so 1 of 3 is what is validated.
    assert dependence.worst_quality.value == pytest.approx(1 / 3)


def _with_a_mean_output(batch: int | str) -> bytes:
    """x [batch, 16] -> y [batch, 4] and the mean of y over the whole run, a scalar."""
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("ReduceMean", ["y"], ["mean"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("mean", TensorProto.FLOAT, [])], [weights],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model.SerializeToString()


DATA = Dataset({"x": np.random.default_rng(1).standard_normal((24, 16)).astype(np.float32)})


def test_an_output_that_is_one_value_per_run_of_several_samples_is_refused_by_name() -> None:
    """It changes with the batch, so no sample's value can be compared: this crashed with numpy's "zero-dimensional
    arrays cannot be concatenated" (and at batch 1, in validation's run at the largest batch)."""
    session = create_session(_with_a_mean_output("N"), FP32)
    with pytest.raises(ModelError, match="output 'mean': a run of 8 samples gives it as one scalar"):
        make_reference(session, DATA, 8)
    reference = make_reference(session, DATA, 1)  # one sample per run: the scalar is that sample's
    with pytest.raises(ModelError, match="output 'mean'"):
        validate_variant(_with_a_mean_output("N"), FP32, DATA, reference, 0.01, 8)


def test_a_scalar_output_of_a_model_fixed_at_batch_1_is_one_value_per_sample() -> None:
    variant = _with_a_mean_output(1)
    reference = make_reference(create_session(variant, FP32), DATA, 1)
    assert [o.shape for o in reference.outputs] == [(24, 4), (24,)]
    report = validate_variant(variant, FP32, DATA, reference, 0.01, 1)
    assert report.passed, [c for c in report.checks if not c.passed]
