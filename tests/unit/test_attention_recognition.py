"""Attention recognised by what it computes: fused when provably the same, left alone otherwise.

The exporters' real graphs (torch's TorchScript and dynamo exporters, optimum, two
transformers versions) are checked in tests/exports; these tests pin the rules on
a small BERT built in code.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from metainfer.agent.zoo.bert import BertConfig, build_bert_inputs, build_bert_model
from metainfer.core.engine.recipe import Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import build_variant, check_padding_removable
from metainfer.core.engine.transforms.attention import recognise_attention
from metainfer.core.engine.transforms.fusion import fuse_transformer

SMALL = BertConfig(layers=2, hidden=64, heads=4, intermediate=128, vocab=512, max_positions=64, opset=17)


def _ops(model: onnx.ModelProto, op: str) -> int:
    return sum(n.op_type == op for n in model.graph.node)


def _run(model: onnx.ModelProto | bytes, feed: dict[str, np.ndarray]) -> np.ndarray:
    blob = model if isinstance(model, bytes) else model.SerializeToString()
    return create_session(blob, Recipe(session=SessionSpec(intra_op_num_threads=1))).run(None, feed)[0]


@pytest.fixture(scope="module")
def feed() -> dict[str, np.ndarray]:
    return build_bert_inputs(samples=5, seq_len=24, cfg=SMALL, seed=3)


def test_each_block_becomes_one_attention_with_the_same_outputs_at_real_tokens(feed) -> None:
    model = build_bert_model(SMALL, seed=1)
    fused = recognise_attention(model)
    assert _ops(fused, "Attention") == SMALL.layers
    assert _ops(fused, "Softmax") == 0
    attention = next(n for n in fused.graph.node if n.op_type == "Attention")
    attributes = {a.name: helper.get_attribute_value(a) for a in attention.attribute}
    assert attributes["num_heads"] == SMALL.heads
    assert attributes["scale"] == pytest.approx(SMALL.head_size**-0.5, rel=1e-6)
    real = feed["attention_mask"].astype(bool)
    assert not real.all()
    np.testing.assert_allclose(_run(fused, feed)[real], _run(model, feed)[real], atol=2e-4, rtol=1e-3)


def test_the_rewrite_is_a_pure_function_of_the_model() -> None:
    model = build_bert_model(SMALL, seed=1)
    first = recognise_attention(model).SerializeToString(deterministic=True)
    assert recognise_attention(model).SerializeToString(deterministic=True) == first


def _mask_sub(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Sub")


def test_a_mask_that_keeps_padding_instead_is_recognised_but_not_kept() -> None:
    """``mask * -10000`` masks the real tokens: the structure matches, the numbers do not, so nothing changes."""
    model = build_bert_model(SMALL, seed=1)
    sub = _mask_sub(model)
    cast_output = sub.input[1]
    sub.CopyFrom(helper.make_node("Identity", [cast_output], [sub.output[0]], name=sub.name))
    assert recognise_attention(model) is model


def test_a_score_bias_that_is_not_the_padding_mask_is_not_recognised() -> None:
    """A constant bias on the scores (relative positions, ALiBi) is not what Attention's mask input means."""
    model = build_bert_model(SMALL, seed=1)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    bias = numpy_helper.from_array(np.full((1, 1, 1, 1), 0.5, np.float32), "position_bias")
    model.graph.initializer.append(bias)
    biased = softmax.input[0] + "_biased"
    position = list(model.graph.node).index(softmax)
    model.graph.node.insert(position, helper.make_node("Add", [softmax.input[0], "position_bias"], [biased]))
    softmax.input[0] = biased
    fused = recognise_attention(model)
    assert _ops(fused, "Attention") == SMALL.layers - 1  # the other layer is still recognised
    assert _ops(fused, "Softmax") == 1


def _sdpa_style(model: onnx.ModelProto) -> onnx.ModelProto:
    """What torch's SDPA decomposition writes: Q and K each scaled by head_size ** -0.25 before their MatMul,
    instead of the scores divided by sqrt(head_size) after it. ORT's fuser does not know this pattern."""
    nodes = list(model.graph.node)
    producer = {o: n for n in nodes for o in n.output}
    factor = numpy_helper.from_array(np.array(SMALL.head_size**-0.25, np.float32), "qk_factor")
    model.graph.initializer.append(factor)
    rebuilt: list[onnx.NodeProto] = []
    for node in nodes:
        if node.op_type == "Div" and producer[node.input[0]].op_type == "MatMul" and "scale" in node.input[1]:
            rebuilt.append(helper.make_node("Identity", [node.input[0]], list(node.output), name=node.name))
            continue
        if node.op_type == "MatMul" and node.output[0] in {d.input[0] for d in nodes if d.op_type == "Div"}:
            scaled = [f"{name}_scaled" for name in node.input]
            pairs = zip(node.input, scaled, strict=True)
            rebuilt += [helper.make_node("Mul", [name, "qk_factor"], [out]) for name, out in pairs]
            node = helper.make_node("MatMul", scaled, list(node.output), name=node.name)
        rebuilt.append(node)
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
    return model


def test_transformer_fusion_recognises_attention_where_ort_finds_none(feed) -> None:
    """On the SDPA-style graph ORT's optimizer fuses no attention; the variant still gets one Attention per layer
    (as the per-sequence MultiHeadAttention of padding removal), and real tokens keep their outputs."""
    from onnxruntime.transformers.optimizer import optimize_model

    base = _sdpa_style(build_bert_model(SMALL, seed=1))
    ort_only = optimize_model(onnx.load_from_string(base.SerializeToString()), "bert", 0, 0, opt_level=0).model
    assert _ops(ort_only, "Attention") == 0  # the premise: ORT's patterns miss it
    fused = fuse_transformer(base)
    assert _ops(fused, "Attention") == SMALL.layers
    check_padding_removable(fused)
    variant = build_variant(base.SerializeToString(), TransformSpec(fusion="transformer", padding="remove"))
    assert _ops(onnx.load_from_string(variant), "Loop") == SMALL.layers
    real = feed["attention_mask"].astype(bool)
    np.testing.assert_allclose(_run(variant, feed)[real], _run(base, feed)[real], atol=2e-4, rtol=1e-3)
