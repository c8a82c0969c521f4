"""Pure mapping between an AdaptationRun and the local engine: spec -> settings, outcome -> status.

The agent Job is a thin shell around these functions (read the run, call the
engine, write the status), so everything a unit test can check without a
cluster lives here: which spec field feeds which engine setting, which trials
make the bounded summary, which reason a failure gets, and how the three run
conditions (Succeeded, Ready, Progressing) move together. Each function
returns a new status; nothing here talks to the API server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pydantic import BaseModel

from metainfer.core.api.conditions import ConditionStatus, set_condition
from metainfer.core.api.run import (
    MAX_TRIALS,
    AdaptationRunSpec,
    AdaptationRunStatus,
    RunMetrics,
    RunProgress,
    TrialSummary,
)
from metainfer.core.api.vocabulary import ConditionType, Reason, RunPhase, RunStage, TrialState
from metainfer.core.control.memory_bound import variant_memory_bound_mib
from metainfer.core.engine.errors import (
    UNSUPPORTED_MARKERS,
    FailureReason,
    InputError,
    MetainferError,
    NoFeasibleCandidate,
    UnsupportedModelError,
)
from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.knobs import KNOBS, QUANTIZATION, QUANTIZATION_MODES, Knob, overridable
from metainfer.core.engine.modelinfo import ModelInfo
from metainfer.core.engine.profile.types import CPU_PROVIDER, HardwareProfile
from metainfer.core.engine.recipe import COMPUTED_FIELDS
from metainfer.core.engine.report import AdaptSettings, Report
from metainfer.core.engine.scoring import Constraints, Objective, by_closeness
from metainfer.core.engine.trial import Trial, TrialMetrics

FINISHED = "finished"  # the Progressing message once a run is over
MAX_KEEP_FAILED = 5  # failed trials kept in the summary even when better ones would fill it
REJECTED_SHOWN = 5  # candidates validation rejected, named in a run's message

# SearchSpaceOverrides field -> the engine's search-space dimension name, from the knob declarations.
OVERRIDE_DIMENSIONS: dict[str, str] = {override.field: knob.name for knob, override in overridable(KNOBS)}


# -- spec -> engine settings ------------------------------------------------------------


def space_overrides(space: BaseModel, knobs: Sequence[Knob] = KNOBS) -> dict[str, list[str | int | float | bool]]:
    """The policy's search-space restrictions (a ``SearchSpaceOverrides``) as ``AdaptSettings.overrides``:
    dimension -> allowed choices, for each restriction the policy sets."""
    out: dict[str, list[str | int | float | bool]] = {}
    for knob, override in overridable(knobs):
        value = getattr(space, override.field)
        if value is not None:
            out[knob.name] = override.choices(value)
    return out


def settings_from_spec(
    spec: AdaptationRunSpec, measure: MeasureSettings | None = None, serve_floor_mib: float = 0.0
) -> AdaptSettings:
    """Engine settings for one run.

    The batch is fixed (it is part of the run's key). Each objective weight is
    the engine's weight of the same term (scoring.Objective), so every weight
    the API accepts ranks candidates; the p99 bound has no engine counterpart
    yet and is ignored. ``serve_floor_mib``: serve's own resident memory in this image, which the Job measures
    (metainfer.agent.serve.floor); with the serving container's memory limit it bounds each variant's own memory
    (core.control.memory_bound).
    """
    data = spec.model.data
    base = measure or MeasureSettings()
    if data is not None:
        base = base.model_copy(update={"quality_samples": data.validation_samples})
    weights = spec.objective
    return AdaptSettings(
        batch=spec.slo.batch_size,
        search_batch=False,
        constraints=Constraints(
            slo_p95_ms=spec.slo.latency_p95_ms,
            slo_p99_ms=spec.slo.latency_p99_ms,
            max_quality_drop=spec.slo.max_quality_drop,
            quality_metric=spec.slo.quality_metric,
            max_memory_mib=float(spec.slo.max_memory_mib) if spec.slo.max_memory_mib is not None else None,
            max_variant_memory_mib=variant_memory_bound_mib(spec.serving_memory_limit_mib, serve_floor_mib),
        ),
        objective=Objective(
            latency_weight=weights.latency,
            throughput_weight=weights.throughput,
            memory_weight=weights.memory,
            quality_weight=weights.quality,
        ),
        budget_trials=spec.search.trial_budget,
        time_budget_s=float(spec.search.time_budget_seconds),
        algorithm=spec.search.algorithm,
        seed=spec.search.seed,
        measure=base,
        calibration_samples=data.calibration_samples if data is not None else 64,
        overrides=_without_static_if_no_data(space_overrides(spec.search_space), data is None),
    )


def _without_static_if_no_data(
    overrides: dict[str, list[str | int | float | bool]], no_data: bool
) -> dict[str, list[str | int | float | bool]]:
    """Without spec.model.data the agent calibrates on synthetic inputs that serving pods cannot reproduce,
    so a static int8 winner could never be rebuilt by ``metainfer serve``: leave static out of the search."""
    if not no_data:
        return overrides
    modes = overrides.get(QUANTIZATION.name, list(QUANTIZATION_MODES))
    return {**overrides, QUANTIZATION.name: [m for m in modes if m != "int8_static"] or ["fp32"]}


# -- report -> status fields ---------------------------------------------------------------


def status_ms(value: float) -> float:
    """Latency for an object's status, to the microsecond: kubectl prints number columns digit for digit."""
    return round(value, 3)


def run_metrics(metrics: TrialMetrics) -> RunMetrics:
    latency, quality = metrics.latency, metrics.quality
    return RunMetrics(
        p50_ms=status_ms(latency.p50_ms),
        p95_ms=status_ms(latency.p95_ms),
        p99_ms=status_ms(latency.p99_ms),
        throughput_per_s=latency.throughput_per_s,
        quality_metric=quality.metric,
        quality_drop=quality.drop,
        peak_memory_mib=metrics.peak_memory_mib,
        model_size_mib=metrics.model_size_mib,
    )


def best_metrics(report: Report) -> RunMetrics | None:
    """The shipped model's metrics: from the back-to-back final comparison when there is one (less noisy)."""
    if report.final is not None and not report.final.kept_baseline:
        return run_metrics(report.final.best)
    shipped = report.shipped()
    if shipped is not None and shipped.metrics is not None:
        return run_metrics(shipped.metrics)
    return None


def _summary(trial: Trial) -> TrialSummary:
    m = trial.metrics
    error = trial.error or ("; ".join(trial.violations) if trial.violations else None)
    return TrialSummary(
        index=trial.index,
        recipe_key=trial.recipe.key(),
        description=trial.recipe.describe()[:256],
        status=trial.status,
        p95_ms=status_ms(m.latency.p95_ms) if m is not None else None,
        quality_drop=m.quality.drop if m is not None else None,
        score=trial.score,
        error=error[:1024] if error else None,
    )


def rank_trials(trials: list[Trial], constraints: Constraints) -> list[Trial]:
    """Feasible by score (best first), then infeasible by how close they came, then failed by index."""
    feasible = sorted((t for t in trials if t.score is not None), key=lambda t: (-(t.score or 0.0), t.index))
    infeasible = by_closeness(trials, constraints)
    failed = sorted((t for t in trials if t.score is None and t.status == TrialState.FAILED), key=lambda t: t.index)
    return [*feasible, *infeasible, *failed]


def trial_summaries(trials: list[Trial], constraints: Constraints, limit: int = MAX_TRIALS) -> list[TrialSummary]:
    """At most ``limit`` summaries, best first; a few failed trials always stay so their errors are seen."""
    ranked = rank_trials(trials, constraints)
    measured = [t for t in ranked if t.status != TrialState.FAILED]
    failed = [t for t in ranked if t.status == TrialState.FAILED]
    keep_failed = min(len(failed), max(MAX_KEEP_FAILED, limit - len(measured)), limit)
    chosen = measured[: limit - keep_failed] + failed[:keep_failed]
    return [_summary(t) for t in chosen]


def trial_counts(trials: list[Trial]) -> dict[str, int]:
    return {s.value: sum(t.status == s for t in trials) for s in TrialState}


def infeasible_error(report: Report) -> NoFeasibleCandidate:
    """Why a finished search has no result: every candidate missed, or validation rejected the best ones."""
    trials = report.candidates()
    counts = trial_counts(trials)
    message = (
        f"none of {len(trials)} candidates (FP32 baseline included) met every constraint"
        f" ({counts['feasible']} feasible, {counts['infeasible']} infeasible, {counts['failed']} failed)"
    )
    if report.rejected_by_validation:
        message += "; " + rejected_message(report)
    elif counts["feasible"] and report.validation is not None and not report.validation.passed:
        failed_checks = [f"{c.name}: {c.detail}" for c in report.validation.checks if not c.passed]
        message += "; the best feasible ones failed validation on all samples: " + "; ".join(failed_checks)
    if report.quality_granularity_note:
        message += f"; {report.quality_granularity_note}"
    return NoFeasibleCandidate(message, report.closest_misses())


def rejected_message(report: Report, shown: int = REJECTED_SHOWN) -> str:
    """The candidates validation rejected and why, the first ``shown`` of them."""
    rejected = report.rejected_by_validation
    named = "; ".join(r.describe() for r in rejected[:shown])
    more = f"; and {len(rejected) - shown} more" if len(rejected) > shown else ""
    return f"validation on all samples rejected {named}{more}"


def slo_unmet_message(report: Report) -> str:
    """What a run serving the SLO-unmet FP32 fallback says first: which bound is unmet, measured vs limit."""
    fallback = report.slo_unmet_fallback
    assert fallback is not None, "slo_unmet_message needs a report with an SLO-unmet fallback"
    return f"SLO unmet: no candidate met every constraint, so the class keeps serving FP32: {fallback.describe()}"


# -- errors -> reasons ---------------------------------------------------------------------


def failure_reason(exc: BaseException) -> tuple[str, str]:
    """(reason, one-line-ish message) for an expected error of a run."""
    if isinstance(exc, NoFeasibleCandidate):
        lines = [str(exc)]
        if exc.closest:
            lines.append("closest candidates:")
            lines += [f"- {described}: {'; '.join(missed)}" for described, missed in exc.closest]
        return Reason.NO_FEASIBLE_CANDIDATE, "\n".join(lines)
    text = _first_line(exc)
    if any(marker in str(exc) for marker in UNSUPPORTED_MARKERS):
        return Reason.UNSUPPORTED_OPERATORS, text
    if isinstance(exc, InputError) and exc.reason == FailureReason.INVALID_INPUT:
        if exc.field == "model":
            return Reason.INVALID_MODEL, text
        return Reason.INVALID_SPEC, text.replace("--batch", "spec.batchSize", 1)  # the engine names CLI flags
    if isinstance(exc, MetainferError):
        return exc.reason, text
    return Reason.INVALID_MODEL, text  # ONNX Runtime rejected the model itself


def unsupported_operators(model: ModelInfo, profile: HardwareProfile) -> UnsupportedModelError | None:
    """The model's op types this machine measured as unable to run in fp32 on the CPU EP (every EP's fallback)."""
    missing = profile.unsupported_ops(model.op_types, "fp32", CPU_PROVIDER)
    if not missing:
        return None
    return UnsupportedModelError(
        f"the model uses operator(s) {', '.join(missing)} that no execution provider of this hardware class can run"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:2000]


# -- conditions and phase ------------------------------------------------------------------


def _run_conditions(
    status: AdaptationRunStatus,
    generation: int | None,
    now: dt.datetime | None,
    *,
    succeeded: ConditionStatus,
    reason: str,
    message: str,
    progressing_message: str | None = None,
    set_ready: bool = True,
) -> AdaptationRunStatus:
    """Succeeded, Ready (True only with Succeeded) and Progressing (True while unfinished) with one reason."""
    finished = succeeded != "Unknown"
    entries: list[tuple[ConditionType, ConditionStatus, str]] = [(ConditionType.SUCCEEDED, succeeded, message)]
    if set_ready:
        entries.append((ConditionType.READY, "True" if succeeded == "True" else "False", message))
    progressing_status: ConditionStatus = "False" if finished else "True"
    entries.append((ConditionType.PROGRESSING, progressing_status, progressing_message or message))
    conditions = list(status.conditions)
    for type_, value, text in entries:
        conditions = set_condition(
            conditions, type_, value, reason, text[:32768], observed_generation=generation, now=now
        )
    return status.model_copy(update={"conditions": conditions, "observed_generation": generation})


def mark_running(
    status: AdaptationRunStatus,
    generation: int | None,
    stage: str,
    reason: str,
    message: str,
    now: dt.datetime | None = None,
) -> AdaptationRunStatus:
    """Phase Running at ``stage``: Succeeded Unknown, Ready False, Progressing True (all with ``reason``)."""
    now = now or _now()
    out = _run_conditions(status, generation, now, succeeded="Unknown", reason=reason, message=message)
    progress = (out.progress or _progress()).model_copy(update={"stage": stage})
    return out.model_copy(update={"phase": RunPhase.RUNNING, "start_time": out.start_time or now, "progress": progress})


def with_progress(
    status: AdaptationRunStatus,
    *,
    trials_completed: int,
    feasible_trials: int,
    elapsed_seconds: float,
    trial_budget: int | None = None,
    stage: str | None = None,
) -> AdaptationRunStatus:
    progress = (status.progress or _progress()).model_copy(
        update={
            "trials_completed": trials_completed,
            "feasible_trials": feasible_trials,
            "elapsed_seconds": round(max(elapsed_seconds, 0.0), 1),
        }
    )
    if trial_budget is not None:
        progress = progress.model_copy(update={"trial_budget": trial_budget})
    if stage is not None:
        progress = progress.model_copy(update={"stage": stage})
    return status.model_copy(update={"progress": progress})


def mark_succeeded(
    status: AdaptationRunStatus,
    generation: int | None,
    report: Report,
    notes: list[str],
    now: dt.datetime | None = None,
    variant_sha256: str | None = None,
) -> AdaptationRunStatus:
    """The run found and validated a variant: the recipe, its metrics, the bounded trial summary, and the sha256 of
    the variant's bytes (what serving pods must load or rebuild). With no feasible candidate but an SLO-unmet FP32
    fallback (``Report.slo_unmet_fallback``), the run succeeds with FP32, its message saying first which latency
    bound is unmet, so the class keeps serving rather than serving nothing."""
    best = report.shipped()
    assert best is not None, "mark_succeeded needs a report with a best trial or an SLO-unmet fallback"
    now = now or _now()
    metrics = best_metrics(report)
    trials = report.candidates()
    counts = trial_counts(report.trials)
    parts = [slo_unmet_message(report)] if report.best is None else []
    parts.append(f"best {best.recipe.describe()} (key {best.recipe.key()})")
    if report.fallback_note:
        parts.append(report.fallback_note)
    if metrics is not None:
        parts.append(f"p95 {metrics.p95_ms:.3f} ms, {metrics.quality_metric} drop {metrics.quality_drop:.4f}")
    if memory := report.memory_note():
        parts.append(memory)
    if report.final is not None and report.final.kept_baseline:
        parts.append(report.final.note)
    elif report.final is not None:
        parts.append(
            f"speedup {report.final.speedup_p50:.2f}x p50 / {report.final.speedup_p95:.2f}x p95 vs FP32"
            f" (checked at {report.final.slo_percentile})"
        )
        if report.final.note:
            parts.append(report.final.note)
    parts.append(
        f"{len(report.trials)} trials ({counts['feasible']} feasible, {counts['infeasible']} infeasible,"
        f" {counts['failed']} failed); {report.stop_reason}"
    )
    if report.quality_granularity_note:
        parts.append(report.quality_granularity_note)
    message = "; ".join(parts + notes)
    out = _run_conditions(
        status,
        generation,
        now,
        succeeded="True",
        reason=Reason.SUCCEEDED,
        message=message,
        progressing_message="finished",
    )
    progress = with_progress(
        out,
        trials_completed=len(report.trials),
        feasible_trials=counts["feasible"],
        elapsed_seconds=report.total_wall_s,
        trial_budget=report.settings.budget_trials,
        stage=RunStage.DONE,
    ).progress
    return out.model_copy(
        update={
            "phase": RunPhase.SUCCEEDED,
            "completion_time": now,
            "progress": progress,
            "trials": trial_summaries(trials, report.settings.constraints),
            "best_recipe": best.recipe,
            "best_recipe_key": best.recipe.key(),
            "best_variant_sha256": variant_sha256,
            "best_metrics": metrics,
            "checkpoint": None,  # the trials are in the result now
        }
    )


def mark_failed(
    status: AdaptationRunStatus,
    generation: int | None,
    reason: str,
    message: str,
    report: Report | None = None,
    now: dt.datetime | None = None,
) -> AdaptationRunStatus:
    """A deterministic failure: the status is the outcome (with the trials, when the search ran)."""
    now = now or _now()
    out = _run_conditions(
        status, generation, now, succeeded="False", reason=reason, message=message, progressing_message=FINISHED
    )
    update: dict[str, object] = {"phase": RunPhase.FAILED, "completion_time": now, "checkpoint": None}
    progress = (out.progress or _progress()).model_copy(update={"stage": RunStage.FAILED})
    if report is not None:
        trials = report.candidates()
        update["trials"] = trial_summaries(trials, report.settings.constraints)
        progress = progress.model_copy(
            update={
                "trials_completed": len(report.trials),
                "feasible_trials": trial_counts(report.trials)["feasible"],
                "elapsed_seconds": round(report.total_wall_s, 1),
            }
        )
    update["progress"] = progress
    return out.model_copy(update=update)


def mark_retrying(
    status: AdaptationRunStatus, generation: int | None, reason: str, message: str, now: dt.datetime | None = None
) -> AdaptationRunStatus:
    """A transient failure of this attempt: still Running, the Job retries; the message says why."""
    text = f"attempt failed, the Job will retry: {message}"
    return _run_conditions(
        status, generation, now or _now(), succeeded="Unknown", reason=reason, message=text, set_ready=False
    )


def is_finished(status: AdaptationRunStatus | None) -> bool:
    return status is not None and status.phase in (RunPhase.SUCCEEDED, RunPhase.FAILED)


def status_to_api(status: AdaptationRunStatus) -> dict[str, object]:
    """Status JSON for the API server; ``bestRecipe`` without Recipe's derived (computed) fields."""
    body = status.to_api()
    if status.best_recipe is not None:
        body["bestRecipe"] = status.best_recipe.model_dump(mode="json", exclude=set(COMPUTED_FIELDS))
    return body


def _progress() -> RunProgress:
    return RunProgress()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)
