"""The probe matrix: one single-op model per (op type, dtype, type variant) the search cares about.

Shapes are those of a small transformer layer or conv stage (sequence 128,
hidden 256, 32->64 channels at 56x56), so latencies are comparable between ops
and to real models. Integer ops are probed per type variant (u8s8 = uint8
activations x int8 weights) because ORT's CPU kernels differ by variant: some
are missing, some are reference loops many times slower than the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from onnx import helper

from metainfer.core.engine.profile.opmodels import Built, ints, normal, scalar, single_op_model
from metainfer.core.engine.profile.types import Dtype

Rng = np.random.Generator
FloatType = type[np.floating[Any]]
IntType = type[np.integer[Any]]
_FLOAT: dict[Dtype, FloatType] = {"fp32": np.float32, "fp16": np.float16}
_INT: dict[str, IntType] = {"u8": np.uint8, "s8": np.int8}


@dataclass(frozen=True)
class OpCase:
    op_type: str
    dtype: Dtype
    variant: str | None
    build: Callable[[np.random.Generator], Built]


# float ops: builder(rng, float type)
def _matmul(r: Rng, f: FloatType) -> Built:
    return single_op_model(
        "MatMul", {"a": normal(r, (1, 128, 256), f)}, {"b": normal(r, (256, 256), f)}, ["a", "b"], [("y", f)]
    )


def _gemm(r: Rng, f: FloatType) -> Built:
    consts = {"b": normal(r, (256, 256), f), "c": normal(r, (256,), f)}
    return single_op_model("Gemm", {"a": normal(r, (128, 256), f)}, consts, ["a", "b", "c"], [("y", f)])


def _conv(r: Rng, f: FloatType) -> Built:
    consts = {"w": normal(r, (64, 32, 3, 3), f), "b": normal(r, (64,), f)}
    return single_op_model(
        "Conv", {"x": normal(r, (1, 32, 56, 56), f)}, consts, ["x", "w", "b"], [("y", f)], pads=[1, 1, 1, 1]
    )


def _nhwcconv(r: Rng, f: FloatType) -> Built:
    # Channels-last conv (contrib op): the NHWC layout candidate needs it natively.
    consts = {"w": normal(r, (64, 32, 3, 3), f), "b": normal(r, (64,), f)}
    return single_op_model(
        "NhwcConv", {"x": normal(r, (1, 56, 56, 32), f)}, consts, ["x", "w", "b"], [("y", f)],
        domain="com.microsoft", pads=[1, 1, 1, 1], kernel_shape=[3, 3],
    )  # fmt: skip


def _softmax(r: Rng, f: FloatType) -> Built:
    return single_op_model("Softmax", {"x": normal(r, (1, 4, 128, 128), f)}, {}, ["x"], [("y", f)], axis=-1)


def _layernorm(r: Rng, f: FloatType) -> Built:
    consts = {"g": normal(r, (256,), f), "b": normal(r, (256,), f)}
    return single_op_model(
        "LayerNormalization", {"x": normal(r, (1, 128, 256), f)}, consts, ["x", "g", "b"], [("y", f)], axis=-1
    )


def _unary(op: str, r: Rng, f: FloatType) -> Built:
    return single_op_model(op, {"x": normal(r, (1, 128, 1024), f)}, {}, ["x"], [("y", f)])


def _attention(r: Rng, f: FloatType) -> Built:
    consts = {"w": normal(r, (256, 768), f), "b": normal(r, (768,), f)}
    x = {"x": normal(r, (1, 128, 256), f)}
    return single_op_model("Attention", x, consts, ["x", "w", "b"], [("y", f)], domain="com.microsoft", num_heads=4)


def _matmulnbits(r: Rng, f: FloatType, k: int = 256, n: int = 256, block: int = 32) -> Built:
    consts = {
        "w": ints(r, (n, k // block, block // 2), np.uint8),
        "s": (np.abs(normal(r, (n * k // block,), f)) + 0.01).astype(f),
    }
    return single_op_model(
        "MatMulNBits", {"a": normal(r, (1, 128, k), f)}, consts, ["a", "w", "s"], [("y", f)],
        domain="com.microsoft", K=k, N=n, bits=4, block_size=block,
    )  # fmt: skip


def _cast(src: type, dst: type, r: Rng) -> Built:
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    return single_op_model("Cast", {"x": normal(r, (128, 1024), src)}, {}, ["x"], [("y", dst)], to=to)


# integer ops: builder(rng, activation type, weight type)
def _matmulinteger(r: Rng, a: IntType, w: IntType) -> Built:
    consts = {"b": ints(r, (256, 256), w), "az": scalar(3, a), "bz": scalar(0, w)}
    return single_op_model(
        "MatMulInteger", {"a": ints(r, (128, 256), a)}, consts, ["a", "b", "az", "bz"], [("y", np.int32)]
    )


def _convinteger(r: Rng, a: IntType, w: IntType) -> Built:
    consts = {"w": ints(r, (64, 32, 3, 3), w), "xz": scalar(3, a), "wz": scalar(0, w)}
    x = {"x": ints(r, (1, 32, 56, 56), a)}
    return single_op_model("ConvInteger", x, consts, ["x", "w", "xz", "wz"], [("y", np.int32)], pads=[1, 1, 1, 1])


def _qlinearmatmul(r: Rng, a: IntType, w: IntType) -> Built:
    consts = {
        "as": scalar(0.02),
        "az": scalar(3, a),
        "b": ints(r, (256, 256), w),
        "bs": scalar(0.01),
        "bz": scalar(0, w),
    }
    consts |= {"ys": scalar(0.5), "yz": scalar(5, a)}
    order = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    return single_op_model("QLinearMatMul", {"a": ints(r, (128, 256), a)}, consts, order, [("y", a)])


def _qlinearconv(r: Rng, a: IntType, w: IntType) -> Built:
    consts = {
        "xs": scalar(0.02),
        "xz": scalar(3, a),
        "w": ints(r, (64, 32, 3, 3), w),
        "ws": scalar(0.01),
        "wz": scalar(0, w),
    }
    consts |= {"ys": scalar(0.5), "yz": scalar(5, a), "b": ints(r, (64,), np.int32) // 1000}
    order = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]
    x = {"x": ints(r, (1, 32, 56, 56), a)}
    return single_op_model("QLinearConv", x, consts, order, [("y", a)], pads=[1, 1, 1, 1])


def _dql(r: Rng) -> Built:
    outs = [("y", np.uint8), ("y_scale", np.float32), ("y_zero_point", np.uint8)]
    return single_op_model("DynamicQuantizeLinear", {"x": normal(r, (128, 1024), np.float32)}, {}, ["x"], outs)


def _quantize(r: Rng, t: IntType) -> Built:
    consts = {"s": scalar(0.02), "z": scalar(3, t)}
    x = {"x": normal(r, (128, 1024), np.float32)}
    return single_op_model("QuantizeLinear", x, consts, ["x", "s", "z"], [("y", t)])


def _dequantize(r: Rng, t: IntType) -> Built:
    consts = {"s": scalar(0.02), "z": scalar(3, t)}
    return single_op_model(
        "DequantizeLinear", {"x": ints(r, (128, 1024), t)}, consts, ["x", "s", "z"], [("y", np.float32)]
    )


def _in_float(build: Callable[[Rng, FloatType], Built], f: FloatType) -> Callable[[Rng], Built]:
    return lambda r: build(r, f)


def _in_ints(build: Callable[[Rng, IntType, IntType], Built], a: IntType, w: IntType) -> Callable[[Rng], Built]:
    return lambda r: build(r, a, w)


def _in_int(build: Callable[[Rng, IntType], Built], t: IntType) -> Callable[[Rng], Built]:
    return lambda r: build(r, t)


def op_cases() -> list[OpCase]:
    """Every probe: float ops in fp32 and fp16, integer ops per type variant."""
    cases: list[OpCase] = []
    floats: dict[str, Callable[[Rng, FloatType], Built]] = {
        "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "Softmax": _softmax,
        "LayerNormalization": _layernorm, "Gelu": partial(_unary, "Gelu"), "Erf": partial(_unary, "Erf"),
        "Attention": _attention, "NhwcConv": _nhwcconv,
    }  # fmt: skip
    for dtype, f in _FLOAT.items():
        cases += [OpCase(op, dtype, None, _in_float(b, f)) for op, b in floats.items()]
        cases.append(OpCase("MatMulNBits", dtype, "q4", _in_float(_matmulnbits, f)))
    cases.append(OpCase("Cast", "fp32", None, partial(_cast, np.float16, np.float32)))
    cases.append(OpCase("Cast", "fp16", None, partial(_cast, np.float32, np.float16)))
    cases.append(OpCase("Cast", "int8", None, partial(_cast, np.float32, np.int8)))
    cases.append(OpCase("DynamicQuantizeLinear", "int8", "u8", _dql))
    for tag, t in _INT.items():  # the Q/DQ pairs that static (QDQ) quantization leaves unfused
        cases.append(OpCase("QuantizeLinear", "int8", tag, _in_int(_quantize, t)))
        cases.append(OpCase("DequantizeLinear", "int8", tag, _in_int(_dequantize, t)))
    variants: dict[str, tuple[Callable[[Rng, IntType, IntType], Built], tuple[str, ...]]] = {
        "MatMulInteger": (_matmulinteger, ("u8s8", "u8u8", "s8s8")),
        "ConvInteger": (_convinteger, ("u8s8", "u8u8")),
        "QLinearMatMul": (_qlinearmatmul, ("u8s8", "u8u8", "s8s8")),
        "QLinearConv": (_qlinearconv, ("u8s8", "u8u8", "s8s8", "s8u8")),
    }
    for op, (build, tags) in variants.items():
        for tag in tags:
            cases.append(OpCase(op, "int8", tag, _in_ints(build, _INT[tag[:2]], _INT[tag[2:]])))
    return cases
