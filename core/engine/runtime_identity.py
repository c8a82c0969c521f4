"""Which runtime builds an image runs (ONNX Runtime's, and OpenVINO's where installed), in one line, read without
importing either.

A variant's bytes and latency are a function of the runtime that built and runs it, so a run made under one build
says nothing certain about another: the run key includes this line (core.control.runkey), and a serving pod of
another runtime is not given a variant validated under this one (core.control.manifests.serving_image). It comes
from the installed distribution's metadata, so the operator, which never loads a model, does not pay ONNX
Runtime's import (about 30 MB of RSS) to know it; the distribution's name carries its execution providers
(onnxruntime-gpu: CUDA and TensorRT, onnxruntime-openvino: OpenVINO, ...).
"""

from __future__ import annotations

import functools
import importlib.metadata

RUNTIME_MAX = 256
# Every ONNX Runtime build published as a distribution of its own provides the ``onnxruntime`` package.
DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-openvino",
    "onnxruntime-rocm",
    "onnxruntime-directml",
    "onnxruntime-qnn",
    "onnxruntime-training",
    # The second runtime (session.runtime: openvino): a variant validated on one OpenVINO release is served on it.
    "openvino",
)


# Once per process: each lookup of an absent distribution scans every sys.path entry, and the operator asks on
# every reconcile (21 of 312 profiled seconds at 1,000 nodes x 100 policies). What is installed does not change
# under a running process.
@functools.cache
def runtime_identity() -> str:
    """``<distribution> <version>`` of each installed runtime distribution (e.g. ``onnxruntime-gpu 1.22.0`` or
    ``onnxruntime 1.32.0+openvino 2026.4.1``), joined by ``+``; ``none`` without any."""
    found = []
    for name in DISTRIBUTIONS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ("+".join(found) or "none")[:RUNTIME_MAX]
