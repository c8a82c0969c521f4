"""NNCF as a second static int8 quantizer (issue 30 item 1): the recipe field, the variant it writes (QDQ ONNX that
either runtime loads, rebuilt byte for byte, mixed precision through its ignored scope), and a search over it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.pipeline import Adaptation, AdaptSettings
from metainfer.core.engine.profile import HardwareProfile
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.reference import Reference, make_reference, quality_of, run_all, top1_accuracy
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.scoring import Constraints
from metainfer.core.engine.sensitivity import accuracy_control
from metainfer.core.engine.transforms import build_variant
from metainfer.core.engine.transforms.build import PROVENANCE_PREFIX, quantizable_nodes

pytest.importorskip("nncf")

NNCF = {"mode": "int8_static", "quantizer": "nncf"}


def test_the_quantizer_is_left_out_of_stamps_and_keys_at_its_default_and_nncf_writes_static_qdq_only() -> None:
    assert "quantizer" not in Recipe().transform.model_dump_json()  # variants built before it keep their bytes
    assert Recipe().key() == "9f6dbef17ce4a69d"
    nncf = Recipe.model_validate({"transform": {"quantization": NNCF}})
    assert nncf.describe() == "int8 static (NNCF), default threads"
    assert Recipe.model_validate_json(nncf.model_dump_json()) == nncf
    for wrong in ({"mode": "int8_dynamic"}, {"format": "qoperator"}):
        with pytest.raises(ValueError, match="quantizer nncf writes static int8 in QDQ form"):
            Recipe.model_validate({"transform": {"quantization": {**NNCF, **wrong}}})


def test_nncf_writes_a_qdq_variant_both_runtimes_run_and_keeps_named_layers_in_float(
    digits: tuple[bytes, ModelInfo, Dataset],
) -> None:
    base, _, data = digits
    kept = quantizable_nodes(onnx.load_from_string(base), "int8_static")[0]
    recipe = Recipe.model_validate({"transform": {"quantization": {**NNCF, "keep_float": [kept]}}, "batch": 8})
    calibration = data.head(64)
    variant = build_variant(base, recipe.transform, calibration)
    assert variant == build_variant(base, recipe.transform, calibration), "a serving pod rebuilds the same bytes"
    model = onnx.load_from_string(variant)
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props[f"{PROVENANCE_PREFIX}transform"])["quantization"]["quantizer"] == "nncf"
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    (node,) = [n for n in model.graph.node if n.name == kept]
    assert not set(node.input) & dequantized, "the kept layer reads float weights and activations"

    labels = data.labels
    assert labels is not None
    feed = dict(data.inputs)
    fp32 = top1_accuracy(create_session(base, Recipe()).run(None, feed)[0], labels)
    on_ort = create_session(variant, recipe).run(None, feed)[0]
    assert top1_accuracy(on_ort, labels) >= fp32 - 0.02
    pytest.importorskip("openvino")
    on_openvino = Recipe.model_validate({**recipe.model_dump(), "session": {"runtime": "openvino"}})
    np.testing.assert_allclose(create_session(variant, on_openvino).run(None, feed)[0], on_ort, atol=0.05)


def test_a_search_offered_nncf_measures_its_variants(
    digits: tuple[bytes, ModelInfo, Dataset], quick_profile: HardwareProfile
) -> None:
    base, info, data = digits
    settings = AdaptSettings(
        batch=8, budget_trials=2, algorithm="random",
        overrides={"quantizer": ("nncf",), "quantization": ("int8_static",), "keep_float": (0,)},
    )  # fmt: skip
    report, _ = Adaptation(base, info, data, quick_profile, settings).run()
    measured = [t for t in report.trials if t.index > 0]
    assert measured and all(t.recipe.transform.quantization.quantizer == "nncf" for t in measured)
    assert all(t.metrics is not None for t in measured), [t.error for t in measured]


def _cosine_reference(base: bytes, data: Dataset, batch: int) -> Reference:
    """FP32's outputs without the labels: quality is cosine similarity, whose drop int8 never leaves at zero."""
    return make_reference(create_session(base, Recipe()), Dataset(inputs=dict(data.inputs)), batch)


def test_nncf_accuracy_control_keeps_in_float_what_meets_the_budget_and_its_names_rebuild_that_variant(
    digits: tuple[bytes, ModelInfo, Dataset],
) -> None:
    base, _, data = digits
    quality_data = Dataset(inputs={k: v[:64] for k, v in data.inputs.items()})
    reference = _cosine_reference(base, quality_data, 8)
    calibration = data.head(64)

    def drop(keep: list[str]) -> float:
        spec = Recipe.model_validate({"transform": {"quantization": {**NNCF, "keep_float": keep}}}).transform
        variant = build_variant(base, spec, calibration)
        return quality_of(run_all(create_session(variant, Recipe()), quality_data, 8), reference).drop

    plain = drop([])
    assert plain > 0
    loose = accuracy_control(base, calibration, quality_data, reference, 8, max_quality_drop=1.0, max_kept=4)
    assert loose.quantizer == "nncf" and loose.kept_to_meet_budget == []
    budget = plain / 4
    tight = accuracy_control(base, calibration, quality_data, reference, 8, max_quality_drop=budget, max_kept=4)
    kept = tight.kept_to_meet_budget
    assert kept and len(kept) <= 4
    assert tight.ranked()[: len(kept)] == kept, "what the control kept ranks first"
    assert set(tight.ranked()) >= set(quantizable_nodes(onnx.load_from_string(base), "int8_static")) - set(kept)
    assert drop(kept) < plain, "the kept operations, as an ignored scope, rebuild a closer variant"


def test_a_search_keeping_layers_in_float_under_nncf_takes_them_from_its_accuracy_control(
    digits: tuple[bytes, ModelInfo, Dataset], quick_profile: HardwareProfile
) -> None:
    base, info, data = digits
    unlabelled = Dataset(inputs=dict(data.inputs))
    settings = AdaptSettings(
        batch=8, budget_trials=3, algorithm="random", constraints=Constraints(max_quality_drop=1e-6),
        overrides={"quantizer": ("nncf",), "quantization": ("int8_static",), "threads": (1,)},
    )  # fmt: skip
    report, _ = Adaptation(base, info, unlabelled, quick_profile, settings).run()
    (nncf,) = [s for s in report.sensitivity if s.quantizer == "nncf"]
    assert nncf.kept_to_meet_budget, "plain int8 misses a budget of 1e-6 in cosine"
    mixed = [t for t in report.trials if t.recipe.transform.quantization.keep_float]
    assert mixed, [(t.point, t.error) for t in report.trials]
    for trial in mixed:
        keep = list(trial.recipe.transform.quantization.keep_float)
        assert keep == nncf.ranked()[: len(keep)]
