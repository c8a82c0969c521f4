"""The engine's joint search space: which knobs exist for this model on this hardware.

The space is built from the model (convs? transformer blocks? dynamic batch?)
and the hardware profile (which EPs exist, which ops they run in which dtype),
so the searcher never spends a real evaluation on a candidate that cannot run.
Knobs that do not apply to a point (per-channel scales on fp32, calibration on
dynamic int8) are pinned to their first choice by the constraint, so no two
allowed points build the same recipe.

Each knob is declared once in ``core.engine.knobs``; this module only puts the
declarations together: a dimension and rules per knob make the space, and each
knob's Recipe fields make a point's recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from metainfer.core.engine.knobs import (
    COMPUTE_OPS,
    INT8_DYNAMIC_OPS,
    INT8_MODES,
    INT8_STATIC_CONV_OPS,
    INT8_STATIC_OPS,
    KNOBS,
    SLOW_VARIANT_FACTOR,
    Knob,
    SpaceContext,
    SpaceOptions,
    check_knobs,
    thread_choices,
    unsupported_reason,
)
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.profile.types import HardwareProfile
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.search.space import Dimension, Point, Space

__all__ = [
    "COMPUTE_OPS",
    "INT8_DYNAMIC_OPS",
    "INT8_MODES",
    "INT8_STATIC_CONV_OPS",
    "INT8_STATIC_OPS",
    "KNOBS",
    "SLOW_VARIANT_FACTOR",
    "Knob",
    "SpaceOptions",
    "build_space",
    "recipe_for",
    "thread_choices",
    "unsupported_reason",
]


def build_space(
    model: ModelInfo,
    profile: HardwareProfile,
    options: SpaceOptions,
    sensitive_layers: int,
    *,
    knobs: Sequence[Knob] = KNOBS,
) -> tuple[Space, list[str]]:
    """The space and, for the report, the reasons knobs were left out."""
    check_knobs(knobs)
    context = SpaceContext(model, profile, options, sensitive_layers)
    dims = [_override(Dimension(k.name, k.choices(context)), options.overrides) for k in knobs]
    # Built after every knob's values, so a rule's notes follow the value notes, in knob order.
    checks = [rule(context) for k in knobs for rule in k.rules]

    def allowed(point: Point) -> bool:
        return all(check(point) for check in checks)

    return Space(dims, constraint=allowed, rules=checks), context.notes


def _override(dim: Dimension, overrides: dict[str, tuple[object, ...]]) -> Dimension:
    if dim.name not in overrides:
        return dim
    allowed = tuple(c for c in dim.choices if c in overrides[dim.name])
    return Dimension(dim.name, allowed or dim.choices[:1])


def recipe_for(point: Point, ranked_layers: Callable[[str], list[str]], *, knobs: Sequence[Knob] = KNOBS) -> Recipe:
    """The recipe a point stands for.

    ``ranked_layers(mode)`` gives the quantizable layers most sensitive first; it
    is only called for mixed-precision points, so sensitivity analysis runs only
    when the search actually asks for it.
    """
    fields: dict[str, object] = {}
    for knob in knobs:
        for name, value in knob.recipe_values(point, ranked_layers).items():
            if name in fields:
                raise ValueError(f"knob {knob.name!r} sets recipe field {name}, which another knob already set")
            fields[name] = value
    return Recipe.model_validate(_nested(fields))


def _nested(fields: dict[str, object]) -> dict[str, object]:
    """``{"session.execution_mode": v}`` -> ``{"session": {"execution_mode": v}}``."""
    out: dict[str, object] = {}
    for dotted, value in fields.items():
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"recipe field {dotted}: {part} is set as a value by another knob")
            node = child
        if leaf in node:
            raise ValueError(f"recipe field {dotted} is also a parent of fields other knobs set")
        node[leaf] = value
    return out
