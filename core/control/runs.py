"""A class's adaptation runs and their Jobs: which run is current, which to start, cancel or fail.

Exactly one run per current run key; the trigger reason is derived from what
changed against the class's latest run; a run waits (Pending,
ConcurrencyLimit) when no slot is free; superseded unfinished runs are
deleted, since their result would never be served. A class with a run that
does not validate is held (``hold_class``): without that run the plan could
roll the class back to an older variant, or start a run under the name the
unreadable one already has, so nothing is started, cancelled or rolled out
for it until the run is readable again or gone.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from metainfer.core.api.conditions import ConditionType, Reason, set_condition
from metainfer.core.api.names import ANNOTATION_DRIFT_EPOCH, ANNOTATION_RERUN
from metainfer.core.api.policy import ClassStatus
from metainfer.core.api.run import MAX_HISTORY_SOURCES, AdaptationRun, RunProgress
from metainfer.core.api.vocabulary import IN_FLIGHT, ClassState, RunPhase
from metainfer.core.control.decisions import (
    ClassContext,
    ClassPlan,
    Decisions,
    FailedRun,
    PlannedJob,
    PlannedRun,
    updated,
)
from metainfer.core.control.events import Event
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.manifests import build_job, build_run
from metainfer.core.control.naming import job_name
from metainfer.core.control.objects import InvalidRun, annotation_of, latest, name_of, run_failure, run_phase
from metainfer.core.control.settings import AgentJobSettings
from metainfer.core.control.workloads import job_end

MAX_HELD_MESSAGE = 1024
# What a held or refused class serves, and since when: true as last written while nothing is rolled out.
_SERVED_FIELDS = ("current", "run_name", "deployment_name", "last_adaptation_time", "last_adaptation_reason")
_JOB_REASONS = {"BackoffLimitExceeded": Reason.BACKOFF_LIMIT_EXCEEDED, "DeadlineExceeded": Reason.DEADLINE_EXCEEDED}


def fresh_status(context: ClassContext) -> ClassStatus:
    """The class as its nodes show it now; the rollout and drift state carry over from the last status."""
    group, previous = context.group, context.previous
    return ClassStatus(
        fingerprint=group.fingerprint,
        name=context.class_name,
        hardware_class=group.hardware_class,
        nodes=len(group.node_names),
        node_names=list(group.node_names[:64]),
        rollout=previous.rollout if previous else None,
        drift=previous.drift if previous else None,
    )


def discovered(context: ClassContext, status: ClassStatus) -> tuple[Event, ...]:
    if context.previous is not None:
        return ()
    return (Event("Normal", Reason.NEW_HARDWARE_CLASS, f"class {status.name}: {status.nodes} nodes"),)


def plan_runs(context: ClassContext, *, slot_free: bool) -> ClassPlan:
    """The class's status from its current run, or the run to start (``slot_free``) or wait for."""
    status = fresh_status(context)
    superseded = tuple(name_of(r) for r in context.runs if r is not context.current and run_phase(r) in IN_FLIGHT)
    if context.current is None:
        step = start_run(context, status) if slot_free else wait_for_slot(context, status)
    else:
        step = follow_run(context, status, context.current)
    found = Decisions(runs_to_delete=superseded, events=discovered(context, status))
    return ClassPlan(step.status, found + step.decisions + class_jobs(context))


def start_run(context: ClassContext, status: ClassStatus) -> ClassPlan:
    reason = trigger(context)
    manifest = build_run(
        context.policy,
        context.group,
        reason,
        context.drift_epoch,
        history_sources(context),
        context.rerun,
        settings=context.job_settings,
        serving_memory_limit_mib=context.serving_memory_limit_mib,
    )
    run_name = manifest["metadata"]["name"]
    return ClassPlan(
        updated(status, state=ClassState.ADAPTING, reason=reason, run_name=run_name),
        Decisions(
            runs_to_create=(PlannedRun(manifest, reason),),
            events=(Event("Normal", reason, f"class {status.name}: run {run_name}"),),
        ),
    )


def history_sources(context: ClassContext) -> list[str]:
    """The policy's ended runs that kept their measured trials, for the new run to warm-start from: this class's
    own (a model or batch change, a drift) first, then other classes' (a driver change, new hardware), newest
    first within each; the agent ranks them again by hardware-profile and model similarity."""
    ended = [r for r in context.policy_runs if r.status is not None and r.status.trial_history is not None]

    def order(run: AdaptationRun) -> tuple[bool, float]:
        ended_at = run.status.completion_time if run.status else None
        return (run.spec.class_fingerprint != context.fingerprint, -(ended_at.timestamp() if ended_at else 0.0))

    return [name_of(r) for r in sorted(ended, key=order)[:MAX_HISTORY_SOURCES]]


def wait_for_slot(context: ClassContext, status: ClassStatus) -> ClassPlan:
    message = f"waiting to start ({trigger(context)})"
    return ClassPlan(updated(status, state=ClassState.PENDING, reason=Reason.CONCURRENCY_LIMIT, message=message))


def trigger(context: ClassContext) -> Reason:
    """Why the class needs a new run: what differs between the policy's spec and the class's latest run."""
    last = latest(context.runs)
    if last is None:
        nodes = set(context.group.node_names)
        moved = any(
            fp != context.fingerprint and nodes & set(c.node_names) for fp, c in context.previous_classes.items()
        )
        return Reason.DRIVER_CHANGE if moved else Reason.NEW_HARDWARE_CLASS
    model, wanted = last.spec.model, context.spec.model
    if (model.sha256, model.uri, model.version) != (wanted.sha256, wanted.uri, wanted.version):
        return Reason.MODEL_CHANGE
    if last.spec.batch_size != context.spec.slo.batch_size:
        return Reason.BATCH_CHANGE
    if context.rerun and annotation_of(last, ANNOTATION_RERUN) != context.rerun:
        return Reason.MANUAL
    if context.drift_epoch and annotation_of(last, ANNOTATION_DRIFT_EPOCH) != context.drift_epoch:
        return Reason.LATENCY_DRIFT
    runtime = context.job_settings.runtime if context.job_settings else None
    if runtime and last.spec.runtime != runtime:
        return Reason.RUNTIME_CHANGE
    return Reason.SPEC_CHANGE


def follow_run(context: ClassContext, status: ClassStatus, run: AdaptationRun) -> ClassPlan:
    """The class's state from its current run: Degraded when it failed (said once), RollingOut when it
    succeeded, else Adapting with the run's progress."""
    name, phase = name_of(run), run_phase(run)
    status = updated(status, run_name=name, reason=run.spec.reason)
    if phase == RunPhase.FAILED:
        reason, message = run_failure(run)
        was = context.previous
        said = was is not None and was.state == ClassState.DEGRADED
        events = () if said else (Event("Warning", reason, f"run {name} failed: {message}"),)
        return ClassPlan(
            updated(status, state=ClassState.DEGRADED, reason=reason, message=message), Decisions(events=events)
        )
    if phase == RunPhase.SUCCEEDED:
        return ClassPlan(updated(status, state=ClassState.ROLLING_OUT))
    progress = (run.status.progress if run.status else None) or RunProgress()
    budget = progress.trial_budget or "?"
    message = f"{progress.stage or phase}: {progress.trials_completed}/{budget} trials"
    why = context.job_waits.get(job_name(name))
    if why is None:
        return ClassPlan(updated(status, state=ClassState.ADAPTING, message=message))
    # Said once per cause (what precedes the first colon: a refused pod, or which pod cannot be scheduled or
    # started): the status keeps saying it while it lasts, with the details of the latest try (a refused pod's
    # generated name changes with every retry of the Job controller), the event tells whoever watches events.
    was = context.previous
    cause = "waiting: " + why.split(":", 1)[0]
    said = was is not None and was.state == ClassState.ADAPTING and cause in (was.message or "")
    events = () if said else (Event("Warning", Reason.JOB_WAITING, f"run {name}: {why}"),)
    waiting = updated(status, state=ClassState.ADAPTING, message=f"{message}; waiting: {why}")
    return ClassPlan(waiting, Decisions(events=events))


def hold_class(context: ClassContext) -> ClassPlan:
    """A class with unreadable runs: Degraded (InvalidSpec) naming them, its serving state kept as last written;
    only the Jobs of its readable runs are still looked after."""
    message = "; ".join(r.message for r in context.invalid_runs)[:MAX_HELD_MESSAGE]
    was = context.previous
    base = fresh_status(context)
    if was is not None:  # what it serves, and since when, stays true while nothing is rolled out
        base = updated(base, **{k: getattr(was, k) for k in _SERVED_FIELDS})
    status = updated(base, state=ClassState.DEGRADED, reason=Reason.INVALID_SPEC, message=message)
    said = was is not None and (was.state, was.reason, was.message) == (status.state, status.reason, status.message)
    unread = () if said else tuple(skipped(r) for r in context.invalid_runs)
    return ClassPlan(status, Decisions(events=(*discovered(context, status), *unread)) + class_jobs(context))


def refuse_class(context: ClassContext) -> ClassPlan:
    """A class of an accelerator vendor the platform maps no image to: Degraded (NoImageForHardware) saying which
    setting is missing. Nothing starts for it, what it serves stays, and its runs' ended Jobs are still read: the
    platform's image is the CPU one, and a class never adapts or serves there on a CPU its accelerator idles beside.
    """
    vendor = context.group.hardware_class.vendor
    message = (
        f"no image for {vendor} classes: the platform maps none (Helm value agent.vendorImages.{vendor}, "
        f"METAINFER_AGENT_IMAGES); the CPU image cannot use their accelerator, so nothing is adapted or served here"
    )
    was = context.previous
    base = fresh_status(context)
    if was is not None:
        base = updated(base, **{k: getattr(was, k) for k in _SERVED_FIELDS})
    status = updated(base, state=ClassState.DEGRADED, reason=Reason.NO_IMAGE_FOR_HARDWARE, message=message)
    said = was is not None and (was.state, was.reason) == (status.state, status.reason)
    events = () if said else (Event("Warning", Reason.NO_IMAGE_FOR_HARDWARE, f"class {status.name}: {message}"),)
    jobs = job_decisions(context.runs, None, jobs=context.jobs, settings=context.job_settings, now=context.now)
    return ClassPlan(status, Decisions(events=(*discovered(context, status), *events)) + jobs)


def skipped(run: InvalidRun) -> Event:
    return Event("Warning", Reason.INVALID_SPEC, f"skipped {run.message}")


# --- Jobs ----------------------------------------------------------------------------------------------------------


def class_jobs(context: ClassContext) -> Decisions:
    return job_decisions(context.runs, context.group, jobs=context.jobs, settings=context.job_settings, now=context.now)


def job_decisions(
    runs: Iterable[AdaptationRun],
    group: ClassGroup | None,
    *,
    jobs: Mapping[str, Mapping[str, Any]],
    settings: AgentJobSettings | None,
    now: dt.datetime,
) -> Decisions:
    """Each run's Job to create, or its failure when its Job ended without a result (``group`` None: the runs'
    class is no longer selected, so no Job of theirs could schedule)."""
    created: list[PlannedJob] = []
    failed: list[FailedRun] = []
    for run in runs:
        name = name_of(run)
        job = jobs.get(job_name(name))
        manifest = plan_job(run, job, group, settings)
        if manifest is not None:
            created.append(PlannedJob(name, manifest))
        elif (patch := run_status_from_job(run, job, now)) is not None:
            failed.append(FailedRun(name, patch))
    return Decisions(jobs_to_create=tuple(created), runs_to_fail=tuple(failed))


def plan_job(
    run: AdaptationRun,
    existing_job: Mapping[str, Any] | None,
    group: ClassGroup | None,
    settings: AgentJobSettings | None = None,
) -> dict[str, Any] | None:
    """The Job to create for ``run``, or None: it exists, the run is finished, its class is gone, or it had one.

    The operator creates the Job first and records status.jobName after, so a recorded name whose Job is missing
    means the Job was deleted (TTL, a person): it is never recreated; ``run_status_from_job`` fails the run instead.
    """
    if existing_job is not None or group is None or run_phase(run) not in IN_FLIGHT:
        return None
    if run.status is not None and run.status.job_name:
        return None
    return build_job(run, group, settings)


def run_status_from_job(run: AdaptationRun, job: Mapping[str, Any] | None, now: dt.datetime) -> dict[str, Any] | None:
    """A status patch failing ``run`` when its Job ended (or vanished) without the agent writing a result.

    The agent writes Succeeded/Failed itself; this covers what it cannot: OOM kills, the deadline, the backoff
    limit, a deleted Job. None while the Job runs or once the run is finished.
    """
    if run_phase(run) not in IN_FLIGHT:
        return None
    recorded = run.status.job_name if run.status else None
    if job is None:
        if not recorded:
            return None
        reason, message = Reason.JOB_FAILED, f"Job {recorded} was deleted before the run finished"
    else:
        end = job_end(job)
        if end is None:
            return None
        if end.failed:
            reason = _JOB_REASONS.get(end.reason, Reason.JOB_FAILED)
            message = end.message or f"Job {end.name} failed"
        else:
            reason, message = Reason.JOB_FAILED, f"Job {end.name} completed without writing a result"
    conditions = list(run.status.conditions) if run.status else []
    conditions = set_condition(conditions, ConditionType.SUCCEEDED, "False", reason, message, now=now)
    return {
        "phase": RunPhase.FAILED.value,
        "completionTime": now.isoformat(),
        "conditions": [c.to_api() for c in conditions],
    }
