"""The activations knob: spelled-out GELU, HardSwish and SiLU kept as exported, or written as one operator each.

Offered where the model has the elementary operators these patterns are made of (Erf, HardSigmoid, Sigmoid,
Clip); the rewrite itself (core.engine.transforms.activations) finds the patterns and leaves everything else
alone. Not with the transformer fusion, which writes GELU its own way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metainfer.core.engine.knobs.base import ChoiceList, Knob, SpaceContext, point_rule
from metainfer.core.engine.recipe import Activations

if TYPE_CHECKING:
    from metainfer.core.engine.search.space import Point, Scalar

# The operators the spelled-out activations are built around (Clip: paddle2onnx's HardSwish below opset 14).
PATTERN_OPS = frozenset({"Erf", "HardSigmoid", "Sigmoid", "Clip"})


def _activation_values(context: SpaceContext) -> tuple[Scalar, ...]:
    return ("keep", "fused") if PATTERN_OPS & set(context.model.op_types) else ("keep",)


@point_rule
def _not_with_transformer_fusion(p: Point) -> bool:
    return p["activations"] == "keep" or p["fusion"] != "transformer"


ACTIVATIONS = Knob(
    name="activations",
    values=_activation_values,
    recipe_field="transform.activations",
    # One operator per activation is never more work; what it buys depends on the runtime and the quantizer.
    spread=0.08,
    effects={"keep": 0.0, "fused": 0.02},
    rules=(_not_with_transformer_fusion,),
    backfill=("keep",),  # points recorded before the knob existed kept their activations as exported
    override=ChoiceList(
        "activations", 140, Activations, max_items=2, description="Spelled-out activations: keep and/or fused."
    ),
)

# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (ACTIVATIONS,)
