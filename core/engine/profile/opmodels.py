"""Build tiny single-op ONNX models, for the op probes and the peak benchmarks.

Activations are graph inputs and weights initializers: with all-constant
inputs ORT would fold the node away, and constant weights let it pre-pack them
as it does in real models. Values come from the caller's seeded generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from metainfer.core.engine.profile.types import Dtype

Feeds = dict[str, np.ndarray]
Built = tuple[onnx.ModelProto, Feeds]
OPSET = 20  # Gelu is a standard op from opset 20


def single_op_model(
    op_type: str,
    feeds: Feeds,
    consts: Feeds,
    order: list[str],
    outs: Sequence[tuple[str, type]],
    domain: str = "",
    **attrs: object,
) -> Built:
    """One node named ``target``; ``order`` lists its inputs ("" for an omitted optional one)."""
    inputs = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()
    ]
    outputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)), None) for n, t in outs]
    node = helper.make_node(op_type, order, [n for n, _ in outs], name="target", domain=domain, **attrs)  # type: ignore[arg-type]  # onnx types attribute kwargs as str | None
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    graph = helper.make_graph([node], f"probe_{op_type}", inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets, producer_name="metainfer-profile")
    model.ir_version = 10  # what ORT >= 1.20 reads; onnx's default may be newer
    return model, feeds


def normal(r: np.random.Generator, shape: tuple[int, ...], t: type) -> np.ndarray:
    return (r.standard_normal(shape) * 0.1).astype(t)


def ints(r: np.random.Generator, shape: tuple[int, ...], t: type) -> np.ndarray:
    info = np.iinfo(t)
    return r.integers(info.min, info.max, shape, endpoint=True).astype(t)


def scalar(v: float, t: type = np.float32) -> np.ndarray:
    return np.array(v, dtype=t)


def gemm_model(n: int, dtype: Dtype, rng: np.random.Generator) -> Built:
    """Square n x n x n GEMM for peak compute: fp32 MatMul or u8s8 MatMulInteger."""
    if dtype == "int8":
        return _matmulinteger_n(rng, n)
    return single_op_model(
        "MatMul",
        {"a": normal(rng, (n, n), np.float32)},
        {"b": normal(rng, (n, n), np.float32)},
        ["a", "b"],
        [("y", np.float32)],
    )


def _matmulinteger_n(r: np.random.Generator, n: int) -> Built:
    consts = {"b": ints(r, (n, n), np.int8), "az": scalar(3, np.uint8)}
    return single_op_model(
        "MatMulInteger", {"a": ints(r, (n, n), np.uint8)}, consts, ["a", "b", "az"], [("y", np.int32)]
    )


def add_model(elements: int, rng: np.random.Generator) -> Built:
    """Elementwise fp32 Add of two 1-D tensors: memory bound at any useful size."""
    feeds = {"x": normal(rng, (elements,), np.float32), "z": normal(rng, (elements,), np.float32)}
    return single_op_model("Add", feeds, {}, ["x", "z"], [("y", np.float32)])
