"""Static int8 on conv nets: BatchNorm and constant-produced weights are folded before quantizing, and the
QOperator form writes ONNX Runtime's integer convolutions directly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant


def _conv_bn_net() -> onnx.ModelProto:
    """Conv (weight from a Constant node, as some exporters write it) -> BatchNorm -> Relu -> Conv -> Relu."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((4, 8, 3, 3)) * 0.2).astype(np.float32)
    bn = [np.ones(8, np.float32), np.full(8, 0.1, np.float32), np.zeros(8, np.float32), np.ones(8, np.float32)]
    nodes = [
        helper.make_node("Constant", [], ["w1"], value=numpy_helper.from_array(w1)),
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["y"], name="relu2"),
    ]
    initializers = [numpy_helper.from_array(w2, "w2")] + [
        numpy_helper.from_array(a, n) for a, n in zip(bn, ["s", "b", "m", "v"], strict=True)
    ]
    graph = helper.make_graph(
        nodes,
        "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 16, 16])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def net() -> tuple[bytes, Dataset]:
    images = np.random.default_rng(1).standard_normal((16, 3, 16, 16)).astype(np.float32)
    return _conv_bn_net().SerializeToString(), Dataset({"x": images})


def _static(fmt: str) -> TransformSpec:
    return TransformSpec(quantization=QuantizationSpec(mode="int8_static", per_channel=True, format=fmt))  # type: ignore[arg-type]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_batchnorm_and_constant_weights_are_folded_before_quantizing(net) -> None:  # type: ignore[no-untyped-def]
    base, data = net
    variant = onnx.load_from_string(build_variant(base, _static("qdq"), data))
    ops = [n.op_type for n in variant.graph.node]
    assert "BatchNormalization" not in ops and "Constant" not in ops
    initializers = {t.name: t for t in variant.graph.initializer}
    # Every conv weight is an int8 initializer behind a DequantizeLinear, so ORT fuses integer convolutions.
    conv_weights = {n.input[1] for n in variant.graph.node if n.op_type == "Conv"}
    weight_dq = [n for n in variant.graph.node if n.op_type == "DequantizeLinear" and n.output[0] in conv_weights]
    assert len(weight_dq) == 2
    assert all(n.input[0] in initializers for n in weight_dq)
    assert all(initializers[n.input[0]].data_type == TensorProto.INT8 for n in weight_dq)
    feed = {"x": data.inputs["x"][:4]}
    fp32 = create_session(base, Recipe(batch=4)).run(None, feed)[0]
    int8 = create_session(variant.SerializeToString(), Recipe(batch=4)).run(None, feed)[0]
    assert _cosine(fp32, int8) > 0.99


def test_the_qoperator_form_writes_integer_convolutions(net) -> None:  # type: ignore[no-untyped-def]
    base, data = net
    variant = onnx.load_from_string(build_variant(base, _static("qoperator"), data))
    ops = [n.op_type for n in variant.graph.node]
    assert ops.count("QLinearConv") == 2 and "DequantizeLinear" in ops  # back to float only at the output
    feed = {"x": data.inputs["x"][:4]}
    fp32 = create_session(base, Recipe(batch=4)).run(None, feed)[0]
    int8 = create_session(variant.SerializeToString(), Recipe(batch=4)).run(None, feed)[0]
    assert _cosine(fp32, int8) > 0.99
    assert "integer operators" in Recipe(transform=_static("qoperator")).describe()
