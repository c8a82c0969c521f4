"""The unit tier: a tiny conv model for the conv paths (the digits model and a quick profile, which every tier
uses, are in tests/conftest.py), and the tier's guard: a unit test that opens a connection off this host fails."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


def conv_model(seed: int = 0) -> onnx.ModelProto:
    """A tiny two-conv classifier with a dynamic batch: enough to exercise conv paths."""
    rng = np.random.default_rng(seed)

    def init(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return helper.make_tensor(
            name, TensorProto.FLOAT, shape, (rng.standard_normal(shape) * 0.2).astype(np.float32).ravel()
        )

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [
            init("w1", (8, 3, 3, 3)),
            init("b1", (8,)),
            init("w2", (16, 8, 3, 3)),
            init("b2", (16,)),
            init("w3", (10, 16)),
            init("b3", (10,)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="session")
def tiny_conv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("conv")
    path = out / "model.onnx"
    onnx.save(conv_model(), path)
    rng = np.random.default_rng(1)
    np.savez(out / "data.npz", x=rng.standard_normal((32, 3, 16, 16)).astype(np.float32))
    return path, out / "data.npz"


# -- the unit tier's promise: nothing here reaches a network ---------------------------------------------------
_LOOPBACK = ("127.", "::1", "localhost", "0.0.0.0")


def _refuse_off_host(connect):  # type: ignore[no-untyped-def]
    def guarded(sock: socket.socket, address, *args):  # type: ignore[no-untyped-def]
        host = address[0] if isinstance(address, tuple) else address
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not str(host).startswith(_LOOPBACK):
            raise AssertionError(f"a unit test connected to {address!r}: network tests belong in tests/integration")
        return connect(sock, address, *args)

    return guarded


@pytest.fixture(autouse=True, scope="session")
def _no_network() -> Iterator[None]:
    """In-process servers on loopback are fine (aiohttp's test client); any other address fails the test."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    socket.socket.connect = _refuse_off_host(real_connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = _refuse_off_host(real_connect_ex)  # type: ignore[method-assign]
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex  # type: ignore[method-assign]
