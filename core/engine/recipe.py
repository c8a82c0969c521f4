"""The recipe: one point of the joint model x runtime search space, made concrete.

A recipe is deterministic: the base model's sha256 plus the recipe's
``transform`` part always yield the same variant bytes, so a serving pod can
rebuild a variant instead of fetching it. The ``session`` part does not touch
the bytes; it names the runtime (ONNX Runtime or OpenVINO) and the settings it
is loaded with.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    computed_field,
    model_serializer,
    model_validator,
)

QuantizationMode = Literal["fp32", "fp16", "int8_dynamic", "int8_static"]
# The numeric formats, and those that run integer kernels: defined once, here, for every module that asks.
QUANTIZATION_MODES: tuple[str, ...] = get_args(QuantizationMode)
INT8_MODES: tuple[str, ...] = ("int8_dynamic", "int8_static")
GraphOptimizationLevel = Literal["disable", "basic", "extended", "all"]
Layout = Literal["NCHW", "NHWC"]
ExecutionMode = Literal["sequential", "parallel"]
GraphFusion = Literal["none", "transformer", "conv"]
Padding = Literal["keep", "remove"]
# The inference runtimes a variant can be loaded by; each has its own session settings.
Runtime = Literal["onnxruntime", "openvino"]
OpenVinoHint = Literal["latency", "throughput"]
OpenVinoPrecision = Literal["f32", "bf16"]
# Execution-provider options (session.ep), each in ONNX Runtime's own spelling where it has one.
CudnnConvAlgoSearch = Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"]
ArenaExtendStrategy = Literal["kNextPowerOfTwo", "kSameAsRequested"]
OpenVinoEpPrecision = Literal["FP32", "FP16", "ACCURACY"]
# Which tool writes a static int8 variant: ONNX Runtime's quantizer, or NNCF's ONNX backend (its own range
# estimators, bias correction and which ops to quantize); both write QDQ ONNX that either runtime loads.
Quantizer = Literal["onnxruntime", "nncf"]
# Spelled-out activations (Erf GELU, x * HardSigmoid(x), x * Sigmoid(x)) kept as exported, or written as one
# operator each (core.engine.transforms.activations).
Activations = Literal["keep", "fused"]
# Weight-only quantization (activations stay float): 0 keeps float weights. Methods: ONNX Runtime's MatMulNBits
# quantizer, round-to-nearest ("rtn", its default), half-quadratic ("hqq", needs torch) or data-aware ("gptq", its
# vendored implementation); NNCF's compress_weights, data-free ("nncf") or with AWQ and scale estimation on the
# calibration samples ("nncf_awq").
WeightBits = Literal[0, 4, 8]
WeightMethod = Literal["rtn", "hqq", "gptq", "nncf", "nncf_awq"]
WEIGHT_METHODS: tuple[str, ...] = get_args(WeightMethod)
ORT_WEIGHT_METHODS: tuple[str, ...] = ("rtn", "hqq", "gptq")
WeightBlock = Literal[32, 64, 128]
# NNCF's int4 share of the weights it compresses, in percent (the rest at 8 bits, the least sensitive by its own
# metric chosen for 4): 100 all, 80 and 60 keep its most sensitive fifth or two fifths at 8 bits.
WeightInt4Percent = Literal[100, 80, 60]
# The sensitivity ranking of MatMuls under 4-bit weights, whose top a mixed point keeps in float.
WEIGHT_RANKING = "int4_weights"

ORT_GRAPH_OPTIMIZATION_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
ORT_EXECUTION_MODES: dict[str, str] = {"sequential": "ORT_SEQUENTIAL", "parallel": "ORT_PARALLEL"}
# What Recipe computes from its fields: written beside them for people and tools, never part of its identity.
COMPUTED_FIELDS = frozenset({"session_options", "providers"})
DERIVED_FIELDS = COMPUTED_FIELDS | {
    "base_sha256", "variant_sha256", "transform_key", "recipe_key", "batch_dependent"
}  # fmt: skip


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QuantizationSpec(_Frozen):
    """How weights and activations are stored and computed."""

    mode: QuantizationMode = Field("fp32", description="Numeric format of the variant.")
    per_channel: bool = Field(False, description="Per-output-channel weight scales (int8 modes).")
    weight_type: Literal["int8", "uint8"] = Field("int8", description="Integer type of quantized weights.")
    activation_type: Literal["uint8", "int8"] = Field(
        "uint8", description="Integer type of activations (static QDQ only)."
    )
    calibration: Literal["minmax", "entropy", "percentile"] = Field(
        "minmax", description="Calibration method for static quantization."
    )
    reduce_range: bool = Field(False, description="7-bit weights, for CPUs without VNNI.")
    format: Literal["qdq", "qoperator"] = Field(
        "qdq",
        description="Static int8 graph form: QuantizeLinear/DequantizeLinear pairs that each execution provider"
        " fuses its own way, or ONNX Runtime's integer operators (QLinearConv...) written directly, which its CPU"
        " kernels run with fewer float islands between convolutions.",
    )
    keep_float: tuple[str, ...] = Field(
        (), description="Node names kept in float (mixed precision: the most sensitive layers)."
    )
    quantizer: Quantizer = Field(
        "onnxruntime",
        description="The tool that writes a static int8 variant: ONNX Runtime's quantizer (its scales, types and"
        " calibration are the fields above), or NNCF, which chooses them itself (symmetric per-channel weights,"
        " its own activation ranges and bias correction).",
    )

    @model_validator(mode="after")
    def _nncf_writes_static_qdq(self) -> QuantizationSpec:
        if self.quantizer == "nncf" and (self.mode != "int8_static" or self.format != "qdq"):
            raise ValueError("quantizer nncf writes static int8 in QDQ form: mode int8_static, format qdq")
        return self

    @model_serializer(mode="wrap")
    def _omit_default_quantizer(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out at its default, so every variant built before NNCF was a choice keeps its provenance stamp,
        # its bytes and its sha256 (serving pods rebuild variants and compare the sha256 the run validated).
        data: dict[str, Any] = handler(self)
        if data.get("quantizer") == "onnxruntime":
            del data["quantizer"]
        return data


class WeightSpec(_Frozen):
    """Weight-only quantization: MatMul weights (and optionally embedding tables) stored in 4 or 8 bits, blockwise,
    while activations stay float. What makes a model fit a small node's memory, and what speeds up memory-bound
    runs (batch 1, large tables) where the kernels dequantize on the fly."""

    bits: WeightBits = Field(0, description="Bits per weight; 0 keeps float weights.")
    method: WeightMethod = Field("rtn", description="Who quantizes and how (see WeightMethod).")
    block_size: WeightBlock = Field(128, description="Weights sharing one scale (and zero point), along K.")
    symmetric: bool = Field(False, description="Symmetric blocks (no zero points).")
    accuracy_level: Literal[0, 4] = Field(
        0, description="ONNX Runtime's MatMulNBits accuracy_level: 4 computes in int8 where the CPU has it."
    )
    embeddings: bool = Field(False, description="Embedding tables (Gather) to 4-bit GatherBlockQuantized too.")
    keep_float: tuple[str, ...] = Field((), description="MatMul nodes left in float (the most sensitive).")
    int4_percent: WeightInt4Percent = Field(
        100, description="NNCF int4: the share of compressed weights in 4 bits, the rest (its most sensitive) at 8."
    )

    @model_validator(mode="after")
    def _consistent(self) -> WeightSpec:
        if self.bits == 0:
            defaults = (self.method, self.block_size, self.symmetric, self.accuracy_level, self.embeddings)
            if defaults != ("rtn", 128, False, 0, False) or self.int4_percent != 100 or self.keep_float:
                raise ValueError("weights: bits 0 keeps float weights; leave the other weight fields at their defaults")
            return self
        ort = self.method in ORT_WEIGHT_METHODS
        if self.method in ("hqq", "gptq", "nncf_awq") and self.bits != 4:
            raise ValueError(f"weights: method {self.method} writes 4-bit weights only")
        if self.accuracy_level and not ort:
            raise ValueError("weights: accuracy_level is ONNX Runtime's MatMulNBits attribute; NNCF writes DQ nodes")
        if self.embeddings and (self.method != "rtn" or self.bits != 4):
            raise ValueError("weights: embedding tables are quantized by method rtn at 4 bits (GatherBlockQuantized)")
        if self.method == "gptq" and not self.symmetric:
            raise ValueError("weights: ONNX Runtime's gptq writes symmetric blocks; set symmetric")
        if self.int4_percent != 100 and (ort or self.bits != 4):
            raise ValueError("weights: int4_percent is NNCF's share of int4 weights: method nncf or nncf_awq, 4 bits")
        return self


class TransformSpec(_Frozen):
    """Everything that changes the variant's bytes."""

    quantization: QuantizationSpec = QuantizationSpec()
    weights: WeightSpec = Field(
        WeightSpec(), description="Weight-only quantization, applied after every other transform (fp32 mode only)."
    )
    fusion: GraphFusion = Field(
        "none",
        description=(
            "Offline graph rewrite applied before quantization: 'transformer' fuses attention and layer norms;"
            " 'conv' writes Sum as Add (so residual joins quantize) and decomposes LRN into vectorised ops."
        ),
    )
    layout: Layout = Field("NCHW", description="Activation layout of convolutions.")
    padding: Padding = Field(
        "keep",
        description=(
            "'remove': token-wise layers run on real tokens only and attention per sequence "
            "(needs transformer fusion and an attention-mask input); outputs at padded positions are zeros."
        ),
    )
    activations: Activations = Field(
        "keep",
        description="'fused': GELU spelled out with Erf, x * HardSigmoid(x) and x * Sigmoid(x) written as one"
        " operator each (Gelu, HardSwish, QuickGelu), before quantization, so a quantizer does not split them.",
    )

    @model_validator(mode="after")
    def _padding_needs_fusion(self) -> TransformSpec:
        if self.padding == "remove" and self.fusion != "transformer":
            raise ValueError("padding 'remove' works on the fused graph: set fusion to 'transformer'")
        if self.weights.bits and self.quantization.mode != "fp32":
            raise ValueError("weight-only quantization keeps activations float: quantization mode must be fp32")
        return self

    @model_serializer(mode="wrap")
    def _omit_default_activations(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out at their defaults, as QuantizationSpec.quantizer is: existing variants keep their bytes.
        data: dict[str, Any] = handler(self)
        if data.get("activations") == "keep":
            del data["activations"]
        if data.get("weights") == _FLOAT_WEIGHTS:
            del data["weights"]
        return data


_FLOAT_WEIGHTS = WeightSpec().model_dump(mode="json")


class OpenVinoSpec(_Frozen):
    """OpenVINO compile settings (``session.runtime: openvino``): applied at load time, bytes unchanged."""

    performance_hint: OpenVinoHint = Field(
        "latency", description="OpenVINO's PERFORMANCE_HINT: one request as fast as possible, or many at once."
    )
    num_streams: int = Field(0, ge=0, le=64, description="Parallel inference streams; 0 lets the hint decide.")
    inference_precision: OpenVinoPrecision = Field(
        "f32", description="INFERENCE_PRECISION_HINT: bf16 only where the CPU computes it natively."
    )


class ExecutionProviderOptions(_Frozen):
    """The options of the accelerator EPs that make them fast, passed to the EP the recipe names (and only to it):
    CUDA's cuDNN convolution algorithm search, TF32 and arena growth; TensorRT's FP16 kernels and builder effort;
    the OpenVINO EP's inference precision and streams. Each default is ONNX Runtime's own, so a recipe that sets
    none loads as before these options existed."""

    cuda_cudnn_conv_algo_search: CudnnConvAlgoSearch = "EXHAUSTIVE"
    cuda_use_tf32: bool = True
    cuda_arena_extend_strategy: ArenaExtendStrategy = "kNextPowerOfTwo"
    tensorrt_fp16: bool = False
    tensorrt_builder_optimization_level: int = Field(3, ge=0, le=5)
    openvino_precision: OpenVinoEpPrecision = "FP32"
    openvino_num_streams: int = Field(1, ge=1, le=64)

    def for_provider(self, provider: str) -> dict[str, str]:
        """``provider``'s options as ONNX Runtime takes them (strings); empty for any other EP."""
        if provider == "CUDAExecutionProvider":
            return {
                "cudnn_conv_algo_search": self.cuda_cudnn_conv_algo_search,
                "use_tf32": str(int(self.cuda_use_tf32)),
                "arena_extend_strategy": self.cuda_arena_extend_strategy,
            }
        if provider == "TensorrtExecutionProvider":
            return {
                "trt_fp16_enable": str(self.tensorrt_fp16).lower(),
                "trt_builder_optimization_level": str(self.tensorrt_builder_optimization_level),
            }
        if provider == "OpenVINOExecutionProvider":
            return {"device_type": "CPU", "precision": self.openvino_precision,
                    "num_streams": str(self.openvino_num_streams)}  # fmt: skip
        return {}


_DEFAULT_EP_OPTIONS = ExecutionProviderOptions().model_dump(mode="json")


class SessionSpec(_Frozen):
    """How the variant is loaded: the runtime and its settings, applied at load time, bytes unchanged.

    The ONNX Runtime fields (execution provider, optimization level, execution mode) apply to ``onnxruntime``;
    the thread count to both (OpenVINO's INFERENCE_NUM_THREADS); ``openvino`` to ``openvino``.
    """

    runtime: Runtime = Field("onnxruntime", description="The inference runtime that loads the variant.")
    openvino: OpenVinoSpec = OpenVinoSpec()
    execution_provider: str = "CPUExecutionProvider"
    ep: ExecutionProviderOptions = Field(
        ExecutionProviderOptions(), description="Options of the execution provider named above (and of no other)."
    )
    graph_optimization_level: GraphOptimizationLevel = "all"
    intra_op_num_threads: int = Field(0, ge=0, description="Threads of one run, on either runtime; 0 lets it decide.")
    inter_op_num_threads: int = Field(0, ge=0, description="0 lets ONNX Runtime decide.")
    execution_mode: ExecutionMode = "sequential"

    @model_validator(mode="after")
    def _openvino_runs_on_its_cpu_device(self) -> SessionSpec:
        # OpenVINO picks its own kernels on its CPU device; an ONNX Runtime EP means nothing to it, and a recipe
        # naming both would be measured on one and described as the other.
        if self.runtime == "openvino" and self.execution_provider != "CPUExecutionProvider":
            raise ValueError(
                f"runtime 'openvino' runs on OpenVINO's CPU device: execution_provider must be CPUExecutionProvider,"
                f" not {self.execution_provider!r}"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_default_ep_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Left out at ONNX Runtime's defaults, as QuantizationSpec.quantizer is: a CPU recipe reads as it did
        # before EP options were knobs, in recipe.json and in every run's status.
        data: dict[str, Any] = handler(self)
        if data.get("ep") == _DEFAULT_EP_OPTIONS:
            del data["ep"]
        return data


class Recipe(_Frozen):
    """A complete, reproducible adaptation of one base model to one hardware class."""

    transform: TransformSpec = TransformSpec()
    session: SessionSpec = SessionSpec()
    batch: int = Field(1, ge=1, description="Batch size the variant is measured and served at.")

    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, data: Any) -> Any:
        # recipe.json carries derived fields (session_options, providers, hashes) for
        # humans and other tools; they are recomputed, never trusted, on the way in.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in DERIVED_FIELDS}
        return data

    @computed_field  # type: ignore[prop-decorator]  # mypy rejects decorators over @property; pydantic documents this
    @property
    def session_options(self) -> dict[str, Any]:
        """ONNX Runtime ``SessionOptions`` attribute names and values."""
        return {
            "graph_optimization_level": ORT_GRAPH_OPTIMIZATION_LEVELS[self.session.graph_optimization_level],
            "intra_op_num_threads": self.session.intra_op_num_threads,
            "inter_op_num_threads": self.session.inter_op_num_threads,
            "execution_mode": ORT_EXECUTION_MODES[self.session.execution_mode],
        }

    @computed_field  # type: ignore[prop-decorator]  # mypy rejects decorators over @property; pydantic documents this
    @property
    def providers(self) -> list[str]:
        fallback = ["CPUExecutionProvider"]
        ep = self.session.execution_provider
        return [ep] if ep in fallback else [ep, *fallback]

    def provider_options(self) -> list[dict[str, str]]:
        """ONNX Runtime's ``provider_options``, one dict per entry of ``providers`` (not written beside the fields:
        ``session.ep`` says it, and a CPU recipe's JSON stays as it was)."""
        return [self.session.ep.for_provider(p) for p in self.providers]

    def batch_dependent(self) -> bool:
        """Whether a sample's outputs depend on the other samples of its run: dynamic int8 quantizes each run's
        activations with one scale computed from all of its rows, so a request served in a run with others gets
        (slightly) different outputs than alone. Validation measures by how much; ``serve --batch-dependent
        isolate`` runs such a variant's requests one per run."""
        return self.transform.quantization.mode == "int8_dynamic"

    def transform_key(self) -> str:
        """Short hash of the byte-changing part: equal keys mean equal variants."""
        return _short_hash(self.transform.model_dump(mode="json"))

    def key(self) -> str:
        """Short hash of the whole recipe (variant plus session settings plus batch).

        The runtime's fields join the hash only when they differ from ONNX Runtime's defaults, so every recipe
        made before OpenVINO was a choice keeps its key (the operator compares keys to decide on rollouts).
        """
        data = self.model_dump(mode="json", exclude=set(COMPUTED_FIELDS))
        session = data["session"]
        if self.session.runtime == "onnxruntime":
            del session["runtime"]
        if self.session.openvino == OpenVinoSpec():
            del session["openvino"]
        return _short_hash(data)

    def describe(self) -> str:
        """The recipe in words, for people: progress lines, tables, logs, status.

        Settings left at their defaults are not named, apart from the numeric
        format and the thread count, which every reader asks about; e.g.
        "int8 static per-tensor, 1 thread" or "FP32, default threads".
        """
        q = self.transform.quantization
        head = {"fp32": "FP32", "fp16": "FP16", "int8_dynamic": "int8 dynamic", "int8_static": "int8 static"}[q.mode]
        parts: list[str] = []
        if q.quantizer == "nncf":
            head += " (NNCF)"  # NNCF chooses scales, types and ranges itself: the fields below are not its
        elif q.mode in INT8_MODES:
            head += " per-channel" if q.per_channel else " per-tensor"
            if q.weight_type != "int8":
                parts.append(f"{q.weight_type} weights")
            if q.reduce_range:
                parts.append("7-bit weights")
            if q.mode == "int8_static":
                if q.activation_type != "uint8":
                    parts.append(f"{q.activation_type} activations")
                if q.calibration != "minmax":
                    parts.append(f"{q.calibration} calibration")
                if q.format != "qdq":
                    parts.append("integer operators (QOperator)")
        w = self.transform.weights
        if w.bits:
            head += f" with int{w.bits} weights ({_describe_weights(w)})"
        if q.mode in INT8_MODES and q.keep_float:
            n = len(q.keep_float)
            parts.append(f"{n} sensitive layer{'s' if n > 1 else ''} kept in float")
        if self.transform.fusion != "none":
            parts.append(f"{self.transform.fusion} fusion")
        if self.transform.activations == "fused":
            parts.append("fused activations")
        if self.transform.padding == "remove":
            parts.append("padding removed")
        if self.transform.layout != "NCHW":
            parts.append(f"{self.transform.layout} layout")
        s = self.session
        threads = s.intra_op_num_threads
        parts.append(f"{threads} thread{'s' if threads > 1 else ''}" if threads else "default threads")
        if s.execution_mode != "sequential":
            inter = s.inter_op_num_threads
            parts.append(f"{s.execution_mode} execution" + (f" on {inter} inter-op threads" if inter else ""))
        if s.graph_optimization_level != "all":
            level = s.graph_optimization_level
            parts.append("no graph optimizations" if level == "disable" else f"{level} graph optimizations only")
        if s.execution_provider != "CPUExecutionProvider":
            parts.append(f"on {s.execution_provider.removesuffix('ExecutionProvider')}")
        if s.runtime == "openvino":
            parts.append(_describe_openvino(s.openvino))
        if self.batch > 1:
            parts.append(f"batch {self.batch}")
        return ", ".join([head, *parts])


def _describe_weights(w: WeightSpec) -> str:
    method = {"rtn": "RTN", "hqq": "HQQ", "gptq": "GPTQ", "nncf": "NNCF", "nncf_awq": "NNCF AWQ"}[w.method]
    details = [method, f"block {w.block_size}", "symmetric" if w.symmetric else "asymmetric"]
    if w.accuracy_level:
        details.append(f"accuracy level {w.accuracy_level}")
    if w.embeddings:
        details.append("embeddings too")
    if w.int4_percent != 100:
        details.append(f"{w.int4_percent} % in 4 bits, the rest in 8")
    if w.keep_float:
        details.append(f"{len(w.keep_float)} kept in float")
    return ", ".join(details)


def _describe_openvino(ov: OpenVinoSpec) -> str:
    settings = [f"{ov.performance_hint} hint"]
    if ov.num_streams:
        settings.append(f"{ov.num_streams} stream{'s' if ov.num_streams > 1 else ''}")
    if ov.inference_precision != "f32":
        settings.append(f"{ov.inference_precision} compute")
    return f"on OpenVINO ({', '.join(settings)})"


def _short_hash(obj: Any) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
