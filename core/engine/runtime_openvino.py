"""OpenVINO as a second runtime: a variant compiled by OpenVINO's CPU plugin behind the part of ONNX Runtime's
``InferenceSession`` interface that metainfer uses (``run``, ``get_inputs``, ``get_outputs``, ``get_providers``).

Measuring, validating and serving go through one seam (``core.engine.runtime.create_session``), so a variant on
OpenVINO is timed by the same loop, on the same samples, against the same FP32 baseline as one on ONNX Runtime,
and served behind the same endpoint. OpenVINO reads the variant's ONNX bytes itself (its ONNX frontend): the
variant store keeps the same bytes for both runtimes, and the compile settings come from the recipe.

Like an execution provider, a compile setting OpenVINO quietly replaces (bf16 on a CPU without it becomes f32) is
an error here, not a different measurement under the same name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from metainfer.core.engine.errors import ProviderUnavailable
from metainfer.core.engine.recipe import Recipe

if TYPE_CHECKING:
    import openvino

OPENVINO_DEVICE = "CPU"
# What a session on OpenVINO reports as its provider: one name for the runtime and device, in status and logs.
OPENVINO_PROVIDER = "OpenVINO:CPU"
_HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT"}
# How often a running request looks at its RunOptions' terminate flag (the serving watchdog sets it).
_POLL_MS = 5
_GRAPH_ENDS = frozenset({"Parameter", "Result", "Constant"})
_ORT_TYPE_NAMES = {
    "f32": "tensor(float)",
    "f16": "tensor(float16)",
    "f64": "tensor(double)",
    "i64": "tensor(int64)",
    "i32": "tensor(int32)",
    "i16": "tensor(int16)",
    "i8": "tensor(int8)",
    "u8": "tensor(uint8)",
    "u16": "tensor(uint16)",
    "u32": "tensor(uint32)",
    "u64": "tensor(uint64)",
    "boolean": "tensor(bool)",
}


@dataclass(frozen=True)
class TensorArg:
    """One input or output as ONNX Runtime's ``NodeArg`` shows it: dynamic dimensions are None."""

    name: str
    type: str
    shape: list[int | None]


def openvino_version() -> str | None:
    """OpenVINO's version, or None when it is not installed (an image built without it)."""
    try:
        import openvino
    except ImportError:
        return None
    return str(openvino.__version__)


def openvino_devices() -> tuple[list[str], str | None]:
    """OpenVINO's devices here and, when its CPU device cannot compile a model, why (None: usable)."""
    try:
        import openvino
    except ImportError:
        return [], "OpenVINO is not installed in this image"
    try:
        core = openvino.Core()
        devices = [str(d) for d in core.available_devices]
        if OPENVINO_DEVICE not in devices:
            return devices, f"OpenVINO offers no {OPENVINO_DEVICE} device here (it offers {', '.join(devices)})"
        from metainfer.core.engine.runtime import probe_model

        compiled = core.compile_model(core.read_model(probe_model()), OPENVINO_DEVICE)
        compiled.create_infer_request().infer({"x": np.ones((1, 4), np.float32)})
    except Exception as exc:  # OpenVINO raises RuntimeError and its own types
        return [], f"OpenVINO failed to compile a one-op model: {type(exc).__name__}: {str(exc)[:300]}"
    return devices, None


def unsupported_ops(model: bytes) -> list[str]:
    """The operations of ``model`` OpenVINO cannot run on its CPU device: ONNX operations its frontend has no
    conversion for, or OpenVINO operations its CPU plugin does not support; empty when it runs them all."""
    import openvino

    core = openvino.Core()
    try:
        read = core.read_model(model)
    except Exception as exc:  # OpenVINO raises RuntimeError and its own types
        found = re.search(r"No conversion rule found for operations: ([^\n]+)", str(exc))
        if found:
            return sorted({op.strip() for op in found.group(1).split(",") if op.strip()})[:32]
        return [f"(the model, which OpenVINO could not read: {_first(exc)[:200]})"]
    supported = core.query_model(read, OPENVINO_DEVICE)
    return sorted(
        {
            op.get_type_name()
            for op in read.get_ops()
            if op.get_friendly_name() not in supported and op.get_type_name() not in _GRAPH_ENDS
        }
    )[:32]


def device_identity() -> str:
    """What OpenVINO's CPU plugin compiles for here: its version, the CPU's model and instruction sets. A compiled
    blob is reused only where this is the same (OpenVINO's own blob key names the device, not its ISA)."""
    import openvino

    from metainfer.core.engine.profile.fingerprint import cpu_identity

    return f"openvino {openvino.__version__}; {OPENVINO_DEVICE}: {cpu_identity()}"


def compiled_cache_key(variant_sha256: str, recipe: Recipe) -> str:
    """Where a variant's compiled blobs are kept: one key per (variant bytes, compile settings, OpenVINO build and
    CPU), so a node of another CPU or an image of another OpenVINO never imports a blob made elsewhere."""
    settings = {"variant": variant_sha256, "config": compile_config(recipe), "device": device_identity()}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def compile_config(recipe: Recipe) -> dict[str, Any]:
    """OpenVINO compile properties for ``recipe``: its hint, streams, threads and precision."""
    ov = recipe.session.openvino
    config: dict[str, Any] = {
        "PERFORMANCE_HINT": _HINTS[ov.performance_hint],
        "INFERENCE_PRECISION_HINT": ov.inference_precision,
    }
    if ov.num_streams:
        config["NUM_STREAMS"] = ov.num_streams
    if recipe.session.intra_op_num_threads:
        config["INFERENCE_NUM_THREADS"] = recipe.session.intra_op_num_threads
    return config


class OpenVinoSession:
    """A compiled model with a pool of infer requests, so concurrent callers (the server's worker threads) never
    share one; ``run`` has ``InferenceSession.run``'s signature and results."""

    def __init__(self, model: bytes | str, recipe: Recipe, compiled_cache: Path | None = None) -> None:
        import openvino

        core = openvino.Core()
        config = compile_config(recipe)
        if compiled_cache is not None:
            # OpenVINO keys each blob by the model, the compile settings, its version and the device; a blob that
            # does not match is ignored and the model compiled (a read-only directory is then left as it is).
            config["CACHE_DIR"] = str(compiled_cache)
        try:
            read = core.read_model(model)
            self._compiled = core.compile_model(read, OPENVINO_DEVICE, config)
        except Exception as exc:
            why = f"OpenVINO could not compile the variant: {_first(exc)}"
            raise ProviderUnavailable(OPENVINO_PROVIDER, why) from exc
        _check_settings(self._compiled, recipe)
        graph_names = _graph_names(model)
        self._inputs = [_arg(port, graph_names) for port in self._compiled.inputs]
        self._outputs = [_arg(port, graph_names) for port in self._compiled.outputs]
        # Every name of an output reaches it (OpenVINO merges the names of tensors it folded together).
        self._output_ports = {name: port for port in self._compiled.outputs for name in port.get_names()}
        self._output_ports.update(
            {arg.name: port for arg, port in zip(self._outputs, self._compiled.outputs, strict=True)}
        )
        self._idle: queue.SimpleQueue[openvino.InferRequest] = queue.SimpleQueue()
        self._lock = threading.Lock()

    @property
    def loaded_from_cache(self) -> bool:
        """Whether the compiled model was imported from ``compiled_cache`` rather than compiled here."""
        return bool(self._compiled.get_property("LOADED_FROM_CACHE"))

    def get_inputs(self) -> list[TensorArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [OPENVINO_PROVIDER]

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray], run_options: Any = None
    ) -> list[np.ndarray]:
        """The named outputs (all when None), as fresh arrays. ``run_options`` is honoured for its ``terminate``
        flag: a request still running when it is set is cancelled, and this raises as ONNX Runtime would."""
        names = [arg.name for arg in self._outputs] if output_names is None else list(output_names)
        unknown = [n for n in names if n not in self._output_ports]
        if unknown:
            raise ValueError(f"unknown output(s) {unknown}; the model gives {[a.name for a in self._outputs]}")
        request = self._request()
        try:
            request.start_async(dict(input_feed))
            while not request.wait_for(_POLL_MS):
                if run_options is not None and getattr(run_options, "terminate", False):
                    request.cancel()
                    # A cancelled request ends at its next node, raising; it is then idle and may be reused.
                    with contextlib.suppress(Exception):
                        request.wait()
                    raise RuntimeError("Exiting due to terminate flag being set to true.")
            return [np.array(request.get_tensor(self._output_ports[n]).data, copy=True) for n in names]
        finally:
            self._idle.put(request)

    def _request(self) -> openvino.InferRequest:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            with self._lock:
                return self._compiled.create_infer_request()


def _check_settings(compiled: openvino.CompiledModel, recipe: Recipe) -> None:
    wanted = recipe.session.openvino.inference_precision
    precision = compiled.get_property("INFERENCE_PRECISION_HINT")
    got = str(precision.get_type_name() if hasattr(precision, "get_type_name") else precision)
    if got != wanted:
        raise ProviderUnavailable(
            OPENVINO_PROVIDER,
            f"asked for {wanted} inference precision, OpenVINO compiled {got} (the CPU has no native {wanted})",
        )


def _graph_names(model: bytes | str) -> set[str]:
    """The ONNX graph's input and output names: what ONNX Runtime calls them, and so every caller."""
    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
    return {v.name for v in proto.graph.input} | {v.name for v in proto.graph.output}


def _arg(port: Any, graph_names: set[str]) -> TensorArg:
    shape = port.get_partial_shape()
    dims: list[int | None] = [d.get_length() if d.is_static else None for d in shape] if shape.rank.is_static else []
    element = port.get_element_type().get_type_name()
    named = sorted(graph_names & set(port.get_names()))
    name = named[0] if named else port.get_any_name()
    return TensorArg(name, _ORT_TYPE_NAMES.get(element, f"tensor({element})"), dims)


def _first(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"
