"""Knobs declare themselves: the space, the recipe mapping, the policy's restrictions and the run settings
all follow from ``core.engine.knobs.KNOBS``, so a new knob is one declaration."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import numpy as np
import pytest

from metainfer.core.api import crdgen
from metainfer.core.api.policy import SearchSpaceOverrides, search_space_fields, search_space_model
from metainfer.core.control import runstatus
from metainfer.core.engine.candidates import SpaceOptions, build_space, recipe_for
from metainfer.core.engine.knobs import (
    DEFAULT_SPREAD,
    INT8_MODES,
    KNOBS,
    ChoiceList,
    Knob,
    UpTo,
    check_knobs,
    overridable,
    point_rule,
)
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.profile import HardwareProfile, MachineInfo, OpSupport
from metainfer.core.engine.search import SearchContext, builtin_prior
from metainfer.core.engine.search.space import Point

CPU = "CPUExecutionProvider"


def cpu_profile() -> HardwareProfile:
    """One EP, fp16 emulated: a small, fixed space for the digits model."""
    return HardwareProfile(
        fingerprint="fedcba9876543210",
        machine=MachineInfo(
            cpu_model="synthetic",
            arch="x86_64",
            logical_cores=4,
            physical_cores=2,
            total_memory_bytes=2**33,
            onnxruntime_version="1.0",
            execution_providers=[CPU],
        ),
        providers_profiled=[CPU],
        ops=[OpSupport(op_type="MatMul", dtype="fp16", provider=CPU, status="fallback")],
        peak_gemm_gflops_fp32=100,
        peak_gemm_gflops_int8=200,
        memory_bandwidth_gbps=10,
        measured_at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        duration_s=1,
    )


def _ranked(mode: str) -> list[str]:
    return [f"{mode}/n{i}" for i in range(8)]


# -- a knob declared here, in a test, and nowhere else ---------------------------------------------


@point_rule
def _reduce_range_needs_int8(p: Point) -> bool:
    """7-bit weights only mean something for integer weights."""
    return p["quantization"] in INT8_MODES or not p["reduce_range"]


REDUCE_RANGE = Knob(
    name="reduce_range",
    values=(False, True),
    recipe_field="transform.quantization.reduce_range",
    spread=0.07,
    effects={False: 0.0, True: -0.02},
    cast=bool,
    rules=(_reduce_range_needs_int8,),
    override=ChoiceList("reduce_ranges", 1000, bool, max_items=2, description="7-bit weights or not."),
)
WITH_TOY = (*KNOBS, REDUCE_RANGE)


def test_a_new_knob_joins_the_space_with_its_rules(digits) -> None:
    info: ModelInfo = digits[1]
    base, base_notes = build_space(info, cpu_profile(), SpaceOptions(), 3)
    space, notes = build_space(info, cpu_profile(), SpaceOptions(), 3, knobs=WITH_TOY)
    assert space.names == (*base.names, "reduce_range") and notes == base_notes
    assert space.dimensions[-1].choices == (False, True)
    points = space.allowed_points()
    reduced = [p for p in points if p["reduce_range"]]
    assert reduced and all(p["quantization"] in INT8_MODES for p in reduced)
    # The toy knob doubles exactly the int8 points; everything else is the space it joined.
    int8 = [p for p in base.allowed_points() if p["quantization"] in INT8_MODES]
    assert len(points) == len(base.allowed_points()) + len(int8)
    assert [{k: v for k, v in p.items() if k != "reduce_range"} for p in points if not p["reduce_range"]] == (
        base.allowed_points()
    )

    restricted, _ = build_space(
        info, cpu_profile(), SpaceOptions(overrides={"reduce_range": (True,)}), 3, knobs=WITH_TOY
    )
    assert restricted.dimensions[-1].choices == (True,)
    assert all(p["quantization"] in INT8_MODES for p in restricted.allowed_points())


def test_a_new_knob_maps_into_the_recipe(digits) -> None:
    space, _ = build_space(digits[1], cpu_profile(), SpaceOptions(), 3, knobs=WITH_TOY)
    for point in space.allowed_points():
        recipe = recipe_for(point, _ranked, knobs=WITH_TOY)
        assert REDUCE_RANGE.read(recipe) is point["reduce_range"]
        # The registered knobs map the rest of the point exactly as they do without the toy knob.
        without = recipe_for({k: v for k, v in point.items() if k != "reduce_range"}, _ranked)
        assert recipe == without.model_copy(
            update={
                "transform": without.transform.model_copy(
                    update={
                        "quantization": without.transform.quantization.model_copy(
                            update={"reduce_range": point["reduce_range"]}
                        )
                    }
                )
            }
        )


def test_a_new_knob_states_what_the_prior_believes_of_it(digits) -> None:
    space, _ = build_space(digits[1], cpu_profile(), SpaceOptions(), 3, knobs=WITH_TOY)
    context = SearchContext.from_peaks(100, 200, 4, 2, False)
    prior = builtin_prior(space, context, knobs=WITH_TOY)
    assert prior.spread == tuple(k.spread for k in WITH_TOY)
    assert list(prior.effects[-1]) == [0.0, -0.02]
    # The registry's prior has no declaration for it: the default spread, and its choices rank by position.
    registered = builtin_prior(space, context)
    assert registered.spread[-1] == DEFAULT_SPREAD and list(registered.effects[-1]) == [0.0, -0.01]
    assert all(np.array_equal(a, b) for a, b in zip(registered.effects[:-1], prior.effects[:-1], strict=True))


def test_a_new_knob_becomes_a_policy_restriction_and_run_setting() -> None:
    model = search_space_model(WITH_TOY)
    assert list(model.model_fields) == [*SearchSpaceOverrides.model_fields, "reduce_ranges"]
    schema = crdgen.structural(model.model_json_schema(by_alias=True))
    assert schema["properties"]["reduceRanges"] == {
        "type": "array",
        "description": "7-bit weights or not.",
        "minItems": 1,
        "maxItems": 2,
        "items": {"type": "boolean"},
        "x-kubernetes-list-type": "set",
    }
    policy = model.model_validate({"reduceRanges": [True], "layouts": ["NCHW"]})
    assert runstatus.space_overrides(policy, WITH_TOY) == {"layout": ["NCHW"], "reduce_range": [True]}
    with pytest.raises(ValueError, match="reduceRanges"):
        model.model_validate({"reduceRanges": []})


def test_the_toy_knob_is_not_registered() -> None:
    assert REDUCE_RANGE not in KNOBS
    assert "reduce_ranges" not in SearchSpaceOverrides.model_fields
    assert "reduce_ranges" not in runstatus.OVERRIDE_DIMENSIONS


# -- the real registry ---------------------------------------------------------------------------------


def test_the_policy_model_and_run_mapping_are_derived_from_the_knobs() -> None:
    fields = [override.field for _, override in overridable(KNOBS)]
    assert list(SearchSpaceOverrides.model_fields) == fields == list(search_space_fields())
    # The policy's names for the dimensions, in the CRD's order of spec.search.searchSpace (pinned:
    # reordering would churn every generated CRD).
    pinned = {
        "quantization": "quantization",
        "graph_optimization_levels": "graph_optimization_level",
        "layouts": "layout",
        "fusions": "fusion",
        "execution_modes": "execution_mode",
        "execution_providers": "execution_provider",
        "intra_op_threads": "intra_op_num_threads",
        "max_keep_float_layers": "keep_float",
        "runtimes": "runtime",
        "openvino_hints": "openvino_hint",
        "max_openvino_streams": "openvino_streams",
        "openvino_precisions": "openvino_precision",
        "quantizers": "quantizer",
        "activations": "activations",
        "cuda_conv_algo_searches": "cuda_conv_algo_search",
        "cuda_tf32": "cuda_tf32",
        "cuda_arena_extend_strategies": "cuda_arena_extend_strategy",
        "tensorrt_fp16": "tensorrt_fp16",
        "tensorrt_builder_optimization_levels": "tensorrt_builder_optimization_level",
        "openvino_ep_precisions": "openvino_ep_precision",
        "openvino_ep_streams": "openvino_ep_streams",
        "weight_bits": "weight_bits",
        "weight_methods": "weight_method",
        "weight_block_sizes": "weight_block",
        "weight_symmetric": "weight_symmetric",
        "weight_accuracy_levels": "weight_accuracy_level",
        "weight_embeddings": "weight_embeddings",
        "max_weight_keep_float_layers": "weight_keep_float",
        "weight_int4_percents": "weight_int4_percent",
    }
    assert list(pinned.items()) == list(runstatus.OVERRIDE_DIMENSIONS.items())
    assert list(pinned) == fields


def test_every_policy_restriction_reaches_the_space(digits) -> None:
    """policy field -> run settings -> SpaceOptions.overrides -> the dimension keeps only what was asked."""
    info: ModelInfo = digits[1]
    full, _ = build_space(info, cpu_profile(), SpaceOptions(), 3)
    for knob, override in overridable(KNOBS):
        dimension = full.dimensions[full.names.index(knob.name)]
        value: object = 0 if isinstance(override, UpTo) else [dimension.choices[-1]]
        policy = SearchSpaceOverrides.model_validate({override.field: value})
        overrides = runstatus.space_overrides(policy)
        assert list(overrides) == [knob.name]
        space, _ = build_space(
            info, cpu_profile(), SpaceOptions(overrides={k: tuple(v) for k, v in overrides.items()}), 3
        )
        kept = space.dimensions[space.names.index(knob.name)].choices
        assert kept == ((0,) if isinstance(override, UpTo) else (dimension.choices[-1],)), knob.name


def test_every_knob_writes_its_own_recipe_fields(digits) -> None:
    space, _ = build_space(digits[1], cpu_profile(), SpaceOptions(), 3)
    point = space.allowed_points()[0]
    written = [set(k.recipe_values(point, _ranked)) for k in KNOBS]
    for knob, fields in zip(KNOBS, written, strict=True):
        assert knob.recipe_field in fields, knob.name
    assert sum(len(f) for f in written) == len(set().union(*written))  # no field written by two knobs


def test_recipe_for_backfills_only_declared_knobs(digits) -> None:
    space, _ = build_space(digits[1], cpu_profile(), SpaceOptions(), 3)
    point = space.allowed_points()[0]
    # Points recorded before padding removal existed have no "padding" and keep it.
    old = {k: v for k, v in point.items() if k != "padding"}
    assert recipe_for(old, _ranked) == recipe_for(point, _ranked)
    with pytest.raises(KeyError):
        recipe_for({k: v for k, v in point.items() if k != "batch"}, _ranked)


def test_declaration_mistakes_are_refused() -> None:
    clash = Knob(name="fusion", values=("none",), recipe_field="transform.quantization.reduce_range", spread=0.1)
    with pytest.raises(ValueError, match="duplicate knob names"):
        check_knobs((*KNOBS, clash))
    same_field = Knob(
        name="other",
        values=(1,),
        recipe_field="transform.quantization.reduce_range",
        spread=0.1,
        override=ChoiceList("layouts", 2000, int, max_items=1),
    )
    with pytest.raises(ValueError, match="duplicate override fields"):
        search_space_fields((*KNOBS, same_field))
    same_recipe = Knob(name="other", values=(1,), recipe_field="batch", spread=0.1)
    with pytest.raises(ValueError, match="duplicate recipe fields"):
        check_knobs((*KNOBS, same_recipe))
    with pytest.raises(ValueError, match="duplicate override positions"):
        clashing_position = UpTo("x", 10, maximum=1)
        check_knobs((*KNOBS, Knob(name="x", values=(0,), recipe_field="y", spread=0.1, override=clashing_position)))


def test_the_declarations_import_nothing_heavy() -> None:
    """The operator reads the policy types, which are built from the knobs: no inference stack behind them."""
    code = (
        "import sys, metainfer.core.engine.knobs, metainfer.core.api.policy\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'onnx', 'onnxruntime', 'skopt', 'sklearn'})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("ops", "int8_kept"),
    [
        ({"ai.onnx.ml.TreeEnsembleClassifier": 1}, False),  # a forest: nothing int8 computes in integers
        ({"ai.onnx.ml.Scaler": 1, "ai.onnx.ml.LinearClassifier": 1}, False),
        ({"Add": 3, "Relu": 2}, False),  # element-wise only: quantize/dequantize pairs and nothing faster
        ({"Gather": 1, "ReduceMean": 1}, True),  # an embedding: dynamic int8 shrinks its table
        ({"Loop": 1, "Add": 1}, True),  # its body may hold MatMuls, which the quantizers walk into
        ({"com.microsoft.Attention": 2, "LayerNormalization": 2}, True),
    ],
)
def test_int8_is_searched_only_where_the_model_has_ops_it_computes_in_integers(
    digits, ops: dict[str, int], int8_kept: bool
) -> None:
    """A tree ensemble's search spent 5 of its 6 trials on int8 variants that were its FP32 graph again."""
    info = digits[1].model_copy(update={"op_counts": ops})
    space, notes = build_space(info, cpu_profile(), SpaceOptions(), 3)
    modes = space.dimensions[space.names.index("quantization")].choices
    assert bool(set(modes) & set(INT8_MODES)) == int8_kept, modes
    assert any(n.startswith("int8 left out: the model has none") for n in notes) != int8_kept
    assert "fp32" in modes
