"""Execution-provider options as knobs: what makes an accelerator's EP fast beyond choosing it.

CUDA: cuDNN's convolution algorithm search (EXHAUSTIVE benchmarks every algorithm once per shape, HEURISTIC and
DEFAULT skip that), TF32 tensor cores for float32 matmuls and convolutions (faster on Ampere and later, about 10
bits of mantissa: the quality check decides whether it stays within the budget), and how the memory arena grows.
TensorRT: FP16 kernels and the builder's optimisation level (more build time, possibly faster engines). The
OpenVINO EP (the ``openvino`` image flavour): its inference precision and number of streams.

Each knob has its choices only where the profile found its EP usable on the node (``execution_provider``'s own
values are the profiled, usable EPs); elsewhere only its first choice, which is ONNX Runtime's default, so a space
on a machine without that EP is the space before these knobs existed. A rule pins each to that first choice on
points of another EP, so no two allowed points build the same recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from metainfer.core.engine.knobs.base import ChoiceList, Knob, SpaceContext, as_int, point_rule
from metainfer.core.engine.knobs.session import provider_values
from metainfer.core.engine.recipe import ArenaExtendStrategy, CudnnConvAlgoSearch, OpenVinoEpPrecision

if TYPE_CHECKING:
    from metainfer.core.engine.knobs.base import Rule
    from metainfer.core.engine.search.space import Point, Scalar

CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
OPENVINO_EP = "OpenVINOExecutionProvider"


def _only_with(provider: str, values: tuple[Scalar, ...]) -> Callable[[SpaceContext], tuple[Scalar, ...]]:
    """The knob's choices where ``provider`` is usable here; elsewhere only its first (ONNX Runtime's default)."""

    def choices(context: SpaceContext) -> tuple[Scalar, ...]:
        return values if provider in provider_values(context) else values[:1]

    return choices


def _pinned_off(provider: str, knob: str, default: Scalar) -> Rule:
    """Points of another EP keep ``knob`` at its default: the option means nothing to them."""

    @point_rule
    def rule(p: Point) -> bool:
        return p["execution_provider"] == provider or p[knob] == default

    rule.__doc__ = f"{knob} is an option of {provider} only."
    return rule


def _provider_knob(
    name: str,
    provider: str,
    values: tuple[Scalar, ...],
    recipe_field: str,
    override: ChoiceList,
    *,
    spread: float,
    effects: dict[Scalar, float] | None = None,
    cast: Callable[[Scalar], object] = str,
) -> Knob:
    return Knob(
        name=name,
        values=_only_with(provider, values),
        recipe_field=recipe_field,
        spread=spread,
        effects=effects or {},
        rules=(_pinned_off(provider, name, values[0]),),
        backfill=(values[0],),  # points recorded before the knob existed ran with ONNX Runtime's default
        override=override,
        cast=cast,
    )


CUDA_CONV_ALGO_SEARCH = _provider_knob(
    "cuda_conv_algo_search",
    CUDA,
    ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
    "session.ep.cuda_cudnn_conv_algo_search",
    ChoiceList(
        "cuda_conv_algo_searches",
        150,
        CudnnConvAlgoSearch,
        max_items=3,
        description="CUDA EP: cuDNN convolution algorithm searches to try.",
    ),
    spread=0.15,
    # EXHAUSTIVE picks the fastest algorithm per shape; the others only save the first run's search.
    effects={"EXHAUSTIVE": 0.0, "HEURISTIC": -0.03, "DEFAULT": -0.08},
)
CUDA_TF32 = _provider_knob(
    "cuda_tf32",
    CUDA,
    (True, False),
    "session.ep.cuda_use_tf32",
    ChoiceList("cuda_tf32", 160, bool, max_items=2, description="CUDA EP: TF32 tensor cores on or off."),
    spread=0.15,
    effects={True: 0.0, False: -0.05},
    cast=bool,
)
CUDA_ARENA = _provider_knob(
    "cuda_arena_extend_strategy",
    CUDA,
    ("kNextPowerOfTwo", "kSameAsRequested"),
    "session.ep.cuda_arena_extend_strategy",
    ChoiceList(
        "cuda_arena_extend_strategies",
        170,
        ArenaExtendStrategy,
        max_items=2,
        description="CUDA EP: how its memory arena grows (device memory against allocations).",
    ),
    spread=0.03,
)
TENSORRT_FP16 = _provider_knob(
    "tensorrt_fp16",
    TENSORRT,
    (False, True),
    "session.ep.tensorrt_fp16",
    ChoiceList("tensorrt_fp16", 180, bool, max_items=2, description="TensorRT EP: FP16 kernels off or on."),
    spread=0.3,
    effects={False: 0.0, True: 0.3},
    cast=bool,
)
TENSORRT_BUILDER_LEVEL = _provider_knob(
    "tensorrt_builder_optimization_level",
    TENSORRT,
    (3, 5, 1),
    "session.ep.tensorrt_builder_optimization_level",
    ChoiceList(
        "tensorrt_builder_optimization_levels",
        190,
        Annotated[int, Field(ge=0, le=5)],
        max_items=6,
        description="TensorRT EP: builder optimisation levels (0-5) to try.",
    ),
    spread=0.05,
    cast=as_int,
)
OPENVINO_EP_PRECISION = _provider_knob(
    "openvino_ep_precision",
    OPENVINO_EP,
    ("FP32", "ACCURACY", "FP16"),
    "session.ep.openvino_precision",
    ChoiceList(
        "openvino_ep_precisions",
        200,
        OpenVinoEpPrecision,
        max_items=3,
        description="OpenVINO EP: inference precisions to try.",
    ),
    spread=0.15,
)
OPENVINO_EP_STREAMS = _provider_knob(
    "openvino_ep_streams",
    OPENVINO_EP,
    (1, 2),
    "session.ep.openvino_num_streams",
    ChoiceList(
        "openvino_ep_streams",
        210,
        Annotated[int, Field(ge=1, le=64)],
        max_items=8,
        description="OpenVINO EP: numbers of streams to try.",
    ),
    spread=0.05,
    # The objective is one request's p95: more streams split the cores between requests.
    effects={1: 0.0, 2: -0.05},
    cast=as_int,
)

# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (
    CUDA_CONV_ALGO_SEARCH,
    CUDA_TF32,
    CUDA_ARENA,
    TENSORRT_FP16,
    TENSORRT_BUILDER_LEVEL,
    OPENVINO_EP_PRECISION,
    OPENVINO_EP_STREAMS,
)
