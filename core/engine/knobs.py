"""The search knobs: each dimension of the joint search space, declared once.

A ``Knob`` says everything the rest of metainfer needs to know about one
dimension: the values it takes for a model on a machine, the rules that
rule points out (against the hardware profile and against other knobs), the
Recipe field its value lands in, and how a policy may restrict it
(``spec.search.searchSpace``). Derived from ``KNOBS``:

- ``candidates.build_space``: one ``Dimension`` per knob, in ``KNOBS`` order,
  and a constraint that is every knob's rules together;
- ``candidates.recipe_for``: each knob writes its Recipe field(s);
- ``core.api.policy.SearchSpaceOverrides``: one optional field per knob with an
  ``override``, so the CRD schema follows the declarations;
- ``core.control.runstatus``: policy field -> dimension, and the choices a
  policy's value allows.

Adding a knob is one declaration here, appended to ``KNOBS`` (the order of
``KNOBS`` is the order of the space's dimensions, which seeded searches
depend on), plus its test.

The operator imports this module (through the API types) and never builds a
space, so nothing here loads onnx, onnxruntime, numpy or the searchers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, get_args

from pydantic import Field, StringConstraints

from metainfer.core.engine.profile.types import Dtype, HardwareProfile, int8_variant
from metainfer.core.engine.recipe import (
    ExecutionMode,
    GraphFusion,
    GraphOptimizationLevel,
    Layout,
    QuantizationMode,
    Recipe,
)

if TYPE_CHECKING:
    from metainfer.core.engine.modelinfo import ModelInfo
    from metainfer.core.engine.search.space import Point, Scalar

    Predicate = Callable[[Point], bool]
    # A rule is built once per space: it may precompute tables from the profile and add notes.
    Rule = Callable[["SpaceContext"], Predicate]
    RankedLayers = Callable[[str], list[str]]
    # (chosen value, the whole point, ranked_layers) -> {dotted Recipe field: value}
    ToRecipe = Callable[[Scalar, Point, RankedLayers], dict[str, object]]

INT8_MODES = ("int8_dynamic", "int8_static")
QUANTIZATION_MODES: tuple[str, ...] = get_args(QuantizationMode)
COMPUTE_OPS = {"MatMul", "Gemm", "Conv", "Attention"}
# What a quantization mode turns the model's compute ops into, for support checks.
INT8_DYNAMIC_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul"}
INT8_STATIC_OPS = {"QuantizeLinear", "DequantizeLinear"}
INT8_STATIC_CONV_OPS = {"QLinearConv"}
SLOW_VARIANT_FACTOR = 2.0
# A value a policy may name: a point's scalars, less None (the API has no nulls in lists).
Choice = str | int | float | bool


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


@dataclass
class SpaceContext:
    """What a knob's values and rules may depend on; ``notes`` collects, for the report, what was left out."""

    model: ModelInfo
    profile: HardwareProfile
    options: SpaceOptions
    sensitive_layers: int
    notes: list[str] = field(default_factory=list)


# -- how a policy may restrict a knob ---------------------------------------------------------


@dataclass(frozen=True)
class ChoiceList:
    """A policy lists the values to try (a set: the API rejects duplicates).

    ``item`` is the type of one value as the API validates it: a ``Literal``, or
    an ``Annotated`` type with bounds. ``position`` orders the fields of
    ``spec.search.searchSpace``: the CRD lists them in that order, so a new knob
    takes a number after the existing ones and leaves their schema unchanged.
    """

    field: str
    position: int
    item: Any
    max_items: int
    description: str | None = None

    def choices(self, value: Sequence[Choice]) -> list[Choice]:
        return list(value)


@dataclass(frozen=True)
class UpTo:
    """A policy caps a counting knob with one number n, the choices 0..n; ``position`` as for ``ChoiceList``."""

    field: str
    position: int
    maximum: int
    description: str | None = None

    def choices(self, value: int) -> list[Choice]:
        return list(range(value + 1))


Override = ChoiceList | UpTo


# -- the knob -------------------------------------------------------------------------------------


def _unchanged(value: Scalar) -> object:
    return value


@dataclass(frozen=True)
class Knob:
    """One dimension of the search space and everything derived from it.

    ``values``: the choices in a meaningful order (the first is what a knob that
    does not apply to a point is pinned to), or a function of the context.
    ``rules``: the points this knob rules out; they see the whole point, so a
    rule between two knobs lives with the knob it restricts.
    ``recipe_field``: the dotted Recipe field the value lands in; ``cast``
    turns a choice into that field's value, or ``to_recipe`` writes several
    fields (it then owns them all); ``from_recipe`` reads the value back when
    ``recipe_field`` alone cannot.
    ``backfill``: the value a point recorded before this knob existed stands
    for; without one such a point is an error.
    """

    name: str
    values: tuple[Scalar, ...] | Callable[[SpaceContext], tuple[Scalar, ...]]
    recipe_field: str
    cast: Callable[[Scalar], object] = _unchanged
    to_recipe: ToRecipe | None = None
    from_recipe: Callable[[Recipe], Scalar] | None = None
    rules: tuple[Rule, ...] = ()
    override: Override | None = None
    backfill: tuple[Scalar] | None = None

    def choices(self, context: SpaceContext) -> tuple[Scalar, ...]:
        return self.values if isinstance(self.values, tuple) else self.values(context)

    def value_of(self, point: Point) -> Scalar:
        if self.backfill is None:
            return point[self.name]
        return point.get(self.name, self.backfill[0])

    def recipe_values(self, point: Point, ranked_layers: RankedLayers) -> dict[str, object]:
        """The Recipe fields (dotted) this knob sets for ``point``."""
        value = self.value_of(point)
        if self.to_recipe is not None:
            return self.to_recipe(value, point, ranked_layers)
        return {self.recipe_field: self.cast(value)}

    def read(self, recipe: Recipe) -> Scalar:
        """The knob's value in a recipe: what ``recipe_values`` wrote, read back."""
        if self.from_recipe is not None:
            return self.from_recipe(recipe)
        value: Any = recipe
        for part in self.recipe_field.split("."):
            value = getattr(value, part)
        if value is not None and not isinstance(value, str | int | float | bool):
            raise TypeError(f"knob {self.name!r}: recipe field {self.recipe_field} is not a scalar; give from_recipe")
        return value


def check_knobs(knobs: Sequence[Knob]) -> None:
    """Declaration mistakes that would otherwise surface far away (a clashing CRD field, a lost recipe value)."""
    overrides = [k.override for k in knobs if k.override is not None]
    declared: dict[str, list[str]] = {
        "knob names": [k.name for k in knobs],
        "override fields": [o.field for o in overrides],
        "override positions": [str(o.position) for o in overrides],
        "recipe fields": [k.recipe_field for k in knobs],
    }
    for what, values in declared.items():
        duplicates = sorted({v for v in values if values.count(v) > 1})
        if duplicates:
            raise ValueError(f"duplicate {what}: {duplicates}")


def overridable(knobs: Sequence[Knob]) -> list[tuple[Knob, Override]]:
    """The knobs a policy may restrict, with their overrides, in the API's field order."""
    pairs = [(k, k.override) for k in knobs if k.override is not None]
    return sorted(pairs, key=lambda pair: pair[1].position)


def point_rule(check: Predicate) -> Rule:
    """A rule between knobs only: it needs nothing from the model or the machine."""

    def build(context: SpaceContext) -> Predicate:
        return check

    build.__doc__ = check.__doc__
    return build


def _as_int(value: Scalar) -> int:
    if value is None:
        raise TypeError("a knob with integer values got None")
    return int(value)


def _is_int8(p: Point) -> bool:
    return p["quantization"] in INT8_MODES


# -- quantization ---------------------------------------------------------------------------------


def _quantization_values(context: SpaceContext) -> tuple[Scalar, ...]:
    quant: list[Scalar] = ["fp32", "fp16", "int8_dynamic"]
    if context.options.allow_static:
        quant.append("int8_static")
    else:
        context.notes.append("int8_static left out: needs at least a few calibration samples")
    return tuple(quant)


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


QUANTIZATION = Knob(
    name="quantization",
    values=_quantization_values,
    recipe_field="transform.quantization.mode",
    rules=(_format_runs_on_provider,),
    override=ChoiceList("quantization", 10, QuantizationMode, max_items=4, description="Numeric formats to try."),
)


# -- integer details: scales, types, calibration --------------------------------------------------
# They only mean something for int8 modes; elsewhere the rules pin them to their first value,
# so no two allowed points build the same recipe.


@point_rule
def _per_channel_needs_int8(p: Point) -> bool:
    return _is_int8(p) or not p["per_channel"]


PER_CHANNEL = Knob(
    name="per_channel",
    values=(False, True),
    recipe_field="transform.quantization.per_channel",
    cast=bool,
    rules=(_per_channel_needs_int8,),
)


@point_rule
def _weight_type_needs_int8(p: Point) -> bool:
    return _is_int8(p) or p["weight_type"] == "int8"


WEIGHT_TYPE = Knob(
    name="weight_type",
    values=("int8", "uint8"),
    recipe_field="transform.quantization.weight_type",
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
        (ep, mode, act, weight)
        for ep in profile.providers_profiled
        for mode in INT8_MODES
        for act in ("uint8", "int8")
        for weight in ("int8", "uint8")
        if _int8_variant_unsupported(model, profile, ep, mode, act, weight)
    }
    return lambda p: (
        (p["execution_provider"], p["quantization"], p["activation_type"], p["weight_type"]) not in bad_variants
    )


def _int8_variant_unsupported(
    model: ModelInfo, profile: HardwareProfile, ep: str, mode: str, activation: str, weight: str
) -> bool:
    ops = {"MatMulInteger"} if mode == "int8_dynamic" else {"QLinearMatMul"}
    if mode == "int8_static" and model.has_convs:
        ops.add("QLinearConv")
    variant = int8_variant(activation, weight)
    measured = {o.op_type for o in profile.ops if o.variant == variant and o.provider == ep}
    if profile.unsupported_ops(ops & measured, "int8", ep, variant):
        return True
    return any(_much_slower(profile, op, ep, variant) for op in ops & measured)


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


ACTIVATION_TYPE = Knob(
    name="activation_type",
    values=("uint8", "int8"),
    recipe_field="transform.quantization.activation_type",
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
    rules=(_calibration_needs_static, _fused_static_calibrates_minmax),
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
    return _is_int8(p) or not p["keep_float"]


@point_rule
def _keep_float_unfused(p: Point) -> bool:
    """Mixed precision names nodes of the unfused graph; fusion renames them."""
    return not (p["keep_float"] and p["fusion"] != "none")


def _kept_layers(value: Scalar, point: Point, ranked_layers: RankedLayers) -> dict[str, object]:
    # Sensitivity analysis is expensive: only a mixed-precision point asks for the ranking.
    k = _as_int(value)
    keep = tuple(ranked_layers(str(point["quantization"]))[:k]) if k else ()
    return {"transform.quantization.keep_float": keep}


KEEP_FLOAT = Knob(
    name="keep_float",
    values=_keep_float_values,
    recipe_field="transform.quantization.keep_float",
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


# -- graph transforms ------------------------------------------------------------------------------


FUSION = Knob(
    name="fusion",
    values=lambda c: ("none", "transformer") if c.model.is_transformer else ("none",),
    recipe_field="transform.fusion",
    override=ChoiceList("fusions", 40, GraphFusion, max_items=2),
)


def _nhwc_runs_natively(context: SpaceContext) -> Predicate:
    """NHWC only pays where an EP has a native NhwcConv kernel."""
    profile = context.profile
    nhwc_ok = {ep for ep in profile.providers_profiled if profile.support("NhwcConv", "fp32", ep) == "native"}
    if not nhwc_ok and context.model.has_convs:
        context.notes.append("NHWC layout pruned: no profiled EP runs NhwcConv natively")
    return lambda p: p["layout"] != "NHWC" or p["execution_provider"] in nhwc_ok


LAYOUT = Knob(
    name="layout",
    values=lambda c: ("NCHW", "NHWC") if c.model.has_convs else ("NCHW",),
    recipe_field="transform.layout",
    rules=(_nhwc_runs_natively,),
    override=ChoiceList("layouts", 30, Layout, max_items=2),
)


@point_rule
def _padding_removal_on_fused_float_or_int8(p: Point) -> bool:
    """Padding removal rewrites the fused graph; its loop bodies stay fp32, so fp16 gains nothing there."""
    return not (p["padding"] == "remove" and (p["fusion"] != "transformer" or p["quantization"] == "fp16"))


PADDING = Knob(
    name="padding",
    values=lambda c: ("keep", "remove") if c.options.padding_removable else ("keep",),
    recipe_field="transform.padding",
    rules=(_padding_removal_on_fused_float_or_int8,),
    backfill=("keep",),
)


# -- ONNX Runtime session ----------------------------------------------------------------------------


def _provider_values(context: SpaceContext) -> tuple[Scalar, ...]:
    profile = context.profile
    providers = [p for p in profile.providers_profiled if p in profile.machine.execution_providers]
    return tuple(providers or ["CPUExecutionProvider"])


EXECUTION_PROVIDER = Knob(
    name="execution_provider",
    values=_provider_values,
    recipe_field="session.execution_provider",
    cast=str,
    override=ChoiceList(
        "execution_providers",
        60,
        Annotated[str, StringConstraints(min_length=1, max_length=64)],
        max_items=16,
        description="ONNX Runtime execution providers to try.",
    ),
)

GRAPH_OPTIMIZATION_LEVEL = Knob(
    name="graph_optimization_level",
    values=("all", "extended", "basic"),
    recipe_field="session.graph_optimization_level",
    override=ChoiceList("graph_optimization_levels", 20, GraphOptimizationLevel, max_items=4),
)


def thread_choices(profile: HardwareProfile) -> tuple[int, ...]:
    cores = profile.machine.physical_cores
    logical = profile.machine.logical_cores
    return tuple(sorted({1, max(1, cores // 2), cores, logical}))


INTRA_OP_NUM_THREADS = Knob(
    name="intra_op_num_threads",
    values=lambda c: thread_choices(c.profile),
    recipe_field="session.intra_op_num_threads",
    cast=_as_int,
    override=ChoiceList(
        "intra_op_threads",
        70,
        Annotated[int, Field(ge=0, le=1024)],
        max_items=16,
        description="Thread counts to try (0 = ONNX Runtime decides).",
    ),
)


@point_rule
def _parallel_needs_threads(p: Point) -> bool:
    """Parallel mode only matters with independent branches; it needs inter-op threads to help."""
    return not (p["execution_mode"] == "parallel" and p["intra_op_num_threads"] == 1)


def _execution_mode(value: Scalar, point: Point, ranked_layers: RankedLayers) -> dict[str, object]:
    # Two inter-op threads are enough to overlap the independent branches parallel mode is for.
    return {"session.execution_mode": value, "session.inter_op_num_threads": 2 if value == "parallel" else 0}


EXECUTION_MODE = Knob(
    name="execution_mode",
    values=("sequential", "parallel"),
    recipe_field="session.execution_mode",
    to_recipe=_execution_mode,
    rules=(_parallel_needs_threads,),
    override=ChoiceList("execution_modes", 50, ExecutionMode, max_items=2),
)


# -- batch ----------------------------------------------------------------------------------------------


def _batch_values(context: SpaceContext) -> tuple[Scalar, ...]:
    options = context.options
    if not options.search_batch or not context.model.batch_is_dynamic:
        return (options.batch,)
    choices = {1, options.batch}
    b = 2
    while b <= options.max_batch:
        choices.add(b)
        b *= 2
    return tuple(sorted(choices))


BATCH = Knob(name="batch", values=_batch_values, recipe_field="batch", cast=_as_int)


KNOBS: tuple[Knob, ...] = (
    QUANTIZATION,
    PER_CHANNEL,
    WEIGHT_TYPE,
    ACTIVATION_TYPE,
    CALIBRATION,
    KEEP_FLOAT,
    FUSION,
    LAYOUT,
    PADDING,
    EXECUTION_PROVIDER,
    GRAPH_OPTIMIZATION_LEVEL,
    INTRA_OP_NUM_THREADS,
    EXECUTION_MODE,
    BATCH,
)
check_knobs(KNOBS)
