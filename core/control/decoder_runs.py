"""An AdaptationRun of a decoder language model: its settings from the policy, and its result as run status.

A decoder's run reports in the run's usual fields, in per-token units, because that is what its serving pods
export on the serving latency series: ``bestMetrics.p95Ms`` is the shipped variant's time per output token (the
baseline drift compares production with), ``throughputPerS`` the aggregate tokens/s of the workload's streams,
``qualityMetric`` ``perplexity_rise``. The message says the rest (TTFT, tokens/s of one stream, agreement).
"""

from __future__ import annotations

import datetime as dt

from metainfer.core.api.policy import DecoderSlo
from metainfer.core.api.run import AdaptationRunSpec, AdaptationRunStatus, RunMetrics, TrialSummary
from metainfer.core.api.vocabulary import Reason, RunPhase, RunStage
from metainfer.core.control.runstatus import _now, _run_conditions, with_progress
from metainfer.core.engine.decoder.adapt import DecoderConstraints, DecoderReport, DecoderTrial
from metainfer.core.engine.decoder.workload import DecoderWorkload
from metainfer.core.engine.trial import TrialStatus

DEFAULT_CONTEXT = 2048
PERPLEXITY_METRIC = "perplexity_rise"


def decoder_settings(spec: AdaptationRunSpec, model_context: int | None) -> tuple[DecoderWorkload, DecoderConstraints]:
    slo = spec.slo.decoder or DecoderSlo()
    context = slo.max_context or model_context or DEFAULT_CONTEXT
    workload = DecoderWorkload(prompt_tokens=slo.prompt_tokens, decode_tokens=slo.decode_tokens,
                               concurrency=slo.concurrency, max_context=context)  # fmt: skip
    constraints = DecoderConstraints(
        ttft_p95_ms=slo.time_to_first_token_p95_ms, tpot_p95_ms=slo.time_per_output_token_p95_ms,
        min_tokens_per_s=slo.min_tokens_per_second, max_perplexity_rise=slo.max_perplexity_rise,
        max_memory_mib=float(spec.slo.max_memory_mib) if spec.slo.max_memory_mib is not None else None,
    )  # fmt: skip
    return workload, constraints


def decoder_metrics(trial: DecoderTrial) -> RunMetrics | None:
    m, q = trial.measurement, trial.quality
    if m is None:
        return None
    return RunMetrics(
        p50_ms=round(m.tpot_ms_p50, 4),
        p95_ms=round(m.tpot_ms_p95, 4),
        throughput_per_s=round(m.aggregate_tokens_per_s, 2),
        quality_metric=PERPLEXITY_METRIC,
        quality_drop=round(q.perplexity_rise, 6) if q else None,
        model_size_mib=trial.weights_mib,
    )


def trial_summaries(report: DecoderReport, limit: int) -> list[TrialSummary]:
    state = {"ok": TrialStatus.FEASIBLE, "rejected": TrialStatus.INFEASIBLE, "failed": TrialStatus.FAILED}
    out = []
    for index, trial in enumerate(report.trials[:limit]):
        m = trial.measurement
        out.append(TrialSummary(
            index=index, recipe_key=trial.recipe.key(), description=trial.recipe.describe()[:256],
            status=state[trial.status], p95_ms=round(m.tpot_ms_p95, 4) if m else None,
            quality_drop=round(trial.quality.perplexity_rise, 6) if trial.quality else None,
            score=round(m.aggregate_tokens_per_s, 2) if m else None,
            error=trial.reason[:1024] or None,
        ))  # fmt: skip
    return out


def mark_decoder_succeeded(
    status: AdaptationRunStatus, generation: int | None, report: DecoderReport, notes: list[str], limit: int,
    variant_sha256: str | None, elapsed_s: float, now: dt.datetime | None = None,
) -> AdaptationRunStatus:  # fmt: skip
    best = report.shipped
    assert best is not None and best.measurement is not None, "a decoder run succeeds with a shipped candidate"
    now = now or _now()
    m = best.measurement
    counts = {kind: sum(t.status == kind for t in report.trials) for kind in ("ok", "rejected", "failed")}
    parts = [
        f"best {best.recipe.describe()} (key {best.recipe.key()})",
        f"decoder: {m.describe()}",
        best.quality.describe() if best.quality else "",
        f"{best.weights_mib:.1f} MiB of weights, {best.memory_mib:.0f} MiB with the KV cache of "
        f"{report.workload.concurrency} streams at {report.workload.max_context} tokens",
    ]
    base = report.baseline.measurement
    if base is not None and best is not report.baseline:
        parts.append(f"{m.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x FP32's tokens/s")
    parts.append(f"{len(report.trials)} candidates ({counts['ok']} feasible, {counts['rejected']} infeasible, "
                 f"{counts['failed']} failed)")  # fmt: skip
    message = "; ".join([p for p in parts if p] + notes)
    out = _run_conditions(
        status, generation, now, succeeded="True", reason=Reason.SUCCEEDED, message=message,
        progressing_message="finished",
    )  # fmt: skip
    progress = with_progress(
        out, trials_completed=len(report.trials), feasible_trials=counts["ok"], elapsed_seconds=elapsed_s,
        trial_budget=len(report.trials), stage=RunStage.DONE,
    ).progress  # fmt: skip
    return out.model_copy(update={
        "phase": RunPhase.SUCCEEDED, "completion_time": now, "progress": progress,
        "trials": trial_summaries(report, limit), "best_recipe": best.recipe, "best_recipe_key": best.recipe.key(),
        "best_variant_sha256": variant_sha256, "best_metrics": decoder_metrics(best), "checkpoint": None,
    })  # fmt: skip
