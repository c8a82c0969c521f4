"""OpenVINO as the second runtime: the recipe and its key, the session seam, the profile's probe, the knobs' rules,
and a search that measures candidates on it."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pytest

from metainfer.agent import variant_store
from metainfer.core.engine.candidates import SpaceOptions, build_space, recipe_for
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.errors import ProviderUnavailable
from metainfer.core.engine.knobs import openvino as openvino_knobs
from metainfer.core.engine.knobs.openvino import BF16_FLAGS
from metainfer.core.engine.modelinfo import ModelInfo, inspect_model
from metainfer.core.engine.pipeline import Adaptation, AdaptSettings
from metainfer.core.engine.profile import HardwareProfile
from metainfer.core.engine.profile.measure import probe_openvino
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session
from metainfer.core.engine.runtime_openvino import (
    OPENVINO_PROVIDER,
    OpenVinoSession,
    compile_config,
    compiled_cache_key,
)

pytest.importorskip("openvino")

OPENVINO = Recipe.model_validate({"session": {"runtime": "openvino"}})
THROUGHPUT = Recipe.model_validate({"session": {"runtime": "openvino", "openvino": {"performance_hint": "throughput"}}})


def test_recipes_of_onnx_runtime_keep_the_keys_they_had_before_openvino_was_a_choice() -> None:
    # Pinned: the operator compares keys to decide rollouts, so a new session field must not move existing keys.
    assert Recipe().key() == "9f6dbef17ce4a69d"
    assert OPENVINO.key() != Recipe().key()
    assert OPENVINO.transform_key() == Recipe().transform_key()  # same bytes for both runtimes


def test_an_openvino_recipe_is_described_and_refuses_an_onnx_runtime_provider() -> None:
    tuned = Recipe.model_validate(
        {"session": {"runtime": "openvino", "intra_op_num_threads": 2,
                     "openvino": {"performance_hint": "throughput", "num_streams": 2, "inference_precision": "bf16"}}}
    )  # fmt: skip
    assert tuned.describe() == "FP32, 2 threads, on OpenVINO (throughput hint, 2 streams, bf16 compute)"
    assert compile_config(tuned) == {
        "PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_PRECISION_HINT": "bf16", "NUM_STREAMS": 2,
        "INFERENCE_NUM_THREADS": 2,
    }  # fmt: skip
    with pytest.raises(ValueError, match="execution_provider must be CPUExecutionProvider"):
        Recipe.model_validate({"session": {"runtime": "openvino", "execution_provider": "CUDAExecutionProvider"}})


def test_a_session_on_openvino_answers_as_onnx_runtime_does(digits: tuple[bytes, ModelInfo, Dataset]) -> None:
    base, _, data = digits
    feed = {name: array[:8] for name, array in data.inputs.items()}
    on_ort = create_session(base, Recipe())
    on_ov = create_session(base, OPENVINO)
    assert on_ov.get_providers() == [OPENVINO_PROVIDER]
    assert [(a.name, a.type) for a in on_ov.get_inputs()] == [(a.name, a.type) for a in on_ort.get_inputs()]
    assert [a.name for a in on_ov.get_outputs()] == [a.name for a in on_ort.get_outputs()]
    expected = on_ort.run(None, feed)
    got = on_ov.run(None, feed)
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4)
    name = on_ort.get_outputs()[0].name
    np.testing.assert_allclose(on_ov.run([name], feed)[0], expected[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="unknown output"):
        on_ov.run(["nope"], feed)


def test_a_precision_openvino_would_quietly_replace_is_refused(digits: tuple[bytes, ModelInfo, Dataset]) -> None:
    if BF16_FLAGS & _cpu_flags():
        pytest.skip("this CPU computes bf16 natively")
    bf16 = Recipe.model_validate({"session": {"runtime": "openvino", "openvino": {"inference_precision": "bf16"}}})
    with pytest.raises(ProviderUnavailable, match="asked for bf16 inference precision, OpenVINO compiled f32"):
        create_session(digits[0], bf16)


def test_the_profile_finds_openvino_usable_here() -> None:
    found = probe_openvino()
    assert found.usable, found.unusable_reason
    assert "CPU" in found.devices


def test_openvino_points_keep_to_what_it_reads_and_pin_the_onnx_runtime_settings(
    tiny_conv: tuple[object, object], quick_profile: HardwareProfile
) -> None:
    info = inspect_model(tiny_conv[0])  # type: ignore[arg-type]
    space, notes = build_space(info, quick_profile, SpaceOptions(batch=2), 3)
    assert not [n for n in notes if "openvino" in n]
    layers = [f"n{i}" for i in range(8)]
    recipes = [recipe_for(space.point(k), lambda mode: layers) for k in space.allowed_keys()]
    on_openvino = [r for r in recipes if r.session.runtime == "openvino"]
    on_ort = [r for r in recipes if r.session.runtime == "onnxruntime"]
    assert on_openvino and on_ort
    for r in on_openvino:
        q = r.transform.quantization
        assert q.mode in ("fp32", "int8_static") and q.format == "qdq"
        assert r.transform.fusion in ("none", "conv") and r.transform.layout == "NCHW"
        assert (r.session.graph_optimization_level, r.session.execution_mode) == ("all", "sequential")
        assert r.session.openvino.num_streams == 0 or r.session.openvino.performance_hint == "throughput"
    assert {r.session.openvino.model_dump_json() for r in on_ort} == {OPENVINO.session.openvino.model_dump_json()}
    assert len({r.key() for r in recipes}) == len(recipes)


def test_a_search_restricted_to_openvino_measures_its_candidates_there(
    digits: tuple[bytes, ModelInfo, Dataset], quick_profile: HardwareProfile
) -> None:
    base, info, data = digits
    settings = AdaptSettings(
        batch=4, budget_trials=4, algorithm="random",
        overrides={"runtime": ("openvino",), "quantization": ("fp32", "int8_static")},
    )  # fmt: skip
    report, _ = Adaptation(base, info, data, quick_profile, settings).run()
    measured = [t for t in report.trials if t.error is None]
    assert measured, [t.error for t in report.trials]
    assert all(t.recipe.session.runtime == "openvino" for t in report.trials)
    # The peers an OpenVINO user runs come first: OpenVINO on the FP32 model, then with NNCF's int8.
    first = [t.recipe for t in report.trials[:2]]
    assert first[0].session.runtime == "openvino" and first[0].transform.quantization.mode == "fp32"
    assert first[1].transform.quantization.quantizer == "nncf"
    assert report.best.recipe.session.runtime in ("openvino", "onnxruntime")  # FP32 on ORT when nothing beat it


def _cpu_flags() -> set[str]:
    from metainfer.core.engine.profile import detect_machine

    return set(detect_machine().cpu_flags)


def test_a_point_recorded_before_the_runtime_knobs_existed_reads_as_onnx_runtime(
    tiny_conv: tuple[object, object], quick_profile: HardwareProfile
) -> None:
    info = inspect_model(tiny_conv[0])  # type: ignore[arg-type]
    space, _ = build_space(info, quick_profile, SpaceOptions(batch=2), 3)
    layers = [f"n{i}" for i in range(8)]
    for key in space.allowed_keys()[:50]:
        point = space.point(key)
        if point["runtime"] != "onnxruntime":
            continue
        old = {name: value for name, value in point.items() if name not in {k.name for k in openvino_knobs.KNOBS}}
        assert recipe_for(old, lambda mode: layers) == recipe_for(point, lambda mode: layers)


def test_a_compiled_model_is_imported_from_its_cache_not_compiled_again(
    digits: tuple[bytes, ModelInfo, Dataset], tmp_path: Path
) -> None:
    base, _, data = digits
    key = compiled_cache_key(variant_store.sha256_of(base), OPENVINO)
    assert key != compiled_cache_key(variant_store.sha256_of(base), THROUGHPUT), "settings are part of the key"
    assert key != compiled_cache_key("0" * 64, OPENVINO), "the variant is part of the key"
    path = variant_store.put_compiled(tmp_path, key, lambda d: _compile(base, OPENVINO, d))
    cache = variant_store.compiled(tmp_path, key)
    assert cache == path
    imported = create_session(base, OPENVINO, cache)
    assert isinstance(imported, OpenVinoSession) and imported.loaded_from_cache
    assert not cast(OpenVinoSession, create_session(base, OPENVINO)).loaded_from_cache
    feed = {name: array[:4] for name, array in data.inputs.items()}
    np.testing.assert_allclose(
        imported.run(None, feed)[0], create_session(base, Recipe()).run(None, feed)[0], atol=1e-4
    )


def _compile(model: bytes, recipe: Recipe, directory: Path) -> None:
    create_session(model, recipe, directory)


def test_operations_openvino_cannot_run_are_named_and_keep_the_model_on_onnx_runtime(
    digits: tuple[bytes, ModelInfo, Dataset], quick_profile: HardwareProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnx import TensorProto, helper

    from metainfer.core.engine import runtime_openvino

    graph = helper.make_graph(
        [helper.make_node("StringNormalizer", ["x"], ["y"])], "strings",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [4])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [4])],
    )  # fmt: skip
    strings = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    assert runtime_openvino.unsupported_ops(strings) == ["StringNormalizer-17"]
    base, info, data = digits
    assert runtime_openvino.unsupported_ops(base) == []

    monkeypatch.setattr(runtime_openvino, "unsupported_ops", lambda model: ["NonMaxSuppression-10"])
    settings = AdaptSettings(batch=4, budget_trials=2, algorithm="random", overrides={"quantization": ("fp32",)})
    report, _ = Adaptation(base, info, data, quick_profile, settings).run()
    assert all(t.recipe.session.runtime == "onnxruntime" for t in report.trials)
    assert "runtime openvino left out: its CPU plugin does not run NonMaxSuppression-10" in report.space.notes
