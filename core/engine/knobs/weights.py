"""Weight-only quantization knobs: bits, method, block size, symmetry, accuracy level, embeddings, layers kept,
and NNCF's share of int4.

Weights in 4 or 8 bits with float activations (``core.engine.transforms.weights``) are their own lever beside
the activation formats: they shrink what a node must hold (a memory wall the policy or the class sets), and speed
up runs bound by reading weights (batch 1, large tables), while compute-bound runs can get slower (the kernels
dequantize on the fly). Offered on fp32 points only, for models with MatMuls over constant weights; every detail
knob is pinned to its first choice where it means nothing (float weights, a method that fixes it), so no two
allowed points build the same variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from metainfer.core.engine.knobs.base import ChoiceList, Knob, SpaceContext, UpTo, as_int, point_rule
from metainfer.core.engine.knobs.quantization import keep_count
from metainfer.core.engine.recipe import (
    ORT_WEIGHT_METHODS,
    WEIGHT_RANKING,
    WeightBits,
    WeightBlock,
    WeightInt4Percent,
    WeightMethod,
)

if TYPE_CHECKING:
    from metainfer.core.engine.knobs.base import Predicate, RankedLayers
    from metainfer.core.engine.search.space import Point, Scalar


def _where_weights(*values: Scalar) -> Callable[[SpaceContext], tuple[Scalar, ...]]:
    """A detail knob's choices: all of them where weight-only quantization is offered, else its first (so a model
    without weights to quantize keeps the space, and the allowed points, it had before these knobs)."""

    def choices(context: SpaceContext) -> tuple[Scalar, ...]:
        return values if context.options.weight_layers else values[:1]

    return choices


def _bits_values(context: SpaceContext) -> tuple[Scalar, ...]:
    if context.options.weight_layers == 0:
        context.notes.append("weight-only quantization left out: the model has no MatMul over a constant weight")
        return (0,)
    return (0, 8, 4)


@point_rule
def _weights_need_float_activations(p: Point) -> bool:
    return p["weight_bits"] == 0 or p["quantization"] == "fp32"


def _matmulnbits_runs_on_provider(context: SpaceContext) -> Predicate:
    """ONNX Runtime's methods write MatMulNBits: an EP the profile found without it gets NNCF's DQ form only."""
    profile = context.profile
    blocked = {ep for ep in profile.providers_profiled if profile.unsupported_ops(["MatMulNBits"], "fp32", ep)}
    context.notes.extend(f"weight methods {', '.join(ORT_WEIGHT_METHODS)} on {ep} pruned: no MatMulNBits kernel"
                         for ep in sorted(blocked))  # fmt: skip
    return lambda p: (
        not (p["weight_bits"] and p["weight_method"] in ORT_WEIGHT_METHODS and p["execution_provider"] in blocked)
    )


WEIGHT_BITS = Knob(
    name="weight_bits",
    values=_bits_values,
    recipe_field="transform.weights.bits",
    spread=0.2,
    cast=as_int,
    rules=(_weights_need_float_activations, _matmulnbits_runs_on_provider),
    backfill=(0,),  # points recorded before the knob existed had float weights
    override=ChoiceList(
        "weight_bits", 220, WeightBits, max_items=3, description="Weight-only quantization: bits (0 keeps float)."
    ),
)


def _method_values(context: SpaceContext) -> tuple[Scalar, ...]:
    methods = context.options.weight_methods
    if not context.options.weight_layers:
        return ("rtn",)
    left_out = {
        "hqq": "HQQ needs torch, which this image does not have",
        "gptq": "GPTQ needs torch and calibration samples",
        "nncf": "NNCF is not installed in this image",
        "nncf_awq": "NNCF's AWQ needs NNCF and calibration samples",
    }
    context.notes.extend(f"weight method {m} left out: {why}" for m, why in left_out.items() if m not in methods)
    return methods


@point_rule
def _method_needs_weights(p: Point) -> bool:
    return p["weight_bits"] != 0 or p["weight_method"] == "rtn"


@point_rule
def _data_aware_methods_write_4_bits(p: Point) -> bool:
    """HQQ and GPTQ write 4-bit blocks only; NNCF's AWQ and scale estimation are for 4 bits (8-bit weights are
    close enough to float without them, and NNCF refuses them there)."""
    return p["weight_method"] not in ("hqq", "gptq", "nncf_awq") or p["weight_bits"] == 4


@point_rule
def _nncf_reads_unfused_graphs(p: Point) -> bool:
    """NNCF knows standard ONNX only: the transformer fusion's contrib ops (Attention, SkipLayerNormalization)
    break its graph walk."""
    return p["weight_method"] not in ("nncf", "nncf_awq") or p["fusion"] in ("none", "conv")


WEIGHT_METHOD = Knob(
    name="weight_method",
    values=_method_values,
    recipe_field="transform.weights.method",
    spread=0.15,  # the data-aware methods buy back quality at the same speed; which wins depends on the model
    rules=(_method_needs_weights, _data_aware_methods_write_4_bits, _nncf_reads_unfused_graphs),
    backfill=("rtn",),
    override=ChoiceList("weight_methods", 230, WeightMethod, max_items=5, description="Weight-only methods to try."),
)


@point_rule
def _block_needs_int4(p: Point) -> bool:
    """Blocks mean something at 4 bits; 8-bit NNCF weights are per channel, and 8-bit blocks buy little."""
    return p["weight_bits"] == 4 or p["weight_block"] == 128


WEIGHT_BLOCK = Knob(
    name="weight_block",
    values=_where_weights(128, 64, 32),
    recipe_field="transform.weights.block_size",
    spread=0.05,
    cast=as_int,
    rules=(_block_needs_int4,),
    backfill=(128,),
    override=ChoiceList("weight_block_sizes", 240, WeightBlock, max_items=3, description="Weight block sizes."),
)


@point_rule
def _symmetry_the_method_allows(p: Point) -> bool:
    """GPTQ (ONNX Runtime's) writes symmetric blocks only, HQQ asymmetric ones; float weights have none."""
    if p["weight_bits"] == 0 or p["weight_method"] == "hqq":
        return not p["weight_symmetric"]
    if p["weight_method"] == "gptq":
        return bool(p["weight_symmetric"])
    return True


WEIGHT_SYMMETRIC = Knob(
    name="weight_symmetric",
    values=_where_weights(False, True),
    recipe_field="transform.weights.symmetric",
    spread=0.03,
    cast=bool,
    rules=(_symmetry_the_method_allows,),
    backfill=(False,),
    override=ChoiceList("weight_symmetric", 250, bool, max_items=2, description="Symmetric weight blocks or not."),
)


@point_rule
def _accuracy_level_is_matmulnbits(p: Point) -> bool:
    """accuracy_level is an attribute of ONNX Runtime's MatMulNBits kernel: OpenVINO and NNCF's DQ form ignore it."""
    if not p["weight_accuracy_level"]:
        return True
    return bool(p["weight_bits"]) and p["weight_method"] in ORT_WEIGHT_METHODS and p["runtime"] == "onnxruntime"


WEIGHT_ACCURACY_LEVEL = Knob(
    name="weight_accuracy_level",
    values=_where_weights(0, 4),
    recipe_field="transform.weights.accuracy_level",
    spread=0.15,  # int8 compute of MatMulNBits: a large gain where the CPU has VNNI, none (or a loss) elsewhere
    cast=as_int,
    rules=(_accuracy_level_is_matmulnbits,),
    backfill=(0,),
    override=ChoiceList(
        "weight_accuracy_levels",
        260,
        Literal[0, 4],
        max_items=2,
        description="MatMulNBits accuracy levels: 0 computes in float, 4 in int8 where the CPU has it.",
    ),
)


def _embedding_values(context: SpaceContext) -> tuple[Scalar, ...]:
    return (False, True) if context.options.weight_layers and context.options.embedding_tables else (False,)


@point_rule
def _embeddings_by_rtn_at_4_bits(p: Point) -> bool:
    return not p["weight_embeddings"] or (p["weight_bits"] == 4 and p["weight_method"] == "rtn")


WEIGHT_EMBEDDINGS = Knob(
    name="weight_embeddings",
    values=_embedding_values,
    recipe_field="transform.weights.embeddings",
    spread=0.05,
    cast=bool,
    rules=(_embeddings_by_rtn_at_4_bits,),
    backfill=(False,),
    override=ChoiceList(
        "weight_embeddings", 270, bool, max_items=2, description="Embedding tables in 4 bits too, or not."
    ),
)


@point_rule
def _int4_percent_is_nncfs(p: Point) -> bool:
    """Only NNCF mixes 4 and 8 bits by its own sensitivity metric; elsewhere the knob is pinned to all 4 bits."""
    return p["weight_int4_percent"] == 100 or (p["weight_bits"] == 4 and p["weight_method"] in ("nncf", "nncf_awq"))


WEIGHT_INT4_PERCENT = Knob(
    name="weight_int4_percent",
    values=_where_weights(100, 80, 60),
    recipe_field="transform.weights.int4_percent",
    spread=0.05,
    cast=as_int,
    rules=(_int4_percent_is_nncfs,),
    backfill=(100,),
    override=ChoiceList(
        "weight_int4_percents",
        290,
        WeightInt4Percent,
        max_items=3,
        description="NNCF int4: shares of the compressed weights in 4 bits (the rest, its most sensitive, in 8).",
    ),
)


def _weight_keep_values(context: SpaceContext) -> tuple[Scalar, ...]:
    layers = min(context.options.weight_layers, context.sensitive_layers)
    return tuple(sorted({keep_count(f, layers) for f in context.options.keep_float_fractions}))


@point_rule
def _keep_needs_weights_unfused(p: Point) -> bool:
    """Kept layers are named in the unfused graph (fusion renames them), and only quantized weights keep any."""
    return not p["weight_keep_float"] or (p["weight_bits"] != 0 and p["fusion"] == "none")


def _kept_weights(value: Scalar, point: Point, ranked_layers: RankedLayers) -> dict[str, object]:
    k = as_int(value)
    return {"transform.weights.keep_float": tuple(ranked_layers(WEIGHT_RANKING)[:k]) if k else ()}


WEIGHT_KEEP_FLOAT = Knob(
    name="weight_keep_float",
    values=_weight_keep_values,
    recipe_field="transform.weights.keep_float",
    spread=0.05,
    to_recipe=_kept_weights,
    from_recipe=lambda recipe: len(recipe.transform.weights.keep_float),
    rules=(_keep_needs_weights_unfused,),
    backfill=(0,),
    override=UpTo(
        "max_weight_keep_float_layers",
        280,
        maximum=1024,
        description="Weight-only quantization: at most this many of the most sensitive MatMuls kept in float.",
    ),
)

# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (
    WEIGHT_BITS,
    WEIGHT_METHOD,
    WEIGHT_BLOCK,
    WEIGHT_SYMMETRIC,
    WEIGHT_ACCURACY_LEVEL,
    WEIGHT_EMBEDDINGS,
    WEIGHT_KEEP_FLOAT,
    WEIGHT_INT4_PERCENT,
)
