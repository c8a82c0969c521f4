"""``tiny_decoder``: a decoder language model built in code, in the shape optimum exports a Llama-like model.

Token and learned position embeddings, ``layers`` pre-norm blocks of grouped-query attention (``heads`` query
heads sharing ``kv_heads`` key/value heads) over ``past_key_values.<i>.key/value`` concatenated with the new
tokens, a SiLU MLP, and tied-free logits; inputs ``input_ids``, ``attention_mask`` (past and new, 1 where a token
is real) and ``position_ids``; outputs ``logits`` and ``present.<i>.key/value``. The weights are seeded noise, so
its text is gibberish, but every path a real decoder takes is there: a cache that grows, a mask that hides left
padding, grouped heads, and MatMuls large enough for the weight-only knobs (hidden 64, blocks of 32).

Its tokenizer is byte-level (one token per UTF-8 byte, plus ``<|bos|>``, ``<|eos|>`` and the chat markers), built
with the ``tokenizers`` library, and it carries it, with a chat template, in the model's metadata
(``core.engine.decoder.tokenizer``), so one file is a servable decoder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyDecoderShape:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    max_positions: int = 512

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def vocab(self) -> int:
        return 256 + len(SPECIAL_TOKENS)


def tokenizer_json() -> str:
    """A byte-level tokenizer: the 256 bytes in GPT-2's byte-to-unicode alphabet, then the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_of)
    vocab = {char: index for index, char in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return str(tokenizer.to_str())


def tokenizer_config_json() -> str:
    return json.dumps({
        "bos_token": "<|bos|>", "eos_token": "<|im_end|>", "pad_token": "<|eos|>", "chat_template": CHAT_TEMPLATE,
        "add_bos_token": False,
    })  # fmt: skip


def build_tiny_decoder(shape: TinyDecoderShape | None = None, seed: int = 0, with_tokenizer: bool = True) -> bytes:
    shape = shape or TinyDecoderShape()
    rng = np.random.default_rng(seed)
    graph = _Graph(rng)
    h, hd, nh, kvh = shape.hidden, shape.head_dim, shape.heads, shape.kv_heads
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", shape.vocab])]
    for layer in range(shape.layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{layer}.{kind}", TensorProto.FLOAT, ["batch", kvh, "past_sequence", hd]
                )
            )
            outputs.append(helper.make_tensor_value_info(
                f"present.{layer}.{kind}", TensorProto.FLOAT, ["batch", kvh, "total_sequence", hd]))  # fmt: skip

    tokens = graph.op("Gather", graph.weight("embed_tokens", (shape.vocab, h), 0.5), "input_ids")
    positions = graph.op("Gather", graph.weight("embed_positions", (shape.max_positions, h), 0.1), "position_ids")
    hidden = graph.op("Add", tokens, positions)
    allowed = _attention_allowed(graph)
    for layer in range(shape.layers):
        normed = graph.layer_norm(hidden, h, f"layers.{layer}.attn_norm")
        query = graph.heads(graph.matmul(normed, (h, nh * hd), f"layers.{layer}.q"), nh, hd)
        key = graph.heads(graph.matmul(normed, (h, kvh * hd), f"layers.{layer}.k"), kvh, hd)
        value = graph.heads(graph.matmul(normed, (h, kvh * hd), f"layers.{layer}.v"), kvh, hd)
        present_key = graph.op("Concat", f"past_key_values.{layer}.key", key, axis=2, out=f"present.{layer}.key")
        present_value = graph.op("Concat", f"past_key_values.{layer}.value", value, axis=2,
                                 out=f"present.{layer}.value")  # fmt: skip
        keys, values = graph.repeat_kv(present_key, nh // kvh), graph.repeat_kv(present_value, nh // kvh)
        scores = graph.op("Mul", graph.op("MatMul", query, graph.op("Transpose", keys, perm=[0, 1, 3, 2])),
                          graph.const(np.array(1.0 / np.sqrt(hd), np.float32)))  # fmt: skip
        masked = graph.op("Where", allowed, scores, graph.const(np.array(-1e9, np.float32)))
        attended = graph.op("MatMul", graph.op("Softmax", masked, axis=-1), values)
        merged = graph.op("Reshape", graph.op("Transpose", attended, perm=[0, 2, 1, 3]),
                          graph.const(np.array([0, 0, nh * hd], np.int64)))  # fmt: skip
        hidden = graph.op("Add", hidden, graph.matmul(merged, (nh * hd, h), f"layers.{layer}.o"))
        normed = graph.layer_norm(hidden, h, f"layers.{layer}.mlp_norm")
        up = graph.matmul(normed, (h, shape.ffn), f"layers.{layer}.up")
        activated = graph.op("Mul", up, graph.op("Sigmoid", up))
        hidden = graph.op("Add", hidden, graph.matmul(activated, (shape.ffn, h), f"layers.{layer}.down"))
    final = graph.layer_norm(hidden, h, "final_norm")
    graph.op("MatMul", final, graph.weight("lm_head", (h, shape.vocab), 1.0 / np.sqrt(h)), out="logits")

    onnx_graph = helper.make_graph(graph.nodes, "tiny_decoder", inputs, outputs, graph.initializers)
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="metainfer-zoo")
    model.ir_version = 8
    if with_tokenizer:
        from metainfer.core.engine.decoder.tokenizer import embed_tokenizer

        embed_tokenizer(model, tokenizer_json(), tokenizer_config_json(), shape.max_positions)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def _attention_allowed(graph: _Graph) -> str:
    """[batch, 1, sequence, total] booleans: a new token at slot ``past + i`` sees slots up to its own, and only
    those the mask marks real (left padding is hidden)."""
    total = graph.op("Gather", graph.op("Shape", "attention_mask"), graph.const(np.array(1, np.int64)))
    sequence = graph.op("Gather", graph.op("Shape", "input_ids"), graph.const(np.array(1, np.int64)))
    zero, one = graph.const(np.array(0, np.int64)), graph.const(np.array(1, np.int64))
    key_slots = graph.op("Range", zero, total, one)
    query_slots = graph.op("Add", graph.op("Range", zero, sequence, one), graph.op("Sub", total, sequence))
    causal = graph.op("LessOrEqual", graph.op("Unsqueeze", key_slots, graph.const(np.array([0], np.int64))),
                      graph.op("Unsqueeze", query_slots, graph.const(np.array([1], np.int64))))  # fmt: skip
    real = graph.op("Cast", graph.op("Unsqueeze", "attention_mask", graph.const(np.array([1, 2], np.int64))),
                    to=TensorProto.BOOL)  # fmt: skip
    return graph.op("And", causal, real)


class _Graph:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attributes: Any) -> str:
        output = out or self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=self._name(op_type), **attributes))
        return output

    def const(self, value: np.ndarray) -> str:
        name = self._name("const")
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        values = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(values, name))
        return name

    def matmul(self, x: str, shape: tuple[int, int], name: str) -> str:
        return self.op("MatMul", x, self.weight(f"{name}.weight", shape, 1.0 / np.sqrt(shape[0])))

    def layer_norm(self, x: str, width: int, name: str) -> str:
        gamma = numpy_helper.from_array(np.ones(width, np.float32), f"{name}.weight")
        beta = numpy_helper.from_array(np.zeros(width, np.float32), f"{name}.bias")
        self.initializers += [gamma, beta]
        return self.op("LayerNormalization", x, gamma.name, beta.name, axis=-1, epsilon=1e-5)

    def heads(self, x: str, heads: int, head_dim: int) -> str:
        split = self.op("Reshape", x, self.const(np.array([0, 0, heads, head_dim], np.int64)))
        return self.op("Transpose", split, perm=[0, 2, 1, 3])

    def repeat_kv(self, x: str, groups: int) -> str:
        if groups == 1:
            return x
        widened = self.op("Unsqueeze", x, self.const(np.array([2], np.int64)))
        expanded = self.op("Expand", widened, self.const(np.array([1, 1, groups, 1, 1], np.int64)))
        shape = self.op("Shape", x)
        batch_heads = self.op("Mul", self.op("Slice", shape, *self._consts([1], [2], [0])),
                              self.const(np.array([groups], np.int64)))  # fmt: skip
        target = self.op("Concat", self.op("Slice", shape, *self._consts([0], [1], [0])), batch_heads,
                         self.op("Slice", shape, *self._consts([2], [4], [0])), axis=0)  # fmt: skip
        return self.op("Reshape", expanded, target)

    def _consts(self, *values: list[int]) -> list[str]:
        return [self.const(np.array(value, np.int64)) for value in values]


def _byte_of(char: str) -> int:
    """The byte GPT-2's byte-to-unicode table maps to ``char``: printable bytes map to themselves."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + shift)] = byte
            shift += 1
    return table[char]
