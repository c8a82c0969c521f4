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

import numpy as np
from onnx import helper

from metainfer.core.engine.profile.opmodels import Built, ints, normal, scalar, single_op_model
from metainfer.core.engine.profile.types import Dtype

_FLOAT: dict[str, type[np.floating]] = {"fp32": np.float32, "fp16": np.float16}
_INT = {"u8": np.uint8, "s8": np.int8}


@dataclass(frozen=True)
class OpCase:
    op_type: str
    dtype: Dtype
    variant: str | None
    build: Callable[[np.random.Generator], Built]


# float ops: builder(rng, float type)
def _matmul(r, f):
    return single_op_model(
        "MatMul", {"a": normal(r, (1, 128, 256), f)}, {"b": normal(r, (256, 256), f)}, ["a", "b"], [("y", f)]
    )


def _gemm(r, f):
    consts = {"b": normal(r, (256, 256), f), "c": normal(r, (256,), f)}
    return single_op_model("Gemm", {"a": normal(r, (128, 256), f)}, consts, ["a", "b", "c"], [("y", f)])


def _conv(r, f):
    consts = {"w": normal(r, (64, 32, 3, 3), f), "b": normal(r, (64,), f)}
    return single_op_model(
        "Conv", {"x": normal(r, (1, 32, 56, 56), f)}, consts, ["x", "w", "b"], [("y", f)], pads=[1, 1, 1, 1]
    )


def _nhwcconv(r, f):
    # Channels-last conv (contrib op): the NHWC layout candidate needs it natively.
    consts = {"w": normal(r, (64, 32, 3, 3), f), "b": normal(r, (64,), f)}
    return single_op_model(
        "NhwcConv", {"x": normal(r, (1, 56, 56, 32), f)}, consts, ["x", "w", "b"], [("y", f)],
        domain="com.microsoft", pads=[1, 1, 1, 1], kernel_shape=[3, 3],
    )  # fmt: skip


def _softmax(r, f):
    return single_op_model("Softmax", {"x": normal(r, (1, 4, 128, 128), f)}, {}, ["x"], [("y", f)], axis=-1)


def _layernorm(r, f):
    consts = {"g": normal(r, (256,), f), "b": normal(r, (256,), f)}
    return single_op_model(
        "LayerNormalization", {"x": normal(r, (1, 128, 256), f)}, consts, ["x", "g", "b"], [("y", f)], axis=-1
    )


def _unary(op, r, f):
    return single_op_model(op, {"x": normal(r, (1, 128, 1024), f)}, {}, ["x"], [("y", f)])


def _attention(r, f):
    consts = {"w": normal(r, (256, 768), f), "b": normal(r, (768,), f)}
    x = {"x": normal(r, (1, 128, 256), f)}
    return single_op_model("Attention", x, consts, ["x", "w", "b"], [("y", f)], domain="com.microsoft", num_heads=4)


def _matmulnbits(r, f, k=256, n=256, block=32):
    consts = {
        "w": ints(r, (n, k // block, block // 2), np.uint8),
        "s": (np.abs(normal(r, (n * k // block,), f)) + 0.01).astype(f),
    }
    return single_op_model(
        "MatMulNBits", {"a": normal(r, (1, 128, k), f)}, consts, ["a", "w", "s"], [("y", f)],
        domain="com.microsoft", K=k, N=n, bits=4, block_size=block,
    )  # fmt: skip


def _cast(src, dst, r):
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    return single_op_model("Cast", {"x": normal(r, (128, 1024), src)}, {}, ["x"], [("y", dst)], to=to)


# integer ops: builder(rng, activation type, weight type)
def _matmulinteger(r, a, w):
    consts = {"b": ints(r, (256, 256), w), "az": scalar(3, a), "bz": scalar(0, w)}
    return single_op_model(
        "MatMulInteger", {"a": ints(r, (128, 256), a)}, consts, ["a", "b", "az", "bz"], [("y", np.int32)]
    )


def _convinteger(r, a, w):
    consts = {"w": ints(r, (64, 32, 3, 3), w), "xz": scalar(3, a), "wz": scalar(0, w)}
    x = {"x": ints(r, (1, 32, 56, 56), a)}
    return single_op_model("ConvInteger", x, consts, ["x", "w", "xz", "wz"], [("y", np.int32)], pads=[1, 1, 1, 1])


def _qlinearmatmul(r, a, w):
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


def _qlinearconv(r, a, w):
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


def _dql(r):
    outs = [("y", np.uint8), ("y_scale", np.float32), ("y_zero_point", np.uint8)]
    return single_op_model("DynamicQuantizeLinear", {"x": normal(r, (128, 1024), np.float32)}, {}, ["x"], outs)


def _quantize(r, t):
    consts = {"s": scalar(0.02), "z": scalar(3, t)}
    x = {"x": normal(r, (128, 1024), np.float32)}
    return single_op_model("QuantizeLinear", x, consts, ["x", "s", "z"], [("y", t)])


def _dequantize(r, t):
    consts = {"s": scalar(0.02), "z": scalar(3, t)}
    return single_op_model(
        "DequantizeLinear", {"x": ints(r, (128, 1024), t)}, consts, ["x", "s", "z"], [("y", np.float32)]
    )


def op_cases() -> list[OpCase]:
    """Every probe: float ops in fp32 and fp16, integer ops per type variant."""
    cases: list[OpCase] = []
    floats = {
        "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "Softmax": _softmax,
        "LayerNormalization": _layernorm, "Gelu": partial(_unary, "Gelu"), "Erf": partial(_unary, "Erf"),
        "Attention": _attention, "NhwcConv": _nhwcconv,
    }  # fmt: skip
    for dtype, f in _FLOAT.items():
        cases += [OpCase(op, dtype, None, partial(b, f=f)) for op, b in floats.items()]  # type: ignore[arg-type]
        cases.append(OpCase("MatMulNBits", dtype, "q4", partial(_matmulnbits, f=f)))
    cases.append(OpCase("Cast", "fp32", None, partial(_cast, np.float16, np.float32)))
    cases.append(OpCase("Cast", "fp16", None, partial(_cast, np.float32, np.float16)))
    cases.append(OpCase("Cast", "int8", None, partial(_cast, np.float32, np.int8)))
    cases.append(OpCase("DynamicQuantizeLinear", "int8", "u8", _dql))
    for tag, t in _INT.items():  # the Q/DQ pairs that static (QDQ) quantization leaves unfused
        cases.append(OpCase("QuantizeLinear", "int8", tag, partial(_quantize, t=t)))
        cases.append(OpCase("DequantizeLinear", "int8", tag, partial(_dequantize, t=t)))
    variants = {
        "MatMulInteger": (_matmulinteger, ("u8s8", "u8u8", "s8s8")),
        "ConvInteger": (_convinteger, ("u8s8", "u8u8")),
        "QLinearMatMul": (_qlinearmatmul, ("u8s8", "u8u8", "s8s8")),
        "QLinearConv": (_qlinearconv, ("u8s8", "u8u8", "s8s8", "s8u8")),
    }
    for op, (build, tags) in variants.items():
        for tag in tags:
            cases.append(OpCase(op, "int8", tag, partial(build, a=_INT[tag[:2]], w=_INT[tag[2:]])))
    return cases
