"""The Olive peer benchmark's own logic, without Olive installed.

The comparison is only as right as its reading of Olive's outputs (which
candidate Olive ranked best, which session options it chose, how they map to
ORT: bench/olive_output.py), its verdict rule (bench/olive_report.py) and the
workflow it hands Olive (bench/olive_workflow.py), so those are checked on
synthetic footprints and configs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import onnxruntime as ort

from bench import olive_output as oo
from bench import olive_report as orp
from bench import olive_workflow as ow
from bench.olive_measure import Measured
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.profile.types import HardwareProfile, MachineInfo
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec
from metainfer.core.engine.report import AdaptSettings, Report, SpaceSummary
from metainfer.core.engine.trial import LatencyStats, Quality, Trial, TrialMetrics


def _node(parent: str | None, latency: float | None = None, quality: float = 1.0, ok: bool = True, **cfg: object):
    node: dict[str, object] = {"parent_model_id": parent, "pass_run_config": cfg or None, "metrics": None}
    if latency is not None:
        node["metrics"] = {
            "value": {
                "latency-p50": {"value": latency, "priority": 1},
                "quality-quality": {"value": quality, "priority": 2},
            },
            "if_goals_met": ok,
        }
    return node


def _footprint(tmp_path: Path) -> Path:
    nodes = {
        "in": _node(None, 100.0),
        "q1": _node("in", quant_mode="dynamic", precision="int8", per_channel=True, data_config={"x": 1}),
        "t1": _node("q1", 40.0, 0.999),
        "q2": _node("in", quant_mode="static", precision="int8", per_channel=False, activation_type="int8"),
        "t2": _node("q2", 30.0, 0.95, ok=False),  # fastest, but outside the quality goal
        "q3": _node("in", quant_mode="static", precision="uint8"),
        "t3": _node("q3", 45.0, 0.998),
    }
    path = tmp_path / "footprint.json"
    path.write_text(json.dumps(nodes))
    return path


def test_best_quantization_is_the_fastest_candidate_within_the_goal(tmp_path: Path) -> None:
    best = oo.olive_best_quantization(_footprint(tmp_path))
    assert best == {"quant_mode": "dynamic", "precision": "int8", "per_channel": True}


def test_search_stats_count_candidates_not_the_input_model(tmp_path: Path) -> None:
    stats = oo.olive_search_stats(_footprint(tmp_path), "x ... FAILED.\ny ... FAILED.\n")
    assert stats["olive_candidates_evaluated"] == 3
    assert stats["olive_candidates_meeting_goal"] == 2
    assert stats["olive_steps_failed"] == 2


def test_olive_session_options_map_to_ort_as_olive_applies_them() -> None:
    so = oo.olive_session_options(
        {"execution_mode": 1, "graph_optimization_level": 2, "intra_op_num_threads": 2, "inter_op_num_threads": 0}
    )
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert so.intra_op_num_threads == 2
    assert so.inter_op_num_threads == 0  # 0 is "not set" for Olive too
    assert oo.describe_olive_settings({}) == "ORT defaults"


def _row(name: str, p50: float, drop: float) -> Measured:
    return Measured(name, "", p50, p50 * 1.1, 1 - drop, drop, "cosine", 1.0)


def test_verdict_needs_speed_and_quality() -> None:
    fp32 = _row("ORT FP32, default options", 100.0, 0.0)
    met, _ = orp.verdict([fp32, _row("Olive best", 40.0, 0.002), _row("metainfer best", 39.0, 0.0025)])
    assert met is True  # within the quality tie
    met, text = orp.verdict([fp32, _row("Olive best", 40.0, 0.002), _row("metainfer best", 41.0, 0.001)])
    assert met is False and "faster" in text
    met, text = orp.verdict([fp32, _row("Olive best", 40.0, 0.001), _row("metainfer best", 30.0, 0.008)])
    assert met is False and "quality" in text
    met, _ = orp.verdict([fp32, _row("metainfer best", 30.0, 0.0)])
    assert met is None


def _report(trials: list[tuple[bool, float, float]]) -> Report:
    """A metainfer report whose trials are int8 dynamic with (per_channel, p50 ms, score)."""

    def metrics(p50: float) -> TrialMetrics:
        latency = LatencyStats(
            p50_ms=p50, p95_ms=p50, p99_ms=p50, mean_ms=p50, runs=10, warmup_runs=1, throughput_per_s=1 / p50
        )
        quality = Quality(metric="top1_accuracy", value=0.98, reference=0.98, drop=0.0, samples=10)
        return TrialMetrics(latency=latency, quality=quality, peak_memory_mib=1.0, model_size_mib=1.0)

    def trial(index: int, per_channel: bool, p50: float, score: float) -> Trial:
        q = QuantizationSpec(mode="int8_dynamic", per_channel=per_channel)
        recipe = Recipe(transform=TransformSpec(quantization=q))
        return Trial(index=index, point={}, recipe=recipe, status="feasible", metrics=metrics(p50), score=score)

    machine = MachineInfo(
        cpu_model="c", arch="x86_64", logical_cores=1, physical_cores=1, total_memory_bytes=1, onnxruntime_version="1"
    )
    when = datetime(2025, 1, 1, tzinfo=UTC)
    return Report(
        started_at=when,
        model=ModelInfo(
            path="m.onnx", sha256="a" * 64, size_bytes=1, opset=17, inputs=(), outputs=(), op_counts={}, parameters=0
        ),
        profile=HardwareProfile(
            fingerprint="0" * 16,
            machine=machine,
            providers_profiled=["CPUExecutionProvider"],
            peak_gemm_gflops_fp32=1,
            peak_gemm_gflops_int8=1,
            memory_bandwidth_gbps=1,
            measured_at=when,
            duration_s=0,
        ),
        settings=AdaptSettings(),
        space=SpaceSummary(dimensions={}, allowed_points=1, notes=[]),
        baseline=Trial(index=0, point={}, recipe=Recipe(), status="feasible", metrics=metrics(0.068), score=1.0),
        trials=[trial(i + 1, *t) for i, t in enumerate(trials)],
        best=None,
        search_wall_s=1.0,
        total_wall_s=1.0,
        stop_reason="trial budget reached",
    )


def test_a_missed_verdict_says_by_how_much_and_how_the_search_ranked_it(tmp_path: Path) -> None:
    report = _report([(False, 0.0362, 1.67), (True, 0.0382, 1.58)])
    (tmp_path / "report.json").write_text(report.model_dump_json())
    rows = [
        Measured("ORT FP32, default options", "ORT defaults", 0.068, 0.09, 0.98, 0.0, "top1_accuracy", 0.2),
        Measured("Olive best", "int8 dynamic, per-channel", 0.0479, 0.08, 0.98, 0.0, "top1_accuracy", 0.1),
        Measured("metainfer best", "int8_dynamic, per-tensor", 0.0525, 0.066, 0.98, 0.0, "top1_accuracy", 0.1),
    ]
    text = orp.why_slower(rows, {"model_path": str(tmp_path / "model.onnx")})
    assert text.startswith("Why: Olive's variant measured 4.6 µs (10%) faster per batch here.")
    assert "chosen variant at 36.2 µs and its best per-channel int8 variant" in text and "38.2 µs (+6%)" in text
    gone = orp.why_slower(rows, {"model_path": str(tmp_path / "gone" / "model.onnx")})
    assert gone == "Why: Olive's variant measured 4.6 µs (10%) faster per batch here."


def test_the_workflow_searches_quantization_and_session_jointly_for_k_samples(tmp_path: Path) -> None:
    from metainfer.agent.zoo.build import ExampleModel

    example = ExampleModel(
        name="m",
        model_path=tmp_path / "model.onnx",
        data_path=tmp_path / "data.npz",
        sha256="0" * 64,
        data_sha256="0" * 64,
        input_names=("x",),
        samples=32,
        has_labels=True,
        fixed_batch=None,
        description="m",
    )
    config = ow.olive_workflow(example, 8, 12, tmp_path / "ref.npz", tmp_path / "work", [1, 2])
    assert list(config["passes"]) == ["quantization", "session_params_tuning"]
    assert config["passes"]["session_params_tuning"]["intra_thread_num_list"] == [1, 2]
    assert config["search_strategy"]["sampler_config"] == {"max_samples": 12, "seed": ow.SEED}
    quality = config["evaluators"]["peer_evaluator"]["metrics"][1]["sub_types"][0]
    assert quality["goal"] == {"type": "max-degradation", "value": ow.MAX_DROP}
    data = {d["name"]: d["load_dataset_config"]["params"]["max_samples"] for d in config["data_configs"]}
    assert data == {"calibration_data": ow.CALIBRATION_SAMPLES, "latency_data": 8, "quality_data": 32}


def test_why_olive_made_no_model_is_its_warnings_and_errors_not_its_run_history() -> None:
    log = "\n".join([
        "[2026-12-04 06:07:01,000] [INFO] [engine.py:100:run] Running pass quantization",
        "[2026-12-04 06:07:10,000] [WARNING] [engine.py:300:run] Pass OnnxStaticQuantization failed: shape mismatch",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "onnxruntime.capi.onnxruntime_pybind11_state.Fail: [ONNXRuntimeError] : 1 : FAIL : bad node",
        "[2026-12-04 06:07:19,000] [WARNING] [engine.py:300:run] Pass OnnxStaticQuantization failed: shape mismatch",
        "[2026-12-04 06:07:20,355] [INFO] [engine.py:216:run] Run history for cpu-cpu:",
        "[2026-12-04 06:07:20,357] [INFO] [engine.py:476:_dump_run_history_internal] Please install tabulate",
        "[2026-12-04 06:07:20,357] [WARNING] [engine.py:237:run] No output model produced. Please check the log.",
    ])  # fmt: skip
    assert oo.why_olive_failed(log) == (
        "onnxruntime.capi.onnxruntime_pybind11_state.Fail: [ONNXRuntimeError] : 1 : FAIL : bad node"
        " | Pass OnnxStaticQuantization failed: shape mismatch"
        " | No output model produced. Please check the log."
    )
    assert oo.why_olive_failed("only\nplain\nlines") == "only | plain | lines"
