"""Quantization knobs: numeric format, int8 scales and types, calibration, mixed precision.

Their rules prune what the hardware profile says cannot run (or runs emulated,
or through a type variant far slower than another) before any evaluation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from metainfer.core.engine.knobs.base import (
    COMPUTE_OPS,
    CONTROL_FLOW_OPS,
    DEFAULT_SPREAD,
    INT8_COMPUTE_OPS,
    INT8_DYNAMIC_OPS,
    INT8_STATIC_CONV_OPS,
    INT8_STATIC_OPS,
    SLOW_VARIANT_FACTOR,
    ChoiceList,
    Knob,
    SpaceContext,
    UpTo,
    as_int,
    is_int8,
    point_rule,
)
from metainfer.core.engine.knobs.quantizer import ranking_key
from metainfer.core.engine.profile.types import Dtype, HardwareProfile, int8_variant
from metainfer.core.engine.recipe import INT8_MODES, QUANTIZATION_MODES, QuantizationMode

if TYPE_CHECKING:
    from metainfer.core.engine.knobs.base import Predicate, RankedLayers
    from metainfer.core.engine.modelinfo import ModelInfo
    from metainfer.core.engine.search.prior import SearchContext
    from metainfer.core.engine.search.space import Point, Scalar


def _quantization_values(context: SpaceContext) -> tuple[Scalar, ...]:
    modes: tuple[Scalar, ...] = QUANTIZATION_MODES
    if not set(context.model.op_counts) & (INT8_COMPUTE_OPS | CONTROL_FLOW_OPS):
        context.notes.append(
            "int8 left out: the model has none of the ops int8 computes in integers (MatMul, Gemm, Conv, Attention,"
            " Gather, LSTM), so an int8 variant would be its FP32 graph again"
        )
        return tuple(mode for mode in modes if mode not in INT8_MODES)
    if context.options.allow_static:
        return modes
    context.notes.append("int8_static left out: needs at least a few calibration samples")
    return tuple(mode for mode in modes if mode != "int8_static")


def _format_runs_on_provider(context: SpaceContext) -> Predicate:
    """A numeric format the EP cannot run, or only runs emulated, is never worth an evaluation there."""
    model, profile = context.model, context.profile
    blocked = {
        (ep, mode): reason
        for ep in profile.providers_profiled
        for mode in QUANTIZATION_MODES
        if (reason := unsupported_reason(model, profile, ep, mode))
    }
    context.notes.extend(f"{mode} on {ep} pruned: {reason}" for (ep, mode), reason in sorted(blocked.items()))
    return lambda p: (p["execution_provider"], p["quantization"]) not in blocked


def unsupported_reason(model: ModelInfo, profile: HardwareProfile, ep: str, mode: str) -> str | None:
    """Why ``mode`` cannot (or should not) run on ``ep`` for this model, or None."""
    ops = set(model.op_types)
    float_dtype: Dtype = "fp16" if mode == "fp16" else "fp32"
    bad = profile.unsupported_ops(ops, float_dtype, ep)
    if bad:
        return f"unsupported {float_dtype} ops {bad}"
    if mode == "fp16":
        emulated = sorted(o for o in ops & COMPUTE_OPS if profile.support(o, "fp16", ep) == "fallback")
        if emulated:
            return f"fp16 {emulated} only run emulated (cast to fp32), never faster than fp32"
    if mode in INT8_MODES:
        needed = set(INT8_DYNAMIC_OPS if mode == "int8_dynamic" else INT8_STATIC_OPS)
        if mode == "int8_static" and model.has_convs:
            needed |= INT8_STATIC_CONV_OPS
        bad = profile.unsupported_ops(needed & _measured_ops(profile), "int8", ep)
        if bad:
            return f"unsupported int8 ops {bad}"
    return None


def _measured_ops(profile: HardwareProfile) -> set[str]:
    return {o.op_type for o in profile.ops}


def _int8_gain(mode: Scalar, context: SearchContext) -> float | None:
    """int8 pays by a quarter of the profile's int8 GEMM gain, in log terms (bounded); static costs a little more
    (the activation quantize/dequantize pairs)."""
    if mode not in INT8_MODES:
        return None
    gain = min(max(0.25 * math.log(2) * context.int8_gain, -0.3), 0.5)
    return gain if mode == "int8_dynamic" else gain - 0.1


QUANTIZATION = Knob(
    name="quantization",
    values=_quantization_values,
    recipe_field="transform.quantization.mode",
    spread=0.3,
    effects={"fp32": 0.0, "fp16": 0.1},
    context_effect=_int8_gain,
    rules=(_format_runs_on_provider,),
    override=ChoiceList("quantization", 10, QuantizationMode, max_items=4, description="Numeric formats to try."),
)


# -- integer details: scales, types, calibration --------------------------------------------------
# They only mean something for int8 modes; elsewhere the rules pin them to their first value,
# so no two allowed points build the same recipe.


@point_rule
def _per_channel_needs_int8(p: Point) -> bool:
    return is_int8(p) or not p["per_channel"]


PER_CHANNEL = Knob(
    name="per_channel",
    values=(False, True),
    recipe_field="transform.quantization.per_channel",
    spread=0.05,
    effects={False: 0.0, True: -0.03},
    cast=bool,
    rules=(_per_channel_needs_int8,),
)


@point_rule
def _weight_type_needs_int8(p: Point) -> bool:
    return is_int8(p) or p["weight_type"] == "int8"


WEIGHT_TYPE = Knob(
    name="weight_type",
    values=("int8", "uint8"),
    recipe_field="transform.quantization.weight_type",
    spread=0.03,
    rules=(_weight_type_needs_int8,),
)


@point_rule
def _activation_type_needs_static(p: Point) -> bool:
    return p["quantization"] == "int8_static" or p["activation_type"] == "uint8"


@point_rule
def _activation_weight_format_exists(p: Point) -> bool:
    """ORT's quantizer has no int8-activation x uint8-weight format."""
    return not (p["activation_type"] == "int8" and p["weight_type"] == "uint8")


def _int8_variant_runs_well(context: SpaceContext) -> Predicate:
    """Integer kernels exist per type combination (e.g. QLinearConv s8u8 has none on CPU), and some are slow."""
    model, profile = context.model, context.profile
    bad_variants = {
        (ep, mode, act, weight): reason
        for ep in profile.providers_profiled
        for mode in INT8_MODES
        for act in ("uint8", "int8")
        for weight in ("int8", "uint8")
        if (reason := _int8_variant_unsupported(model, profile, ep, mode, act, weight))
    }
    context.notes.extend(  # a mode the EP cannot run at all has its own note (_format_runs_on_provider)
        f"{mode} {int8_variant(act, weight)} on {ep} pruned: {reason}"
        for (ep, mode, act, weight), reason in sorted(bad_variants.items())
        if unsupported_reason(model, profile, ep, mode) is None
    )
    return lambda p: (
        (p["execution_provider"], p["quantization"], p["activation_type"], p["weight_type"]) not in bad_variants
    )


def _int8_variant_unsupported(
    model: ModelInfo, profile: HardwareProfile, ep: str, mode: str, activation: str, weight: str
) -> str | None:
    ops = {"MatMulInteger"} if mode == "int8_dynamic" else {"QLinearMatMul"}
    if mode == "int8_static" and model.has_convs:
        ops.add("QLinearConv")
    variant = int8_variant(activation, weight)
    measured = {o.op_type for o in profile.ops if o.variant == variant and o.provider == ep}
    if bad := profile.unsupported_ops(ops & measured, "int8", ep, variant):
        return f"unsupported int8 ops {bad}"
    if variant == _fastest_over(profile, ops, ep):  # each op's fastest may differ: the mode keeps its best overall
        return None
    return next((why for op in sorted(ops & measured) if (why := _much_slower(profile, op, ep, variant))), None)


def _kernel_times(profile: HardwareProfile, op: str, ep: str) -> dict[str, float]:
    """Each type variant's time for ``op`` on ``ep``: its fastest run (another process on the machine inflates
    some runs of a kernel, a median of a few by 2x under a parallel build, never its fastest; a reference loop is
    slow in every run), or its median in profiles written before the fastest run was kept."""
    return {
        str(o.variant): o.best_us if o.best_us is not None else o.latency_us
        for o in profile.ops
        if o.op_type == op and o.provider == ep and o.dtype == "int8" and o.status == "native" and o.latency_us
    }


def _fastest_over(profile: HardwareProfile, ops: set[str], ep: str) -> str | None:
    """The variant with the least summed time over ``ops``, among those timed on all of them."""
    times = [_kernel_times(profile, op, ep) for op in sorted(ops)]
    timed = [t for t in times if t]
    common = set.intersection(*(set(t) for t in timed)) if timed else set()
    return min(sorted(common), key=lambda v: sum(t[v] for t in timed), default=None)


def _much_slower(profile: HardwareProfile, op: str, ep: str, variant: str) -> str | None:
    """A type combination whose kernel the profile measured at >= 2x the best one (a reference loop, not a
    vectorised kernel: e.g. u8u8 MatMulInteger without VNNI's u8s8 path) is never worth a real evaluation."""
    times = _kernel_times(profile, op, ep)
    if variant not in times:
        return None
    fastest = min(times, key=times.__getitem__)
    mine, best = times[variant], times[fastest]
    if mine < SLOW_VARIANT_FACTOR * best:
        return None
    return f"its {op} kernel took {mine:.0f} us, {mine / best:.1f}x {fastest}'s {best:.0f} us"


ACTIVATION_TYPE = Knob(
    name="activation_type",
    values=("uint8", "int8"),
    recipe_field="transform.quantization.activation_type",
    spread=0.03,
    rules=(_int8_variant_runs_well, _activation_type_needs_static, _activation_weight_format_exists),
)


@point_rule
def _calibration_needs_static(p: Point) -> bool:
    return p["quantization"] == "int8_static" or p["calibration"] == "minmax"


@point_rule
def _fused_static_calibrates_minmax(p: Point) -> bool:
    """ORT's histogram calibrators (percentile, entropy) fail on fused graphs ("Histogram has not been
    collected": fused ops leave tensors without one) and on packed activations, whose shape changes from
    batch to batch; min/max works on both."""
    return not (p["fusion"] == "transformer" and p["quantization"] == "int8_static" and p["calibration"] != "minmax")


CALIBRATION = Knob(
    name="calibration",
    values=("minmax", "percentile"),
    recipe_field="transform.quantization.calibration",
    spread=0.03,
    rules=(_calibration_needs_static, _fused_static_calibrates_minmax),
)


def _quant_format_values(context: SpaceContext) -> tuple[Scalar, ...]:
    """Integer operators only pay where convolutions chain (QLinearConv into QLinearConv); elsewhere QDQ."""
    return ("qdq", "qoperator") if context.model.has_convs else ("qdq",)


@point_rule
def _quant_format_is_static_on_cpu(p: Point) -> bool:
    """QOperator graphs are static int8 only, and only ONNX Runtime's CPU kernels are the reason to write them
    (other providers, TensorRT among them, expect QDQ and fuse it themselves)."""
    if p["quant_format"] == "qdq":
        return True
    return p["quantization"] == "int8_static" and p["execution_provider"] == "CPUExecutionProvider"


QUANT_FORMAT = Knob(
    name="quant_format",
    values=_quant_format_values,
    recipe_field="transform.quantization.format",
    spread=DEFAULT_SPREAD,
    rules=(_quant_format_is_static_on_cpu,),
    backfill=("qdq",),  # points recorded before the knob existed were QDQ
)


# -- mixed precision: the most sensitive layers kept in float --------------------------------------


def keep_count(fraction: float, layers: int) -> int:
    """Layers kept in float for a fraction; at least one when the fraction is positive and it leaves some int8."""
    if fraction <= 0 or layers < 2:
        return 0
    return min(layers - 1, max(1, round(fraction * layers)))


def _keep_float_values(context: SpaceContext) -> tuple[Scalar, ...]:
    fractions = context.options.keep_float_fractions
    return tuple(sorted({keep_count(f, context.sensitive_layers) for f in fractions}))


@point_rule
def _keep_float_needs_int8(p: Point) -> bool:
    return is_int8(p) or not p["keep_float"]


@point_rule
def _keep_float_unfused(p: Point) -> bool:
    """Mixed precision names nodes of the unfused graph; fusion renames them."""
    return not (p["keep_float"] and p["fusion"] != "none")


def _kept_layers(value: Scalar, point: Point, ranked_layers: RankedLayers) -> dict[str, object]:
    # Sensitivity analysis is expensive: only a mixed-precision point asks for the ranking.
    k = as_int(value)
    keep = tuple(ranked_layers(ranking_key(point))[:k]) if k else ()
    return {"transform.quantization.keep_float": keep}


KEEP_FLOAT = Knob(
    name="keep_float",
    values=_keep_float_values,
    recipe_field="transform.quantization.keep_float",
    spread=0.05,
    to_recipe=_kept_layers,
    from_recipe=lambda recipe: len(recipe.transform.quantization.keep_float),
    rules=(_keep_float_needs_int8, _keep_float_unfused),
    override=UpTo(
        "max_keep_float_layers",
        80,
        maximum=1024,
        description="Mixed precision: at most this many layers kept in float.",
    ),
)


# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (
    QUANTIZATION,
    PER_CHANNEL,
    WEIGHT_TYPE,
    ACTIVATION_TYPE,
    CALIBRATION,
    KEEP_FLOAT,
    QUANT_FORMAT,
)
