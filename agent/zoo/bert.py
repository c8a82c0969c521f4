"""A BERT-Mini-sized encoder (4 layers, hidden 256, 4 heads), written node by node.

Why by hand: the product's real target is a sentence-embedding transformer
exported from PyTorch, and no model hub is reachable here. So this module
rebuilds the graph *pattern* such an export has (Gather embeddings + Add +
LayerNormalization, per layer Q/K/V MatMul+Add, Reshape/Transpose to heads,
scaled scores with the ``(1 - mask) * -10000`` additive mask, Softmax, output
projection, residual Add + LayerNormalization, erf-GELU feed-forward), because
ONNX Runtime's fusions (Attention, SkipLayerNormalization, BiasGelu,
EmbedLayerNormalization) match that pattern and the speed-ups the adaptation
engine finds depend on them. Weights are random with BERT's initialisation scale,
so latency and quantization behaviour are realistic even though the embeddings
mean nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from metainfer.agent.zoo._exact import uniform_below
from metainfer.agent.zoo._graph import GraphBuilder
from metainfer.agent.zoo._onnx import ir_version_for

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "last_hidden_state"
PAD_ID, CLS_ID, SEP_ID = 0, 1, 2


@dataclass(frozen=True)
class BertConfig:
    """Shape of the encoder; the defaults are Google's BERT-Mini with a smaller vocabulary.

    The vocabulary is 8192 instead of 30522 so the file stays around 20 MB while the
    per-token compute (which is what the adaptation engine measures) is unchanged.
    """

    layers: int = 4
    hidden: int = 256
    heads: int = 4
    intermediate: int = 1024
    vocab: int = 8192
    max_positions: int = 512
    type_vocab: int = 2
    init_std: float = 0.02
    layer_norm_eps: float = 1e-12
    # Opset 12 is the pattern ORT's built-in AttentionFusion matches (it only knows
    # Softmax/Unsqueeze up to version 11); opset 17 is what a current torch export writes.
    opset: int = 12
    # None keeps the sequence dimension symbolic; an int fixes it in the graph's input shapes.
    static_sequence: int | None = None

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


def _embeddings(g: GraphBuilder, cfg: BertConfig, sequence: str | int) -> str:
    """Word + token-type + position embeddings, then LayerNormalization.

    The sum is ordered as HuggingFace writes it: (word + token type) + position.
    """
    words = g.node("Gather", [g.weight("embeddings.word_embeddings.weight", (cfg.vocab, cfg.hidden)), "input_ids"])
    types = g.node(
        "Gather",
        [g.weight("embeddings.token_type_embeddings.weight", (cfg.type_vocab, cfg.hidden)), "token_type_ids"],
    )
    summed = g.node("Add", [words, types])
    position_ids = _position_ids(g, cfg, sequence)
    positions = g.node(
        "Gather",
        [g.weight("embeddings.position_embeddings.weight", (cfg.max_positions, cfg.hidden)), position_ids],
    )
    return g.layer_norm(g.node("Add", [summed, positions]), "embeddings.LayerNorm", cfg.hidden, cfg.layer_norm_eps)


def _position_ids(g: GraphBuilder, cfg: BertConfig, sequence: str | int) -> str:
    """``[1, sequence]`` position ids, sliced out of a ``[1, max_positions]`` buffer.

    This is HuggingFace's ``BertEmbeddings`` (and what the transformers optimizer's
    EmbedLayerNormalization fusion looks for). ONNX shape inference cannot see
    through a Slice whose end is computed, so it would lose the batch dimension's
    name downstream and ORT's SkipLayerNormalization fusion, which compares those
    names, would refuse every residual Add. A torch export records the slice's
    shape as value_info; so does this.
    """
    seq_len = g.node("Gather", [g.node("Shape", ["input_ids"]), g.const("seq_axis", np.array(1, np.int64))], axis=0)
    position_ids = g.node(
        "Slice",
        [
            g.const("embeddings.position_ids", np.arange(cfg.max_positions, dtype=np.int64)[None, :]),
            g.const("slice_start", np.array([0], np.int64)),
            g.unsqueeze(seq_len, 0),
            g.const("axes_1", np.array([1], np.int64)),
        ],
    )
    g.value_info.append(helper.make_tensor_value_info(position_ids, TensorProto.INT64, [1, sequence]))
    return position_ids


def _extended_mask(g: GraphBuilder) -> str:
    """``(1 - mask[:, None, None, :].float()) * -10000``: the additive mask of HF BERT."""
    unsqueezed = g.unsqueeze(g.unsqueeze("attention_mask", 1), 2)
    as_float = g.node("Cast", [unsqueezed], to=TensorProto.FLOAT)
    inverted = g.node("Sub", [g.const("one", np.array(1.0, np.float32)), as_float])
    return g.node("Mul", [inverted, g.const("mask_fill", np.array(-10000.0, np.float32))])


def _attention(g: GraphBuilder, cfg: BertConfig, hidden: str, mask: str, prefix: str) -> str:
    """Self-attention up to and including the output projection (before the residual)."""
    heads_shape = g.const("heads_shape", np.array([0, 0, cfg.heads, cfg.head_size], np.int64))

    def project(name: str, perm: list[int]) -> str:
        dense = g.linear(hidden, f"{prefix}.attention.self.{name}", cfg.hidden, cfg.hidden)
        return g.node("Transpose", [g.node("Reshape", [dense, heads_shape])], perm=perm)

    query = project("query", [0, 2, 1, 3])
    key = project("key", [0, 2, 3, 1])  # transpose_for_scores, then .transpose(-1, -2)
    value = project("value", [0, 2, 1, 3])
    scale = g.const(f"{prefix}.scale", np.array(math.sqrt(cfg.head_size), np.float32))
    scores = g.node("Add", [g.node("Div", [g.node("MatMul", [query, key]), scale]), mask])
    # torch writes the last axis as 3 before opset 13 (and ORT's Attention fusion insists on it).
    probs = g.node("Softmax", [scores], axis=3 if g.opset < 13 else -1)
    context = g.node("Transpose", [g.node("MatMul", [probs, value])], perm=[0, 2, 1, 3])
    merged = g.node("Reshape", [context, g.const("hidden_shape", np.array([0, 0, cfg.hidden], np.int64))])
    return g.linear(merged, f"{prefix}.attention.output.dense", cfg.hidden, cfg.hidden)


def _gelu(g: GraphBuilder, x: str) -> str:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` exactly as torch's erf-GELU exports."""
    erf = g.node("Erf", [g.node("Div", [x, g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
    one_plus = g.node("Add", [erf, g.const("one", np.array(1.0, np.float32))])
    return g.node("Mul", [g.node("Mul", [x, one_plus]), g.const("half", np.array(0.5, np.float32))])


def _layer(g: GraphBuilder, cfg: BertConfig, hidden: str, mask: str, index: int, output: str | None) -> str:
    prefix = f"encoder.layer.{index}"
    attended = _attention(g, cfg, hidden, mask, prefix)
    normed = g.layer_norm(
        g.node("Add", [attended, hidden]),
        f"{prefix}.attention.output.LayerNorm",
        cfg.hidden,
        cfg.layer_norm_eps,
    )
    inner = _gelu(g, g.linear(normed, f"{prefix}.intermediate.dense", cfg.hidden, cfg.intermediate))
    projected = g.linear(inner, f"{prefix}.output.dense", cfg.intermediate, cfg.hidden)
    return g.layer_norm(
        g.node("Add", [projected, normed]),
        f"{prefix}.output.LayerNorm",
        cfg.hidden,
        cfg.layer_norm_eps,
        output,
    )


def build_bert_model(cfg: BertConfig | None = None, seed: int = 0) -> onnx.ModelProto:
    """The encoder with seeded weights; inputs ``[batch, sequence]`` int64, output float32."""
    cfg = cfg or BertConfig()
    g = GraphBuilder(seed, cfg.init_std, cfg.opset)
    sequence: str | int = cfg.static_sequence or "sequence"
    hidden = _embeddings(g, cfg, sequence)
    mask = _extended_mask(g)
    for index in range(cfg.layers):
        hidden = _layer(g, cfg, hidden, mask, index, OUTPUT_NAME if index == cfg.layers - 1 else None)
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", sequence]) for name in INPUT_NAMES]
    output = helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", sequence, cfg.hidden])
    graph = helper.make_graph(
        g.nodes, "bert_mini", inputs, [output], initializer=g.initializers, value_info=g.value_info
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", cfg.opset)],
        producer_name="metainfer.zoo",
        doc_string=f"BERT-like encoder, random weights (std {cfg.init_std}, seed {seed}): {cfg}",
    )
    model.ir_version = ir_version_for(cfg.opset)
    return model


def build_bert_inputs(
    samples: int = 64, seq_len: int = 128, cfg: BertConfig | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Tokenised-looking inputs: ``[CLS] a [SEP] (b [SEP])`` then padding, with varied lengths.

    Real batches are padded, and padding is where a wrong mask shows up, so true
    lengths range from 8 tokens to the full sequence; about half the samples are
    sentence pairs with token type 1 on the second segment. Every draw is integer
    arithmetic (``_exact``), so the arrays are the same on every machine.
    """
    cfg = cfg or BertConfig()
    input_ids = np.full((samples, seq_len), PAD_ID, np.int64)
    attention_mask = np.zeros((samples, seq_len), np.int64)
    token_type_ids = np.zeros((samples, seq_len), np.int64)
    lengths = 8 + uniform_below(f"{seed}/lengths", samples, seq_len - 7)
    lengths[0] = seq_len  # at least one sample without padding
    pairs = uniform_below(f"{seed}/pairs", samples, 2)
    for row, length in enumerate(lengths.tolist()):
        input_ids[row, :length] = SEP_ID + 1 + uniform_below(f"{seed}/tokens/{row}", length, cfg.vocab - SEP_ID - 1)
        input_ids[row, 0] = CLS_ID
        input_ids[row, length - 1] = SEP_ID
        attention_mask[row, :length] = 1
        if pairs[row] and length >= 6:
            split = 2 + int(uniform_below(f"{seed}/split/{row}", 1, length - 4)[0])
            input_ids[row, split] = SEP_ID
            token_type_ids[row, split + 1 : length] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
