"""The engine's joint search space: which knobs exist for this model on this hardware.

The space is built from the model (convs? transformer blocks? dynamic batch?)
and the hardware profile (which EPs exist, which ops they run in which dtype),
so the searcher never spends a real evaluation on a candidate that cannot run.
Knobs that do not apply to a point (per-channel scales on fp32, calibration on
dynamic int8) are pinned to their first choice by the constraint, so no two
allowed points build the same recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.profile.types import Dtype, HardwareProfile, int8_variant
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.search.space import Dimension, Point, Space

INT8_MODES = ("int8_dynamic", "int8_static")
COMPUTE_OPS = {"MatMul", "Gemm", "Conv", "Attention"}
# What a quantization mode turns the model's compute ops into, for support checks.
INT8_DYNAMIC_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul"}
INT8_STATIC_OPS = {"QuantizeLinear", "DequantizeLinear"}
INT8_STATIC_CONV_OPS = {"QLinearConv"}


@dataclass(frozen=True)
class SpaceOptions:
    """What the user (or policy) allows; the defaults search everything that applies."""

    batch: int = 1
    search_batch: bool = False
    max_batch: int = 32
    keep_float_fractions: tuple[float, ...] = (0.0, 0.05, 0.15)
    allow_static: bool = True
    # Whether the fused graph admits padding removal (core.engine.transforms.padding); the engine checks it.
    padding_removable: bool = False
    overrides: dict[str, tuple[object, ...]] = field(default_factory=dict)


def thread_choices(profile: HardwareProfile) -> tuple[int, ...]:
    cores = profile.machine.physical_cores
    logical = profile.machine.logical_cores
    return tuple(sorted({1, max(1, cores // 2), cores, logical}))


def build_space(
    model: ModelInfo, profile: HardwareProfile, options: SpaceOptions, sensitive_layers: int
) -> tuple[Space, list[str]]:
    """The space and, for the report, the reasons knobs were left out."""
    notes: list[str] = []
    quant = ["fp32", "fp16", "int8_dynamic"]
    if options.allow_static:
        quant.append("int8_static")
    else:
        notes.append("int8_static left out: needs at least a few calibration samples")
    keep = sorted({_keep_count(f, sensitive_layers) for f in options.keep_float_fractions})
    providers = [p for p in profile.providers_profiled if p in profile.machine.execution_providers]
    dims = [
        Dimension("quantization", tuple(quant)),
        Dimension("per_channel", (False, True)),
        Dimension("weight_type", ("int8", "uint8")),
        Dimension("activation_type", ("uint8", "int8")),
        Dimension("calibration", ("minmax", "percentile")),
        Dimension("keep_float", tuple(keep)),
        Dimension("fusion", ("none", "transformer") if model.is_transformer else ("none",)),
        Dimension("layout", ("NCHW", "NHWC") if model.has_convs else ("NCHW",)),
        Dimension("padding", ("keep", "remove") if options.padding_removable else ("keep",)),
        Dimension("execution_provider", tuple(providers or ["CPUExecutionProvider"])),
        Dimension("graph_optimization_level", ("all", "extended", "basic")),
        Dimension("intra_op_num_threads", thread_choices(profile)),
        Dimension("execution_mode", ("sequential", "parallel")),
        Dimension("batch", _batch_choices(model, options)),
    ]
    dims = [_override(d, options.overrides) for d in dims]
    return Space(dims, constraint=_make_constraint(model, profile, notes)), notes


def _keep_count(fraction: float, layers: int) -> int:
    """Layers kept in float for a fraction; at least one when the fraction is positive and it leaves some int8."""
    if fraction <= 0 or layers < 2:
        return 0
    return min(layers - 1, max(1, round(fraction * layers)))


def _batch_choices(model: ModelInfo, options: SpaceOptions) -> tuple[int, ...]:
    if not options.search_batch or not model.batch_is_dynamic:
        return (options.batch,)
    choices = {1, options.batch}
    b = 2
    while b <= options.max_batch:
        choices.add(b)
        b *= 2
    return tuple(sorted(choices))


def _override(dim: Dimension, overrides: dict[str, tuple[object, ...]]) -> Dimension:
    if dim.name not in overrides:
        return dim
    allowed = tuple(c for c in dim.choices if c in overrides[dim.name])
    return Dimension(dim.name, allowed or dim.choices[:1])


def _make_constraint(model: ModelInfo, profile: HardwareProfile, notes: list[str]) -> Callable[[Point], bool]:
    blocked = {
        (ep, mode): reason
        for ep in profile.providers_profiled
        for mode in ("fp32", "fp16", *INT8_MODES)
        if (reason := unsupported_reason(model, profile, ep, mode))
    }
    notes.extend(f"{mode} on {ep} pruned: {reason}" for (ep, mode), reason in sorted(blocked.items()))
    nhwc_ok = {ep for ep in profile.providers_profiled if profile.support("NhwcConv", "fp32", ep) == "native"}
    bad_variants = {
        (ep, mode, act, weight)
        for ep in profile.providers_profiled
        for mode in INT8_MODES
        for act in ("uint8", "int8")
        for weight in ("int8", "uint8")
        if _int8_variant_unsupported(model, profile, ep, mode, act, weight)
    }

    def allowed(p: Point) -> bool:
        mode = p["quantization"]
        if (p["execution_provider"], mode) in blocked:
            return False
        if (p["execution_provider"], mode, p["activation_type"], p["weight_type"]) in bad_variants:
            return False
        is_int8 = mode in INT8_MODES
        if not is_int8 and (p["per_channel"] or p["weight_type"] != "int8" or p["keep_float"]):
            return False
        if mode != "int8_static" and (p["activation_type"] != "uint8" or p["calibration"] != "minmax"):
            return False
        # ORT's quantizer has no int8-activation x uint8-weight format.
        if p["activation_type"] == "int8" and p["weight_type"] == "uint8":
            return False
        # Mixed precision names nodes of the unfused graph; fusion renames them.
        if p["keep_float"] and p["fusion"] != "none":
            return False
        if p["layout"] == "NHWC" and p["execution_provider"] not in nhwc_ok:
            return False
        # Padding removal rewrites the fused graph; its loop bodies stay fp32, so fp16 gains nothing there.
        if p["padding"] == "remove" and (p["fusion"] != "transformer" or mode == "fp16"):
            return False
        # ORT's histogram calibrators (percentile, entropy) fail on fused graphs ("Histogram has
        # not been collected": fused ops leave tensors without one) and on packed activations,
        # whose shape changes from batch to batch; min/max works on both.
        if p["fusion"] == "transformer" and mode == "int8_static" and p["calibration"] != "minmax":
            return False
        # Parallel mode only matters with independent branches; it needs inter-op threads to help.
        return not (p["execution_mode"] == "parallel" and p["intra_op_num_threads"] == 1)

    if not nhwc_ok and model.has_convs:
        notes.append("NHWC layout pruned: no profiled EP runs NhwcConv natively")
    return allowed


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


def _int8_variant_unsupported(
    model: ModelInfo, profile: HardwareProfile, ep: str, mode: str, activation: str, weight: str
) -> bool:
    """Integer kernels exist per type combination (e.g. QLinearConv s8u8 has none on CPU)."""
    ops = {"MatMulInteger"} if mode == "int8_dynamic" else {"QLinearMatMul"}
    if mode == "int8_static" and model.has_convs:
        ops.add("QLinearConv")
    variant = int8_variant(activation, weight)
    measured = {o.op_type for o in profile.ops if o.variant == variant and o.provider == ep}
    if profile.unsupported_ops(ops & measured, "int8", ep, variant):
        return True
    return any(_much_slower(profile, op, ep, variant) for op in ops & measured)


SLOW_VARIANT_FACTOR = 2.0


def _much_slower(profile: HardwareProfile, op: str, ep: str, variant: str) -> bool:
    """A type combination whose kernel the profile measured at >= 2x the best one (a reference loop, not a
    vectorised kernel: e.g. u8u8 MatMulInteger without VNNI's u8s8 path) is never worth a real evaluation."""
    times = {
        o.variant: o.latency_us
        for o in profile.ops
        if o.op_type == op and o.provider == ep and o.dtype == "int8" and o.status == "native" and o.latency_us
    }
    best = min(times.values(), default=None)
    mine = times.get(variant)
    return best is not None and mine is not None and mine >= SLOW_VARIANT_FACTOR * best


def _measured_ops(profile: HardwareProfile) -> set[str]:
    return {o.op_type for o in profile.ops}


def recipe_for(point: Point, ranked_layers: Callable[[str], list[str]]) -> Recipe:
    """The recipe a point stands for.

    ``ranked_layers(mode)`` gives the quantizable layers most sensitive first; it
    is only called for mixed-precision points, so sensitivity analysis runs only
    when the search actually asks for it.
    """
    k = int(point["keep_float"])  # type: ignore[arg-type]
    keep = tuple(ranked_layers(str(point["quantization"]))[:k]) if k else ()
    return Recipe(
        transform=TransformSpec(
            quantization=QuantizationSpec(
                mode=point["quantization"],  # type: ignore[arg-type]
                per_channel=bool(point["per_channel"]),
                weight_type=point["weight_type"],  # type: ignore[arg-type]
                activation_type=point["activation_type"],  # type: ignore[arg-type]
                calibration=point["calibration"],  # type: ignore[arg-type]
                keep_float=keep,
            ),
            fusion=point["fusion"],  # type: ignore[arg-type]
            layout=point["layout"],  # type: ignore[arg-type]
            padding=point.get("padding", "keep"),  # type: ignore[arg-type]
        ),
        session=SessionSpec(
            execution_provider=str(point["execution_provider"]),
            graph_optimization_level=point["graph_optimization_level"],  # type: ignore[arg-type]
            intra_op_num_threads=int(point["intra_op_num_threads"]),  # type: ignore[arg-type]
            inter_op_num_threads=2 if point["execution_mode"] == "parallel" else 0,
            execution_mode=point["execution_mode"],  # type: ignore[arg-type]
        ),
        batch=int(point["batch"]),  # type: ignore[arg-type]
    )
