"""Padding removal keeps every real token's output and refuses graphs where that is not provable."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from metainfer.agent.zoo.bert import BertConfig, build_bert_inputs, build_bert_model
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.transforms import PaddingNotRemovable, build_variant, can_remove_padding, remove_padding
from metainfer.core.engine.transforms.fusion import fuse_transformer

SMALL = BertConfig(layers=2, hidden=64, heads=4, intermediate=128, vocab=512, max_positions=64)


@pytest.fixture(scope="module")
def encoder() -> tuple[bytes, dict[str, np.ndarray]]:
    model = build_bert_model(SMALL, seed=1)
    return model.SerializeToString(), build_bert_inputs(samples=6, seq_len=32, cfg=SMALL, seed=2)


def _run(blob: bytes, feed: dict[str, np.ndarray]) -> np.ndarray:
    session = create_session(blob, Recipe(session=SessionSpec(intra_op_num_threads=1)))
    return session.run(None, feed)[0]


def test_real_tokens_match_and_padding_is_zero(encoder) -> None:
    base, feed = encoder
    reference = _run(base, feed)
    packed = _run(build_variant(base, TransformSpec(fusion="transformer", padding="remove")), feed)
    real = feed["attention_mask"].astype(bool)
    assert not real.all() and real.any()  # the data really has padding
    np.testing.assert_allclose(packed[real], reference[real], atol=2e-4, rtol=1e-3)
    assert np.all(packed[~real] == 0)


def test_int8_on_packed_graph_stays_close(encoder) -> None:
    base, feed = encoder
    spec = TransformSpec(
        fusion="transformer", padding="remove", quantization=QuantizationSpec(mode="int8_dynamic", per_channel=True)
    )
    variant = build_variant(base, spec)
    ops = {n.op_type for n in onnx.load_from_string(variant).graph.node}
    assert {"Loop", "MatMulInteger"} <= ops and "QAttention" not in ops  # QKV runs as a packed int8 MatMul
    real = feed["attention_mask"].astype(bool)
    a, b = _run(base, feed)[real], _run(variant, feed)[real]
    cosine = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cosine.mean() > 0.98


def test_deterministic_bytes(encoder) -> None:
    base, _ = encoder
    spec = TransformSpec(fusion="transformer", padding="remove")
    assert hashlib.sha256(build_variant(base, spec)).digest() == hashlib.sha256(build_variant(base, spec)).digest()


@pytest.mark.parametrize(
    "mask",
    [
        np.zeros((2, 32), np.int64),  # nothing real: an all-zero output, not a crash
        np.array([[1] * 32, [0] * 32]),  # one empty sequence
        np.array([[1, 0] * 16, [1] * 5 + [0] * 27]),  # holes: attention still sees exactly the real tokens
    ],
)
def test_unusual_masks_run(encoder, mask: np.ndarray) -> None:
    base, feed = encoder
    feed = {k: v[:2] for k, v in feed.items()} | {"attention_mask": mask}
    out = _run(build_variant(base, TransformSpec(fusion="transformer", padding="remove")), feed)
    assert out.shape == (2, 32, SMALL.hidden) and np.isfinite(out).all()
    assert np.all(out[mask == 0] == 0)
    if mask.any():
        reference = _run(base, feed)
        real = mask.astype(bool)
        np.testing.assert_allclose(out[real], reference[real], atol=2e-4, rtol=1e-3)


def test_needs_fusion_in_the_recipe() -> None:
    with pytest.raises(ValueError, match="fusion"):
        TransformSpec(padding="remove")


def test_unfused_graph_is_refused(encoder) -> None:
    base, _ = encoder
    model = onnx.load_from_string(base)
    assert not can_remove_padding(model)
    with pytest.raises(PaddingNotRemovable, match="fused Attention"):
        remove_padding(model)


def test_token_mixing_after_the_encoder_is_refused(encoder) -> None:
    """A mean over the sequence (a pooler) inside the graph would see zeros for padding: refuse."""
    base, _ = encoder
    fused = fuse_transformer(onnx.load_from_string(base))
    assert can_remove_padding(fused)
    last = fused.graph.output[0].name
    fused.graph.node.append(helper.make_node("ReduceMean", [last], ["pooled"], axes=[1], keepdims=0))
    fused.graph.output.append(helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", SMALL.hidden]))
    with pytest.raises(PaddingNotRemovable, match="ReduceMean"):
        remove_padding(fused)


def test_model_without_mask_input_is_refused(digits) -> None:
    base, _, _ = digits
    with pytest.raises(PaddingNotRemovable, match="attention-mask"):
        remove_padding(onnx.load_from_string(base))
