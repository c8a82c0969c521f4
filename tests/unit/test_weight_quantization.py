"""Weight-only quantization: the recipe's WeightSpec, the transform (ONNX Runtime's MatMulNBits and NNCF's DQ
form), its knobs in the space, and the depth-first enumeration of allowed points that a space with them needs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from pydantic import ValidationError

from metainfer.agent.zoo.bert import BertConfig, build_bert_model
from metainfer.core.engine.candidates import build_space, recipe_for
from metainfer.core.engine.data import Dataset
from metainfer.core.engine.knobs import SpaceOptions
from metainfer.core.engine.modelinfo import inspect_model
from metainfer.core.engine.profile import HardwareProfile, MachineInfo
from metainfer.core.engine.profile.types import OpenVinoAvailability
from metainfer.core.engine.recipe import WEIGHT_RANKING, Recipe, TransformSpec, WeightSpec
from metainfer.core.engine.search.space import Space
from metainfer.core.engine.transforms import build_variant, quantizable_nodes
from metainfer.core.engine.transforms.weights import (
    available_weight_methods,
    embedding_tables,
    weight_matmuls,
)

CONFIG = BertConfig(layers=1, hidden=64, heads=2, intermediate=128, vocab=512)


def synthetic_profile() -> HardwareProfile:
    """A CPU where every op runs (nothing measured: the CPU EP's default is native)."""
    return HardwareProfile(
        openvino=OpenVinoAvailability(unusable_reason="OpenVINO is not installed in this image"),
        fingerprint="0123456789abcdef",
        machine=MachineInfo(
            cpu_model="synthetic",
            arch="x86_64",
            logical_cores=4,
            physical_cores=2,
            total_memory_bytes=2**34,
            onnxruntime_version="1.0",
            execution_providers=["CPUExecutionProvider"],
        ),
        providers_profiled=["CPUExecutionProvider"],
        ops=[],
        peak_gemm_gflops_fp32=100,
        peak_gemm_gflops_int8=200,
        memory_bandwidth_gbps=10,
        measured_at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        duration_s=1,
    )


@pytest.fixture(scope="module")
def encoder() -> onnx.ModelProto:
    return build_bert_model(CONFIG)


def _feed(batch: int = 2, length: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, CONFIG.vocab, (batch, length)).astype(np.int64),
        "attention_mask": np.ones((batch, length), np.int64),
        "token_type_ids": np.zeros((batch, length), np.int64),
    }


def _run(model: bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feed)]


def _ops(model: bytes) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load_from_string(model).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _weights_bytes(model: bytes) -> int:
    return sum(t.ByteSize() for t in onnx.load_from_string(model).graph.initializer)


# -- the recipe -----------------------------------------------------------------------------------------------


def test_float_weights_leave_every_existing_recipe_key_and_variant_as_it_was() -> None:
    assert "weights" not in Recipe().transform.model_dump(mode="json")
    assert Recipe().key() == Recipe.model_validate({"transform": {"weights": {"bits": 0}}}).key()
    assert Recipe(transform=TransformSpec(weights=WeightSpec(bits=4))).key() != Recipe().key()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"bits": 0, "block_size": 32}, "bits 0 keeps float weights"),
        ({"bits": 8, "method": "hqq"}, "4-bit weights only"),
        ({"bits": 4, "method": "nncf", "accuracy_level": 4}, "accuracy_level"),
        ({"bits": 8, "embeddings": True}, "embedding tables"),
        ({"bits": 4, "method": "gptq"}, "symmetric"),
    ],
)
def test_a_weight_spec_that_no_tool_writes_is_refused_with_its_reason(fields: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        WeightSpec.model_validate(fields)


def test_weight_only_quantization_keeps_activations_float() -> None:
    with pytest.raises(ValidationError, match="mode must be fp32"):
        TransformSpec.model_validate({"quantization": {"mode": "int8_dynamic"}, "weights": {"bits": 4}})


# -- the transform --------------------------------------------------------------------------------------------


def test_onnxruntime_writes_matmulnbits_that_run_close_to_fp32_and_weigh_less(encoder: onnx.ModelProto) -> None:
    base = encoder.SerializeToString()
    reference = _run(base, _feed())
    sizes = {}
    for bits in (8, 4):
        spec = TransformSpec(weights=WeightSpec(bits=bits, block_size=32, accuracy_level=4))
        variant = build_variant(base, spec)
        assert _ops(variant).get("MatMulNBits") == len(weight_matmuls(encoder))
        assert "MatMul" not in {n.op_type for n in onnx.load_from_string(variant).graph.node if n.name in
                                weight_matmuls(encoder)}  # fmt: skip
        outputs = _run(variant, _feed())
        for got, want in zip(outputs, reference, strict=True):
            scale = float(np.abs(want).max())
            assert float(np.abs(got - want).max()) < (0.02 if bits == 8 else 0.2) * scale
        sizes[bits] = _weights_bytes(variant)
        assert build_variant(base, spec) == variant  # deterministic: a serving pod rebuilds the same bytes
    assert sizes[4] < sizes[8] < _weights_bytes(base)
    assert encoder.SerializeToString() == base  # the quantizer works on a copy


def test_embedding_tables_become_gather_block_quantized(encoder: onnx.ModelProto) -> None:
    base = encoder.SerializeToString()
    plain = build_variant(base, TransformSpec(weights=WeightSpec(bits=4)))
    tables = build_variant(base, TransformSpec(weights=WeightSpec(bits=4, embeddings=True)))
    assert _ops(tables).get("GatherBlockQuantized") == len(embedding_tables(encoder))
    assert _weights_bytes(tables) < _weights_bytes(plain)
    assert all(np.isfinite(o).all() for o in _run(tables, _feed()))  # the opset upgrade kept the graph valid


def test_kept_layers_stay_float(encoder: onnx.ModelProto) -> None:
    base = encoder.SerializeToString()
    names = quantizable_nodes(encoder, WEIGHT_RANKING)
    assert names == weight_matmuls(encoder) and names
    variant = onnx.load_from_string(
        build_variant(base, TransformSpec(weights=WeightSpec(bits=4, keep_float=(names[0],))))
    )
    kept = [n for n in variant.graph.node if n.name == names[0]]
    assert kept and kept[0].op_type == "MatMul"


def test_nncf_and_gptq_quantize_with_the_calibration_samples(encoder: onnx.ModelProto) -> None:
    pytest.importorskip("nncf")
    base = encoder.SerializeToString()
    reference = _run(base, _feed())
    calibration = Dataset({k: np.concatenate([_feed(seed=s)[k] for s in range(4)]) for k in _feed()})
    for spec in (
        WeightSpec(bits=4, method="nncf", block_size=32, symmetric=True),
        WeightSpec(bits=8, method="nncf"),
        WeightSpec(bits=4, method="nncf_awq", block_size=32),
        WeightSpec(bits=4, method="nncf", block_size=32, int4_percent=60),
    ):
        variant = build_variant(base, TransformSpec(weights=spec), calibration)
        assert _weights_bytes(variant) < _weights_bytes(base), spec
        for got, want in zip(_run(variant, _feed()), reference, strict=True):
            assert float(np.abs(got - want).max()) < 0.3 * float(np.abs(want).max()), spec


# -- the knobs ------------------------------------------------------------------------------------------------


def _space(tmp_path: Path, encoder: onnx.ModelProto, **options: object) -> tuple[Space, list[str]]:
    path = tmp_path / "encoder.onnx"
    onnx.save(encoder, path)
    space_options = SpaceOptions(
        weight_layers=len(weight_matmuls(encoder)),
        embedding_tables=len(embedding_tables(encoder)),
        weight_methods=available_weight_methods(nncf=False, calibration=True),
        **options,  # type: ignore[arg-type]
    )
    return build_space(inspect_model(path), synthetic_profile(), space_options, 4)


def test_the_space_offers_weight_only_points_on_fp32_only_and_each_builds_its_recipe(
    tmp_path: Path, encoder: onnx.ModelProto
) -> None:
    space, notes = _space(tmp_path, encoder)
    assert "weight method nncf left out: NNCF is not installed in this image" in notes
    points = space.allowed_points()
    weighted = [p for p in points if p["weight_bits"]]
    assert weighted and all(p["quantization"] == "fp32" for p in weighted)
    assert {p["weight_method"] for p in weighted} == {"rtn"}  # gptq and hqq need torch, nncf is not offered
    float_points = [p for p in points if not p["weight_bits"]]
    details = ("weight_method", "weight_block", "weight_symmetric", "weight_accuracy_level")
    assert all(tuple(p[d] for d in details) == ("rtn", 128, False, 0) for p in float_points)
    ranked = weight_matmuls(encoder)
    for point in weighted[:: max(1, len(weighted) // 40)]:
        recipe = recipe_for(point, lambda key: ranked if key == WEIGHT_RANKING else [])
        assert recipe.transform.weights.bits == point["weight_bits"]
        assert len(recipe.transform.weights.keep_float) == point["weight_keep_float"]


def test_a_policy_can_switch_weight_only_quantization_off(tmp_path: Path, encoder: onnx.ModelProto) -> None:
    space, _ = _space(tmp_path, encoder, overrides={"weight_bits": (0,)})
    assert {p["weight_bits"] for p in space.allowed_points()} == {0}


def test_nncf_keeps_its_most_sensitive_share_at_8_bits(encoder: onnx.ModelProto) -> None:
    pytest.importorskip("nncf")
    base = encoder.SerializeToString()

    def int4_tensors(percent: Literal[100, 80, 60]) -> int:
        spec = TransformSpec(weights=WeightSpec(bits=4, method="nncf", int4_percent=percent))
        variant = onnx.load_from_string(build_variant(base, spec))
        return sum(t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) for t in variant.graph.initializer)

    assert 0 < int4_tensors(60) < int4_tensors(100)
    with pytest.raises(ValidationError, match="int4_percent"):
        WeightSpec(bits=4, int4_percent=80)  # ONNX Runtime's quantizer has no such mix


def test_hqq_and_gptq_write_matmulnbits_where_torch_is_importable(encoder: onnx.ModelProto) -> None:
    """ONNX Runtime's HQQ and GPTQ import torch, which the image does not carry (the knob leaves them out there);
    where torch is, they quantize the model at its own opset (GPTQ loses a value name after an opset conversion)."""
    pytest.importorskip("torch")
    base = encoder.SerializeToString()
    reference = _run(base, _feed())
    calibration = Dataset({k: np.concatenate([_feed(seed=s)[k] for s in range(4)]) for k in _feed()})
    for spec in (WeightSpec(bits=4, method="hqq", block_size=32), WeightSpec(bits=4, method="gptq", symmetric=True)):
        variant = build_variant(base, TransformSpec(weights=spec), calibration)
        assert _ops(variant).get("MatMulNBits") == len(weight_matmuls(encoder)), spec
        for got, want in zip(_run(variant, _feed()), reference, strict=True):
            assert float(np.abs(got - want).max()) < 0.2 * float(np.abs(want).max()), spec
