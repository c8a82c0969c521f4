"""Spelled-out activations written as one operator (issue 30 item 4): each exporter ordering is found, the rewrite
is exact, and patterns that are not what they look like are left alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms.activations import fuse_activations

RNG = np.random.default_rng(0)


def _scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], opset: int = 14) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["in"], ["x"]), *nodes, helper.make_node("Identity", ["y"], ["out"])],
        "g",
        [helper.make_tensor_value_info("in", TensorProto.FLOAT, [2, 3, 4, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3, 4, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


GELU_DIV_HALF_LAST = (
    [
        helper.make_node("Div", ["x", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["x", "a"], ["m"]),
        helper.make_node("Mul", ["m", "half"], ["y"]),
    ],
    [_scalar("sqrt2", 1.4142135), _scalar("one", 1.0), _scalar("half", 0.5)],
)
GELU_MUL_HALF_FIRST = (  # tf2onnx / paddle2onnx: x * 0.5 first, x * (1/sqrt2) instead of a Div
    [
        helper.make_node("Mul", ["x", "half"], ["h"]),
        helper.make_node("Mul", ["x", "rsqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["one", "e"], ["a"]),
        helper.make_node("Mul", ["h", "a"], ["y"]),
    ],
    [_scalar("rsqrt2", 0.70710678), _scalar("one", 1.0), _scalar("half", 0.5)],
)
HARDSWISH = (
    [helper.make_node("HardSigmoid", ["x"], ["s"], alpha=1 / 6, beta=0.5), helper.make_node("Mul", ["x", "s"], ["y"])],
    [],
)
HARDSWISH_CLIP = (  # paddle2onnx below opset 14: x * Clip(x + 3, 0, 6) / 6
    [
        helper.make_node("Add", ["x", "three"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Div", ["m", "six_"], ["y"]),
    ],
    [_scalar("three", 3.0), _scalar("zero", 0.0), _scalar("six", 6.0), _scalar("six_", 6.0)],
)
HARDSWISH_CLIP_GATE_SCALED = (  # the 1/6 on the gate, as a Mul: x * (Clip(3 + x, 0, 6) * 1/6)
    [
        helper.make_node("Add", ["three", "x"], ["a"]),
        helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
        helper.make_node("Mul", ["c", "sixth"], ["g"]),
        helper.make_node("Mul", ["g", "x"], ["y"]),
    ],
    [_scalar("three", 3.0), _scalar("zero", 0.0), _scalar("six", 6.0), _scalar("sixth", 1 / 6)],
)
SILU = ([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])], [])


@pytest.mark.parametrize(
    ("pattern", "kind", "op"),
    [
        (GELU_DIV_HALF_LAST, "gelu", "Gelu"),
        (GELU_MUL_HALF_FIRST, "gelu", "Gelu"),
        (HARDSWISH, "hardswish", "HardSwish"),
        (HARDSWISH_CLIP, "hardswish", "HardSwish"),
        (HARDSWISH_CLIP_GATE_SCALED, "hardswish", "HardSwish"),
        (SILU, "silu", "QuickGelu"),
    ],
)
def test_each_spelled_out_activation_becomes_one_exact_operator(pattern, kind: str, op: str) -> None:
    _assert_exact_rewrite(_model(*pattern), kind, [op])


@pytest.mark.parametrize("pattern", [HARDSWISH_CLIP, HARDSWISH_CLIP_GATE_SCALED])
def test_below_opset_14_the_clip_hardswish_becomes_x_times_hardsigmoid(pattern) -> None:
    _assert_exact_rewrite(_model(*pattern, opset=12), "hardswish", ["HardSigmoid", "Mul"])


def _assert_exact_rewrite(model: onnx.ModelProto, kind: str, ops: list[str]) -> None:
    fused, counts = fuse_activations(model)
    assert counts == {kind: 1}
    assert [n.op_type for n in fused.graph.node] == ["Relu", *ops, "Identity"]
    assert [t.name for t in fused.graph.initializer] == [], "the constants only the pattern read go with it"
    onnx.checker.check_model(fused)
    feed = {"in": RNG.standard_normal((2, 3, 4, 4)).astype(np.float32) * 3}
    want = create_session(model.SerializeToString(), Recipe()).run(None, feed)[0]
    got = create_session(fused.SerializeToString(), Recipe()).run(None, feed)[0]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_what_only_looks_like_an_activation_is_left_alone() -> None:
    not_gelu = _model(
        [
            helper.make_node("Div", ["x", "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]),
            helper.make_node("Mul", ["x", "a"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["y"]),
        ],
        [_scalar("sqrt2", 2.0), _scalar("one", 1.0), _scalar("half", 0.5)],  # x / 2: not GELU
    )
    assert fuse_activations(not_gelu)[1] == {}
    other_slope = _model(
        [
            helper.make_node("HardSigmoid", ["x"], ["s"], alpha=0.2, beta=0.5),
            helper.make_node("Mul", ["x", "s"], ["y"]),
        ],
        [],
    )
    assert fuse_activations(other_slope)[1] == {}
    assert fuse_activations(_model(*HARDSWISH, opset=13))[1] == {}, "HardSwish is opset 14"
    shared = _model(  # the gate is read elsewhere too: removing it would break that reader
        [
            helper.make_node("Sigmoid", ["x"], ["s"]),
            helper.make_node("Mul", ["x", "s"], ["m"]),
            helper.make_node("Add", ["m", "s"], ["y"]),
        ],
        [],
    )
    assert fuse_activations(shared)[1] == {}
    nodes, inits = HARDSWISH_CLIP
    relu6_plus_4 = _model(nodes, [_scalar("three", 4.0), *inits[1:]])  # x * Clip(x + 4, 0, 6) / 6: not HardSwish
    assert fuse_activations(relu6_plus_4)[1] == {}
    other_x = _model(  # Clip(x + 3) times another tensor: a gate, not HardSwish
        [
            helper.make_node("Add", ["x", "three"], ["a"]),
            helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
            helper.make_node("Mul", ["in", "c"], ["m"]),
            helper.make_node("Div", ["m", "six_"], ["y"]),
        ],
        inits,
    )
    assert fuse_activations(other_x)[1] == {}
