"""The knob declaration: what one search dimension says about itself, and the
space-building context its values and rules read.

``Knob`` bundles a dimension's values, rules, Recipe mapping, policy override
(``ChoiceList`` or ``UpTo``) and what the search believes about it before
measuring (its prior spread and known effects, read by
``core.engine.search.prior``); ``SpaceContext`` is what values and rules are
computed from (model, profile, options, sensitive layers), and where rules
leave notes. Declarations live beside this module, one module per area.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from metainfer.core.engine.profile.types import HardwareProfile
from metainfer.core.engine.recipe import INT8_MODES, Recipe

if TYPE_CHECKING:
    from metainfer.core.engine.modelinfo import ModelInfo
    from metainfer.core.engine.search.prior import SearchContext
    from metainfer.core.engine.search.space import Point, Scalar

    Predicate = Callable[[Point], bool]
    # A rule is built once per space: it may precompute tables from the profile and add notes.
    Rule = Callable[["SpaceContext"], Predicate]
    RankedLayers = Callable[[str], list[str]]
    # (chosen value, the whole point, ranked_layers) -> {dotted Recipe field: value}
    ToRecipe = Callable[[Scalar, Point, RankedLayers], dict[str, object]]
    # (a choice, the hardware and model facts of the search) -> its expected log-score effect; None: no opinion
    ContextEffect = Callable[[Scalar, SearchContext], float | None]

COMPUTE_OPS = {"MatMul", "Gemm", "Conv", "Attention"}
# What a quantization mode turns the model's compute ops into, for support checks.
INT8_DYNAMIC_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul"}
INT8_STATIC_OPS = {"QuantizeLinear", "DequantizeLinear"}
INT8_STATIC_CONV_OPS = {"QLinearConv"}
# The ops an int8 variant computes in integers (what ORT's dynamic quantizer converts, and the layers static
# quantization puts between integer kernels; contrib ops domain-qualified, as ModelInfo counts them), and the ops
# whose bodies the quantizers also walk. A model with none of either (a tree ensemble, a scaler) gets from int8
# only its FP32 graph again, or a slower one with quantize/dequantize pairs around element-wise ops.
INT8_COMPUTE_OPS = frozenset(
    {"MatMul", "Gemm", "Conv", "ConvTranspose", "Attention", "Gather", "LSTM", "GRU", "com.microsoft.Attention",
     "com.microsoft.EmbedLayerNormalization", "com.microsoft.MultiHeadAttention", "com.microsoft.FusedMatMul"}
)  # fmt: skip
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
SLOW_VARIANT_FACTOR = 2.0
# The prior spread of a knob the built-in prior has no particular view of (and of a dimension that is no knob).
DEFAULT_SPREAD = 0.1
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
    # Whether this image has NNCF (core.engine.transforms.quantize_nncf.nncf_available); the engine checks it.
    nncf: bool = False
    # MatMuls over constant weights and embedding tables in the model, and the weight methods this image and
    # data allow (core.engine.transforms.weights); the engine counts and checks them.
    weight_layers: int = 0
    embedding_tables: int = 0
    weight_methods: tuple[str, ...] = ("rtn",)
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

    What the built-in prior (``core.engine.search.prior``) believes before any
    measurement, in log-score units: ``spread``, how unsure it is about the
    knob, which is the bonus an untried knob gets when the start picks its next
    move (threads and numeric format move latency the most, opt level, scales
    and calibration rarely matter much); every knob states it, ``DEFAULT_SPREAD``
    when it has no particular view. ``effects``: the expected effect of those
    choices whose effect does not depend on the machine (the first choice is
    usually 0); ``context_effect``: the effect of a choice that does (int8 on
    the profile's int8 gain, threads against the cores), which wins over
    ``effects`` where it has an opinion. A choice with neither ranks by its
    position in ``values``.
    """

    name: str
    values: tuple[Scalar, ...] | Callable[[SpaceContext], tuple[Scalar, ...]]
    recipe_field: str
    spread: float
    cast: Callable[[Scalar], object] = _unchanged
    to_recipe: ToRecipe | None = None
    from_recipe: Callable[[Recipe], Scalar] | None = None
    rules: tuple[Rule, ...] = ()
    override: Override | None = None
    backfill: tuple[Scalar] | None = None
    effects: Mapping[Scalar, float] = field(default_factory=dict, hash=False)
    context_effect: ContextEffect | None = None

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


def as_int(value: Scalar) -> int:
    if value is None:
        raise TypeError("a knob with integer values got None")
    return int(value)


def is_int8(p: Point) -> bool:
    return p["quantization"] in INT8_MODES
