"""ONNX Runtime sessions built from a recipe's session part, on the execution provider the recipe names or not at all.

ONNX Runtime builds a session on the CPU when the requested EP is missing from its build or cannot initialise (no
device visible, a driver or CUDA/cuDNN mismatch), with a Python warning or a native log line nobody reads. Every
latency measured on such a session would be the CPU's, reported as the accelerator's. So every session is checked
against the EP its recipe names (``create_session``), the EPs a machine offers are tried once before anything is
measured on them (``provider_usability``), and an accelerator class whose vendor's EPs are all unusable here
fails its run with the reason (``require_accelerator``) instead of adapting on the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from metainfer.core.engine.errors import ProviderUnavailable
from metainfer.core.engine.recipe import Recipe

CPU_PROVIDER = "CPUExecutionProvider"
CAUSE_LIMIT = 600
# The EPs that make each accelerator vendor's hardware fast (core.api.hardwareclass vendors); "cpu" needs none.
ACCELERATOR_PROVIDERS: Mapping[str, tuple[str, ...]] = {
    "nvidia": ("TensorrtExecutionProvider", "CUDAExecutionProvider"),
    "amd": ("MIGraphXExecutionProvider", "ROCMExecutionProvider"),
    "intel": ("OpenVINOExecutionProvider",),
    "huawei": ("CANNExecutionProvider",),
}


def session_options(recipe: Recipe) -> ort.SessionOptions:
    so = ort.SessionOptions()
    for name, value in recipe.session_options.items():
        if name == "graph_optimization_level":
            value = getattr(ort.GraphOptimizationLevel, value)
        elif name == "execution_mode":
            value = getattr(ort.ExecutionMode, value)
        setattr(so, name, value)
    so.log_severity_level = 3  # warnings about unused initializers etc. are noise to a user
    return so


class Session(Protocol):
    """What metainfer asks of a loaded variant, on either runtime: ONNX Runtime's ``InferenceSession`` has it, and
    ``core.engine.runtime_openvino.OpenVinoSession`` gives it for OpenVINO."""

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray], run_options: Any = None
    ) -> list[Any]: ...

    def get_inputs(self) -> Sequence[Any]: ...

    def get_outputs(self) -> Sequence[Any]: ...

    def get_providers(self) -> list[str]: ...


def create_session(model: bytes | str, recipe: Recipe, compiled_cache: Path | None = None) -> Session:
    """The session on the recipe's runtime and EP; raises ProviderUnavailable (with the runtime's reason) where
    it cannot be had. ``compiled_cache`` is a directory of OpenVINO compiled blobs to import from (and, where it
    is writable, to add to); ONNX Runtime sessions ignore it."""
    if recipe.session.runtime == "openvino":
        from metainfer.core.engine.runtime_openvino import OpenVinoSession  # only images that serve it load it

        return OpenVinoSession(model, recipe, compiled_cache)
    wanted = recipe.session.execution_provider
    if wanted != CPU_PROVIDER:
        preload_accelerator_libraries()
    with warnings.catch_warnings():  # the missing-EP warning is this check's to report, with its cause
        warnings.simplefilter("ignore", UserWarning)
        session: Session = ort.InferenceSession(
            model,
            sess_options=session_options(recipe),
            providers=recipe.providers,
            provider_options=recipe.provider_options(),
        )
    got = session.get_providers()
    if wanted not in got:
        raise ProviderUnavailable(wanted, why_not(wanted, got, model, recipe.providers))
    return session


def available_providers() -> list[str]:
    # Azure's EP calls a remote endpoint; it is not hardware to adapt to.
    return [p for p in ort.get_available_providers() if p != "AzureExecutionProvider"]


def provider_usability(providers: Iterable[str]) -> dict[str, str | None]:
    """Per EP: None when a session on it really runs there, else why not. A one-node model per EP, milliseconds."""
    providers = list(providers)
    if any(p != CPU_PROVIDER for p in providers):
        preload_accelerator_libraries()
    probe = probe_model()
    out: dict[str, str | None] = {}
    for provider in providers:
        if provider == CPU_PROVIDER:
            out[provider] = None
            continue
        providers_list = [provider, CPU_PROVIDER]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                got = _session(probe, _quiet(), providers_list).get_providers()
        except Exception as exc:  # ONNX Runtime raises several unrelated types
            out[provider] = _bounded(f"creating a session failed: {type(exc).__name__}: {exc}")
            continue
        out[provider] = None if provider in got else why_not(provider, got, probe, providers_list)
    return out


def require_accelerator(vendor: str, usability: Mapping[str, str | None]) -> None:
    """Raise ProviderUnavailable when ``vendor``'s hardware has EPs and none of them is usable here: adapting such a
    class on the CPU would serve CPU latencies as the accelerator's."""
    wanted = ACCELERATOR_PROVIDERS.get(vendor, ())
    if not wanted or any(usability.get(p, "absent") is None for p in wanted):
        return
    causes = [f"{p}: {usability[p]}" for p in wanted if usability.get(p)]
    missing = [p for p in wanted if p not in usability]
    if missing:
        causes.append(f"this ONNX Runtime build ({ort.__version__}) has no {', '.join(missing)}")
    raise ProviderUnavailable(
        " or ".join(wanted),
        _bounded(f"a {vendor} class needs one of them and none runs on this node ({'; '.join(causes)});"
                 " use an image built with that runtime on nodes whose device is visible to the pod"),
    )  # fmt: skip


@functools.cache
def preload_accelerator_libraries() -> None:
    """Once per process, before any session asks for an accelerator EP: load the CUDA and cuDNN libraries the
    image's pip wheels (nvidia-*) carry. onnxruntime-gpu's EP libraries find them only on the loader's path, which
    a venv's site-packages is not; ``onnxruntime.preload_dlls`` loads them by path (ONNX Runtime 1.21+). Without
    it every CUDA and TensorRT session of the CUDA image falls back ("libcublasLt.so.13: cannot open shared
    object file") even on a GPU node. What it prints about libraries it could not load goes to stderr: the driver's
    own library (libcuda) is absent on a node without a GPU, and the EP then says so itself."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None or "CUDAExecutionProvider" not in ort.get_available_providers():
        return
    with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(Exception):
        preload()


def why_not(wanted: str, got: list[str], model: bytes | str, providers: list[str]) -> str:
    """ONNX Runtime's reason for leaving ``wanted`` out: its build lacks it, or what it logs when the EP fails to
    initialise (taken from a second attempt at warning level, so that the usual path logs nothing)."""
    if wanted not in ort.get_available_providers():
        offered = ", ".join(available_providers())
        return _bounded(f"this ONNX Runtime build ({ort.__version__}) has no {wanted} (it offers {offered})")
    so = _quiet()
    so.log_severity_level = 1  # info and up: the EP's own explanation
    lines: list[str] = []
    with _native_stderr(lines), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(Exception):
            _session(model, so, providers)
    lines += [str(w.message) for w in caught]
    stem = wanted.removesuffix("ExecutionProvider").lower()
    relevant = [_essence(line) for line in lines if stem in line.lower() or "fail" in line.lower()]
    if relevant:
        return _bounded(f"ONNX Runtime ran the session on {', '.join(got)} instead: " + " | ".join(relevant[-3:]))
    return _bounded(f"ONNX Runtime ran the session on {', '.join(got)} instead, without saying why")


def _session(model: bytes | str, so: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    return ort.InferenceSession(model, sess_options=so, providers=providers)


def _quiet() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return so


@contextlib.contextmanager
def _native_stderr(lines: list[str]) -> Iterator[None]:
    """What native code writes to file descriptor 2 meanwhile, as lines; written on to stderr afterwards, so
    nothing another thread logged in the meantime is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
    if text:
        sys.stderr.write(text)
        lines.extend(text.splitlines())


def probe_model() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 9)
    return bytes(onnx.shape_inference.infer_shapes(model).SerializeToString())


# ONNX Runtime's log lines: colour codes, a timestamp and logger prefix, the source path of the throw site.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOG_PREFIX = re.compile(r"^\S+ \S+ \[[EWIV]:onnxruntime:[^\]]*\]\s*")
_THROW_SITE = re.compile(r"^/\S+:\d+ .*?\[ONNXRuntimeError\] : \d+ : \w+ : ")


def _bounded(text: str) -> str:
    text = _ANSI.sub("", text)
    return text if len(text) <= CAUSE_LIMIT else text[: CAUSE_LIMIT - 3] + "..."


def _essence(line: str) -> str:
    """One of ONNX Runtime's log lines without what says nothing to a reader of a condition message."""
    return _THROW_SITE.sub("", _LOG_PREFIX.sub("", _ANSI.sub("", line).strip()))
