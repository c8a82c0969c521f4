"""Activations written as one operator each, where exporters spell them out in elementary ops.

Exporters of other ecosystems (paddle2onnx, tf2onnx, older torch opsets) write GELU as
``0.5 * x * (1 + Erf(x / sqrt 2))``, HardSwish as ``x * HardSigmoid(x)`` (HardSwish is opset 14) or, as
paddle2onnx does below opset 14, as ``x * Clip(x + 3, 0, 6) / 6``, and SiLU as ``x * Sigmoid(x)``. ONNX
Runtime's optimizer fuses some of these in FP32, but a static int8 quantizer sees the elementary ops first: it
puts QuantizeLinear/DequantizeLinear pairs around each Mul and Add, the fusion no longer matches, and every
activation becomes several passes over the tensor with requantization between. Written as ``com.microsoft``
Gelu, ONNX HardSwish and ``com.microsoft`` QuickGelu (alpha 1: x * sigmoid(x)), each activation is one operator
both runtimes know. Below opset 14 the Clip form becomes ``x * HardSigmoid(x)``: two passes instead of four.
Every rewrite is exact in real arithmetic.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
HARDSWISH_OPSET = 14
_TOLERANCE = 1e-4


@dataclass
class _Graph:
    """Producers, consumer counts and scalar constants of a graph: what the matchers look at."""

    model: onnx.ModelProto
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    consumers: Counter[str] = field(default_factory=Counter)
    scalars: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        graph = self.model.graph
        outputs = {o.name for o in graph.output}
        for node in graph.node:
            for name in node.output:
                self.producer[name] = node
            self.consumers.update(node.input)
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self._scalar(node.output[0], numpy_helper.to_array(node.attribute[0].t))
        self.consumers.update(outputs)  # a graph output is a consumer nothing may remove
        for tensor in graph.initializer:
            self._scalar(tensor.name, numpy_helper.to_array(tensor))

    def _scalar(self, name: str, value: np.ndarray) -> None:
        if value.size == 1 and np.issubdtype(value.dtype, np.floating):
            self.scalars[name] = float(value.reshape(-1)[0])

    def node(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The producer of ``name`` if it is an ``op_type`` of the default domain read by one consumer only."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        return node if self.consumers[name] == 1 else None

    def is_scalar(self, name: str, value: float) -> bool:
        return name in self.scalars and math.isclose(self.scalars[name], value, rel_tol=_TOLERANCE)

    def other(self, node: onnx.NodeProto, name: str) -> str | None:
        """The binary ``node``'s input that is not ``name``."""
        if len(node.input) != 2 or name not in node.input:
            return None
        return node.input[1] if node.input[0] == name else node.input[0]


@dataclass
class _Rewrite:
    remove: set[int]  # ids of the nodes it replaces
    replacement: list[onnx.NodeProto]
    kind: str
    anchor: int  # id of the pattern's final Mul (or Div)


def fuse_activations(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """``model`` with each spelled-out GELU, HardSwish and SiLU as one operator, and how many of each."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    opset = next((o.version for o in out.opset_import if o.domain in ("", "ai.onnx")), 1)
    graph = _Graph(out)
    rewrites: list[_Rewrite] = []
    taken: set[int] = set()
    for node in out.graph.node:
        if node.op_type not in ("Mul", "Div") or node.domain not in ("", "ai.onnx"):
            continue
        found = _hardswish_clip(graph, node, opset)
        if node.op_type == "Mul":
            found = found or _gelu(graph, node) or _hardswish(graph, node, opset) or _silu(graph, node)
        if found is not None and not (found.remove & taken):
            taken |= found.remove
            rewrites.append(found)
    if not rewrites:
        return out, {}
    # Each replacement takes its final Mul's place: every input of the pattern is computed before that.
    by_last = {r.anchor: r for r in rewrites}
    nodes: list[onnx.NodeProto] = []
    for current in out.graph.node:
        rewrite = by_last.get(id(current))
        if rewrite is not None:
            nodes.extend(rewrite.replacement)
        elif id(current) not in taken:
            nodes.append(current)
    freed = {name for node in out.graph.node if id(node) in taken for name in node.input}
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    still_read = {name for node in nodes for name in node.input} | {o.name for o in out.graph.output}
    unused = [t for t in out.graph.initializer if t.name in freed and t.name not in still_read]
    for tensor in unused:  # the constants only the replaced nodes read (sqrt 2, 1, 0.5)
        out.graph.initializer.remove(tensor)
    gone = {t.name for t in unused}
    listed = [v for v in out.graph.input if v.name in gone]  # IR 3 lists initializers among the inputs
    for value in listed:
        out.graph.input.remove(value)
    if any(n.domain == MS_DOMAIN for r in rewrites for n in r.replacement) and not any(
        o.domain == MS_DOMAIN for o in out.opset_import
    ):
        out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return out, dict(Counter(r.kind for r in rewrites))


def _gelu(graph: _Graph, last: onnx.NodeProto) -> _Rewrite | None:
    """``(x * 0.5) * (1 + erf(x / sqrt2))`` in its exporters' orderings: the 0.5 on x, on the product, or on the
    sum; x / sqrt2 as a Div or as a Mul by 1/sqrt2."""
    for half_side in last.input:
        rest = graph.other(last, half_side)
        if rest is None:
            continue
        # 0.5 applied last: last = Mul(product, 0.5), product = Mul(x, 1 + erf)
        if graph.is_scalar(half_side, 0.5):
            product = graph.node(rest, "Mul")
            if product is None:
                continue
            for sum_side in product.input:
                x = graph.other(product, sum_side)
                matched = x is not None and _one_plus_erf(graph, sum_side, x)
                if x is not None and matched:
                    return _gelu_rewrite(last, x, [product, *matched])
            continue
        # 0.5 applied to x first: last = Mul(Mul(x, 0.5), 1 + erf)
        scaled = graph.node(half_side, "Mul")
        if scaled is None:
            continue
        x = next((i for i in scaled.input if not graph.is_scalar(i, 0.5)), None)
        if x is None or not any(graph.is_scalar(i, 0.5) for i in scaled.input):
            continue
        matched = _one_plus_erf(graph, rest, x)
        if matched:
            return _gelu_rewrite(last, x, [scaled, *matched])
    return None


def _one_plus_erf(graph: _Graph, name: str, x: str) -> list[onnx.NodeProto] | None:
    """The nodes of ``1 + erf(x / sqrt2)`` producing ``name``, or None."""
    add = graph.node(name, "Add")
    if add is None:
        return None
    erf_out = next((i for i in add.input if not graph.is_scalar(i, 1.0)), None)
    if erf_out is None or not any(graph.is_scalar(i, 1.0) for i in add.input):
        return None
    erf = graph.node(erf_out, "Erf")
    if erf is None:
        return None
    scale = graph.producer.get(erf.input[0])
    if scale is None or graph.consumers[erf.input[0]] != 1 or scale.domain not in ("", "ai.onnx"):
        return None
    if scale.op_type == "Div" and scale.input[0] == x and graph.is_scalar(scale.input[1], math.sqrt(2)):
        return [add, erf, scale]
    if scale.op_type == "Mul" and x in scale.input:
        other = graph.other(scale, x)
        if other is not None and graph.is_scalar(other, 1 / math.sqrt(2)):
            return [add, erf, scale]
    return None


def _gelu_rewrite(last: onnx.NodeProto, x: str, inner: list[onnx.NodeProto]) -> _Rewrite:
    name = f"{last.name or last.output[0]}_gelu"
    gelu = helper.make_node("Gelu", [x], [last.output[0]], name=name, domain=MS_DOMAIN)
    return _Rewrite({id(last), *(id(n) for n in inner)}, [gelu], "gelu", id(last))


def _hardswish(graph: _Graph, mul: onnx.NodeProto, opset: int) -> _Rewrite | None:
    """``x * HardSigmoid(x)`` with HardSwish's alpha 1/6 and beta 0.5."""
    if opset < HARDSWISH_OPSET:
        return None
    for gate_out in mul.input:
        x = graph.other(mul, gate_out)
        gate = graph.node(gate_out, "HardSigmoid")
        if x is None or gate is None or gate.input[0] != x:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in gate.attribute}
        if math.isclose(attrs.get("alpha", 0.2), 1 / 6, rel_tol=1e-3) and math.isclose(
            attrs.get("beta", 0.5), 0.5, rel_tol=1e-3
        ):
            name = f"{mul.name or mul.output[0]}_hardswish"
            node = helper.make_node("HardSwish", [x], [mul.output[0]], name=name)
            return _Rewrite({id(mul), id(gate)}, [node], "hardswish", id(mul))
    return None


def _hardswish_clip(graph: _Graph, last: onnx.NodeProto, opset: int) -> _Rewrite | None:
    """``x * Clip(x + 3, 0, 6) / 6``, the 1/6 (a Div by 6 or a Mul by 1/6) on the product or on the gate."""
    product_out = _over_six(graph, last)  # (x * clip) / 6
    product = graph.node(product_out, "Mul") if product_out is not None else None
    if product is not None:
        for clip_out in product.input:
            found = _clip_gate(graph, product, clip_out)
            if found is not None:
                return _hardswish_from_clip(last, found[0], [product, *found[1]], opset)
    if last.op_type != "Mul":
        return None
    for gate_out in last.input:  # x * (clip / 6)
        gate = graph.node(gate_out, "Div") or graph.node(gate_out, "Mul")
        dividend = _over_six(graph, gate) if gate is not None else None
        found = _clip_gate(graph, last, dividend, gate_out) if gate is not None and dividend is not None else None
        if gate is not None and found is not None:
            return _hardswish_from_clip(last, found[0], [gate, *found[1]], opset)
    return None


def _clip_gate(
    graph: _Graph, mul: onnx.NodeProto, clip_out: str, side: str | None = None
) -> tuple[str, list[onnx.NodeProto]] | None:
    """Where ``mul`` multiplies some x (the input other than ``side``, by default ``clip_out``) by a gate built on
    ``clip_out`` = Clip(x + 3, 0, 6): x and the Clip and Add nodes."""
    x = graph.other(mul, side or clip_out)
    clip = graph.node(clip_out, "Clip")
    if x is None or clip is None:
        return None
    add = _relu6_of_x_plus_3(graph, clip, x)
    return (x, [clip, add]) if add is not None else None


def _over_six(graph: _Graph, node: onnx.NodeProto) -> str | None:
    """What ``node`` divides by 6 (a Div by 6 or a Mul by 1/6), or None."""
    if node.op_type == "Div" and len(node.input) == 2 and graph.is_scalar(node.input[1], 6.0):
        return node.input[0]
    if node.op_type == "Mul":
        for side in node.input:
            other = graph.other(node, side)
            if other is not None and graph.is_scalar(other, 1 / 6):
                return side
    return None


def _relu6_of_x_plus_3(graph: _Graph, clip: onnx.NodeProto, x: str) -> onnx.NodeProto | None:
    """The Add of ``Clip(x + 3, 0, 6)`` (bounds as inputs from opset 11, attributes before), or None."""
    attrs = {a.name: helper.get_attribute_value(a) for a in clip.attribute}
    low = clip.input[1] if len(clip.input) > 1 and clip.input[1] else None
    high = clip.input[2] if len(clip.input) > 2 and clip.input[2] else None
    low_ok = graph.is_scalar(low, 0.0) if low else math.isclose(attrs.get("min", -math.inf), 0.0, abs_tol=1e-6)
    high_ok = graph.is_scalar(high, 6.0) if high else math.isclose(attrs.get("max", math.inf), 6.0, rel_tol=1e-4)
    add = graph.node(clip.input[0], "Add")
    if not (low_ok and high_ok) or add is None or x not in add.input:
        return None
    three = graph.other(add, x)
    return add if three is not None and graph.is_scalar(three, 3.0) else None


def _hardswish_from_clip(last: onnx.NodeProto, x: str, inner: list[onnx.NodeProto], opset: int) -> _Rewrite:
    name = f"{last.name or last.output[0]}_hardswish"
    removed = {id(last), *(id(n) for n in inner)}
    if opset >= HARDSWISH_OPSET:
        return _Rewrite(
            removed, [helper.make_node("HardSwish", [x], [last.output[0]], name=name)], "hardswish", id(last)
        )
    gate = f"{name}_gate"
    nodes = [
        helper.make_node("HardSigmoid", [x], [gate], name=gate, alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", [x, gate], [last.output[0]], name=name),
    ]
    return _Rewrite(removed, nodes, "hardswish", id(last))


def _silu(graph: _Graph, mul: onnx.NodeProto) -> _Rewrite | None:
    """``x * Sigmoid(x)``: QuickGelu with alpha 1 is exactly that."""
    for gate_out in mul.input:
        x = graph.other(mul, gate_out)
        gate = graph.node(gate_out, "Sigmoid")
        if x is None or gate is None or gate.input[0] != x:
            continue
        name = f"{mul.name or mul.output[0]}_silu"
        node = helper.make_node("QuickGelu", [x], [mul.output[0]], name=name, domain=MS_DOMAIN, alpha=1.0)
        return _Rewrite({id(mul), id(gate)}, [node], "silu", id(mul))
    return None
