"""Exports whose outputs no single sample owns, and models that compute across their batch.

A detector with non-max suppression inside returns the boxes each run kept: as many rows as survived, whatever
the run's samples. Compared row by row with FP32 at another grouping they crashed validation ("operands could not
be broadcast together with shapes (35,3) (38,3)"); a constant output crashed the cosine the same way. Such
outputs are now left out of the per-sample comparison and named in the report's notes; a model with nothing
else is refused by name. A model whose FP32 answer for one sample changes with the rest of its run (a statistic
or branch over the whole batch) made every candidate "infeasible" at batch 1; it is refused by name too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from fakes import fixed_profile
from odd_exports import detector
from onnx import TensorProto, helper, numpy_helper

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import DataError, ModelError, UnsupportedModelError, fp32_failure
from metainfer.core.engine.modelinfo import ModelInfo, inspect_model
from metainfer.core.engine.pipeline import Adaptation
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.reference import make_reference, quality_of, refuse_batch_mixing, run_all
from metainfer.core.engine.report import AdaptSettings
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms.build import build_variant
from metainfer.core.engine.validate import validate_variant

FP32 = Recipe()
DYNAMIC = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic")))
RNG = np.random.default_rng(0)
DATA = Dataset({"x": RNG.standard_normal((40, 16)).astype(np.float32)})


def _model(
    nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto], initializers: list[onnx.TensorProto]
) -> bytes:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])], outputs, initializers
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _array(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def test_detections_kept_per_run_are_left_out_and_the_per_sample_boxes_validate() -> None:
    model = detector()
    reference = make_reference(create_session(model, FP32), DATA, 8)
    assert reference.compared() == [0] and reference.left_out() == ["selected"]
    variant = build_variant(model, DYNAMIC.transform)
    recipe = DYNAMIC.model_copy(update={"batch": 8})
    report = validate_variant(variant, recipe, DATA, reference, 0.05, 40)
    assert report.passed, [c for c in report.checks if not c.passed]
    assert report.batch_dependence is not None  # run in other company: the boxes only
    # At batch 1 the detections have other rows than at 8: only the boxes are compared, so this does not crash.
    assert quality_of(run_all(create_session(variant, FP32), DATA, 1), reference).metric == "cosine_similarity"


def test_a_model_whose_only_output_no_sample_owns_is_refused_by_name_unless_a_plugin_reads_it() -> None:
    session = create_session(detector(with_boxes=False), FP32)
    with pytest.raises(ModelError, match=r"none has a fixed number of rows per sample .*'selected'.*quality plugin"):
        make_reference(session, DATA, 8)


def test_an_output_of_fixed_shape_is_left_out_even_where_a_run_has_as_many_rows() -> None:
    """[4] rows for a run of 4 look like one per sample; the declared shape says they cannot follow the batch."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("anchors", TensorProto.FLOAT, [4]),
    ]
    initializers = [
        _array("W", RNG.standard_normal((16, 4)).astype(np.float32)),
        _array("anchors", np.ones(4, np.float32)),
    ]
    model = _model(nodes, outputs, initializers)
    reference = make_reference(create_session(model, FP32), DATA, 4)
    assert reference.left_out() == ["anchors"]
    report = validate_variant(model, FP32.model_copy(update={"batch": 4}), DATA, reference, 0.01, 40)
    assert report.passed, [c for c in report.checks if not c.passed]


def _centred_on_the_batch() -> bytes:
    """y = x W - mean(x W) over the whole run: each sample's answer depends on the others in its run."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["z"]),
        helper.make_node("ReduceMean", ["z"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["z", "mean"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])]
    return _model(nodes, outputs, [_array("W", RNG.standard_normal((16, 4)).astype(np.float32))])


def test_a_model_that_computes_across_its_batch_is_refused_by_name_and_runs_at_batch_1() -> None:
    model = _centred_on_the_batch()
    adaptation = Adaptation(model, _info(model), DATA, fixed_profile(), AdaptSettings(batch=8))
    with pytest.raises(ModelError, match=r"cosine_similarity drops by 0\.\d+ \(budget 0\.01\) between running its "
                       r"samples alone and in runs of 8: it computes across its batch"):  # fmt: skip
        adaptation.run()
    session = create_session(model, FP32)
    assert make_reference(session, DATA, 1).shared_run_drop is None  # alone, every answer is the sample's own
    refuse_batch_mixing(make_reference(session, DATA, 8), 8, budget=1.0)  # a budget it keeps: not refused


def test_a_users_own_dynamic_int8_export_is_not_taken_for_one_that_computes_across_its_batch(
    digits: tuple[bytes, ModelInfo, Dataset],
) -> None:
    """Its per-run activation scales move a sample's outputs with its company, by far less than any budget."""
    base, _, data = digits
    users_export = build_variant(base, DYNAMIC.transform)
    without_labels = Dataset(data.inputs)  # cosine: top-1 on 128 samples would read 0 either way
    reference = make_reference(create_session(users_export, FP32), without_labels, 64)
    assert reference.shared_run_drop is not None and 0 < reference.shared_run_drop < 1e-3
    refuse_batch_mixing(reference, 64, budget=0.005)


def _info(model: bytes) -> ModelInfo:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        path.write_bytes(model)
        return inspect_model(path)


def test_onnx_runtimes_refusal_of_the_fp32_model_becomes_a_named_error() -> None:
    """A custom-domain op no provider registers fails the run with ONNX Runtime's line, not a traceback."""
    custom = helper.make_model(
        helper.make_graph(
            [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.acme")], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)], ir_version=8,
    )  # fmt: skip
    model = custom.SerializeToString()
    adaptation = Adaptation(model, _info(model), DATA, fixed_profile(), AdaptSettings(batch=8))
    with pytest.raises(UnsupportedModelError, match=r"cannot run: .*com\.acme:Frobnicate\(-1\) is not a registered"):
        adaptation.run()
    with pytest.raises(Exception) as raised:
        create_session(custom.SerializeToString(), FP32)
    error = fp32_failure(raised.value)
    assert isinstance(error, UnsupportedModelError) and "com.acme:Frobnicate" in str(error)
    other = fp32_failure(RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad\nstack"))
    assert isinstance(other, ModelError) and str(other).endswith("INVALID_ARGUMENT : bad")


def test_a_model_without_a_samples_axis_adapts_at_batch_1_only() -> None:
    from odd_exports import unbatched_conv

    from metainfer.core.engine.errors import InputError

    model = unbatched_conv()
    images = Dataset({"x": RNG.standard_normal((6, 3, 8, 8)).astype(np.float32)}, unbatched=frozenset({"x"}))
    with pytest.raises(InputError, match=r"--batch: input\(s\) \['x'\] have no samples axis .* use --batch 1"):
        Adaptation(model, _info(model), images, fixed_profile(), AdaptSettings(batch=3))
    # Its fixed first axis (3, the channels) is not a batch: batch 1 is accepted, not "use --batch 3".
    Adaptation(model, _info(model), images, fixed_profile(), AdaptSettings(batch=1))


def _linear() -> bytes:
    weights = _array("W", RNG.standard_normal((16, 4)).astype(np.float32))
    return _model(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], [helper.make_tensor_value_info("y", 1, ["N", 4])], [weights]
    )


def test_data_with_missing_values_fp32_answers_nan_for_is_refused_naming_the_input_and_samples() -> None:
    """Found with a tabular export and NaN in one feature of its data: FP32 scored top-1 0.10 on NaN logits and
    an int8 variant (its quantizer turns NaN into a number) "gained" 0.86, and was chosen."""
    x = DATA.inputs["x"].copy()
    x[[3, 17], 5] = np.nan
    with pytest.raises(DataError, match=r"input 'x'.*for 2 of 40 samples \(sample 3, 17\).*Fill in missing values"):
        make_reference(create_session(_linear(), FP32), Dataset({"x": x}), 8)


def test_a_model_that_answers_nan_for_finite_data_is_refused_naming_the_output() -> None:
    """log of a negative number: NaN from the model itself, not from its data."""
    model = _model([helper.make_node("Log", ["x"], ["y"])], [helper.make_tensor_value_info("y", 1, ["N", 16])], [])
    with pytest.raises(ModelError, match=r"output 'y'\) for 40 of 40 samples .*though their inputs are finite"):
        make_reference(create_session(model, FP32), DATA, 8)


def test_missing_values_the_model_itself_fills_in_are_fine() -> None:
    """A graph that imputes NaN (IsNaN, Where) answers numbers for them: nothing to refuse."""
    x = DATA.inputs["x"].copy()
    x[:5, 2] = np.nan
    model = _model(
        [
            helper.make_node("IsNaN", ["x"], ["missing"]),
            helper.make_node("Where", ["missing", "zero", "x"], ["filled"]),
            helper.make_node("MatMul", ["filled", "W"], ["y"]),
        ],
        [helper.make_tensor_value_info("y", 1, ["N", 4])],
        [_array("zero", np.zeros((), np.float32)), _array("W", RNG.standard_normal((16, 4)).astype(np.float32))],
    )
    reference = make_reference(create_session(model, FP32), Dataset({"x": x}), 8)
    assert np.isfinite(reference.outputs[0]).all()


def test_nan_on_random_inputs_asks_for_data_not_for_a_fixed_export() -> None:
    """No data given: the model takes the log of a feature, and random numbers are not what it takes."""
    model = _model([helper.make_node("Log", ["x"], ["y"])], [helper.make_tensor_value_info("y", 1, ["N", 16])], [])
    random = Dataset(DATA.inputs, random=True)
    with pytest.raises(DataError, match=r"data: FP32 answers NaN .* they are random \(no data was given\).*--data"):
        make_reference(create_session(model, FP32), random, 8)


def test_a_setting_given_once_does_not_set_the_calibration_batch() -> None:
    """A fixed [4, 5] table beside a batch is a setting: its first axis is not the batch static int8 calibrates
    in (it asked for 4 samples per calibration run and failed every int8_static trial on fewer)."""
    from metainfer.core.engine.transforms.quantize import CALIBRATION_BATCH, calibration_batch

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["z"]), helper.make_node("MatMul", ["z", "table"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16]),
         helper.make_tensor_value_info("table", TensorProto.FLOAT, [4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        [_array("W", RNG.standard_normal((16, 4)).astype(np.float32))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    table = np.broadcast_to(np.ones((4, 5), np.float32), (40, 4, 5))
    data = Dataset(
        {"x": DATA.inputs["x"], "table": table}, unbatched=frozenset({"table"}), per_run=frozenset({"table"})
    )
    assert calibration_batch(model, data) == CALIBRATION_BATCH
