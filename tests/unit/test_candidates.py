"""The search space follows the model and the measured profile."""

from __future__ import annotations

from pathlib import Path

from metainfer.core.engine.candidates import SpaceOptions, build_space, recipe_for, unsupported_reason
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.profile import HardwareProfile, OpSupport


def test_space_prunes_what_the_profile_says_cannot_run(digits, quick_profile: HardwareProfile) -> None:
    _, info, _ = digits
    space, notes = build_space(info, quick_profile, SpaceOptions(batch=8), sensitive_layers=3)
    points = space.allowed_points()
    assert points, notes
    # fp16 only runs emulated on ONNX Runtime's CPU EP (measured by the profile), so it is pruned.
    if quick_profile.support("MatMul", "fp16", "CPUExecutionProvider") == "fallback":
        assert all(p["quantization"] != "fp16" for p in points)
        assert any("fp16" in n for n in notes)
    assert all(p["batch"] == 8 for p in points)
    assert all(p["fusion"] == "none" and p["layout"] == "NCHW" for p in points)  # no transformer, no conv


def test_allowed_points_build_distinct_recipes(digits, quick_profile: HardwareProfile) -> None:
    _, info, _ = digits
    space, _ = build_space(info, quick_profile, SpaceOptions(), sensitive_layers=3)
    layers = ["a", "b", "c"]
    recipes = [recipe_for(p, lambda mode: layers) for p in space.allowed_points()]
    keys = [r.key() for r in recipes]
    assert len(keys) == len(set(keys))
    assert any(r.transform.quantization.keep_float == ("a",) for r in recipes)


def test_unsupported_ops_prune_an_execution_provider(digits, quick_profile: HardwareProfile) -> None:
    _, info, _ = digits
    broken = quick_profile.model_copy(
        update={
            "ops": [
                *(o for o in quick_profile.ops if o.op_type != "MatMul"),
                OpSupport(op_type="MatMul", dtype="fp32", provider="CPUExecutionProvider", status="unsupported"),
            ]
        }
    )
    assert "MatMul" in (unsupported_reason(info, broken, "CPUExecutionProvider", "fp32") or "")


def test_batch_search_and_conv_space(tiny_conv: tuple[Path, Path], quick_profile: HardwareProfile) -> None:
    info = inspect_model(tiny_conv[0])
    space, notes = build_space(info, quick_profile, SpaceOptions(batch=4, search_batch=True, max_batch=16), 2)
    batches = {p["batch"] for p in space.allowed_points()}
    assert batches == {1, 2, 4, 8, 16}
    if quick_profile.support("NhwcConv", "fp32", "CPUExecutionProvider") != "native":
        assert all(p["layout"] == "NCHW" for p in space.allowed_points())
        assert any("NHWC" in n for n in notes)


def test_padding_removal_only_with_fusion_and_where_it_can_build(
    quick_profile: HardwareProfile, tmp_path: Path
) -> None:
    from metainfer.agent.zoo.bert import BertConfig, build_bert_model

    model_path = tmp_path / "encoder.onnx"
    model_path.write_bytes(
        build_bert_model(BertConfig(layers=1, hidden=32, heads=2, intermediate=64, vocab=64)).SerializeToString()
    )
    info = inspect_model(model_path)
    assert info.is_transformer
    without, _ = build_space(info, quick_profile, SpaceOptions(batch=4), sensitive_layers=2)
    assert {p["padding"] for p in without.allowed_points()} == {"keep"}

    space, _ = build_space(info, quick_profile, SpaceOptions(batch=4, padding_removable=True), sensitive_layers=2)
    removed = [p for p in space.allowed_points() if p["padding"] == "remove"]
    assert removed
    assert all(p["fusion"] == "transformer" and p["quantization"] != "fp16" for p in removed)
    fused_static = [
        p for p in space.allowed_points() if p["fusion"] == "transformer" and p["quantization"] == "int8_static"
    ]
    assert fused_static and all(p["calibration"] == "minmax" for p in fused_static)
    assert all(recipe_for(p, lambda mode: []).transform.padding == "remove" for p in removed)
