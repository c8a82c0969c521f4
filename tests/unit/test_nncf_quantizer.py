"""NNCF as a second static int8 quantizer (issue 30 item 1): the recipe field, the variant it writes (QDQ ONNX that
either runtime loads, rebuilt byte for byte, mixed precision through its ignored scope), and a search over it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import top1_accuracy
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.pipeline import Adaptation, AdaptSettings
from metainfer.core.engine.profile import HardwareProfile
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session
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
