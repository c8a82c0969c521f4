"""The runtime knob (ONNX Runtime or OpenVINO) and OpenVINO's own compile knobs: performance hint, streams and
inference precision. OpenVINO's thread count is the session area's thread knob (``intra_op_num_threads``).

OpenVINO is offered where the profile found that it compiles a model on this node. Its rules keep it to the
variants its ONNX frontend reads as plain ONNX: FP32 and static int8 in QDQ form with signed weights (which it
runs with its own int8 kernels), unfused or with the conv rewrite, NCHW, unpadded. The ONNX Runtime-only settings
(execution provider, optimization level, execution mode) are pinned to their first choice on it, and OpenVINO's
knobs to theirs on ONNX Runtime, so no two allowed points build the same recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from metainfer.core.engine.knobs.base import ChoiceList, Knob, SpaceContext, UpTo, as_int, point_rule
from metainfer.core.engine.recipe import OpenVinoHint, OpenVinoPrecision, Runtime

if TYPE_CHECKING:
    from metainfer.core.engine.knobs.base import Predicate
    from metainfer.core.engine.search.space import Point, Scalar

# The variants OpenVINO is searched with (see the module docstring for why).
OPENVINO_QUANTIZATION = ("fp32", "int8_static")
OPENVINO_FUSIONS = ("none", "conv")
# CPU features with which OpenVINO's CPU plugin computes bf16 natively (elsewhere it quietly stays f32).
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def _runtime_values(context: SpaceContext) -> tuple[Scalar, ...]:
    openvino = context.profile.openvino
    if openvino.usable:
        return ("onnxruntime", "openvino")
    context.notes.append(f"runtime openvino left out: {openvino.unusable_reason}")
    return ("onnxruntime",)


def _openvino_reads_the_variant(context: SpaceContext) -> Predicate:
    """OpenVINO runs plain-ONNX variants on its CPU device, with the ONNX Runtime-only settings at their defaults."""

    def allowed(p: Point) -> bool:
        if p["runtime"] != "openvino":
            return True
        return (
            p["execution_provider"] == "CPUExecutionProvider"
            and p["quantization"] in OPENVINO_QUANTIZATION
            and p["quant_format"] == "qdq"
            # Its CPU plugin has no convolution for uint8 weights (no implementation found, at compile time).
            and p["weight_type"] == "int8"
            and p["fusion"] in OPENVINO_FUSIONS
            and p["layout"] == "NCHW"
            and p["padding"] == "keep"
            and p["graph_optimization_level"] == "all"
            and p["execution_mode"] == "sequential"
        )

    return allowed


RUNTIME = Knob(
    name="runtime",
    values=_runtime_values,
    recipe_field="session.runtime",
    # Which runtime wins depends on the model and the machine (fused activations, kernel choice): the prior has
    # no side to take, only that the question is worth an early measurement.
    spread=0.3,
    rules=(_openvino_reads_the_variant,),
    backfill=("onnxruntime",),  # points recorded before the knob existed ran on ONNX Runtime
    override=ChoiceList("runtimes", 90, Runtime, max_items=2, description="Inference runtimes to try."),
)


def _only_with_openvino(values: tuple[Scalar, ...]) -> Callable[[SpaceContext], tuple[Scalar, ...]]:
    """An OpenVINO knob's choices where OpenVINO is offered; elsewhere only its first, so a space without
    OpenVINO is the same size as before these knobs existed."""

    def choices(context: SpaceContext) -> tuple[Scalar, ...]:
        return values if context.profile.openvino.usable else values[:1]

    return choices


@point_rule
def _hint_needs_openvino(p: Point) -> bool:
    return p["runtime"] == "openvino" or p["openvino_hint"] == "latency"


OPENVINO_HINT = Knob(
    name="openvino_hint",
    values=_only_with_openvino(("latency", "throughput")),
    recipe_field="session.openvino.performance_hint",
    spread=0.05,
    # The objective is one request's p95: the throughput hint splits the cores between streams.
    effects={"latency": 0.0, "throughput": -0.1},
    rules=(_hint_needs_openvino,),
    backfill=("latency",),
    override=ChoiceList(
        "openvino_hints", 100, OpenVinoHint, max_items=2, description="OpenVINO performance hints to try."
    ),
)


def _stream_values(context: SpaceContext) -> tuple[Scalar, ...]:
    cores = context.profile.machine.physical_cores
    return _only_with_openvino(tuple(sorted({0, 1, max(1, cores // 2), cores})))(context)


@point_rule
def _streams_under_throughput(p: Point) -> bool:
    """The latency hint runs one stream; a stream count only means something under the throughput hint."""
    return p["openvino_streams"] == 0 or (p["runtime"] == "openvino" and p["openvino_hint"] == "throughput")


OPENVINO_STREAMS = Knob(
    name="openvino_streams",
    values=_stream_values,
    recipe_field="session.openvino.num_streams",
    spread=0.05,
    cast=as_int,
    rules=(_streams_under_throughput,),
    backfill=(0,),
    override=UpTo(
        "max_openvino_streams", 110, maximum=64, description="OpenVINO: at most this many inference streams."
    ),
)


def _precision_values(context: SpaceContext) -> tuple[Scalar, ...]:
    native_bf16 = bool(BF16_FLAGS & set(context.profile.machine.cpu_flags))
    return _only_with_openvino(("f32", "bf16") if native_bf16 else ("f32",))(context)


@point_rule
def _precision_needs_openvino(p: Point) -> bool:
    """bf16 compute is OpenVINO's here; on ONNX Runtime the numeric format is the quantization knob's."""
    return p["runtime"] == "openvino" or p["openvino_precision"] == "f32"


OPENVINO_PRECISION = Knob(
    name="openvino_precision",
    values=_precision_values,
    recipe_field="session.openvino.inference_precision",
    spread=0.2,
    effects={"f32": 0.0, "bf16": 0.1},
    rules=(_precision_needs_openvino,),
    backfill=("f32",),
    override=ChoiceList(
        "openvino_precisions", 120, OpenVinoPrecision, max_items=2, description="OpenVINO inference precisions."
    ),
)


# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (RUNTIME, OPENVINO_HINT, OPENVINO_STREAMS, OPENVINO_PRECISION)
