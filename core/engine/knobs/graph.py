"""Graph-transform knobs: transformer or conv fusion, conv layout, padding removal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from metainfer.core.engine.knobs.base import (
    ChoiceList,
    Knob,
    SpaceContext,
    point_rule,
)
from metainfer.core.engine.recipe import GraphFusion, Layout

if TYPE_CHECKING:
    from metainfer.core.engine.knobs.base import Predicate
    from metainfer.core.engine.search.space import Point


def _fusions(context: SpaceContext) -> tuple[GraphFusion, ...]:
    transformer: tuple[GraphFusion, ...] = ("transformer",) if context.model.is_transformer else ()
    conv: tuple[GraphFusion, ...] = ("conv",) if context.model.conv_fusable else ()
    return ("none", *transformer, *conv)


FUSION = Knob(
    name="fusion",
    values=_fusions,
    recipe_field="transform.fusion",
    spread=0.3,
    effects={"none": 0.0, "transformer": 0.2, "conv": 0.2},
    override=ChoiceList("fusions", 40, GraphFusion, max_items=3),
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
    spread=0.15,
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
    spread=0.2,
    effects={"keep": 0.0, "remove": 0.1},
    rules=(_padding_removal_on_fused_float_or_int8,),
    backfill=("keep",),
)


# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (
    FUSION,
    LAYOUT,
    PADDING,
)
