"""How close a model runs to what the hardware allows: a FLOP and byte count, and the roofline bound.

Why: a speedup over ORT's FP32 default says how much the adaptation gained, not
how much is left. The roofline bound answers the second question with two
numbers the hardware profile already measures (peak GEMM throughput and memory
bandwidth): no run can be faster than ``max(work / peak, bytes / bandwidth)``,
so ``bound / measured`` is the fraction of the machine a variant achieves.

Definitions (kept simple on purpose, and stated where results are shown):

- **Work** counts the matrix products only, as 2 x multiply-accumulates:
  MatMul, Gemm, Conv (grouped, any rank), ConvTranspose, and their quantized
  counterparts (MatMulInteger, QLinearMatMul, DynamicQuantizeMatMul,
  MatMulIntegerToFloat, QGemm, ConvInteger, QLinearConv), plus ORT's fused
  Attention / QAttention (QKV projection + scores + context). Element-wise ops,
  normalisations, softmax and pooling are not counted: they are bandwidth-bound
  and a small share of the work of these models. Float ops and integer ops are
  counted apart, since the hardware runs them at different peaks.
- **Bytes moved** is a lower bound: every parameter read once (initializers
  that are not graph inputs, Constant values, and ConstantOfShape fills, which
  ORT folds into weights at load time) plus the graph inputs read and the graph
  outputs written once, at the given input shapes. Activations are assumed to
  stay in cache, so the real traffic is higher, never lower.

Shapes come from onnx shape inference at concrete input shapes; models with
ops onnx does not know (com.microsoft) fall back to ONNX Runtime's symbolic
shape inference. A node whose shapes stay unknown is listed in ``uncounted``
rather than guessed.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

Shape = tuple[int, ...]

# Op type -> (index of the A / X input, index of the B / W input), and whether the math is integer.
_MATMUL_LIKE: dict[str, tuple[int, int, bool]] = {
    "MatMul": (0, 1, False),
    "MatMulInteger": (0, 1, True),
    "QLinearMatMul": (0, 3, True),
    "DynamicQuantizeMatMul": (0, 1, True),
    "MatMulIntegerToFloat": (0, 1, True),
}
_GEMM_LIKE: dict[str, tuple[int, int, bool]] = {"Gemm": (0, 1, False), "QGemm": (0, 3, True)}
_CONV_LIKE: dict[str, tuple[int, int, bool]] = {
    "Conv": (0, 1, False),
    "ConvInteger": (0, 1, True),
    "QLinearConv": (0, 3, True),
    "FusedConv": (0, 1, False),
    "NhwcConv": (0, 1, False),
}


@dataclass(frozen=True)
class ModelCost:
    """Counted work and bytes of one model at one set of input shapes."""

    float_flops: int
    int_ops: int
    parameter_bytes: int
    io_bytes: int
    by_op: dict[str, int] = field(default_factory=dict)
    # Counted ops (node names) and graph outputs whose shapes stayed unknown: left out, not guessed.
    uncounted: tuple[str, ...] = ()

    @property
    def total_ops(self) -> int:
        return self.float_flops + self.int_ops

    @property
    def bytes_moved(self) -> int:
        return self.parameter_bytes + self.io_bytes


@dataclass(frozen=True)
class Roofline:
    """Lower bounds on one run's time: compute-bound, memory-bound, and the larger of the two."""

    compute_s: float
    memory_s: float

    @property
    def bound_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def limited_by(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def roofline(work_ops: float, bytes_moved: float, peak_ops_per_s: float, bandwidth_bytes_per_s: float) -> Roofline:
    """The roofline bound of ``work_ops`` operations over ``bytes_moved`` bytes on one machine."""
    if peak_ops_per_s <= 0 or bandwidth_bytes_per_s <= 0:
        raise ValueError("peak throughput and bandwidth must be positive")
    return Roofline(compute_s=work_ops / peak_ops_per_s, memory_s=bytes_moved / bandwidth_bytes_per_s)


def achieved_fraction(bound_s: float, measured_s: float) -> float:
    """Share of the roofline a run achieves: 1.0 runs at the bound, 0.1 is ten times slower."""
    if measured_s <= 0:
        raise ValueError("measured time must be positive")
    return bound_s / measured_s


def batch_input_shapes(
    model: onnx.ModelProto, batch: int, sample_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, Shape]:
    """Concrete shapes of the graph inputs at ``batch``: the first axis is the batch.

    ``sample_shapes`` gives the per-sample shape (without the batch axis) of an
    input whose other axes are symbolic, e.g. the sequence length of a text model.
    """
    shapes: dict[str, Shape] = {}
    for value in graph_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if sample_shapes and value.name in sample_shapes:
            shapes[value.name] = (batch, *(int(d) for d in sample_shapes[value.name]))
            continue
        rest = dims[1:]
        if not all(d.HasField("dim_value") for d in rest):
            raise ValueError(f"input {value.name} has a symbolic non-batch axis; pass its sample shape")
        shapes[value.name] = (batch, *(d.dim_value for d in rest))
    return shapes


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Inputs a caller feeds: IR 3 models also list every initializer as an input."""
    initializers = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def count_model(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> ModelCost:
    """Work and bytes of ``model`` when fed inputs of ``input_shapes``."""
    fixed = _with_input_shapes(model, input_shapes)
    shapes = _infer_shapes(fixed)
    constants = _constant_values(fixed)
    float_flops = int_ops = 0
    by_op: dict[str, int] = {}
    uncounted: list[str] = []
    for node in fixed.graph.node:
        counted = _node_ops(node, shapes)
        if counted is None:
            if _is_counted_op(node.op_type):
                uncounted.append(node.name or node.output[0])
            continue
        for ops, is_int in counted:
            if is_int:
                int_ops += ops
            else:
                float_flops += ops
            by_op[node.op_type] = by_op.get(node.op_type, 0) + ops
    io_bytes = 0
    for value in [*graph_inputs(fixed), *fixed.graph.output]:
        if value.name in shapes:
            io_bytes += _bytes(value, shapes[value.name])
        else:
            uncounted.append(f"graph output {value.name}")
    return ModelCost(
        float_flops=float_flops,
        int_ops=int_ops,
        parameter_bytes=_parameter_bytes(fixed, constants, shapes),
        io_bytes=io_bytes,
        by_op=by_op,
        uncounted=tuple(uncounted),
    )


# -- shapes ----------------------------------------------------------------------------
def _with_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    names = {v.name for v in graph_inputs(fixed)}
    unknown = sorted(set(input_shapes) - names)
    if unknown:
        raise ValueError(f"{unknown} are not graph inputs; the inputs are {sorted(names)}")
    for value in fixed.graph.input:
        if value.name not in input_shapes:
            continue
        dims = value.type.tensor_type.shape.dim
        wanted = list(input_shapes[value.name])
        if dims and len(dims) != len(wanted):
            raise ValueError(f"input {value.name} has rank {len(dims)}, shape {wanted} given")
        value.type.tensor_type.shape.ClearField("dim")
        for size in wanted:
            value.type.tensor_type.shape.dim.add().dim_value = int(size)
    # Outputs and value_info often carry symbolic dims ("batch"); drop them so inference fills concrete ones.
    del fixed.graph.value_info[:]
    for value in fixed.graph.output:
        value.type.tensor_type.ClearField("shape")
    return fixed


def _infer_shapes(model: onnx.ModelProto) -> dict[str, Shape]:
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = _known_shapes(inferred)
    foreign = any(d.domain not in ("", "ai.onnx") for d in model.opset_import)
    if foreign and any(not all(o in shapes for o in n.output if o) for n in model.graph.node):
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        # A model ORT cannot infer either keeps onnx's shapes; its gaps are reported in ``uncounted``.
        # On incomplete inference ORT saves a debug model into the working directory: keep it in a temp one.
        with (
            tempfile.TemporaryDirectory(prefix="metainfer-shapes-") as tmp,
            contextlib.chdir(tmp),
            contextlib.suppress(Exception),
        ):
            shapes = {**_known_shapes(SymbolicShapeInference.infer_shapes(model, auto_merge=True)), **shapes}
    return shapes


def _known_shapes(model: onnx.ModelProto) -> dict[str, Shape]:
    shapes: dict[str, Shape] = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        t = value.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in t.shape.dim)
    for tensor in model.graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
    return shapes


# -- work ------------------------------------------------------------------------------
def _is_counted_op(op_type: str) -> bool:
    return op_type in _MATMUL_LIKE or op_type in _GEMM_LIKE or op_type in _CONV_LIKE or op_type in _ATTENTION


def _node_ops(node: onnx.NodeProto, shapes: Mapping[str, Shape]) -> list[tuple[int, bool]] | None:
    """``[(ops, is_integer), ...]`` of one node, or None when it is not counted or shapes are unknown."""
    op = node.op_type
    inputs = list(node.input)

    def shape(i: int) -> Shape | None:
        return shapes.get(inputs[i]) if i < len(inputs) and inputs[i] else None

    if op in _MATMUL_LIKE:
        a_i, b_i, is_int = _MATMUL_LIKE[op]
        a, b = shape(a_i), shape(b_i)
        return None if a is None or b is None else [(_matmul_ops(a, b), is_int)]
    if op in _GEMM_LIKE:
        a_i, b_i, is_int = _GEMM_LIKE[op]
        a, b = shape(a_i), shape(b_i)
        if a is None or b is None:
            return None
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        m, k = (a[1], a[0]) if attrs.get("transA", 0) else (a[0], a[1])
        n = b[0] if attrs.get("transB", 0) else b[1]
        return [(2 * m * n * k, is_int)]
    if op in _CONV_LIKE:
        _, w_i, is_int = _CONV_LIKE[op]
        w, y = shape(w_i), shapes.get(node.output[0])
        if w is None or y is None:
            return None
        if op == "NhwcConv":  # output is [N, spatial..., M]: move channels back to axis 1
            y = (y[0], y[-1], *y[1:-1])
        # Each output element takes (C / group) x kernel multiply-accumulates; W is [M, C/group, k...].
        return [(2 * math.prod(y) * math.prod(w[1:]), is_int)]
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        if x is None or w is None:
            return None
        # Each input element scatters into (M / group) x kernel outputs; W is [C, M/group, k...].
        return [(2 * math.prod(x) * math.prod(w[1:]), False)]
    if op in _ATTENTION:
        return _attention_ops(node, shapes)
    return None


def _matmul_ops(a: Shape, b: Shape) -> int:
    """2 x M x N x K over numpy-style broadcast batch axes (1-D operands as numpy treats them)."""
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    return 2 * math.prod(batch) * a2[-2] * b2[-1] * a2[-1]


_ATTENTION = {"Attention": False, "QAttention": True}


def _attention_ops(node: onnx.NodeProto, shapes: Mapping[str, Shape]) -> list[tuple[int, bool]] | None:
    """ORT's fused attention: QKV projection (integer for QAttention) + QK^T and attention x V in float."""
    x = shapes.get(node.input[0])
    w = shapes.get(node.input[1]) if len(node.input) > 1 else None
    if x is None or w is None or len(x) != 3:
        return None
    batch, seq, hidden_in = x
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    sizes = list(attrs.get("qkv_hidden_sizes", [])) or [w[1] // 3] * 3
    q_hidden, _, v_hidden = sizes
    projection = 2 * batch * seq * hidden_in * sum(sizes)
    scores = 2 * batch * seq * seq * q_hidden
    context = 2 * batch * seq * seq * v_hidden
    return [(projection, _ATTENTION[node.op_type]), (scores + context, False)]


# -- bytes -----------------------------------------------------------------------------
def _constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _parameter_bytes(model: onnx.ModelProto, constants: Mapping[str, np.ndarray], shapes: Mapping[str, Shape]) -> int:
    fed = {v.name for v in graph_inputs(model)}
    total = sum(int(t.nbytes) for name, t in constants.items() if name not in fed)
    for node in model.graph.node:
        if node.op_type != "ConstantOfShape":
            continue
        out = shapes.get(node.output[0])
        if out is None and node.input and node.input[0] in constants:
            out = tuple(int(d) for d in constants[node.input[0]].reshape(-1))
        if out is None:
            continue
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        itemsize = numpy_helper.to_array(value).itemsize if value is not None else 4  # default fill: float32 0
        total += math.prod(out) * itemsize
    return total


def _bytes(value: onnx.ValueInfoProto, shape: Shape) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).itemsize
    return math.prod(shape) * itemsize
