"""The quantizer knob: which tool writes a static int8 variant, ONNX Runtime's quantizer or NNCF.

The quantization area's other knobs (per-channel, types, calibration) are ONNX Runtime's quantizer's settings;
NNCF chooses those itself, so under NNCF they are pinned to their first choice and no two allowed points build
the same variant. NNCF's variants are plain QDQ ONNX, run by either runtime; they are searched unfused or with
the conv rewrite (the transformer fusion writes ONNX Runtime's contrib ops, which NNCF does not know), NCHW,
unpadded. Offered only where the image has NNCF and the data allows static int8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metainfer.core.engine.knobs.base import ChoiceList, Knob, SpaceContext, point_rule
from metainfer.core.engine.recipe import Quantizer

if TYPE_CHECKING:
    from metainfer.core.engine.search.space import Point, Scalar


def _quantizer_values(context: SpaceContext) -> tuple[Scalar, ...]:
    if not context.options.allow_static:
        return ("onnxruntime",)
    if not context.options.nncf:
        context.notes.append("quantizer nncf left out: NNCF is not installed in this image")
        return ("onnxruntime",)
    return ("onnxruntime", "nncf")


@point_rule
def _nncf_chooses_its_own_settings(p: Point) -> bool:
    if p["quantizer"] != "nncf":
        return True
    return (
        p["quantization"] == "int8_static"
        and p["quant_format"] == "qdq"
        and not p["per_channel"]
        and p["weight_type"] == "int8"
        and p["activation_type"] == "uint8"
        and p["calibration"] == "minmax"
        and p["fusion"] in ("none", "conv")
        and p["layout"] == "NCHW"
        and p["padding"] == "keep"
    )


# The ranking of NNCF's static int8 (its accuracy control's); ONNX Runtime's quantizer's are keyed by their mode.
NNCF_RANKING = "int8_static+nncf"


def ranking_key(point: Point) -> str:
    """Which layer ranking a mixed-precision point keeps the top of in float: NNCF's accuracy control's for NNCF's
    int8 (it knows which of its own quantizers cost the quality), else the per-layer scan for the point's mode."""
    if point.get("quantizer") == "nncf":
        return NNCF_RANKING
    return str(point.get("quantization"))


QUANTIZER = Knob(
    name="quantizer",
    values=_quantizer_values,
    recipe_field="transform.quantization.quantizer",
    # Which tool's int8 is faster or closer to FP32 depends on the model (its fused activations, its outliers).
    spread=0.3,
    rules=(_nncf_chooses_its_own_settings,),
    backfill=("onnxruntime",),  # points recorded before the knob existed were ONNX Runtime's quantizer's
    override=ChoiceList("quantizers", 130, Quantizer, max_items=2, description="Static int8 quantizers to try."),
)

# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (QUANTIZER,)
