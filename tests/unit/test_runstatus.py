"""core.control.runstatus: AdaptationRun spec -> engine settings, engine outcome -> run status (no cluster)."""

from __future__ import annotations

import datetime as dt

import pytest

from metainfer.core.api.conditions import get_condition
from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.core.api.policy import DataReference, ModelSource, ObjectiveWeights, SearchSpaceOverrides, Slo
from metainfer.core.api.run import MAX_TRIALS, AdaptationRunSpec, AdaptationRunStatus
from metainfer.core.control import runstatus
from metainfer.core.engine.errors import DataError, InputError, ModelError, NoFeasibleCandidate, UnsupportedModelError
from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.modelinfo import ModelInfo, TensorInfo
from metainfer.core.engine.profile.types import HardwareProfile, MachineInfo, OpSupport
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, SessionSpec, TransformSpec, WeightSpec
from metainfer.core.engine.report import (
    AdaptSettings,
    FinalComparison,
    RejectedCandidate,
    Report,
    SloUnmetFallback,
    SpaceSummary,
)
from metainfer.core.engine.scoring import Constraints
from metainfer.core.engine.trial import LatencyStats, Quality, Trial, TrialMetrics
from metainfer.core.engine.validate import ValidationReport

SHA = "a" * 64
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=5)


def spec(**changes: object) -> AdaptationRunSpec:
    cls = HardwareClass(vendor="cpu", product="Unit-CPU")
    base: dict[str, object] = {
        "policy_name": "p",
        "policy_generation": 1,
        "class_fingerprint": cls.fingerprint(),
        "hardware_class": cls,
        "model_sha256": SHA,
        "batch_size": 4,
        "reason": "Manual",
        "model": ModelSource(uri="file:///m.onnx", sha256=SHA),
        "slo": Slo(latency_p95_ms=12.5, max_quality_drop=0.02, max_memory_mib=512, batch_size=4),
    }
    base.update(changes)
    return AdaptationRunSpec.model_validate(base)


def metrics(p95: float, drop: float = 0.0, p50: float | None = None) -> TrialMetrics:
    p50 = p50 if p50 is not None else p95 * 0.8
    return TrialMetrics(
        latency=LatencyStats(
            p50_ms=p50, p95_ms=p95, p99_ms=p95 * 1.1, mean_ms=p50, runs=20, warmup_runs=2, throughput_per_s=1000 / p50
        ),
        quality=Quality(metric="top1_accuracy", value=0.9 - drop, reference=0.9, drop=drop, samples=100),
        peak_memory_mib=10.0,
        model_size_mib=1.0,
    )


def recipe(threads: int, mode: str = "int8_dynamic") -> Recipe:
    return Recipe(
        transform=TransformSpec(quantization=QuantizationSpec(mode=mode)),  # type: ignore[arg-type]
        session=SessionSpec(intra_op_num_threads=threads),
    )


def trial(index: int, status: str, score: float | None = None, p95: float = 5.0, **kw: object) -> Trial:
    return Trial(
        index=index,
        point={},
        recipe=recipe(index),
        status=status,  # type: ignore[arg-type]
        metrics=None if status == "failed" else metrics(p95, float(kw.pop("drop", 0.0))),  # type: ignore[arg-type]
        score=score,
        **kw,  # type: ignore[arg-type]
    )


def report(trials: list[Trial], best: Trial | None, final: bool = True) -> Report:
    machine = MachineInfo(
        cpu_model="Unit CPU",
        arch="x86_64",
        logical_cores=2,
        physical_cores=2,
        total_memory_bytes=1,
        onnxruntime_version="1",
    )
    profile = HardwareProfile(
        fingerprint="0" * 16,
        machine=machine,
        providers_profiled=["CPUExecutionProvider"],
        ops=[OpSupport(op_type="Weird", dtype="fp32", provider="CPUExecutionProvider", status="unsupported")],
        peak_gemm_gflops_fp32=1,
        peak_gemm_gflops_int8=1,
        memory_bandwidth_gbps=1,
        measured_at=T0,
        duration_s=1,
    )
    baseline = Trial(index=0, point={}, recipe=Recipe(), status="feasible", metrics=metrics(10.0), score=1.0)
    comparison = None
    if final and best is not None and best.metrics is not None:
        comparison = FinalComparison(
            baseline=metrics(9.0), best=metrics(3.0, p50=2.0), speedup_p50=3.6, speedup_p95=3.0
        )
    return Report(
        started_at=T0,
        model=model_info(),
        profile=profile,
        settings=AdaptSettings(constraints=Constraints(slo_p95_ms=8.0, max_quality_drop=0.01)),
        space=SpaceSummary(dimensions={}, allowed_points=10, notes=[]),
        baseline=baseline,
        trials=trials,
        best=best,
        final=comparison,
        search_wall_s=1.0,
        total_wall_s=2.5,
        stop_reason="trial budget reached",
    )


def model_info(ops: dict[str, int] | None = None) -> ModelInfo:
    return ModelInfo(
        path="m.onnx",
        sha256=SHA,
        size_bytes=1,
        opset=17,
        inputs=(TensorInfo(name="x", dtype="float32", shape=("N", 4)),),
        outputs=(TensorInfo(name="y", dtype="float32", shape=("N", 2)),),
        op_counts=ops or {"MatMul": 1},
        parameters=8,
    )


# -- spec -> settings ----------------------------------------------------------------------


def test_settings_from_spec_maps_slo_objective_and_search() -> None:
    s = spec(
        objective=ObjectiveWeights(latency=1, throughput=2, quality=0.5),
        search={"trialBudget": 900, "timeBudgetSeconds": 90, "seed": 7, "algorithm": "bayes"},
    )
    settings = runstatus.settings_from_spec(s)
    assert settings.batch == 4 and settings.search_batch is False
    assert settings.constraints == Constraints(slo_p95_ms=12.5, max_quality_drop=0.02, max_memory_mib=512.0)
    weights = settings.objective
    assert (weights.latency_weight, weights.throughput_weight, weights.quality_weight) == (1, 2, 0.5)
    assert settings.budget_trials == 900
    assert settings.time_budget_s == 90 and settings.seed == 7 and settings.algorithm == "bayes"
    assert settings.overrides == {"quantization": ["fp32", "fp16", "int8_dynamic"]}  # no data: no static int8


def test_settings_take_data_sample_counts_and_measure_settings() -> None:
    source = ModelSource(
        uri="file:///m.onnx",
        sha256=SHA,
        data=DataReference(uri="file:///d.npz", calibration_samples=16, validation_samples=77),
    )
    fast = MeasureSettings(max_seconds=0.3)
    settings = runstatus.settings_from_spec(spec(model=source), fast)
    assert settings.calibration_samples == 16
    assert settings.measure.quality_samples == 77 and settings.measure.max_seconds == 0.3


def test_space_overrides_use_engine_dimension_names() -> None:
    overrides = SearchSpaceOverrides(
        quantization=["fp32", "int8_static"],
        graph_optimization_levels=["all"],
        layouts=["NHWC"],
        fusions=["none"],
        execution_modes=["sequential"],
        execution_providers=["CPUExecutionProvider"],
        intra_op_threads=[1, 2],
        max_keep_float_layers=2,
    )
    assert runstatus.space_overrides(overrides) == {
        "quantization": ["fp32", "int8_static"],
        "graph_optimization_level": ["all"],
        "layout": ["NHWC"],
        "fusion": ["none"],
        "execution_mode": ["sequential"],
        "execution_provider": ["CPUExecutionProvider"],
        "intra_op_num_threads": [1, 2],
        "keep_float": [0, 1, 2],
    }
    assert runstatus.settings_from_spec(spec(search_space=overrides)).overrides["layout"] == ["NHWC"]


def test_without_data_static_int8_leaves_the_policy_restriction() -> None:
    only_static = SearchSpaceOverrides(quantization=["int8_static"], max_keep_float_layers=0)
    assert runstatus.settings_from_spec(spec(search_space=only_static)).overrides == {
        "quantization": ["fp32"],  # nothing left to search: the baseline format
        "keep_float": [0],
    }
    mixed = SearchSpaceOverrides(quantization=["int8_static", "fp16"])
    assert runstatus.settings_from_spec(spec(search_space=mixed)).overrides == {"quantization": ["fp16"]}


# -- trial summary ---------------------------------------------------------------------------


def test_trial_summary_is_bounded_best_first_and_keeps_failures() -> None:
    trials = [trial(i, "feasible", score=i / 100) for i in range(1, 71)]
    trials += [trial(100 + i, "failed", error=f"boom {i}" + "x" * 2000) for i in range(8)]
    trials.append(trial(200, "infeasible", violations=["latency: p95 9 ms > SLO 8 ms"], p95=9))
    summary = runstatus.trial_summaries(trials, Constraints(slo_p95_ms=8))
    assert len(summary) == MAX_TRIALS
    feasible = [s for s in summary if s.status == "feasible"]
    assert [s.index for s in feasible[:3]] == [70, 69, 68]
    failed = [s for s in summary if s.status == "failed"]
    assert len(failed) == runstatus.MAX_KEEP_FAILED and all(len(s.error or "") <= 1024 for s in failed)
    assert len({s.index for s in summary}) == MAX_TRIALS  # map-list keyed by index: no duplicates


def test_trial_summary_orders_infeasible_by_how_close_they_came() -> None:
    far = trial(1, "infeasible", p95=30, violations=["latency: p95 30 ms > SLO 8 ms"])
    near = trial(2, "infeasible", p95=9, violations=["latency: p95 9 ms > SLO 8 ms"])
    summary = runstatus.trial_summaries([far, near, trial(3, "failed", error="x")], Constraints(slo_p95_ms=8))
    assert [s.index for s in summary] == [2, 1, 3]
    assert summary[0].error == "latency: p95 9 ms > SLO 8 ms" and summary[0].recipe_key == near.recipe.key()


# -- outcome -> status -----------------------------------------------------------------------


def test_running_then_succeeded_conditions_and_fields() -> None:
    running = runstatus.mark_running(AdaptationRunStatus(), 3, "Fetching", "Fetching", "fetching", now=T0)
    assert running.phase == "Running" and running.start_time == T0 and running.observed_generation == 3
    assert running.progress is not None and running.progress.stage == "Fetching"
    searching = runstatus.mark_running(running, 3, "Searching", "Searching", "searching", now=T1)
    progressing = get_condition(searching.conditions, "Progressing")
    assert progressing is not None and progressing.last_transition_time == T0  # status unchanged: time kept
    assert progressing.reason == "Searching" and searching.start_time == T0

    best = trial(1, "feasible", score=2.0, p95=3.0)
    done = runstatus.mark_succeeded(searching, 3, report([best], best), ["no data: random inputs"], now=T1)
    assert done.phase == "Succeeded" and done.completion_time == T1
    assert done.best_recipe == best.recipe and done.best_recipe_key == best.recipe.key()
    assert done.best_metrics is not None and done.best_metrics.p95_ms == 3.0 and done.best_metrics.p50_ms == 2.0
    succeeded = get_condition(done.conditions, "Succeeded")
    assert succeeded is not None and succeeded.status == "True" and succeeded.last_transition_time == T1
    assert "random inputs" in succeeded.message and "3.60x" in succeeded.message
    assert {c.type: c.status for c in done.conditions} == {"Succeeded": "True", "Ready": "True", "Progressing": "False"}
    assert done.progress is not None and done.progress.trials_completed == 1 and done.progress.feasible_trials == 1
    assert [t.index for t in done.trials] == [1, 0]


def test_best_metrics_fall_back_to_the_best_trial_without_final_comparison() -> None:
    best = trial(1, "feasible", score=2.0, p95=4.0)
    assert runstatus.best_metrics(report([best], best, final=False)).p95_ms == 4.0  # type: ignore[union-attr]
    assert runstatus.best_metrics(report([], None)) is None


def test_failed_keeps_trials_and_status_api_has_no_derived_recipe_fields() -> None:
    miss = trial(1, "infeasible", p95=9, violations=["latency: p95 9.00 ms > SLO 8 ms"])
    r = report([miss], None)
    reason, message = runstatus.failure_reason(runstatus.infeasible_error(r))
    assert reason == "NoFeasibleCandidate"
    assert "closest candidates" in message and "latency: p95 9.00 ms > SLO 8 ms" in message
    failed = runstatus.mark_failed(AdaptationRunStatus(), 1, reason, message, r, now=T1)
    assert failed.phase == "Failed" and len(failed.trials) == 2
    assert get_condition(failed.conditions, "Succeeded").status == "False"  # type: ignore[union-attr]
    assert runstatus.is_finished(failed) and not runstatus.is_finished(AdaptationRunStatus(phase="Running"))

    best = trial(1, "feasible", score=2.0)
    body = runstatus.status_to_api(runstatus.mark_succeeded(AdaptationRunStatus(), 1, report([best], best), []))
    assert "session_options" not in body["bestRecipe"] and "providers" not in body["bestRecipe"]  # type: ignore[operator]
    assert Recipe.model_validate(body["bestRecipe"]).key() == body["bestRecipeKey"]


def test_retrying_stays_running_with_the_reason() -> None:
    running = runstatus.mark_running(AdaptationRunStatus(), 1, "Fetching", "Fetching", "x", now=T0)
    retry = runstatus.mark_retrying(running, 1, "ModelFetchFailed", "timed out", now=T1)
    cond = get_condition(retry.conditions, "Succeeded")
    assert retry.phase == "Running" and cond is not None and cond.status == "Unknown"
    assert cond.reason == "ModelFetchFailed" and "will retry" in cond.message and cond.last_transition_time == T0


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ModelError("/m.onnx", "not an ONNX model (DecodeError: x)"), "InvalidModel"),
        (DataError("d.npz:x", "axis 1 has size 3"), "InvalidData"),
        (InputError("model", "the FP32 model does not run on this machine: boom"), "InvalidModel"),
        (InputError("--batch", "the model's batch dimension is fixed at [1]"), "InvalidSpec"),
        (UnsupportedModelError("uses Weird"), "UnsupportedOperators"),
        (
            RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for X"),
            "UnsupportedOperators",
        ),
        (RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : bad\nsecond line"), "InvalidModel"),
        (NoFeasibleCandidate("none", [("fp32", ["latency"])]), "NoFeasibleCandidate"),
    ],
)
def test_failure_reasons(error: BaseException, reason: str) -> None:
    got, message = runstatus.failure_reason(error)
    assert got == reason and message
    if reason != "NoFeasibleCandidate":
        assert "\n" not in message


def test_unsupported_operators_from_the_profile() -> None:
    profile = report([], None).profile
    assert runstatus.unsupported_operators(model_info(), profile) is None
    error = runstatus.unsupported_operators(model_info({"MatMul": 1, "Weird": 2}), profile)
    assert error is not None and "Weird" in str(error) and error.reason == "UnsupportedOperators"


# -- the agent's throttled progress observer (uses runstatus; no cluster: a fake API) ----------


class _FakeKube:
    def __init__(self) -> None:
        self.patches: list[dict[str, object]] = []

    def patch_run_status(self, namespace: str, name: str, status: dict[str, object]) -> None:
        self.patches.append(status)


def test_progress_patches_are_throttled(monkeypatch: pytest.MonkeyPatch) -> None:
    from metainfer.agent import status as agent_status

    clock = [100.0]
    monkeypatch.setattr(agent_status.time, "monotonic", lambda: clock[0])
    kube = _FakeKube()
    writer = agent_status.RunStatusWriter(kube, "ns", "r", 1, AdaptationRunStatus(), lambda _: None)  # type: ignore[arg-type]
    observer = agent_status.StatusObserver(writer, trial_budget=10, started=90.0)
    observer.phase("search", 10)  # a stage change is written at once
    assert len(kube.patches) == 1 and kube.patches[0]["progress"]["stage"] == "Searching"  # type: ignore[index]
    for i in range(1, 6):  # five trials within one second: no write
        clock[0] += 0.2
        observer.trial(trial(i, "feasible", score=1.0), None)
    assert len(kube.patches) == 1
    clock[0] += 2.0
    observer.trial(trial(6, "infeasible", violations=["latency"]), None)
    assert len(kube.patches) == 2
    progress = kube.patches[-1]["progress"]
    assert progress == {  # type: ignore[comparison-overlap]
        "trialsCompleted": 6,
        "trialBudget": 10,
        "feasibleTrials": 5,
        "elapsedSeconds": 13.0,
        "stage": "Searching",
    }


def test_cluster_profile_is_reused_only_when_fresh_from_this_machine_type_and_this_namespace() -> None:
    from metainfer.agent.profiles import usable
    from metainfer.core.api.hardwareprofile import (
        HardwareProfileResource,
        HardwareProfileSpec,
        HardwareProfileStatus,
        profile_name,
    )

    profile = report([], None).profile
    cls = HardwareClass(vendor="cpu", product="Unit-CPU")
    obj = HardwareProfileResource(
        metadata={"name": profile_name(cls.fingerprint(), "team-a")},
        spec=HardwareProfileSpec(
            fingerprint=cls.fingerprint(), hardware_class=cls, namespace="team-a", max_age_seconds=3600
        ),
        status=HardwareProfileStatus(measured_at=T0, profile=profile),
    ).to_api()
    assert usable(obj, "team-a", profile.fingerprint, T0 + dt.timedelta(minutes=59)) == profile
    assert usable(obj, "team-a", profile.fingerprint, T0 + dt.timedelta(minutes=61)) is None  # stale
    assert usable(obj, "team-a", "f" * 16, T0) is None  # another CPU / ONNX Runtime version: measure again
    assert usable({**obj, "status": {}}, "team-a", profile.fingerprint, T0) is None  # created, not measured yet
    assert usable(None, "team-a", profile.fingerprint, T0) is None
    assert usable(obj, "team-b", profile.fingerprint, T0) is None  # another tenant's agent measured it


def test_no_data_means_no_static_int8() -> None:
    """Serving must be able to rebuild the winner; static int8 calibrated on synthetic inputs cannot be."""
    from metainfer.core.api.hardwareclass import HardwareClass
    from metainfer.core.api.policy import ModelSource, SearchSettings, Slo
    from metainfer.core.api.run import AdaptationRunSpec
    from metainfer.core.control.runstatus import settings_from_spec

    cls = HardwareClass(vendor="cpu", product="Intel")
    spec = AdaptationRunSpec(
        policy_name="p", policy_generation=1, class_fingerprint=cls.fingerprint(), hardware_class=cls,
        model_sha256="a" * 64, batch_size=1, reason="NewHardwareClass",
        model=ModelSource(uri="file:///m.onnx", sha256="a" * 64), slo=Slo(latency_p95_ms=10, batch_size=1),
        search=SearchSettings(),
    )  # fmt: skip
    assert "int8_static" not in settings_from_spec(spec).overrides["quantization"]
    assert "int8_dynamic" in settings_from_spec(spec).overrides["quantization"]


def test_status_latencies_are_kept_to_the_microsecond() -> None:
    """kubectl prints number printer columns digit for digit; 4.123456789 ms would fill the column."""
    best = trial(1, "feasible", score=2.0, p95=4.1234567).model_copy(update={"metrics": metrics(4.1234567, p50=2.0004)})
    best_metrics = runstatus.best_metrics(report([best], best, final=False))
    assert best_metrics is not None and (best_metrics.p95_ms, best_metrics.p50_ms) == (4.123, 2.0)
    (summary,) = runstatus.trial_summaries([best], Constraints(slo_p95_ms=8))
    assert summary.p95_ms == 4.123


def test_the_trial_budget_is_accepted_exactly_up_to_what_the_search_runs() -> None:
    """The CRD accepted 10000 and the search silently ran 2000; now one bound, and the run gets what was asked."""
    import pytest
    from pydantic import ValidationError

    from metainfer.core.api.hardwareclass import HardwareClass
    from metainfer.core.api.policy import ModelSource, SearchSettings, Slo
    from metainfer.core.api.run import AdaptationRunSpec
    from metainfer.core.control.runstatus import settings_from_spec
    from metainfer.core.engine.algorithms import MAX_TRIAL_BUDGET

    with pytest.raises(ValidationError, match=r"trial_budget|trialBudget"):
        SearchSettings(trial_budget=MAX_TRIAL_BUDGET + 1)
    cls = HardwareClass(vendor="cpu", product="Intel")
    spec = AdaptationRunSpec(
        policy_name="p", policy_generation=1, class_fingerprint=cls.fingerprint(), hardware_class=cls,
        model_sha256="a" * 64, batch_size=1, reason="NewHardwareClass",
        model=ModelSource(uri="file:///m.onnx", sha256="a" * 64), slo=Slo(latency_p95_ms=10, batch_size=1),
        search=SearchSettings(trial_budget=MAX_TRIAL_BUDGET, time_budget_seconds=3600),
    )  # fmt: skip
    assert settings_from_spec(spec).budget_trials == MAX_TRIAL_BUDGET


def test_a_policys_p99_bound_reaches_the_search() -> None:
    bounded = spec(slo=Slo(latency_p95_ms=12.5, latency_p99_ms=20, batch_size=4))
    assert runstatus.settings_from_spec(bounded).constraints.slo_p99_ms == 20
    assert runstatus.settings_from_spec(spec()).constraints.slo_p99_ms is None


# -- FP32 as the answer when nothing else is (issue 65) ------------------------------------------------------


def _passed_validation() -> ValidationReport:
    quality = Quality(metric="top1_accuracy", value=0.9, reference=0.9, drop=0.0, samples=100)
    return ValidationReport(passed=True, full_data_quality=quality)


def test_a_run_with_only_an_slo_unmet_fp32_fallback_succeeds_serving_fp32_and_says_the_slo_is_unmet() -> None:
    fp32 = Trial(
        index=0, point={}, recipe=Recipe(), status="infeasible", metrics=metrics(9.0),
        violations=["latency: p95 9.00 ms > SLO 8 ms"],
    )  # fmt: skip
    r = report([trial(1, "infeasible", p95=9.5, violations=["latency: p95 9.50 ms > SLO 8 ms"])], None)
    r = r.model_copy(
        update={"baseline": fp32, "slo_unmet_fallback": SloUnmetFallback(trial=fp32, validation=_passed_validation())}
    )
    assert r.shipped() is fp32
    done = runstatus.mark_succeeded(AdaptationRunStatus(), 2, r, [], now=T1, variant_sha256="c" * 64)
    assert done.phase == "Succeeded" and done.best_recipe == Recipe() and done.best_variant_sha256 == "c" * 64
    assert done.best_metrics is not None and done.best_metrics.p95_ms == 9.0
    for type_ in ("Succeeded", "Ready"):
        cond = get_condition(done.conditions, type_)
        assert cond is not None and cond.status == "True"
        assert cond.message.startswith("SLO unmet: ") and "latency: p95 9.00 ms > SLO 8 ms" in cond.message
    # Without the fallback the same report is a failure, as before.
    assert r.model_copy(update={"slo_unmet_fallback": None}).shipped() is None


def test_no_feasible_names_what_validation_rejected_and_a_too_fine_quality_budget() -> None:
    best = trial(1, "feasible", score=2.0)
    rejected = RejectedCandidate(
        trial=1, recipe=best.recipe.describe(), failed_checks=["quality at batch 64 (largest): drop 0.03 > budget 0.01"]
    )
    granularity = "quality budget 0.01 is finer than argmax_agreement's step over 64 samples (0.0156: ...)"
    r = report([best], None).model_copy(
        update={"rejected_by_validation": [rejected] * 7, "quality_granularity_note": granularity}
    )
    message = str(runstatus.infeasible_error(r))
    assert f"validation on all samples rejected {best.recipe.describe()} failed quality at batch 64" in message
    assert message.count("failed quality at batch 64") == runstatus.REJECTED_SHOWN and "and 2 more" in message
    assert granularity in message


def test_a_fallback_note_reaches_the_succeeded_message() -> None:
    best = trial(1, "feasible", score=2.0)
    note = "no variant passed validation on all the data: ...; so the FP32 model is shipped"
    done = runstatus.mark_succeeded(
        AdaptationRunStatus(), 1, report([best], best).model_copy(update={"fallback_note": note}), []
    )
    succeeded = get_condition(done.conditions, "Succeeded")
    assert succeeded is not None and note in succeeded.message


def test_the_status_says_what_a_low_bit_variant_weighs_and_the_memory_bound_that_chose_it() -> None:
    """Issue 65: a class's variant says what it weighs against FP32 and which memory bound FP32 missed."""
    small = metrics(4.0).model_copy(update={"peak_memory_mib": 180.0, "model_size_mib": 3.3})
    best = trial(1, "feasible", score=2.0).model_copy(
        update={"recipe": Recipe(transform=TransformSpec(weights=WeightSpec(bits=4))), "metrics": small}
    )
    done = report([best], best)
    fp32 = done.baseline.model_copy(
        update={"metrics": metrics(10.0).model_copy(update={"peak_memory_mib": 320.0, "model_size_mib": 20.6})}
    )
    bounded = done.model_copy(
        update={
            "baseline": fp32,
            "settings": done.settings.model_copy(update={"constraints": Constraints(max_memory_mib=256.0)}),
        }
    )
    assert bounded.memory_note() == (
        "variant 3.3 MiB (FP32 20.6 MiB), taking 180 MiB (FP32 320 MiB), peak 180 MiB; within the memory SLO of"
        " 256 MiB, which FP32's 320 MiB exceeds"
    )
    status = runstatus.mark_succeeded(AdaptationRunStatus(), 1, bounded, [], variant_sha256="b" * 64)
    succeeded = get_condition(status.conditions, "Succeeded")
    assert succeeded is not None and bounded.memory_note() in succeeded.message
    unbounded = done.model_copy(update={"baseline": fp32})
    assert unbounded.memory_note() == "variant 3.3 MiB (FP32 20.6 MiB), taking 180 MiB (FP32 320 MiB), peak 180 MiB"
    assert report([trial(1, "feasible", score=2.0)], None).memory_note() == ""  # nothing shipped, no bound
