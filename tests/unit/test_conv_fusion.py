"""Conv fusion (transforms.conv): Sum as Add chains, LRN decomposed, and old IR 3 graphs that quantize."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from metainfer.agent.zoo.light import build_light_inputs, load_light_model
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.transforms import build_variant
from metainfer.core.engine.transforms.conv import fuse_conv
from metainfer.core.engine.transforms.quantize import to_int8


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


def _residual_sum_net(opset: int = 9) -> onnx.ModelProto:
    """Conv -> Relu, joined with the input and a per-channel bias by one 3-input Sum (broadcasting)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)
    bias = rng.standard_normal((4, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Sum", ["x", "r", "bias"], ["y"], name="join"),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_an_n_ary_sum_becomes_a_chain_of_adds_with_the_same_result() -> None:
    model = _residual_sum_net()
    fused = fuse_conv(model)
    onnx.checker.check_model(fused)
    ops = [n.op_type for n in fused.graph.node]
    assert "Sum" not in ops and ops.count("Add") == 2
    assert [n.name for n in fused.graph.node if n.output[0] == "y"] == ["join"]  # the node keeps its name
    feed = {"x": np.random.default_rng(1).standard_normal((2, 4, 8, 8)).astype(np.float32)}
    np.testing.assert_allclose(_run(fused, feed)[0], _run(model, feed)[0], rtol=1e-6, atol=1e-6)


def test_a_sum_before_opset_8_is_left_alone() -> None:
    # Add and Sum broadcast differently before opsets 7 and 8, so the rewrite could change the result there.
    fused = fuse_conv(_residual_sum_net(opset=6))
    assert [n.op_type for n in fused.graph.node].count("Sum") == 1


def _lrn_net(size: int, channels: int = 12, ir_version: int | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(size)
    w = (rng.standard_normal((channels, 3, 3, 3)) * 2.0).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("LRN", ["c"], ["y"], size=size, alpha=0.02, beta=0.75, bias=1.5, name="norm"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])]
    if ir_version == 3:  # IR 3 lists every initializer among the inputs
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
    graph = helper.make_graph(
        nodes,
        "lrn",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 6, 6])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


@pytest.mark.parametrize("size", [1, 3, 4, 5])
def test_lrn_is_decomposed_into_ops_that_give_the_same_output(size: int) -> None:
    model = _lrn_net(size)
    fused = fuse_conv(model)
    onnx.checker.check_model(fused)
    ops = [n.op_type for n in fused.graph.node]
    assert "LRN" not in ops and {"Conv", "Pow", "Div"} <= set(ops)
    feed = {"x": np.random.default_rng(2).standard_normal((1, 3, 6, 6)).astype(np.float32) * 3}
    conv_only = onnx.ModelProto()
    conv_only.CopyFrom(model)
    del conv_only.graph.node[1:]
    conv_only.graph.output[0].name = "c"
    expected = _lrn_by_the_spec(_run(conv_only, feed)[0].astype(np.float64), size, 0.02, 0.75, 1.5)
    np.testing.assert_allclose(_run(fused, feed)[0], expected, rtol=2e-5, atol=1e-6)
    if size % 2:  # ORT's own LRN kernel only takes odd sizes; the decomposition takes any
        np.testing.assert_allclose(_run(fused, feed)[0], _run(model, feed)[0], rtol=2e-5, atol=1e-6)


def _lrn_by_the_spec(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    channels = x.shape[1]
    square_sum = np.zeros_like(x)
    for c in range(channels):
        low, high = max(0, c - (size - 1) // 2), min(channels - 1, c + int(np.ceil((size - 1) / 2)))
        square_sum[:, c] = (x[:, low : high + 1] ** 2).sum(axis=1)
    # the inputs are strong enough that the window sum, not the bias, dominates: an off-by-one window shows
    assert float(np.max(alpha / size * square_sum)) > bias
    return x / (bias + alpha / size * square_sum) ** beta


def test_an_ir3_graph_gets_its_new_weights_listed_as_inputs() -> None:
    fused = fuse_conv(_lrn_net(5, ir_version=3))
    onnx.checker.check_model(fused)  # raises if a new initializer is missing from the inputs
    listed = {v.name for v in fused.graph.input}
    assert {t.name for t in fused.graph.initializer} <= listed


def test_an_lrn_whose_channel_count_is_unknown_is_kept() -> None:
    model = _lrn_net(3)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "channels_in"
    del model.graph.initializer[:]  # without the weight, shape inference cannot know the conv's channels
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, ["c", "k", 3, 3]))
    assert [n.op_type for n in fuse_conv(model).graph.node].count("LRN") == 1


def test_conv_fusion_is_offered_only_where_it_changes_something(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with_sum, with_lrn, plain = tmp_path / "sum.onnx", tmp_path / "lrn.onnx", tmp_path / "plain.onnx"
    onnx.save(_residual_sum_net(), with_sum)
    onnx.save(_lrn_net(5), with_lrn)
    model = _residual_sum_net()
    model.graph.node[2].op_type = "Add"
    del model.graph.node[2].input[2]
    onnx.save(model, plain)
    assert inspect_model(with_sum).conv_fusable and inspect_model(with_lrn).conv_fusable
    assert not inspect_model(plain).conv_fusable


def test_static_int8_works_on_an_ir3_graph_with_weights_among_its_inputs() -> None:
    # Inception v2 from the model zoo (IR 3: every weight also listed as an input). ORT's pre-processing folded
    # the ConstantOfShape weights but left their names among the inputs, so calibration failed with
    # "Required inputs ... are missing"; the quantizer now gets a graph whose weights are only initializers.
    model = load_light_model("light_inception_v2")
    assert model.ir_version == 3
    data = Dataset(build_light_inputs(model, samples=8))
    variant = to_int8(model, QuantizationSpec(mode="int8_static", per_channel=True), data)
    assert sum(n.op_type == "QuantizeLinear" for n in variant.graph.node) > 0
    assert not {v.name for v in variant.graph.input} & {t.name for t in variant.graph.initializer}


def test_a_conv_fused_int8_variant_keeps_the_residual_join_in_integers() -> None:
    model = _residual_sum_net(opset=13)
    data = Dataset({"x": np.random.default_rng(5).standard_normal((8, 4, 8, 8)).astype(np.float32)})
    spec = TransformSpec(
        fusion="conv", quantization=QuantizationSpec(mode="int8_static", per_channel=True, format="qoperator")
    )
    ops = [n.op_type for n in onnx.load_from_string(build_variant(model.SerializeToString(), spec, data)).graph.node]
    assert "QLinearAdd" in ops and "Sum" not in ops
    assert "conv fusion" in Recipe(transform=spec).describe()
