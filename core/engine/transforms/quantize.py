"""Quantization passes, all through ONNX Runtime's own quantization tooling.

Dynamic int8 computes activation scales at run time (no data needed; the
usual win for MatMul-heavy transformers). Static int8 writes QDQ pairs whose
scales come from calibration on the user's data (the usual win for conv nets,
which ORT then fuses into QLinearConv). fp16 keeps the graph's I/O in fp32 so a
variant is a drop-in replacement for the base model.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import logging
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import InputError
from metainfer.core.engine.recipe import QuantizationSpec

QUANT_TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
CALIBRATION_METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
# Dynamic quantization of convolutions yields ConvInteger, which ORT's CPU EP
# runs slower than float; dynamic mode therefore targets matrix products only.
DYNAMIC_OP_TYPES = ["MatMul", "Attention", "Gather", "EmbedLayerNormalization", "LSTM"]
CALIBRATION_BATCH = 8
# Batches per calibrator read; see _Reader for why this is one.
CALIBRATION_STRIDE_BATCHES = 1
# Fused contrib ops defeat ONNX shape inference; their outputs are float.
EXTRA = {"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT}


class _Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime ships no type information
    """Full calibration batches, served one stride at a time.

    ORT's histogram calibrators keep every intermediate tensor of everything
    one ``collect_data`` call reads before reducing it, so reading all samples
    at once needs (samples x activation bytes) of memory: 23.5 GB for VGG-19
    on 64 images. With ``CalibStridedMinMax`` ORT calls ``collect_data`` once
    per ``set_range`` window and merges the ranges (min/max) or histograms
    between windows, so memory is bounded by one batch whatever the sample count.
    """

    def __init__(self, data: Dataset, batch: int) -> None:
        self._feeds = [feed for feed, rows in data.batches(batch) if rows.stop - rows.start == batch]
        self._window: Iterator[dict[str, np.ndarray]] = iter(self._feeds)

    def __len__(self) -> int:
        return len(self._feeds)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._window = iter(self._feeds[start_index:end_index])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._window, None)

    def digest(self) -> bytes:
        """What the calibrator reads, as one hash: every batch's input names, dtypes, shapes and values."""
        h = hashlib.sha256()
        for feed in self._feeds:
            for name in sorted(feed):
                arr = np.ascontiguousarray(feed[name])
                h.update(f"{name}|{arr.dtype.str}|{arr.shape}".encode())
                h.update(arr.tobytes())
        return h.digest()


class CalibrationCache:
    """Calibration ranges already computed in this process, by everything ORT's calibrator reads.

    Calibration runs the graph over every sample and, for the histogram methods, bins every activation of every
    batch: about 40 s for a YOLOX-sized detector on 48 images on 2 cores, against about 2 s for the rest of a
    static build. The calibrator sees only the prepared graph, the samples, the method and the quantized types;
    per-channel weights, reduce_range, the QDQ/QOperator format and the nodes kept in float are applied after it.
    Trials differing only in those (most static int8 neighbours in a search) therefore reuse one calibration.
    ORT itself reads and writes the ranges (its ``calibration_cache_path``); the cache holds the JSON it wrote,
    so a reused build is byte-identical to a fresh one.
    """

    def __init__(self, max_entries: int = 8) -> None:
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._max_entries = max_entries
        self._lock = threading.Lock()  # a serving pod may build its variant off the main thread

    @staticmethod
    def key(graph: bytes, data: bytes, spec: QuantizationSpec) -> str:
        h = hashlib.sha256(graph)
        h.update(data)
        h.update(f"|{spec.calibration}|{spec.activation_type}|{spec.weight_type}".encode())
        return h.hexdigest()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
            return self._entries.get(key)

    def put(self, key: str, ranges: bytes) -> None:
        with self._lock:
            self._entries[key] = ranges
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


CALIBRATIONS = CalibrationCache()
# Versions of ORT whose quantize_static cannot read stored ranges calibrate every build.
_ORT_CACHES_CALIBRATION = "calibration_cache_path" in inspect.signature(quantize_static).parameters


def calibration_batch(model: onnx.ModelProto, data: Dataset) -> int:
    """Batches of CALIBRATION_BATCH, unless the model fixes its batch dimension (then that), or takes one sample
    without a samples axis (then 1)."""
    if data.one_sample_per_run:
        return 1
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name in initializers or value.name in data.unbatched:  # a setting's first axis is not the batch
            continue
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            return int(dims[0].dim_value)
    return CALIBRATION_BATCH


def to_fp16(model: onnx.ModelProto, keep_float: tuple[str, ...]) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    converted = convert_float_to_float16(model, keep_io_types=True, node_block_list=list(keep_float) or None)
    # The converter appends its Cast nodes at the end of the node list; ONNX requires topological order.
    wrapped = OnnxModel(converted)
    wrapped.topological_sort()
    sorted_model: onnx.ModelProto = wrapped.model
    return sorted_model


# QDQ with per-channel (1-D) scales and int8 zero points is only valid from opset 13.
QDQ_MIN_OPSET = 13


def _at_least_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    """The model upgraded to ``version`` when it is older (node names are kept, so mixed precision still applies)."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if current >= version:
        return model
    return _initializers_not_inputs(onnx.version_converter.convert_version(model, version))


# The IR version that the opset QDQ needs (13) requires; IR 4 is the first where initializers need not be inputs.
_IR_FOR_QDQ = 7


def _initializers_not_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop initializers from the graph's inputs, as IR 4 and later allow.

    Old (IR 3) exports list every weight among the inputs, and the upgrade to
    the QDQ opset keeps them there. ORT's pre-processing then folds constant
    subgraphs (ConstantOfShape weights, Unsqueezed scales) but leaves their
    names among the inputs, so the calibration session asks the caller to feed
    them ("Required inputs ... are missing": Inception v2 from the model zoo).
    A weight is not something a caller feeds, so the quantizer gets a graph
    where it is only an initializer.
    """
    weights = {t.name for t in model.graph.initializer}
    kept = [v for v in model.graph.input if v.name not in weights]
    if len(kept) != len(model.graph.input):
        del model.graph.input[:]
        model.graph.input.extend(kept)
    model.ir_version = max(model.ir_version, _IR_FOR_QDQ)
    return model


class _QuietThread(logging.Filter):
    """Drops one thread's records below ERROR. Raising the root logger's level instead silenced every thread for
    the whole build: serve's "SIGTERM received" and its drain went unlogged when a signal came during the load."""

    def __init__(self, thread: int) -> None:
        super().__init__()
        self.thread = thread

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread or record.levelno >= logging.ERROR


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ORT's quantizer prints calibration chatter and logs advice on the root logger, from the building thread."""
    root = logging.getLogger()
    quiet = _QuietThread(threading.get_ident())
    root.addFilter(quiet)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.removeFilter(quiet)


def _has_convs(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "Conv" for n in model.graph.node)


def prepared_for_static_int8(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as static int8 quantizers take it: at the QDQ opset and, when it has convolutions, pre-processed."""
    model = _at_least_opset(model, QDQ_MIN_OPSET)
    if not _has_convs(model):
        return model
    with tempfile.TemporaryDirectory(prefix="metainfer-q-") as tmp, _quiet(), contextlib.chdir(tmp):
        _pre_process(Path(tmp, "in.onnx"), model, Path(tmp, "prepared.onnx"))
        return onnx.load(str(Path(tmp, "prepared.onnx")))


def _pre_process(src: Path, model: onnx.ModelProto, prepared: Path) -> None:
    # Fold BatchNormalization into Conv and constant-produced weights into initializers before the quantizer sees
    # the graph (ORT's "pre-processing", basic-level rewrites only, so the result is the same on every machine).
    # Without it, weights computed by Constant/ConstantOfShape nodes get activation-style QDQ and every BN sits in
    # float between a conv and its ReLU, so the CPU runs QuantizeLinear/DequantizeLinear islands instead of fused
    # integer convolutions: 0.98x instead of 1.42x on ResNet-50 at batch 1.
    from onnxruntime.quantization.shape_inference import quant_pre_process

    onnx.save(model, src)
    quant_pre_process(src, prepared, skip_symbolic_shape=True)


def to_int8(model: onnx.ModelProto, spec: QuantizationSpec, calibration: Dataset | None) -> onnx.ModelProto:
    if spec.quantizer == "nncf":
        if calibration is None:
            raise InputError("data", "static int8 quantization needs calibration samples")
        from metainfer.core.engine.transforms.quantize_nncf import feeds_of, to_int8_nncf

        prepared = prepared_for_static_int8(model)
        return to_int8_nncf(prepared, spec, feeds_of(calibration, calibration_batch(model, calibration)))
    if spec.mode == "int8_static":
        model = _at_least_opset(model, QDQ_MIN_OPSET)
    # chdir: ORT's quantizer and shape inference drop debug files into the working directory.
    with tempfile.TemporaryDirectory(prefix="metainfer-q-") as tmp, _quiet(), contextlib.chdir(tmp):
        src, dst = Path(tmp, "in.onnx"), Path(tmp, "out.onnx")
        onnx.save(model, src)
        if spec.mode == "int8_static" and _has_convs(model):
            src = Path(tmp, "prepared.onnx")
            _pre_process(Path(tmp, "in.onnx"), model, src)
        common = {
            "per_channel": spec.per_channel,
            "reduce_range": spec.reduce_range,
            "weight_type": QUANT_TYPES[spec.weight_type],
            "nodes_to_exclude": list(spec.keep_float) or None,
        }
        if spec.mode == "int8_dynamic":
            quantize_dynamic(src, dst, op_types_to_quantize=DYNAMIC_OP_TYPES, **common, extra_options=EXTRA)
        else:
            if calibration is None:
                raise InputError("data", "static int8 quantization needs calibration samples")
            reader = _Reader(calibration, calibration_batch(model, calibration))
            if len(reader) == 0:
                raise InputError(
                    "data",
                    f"static int8 quantization needs at least one full calibration batch of "
                    f"{calibration_batch(model, calibration)} samples; got {calibration.n_samples}",
                )
            cached = Path(tmp, "calibration.json")
            key = CalibrationCache.key(src.read_bytes(), reader.digest(), spec)
            ranges = CALIBRATIONS.get(key) if _ORT_CACHES_CALIBRATION else None
            if ranges is not None:
                cached.write_bytes(ranges)
            cache_option = {"calibration_cache_path": cached} if _ORT_CACHES_CALIBRATION else {}
            try:
                quantize_static(
                    src,
                    dst,
                    reader,
                    **cache_option,
                    quant_format=QuantFormat.QOperator if spec.format == "qoperator" else QuantFormat.QDQ,
                    activation_type=QUANT_TYPES[spec.activation_type],
                    calibrate_method=CALIBRATION_METHODS[spec.calibration],
                    **common,
                    extra_options={**EXTRA, "CalibStridedMinMax": CALIBRATION_STRIDE_BATCHES},
                )
            except ValueError as exc:
                if spec.calibration == "minmax" or "bins" not in str(exc):
                    raise
                # numpy cannot bin a tensor whose values are all equal at a magnitude where float32
                # has no room for 2048 distinct edges; only min/max calibration copes with it.
                raise ValueError(
                    f"{spec.calibration} calibration failed: a calibration batch has an activation with a "
                    f"single huge value, which ORT's histogram cannot bin ({exc}); minmax calibration works"
                ) from exc
            if ranges is None and cached.is_file():
                CALIBRATIONS.put(key, cached.read_bytes())
        return onnx.load(str(dst))
