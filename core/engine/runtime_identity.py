"""Which ONNX Runtime build an image runs, in one line, read without importing ONNX Runtime.

A variant's bytes and latency are a function of the runtime that built and runs it, so a run made under one build
says nothing certain about another: the run key includes this line (core.control.runkey), and a serving pod of
another runtime is not given a variant validated under this one (core.control.manifests.serving_image). It comes
from the installed distribution's metadata, so the operator, which never loads a model, does not pay ONNX
Runtime's import (about 30 MB of RSS) to know it; the distribution's name carries its execution providers
(onnxruntime-gpu: CUDA and TensorRT, onnxruntime-openvino: OpenVINO, ...).
"""

from __future__ import annotations

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
)


def runtime_identity() -> str:
    """``<distribution> <version>`` of each installed ONNX Runtime distribution (e.g. ``onnxruntime-gpu
    1.22.0``), joined by ``+`` when an image has more than one; ``none`` without any."""
    found = []
    for name in DISTRIBUTIONS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ("+".join(found) or "none")[:RUNTIME_MAX]
