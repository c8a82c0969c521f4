"""FLOP and byte counts on graphs small enough to count by hand, and on the digits example."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.roofline import achieved_fraction, batch_input_shapes, count_model, roofline
from metainfer.agent.zoo import digits

F32 = TensorProto.FLOAT


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    opsets: tuple[tuple[str, int], ...] = (("", 17),),
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, dtype=np.float32), name)


def test_batched_matmul_counts_two_flops_per_multiply_accumulate() -> None:
    # [b, 3, 4] x [4, 5]: every one of b*3*5 outputs takes 4 multiply-accumulates.
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", F32, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", F32, ["batch", 3, 5])],
        [_weight("w", 4, 5)],
    )
    cost = count_model(model, batch_input_shapes(model, 2))
    assert cost.float_flops == 2 * (2 * 3 * 5) * 4 == 240
    assert cost.int_ops == 0
    assert cost.parameter_bytes == 4 * 5 * 4
    assert cost.io_bytes == (2 * 3 * 4 + 2 * 3 * 5) * 4
    assert cost.bytes_moved == cost.parameter_bytes + cost.io_bytes
    assert cost.uncounted == ()


def test_gemm_with_transposed_b() -> None:
    # A [b, 4] x B^T where B is stored [5, 4]: b*5 outputs of 4 MACs each (the bias add is not counted).
    model = _model(
        [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1)],
        [helper.make_tensor_value_info("x", F32, ["batch", 4])],
        [helper.make_tensor_value_info("y", F32, ["batch", 5])],
        [_weight("w", 5, 4), _weight("c", 5)],
    )
    cost = count_model(model, {"x": (3, 4)})
    assert cost.float_flops == 2 * 3 * 5 * 4 == 120
    assert cost.by_op == {"Gemm": 120}
    assert cost.parameter_bytes == (5 * 4 + 5) * 4


def test_grouped_conv_counts_only_each_groups_channels() -> None:
    # X [1, 4, 8, 8], W [6, 4/2, 3, 3], group 2, same padding: Y [1, 6, 8, 8], each output 2*3*3 MACs.
    model = _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], group=2, kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("x", F32, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", F32, None)],
        [_weight("w", 6, 2, 3, 3)],
    )
    cost = count_model(model, batch_input_shapes(model, 1))
    assert cost.float_flops == 2 * (6 * 8 * 8) * (2 * 3 * 3) == 13824
    assert cost.io_bytes == (4 * 64 + 6 * 64) * 4  # the output shape came from inference


def test_conv_transpose_scatters_each_input_element() -> None:
    # X [1, 2, 3, 3], W [2, 4, 2, 2] (C_in, C_out, k): every input element feeds 4*2*2 outputs.
    model = _model(
        [helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2])],
        [helper.make_tensor_value_info("x", F32, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", F32, None)],
        [_weight("w", 2, 4, 2, 2)],
    )
    assert count_model(model, {"x": (1, 2, 3, 3)}).float_flops == 2 * (2 * 9) * (4 * 2 * 2)


def test_integer_matmul_counts_as_integer_work() -> None:
    model = _model(
        [helper.make_node("MatMulInteger", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", 2])],
        [numpy_helper.from_array(np.ones((8, 2), dtype=np.int8), "w")],
    )
    cost = count_model(model, batch_input_shapes(model, 4))
    assert (cost.float_flops, cost.int_ops) == (0, 2 * 4 * 2 * 8)
    assert cost.parameter_bytes == 16  # one byte per int8 weight
    assert cost.io_bytes == 4 * 8 * 1 + 4 * 2 * 4


def test_fused_attention_counts_projection_scores_and_context() -> None:
    # ORT's Attention: x [b=2, s=4, h=8] x W [8, 3*8], then QK^T and softmax(..) V over 4x4 per sample.
    model = _model(
        [helper.make_node("Attention", ["x", "w", "bias"], ["y"], domain="com.microsoft", num_heads=2)],
        [helper.make_tensor_value_info("x", F32, ["batch", 4, 8])],
        [helper.make_tensor_value_info("y", F32, None)],
        [_weight("w", 8, 24), _weight("bias", 24)],
        opsets=(("", 17), ("com.microsoft", 1)),
    )
    cost = count_model(model, batch_input_shapes(model, 2))
    assert cost.float_flops == 2 * 2 * 4 * 8 * 24 + 2 * (2 * 2 * 4 * 4 * 8)


def test_constant_of_shape_fill_is_a_parameter() -> None:
    # The onnx package's light_* nets store weights as fills ORT folds at load: they are still read per run.
    shape = numpy_helper.from_array(np.array([4, 5], dtype=np.int64), "shape")
    model = _model(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["w"], value=helper.make_tensor("v", F32, [1], [0.02])),
            helper.make_node("MatMul", ["x", "w"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", F32, [1, 4])],
        [helper.make_tensor_value_info("y", F32, [1, 5])],
        [shape],
    )
    cost = count_model(model, {"x": (1, 4)})
    assert cost.float_flops == 2 * 5 * 4
    assert cost.parameter_bytes == 2 * 8 + 4 * 5 * 4  # the shape tensor itself, then the fill


def test_symbolic_non_batch_axis_needs_a_sample_shape() -> None:
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", F32, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", F32, None)],
        [_weight("w", 4, 5)],
    )
    with pytest.raises(ValueError, match="symbolic non-batch axis"):
        batch_input_shapes(model, 2)
    assert batch_input_shapes(model, 2, {"x": (7, 4)}) == {"x": (2, 7, 4)}
    with pytest.raises(ValueError, match="not graph inputs"):
        count_model(model, {"nope": (1,)})


def test_digits_against_its_architecture(examples: dict[str, Path]) -> None:
    """Counted independently from the MLP's layer sizes, not from the graph."""
    model = onnx.load(examples["digits"])
    widths = [digits.N_FEATURES, *digits.HIDDEN, digits.N_CLASSES]
    macs_per_sample = sum(a * b for a, b in itertools.pairwise(widths))
    params = sum(a * b + b for a, b in itertools.pairwise(widths))
    for batch in (1, 64):
        cost = count_model(model, batch_input_shapes(model, batch))
        assert cost.float_flops == 2 * batch * macs_per_sample
        assert cost.int_ops == 0
        assert cost.parameter_bytes == 4 * params
        assert cost.io_bytes == 4 * batch * (digits.N_FEATURES + digits.N_CLASSES)


def test_roofline_bound_and_fraction() -> None:
    compute_bound = roofline(work_ops=2e9, bytes_moved=1e6, peak_ops_per_s=1e11, bandwidth_bytes_per_s=1e10)
    assert compute_bound.compute_s == pytest.approx(0.02) and compute_bound.memory_s == pytest.approx(1e-4)
    assert compute_bound.bound_s == pytest.approx(0.02) and compute_bound.limited_by == "compute"
    memory_bound = roofline(work_ops=1e6, bytes_moved=1e9, peak_ops_per_s=1e11, bandwidth_bytes_per_s=1e10)
    assert memory_bound.limited_by == "memory" and memory_bound.bound_s == pytest.approx(0.1)
    assert achieved_fraction(0.02, 0.08) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        roofline(1, 1, 0, 1)
    with pytest.raises(ValueError):
        achieved_fraction(1.0, 0.0)
