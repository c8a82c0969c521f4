"""Weight-only quantization: MatMul weights in 4 or 8 bits, activations float.

Two tools write it. ONNX Runtime's ``MatMulNBitsQuantizer`` replaces each MatMul with a constant weight by a
``MatMulNBits`` contrib op (blockwise scales along K, dequantized in the kernel; ``accuracy_level`` 4 lets the CPU
compute in int8), and with ``embeddings`` each embedding table's Gather by ``GatherBlockQuantized``; its
round-to-nearest is data-free, HQQ optimises each block's scale and zero point, and GPTQ corrects each column's
rounding error from the calibration samples' activations (both need torch). NNCF's ``compress_weights``
writes standard DequantizeLinear nodes over int4/int8 weights (opset 21), which OpenVINO turns into its own
compressed weights and ONNX Runtime also runs; with data it applies AWQ and scale estimation. By default NNCF
keeps the embedding and the last projection at 8 bits, which ONNX Runtime's quantizer leaves to ``keep_float``.

Both quantizers modify the model they are given in place; they get a copy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnx.version_converter

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.recipe import ORT_WEIGHT_METHODS, WEIGHT_METHODS, WeightSpec

# int4 initializers (and GatherBlockQuantized's, DequantizeLinear's int4 inputs) need opset 21 and IR 10.
INT4_OPSET = 21
# NNCF's ONNX backend quantizes per channel or per group only from opset 13.
NNCF_MIN_OPSET = 13


class WeightQuantizationFailed(RuntimeError):
    """The weight quantizer refused this graph: the candidate fails, the search goes on."""


def torch_available() -> bool:
    """ONNX Runtime's HQQ and its (vendored neural-compressor) GPTQ import torch; the knob offers them only where
    torch is, which the image is not, for their sake, made 1 GiB larger to carry."""
    return importlib.util.find_spec("torch") is not None


def available_weight_methods(*, nncf: bool, calibration: bool) -> tuple[str, ...]:
    """The weight methods this image and the run's data allow, in the knob's order."""
    torch = torch_available()
    allowed = {
        "rtn": True,
        "hqq": torch,
        "gptq": torch and calibration,
        "nncf": nncf,
        "nncf_awq": nncf and calibration,
    }
    return tuple(method for method in WEIGHT_METHODS if allowed[method])


def weight_matmuls(model: onnx.ModelProto) -> list[str]:
    """Names of the MatMul nodes whose second input is a constant 2-D weight: what weight-only quantization
    changes (and what its sensitivity scan ranks)."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    return [
        n.name
        for n in model.graph.node
        if n.op_type == "MatMul" and len(n.input) == 2 and len(shapes.get(n.input[1], ())) == 2
    ]


def embedding_tables(model: onnx.ModelProto) -> list[str]:
    """Names of the Gather nodes that index a constant 2-D table (token and position embeddings)."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "Gather" and len(shapes.get(n.input[0], ())) == 2]


def compress_weights(model: onnx.ModelProto, spec: WeightSpec, calibration: Dataset | None) -> onnx.ModelProto:
    """``model`` with its MatMul weights (and, if asked, embedding tables) quantized as ``spec`` says."""
    if not spec.bits:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if spec.method in ORT_WEIGHT_METHODS:
        return _with_onnxruntime(copy, spec, calibration)
    return _with_nncf(copy, spec, calibration)


def _at_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if current >= version:
        return model
    # The quantizers raise the opset number alone, without rewriting the ops whose form changed (Unsqueeze's
    # axes became an input in 13): the converter rewrites them.
    converted = onnx.version_converter.convert_version(model, version)
    converted.ir_version = max(converted.ir_version, 10 if version >= INT4_OPSET else 7)
    return converted


def _with_onnxruntime(model: onnx.ModelProto, spec: WeightSpec, calibration: Dataset | None) -> onnx.ModelProto:
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    ops = ("MatMul", "Gather") if spec.embeddings else ("MatMul",)
    if spec.embeddings:  # int4 Gather tables are ONNX int4 tensors; MatMulNBits packs its own bytes at any opset
        model = _at_opset(model, INT4_OPSET)
    config: Any
    if spec.method == "rtn":
        config = nbits.DefaultWeightOnlyQuantConfig(
            block_size=spec.block_size,
            is_symmetric=spec.symmetric,
            accuracy_level=spec.accuracy_level or None,
            op_types_to_quantize=ops,
            bits=spec.bits,
        )
    elif spec.method == "hqq":
        config = nbits.HQQWeightOnlyQuantConfig(block_size=spec.block_size, bits=spec.bits, op_types_to_quantize=ops)
    else:
        if calibration is None or calibration.n_samples == 0:
            raise InputError("data", "GPTQ weight quantization needs calibration samples")
        config = nbits.GPTQWeightOnlyQuantConfig(
            calibration_data_reader=_Feeds(calibration), block_size=spec.block_size, op_types_to_quantize=ops
        )
    quantizer = nbits.MatMulNBitsQuantizer(
        model,
        bits=spec.bits,
        block_size=spec.block_size,
        is_symmetric=spec.symmetric,
        accuracy_level=spec.accuracy_level or None,
        nodes_to_exclude=list(spec.keep_float),
        op_types_to_quantize=ops,
        algo_config=config,
    )
    try:
        with _quiet():
            quantizer.process()
    except Exception as exc:  # the quantizer's own assertion on a graph it does not expect
        raise WeightQuantizationFailed(
            f"ONNX Runtime's weight quantizer failed ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    quantized: onnx.ModelProto = quantizer.model.model
    if spec.accuracy_level:
        # ONNX Runtime's GPTQ and HQQ writers do not take the attribute; it is the kernel's choice, not theirs.
        for node in quantized.graph.node:
            if node.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in node.attribute):
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", spec.accuracy_level))
    return quantized


def _with_nncf(model: onnx.ModelProto, spec: WeightSpec, calibration: Dataset | None) -> onnx.ModelProto:
    from metainfer.core.engine.transforms.quantize import calibration_batch
    from metainfer.core.engine.transforms.quantize_nncf import feeds_of, nncf_module

    nncf = nncf_module()
    model = _at_opset(model, INT4_OPSET if spec.bits == 4 else NNCF_MIN_OPSET)
    sym = "SYM" if spec.symmetric else "ASYM"
    mode = getattr(nncf.CompressWeightsMode, f"INT{spec.bits}_{sym}")
    options: dict[str, Any] = {"mode": mode}
    if spec.bits == 4:
        # A layer whose input size the group does not divide gets the largest power of two below it that does
        # (at least 16), else 8 bits: ONNX Runtime's quantizer pads such a layer's last block instead.
        advanced = nncf.AdvancedCompressionParameters(
            group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST, min_adjusted_group_size=16
        )
        options |= {"group_size": spec.block_size, "ratio": spec.int4_percent / 100, "advanced_parameters": advanced}
    if spec.keep_float:
        options["ignored_scope"] = nncf.IgnoredScope(names=list(spec.keep_float), validate=False)
    if spec.method == "nncf_awq":
        if calibration is None:
            raise InputError("data", "NNCF's AWQ and scale estimation need calibration samples")
        feeds = feeds_of(calibration, calibration_batch(model, calibration))
        if not feeds:
            raise InputError("data", "NNCF's AWQ and scale estimation need at least one full calibration batch")
        options |= {"dataset": nncf.Dataset(feeds), "subset_size": len(feeds), "awq": True}
        options |= {"scale_estimation": spec.bits == 4}
    try:
        with _quiet():
            compressed: onnx.ModelProto = nncf.compress_weights(model, **options)
    except Exception as exc:
        raise WeightQuantizationFailed(
            f"NNCF could not compress this graph's weights ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    return compressed


class _Feeds:
    """The calibration samples one at a time, as ONNX Runtime's CalibrationDataReader."""

    def __init__(self, data: Dataset) -> None:
        self._feeds = [feed for feed, _ in data.batches(1)]
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self._feeds):
            return None
        self._next += 1
        return self._feeds[self._next - 1]

    def rewind(self) -> None:
        self._next = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:  # GPTQ iterates a deep copy of the reader
        return iter(self._feeds)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Both quantizers log a line per node at INFO and draw progress bars on stdout."""
    loggers = [logging.getLogger(name) for name in ("onnxruntime.quantization.matmul_nbits_quantizer", "nncf")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
