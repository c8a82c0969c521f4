"""Measurement and scoring on real sessions."""

from __future__ import annotations

import numpy as np
import pytest

from metainfer.core.engine.evaluate import (
    MeasureSettings,
    evaluate,
    make_reference,
    mean_cosine,
    measure_interleaved,
    quality_of,
    top1_accuracy,
)
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.runtime import create_session, session_options
from metainfer.core.engine.scoring import Constraints, Objective, score, violations
from metainfer.core.engine.transforms import build_variant

FAST = MeasureSettings(warmup_runs=1, round_runs=5, min_runs=10, max_runs=40, max_seconds=0.5)


def test_session_options_use_real_ort_attribute_names() -> None:
    recipe = Recipe(
        session=SessionSpec(
            intra_op_num_threads=1, graph_optimization_level="basic", execution_mode="parallel", inter_op_num_threads=2
        )
    )
    so = session_options(recipe)
    assert so.intra_op_num_threads == 1 and so.inter_op_num_threads == 2
    assert str(so.graph_optimization_level).endswith("ORT_ENABLE_BASIC")
    assert str(so.execution_mode).endswith("ORT_PARALLEL")
    assert recipe.providers == ["CPUExecutionProvider"]


def test_recipe_keys() -> None:
    a = Recipe(batch=8)
    b = Recipe(batch=8, session=SessionSpec(intra_op_num_threads=1))
    assert a.transform_key() == b.transform_key() and a.key() != b.key()
    c = Recipe(batch=8, transform=TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic")))
    assert c.transform_key() != a.transform_key()
    assert Recipe.model_validate_json(c.model_dump_json()) == c


def test_quality_metrics() -> None:
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    assert mean_cosine(a, a) == pytest.approx(1.0)
    assert mean_cosine(a, -a) == pytest.approx(-1.0)
    assert mean_cosine(np.zeros((2, 2)), np.zeros((2, 2))) == 1.0
    assert top1_accuracy(np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([1, 1])) == 0.5


def test_evaluate_digits_fp32_and_int8(digits) -> None:
    base, _, data = digits
    ref = make_reference(create_session(base, Recipe(batch=16)), data, 16)
    assert ref.accuracy is not None and ref.accuracy > 0.95
    fp32 = evaluate(base, Recipe(batch=16), data, data, ref, FAST)
    assert fp32.quality.drop == pytest.approx(0.0)
    assert FAST.min_runs <= fp32.latency.runs <= FAST.max_runs
    lat = fp32.latency
    assert 0 < lat.p50_ms <= lat.p95_ms <= lat.p99_ms
    assert lat.throughput_per_s == pytest.approx(16e3 / lat.p50_ms)
    spec = TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic", per_channel=True))
    int8 = evaluate(build_variant(base, spec), Recipe(batch=16, transform=spec), data, data, ref, FAST)
    assert int8.model_size_mib < fp32.model_size_mib / 2
    assert int8.quality.metric == "top1_accuracy" and int8.quality.drop < 0.05


def test_cosine_quality_without_labels(digits) -> None:
    base, _, data = digits
    unlabelled = type(data)(data.inputs, None)
    ref = make_reference(create_session(base, Recipe()), unlabelled, 32)
    q = quality_of(ref.outputs, ref)
    assert q.metric == "cosine_similarity" and q.value == pytest.approx(1.0) and q.drop == pytest.approx(0.0)


def test_interleaved_measurement(digits) -> None:
    base, _, data = digits
    sessions = [create_session(base, Recipe()), create_session(base, Recipe())]
    stats = measure_interleaved(sessions, data, 8, FAST, rounds=3)
    assert len(stats) == 2 and all(s.runs >= 3 for s in stats)


def test_constraints_and_score(digits) -> None:
    base, _, data = digits
    ref = make_reference(create_session(base, Recipe()), data, 8)
    m = evaluate(base, Recipe(batch=8), data, data, ref, FAST)
    assert violations(m, Constraints()) == []
    missed = violations(m, Constraints(slo_p95_ms=1e-6, max_memory_mib=1e-6))
    assert any(v.startswith("latency: p95") for v in missed)
    bad_quality = m.model_copy(update={"quality": m.quality.model_copy(update={"drop": 0.2})})
    assert any(v.startswith("quality:") for v in violations(bad_quality, Constraints(max_quality_drop=0.01)))
    faster = m.model_copy(update={"latency": m.latency.model_copy(update={"p50_ms": m.latency.p50_ms / 2})})
    objective = Objective(latency_weight=1.0, quality_weight=0.0)
    assert score(faster, m, objective) == pytest.approx(2.0)
    assert score(m, m, Objective(latency_weight=1.0, quality_weight=0.5)) == pytest.approx(1.5)


def test_sequence_outputs_are_compared_mean_pooled_over_real_tokens() -> None:
    from metainfer.core.engine.evaluate import Reference

    rng = np.random.default_rng(0)
    ref_out = rng.standard_normal((4, 6, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0, 0]] * 4)
    variant = ref_out.copy()
    variant[:, 3:, :] = rng.standard_normal((4, 3, 8))  # padding positions: garbage no consumer reads
    ref = Reference([ref_out], None, None, mask)
    q = quality_of([variant], ref)
    assert q.metric == "mean_pooled_cosine_similarity" and q.value == pytest.approx(1.0)
    assert mean_cosine(variant, ref_out) < 0.9  # flattened cosine would have punished the padding
    noisy = variant.copy()
    noisy[:, :3, :] += 0.5 * rng.standard_normal((4, 3, 8))
    assert quality_of([noisy], ref).value < 0.99
