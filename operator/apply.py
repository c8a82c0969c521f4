"""Turn one policy's Plan into API calls, idempotently.

Order matters for crash safety: runs first (deterministic names, so a crash
before anything else just re-plans the same run), then each run's Job (created
if absent, recorded in the run's status after), then Deployments/Services,
deletions, and the policy status last (it is derived, so it is always safe to
recompute). A SIGKILL between any two steps leaves nothing that a re-plan
would duplicate.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf
from pydantic import ValidationError

from metainfer.core.api.conditions import Condition, ConditionType, set_condition
from metainfer.core.api.names import LABEL_CLASS, POLICY_PLURAL, RUN_KIND, RUN_PLURAL
from metainfer.core.api.policy import AdaptationPolicy
from metainfer.core.api.vocabulary import ClassState, Reason
from metainfer.core.control.events import coalesce, missing_agent_account
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.logtail import LOG_TAIL_LINES, log_tail
from metainfer.core.control.naming import job_name
from metainfer.core.control.objects import name_of, parse_runs, validation_message
from metainfer.core.control.platform import ForbiddenByPlatform, check_platform_limits
from metainfer.core.control.pod_checks import read_pod_checks
from metainfer.core.control.pod_endings import pod_ending, with_ending
from metainfer.core.control.reconcile import Plan, RunLimits, plan_policy
from metainfer.core.control.settling import settled_groups
from metainfer.operator import api_calls
from metainfer.operator.config import OperatorConfig
from metainfer.operator.metrics import CLASSES, RUNS_FINISHED, RUNS_STARTED, SERIES, publish_policy
from metainfer.operator.view import ClusterView, Indexes


@dataclass(frozen=True)
class Inputs:
    body: dict[str, Any]  # the policy as read: its stored status decides whether to write one
    groups: list[ClassGroup]
    plan: Plan
    settle_wait_s: float | None = None  # a new class is settling: reconcile again when it has


def reconcile_inputs(
    body: dict[str, Any],
    view: ClusterView,
    indexes: Indexes,
    config: OperatorConfig,
    provisional_pods: Sequence[Mapping[str, Any]] = (),
    job_waits: Mapping[str, str] | None = None,
    rollout_waits: Mapping[str, str] | None = None,
) -> Inputs:
    """Validate the policy and its own runs (never the cluster's), read the rest from the indexes, and plan.

    A policy that does not validate raises ValidationError (``refusal`` and ``refused_status`` report it); a run
    that does not validate is planned around and reported by the plan (core.control.runs).
    """
    policy = AdaptationPolicy.model_validate(body)
    # Before anything is planned: nothing is created for a policy that asks for what the platform does not allow.
    check_platform_limits(policy.spec, config.platform_limits())
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    runs = parse_runs(indexes.runs_of(namespace, name))
    known = {r.spec.class_fingerprint for r in runs.valid} | {
        r.class_fingerprint for r in runs.invalid if r.class_fingerprint
    }
    known |= {c.fingerprint for c in (policy.status.classes if policy.status else [])}
    scheduling = (indexes.node_scheduling, config.placement())
    settled = settled_groups(
        view.selected(policy.spec.hardware, indexes.nodes, *scheduling),
        view.sightings,
        known,
        time.monotonic(),
        config.class_settle_seconds,
    )
    groups = settled.groups
    limits = RunLimits(
        cluster_max_in_flight=config.max_concurrent_runs,
        cluster_in_flight=indexes.cluster_in_flight(),
        namespace_max_in_flight=config.namespace_run_limit(),
        namespace_in_flight=indexes.namespace_in_flight(namespace),
        wait_for_available=config.wait_for_available,
    )
    plan = plan_policy(
        policy,
        groups,
        runs.valid,
        indexes.deployments_of(namespace, name),
        dt.datetime.now(dt.UTC),
        limits,
        serving=config.serving_defaults(),
        jobs=indexes.jobs_of(namespace, (name_of(r) for r in runs.valid)),
        job_settings=config.job_settings(),
        invalid_runs=runs.invalid,
        unclassified_nodes=view.unclassified(policy.spec.hardware, indexes.nodes),
        excluded_nodes=view.excluded(policy.spec.hardware, indexes.nodes, *scheduling),
        pod_checks=read_pod_checks(provisional_pods),
        job_waits=job_waits,
        rollout_waits=rollout_waits,
    )
    plan = dataclasses.replace(plan, objects_to_create=indexes.not_seen(plan.objects_to_create))
    return Inputs(body, groups, plan, settled.wait_s)


async def apply_plan(body: kopf.Body, inputs: Inputs, logger: logging.Logger) -> dict[str, Any]:
    """Carry out the plan; returns the policy as stored afterwards (the next steps read it instead of a GET)."""
    plan, policy = inputs.plan, inputs.body
    namespace, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
    for planned in plan.runs_to_create:
        if await api_calls.create_if_absent(planned.manifest):
            fingerprint = planned.manifest["metadata"]["labels"].get(LABEL_CLASS, "")
            SERIES.child(RUNS_STARTED, namespace, name, fingerprint, planned.reason).inc()
            logger.info("created run %s (%s)", planned.manifest["metadata"]["name"], planned.reason)
    for run_name in plan.runs_to_delete:
        await api_calls.delete(RUN_KIND, namespace, run_name)
    warned: set[str] = set()  # one lookup and one Warning per missing account per reconcile, not one per Job
    for job in plan.jobs_to_create:  # the Job first, its name in the run's status after: see plan_job
        account = job.manifest["spec"]["template"]["spec"].get("serviceAccountName")
        if account and account not in warned and await api_calls.service_account_missing(namespace, account):
            warned.add(account)
            # Found on a real node: the Job is accepted, but its pods never are, and nothing else says why.
            kopf.event(body, type="Warning", reason=Reason.AGENT_SERVICE_ACCOUNT_MISSING.value,
                       message=missing_agent_account(namespace, account, job.run_name))  # fmt: skip
        await api_calls.create_if_absent(job.manifest)
        await api_calls.patch_status(RUN_PLURAL, namespace, job.run_name, {"jobName": job.manifest["metadata"]["name"]})
    for failed in plan.runs_to_fail:
        # The Job's pods go with its TTL, and an OOM kill or a deadline leaves no message of the agent's own.
        tail = await api_calls.job_log(namespace, job_name(failed.run_name), LOG_TAIL_LINES)
        status = {**failed.status, "logTail": log_tail(tail)} if tail else failed.status
        if ending := pod_ending(await api_calls.job_pods(namespace, job_name(failed.run_name))):
            status = with_ending(status, ending)
        await api_calls.patch_status(RUN_PLURAL, namespace, failed.run_name, status)
    for action in plan.deployments_to_apply:
        await api_calls.apply(action.manifest)
    for obj in plan.objects_to_create:
        await api_calls.create_if_absent(obj)
    for workload in plan.deployments_to_delete:
        await api_calls.delete("Deployment", namespace, workload)
        await api_calls.delete("Service", namespace, workload)
        await api_calls.delete("PodDisruptionBudget", namespace, workload)
    SERIES.child(CLASSES, namespace, name).set(len(inputs.groups))
    new_status = plan.status.to_api()
    publish_policy(namespace, name, policy.get("spec") or {}, new_status)
    if _changed(policy.get("status") or {}, new_status):
        stored = await api_calls.patch_status(
            POLICY_PLURAL, namespace, name, new_status, read_at=api_calls.read_at(policy)
        )
        _count_finished(namespace, name, policy.get("status") or {}, new_status)  # once written: see StaleRead
        for event in coalesce(plan.events):
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        return stored or policy
    return policy


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items()) or any(k not in new for k in old)


_ADAPTING = (ClassState.ADAPTING, ClassState.PROVISIONAL)  # a provisional class's own run is still adapting


def _count_finished(namespace: str, name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Run outcomes, counted on the durable transition of a class out of Adapting."""
    before = {c["fingerprint"]: c for c in old.get("classes", [])}
    for cls in new.get("classes", []):
        was = before.get(cls["fingerprint"], {})
        if was.get("state") in _ADAPTING and cls.get("state") not in _ADAPTING:
            outcome = "failed" if cls.get("state") in (ClassState.DEGRADED, ClassState.FAILED) else "succeeded"
            reason = str(cls.get("reason") or outcome)[:64]  # Reason/FailureReason values: a small set
            SERIES.child(RUNS_FINISHED, namespace, name, cls["fingerprint"], outcome, reason).inc()


# Where a part of the policy validated on its own sits in the object (operator.drift and operator.rollout
# validate spec and status separately), so the message names the field by its full path.
_PART = {"AdaptationPolicySpec": "spec.", "AdaptationPolicyStatus": "status."}


# What a retry cannot fix: the policy says so (Ready=False, a warning event) and the next resync tries again.
Refusal = ValidationError | ForbiddenByPlatform | api_calls.ChildRejected


def refusal(exc: Refusal) -> tuple[Reason, str]:
    """The reason and message of a refused reconcile: a policy the schema accepted but core cannot use (naming
    the field), one asking for what the platform does not allow, or a child the API server refused."""
    if isinstance(exc, ValidationError):
        return Reason.INVALID_SPEC, _PART.get(exc.title, "") + validation_message(exc)
    if isinstance(exc, ForbiddenByPlatform):
        return Reason.FORBIDDEN_BY_PLATFORM, str(exc)
    return Reason.CHILD_REJECTED, str(exc)


async def refused_status(body: kopf.Body, policy: Mapping[str, Any], reason: Reason, message: str) -> None:
    """Ready=False on ``policy`` (as last read or written by this reconcile) and a Warning event on it."""
    meta = policy["metadata"]
    previous = [Condition.model_validate(c) for c in (policy.get("status") or {}).get("conditions", [])]
    conditions = set_condition(
        previous, ConditionType.READY, "False", reason, message, observed_generation=meta.get("generation")
    )
    status = {"observedGeneration": meta.get("generation"), "conditions": [c.to_api() for c in conditions]}
    await api_calls.patch_status(
        POLICY_PLURAL, meta["namespace"], meta["name"], status, read_at=api_calls.read_at(policy)
    )
    kopf.event(body, type="Warning", reason=reason, message=message[:1024])
