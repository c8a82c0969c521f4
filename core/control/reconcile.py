"""What the operator should do for one AdaptationPolicy, decided without side effects.

The kopf handler lists the policy's runs and Deployments and the cluster's
classes, calls ``plan_policy``, and writes what the Plan says: create runs
(if absent: names are deterministic, so a retry or a restarted operator never
makes a second one), apply/delete Deployments and Services, patch the status
and emit the events. All state comes from the API server; nothing from memory.

Rules, per selected class: exactly one run per current run key; the trigger
reason is derived from what changed against the class's latest run; runs wait
(Pending, ConcurrencyLimit) beyond the policy's and the cluster's in-flight
limits; the newest succeeded run is served; a failed current run makes the
class Degraded. Classes no longer selected (no nodes left, or deselected)
lose their Deployment and Service and leave the status; their finished runs
stay as history until the policy is deleted (owner references collect them),
and their unfinished runs are deleted, since their Jobs can no longer schedule.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from metainfer.core.api.conditions import Condition, ConditionType, Reason, set_condition
from metainfer.core.api.policy import (
    AdaptationPolicySpec,
    AdaptationPolicyStatus,
    ClassStatus,
    RolloutStatus,
    VariantSummary,
)
from metainfer.core.api.vocabulary import IN_FLIGHT, ClassState, RolloutPhase, RunPhase
from metainfer.core.control.events import Event
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.manifests import (
    ANNOTATION_DRIFT_EPOCH,
    LABEL_CLASS,
    LABEL_RUN_KEY,
    AgentJobSettings,
    ServingDefaults,
    build_deployment,
    build_job,
    build_run,
    build_service,
    run_key,
)
from metainfer.core.control.naming import canary_name, workload_name
from metainfer.core.engine.recipe import Recipe

SPEC_HASH = "metainfer.io/spec-hash"
_JOB_REASONS = {"BackoffLimitExceeded": Reason.BACKOFF_LIMIT_EXCEEDED, "DeadlineExceeded": Reason.DEADLINE_EXCEEDED}


@dataclass(frozen=True)
class RunLimits:
    """Cluster-wide limits; ``cluster_in_flight`` counts Pending/Running runs of every policy, this one included."""

    cluster_max_in_flight: int = 8
    cluster_in_flight: int = 0
    wait_for_available: bool = True  # False where no kubelet runs (tests, the demo): applied counts as rolled out


@dataclass(frozen=True)
class PlannedRun:
    manifest: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class DeploymentAction:
    action: str  # create or update
    manifest: dict[str, Any]


@dataclass
class Plan:
    runs_to_create: list[PlannedRun] = field(default_factory=list)
    runs_to_delete: list[str] = field(default_factory=list)
    deployments_to_apply: list[DeploymentAction] = field(default_factory=list)
    deployments_to_delete: list[str] = field(default_factory=list)  # Deployment and Service of the same name
    services: list[dict[str, Any]] = field(default_factory=list)  # create each if absent
    class_statuses: list[ClassStatus] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    status: AdaptationPolicyStatus | None = None


def plan_policy(
    policy: Mapping[str, Any],
    groups: list[ClassGroup],
    runs: list[Mapping[str, Any]],
    deployments: list[Mapping[str, Any]],
    now: dt.datetime,
    limits: RunLimits | None = None,
    *,
    serving: ServingDefaults | None = None,
) -> Plan:
    """The Plan for ``policy`` given its selected ``groups`` and its existing runs and Deployments."""
    limits = limits or RunLimits()
    spec = AdaptationPolicySpec.model_validate(policy["spec"])
    generation = int(policy["metadata"].get("generation", 0))
    previous = AdaptationPolicyStatus.model_validate(policy.get("status") or {})
    before = {c.fingerprint: c for c in previous.classes}
    by_class: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_class.setdefault(run["spec"]["classFingerprint"], []).append(run)
    by_name = {d["metadata"]["name"]: d for d in deployments}
    selected = {g.fingerprint for g in groups}
    plan = Plan()

    epochs = {fp: drift_epoch(before.get(fp)) for fp in selected}
    keys = {fp: run_key(spec, generation, fp, epochs[fp]) for fp in selected}
    # Only current runs hold a slot: superseded ones and those of vanished classes are deleted below.
    in_flight = sum(
        run_phase(r) in IN_FLIGHT
        for r in runs
        if r["metadata"].get("labels", {}).get(LABEL_RUN_KEY) == keys.get(r["spec"]["classFingerprint"])
    )
    slots = max(
        0, min(spec.search.max_concurrent_runs - in_flight, limits.cluster_max_in_flight - limits.cluster_in_flight)
    )
    for group in groups:
        fp = group.fingerprint
        class_runs = by_class.get(fp, [])
        key = keys[fp]
        current = next((r for r in class_runs if r["metadata"].get("labels", {}).get(LABEL_RUN_KEY) == key), None)
        status = ClassStatus(
            fingerprint=fp,
            name=group.hardware_class.name(),
            hardware_class=group.hardware_class,
            nodes=len(group.node_names),
            node_names=list(group.node_names[:64]),
            rollout=before[fp].rollout if fp in before else None,
            drift=before[fp].drift if fp in before else None,
        )
        if fp not in before:
            plan.events.append(Event("Normal", Reason.NEW_HARDWARE_CLASS, f"class {status.name}: {status.nodes} nodes"))
        for stale in class_runs:  # superseded and unfinished: its result would never be served
            if stale is not current and run_phase(stale) in IN_FLIGHT:
                plan.runs_to_delete.append(stale["metadata"]["name"])
        if current is None:
            reason = _trigger(spec, group, class_runs, before, epochs[fp])
            if slots > 0:
                slots -= 1
                manifest = build_run(policy, group, reason, epochs[fp])
                plan.runs_to_create.append(PlannedRun(manifest, reason))
                plan.events.append(Event("Normal", reason, f"class {status.name}: run {manifest['metadata']['name']}"))
                status = _with(status, state=ClassState.ADAPTING, reason=reason, run_name=manifest["metadata"]["name"])
            else:
                status = _with(
                    status,
                    state=ClassState.PENDING,
                    reason=Reason.CONCURRENCY_LIMIT,
                    message=f"waiting to start ({reason})",
                )
        else:
            status = _from_current(status, current, before.get(fp), plan)
        status = _serve(policy, group, class_runs, current, status, before.get(fp), by_name, limits, serving, plan, now)
        plan.class_statuses.append(status)

    for fp, class_runs in by_class.items():
        if fp not in selected:
            plan.runs_to_delete += [r["metadata"]["name"] for r in class_runs if run_phase(r) in IN_FLIGHT]
    for name, dep in sorted(by_name.items()):
        if dep["metadata"].get("labels", {}).get(LABEL_CLASS) not in selected:
            plan.deployments_to_delete.append(name)
            plan.events.append(
                Event("Normal", Reason.CLASS_REMOVED, f"deleting {name}: its class has no selected nodes")
            )
    plan.conditions = _conditions(previous.conditions, plan.class_statuses, generation, now)
    plan.status = _status(generation, plan)
    return plan


def _trigger(
    spec: AdaptationPolicySpec,
    group: ClassGroup,
    class_runs: list[Mapping[str, Any]],
    before: Mapping[str, ClassStatus],
    epoch: str | None,
) -> str:
    last = latest(class_runs)
    if last is None:
        nodes = set(group.node_names)
        moved = any(fp != group.fingerprint and nodes & set(c.node_names) for fp, c in before.items())
        return Reason.DRIVER_CHANGE if moved else Reason.NEW_HARDWARE_CLASS
    model = last["spec"]["model"]
    if (model.get("sha256"), model.get("uri"), model.get("version")) != (
        spec.model.sha256,
        spec.model.uri,
        spec.model.version,
    ):
        return Reason.MODEL_CHANGE
    if last["spec"]["batchSize"] != spec.slo.batch_size:
        return Reason.BATCH_CHANGE
    if epoch and (last["metadata"].get("annotations") or {}).get(ANNOTATION_DRIFT_EPOCH) != epoch:
        return Reason.LATENCY_DRIFT
    return Reason.SPEC_CHANGE


def drift_epoch(status: ClassStatus | None) -> str | None:
    """The run-key salt of a class: its last confirmed latency drift (core.control.drift), in one canonical spelling."""
    when = status.drift.last_readaptation_time if status and status.drift else None
    return when.astimezone(dt.UTC).isoformat() if when else None


def _from_current(status: ClassStatus, run: Mapping[str, Any], was: ClassStatus | None, plan: Plan) -> ClassStatus:
    name, phase = run["metadata"]["name"], run_phase(run)
    status = _with(status, run_name=name, reason=run["spec"]["reason"])
    if phase == RunPhase.FAILED:
        reason, message = run_failure(run)
        if was is None or was.state != ClassState.DEGRADED:
            plan.events.append(Event("Warning", reason, f"run {name} failed: {message}"))
        return _with(status, state=ClassState.DEGRADED, reason=reason, message=message)
    if phase == RunPhase.SUCCEEDED:
        return _with(status, state=ClassState.ROLLING_OUT)
    progress = (run.get("status") or {}).get("progress") or {}
    done, budget = progress.get("trialsCompleted", 0), progress.get("trialBudget")
    stage = progress.get("stage") or phase
    return _with(status, state=ClassState.ADAPTING, message=f"{stage}: {done}/{budget or '?'} trials")


def _serve(
    policy: Mapping[str, Any],
    group: ClassGroup,
    class_runs: list[Mapping[str, Any]],
    current: Mapping[str, Any] | None,
    status: ClassStatus,
    was: ClassStatus | None,
    by_name: Mapping[str, Mapping[str, Any]],
    limits: RunLimits,
    serving: ServingDefaults | None,
    plan: Plan,
    now: dt.datetime,
) -> ClassStatus:
    """Apply the newest succeeded run's Deployment; the class is Ready once it is current and available.

    A new recipe for a class that already serves one goes through a canary first (``_canary``).
    """
    done = [r for r in class_runs if run_phase(r) == RunPhase.SUCCEEDED and (r.get("status") or {}).get("bestRecipe")]
    best = current if current in done else latest(done)
    if best is None:
        return status
    best, status = _canary(policy, group, done, best, status, was, by_name, serving, plan, now)
    desired = build_deployment(policy, group, best, serving)
    desired["metadata"].setdefault("annotations", {})[SPEC_HASH] = _hash(desired)
    name = desired["metadata"]["name"]
    existing = by_name.get(name)
    have = (existing or {}).get("metadata", {}).get("annotations", {}).get(SPEC_HASH)
    if existing is None or have != desired["metadata"]["annotations"][SPEC_HASH]:
        plan.deployments_to_apply.append(DeploymentAction("create" if existing is None else "update", desired))
        if best is current:
            plan.events.append(Event("Normal", Reason.ROLLING_OUT, f"{name}: serving run {best['metadata']['name']}"))
    plan.services.append(build_service(policy, group))
    rs = best.get("status") or {}
    metrics = rs.get("bestMetrics") or {}
    variant = VariantSummary(
        recipe_key=rs.get("bestRecipeKey") or "",
        run_name=best["metadata"]["name"],
        p95_ms=metrics.get("p95Ms"),
        quality_drop=metrics.get("qualityDrop"),
    )
    status = _with(
        status,
        current=variant,
        deployment_name=name,
        last_adaptation_time=rs.get("completionTime"),
        last_adaptation_reason=best["spec"]["reason"],
    )
    up_to_date = existing is not None and have == desired["metadata"]["annotations"][SPEC_HASH]
    canary = status.rollout is not None and status.rollout.phase == RolloutPhase.CANARY
    if (
        status.state == ClassState.ROLLING_OUT
        and not canary
        and up_to_date
        and (not limits.wait_for_available or _available(existing or {}))
    ):
        rolled_back = status.rollout is not None and status.rollout.phase == RolloutPhase.ROLLED_BACK
        message = f"serving the stable variant, canary rolled back: {status.rollout.reason}" if rolled_back else ""
        status = _with(
            status, state=ClassState.READY, reason=Reason.SUCCEEDED, message=message or "serving the best variant"
        )
    return status


def _canary(
    policy: Mapping[str, Any],
    group: ClassGroup,
    done: list[Mapping[str, Any]],
    best: Mapping[str, Any],
    status: ClassStatus,
    was: ClassStatus | None,
    by_name: Mapping[str, Mapping[str, Any]],
    serving: ServingDefaults | None,
    plan: Plan,
    now: dt.datetime,
) -> tuple[Mapping[str, Any], ClassStatus]:
    """Which run the stable Deployment serves, with the canary Deployment and rollout status that go with it.

    A class that serves a stable variant keeps it while a succeeded run with a different recipe key runs as a
    canary beside it (phase Canary, ``startedAt`` now). operator.rollout decides from Prometheus and writes
    Promoted (the new run becomes stable here) or RolledBack (the stable run stays, the canary goes). Everything
    is read from the status, so a restarted operator continues the same canary. No stable variant yet, or
    ``canaryReplicas`` 0: the new run is served directly, as before canaries existed.
    """
    spec = AdaptationPolicySpec.model_validate(policy["spec"])
    canary_dep = canary_name(policy["metadata"]["name"], group.hardware_class.name())
    stable_name = was.current.run_name if was is not None and was.current is not None else None
    stable = next((r for r in done if r["metadata"]["name"] == stable_name), None)
    rollout = status.rollout
    serve, canary_run = best, None
    if (
        stable is not None
        and stable is not best
        and _recipe_key(stable) != _recipe_key(best)
        and spec.rollout.canary_replicas > 0
        and workload_name(policy["metadata"]["name"], group.hardware_class.name()) in by_name
    ):
        same = rollout is not None and rollout.canary is not None and rollout.canary.run_name == _name(best)
        phase = rollout.phase if same and rollout is not None else None
        if phase == RolloutPhase.ROLLED_BACK:
            serve = stable
        elif phase != RolloutPhase.PROMOTED:
            serve, canary_run = stable, best
            if phase != RolloutPhase.CANARY:
                rollout = RolloutStatus(
                    phase=RolloutPhase.CANARY,
                    canary=_summary(best),
                    started_at=now,
                    reason=Reason.CANARY_PROGRESSING,
                    message=f"canary {canary_dep} serving run {best['metadata']['name']}",
                )
                message = f"{canary_dep}: canary of run {_name(best)}"
                plan.events.append(Event("Normal", Reason.CANARY_PROGRESSING, message))
    elif rollout is not None and rollout.phase == RolloutPhase.CANARY:  # superseded: the stable variant is the canary's
        rollout = rollout.model_copy(update={"phase": RolloutPhase.STABLE, "message": "canary superseded"})
    if canary_run is None:
        if canary_dep in by_name:
            plan.deployments_to_delete.append(canary_dep)
        return serve, _with(status, rollout=rollout.model_dump() if rollout else None)
    desired = build_deployment(
        policy, group, canary_run, serving, track="canary", replicas=spec.rollout.canary_replicas
    )
    desired["metadata"].setdefault("annotations", {})[SPEC_HASH] = _hash(desired)
    existing = by_name.get(canary_dep)
    have = (existing or {}).get("metadata", {}).get("annotations", {}).get(SPEC_HASH)
    if existing is None or have != desired["metadata"]["annotations"][SPEC_HASH]:
        plan.deployments_to_apply.append(DeploymentAction("create" if existing is None else "update", desired))
    assert rollout is not None
    status = _with(status, rollout=rollout.model_dump(), reason=Reason.CANARY_PROGRESSING, message=rollout.message)
    return serve, status


def _name(run: Mapping[str, Any]) -> str:
    return str(run["metadata"]["name"])


def _recipe_key(run: Mapping[str, Any]) -> str:
    rs = run.get("status") or {}
    return str(rs.get("bestRecipeKey") or Recipe.model_validate(rs["bestRecipe"]).key())


def _summary(run: Mapping[str, Any]) -> VariantSummary:
    rs = run.get("status") or {}
    metrics = rs.get("bestMetrics") or {}
    return VariantSummary(
        recipe_key=_recipe_key(run),
        run_name=run["metadata"]["name"],
        p95_ms=metrics.get("p95Ms"),
        quality_drop=metrics.get("qualityDrop"),
    )


def _available(dep: Mapping[str, Any]) -> bool:
    want = (dep.get("spec") or {}).get("replicas", 1)
    st = dep.get("status") or {}
    fresh = st.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
    return fresh and st.get("updatedReplicas", 0) >= want and st.get("availableReplicas", 0) >= want


def _conditions(
    previous: list[Condition], classes: list[ClassStatus], generation: int, now: dt.datetime
) -> list[Condition]:
    states = [c.state for c in classes]
    ready = sum(s == ClassState.READY for s in states)
    summary = f"{ready}/{len(classes)} classes ready"
    if not classes:
        status, reason = "False", Reason.NO_MATCHING_NODES
    elif ready == len(classes):
        status, reason = "True", Reason.ALL_CLASSES_READY
    elif ClassState.DEGRADED in states or ClassState.FAILED in states:
        status, reason = "False", Reason.CLASS_FAILED
    elif ClassState.ADAPTING in states or ClassState.ROLLING_OUT in states:
        status, reason = "False", Reason.ADAPTING
    else:
        status, reason = "False", Reason.CLASSES_PENDING
    busy = [c.name for c in classes if c.state in (ClassState.ADAPTING, ClassState.ROLLING_OUT)]
    bad = [f"{c.name}: {c.reason}" for c in classes if c.state in (ClassState.DEGRADED, ClassState.FAILED)]
    out = set_condition(previous, ConditionType.READY, status, reason, summary, observed_generation=generation, now=now)  # type: ignore[arg-type]
    out = set_condition(
        out,
        ConditionType.PROGRESSING,
        "True" if busy else "False",
        Reason.ADAPTING if busy else Reason.RECONCILING,
        ", ".join(busy),
        observed_generation=generation,
        now=now,
    )
    return set_condition(
        out,
        ConditionType.DEGRADED,
        "True" if bad else "False",
        Reason.CLASS_FAILED if bad else reason,
        "; ".join(bad),
        observed_generation=generation,
        now=now,
    )


def _status(generation: int, plan: Plan) -> AdaptationPolicyStatus:
    ready = sum(c.state == ClassState.READY for c in plan.class_statuses)
    p95s = [c.current.p95_ms for c in plan.class_statuses if c.current and c.current.p95_ms is not None]
    return AdaptationPolicyStatus(
        observed_generation=generation,
        conditions=plan.conditions,
        classes=plan.class_statuses,
        class_count=len(plan.class_statuses),
        ready_classes=ready,
        classes_summary=f"{ready}/{len(plan.class_statuses)}",
        best_p95_ms=round(max(p95s), 3) if p95s else None,  # to the microsecond: kubectl prints it as is
    )


def _with(status: ClassStatus, **changes: Any) -> ClassStatus:
    return ClassStatus.model_validate({**status.model_dump(), **changes})


def _hash(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()[:16]


# --- runs and their Jobs ------------------------------------------------------------------------------------------


def run_phase(run: Mapping[str, Any]) -> RunPhase:
    """status.phase if set (and known), else derived from the Succeeded condition."""
    status = run.get("status") or {}
    if status.get("phase") in RunPhase.__members__.values():
        return RunPhase(status["phase"])
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == ConditionType.SUCCEEDED), None)
    if cond is None:
        return RunPhase.RUNNING if status.get("jobName") or status.get("startTime") else RunPhase.PENDING
    return {"True": RunPhase.SUCCEEDED, "False": RunPhase.FAILED}.get(cond.get("status"), RunPhase.RUNNING)


def run_failure(run: Mapping[str, Any]) -> tuple[str, str]:
    """(reason, message) of a failed run, from its Succeeded condition."""
    status = run.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == ConditionType.SUCCEEDED), None)
    if cond and cond.get("status") == "False":
        return cond.get("reason") or Reason.JOB_FAILED, cond.get("message") or ""
    return Reason.JOB_FAILED, "the run failed without a reason"


def latest(runs: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The most recently created run (creationTimestamp, then name: deterministic on ties)."""
    return max(
        runs, key=lambda r: (str(r["metadata"].get("creationTimestamp", "")), r["metadata"]["name"]), default=None
    )


def plan_job(
    run: Mapping[str, Any],
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
    if (run.get("status") or {}).get("jobName"):
        return None
    return build_job(run, group, settings)


def run_status_from_job(
    run: Mapping[str, Any], job: Mapping[str, Any] | None, now: dt.datetime
) -> dict[str, Any] | None:
    """A status patch failing ``run`` when its Job ended (or vanished) without the agent writing a result.

    The agent writes Succeeded/Failed itself; this covers what it cannot: OOM kills, the deadline, the backoff
    limit, a deleted Job. None while the Job runs or once the run is finished.
    """
    status = run.get("status") or {}
    if run_phase(run) not in IN_FLIGHT:
        return None
    if job is None:
        if not status.get("jobName"):
            return None
        reason, message = Reason.JOB_FAILED, f"Job {status['jobName']} was deleted before the run finished"
    else:
        conds = {
            c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
        }
        if "Failed" in conds:
            reason = _JOB_REASONS.get(conds["Failed"].get("reason", ""), Reason.JOB_FAILED)
            message = conds["Failed"].get("message") or f"Job {job['metadata']['name']} failed"
        elif "Complete" in conds:
            reason, message = Reason.JOB_FAILED, f"Job {job['metadata']['name']} completed without writing a result"
        else:
            return None
    conditions = [Condition.model_validate(c) for c in status.get("conditions") or []]
    conditions = set_condition(conditions, ConditionType.SUCCEEDED, "False", reason, message, now=now)
    return {
        "phase": RunPhase.FAILED.value,
        "completionTime": now.isoformat(),
        "conditions": [c.to_api() for c in conditions],
    }
