"""Static int8 written by NNCF's ONNX backend: the quantizer OpenVINO's users reach for, as a search choice.

NNCF picks what ONNX Runtime's quantizer leaves to its caller: symmetric per-channel weights, its own activation
range estimators, which operations to quantize (it leaves out those its patterns say lose accuracy or speed), and
a bias correction of each quantized layer's output. It writes QDQ ONNX, so the variant stays ONNX bytes that either
runtime loads, is stored and rebuilt like any other, and mixed precision keeps the named layers in float through
NNCF's ignored scope.

Which layers: for NNCF's variants, NNCF's own accuracy-controlled quantization chooses them. It quantizes
everything, and while the policy's quality metric drops by more than its budget, ranks its quantizers by how much
of the drop reverting each buys back and reverts the best; the operations it reverted become the ignored scope
(``kept_in_float_by_accuracy_control``), so the variant is still rebuilt from its recipe alone.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    nncf = _nncf(feeds)
    try:
        quantized: onnx.ModelProto = nncf.quantize(
            model,
            nncf.Dataset(feeds),
            **_settings(nncf, model, feeds),
            ignored_scope=nncf.IgnoredScope(names=list(spec.keep_float), validate=False) if spec.keep_float else None,
        )
    except Exception as exc:  # NNCF's own failures on graphs it does not expect (e.g. its bias correction)
        raise NncfFailed(f"NNCF could not quantize this graph ({type(exc).__name__}: {str(exc)[:200]})") from exc
    return quantized


class NncfFailed(RuntimeError):
    """NNCF failed on this graph: the candidate fails, ONNX Runtime's quantizer's candidates are unaffected."""


# NNCF's accuracy control calls this with a candidate model and data items, for the metric (higher is better)
# and, so that it need not call once per item to rank, each item's own value.
Validate = Callable[[onnx.ModelProto, Iterable[Any]], tuple[float, list[float]]]


def kept_in_float_by_accuracy_control(
    model: onnx.ModelProto,
    feeds: list[dict[str, np.ndarray]],
    items: list[Any],
    validate: Validate,
    max_drop: float,
    max_kept: int,
) -> list[str]:
    """The operations NNCF's accuracy-controlled quantization keeps in float so that ``validate``'s metric drops
    by at most ``max_drop`` from ``model``'s (none when its plain int8 already meets that; at most ``max_kept``
    reverting steps). ``model`` as ``to_int8_nncf`` takes it, with the same quantization settings, so that its
    names, given back as an ignored scope, rebuild the variant the control chose."""
    nncf = _nncf(feeds)
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    with tempfile.TemporaryDirectory(prefix="metainfer-nncf-") as tmp:
        controlled: onnx.ModelProto = nncf.quantize_with_accuracy_control(
            model,
            nncf.Dataset(feeds),
            nncf.Dataset(items),
            validate,
            max_drop=max_drop,
            **_settings(nncf, model, feeds),
            advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                max_num_iterations=max(1, max_kept), intermediate_model_dir=tmp
            ),
        )
        # The fully quantized model it started from: the operations quantized there and not in the result are
        # the ones it reverted.
        plain = onnx.load(str(Path(tmp, "intermediate_model.onnx")))
    reverted = quantized_operations(plain) - quantized_operations(controlled)
    return [n.name for n in model.graph.node if n.name in reverted]


def quantized_operations(model: onnx.ModelProto) -> set[str]:
    """Names of the operations that take an input through a DequantizeLinear (QDQ: the ones that run in int8)."""
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {
        n.name
        for n in model.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and any(i in dequantized for i in n.input)
    }


def _nncf(feeds: list[dict[str, np.ndarray]]) -> Any:
    if not feeds:
        raise InputError("data", "static int8 quantization needs at least one full calibration batch")
    return nncf_module()


def nncf_module() -> Any:
    """NNCF, imported quietly and without telemetry."""
    # NNCF reports usage to a web analytics service unless it believes it runs in CI; metainfer's pods talk to
    # nothing outside their cluster, and neither does a local adaptation.
    os.environ["NNCF_CI"] = "1"
    import nncf

    logging.getLogger("nncf").setLevel(logging.ERROR)
    return nncf


def _settings(nncf: Any, model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    transformer = any(n.op_type in ("Softmax", "LayerNormalization") for n in model.graph.node)
    return {
        "subset_size": len(feeds),
        "fast_bias_correction": True,
        "model_type": nncf.ModelType.TRANSFORMER if transformer else None,
    }


def feeds_of(calibration: Dataset, batch: int) -> list[dict[str, np.ndarray]]:
    """Full calibration batches, as NNCF's dataset items."""
    return [feed for feed, rows in calibration.batches(batch) if rows.stop - rows.start == batch]
