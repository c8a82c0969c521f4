"""What the operator should do for one AdaptationPolicy, decided without side effects.

The kopf handler reads the policy, its runs, their Jobs and its Deployments
from its indexes, validates the policy and the runs (core.control.objects),
calls ``plan_policy``, and writes what the Plan says: create runs and Jobs
(if absent: names are deterministic, so a retry or a restarted operator never
makes a second one), apply/delete Deployments and Services, patch the status
and emit the events. All state comes from the API server; nothing from memory.

Per selected class, ``plan_class`` decides from a ``ClassContext`` and returns
a ``ClassPlan``: the run side (core.control.runs: one run per current run key,
the trigger reason, the concurrency limit, Jobs) then the serving side
(core.control.serving: the newest succeeded run is served, a new recipe goes
through a canary). ``plan_policy`` merges the classes' plans in class order.
Classes no longer selected (no nodes left, or deselected) leave the status;
their finished runs stay as history until the policy is deleted (owner
references collect them), and their unfinished runs are deleted, since their
Jobs can no longer schedule. Their Deployments and Services are deleted only
once they no longer serve, or the policy serves elsewhere (make before break:
a node relabelled by a driver upgrade keeps running the old class's pods while
the new class adapts, and the policy's Service keeps routing to them).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from metainfer.core.api.conditions import Condition, ConditionStatus, ConditionType, Reason, set_condition
from metainfer.core.api.names import LABEL_RUN_KEY
from metainfer.core.api.policy import (
    MAX_UNCLASSIFIED_NODES,
    AdaptationPolicy,
    AdaptationPolicyStatus,
    ClassStatus,
    ExcludedNode,
    UnclassifiedNode,
)
from metainfer.core.api.run import AdaptationRun
from metainfer.core.api.vocabulary import IN_FLIGHT, ClassState
from metainfer.core.control.decisions import (
    ClassContext,
    ClassPlan,
    Decisions,
    DeploymentAction,
    FailedRun,
    PlannedJob,
    PlannedRun,
    drift_epoch,
)
from metainfer.core.control.events import Event
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.manifests import build_policy_service, build_run, policy_endpoint
from metainfer.core.control.objects import InvalidRun, generation_of, label_of, name_of, run_phase
from metainfer.core.control.pin import pinned_run, plan_pinned
from metainfer.core.control.pod_checks import PodCheck
from metainfer.core.control.runs import (
    hold_class,
    job_decisions,
    plan_job,
    plan_runs,
    refuse_class,
    run_status_from_job,
    skipped,
)
from metainfer.core.control.serving import plan_serving
from metainfer.core.control.settings import AgentJobSettings, ServingDefaults
from metainfer.core.control.workloads import DeploymentState

__all__ = [
    "ClassContext",
    "ClassPlan",
    "Decisions",
    "DeploymentAction",
    "FailedRun",
    "Plan",
    "PlannedJob",
    "PlannedRun",
    "RunLimits",
    "build_run",  # bench.scale_lib builds a run through this module
    "drift_epoch",
    "plan_class",
    "plan_classes",
    "plan_job",
    "plan_policy",
    "run_phase",
    "run_status_from_job",
]


@dataclass(frozen=True)
class RunLimits:
    """Cluster-wide limits; ``cluster_in_flight`` counts Pending/Running runs of every policy, this one included."""

    cluster_max_in_flight: int = 8
    cluster_in_flight: int = 0
    # Fairness between tenants: the slots one namespace may hold, and how many its runs hold now (None: no cap).
    namespace_max_in_flight: int | None = None
    namespace_in_flight: int = 0
    wait_for_available: bool = True  # False where no kubelet runs (tests, the demo): applied counts as rolled out


@dataclass(frozen=True)
class Plan:
    """Everything one reconcile of a policy writes, in the order operator.apply writes it."""

    runs_to_create: list[PlannedRun]
    runs_to_delete: list[str]
    jobs_to_create: list[PlannedJob]
    runs_to_fail: list[FailedRun]
    deployments_to_apply: list[DeploymentAction]
    deployments_to_delete: list[str]  # Deployment, Service and PodDisruptionBudget of the same name
    objects_to_create: list[dict[str, Any]]  # Services and PodDisruptionBudgets: create each if absent
    class_statuses: list[ClassStatus]
    conditions: list[Condition]
    events: list[Event]
    status: AdaptationPolicyStatus


def plan_policy(
    policy: AdaptationPolicy,
    groups: Sequence[ClassGroup],
    runs: Sequence[AdaptationRun],
    deployments: Iterable[Mapping[str, Any]],
    now: dt.datetime,
    limits: RunLimits | None = None,
    *,
    serving: ServingDefaults | None = None,
    jobs: Mapping[str, Mapping[str, Any]] | None = None,
    job_settings: AgentJobSettings | None = None,
    invalid_runs: Sequence[InvalidRun] = (),
    unclassified_nodes: Mapping[str, str] | None = None,
    excluded_nodes: Mapping[str, str] | None = None,
    pod_checks: Mapping[str, tuple[PodCheck, ...]] | None = None,
    job_waits: Mapping[str, str] | None = None,
    rollout_waits: Mapping[str, str] | None = None,
) -> Plan:
    """The Plan for ``policy`` given its selected ``groups``, its runs (``invalid_runs``: those that did not
    validate), the Jobs of its runs by name (none yet when omitted) and its Deployments. ``unclassified_nodes`` and
    ``excluded_nodes`` (cordoned or tainted: in no group) are reported in the status, name -> why. ``pod_checks``:
    what provisional pods found on their nodes, by class fingerprint (core.control.pod_checks). ``job_waits``: why
    a Job has no pod at work, by Job name (core.control.job_waits); ``rollout_waits``: why a Deployment's pods do not
    become Ready, by Deployment name (core.control.rollout_waits)."""
    limits, jobs = limits or RunLimits(), jobs or {}
    previous = policy.status or AdaptationPolicyStatus()
    if policy.spec.suspend:
        held = plan_suspended(policy, groups, previous, now, _unclassified(unclassified_nodes or {}))
        return with_pin(with_excluded(held, excluded_nodes or {}), policy)
    existing = {d.name: d for d in map(DeploymentState.read, deployments)}
    shared = partial(
        ClassContext,
        policy=policy,
        policy_runs=tuple(runs),
        previous_classes={c.fingerprint: c for c in previous.classes},
        deployments=existing,
        jobs=jobs,
        wait_for_available=limits.wait_for_available,
        now=now,
        pod_checks=pod_checks or {},
        job_waits=job_waits or {},
        rollout_waits=rollout_waits or {},
    )
    by_class: defaultdict[str, list[AdaptationRun]] = defaultdict(list)
    for run in runs:
        by_class[run.spec.class_fingerprint].append(run)
    contexts = [
        shared(
            group=group,
            runs=tuple(by_class.get(group.fingerprint, ())),
            invalid_runs=tuple(r for r in invalid_runs if r.class_fingerprint == group.fingerprint),
            **class_settings(group, job_settings, serving),
        )
        for group in groups
    ]
    class_plans = plan_classes(contexts, free_slots(policy, contexts, limits))

    # Beyond the selected classes: the runs and Deployments of classes no longer selected, and unreadable runs
    # of no selected class (reported, nothing else: there is no class of theirs to hold).
    selected = {g.fingerprint for g in groups}
    orphans = [r for fp, class_runs in by_class.items() if fp not in selected for r in class_runs]
    leftovers = (
        Decisions(runs_to_delete=tuple(name_of(r) for r in orphans if run_phase(r) in IN_FLIGHT))
        + job_decisions(orphans, None, jobs=jobs, settings=job_settings, now=now)
        + remove_deselected(existing, selected)
        + Decisions(events=tuple(skipped(r) for r in invalid_runs if r.class_fingerprint not in selected))
    )
    unclassified = _unclassified(unclassified_nodes or {})
    leftovers += _newly_unclassified(unclassified, previous.unclassified_nodes)
    # The policy's stable address exists from the start, whatever serves behind it (classes come and go).
    leftovers += Decisions(objects_to_create=(build_policy_service(policy),))
    plan = merge(
        class_plans, leftovers, previous.conditions, generation_of(policy), now, unclassified, policy_endpoint(policy)
    )
    return with_pin(with_excluded(plan, excluded_nodes or {}), policy)


def class_settings(
    group: ClassGroup, job_settings: AgentJobSettings | None, serving: ServingDefaults | None
) -> dict[str, Any]:
    """The Job and serving settings of ``group``'s classes: the image (and runtime) the platform maps to its
    accelerator vendor; the platform's own, with ``image_missing``, where it maps none."""
    vendor = group.hardware_class.vendor
    job = job_settings.for_vendor(vendor) if job_settings else None
    served = serving.for_vendor(vendor) if serving else None
    missing = (job_settings is not None and job is None) or (serving is not None and served is None)
    return {"job_settings": job or job_settings, "serving": served or serving, "image_missing": missing}


def with_excluded(plan: Plan, nodes: Mapping[str, str]) -> Plan:
    """The plan with the nodes left out for scheduling (cordoned, untolerated taints) listed in the status."""
    if not nodes:
        return plan
    listed = [ExcludedNode(name=n, reason=why) for n, why in sorted(nodes.items())[:MAX_UNCLASSIFIED_NODES]]
    return replace(plan, status=plan.status.model_copy(update={"excluded_nodes": listed}))


def with_pin(plan: Plan, policy: AdaptationPolicy) -> Plan:
    """The plan with spec.pin in words in the status (kubectl get -o wide shows it)."""
    pin = policy.spec.pin
    if pin is None:
        return plan
    return replace(plan, status=plan.status.model_copy(update={"pinned": pin.describe()}))


def plan_suspended(
    policy: AdaptationPolicy,
    groups: Sequence[ClassGroup],
    previous: AdaptationPolicyStatus,
    now: dt.datetime,
    unclassified: list[UnclassifiedNode],
) -> Plan:
    """spec.suspend: nothing is created, applied or deleted but the policy's own Service (its address stays);
    each class keeps the status it had, a class new since is Pending; Progressing says why nothing moves."""
    before = {c.fingerprint: c for c in previous.classes}
    classes = [
        before.get(g.fingerprint)
        or ClassStatus(
            fingerprint=g.fingerprint,
            name=g.hardware_class.name(),
            hardware_class=g.hardware_class,
            nodes=len(g.node_names),
            node_names=list(g.node_names[:64]),
            state=ClassState.PENDING,
            reason=Reason.SUSPENDED,
            message="the policy is suspended: no run starts until spec.suspend is false",
        )
        for g in groups
    ]
    plan = merge(
        [],
        Decisions(objects_to_create=(build_policy_service(policy),)),
        previous.conditions,
        generation_of(policy),
        now,
        unclassified,
        policy_endpoint(policy),
    )
    conditions = policy_conditions(previous.conditions, classes, generation_of(policy), now)
    conditions = set_condition(
        conditions,
        ConditionType.PROGRESSING,
        "False",
        Reason.SUSPENDED,
        "spec.suspend is true: no new runs, rollouts or re-adaptations; serving is untouched",
        observed_generation=generation_of(policy),
        now=now,
    )
    status = policy_status(generation_of(policy), conditions, classes, unclassified, policy_endpoint(policy))
    return replace(plan, class_statuses=classes, conditions=conditions, status=status)


def _unclassified(nodes: Mapping[str, str]) -> list[UnclassifiedNode]:
    return [UnclassifiedNode(name=n, reason=why) for n, why in sorted(nodes.items())[:MAX_UNCLASSIFIED_NODES]]


def _newly_unclassified(nodes: list[UnclassifiedNode], before: list[UnclassifiedNode]) -> Decisions:
    """One Warning when the set of unclassifiable nodes grows, not on every reconcile."""
    known = {n.name for n in before}
    new = [n for n in nodes if n.name not in known]
    if not new:
        return Decisions()
    text = "; ".join(f"node {n.name}: {n.reason}" for n in new)
    return Decisions(events=(Event("Warning", Reason.NODE_UNCLASSIFIABLE, f"left out, no hardware class: {text}"),))


def plan_classes(contexts: Sequence[ClassContext], slots: int) -> list[ClassPlan]:
    """Each class's plan, in order; a class may start a run while ``slots`` are left."""
    plans: list[ClassPlan] = []
    for context in contexts:
        plan = plan_class(context, slot_free=slots > 0)
        slots -= len(plan.decisions.runs_to_create)
        plans.append(plan)
    return plans


def plan_class(context: ClassContext, *, slot_free: bool) -> ClassPlan:
    """One selected class: its runs, then what it serves; held while one of its runs does not validate, refused
    while the platform maps no image to its accelerator."""
    if context.invalid_runs:
        return hold_class(context)
    if context.image_missing:
        return refuse_class(context)
    pinned = pinned_run(context)
    if pinned is not None:
        return plan_pinned(context, pinned)
    runs = plan_runs(context, slot_free=slot_free)
    return runs.then(plan_serving(context, runs.status))


def free_slots(policy: AdaptationPolicy, contexts: Sequence[ClassContext], limits: RunLimits) -> int:
    """Runs this reconcile may start: the policy's, its namespace's and the cluster's limits, less what is in
    flight."""
    # Only current runs hold a slot: superseded ones and those of vanished classes are deleted by this plan.
    in_flight = sum(
        run_phase(r) in IN_FLIGHT for c in contexts for r in c.runs if label_of(r, LABEL_RUN_KEY) == c.run_key
    )
    left = [policy.spec.search.max_concurrent_runs - in_flight, limits.cluster_max_in_flight - limits.cluster_in_flight]
    if limits.namespace_max_in_flight is not None:
        left.append(limits.namespace_max_in_flight - limits.namespace_in_flight)
    return max(0, min(left))


def merge(
    class_plans: Sequence[ClassPlan],
    leftovers: Decisions,
    previous_conditions: list[Condition],
    generation: int,
    now: dt.datetime,
    unclassified: list[UnclassifiedNode] | None = None,
    endpoint: str | None = None,
) -> Plan:
    """The classes' plans in class order, then what the policy decided beyond them; conditions and status last."""
    decisions = sum((p.decisions for p in class_plans), Decisions()) + leftovers
    classes = [p.status for p in class_plans]
    conditions = policy_conditions(previous_conditions, classes, generation, now)
    return Plan(
        runs_to_create=list(decisions.runs_to_create),
        runs_to_delete=list(decisions.runs_to_delete),
        jobs_to_create=list(decisions.jobs_to_create),
        runs_to_fail=list(decisions.runs_to_fail),
        deployments_to_apply=list(decisions.deployments_to_apply),
        deployments_to_delete=list(decisions.deployments_to_delete),
        objects_to_create=list(decisions.objects_to_create),
        class_statuses=classes,
        conditions=conditions,
        events=list(decisions.events),
        status=policy_status(generation, conditions, classes, unclassified or [], endpoint),
    )


def remove_deselected(existing: Mapping[str, DeploymentState], selected: set[str]) -> Decisions:
    """Deployments (and their Services) of classes no longer selected, once deleting them costs no answer: they
    have no available replica (their nodes were drained), or a selected class's Deployment has one."""
    deselected = {name: d for name, d in sorted(existing.items()) if d.class_fingerprint not in selected}
    elsewhere = any(d.serving for d in existing.values() if d.class_fingerprint in selected)
    gone = tuple(name for name, d in deselected.items() if elsewhere or not d.serving)
    why = "the policy serves from a selected class" if elsewhere else "it has no available replica"
    events = tuple(
        Event("Normal", Reason.CLASS_REMOVED, f"deleting {n}: its class has no selected nodes and {why}") for n in gone
    )
    return Decisions(deployments_to_delete=gone, events=events)


def policy_conditions(
    previous: list[Condition], classes: list[ClassStatus], generation: int, now: dt.datetime
) -> list[Condition]:
    """Ready summarises the classes; Progressing names the busy ones; Degraded the failed ones, with why."""
    states = [c.state for c in classes]
    ready = sum(s == ClassState.READY for s in states)
    status: ConditionStatus = "False"
    if not classes:
        reason = Reason.NO_MATCHING_NODES
    elif ready == len(classes):
        status, reason = "True", Reason.ALL_CLASSES_READY
    elif ClassState.DEGRADED in states or ClassState.FAILED in states:
        reason = Reason.CLASS_FAILED
    elif {ClassState.ADAPTING, ClassState.PROVISIONAL, ClassState.ROLLING_OUT} & set(states):
        reason = Reason.ADAPTING
    else:
        reason = Reason.CLASSES_PENDING
    busy = [c.name for c in classes if c.state in (ClassState.ADAPTING, ClassState.PROVISIONAL, ClassState.ROLLING_OUT)]
    bad = [f"{c.name}: {c.reason}" for c in classes if c.state in (ClassState.DEGRADED, ClassState.FAILED)]

    def put(
        conditions: list[Condition], type_: ConditionType, status: ConditionStatus, reason: Reason, message: str
    ) -> list[Condition]:
        return set_condition(conditions, type_, status, reason, message, observed_generation=generation, now=now)

    out = put(previous, ConditionType.READY, status, reason, f"{ready}/{len(classes)} classes ready")
    out = put(
        out,
        ConditionType.PROGRESSING,
        "True" if busy else "False",
        Reason.ADAPTING if busy else Reason.RECONCILING,
        ", ".join(busy),
    )
    return put(
        out, ConditionType.DEGRADED, "True" if bad else "False", Reason.CLASS_FAILED if bad else reason, "; ".join(bad)
    )


def policy_status(
    generation: int,
    conditions: list[Condition],
    classes: list[ClassStatus],
    unclassified: list[UnclassifiedNode] | None = None,
    endpoint: str | None = None,
) -> AdaptationPolicyStatus:
    ready = sum(c.state == ClassState.READY for c in classes)
    p95s = [c.current.p95_ms for c in classes if c.current and c.current.p95_ms is not None]
    return AdaptationPolicyStatus(
        observed_generation=generation,
        conditions=conditions,
        classes=classes,
        class_count=len(classes),
        ready_classes=ready,
        classes_summary=f"{ready}/{len(classes)}",
        worst_class_p95_ms=round(max(p95s), 3) if p95s else None,  # to the microsecond: kubectl prints it as is
        unclassified_nodes=unclassified or [],
        endpoint=endpoint,
    )
