"""Build a variant: fuse, remove padding, re-layout, quantize, then stamp provenance.

Weight-only quantization comes last (it is only for fp32 activations), so it sees the fused graph's MatMuls.
The order matters: fusion first, so quantization sees fused Attention and emits
QAttention, and padding removal finds whole attention blocks; padding removal
before quantization, so the packed QKV projections become int8 MatMuls;
layout before quantization, so QDQ pairs wrap the final convs.
The output is a pure function of (base bytes, spec, calibration samples): the
same inputs always produce the same bytes, which lets a serving pod rebuild the
variant from the recipe instead of downloading it.
"""

from __future__ import annotations

import hashlib

import onnx

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.decoder.tokenizer import CARRIED_KEYS
from metainfer.core.engine.recipe import INT8_MODES, WEIGHT_RANKING, TransformSpec
from metainfer.core.engine.transforms.activations import fuse_activations
from metainfer.core.engine.transforms.conv import fuse_conv
from metainfer.core.engine.transforms.fusion import fuse_transformer
from metainfer.core.engine.transforms.layout import to_nhwc
from metainfer.core.engine.transforms.padding import remove_padding
from metainfer.core.engine.transforms.quantize import DYNAMIC_OP_TYPES, to_fp16, to_int8
from metainfer.core.engine.transforms.weights import compress_weights, weight_matmuls

PROVENANCE_PREFIX = "metainfer."


def build_variant(base: bytes, spec: TransformSpec, calibration: Dataset | None = None) -> bytes:
    model = onnx.load_from_string(base)
    carried = {p.key: p.value for p in model.metadata_props if p.key in CARRIED_KEYS}
    ensure_node_names(model)
    if spec.fusion == "transformer":
        model = fuse_transformer(model)
    elif spec.fusion == "conv":
        model = fuse_conv(model)
        ensure_node_names(model)
    if spec.activations == "fused":
        model, _ = fuse_activations(model)
    if spec.padding == "remove":
        model = remove_padding(model)
        ensure_node_names(model)
    if spec.layout == "NHWC":
        model = to_nhwc(model)
    q = spec.quantization
    if q.mode == "fp16":
        model = to_fp16(model, q.keep_float)
    elif q.mode in INT8_MODES:
        model = to_int8(model, q, calibration)
    if spec.weights.bits:
        model = compress_weights(model, spec.weights, calibration)
    _carry(model, carried)
    _stamp(model, base, spec)
    serialized: bytes = model.SerializeToString(deterministic=True)
    return serialized


def quantizable_nodes(model: onnx.ModelProto, mode: str) -> list[str]:
    """Names of the nodes a quantization mode (or ``WEIGHT_RANKING``) would touch: the layers sensitivity ranks."""
    ops = set(DYNAMIC_OP_TYPES) if mode == "int8_dynamic" else {"Conv", "MatMul", "Gemm", "Attention"}
    named = onnx.ModelProto()
    named.CopyFrom(model)
    ensure_node_names(named)
    if mode == WEIGHT_RANKING:
        return weight_matmuls(named)
    return [n.name for n in named.graph.node if n.op_type in ops]


def ensure_node_names(model: onnx.ModelProto) -> None:
    """Give unnamed nodes stable names (op type + position), so recipes can name layers.

    Mixed precision refers to layers by node name; many exporters leave names
    empty. Names derive only from the graph, so every rebuild agrees on them.
    """
    taken = {n.name for n in model.graph.node if n.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def _carry(model: onnx.ModelProto, carried: dict[str, str]) -> None:
    """Put back the decoder's tokenizer, which a quantizer that writes a new model leaves behind."""
    present = {p.key for p in model.metadata_props}
    for key, value in carried.items():
        if key not in present:
            model.metadata_props.add(key=key, value=value)


def _stamp(model: onnx.ModelProto, base: bytes, spec: TransformSpec) -> None:
    props = {
        f"{PROVENANCE_PREFIX}base_sha256": hashlib.sha256(base).hexdigest(),
        f"{PROVENANCE_PREFIX}transform": spec.model_dump_json(),
    }
    kept = [p for p in model.metadata_props if not p.key.startswith(PROVENANCE_PREFIX)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
