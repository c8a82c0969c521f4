"""Recognise self-attention in the graphs exporters write, and fuse it where ONNX Runtime's fuser does not.

Why: ONNX Runtime's transformer optimizer matches the node patterns of particular
exporter versions. An encoder exported by torch's dynamo exporter, or by the
TorchScript exporter from a recent transformers (SDPA attention, vmap-built
masks), keeps every attention block as dozens of loose nodes, and then neither
QAttention nor padding removal applies: the largest levers on a CPU are gone.

This module finds attention by what it computes rather than by exact node
sequence. For every Softmax it walks the data edges:

- back from the softmax input, through constant scalings and an additive (or
  ``Where``-selected) mask bias, to the score ``MatMul(Q, K^T)``;
- back from Q and K, through reshapes, transposes and constant scalings, to
  ``MatMul(X, W) + b`` projections of one shared input X;
- forward from the softmax, past NaN guards and casts, to ``MatMul(P, V)``,
  with V a projection of the same X; then forward through reshapes and
  transposes to the tensor the output projection reads.

The mask bias must depend, through data edges, only on the model's attention
mask input (shapes do not count), which is what makes it a key-padding mask.
The block becomes one ``com.microsoft.Attention(X, [Wq|Wk|Wv], [bq|bk|bv],
mask)``, with the scale the graph applied and the head count its reshapes use.

Structure alone cannot prove that the reshapes split heads the usual way or
that the mask is not also causal, so the rewrite is only kept when the fused
model gives the original's outputs, at real tokens, on seeded synthetic inputs
with padded rows. Otherwise the graph is returned unchanged. The result is a
pure function of the model, as every transform here must be.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from metainfer.core.engine.transforms.padding import mask_input

MS_DOMAIN = "com.microsoft"
_PASS_THROUGH = frozenset({"Transpose", "Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze"})
_SHAPE_ONLY = frozenset({"Shape", "Size", "ConstantOfShape"})  # outputs carry a shape, not the input's values
_MAX_STEPS = 12
_VERIFY_BATCH, _VERIFY_SEQUENCE = 3, 16
_VERIFY_RTOL = 1e-3


@dataclass(frozen=True)
class _Projection:
    x: str
    weight: np.ndarray
    bias: np.ndarray
    scale: float
    reshape_shapes: tuple[str, ...]


@dataclass(frozen=True)
class _Block:
    x: str
    weight: np.ndarray
    bias: np.ndarray
    heads: int
    scale: float
    masked: bool
    context: str  # the [batch, sequence, hidden] tensor the output projection reads


def recognise_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each recognised self-attention block fused (see module docstring); unchanged if none
    is recognised or the fused model does not reproduce the original's outputs."""
    graph = _Graph(model)
    blocks = [b for b in (graph.block(s) for s in graph.softmaxes()) if b is not None]
    if not blocks:
        return model
    fused = _fuse(model, blocks, graph.mask)
    return fused if _same_outputs(model, fused, graph.mask) else model


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        nodes = model.graph.node
        self.producer = {o: n for n in nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for node in nodes:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.mask = mask_input(model)
        self.sources = self._data_sources()

    def _data_sources(self) -> dict[str, frozenset[str]]:
        """Graph inputs each tensor's values depend on, following data edges only (nodes are topologically sorted)."""
        sources = {i.name: frozenset({i.name}) for i in self.model.graph.input}
        for node in self.model.graph.node:
            found: frozenset[str] = frozenset()
            if node.op_type not in _SHAPE_ONLY:
                for name in node.input:
                    found |= sources.get(name, frozenset())
            for out in node.output:
                sources[out] = found
        return sources

    def softmaxes(self) -> list[onnx.NodeProto]:
        return [n for n in self.model.graph.node if n.op_type == "Softmax" and n.domain in ("", "ai.onnx")]

    def scalar(self, name: str) -> float | None:
        value = self.constants.get(name)
        if value is None or value.size != 1 or value.dtype.kind != "f":
            return None
        return float(value.reshape(-1)[0])

    def data_consumers(self, tensor: str) -> list[onnx.NodeProto]:
        return [n for n in self.consumers.get(tensor, []) if n.op_type not in _SHAPE_ONLY | {"IsNaN"}]

    # -- the walks ------------------------------------------------------------------
    def block(self, softmax: onnx.NodeProto) -> _Block | None:
        axis = next((helper.get_attribute_value(a) for a in softmax.attribute if a.name == "axis"), -1)
        if axis not in (-1, 3):
            return None
        scores = self._scores(softmax.input[0])
        if scores is None:
            return None
        score_matmul, score_scale, masked = scores
        q = self._projection(score_matmul.input[0])
        k = self._projection(score_matmul.input[1])
        attend = self._attend(softmax.output[0])
        if q is None or k is None or attend is None:
            return None
        v = self._projection(attend.input[1])
        context = self._context(attend.output[0])
        if v is None or context is None or v.scale != 1.0 or not q.x == k.x == v.x:
            return None
        hidden = q.weight.shape[1]
        if not (q.weight.shape == k.weight.shape == v.weight.shape) or q.weight.shape[0] != hidden:
            return None
        scale = score_scale * q.scale * k.scale
        heads = self._heads(q.reshape_shapes, hidden, scale)
        if heads is None:
            return None
        return _Block(
            x=q.x,
            weight=np.concatenate([q.weight, k.weight, v.weight], axis=1),
            bias=np.concatenate([q.bias, k.bias, v.bias]),
            heads=heads,
            scale=scale,
            masked=masked,
            context=context,
        )

    def _scores(self, tensor: str) -> tuple[onnx.NodeProto, float, bool] | None:
        """Back from the softmax input to MatMul(Q, K^T): (that MatMul, the scale on the way, whether masked)."""
        scale, masked = 1.0, False
        for _ in range(_MAX_STEPS):
            node = self.producer.get(tensor)
            if node is None:
                return None
            if node.op_type == "MatMul":
                return node, scale, masked
            if node.op_type in ("Mul", "Div") and (factor := self._scaling(node)) is not None:
                tensor, value = factor
                scale *= value
            elif node.op_type == "Add" and not masked:
                side = self._mask_side(node.input[0], node.input[1])
                if side is None:
                    return None
                tensor, masked = side, True
            elif node.op_type == "Where" and not masked and self._is_mask(node.input[0]):
                # masked_fill: Where(keep, scores, fill) or Where(drop, fill, scores)
                tensor = next((i for i in node.input[1:] if i not in self.constants), "")
                masked = bool(tensor)
            elif node.op_type in ("Cast", "Identity"):
                tensor = node.input[0]
            else:
                return None
        return None

    def _mask_side(self, a: str, b: str) -> str | None:
        """Of an Add's operands, the scores when the other one is a mask bias, else None."""
        if self._is_mask(b) and not self._is_mask(a):
            return a
        if self._is_mask(a) and not self._is_mask(b):
            return b
        return None

    def _is_mask(self, tensor: str) -> bool:
        return self.mask is not None and self.sources.get(tensor) == frozenset({self.mask})

    def _scaling(self, node: onnx.NodeProto) -> tuple[str, float] | None:
        """(the scaled tensor, the factor) of a Mul/Div by a constant scalar."""
        for position, other in ((0, 1), (1, 0)):
            value = self.scalar(node.input[other])
            if value is None or value == 0.0:
                continue
            if node.op_type == "Div":
                return (node.input[0], 1.0 / value) if other == 1 else None
            return node.input[position], value
        return None

    def _projection(self, tensor: str) -> _Projection | None:
        """Back through reshapes, transposes and scalings to X @ W (+ b), W and b constants."""
        scale, shapes = 1.0, []
        for _ in range(_MAX_STEPS):
            node = self.producer.get(tensor)
            if node is None:
                return None
            if node.op_type in ("Mul", "Div") and (factor := self._scaling(node)) is not None:
                tensor, value = factor
                scale *= value
            elif node.op_type in _PASS_THROUGH:
                if node.op_type == "Reshape":
                    shapes.append(node.input[1])
                tensor = node.input[0]
            elif node.op_type == "Add":
                bias_at = next((i for i, n in enumerate(node.input) if self._vector(n) is not None), None)
                if bias_at is None:
                    return None
                matmul = self.producer.get(node.input[1 - bias_at])
                found = self._linear(matmul)
                if found is None:
                    return None
                x, weight = found
                bias = self._vector(node.input[bias_at])
                if bias is None or bias.shape[0] != weight.shape[1]:
                    return None
                return _Projection(x, weight, bias.astype(np.float32), scale, tuple(reversed(shapes)))
            elif node.op_type == "MatMul":
                found = self._linear(node)
                if found is None:
                    return None
                x, weight = found
                return _Projection(x, weight, np.zeros(weight.shape[1], np.float32), scale, tuple(reversed(shapes)))
            else:
                return None
        return None

    def _linear(self, node: onnx.NodeProto | None) -> tuple[str, np.ndarray] | None:
        if node is None or node.op_type != "MatMul":
            return None
        weight = self.constants.get(node.input[1])
        if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
            return None
        return node.input[0], weight

    def _vector(self, name: str) -> np.ndarray | None:
        value = self.constants.get(name)
        return value if value is not None and value.ndim == 1 and value.dtype == np.float32 else None

    def _attend(self, probabilities: str) -> onnx.NodeProto | None:
        """Forward from the softmax, past NaN guards and casts, to MatMul(P, V)."""
        tensor = probabilities
        for _ in range(_MAX_STEPS):
            consumers = self.data_consumers(tensor)
            if len(consumers) != 1:
                return None
            node = consumers[0]
            if node.op_type == "MatMul" and node.input[0] == tensor:
                return node
            if node.op_type == "Where" and node.input[2] == tensor and node.input[1] in self.constants:
                tensor = node.output[0]  # Where(IsNaN(p), 0, p): rows with every key masked
            elif node.op_type in ("Cast", "Identity", "Dropout"):
                tensor = node.output[0]
            else:
                return None
        return None

    def _context(self, attended: str) -> str | None:
        """Forward through transposes and reshapes to the tensor the output projection MatMul reads."""
        tensor = attended
        for _ in range(_MAX_STEPS):
            consumers = self.data_consumers(tensor)
            if len(consumers) != 1:
                return None
            node = consumers[0]
            if node.op_type == "MatMul" and node.input[0] == tensor:
                return tensor if self._linear(node) is not None and tensor != attended else None
            if node.op_type not in _PASS_THROUGH:
                return None
            tensor = node.output[0]
        return None

    def _heads(self, shapes: Iterable[str], hidden: int, scale: float) -> int | None:
        """The head count: from the reshape that splits heads, cross-checked with the scale when it is the default."""
        from_reshape: set[int] = set()
        for shape in shapes:
            values = self._shape_constants(shape)
            if len(values) >= 2 and values[-2] > 0 and values[-1] > 0 and values[-2] * values[-1] == hidden:
                from_reshape.add(values[-2])
        from_scale = None
        if scale > 0:
            head_dim = round(1.0 / (scale * scale))
            if head_dim > 0 and hidden % head_dim == 0 and math.isclose(scale, head_dim**-0.5, rel_tol=1e-3):
                from_scale = hidden // head_dim
        if len(from_reshape) == 1:
            return from_reshape.pop()
        return from_scale if not from_reshape else None

    def _shape_constants(self, shape: str) -> list[int]:
        """The constant trailing entries of a reshape's target shape (a constant, or a Concat of pieces)."""
        if shape in self.constants:
            return [int(v) for v in self.constants[shape].reshape(-1)]
        node = self.producer.get(shape)
        if node is None or node.op_type != "Concat":
            return []
        values: list[int] = []
        for piece in node.input:
            if piece in self.constants:
                values += [int(v) for v in self.constants[piece].reshape(-1)]
            else:
                values = []  # only the constant tail after the last dynamic piece counts
        return values


def _fuse(model: onnx.ModelProto, blocks: list[_Block], mask: str | None) -> onnx.ModelProto:
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    graph = fused.graph
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    taken |= {i.name for i in graph.input}

    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    mask_index = ""
    prelude: list[onnx.NodeProto] = []
    if mask is not None and any(b.masked for b in blocks):
        mask_index = fresh("metainfer_attention_mask")
        prelude.append(helper.make_node("Cast", [mask], [mask_index], to=TensorProto.INT32))
    replacements: dict[str, onnx.NodeProto] = {}
    for index, block in enumerate(blocks):
        weight, bias = fresh(f"metainfer_attention_{index}_qkv_weight"), fresh(f"metainfer_attention_{index}_qkv_bias")
        graph.initializer.extend(
            [numpy_helper.from_array(block.weight, weight), numpy_helper.from_array(block.bias, bias)]
        )
        inputs = [block.x, weight, bias] + ([mask_index] if block.masked else [])
        replacements[block.context] = helper.make_node(
            "Attention",
            inputs,
            [block.context],
            name=fresh(f"metainfer_attention_{index}"),
            domain=MS_DOMAIN,
            num_heads=block.heads,
            scale=block.scale,
        )
    nodes: list[onnx.NodeProto] = list(prelude)
    for node in graph.node:
        replaced = next((o for o in node.output if o in replacements), None)
        nodes.append(replacements[replaced] if replaced is not None else node)
    del graph.node[:]
    graph.node.extend(_live(nodes, {o.name for o in graph.output}))
    if not any(o.domain == MS_DOMAIN for o in fused.opset_import):
        fused.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return fused


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """The nodes some graph output still depends on, in their order."""
    needed = set(outputs)
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
            for attribute in node.attribute:  # subgraphs read outer tensors by name
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    needed.update(i for n in sub.node for i in n.input)
    return list(reversed(kept))


def _same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto, mask: str | None) -> bool:
    """Whether the fused model reproduces the original's outputs at real tokens on seeded synthetic inputs."""
    import onnxruntime as ort

    feeds = _synthetic_feeds(original, mask)
    if feeds is None:
        return False
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        runs = [
            ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)
            for m in (original, fused)
        ]
    except Exception:  # the fused graph does not load or run here: keep the original
        return False
    keep = None if mask is None else feeds[mask].astype(bool)
    for before, after in zip(*runs, strict=True):
        if before.shape != after.shape:
            return False
        if keep is not None and before.ndim >= 2 and before.shape[:2] == keep.shape:
            before, after = before[keep], after[keep]
        if before.dtype.kind == "f":
            tolerance = _VERIFY_RTOL * max(float(np.abs(before).max(initial=0.0)), 1e-6)
            if not np.allclose(before, after, rtol=_VERIFY_RTOL, atol=tolerance):
                return False
        elif not np.array_equal(before, after):
            return False
    return True


def _synthetic_feeds(model: onnx.ModelProto, mask: str | None) -> dict[str, np.ndarray] | None:
    """Seeded inputs: ids within their embedding tables, a mask with padded rows, floats ~ N(0, 1)."""
    rng = np.random.default_rng(0)
    rows = _embedding_rows(model)
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim]
        shape = [d or (_VERIFY_BATCH if i == 0 else _VERIFY_SEQUENCE) for i, d in enumerate(dims)]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if value.name == mask:
            lengths = np.linspace(shape[1], 2, num=shape[0]).astype(int)
            feeds[value.name] = (np.arange(shape[1])[None, :] < lengths[:, None]).astype(dtype)
        elif dtype.kind in "iu":
            feeds[value.name] = rng.integers(0, max(1, rows.get(value.name, 1)), size=shape).astype(dtype)
        elif dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            return None
    return feeds


def _embedding_rows(model: onnx.ModelProto) -> dict[str, int]:
    """For integer inputs that index a table (Gather on a constant), that table's row count."""
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    aliases: dict[str, str] = {i.name: i.name for i in model.graph.input}
    rows: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Cast" and node.input[0] in aliases:
            aliases[node.output[0]] = aliases[node.input[0]]
        elif node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in aliases:
            table = shapes.get(node.input[0])
            if table:
                name = aliases[node.input[1]]
                rows[name] = min(rows.get(name, table[0]), table[0])
    return rows
