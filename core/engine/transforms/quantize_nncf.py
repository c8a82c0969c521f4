"""Static int8 written by NNCF's ONNX backend: the quantizer OpenVINO's users reach for, as a search choice.

NNCF picks what ONNX Runtime's quantizer leaves to its caller: symmetric per-channel weights, its own activation
range estimators, which operations to quantize (it leaves out those its patterns say lose accuracy or speed), and
a bias correction of each quantized layer's output. It writes QDQ ONNX, so the variant stays ONNX bytes that either
runtime loads, is stored and rebuilt like any other, and mixed precision keeps the named layers in float through
NNCF's ignored scope.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import onnx

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.recipe import QuantizationSpec

if TYPE_CHECKING:
    import numpy as np


def nncf_available() -> bool:
    """Whether this image has NNCF (the quantizer knob offers it only then)."""
    import importlib.util

    return importlib.util.find_spec("nncf") is not None


def to_int8_nncf(model: onnx.ModelProto, spec: QuantizationSpec, feeds: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """``model`` (already at the QDQ opset and pre-processed) quantized by NNCF on the calibration ``feeds``."""
    if not feeds:
        raise InputError("data", "static int8 quantization needs at least one full calibration batch")
    # NNCF reports usage to a web analytics service unless it believes it runs in CI; metainfer's pods talk to
    # nothing outside their cluster, and neither does a local adaptation.
    os.environ["NNCF_CI"] = "1"
    import nncf

    logging.getLogger("nncf").setLevel(logging.ERROR)
    transformer = any(n.op_type in ("Softmax", "LayerNormalization") for n in model.graph.node)
    quantized: onnx.ModelProto = nncf.quantize(
        model,
        nncf.Dataset(feeds),
        subset_size=len(feeds),
        fast_bias_correction=True,
        model_type=nncf.ModelType.TRANSFORMER if transformer else None,
        ignored_scope=nncf.IgnoredScope(names=list(spec.keep_float), validate=False) if spec.keep_float else None,
    )
    return quantized


def feeds_of(calibration: Dataset, batch: int) -> list[dict[str, np.ndarray]]:
    """Full calibration batches, as NNCF's dataset items."""
    return [feed for feed, _ in calibration.batches(batch) if next(iter(feed.values())).shape[0] == batch]
