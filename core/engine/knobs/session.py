"""ONNX Runtime session knobs (execution provider, optimization level, threads,
execution mode) and the batch size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, StringConstraints

from metainfer.core.engine.knobs.base import (
    ChoiceList,
    Knob,
    SpaceContext,
    as_int,
    point_rule,
)
from metainfer.core.engine.profile.types import HardwareProfile
from metainfer.core.engine.recipe import ExecutionMode, GraphOptimizationLevel

if TYPE_CHECKING:
    from metainfer.core.engine.knobs.base import RankedLayers
    from metainfer.core.engine.search.prior import SearchContext
    from metainfer.core.engine.search.space import Point, Scalar


def provider_values(context: SpaceContext) -> tuple[Scalar, ...]:
    """The EPs the profile measured here and found usable (it profiles only those), CPU where none."""
    profile = context.profile
    providers = [p for p in profile.providers_profiled if p in profile.machine.execution_providers]
    return tuple(providers or ["CPUExecutionProvider"])


def _accelerator_first(provider: Scalar, context: SearchContext) -> float:
    """An accelerator's execution provider is expected to beat the CPU's."""
    return 0.0 if provider == "CPUExecutionProvider" else 0.3


EXECUTION_PROVIDER = Knob(
    name="execution_provider",
    values=provider_values,
    recipe_field="session.execution_provider",
    spread=0.4,
    context_effect=_accelerator_first,
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
    spread=0.1,
    effects={"all": 0.0, "extended": -0.03, "basic": -0.1},
    override=ChoiceList("graph_optimization_levels", 20, GraphOptimizationLevel, max_items=4),
)


def thread_choices(profile: HardwareProfile) -> tuple[int, ...]:
    cores = profile.machine.physical_cores
    logical = profile.machine.logical_cores
    return tuple(sorted({1, max(1, cores // 2), cores, logical}))


def _threads_near_the_cores(choice: Scalar, context: SearchContext) -> float:
    """Best at the physical cores (ONNX Runtime's default, which 0 stands for), worse by octaves away from them."""
    cores = threads = float(context.physical_cores)
    if isinstance(choice, int | float) and not isinstance(choice, bool) and choice > 0:
        threads = float(choice)
    return -0.1 * abs(math.log2(threads / cores))


INTRA_OP_NUM_THREADS = Knob(
    name="intra_op_num_threads",
    values=lambda c: thread_choices(c.profile),
    recipe_field="session.intra_op_num_threads",
    spread=0.4,
    context_effect=_threads_near_the_cores,
    cast=as_int,
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
    spread=0.1,
    effects={"sequential": 0.0, "parallel": -0.1},
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


BATCH = Knob(name="batch", values=_batch_values, recipe_field="batch", spread=0.3, cast=as_int)


# This area's knobs, in the order they join the space (core.engine.knobs.KNOBS).
KNOBS: tuple[Knob, ...] = (
    EXECUTION_PROVIDER,
    GRAPH_OPTIMIZATION_LEVEL,
    INTRA_OP_NUM_THREADS,
    EXECUTION_MODE,
    BATCH,
)
