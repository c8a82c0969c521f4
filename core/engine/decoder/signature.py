"""Finding a decoder in an ONNX graph: which inputs are the token ids, the mask, the positions and the cache.

Both export shapes users bring name the cache alike: ``past_key_values.<layer>.key`` / ``.value`` in, and
``present.<layer>.key`` / ``.value`` out, each ``[batch, kv_heads, sequence, head_dim]``. optimum and torch.onnx
exports take ``position_ids``; ONNX Runtime GenAI's builder computes positions inside its GroupQueryAttention
from the mask and takes none. Either way the mask spans the past and the new tokens, 1 where a token is real.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

import onnx
from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.engine.errors import ModelError
from metainfer.core.engine.modelinfo import ONNX_TO_NUMPY, TensorInfo

AttentionForm = Literal["attention_ops", "group_query_attention"]

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$|^past\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$|^present_key_values\.(\d+)\.(key|value)$")
_TOKEN_IDS = ("input_ids",)
_MASK = ("attention_mask",)
_POSITIONS = ("position_ids",)
_LOGITS = ("logits",)
NAME_LIMIT = 200
# [is the cache] -> the dtypes it may have.
_ALLOWED_DTYPES = {False: frozenset({"int64", "int32"}), True: frozenset({"float32", "float16"})}


class CacheLayer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    past_key: str
    past_value: str
    present_key: str
    present_value: str


class DecoderSignature(BaseModel):
    """What running a decoder needs to know of its graph."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_ids: str
    attention_mask: str
    position_ids: str | None = Field(description="None where the graph derives positions from the mask")
    logits: str
    layers: tuple[CacheLayer, ...]
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    cache_dtype: str = Field(description="numpy dtype name of the cache tensors")
    ids_dtype: str = Field(description="numpy dtype of input_ids, attention_mask and position_ids")
    mask_dtype: str
    vocab_size: int | None = Field(description="the logits' last dimension where it is fixed")
    form: AttentionForm

    def cache_bytes_per_token(self) -> int:
        """Key and value of one token in every layer."""
        itemsize = 2 if self.cache_dtype == "float16" else 4
        return 2 * len(self.layers) * self.kv_heads * self.head_dim * itemsize

    def cache_mib(self, tokens: int, sequences: int = 1) -> float:
        return self.cache_bytes_per_token() * tokens * sequences / 2**20


def detect(model: onnx.ModelProto) -> DecoderSignature | None:
    """The model's decoder signature; None for a model without past key values (a single forward). A graph with
    a cache that cannot be run as a decoder raises ModelError naming what is missing or inconsistent."""
    inputs = [_tensor_info(value) for value in _graph_inputs(model)]
    outputs = [_tensor_info(value) for value in model.graph.output]
    ops = {node.op_type for node in _all_nodes(model.graph)}
    return from_io(inputs, outputs, ops, head_dim=_head_dim_from_graph(model))


def takes_past(inputs: Sequence[TensorInfo]) -> bool:
    """Whether a model with these inputs is a decoder (``detect`` says how it runs, or what is wrong)."""
    return any(_PAST.match(value.name) for value in inputs)


def from_io(
    inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], op_types: Iterable[str], head_dim: int | None = None
) -> DecoderSignature | None:
    """``detect`` from what ``core.engine.modelinfo`` already read of a model: its inputs, outputs and op types.
    ``head_dim`` stands in for a cache whose last dimension is symbolic (ONNX Runtime GenAI's builder writes
    ``kv_cache_dim``)."""
    by_input = {value.name: value for value in inputs}
    by_output = {value.name: value for value in outputs}
    pasts = {name: match for name in by_input if (match := _PAST.match(name))}
    if not pasts:
        return None
    presents = {name: match for name in by_output if (match := _PRESENT.match(name))}
    past_by_layer = _by_layer(pasts)
    present_by_layer = _by_layer(presents)
    layers: list[CacheLayer] = []
    for layer in sorted(past_by_layer):
        past, present = past_by_layer[layer], present_by_layer.get(layer, {})
        missing = [f"{kind} of layer {layer}" for kind in ("key", "value") if kind not in past or kind not in present]
        if missing:
            raise ModelError("model", f"the model takes past key values but has no matching past/present "
                             f"{', '.join(missing)} (a decoder takes past_key_values.<layer>.key/value and gives "
                             "present.<layer>.key/value)")  # fmt: skip
        layers.append(CacheLayer(past_key=past["key"], past_value=past["value"], present_key=present["key"],
                                 present_value=present["value"]))  # fmt: skip
    if sorted(past_by_layer) != list(range(len(past_by_layer))):
        raise ModelError("model", f"the model's past key values skip layers: {sorted(past_by_layer)[:20]}")
    input_ids = _one(by_input, _TOKEN_IDS, "token ids")
    mask = _one(by_input, _MASK, "attention mask")
    positions = next((name for name in _POSITIONS if name in by_input), None)
    logits = _one(by_output, _LOGITS, "logits output")
    key = by_input[layers[0].past_key]
    shape = key.shape
    if len(shape) == 4 and not isinstance(shape[3], int) and head_dim is not None:
        shape = (*shape[:3], head_dim)
    if len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
        raise ModelError("model", f"past key {_bounded(key.name)} has shape {shape}; a decoder's cache is "
                         "[batch, kv_heads, sequence, head_dim] with kv_heads and head_dim fixed")  # fmt: skip
    for name in (input_ids, mask, key.name):
        if by_input[name].dtype not in _ALLOWED_DTYPES[name == key.name]:
            raise ModelError("model", f"{_bounded(name)} is {by_input[name].dtype}; a decoder's "
                             f"{'cache' if name == key.name else 'ids and mask'} are one of "
                             f"{sorted(_ALLOWED_DTYPES[name == key.name])}")  # fmt: skip
    logits_shape = by_output[logits].shape
    vocab = logits_shape[-1] if logits_shape and isinstance(logits_shape[-1], int) else None
    return DecoderSignature(
        input_ids=input_ids, attention_mask=mask, position_ids=positions, logits=logits, layers=tuple(layers),
        kv_heads=shape[1], head_dim=shape[3], cache_dtype=key.dtype, ids_dtype=by_input[input_ids].dtype,
        mask_dtype=by_input[mask].dtype, vocab_size=vocab,
        form="group_query_attention" if any(op.endswith("GroupQueryAttention") for op in op_types) else "attention_ops",
    )  # fmt: skip


def _head_dim_from_graph(model: onnx.ModelProto) -> int | None:
    """The head dimension GroupQueryAttention works in: its rotary cos cache is [positions, head_dim / 2], else its
    packed QKV projection is (heads + 2 kv_heads) x head_dim wide."""
    initializers = {tensor.name: tuple(tensor.dims) for tensor in model.graph.initializer}
    producers = {output: node for node in model.graph.node for output in node.output}
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        cos = initializers.get(node.input[7]) if len(node.input) > 7 and node.input[7] else None
        if attributes.get("do_rotary") and cos is not None and len(cos) == 2:
            return int(cos[1]) * 2
        heads, kv_heads = int(attributes.get("num_heads", 0)), int(attributes.get("kv_num_heads", 0))
        packed = len(node.input) < 2 or not node.input[1]
        source = producers.get(node.input[0])
        while source is not None and source.op_type in ("Add", "Cast"):
            source = producers.get(source.input[0])
        widths = [
            initializers[name][-1] for name in (source.input if source is not None else []) if name in initializers
        ]
        if widths and heads:
            return int(widths[0]) // (heads + 2 * kv_heads if packed else heads)
    return None


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    element = value.type.tensor_type.elem_type
    dtype = ONNX_TO_NUMPY[element].__name__ if element in ONNX_TO_NUMPY else onnx.TensorProto.DataType.Name(element)
    dims = value.type.tensor_type.shape.dim
    shape = tuple(dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in dims)
    return TensorInfo(name=value.name, dtype=dtype, shape=shape)


def is_decoder(model: onnx.ModelProto) -> bool:
    return any(_PAST.match(value.name) for value in _graph_inputs(model))


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def _by_layer(matches: dict[str, re.Match[str]]) -> dict[int, dict[str, str]]:
    layers: dict[int, dict[str, str]] = {}
    for name, match in matches.items():
        number, kind = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        layers.setdefault(int(number), {})[kind] = name
    return layers


def _one(values: dict[str, TensorInfo], names: Iterable[str], what: str) -> str:
    for name in names:
        if name in values:
            return name
    known = ", ".join(_bounded(name) for name in list(values)[:12])
    raise ModelError("model", f"the model takes past key values but has no {what} (expected one of {', '.join(names)}; "
                     f"it has {known})")  # fmt: skip


def _all_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attribute.g)


def _bounded(text: str) -> str:
    return text if len(text) <= NAME_LIMIT else text[: NAME_LIMIT - 3] + "..."
