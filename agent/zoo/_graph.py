"""A small helper that names nodes and tensors while a graph is written by hand.

Output names are derived from a running counter, and each random initializer is
drawn from its own stream keyed by the seed and its name (``_exact``), so the same
calls always give the same bytes, on any machine. Shared constants (the same name
asked for twice) are stored once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from metainfer.agent.zoo._exact import bell, bell_width, to_float32

MAX_BELL_WIDTH = 1 << 16


def _weight_exponent(init_std: float) -> int:
    """Weights are integers times ``2**-exponent``; the largest exponent whose bell still fits 16-bit draws keeps
    the most resolution (for std 0.02: exponent 20, width ~36k, about 15 bits per weight)."""
    if not init_std > 0:
        raise ValueError(f"init_std must be positive, got {init_std}")
    exponent = 0
    while bell_width(init_std, exponent + 1) <= MAX_BELL_WIDTH:
        exponent += 1
    return exponent


class GraphBuilder:
    """Collects nodes and initializers; each ``node`` call returns its output's name."""

    def __init__(self, seed: int, init_std: float, opset: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.value_info: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._seed = seed
        self._exponent = _weight_exponent(init_std)
        self._width = bell_width(init_std, self._exponent)
        self._count = 0
        self.opset = opset

    def node(self, op_type: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> str:
        self._count += 1
        name = f"/{op_type}_{self._count}"
        out = output or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer with a fixed value; asking again for the same name reuses it."""
        if name not in self._names:
            self._names.add(name)
            self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        """A float32 initializer with mean 0 and standard deviation init_std (BERT's initialisation).

        The distribution is a four-term Irwin-Hall rather than a normal: close to
        one (bounded at about 3.5 standard deviations), and made of integers, so the
        bytes do not depend on the machine's libm or on numpy's sampling algorithms.
        """
        return self.const(name, to_float32(bell(f"{self._seed}/{name}", shape, self._width), self._exponent))

    def linear(self, x: str, prefix: str, fan_in: int, fan_out: int) -> str:
        """``x @ W + b`` as MatMul then Add, the way torch exports ``nn.Linear`` on 3-D input.

        BERT initialises biases to zero; a trained model's are not, so they are drawn
        at the same scale as the weights to give quantizers a realistic range.
        """
        weight = self.weight(f"{prefix}.weight", (fan_in, fan_out))
        bias = self.weight(f"{prefix}.bias", (fan_out,))
        return self.node("Add", [self.node("MatMul", [x, weight]), bias])

    def unsqueeze(self, x: str, axis: int) -> str:
        """Unsqueeze one axis: an attribute before opset 13, an input from 13 on."""
        if self.opset < 13:
            return self.node("Unsqueeze", [x], axes=[axis])
        return self.node("Unsqueeze", [x, self.const(f"axes_{axis}", np.array([axis], np.int64))])

    def layer_norm(self, x: str, prefix: str, width: int, eps: float, output: str | None = None) -> str:
        """LayerNormalization over the last axis with gamma 1 and beta 0 (BERT's init).

        Below opset 17 there is no LayerNormalization op, and torch writes the
        formula out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add);
        ONNX Runtime's LayerNormFusion recognises exactly that sequence.
        """
        gamma = self.const(f"{prefix}.weight", np.ones(width, np.float32))
        beta = self.const(f"{prefix}.bias", np.zeros(width, np.float32))
        if self.opset >= 17:
            return self.node("LayerNormalization", [x, gamma, beta], output, axis=-1, epsilon=eps)
        mean = self.node("ReduceMean", [x], axes=[-1])
        centred = self.node("Sub", [x, mean])
        variance = self.node(
            "ReduceMean",
            [self.node("Pow", [centred, self.const("two", np.array(2.0, np.float32))])],
            axes=[-1],
        )
        std = self.node("Sqrt", [self.node("Add", [variance, self.const(f"{prefix}.eps", np.array(eps, np.float32))])])
        scaled = self.node("Mul", [self.node("Div", [centred, std]), gamma])
        return self.node("Add", [scaled, beta], output)
