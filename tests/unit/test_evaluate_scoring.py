"""Measurement and scoring on real sessions."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from metainfer.core.engine.data import Dataset
from metainfer.core.engine.evaluate import MeasureSettings, evaluate, measure_interleaved, resident_mib
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec
from metainfer.core.engine.reference import make_reference, mean_cosine, quality_of, run_all, top1_accuracy
from metainfer.core.engine.runtime import create_session, session_options
from metainfer.core.engine.scoring import (
    Constraints,
    Objective,
    measurement_noise,
    noise_band,
    rank,
    score,
    violations,
)
from metainfer.core.engine.transforms import build_variant
from metainfer.core.engine.trial import LatencyStats, Quality, Trial, TrialMetrics, TrialStatus
from metainfer.core.engine.validate import validate_variant

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
    from metainfer.core.engine.reference import Reference

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


# -- the objective's terms, timing noise and ranking ------------------------------------------------


def _metrics(
    p50: float, value: float = 0.95, memory: float = 200.0, batch: int = 1, p95: float | None = None
) -> TrialMetrics:
    return TrialMetrics(
        latency=LatencyStats(
            p50_ms=p50,
            p95_ms=p95 if p95 is not None else 1.1 * p50,
            p99_ms=1.5 * p50,
            mean_ms=p50,
            runs=100,
            warmup_runs=0,
            throughput_per_s=batch * 1e3 / p50,
        ),
        quality=Quality(metric="top1_accuracy", value=value, reference=0.95, drop=0.95 - value, samples=100),
        peak_memory_mib=memory,
        model_size_mib=1.0,
    )


def test_every_weight_scores_its_term_relative_to_fp32() -> None:
    fp32 = _metrics(4.0, memory=400.0, batch=8)
    lean = _metrics(4.0, memory=200.0, batch=8)
    assert score(lean, fp32, Objective(latency_weight=0, memory_weight=1, quality_weight=0)) == pytest.approx(2.0)
    assert score(fp32, fp32, Objective(latency_weight=0, memory_weight=1, quality_weight=0)) == pytest.approx(1.0)
    # Bigger batches: slower per batch, more items per second; only the throughput weight sees that.
    batched = _metrics(8.0, batch=32)
    throughput = Objective(latency_weight=0, throughput_weight=1, quality_weight=0)
    assert score(batched, fp32, throughput) == pytest.approx(2.0)
    assert score(batched, fp32, Objective(latency_weight=1, quality_weight=0)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one objective weight"):
        Objective(latency_weight=0, quality_weight=0)


def test_noise_band_from_the_runs_floored_by_the_stability_rule() -> None:
    quiet = _metrics(1.0, p95=1.01).latency
    assert measurement_noise(quiet, stable_rel=0.02) == pytest.approx(0.04)  # the stability rule's 2 x 2%
    noisy = _metrics(1.0, p95=2.0).latency  # sigma ~ 0.61 ms over 100 runs: the medians' 95% interval
    assert measurement_noise(noisy, stable_rel=0.02) == pytest.approx(0.2112, abs=1e-3)
    fewer = noisy.model_copy(update={"runs": 25})
    assert measurement_noise(fewer, stable_rel=0.02) == pytest.approx(2 * 0.2112, abs=1e-3)
    # One noisy measurement among quiet ones does not widen the search's band.
    assert noise_band([noisy, quiet, quiet], stable_rel=0.02) == pytest.approx(0.04)


def _trial(index: int, metrics: TrialMetrics, baseline: TrialMetrics, objective: Objective) -> Trial:
    return Trial(
        index=index,
        point={},
        recipe=Recipe(session=SessionSpec(intra_op_num_threads=index)),
        status=TrialStatus.FEASIBLE,
        metrics=metrics,
        score=score(metrics, baseline, objective),
    )


def test_rank_treats_timings_inside_the_band_as_ties() -> None:
    fp32 = _metrics(4.0)
    objective = Objective()
    fast_lossy = _trial(1, _metrics(1.00, value=0.94), fp32, objective)
    close_exact = _trial(2, _metrics(1.03, value=0.95), fp32, objective)
    slow_exact = _trial(3, _metrics(1.50, value=0.95), fp32, objective)
    trials = [fast_lossy, close_exact, slow_exact]
    assert fast_lossy.score is not None and close_exact.score is not None and fast_lossy.score > close_exact.score
    assert rank(trials, fp32, objective, band=0.05) == [close_exact, fast_lossy, slow_exact]
    assert rank(trials, fp32, objective, band=0.01) == [fast_lossy, close_exact, slow_exact]
    assert rank(trials, fp32, objective, band=0.05, limit=1) == [close_exact]
    # With a memory weight, memory decides a tie before accuracy does.
    lean = Objective(memory_weight=1.0)
    lean_lossy = _trial(4, _metrics(1.01, value=0.94, memory=100.0), fp32, lean)
    fat_exact = _trial(5, _metrics(1.00, value=0.95, memory=300.0), fp32, lean)
    assert rank([fat_exact, lean_lossy], fp32, lean, band=0.05)[0] is lean_lossy
    # Failed and infeasible trials are not ranked.
    infeasible = close_exact.model_copy(update={"score": None, "status": TrialStatus.INFEASIBLE})
    assert rank([infeasible], fp32, objective, band=0.05) == []


def test_peak_memory_is_the_process_peak_and_sees_each_variant_in_full() -> None:
    """16 MiB of weights. Evaluated again and again, the allocator could serve each session from what the
    previous one freed, and the variant would read as free; memory is handed back first, so it never does."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((1024, 4096)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4096])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    data = Dataset({"x": rng.standard_normal((8, 1024)).astype(np.float32)})
    ref = make_reference(create_session(model, Recipe(batch=8)), data, 8)
    weights_mib = weights.nbytes / (1 << 20)
    growth = [evaluate(model, Recipe(batch=8), data, data, ref, FAST, floor_mib=0.0).peak_memory_mib for _ in range(4)]
    assert min(growth) >= weights_mib, growth
    floor = resident_mib()
    peak = evaluate(model, Recipe(batch=8), data, data, ref, FAST).peak_memory_mib
    assert peak >= floor + weights_mib  # the process's peak: what it held plus the variant


def test_recipes_are_described_in_words() -> None:
    assert Recipe().describe() == "FP32, default threads"
    static = TransformSpec(quantization=QuantizationSpec(mode="int8_static"))
    assert Recipe(transform=static, session=SessionSpec(intra_op_num_threads=1)).describe() == (
        "int8 static per-tensor, 1 thread"
    )
    mixed = TransformSpec(
        quantization=QuantizationSpec(
            mode="int8_dynamic", per_channel=True, weight_type="uint8", keep_float=("a", "b")
        ),
        fusion="transformer",
        padding="remove",
    )
    session = SessionSpec(intra_op_num_threads=4, execution_mode="parallel", inter_op_num_threads=2)
    assert Recipe(transform=mixed, session=session, batch=8).describe() == (
        "int8 dynamic per-channel, uint8 weights, 2 sensitive layers kept in float, transformer fusion,"
        " padding removed, 4 threads, parallel execution on 2 inter-op threads, batch 8"
    )


def test_pareto_latency_axis_is_logarithmic(digits) -> None:
    """One 100x slower candidate must not squash the others into one pixel column."""
    from metainfer.core.engine.plots import pareto_figure

    report = _fake_report(digits, [0.02, 0.021, 0.025, 2.0])
    fig = pareto_figure(report)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and not any("e" in label for label in labels), labels  # 0.1, not 1e-01


def _fake_report(digits, p50s: list[float]):  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    from metainfer.core.engine.profile.types import HardwareProfile, MachineInfo
    from metainfer.core.engine.report import AdaptSettings, Report, SpaceSummary

    _, info, _ = digits
    baseline = _metrics(p50s[0])
    trials = [_trial(i + 1, _metrics(p), baseline, Objective()) for i, p in enumerate(p50s)]
    profile = HardwareProfile(
        fingerprint="0" * 16,
        machine=MachineInfo(
            cpu_model="c",
            arch="x86_64",
            logical_cores=1,
            physical_cores=1,
            total_memory_bytes=1,
            onnxruntime_version="1",
        ),
        providers_profiled=["CPUExecutionProvider"],
        peak_gemm_gflops_fp32=1,
        peak_gemm_gflops_int8=1,
        memory_bandwidth_gbps=1,
        measured_at=datetime(2025, 1, 1, tzinfo=UTC),
        duration_s=0,
    )
    return Report(
        started_at=datetime(2025, 1, 1, tzinfo=UTC),
        model=info,
        profile=profile,
        settings=AdaptSettings(),
        space=SpaceSummary(dimensions={}, allowed_points=1, notes=[]),
        baseline=trials[0].model_copy(update={"index": 0}),
        trials=trials,
        best=trials[0],
        search_wall_s=1.0,
        total_wall_s=1.0,
        stop_reason="trial budget reached",
    )


def test_a_p99_bound_makes_a_candidate_with_a_long_tail_infeasible() -> None:
    """slo.latencyP99Ms (--slo-p99-ms) was documented as a hard constraint and not checked by the search."""
    tail = _metrics(4.0)  # p95 4.4 ms, p99 6 ms
    assert violations(tail, Constraints(slo_p95_ms=5, max_quality_drop=0.05)) == []
    assert violations(tail, Constraints(slo_p95_ms=5, slo_p99_ms=5.5, max_quality_drop=0.05)) == [
        "latency: p99 6.00 ms > bound 5.5 ms"
    ]
    from metainfer.core.engine.scoring import miss_distance

    assert miss_distance([], tail, Constraints(slo_p99_ms=5.0)) == pytest.approx(0.2)


def _seq_major_model(batch: int | str = 1) -> bytes:
    """[batch, 4] -> [3, batch, 4] per-step class probabilities: steps first, then the batch, then classes, as
    PyTorch's CTC recognisers export."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, batch, 4])
    nodes = [helper.make_node("Unsqueeze", ["x", "axis0"], ["x3"])]
    scales = []
    for step in range(3):
        scales.append(numpy_helper.from_array(np.array(step + 1, dtype=np.float32), f"scale{step}"))
        nodes.append(helper.make_node("Mul", ["x3", f"scale{step}"], [f"step{step}"]))
    nodes.append(helper.make_node("Concat", ["step0", "step1", "step2"], ["logits"], axis=0))
    nodes.append(helper.make_node("Softmax", ["logits"], ["y"], axis=-1))
    axis = numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0")
    graph = helper.make_graph(nodes, "seq_major", [x], [y], [axis, *scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return bytes(model.SerializeToString())


def test_a_seq_major_output_is_read_samples_first_and_cut_and_counted_by_sample() -> None:
    """Issue 30: ddddocr's PyTorch-exported recogniser ([steps, 1, classes]) failed its baseline: the quality
    screen cut its reference at n rows, not at n samples. Its outputs are now read samples first, so the
    per-step metric is chosen for it, as for a batch-major recogniser."""
    data = Dataset(inputs={"x": np.random.default_rng(0).random((5, 4), dtype=np.float32)})
    session = create_session(_seq_major_model(), Recipe())
    reference = make_reference(session, data, 1)
    raw = session.run(None, data.batch(1, 1))[0]
    assert reference.outputs[0].shape == (5, 3, 4) and reference.samples == 5
    assert np.array_equal(reference.outputs[0][1], raw[:, 0])
    assert reference.metric == "argmax_agreement"
    head = reference.head(2)
    assert np.array_equal(head.outputs[0], reference.outputs[0][:2]) and head.samples == 2
    quality = quality_of(run_all(session, data.head(2), 1), head)
    assert quality.samples == 2 and quality.drop == pytest.approx(0.0, abs=1e-6)
    assert quality_of(run_all(session, data, 1), reference).samples == 5


def test_a_seq_major_model_with_a_dynamic_batch_gives_each_sample_the_same_outputs_at_every_batch() -> None:
    """With a dynamic batch, [steps, batch, classes] runs of 1 and of 4 concatenated along the first axis had
    different layouts, so validation at batch 1 and the batch-dependence check compared steps with samples."""
    data = Dataset(inputs={"x": np.random.default_rng(1).random((6, 4), dtype=np.float32)})
    model = _seq_major_model("batch")
    session = create_session(model, Recipe())
    alone, in_fours = run_all(session, data, 1), run_all(session, data, 4)
    assert alone[0].shape == in_fours[0].shape == (6, 3, 4)
    assert np.allclose(alone[0], in_fours[0], atol=1e-6)
    # A run of 3 samples gives [3 steps, 3, 4]: its samples' axis is in doubt; the last run, of 2, settles it.
    in_threes = run_all(session, Dataset(inputs={"x": data.inputs["x"][:5]}), 3)
    assert np.allclose(in_threes[0], alone[0][:5], atol=1e-6)
    reference = make_reference(session, data, 4)
    report = validate_variant(model, Recipe(batch=4), data, reference, max_quality_drop=0.0, largest_batch=6)
    assert report.passed, [c.detail for c in report.checks if not c.passed]
    assert report.batch_dependence is not None and report.batch_dependence.max_abs_difference < 1e-6
