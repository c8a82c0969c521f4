"""Turn one policy's Plan into API calls, idempotently.

Order matters for crash safety: runs first (deterministic names, so a crash
before anything else just re-plans the same run), then each run's Job (created
if absent, recorded in the run's status after), then Deployments/Services,
deletions, and the policy status last (it is derived, so it is always safe to
recompute). A SIGKILL between any two steps leaves nothing that a re-plan
would duplicate.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from pydantic import ValidationError

from metainfer.core.api import ADAPTATION_POLICY, ADAPTATION_RUN
from metainfer.core.api.conditions import Condition, ConditionType, set_condition
from metainfer.core.api.policy import AdaptationPolicySpec
from metainfer.core.api.vocabulary import ClassState, Reason
from metainfer.core.control.events import coalesce
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.manifests import AgentJobSettings, ServingDefaults
from metainfer.core.control.naming import job_name
from metainfer.core.control.reconcile import Plan, RunLimits, plan_job, plan_policy, run_status_from_job
from metainfer.operator import kube
from metainfer.operator.config import OperatorConfig
from metainfer.operator.metrics import CLASSES, RUNS_FINISHED, RUNS_STARTED
from metainfer.operator.view import ClusterView


@dataclass(frozen=True)
class Inputs:
    policy: dict[str, Any]
    groups: list[ClassGroup]
    runs: list[dict[str, Any]]
    plan: Plan


def reconcile_inputs(
    policy: dict[str, Any],
    view: ClusterView,
    nodes_index: Mapping[str, Any],
    runs_index: Mapping[Any, Any],
    deployments_index: Mapping[Any, Any],
    cluster_in_flight: int,
    config: OperatorConfig,
) -> Inputs:
    """Read everything the plan needs from the indexes and plan (pure apart from reading).

    ``cluster_in_flight``: Pending/Running runs of every policy, this one's included.
    """
    namespace, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
    spec = AdaptationPolicySpec.model_validate(policy["spec"])
    groups = view.selected(spec.hardware, nodes_index)
    runs = list(runs_index.get((namespace, name), []))
    deployments = list(deployments_index.get((namespace, name), []))
    limits = RunLimits(
        cluster_max_in_flight=config.max_concurrent_runs,
        cluster_in_flight=cluster_in_flight,
        wait_for_available=config.wait_for_available,
    )
    serving = ServingDefaults(image=config.agent_image)
    plan = plan_policy(policy, groups, runs, deployments, dt.datetime.now(dt.UTC), limits, serving=serving)
    return Inputs(policy, groups, runs, plan)


async def apply_plan(
    body: kopf.Body,
    inputs: Inputs,
    jobs_index: Mapping[Any, Any],
    config: OperatorConfig,
    logger: logging.Logger,
    now: dt.datetime,
) -> dict[str, Any]:
    """Carry out the plan; returns the policy as stored afterwards (the next steps read it instead of a GET)."""
    plan, policy = inputs.plan, inputs.policy
    namespace, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
    for planned in plan.runs_to_create:
        if await kube.create_if_absent(planned.manifest):
            RUNS_STARTED.labels(planned.reason).inc()
            logger.info("created run %s (%s)", planned.manifest["metadata"]["name"], planned.reason)
    for run_name in plan.runs_to_delete:
        await kube.delete("AdaptationRun", namespace, run_name)
    await _jobs(inputs, jobs_index, config, now)
    for action in plan.deployments_to_apply:
        await kube.apply(action.manifest)
    for service in plan.services:
        await kube.create_if_absent(service)
    for workload in plan.deployments_to_delete:
        await kube.delete("Deployment", namespace, workload)
        await kube.delete("Service", namespace, workload)
    CLASSES.labels(namespace, name).set(len(inputs.groups))
    assert plan.status is not None
    new_status = plan.status.to_api()
    if _changed(policy.get("status") or {}, new_status):
        _count_finished(policy.get("status") or {}, new_status)
        stored = await kube.patch_status(ADAPTATION_POLICY.plural, namespace, name, new_status)
        for event in coalesce(plan.events):
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        return stored or policy
    return policy


async def _jobs(inputs: Inputs, jobs_index: Mapping[Any, Any], config: OperatorConfig, now: dt.datetime) -> None:
    """Create the Job of every run that lacks one; fail runs whose Job ended without a result."""
    by_fp = {g.fingerprint: g for g in inputs.groups}
    settings = AgentJobSettings(image=config.agent_image, service_account=config.agent_service_account)
    for run in inputs.runs:
        meta = run["metadata"]
        jname = job_name(meta["name"])
        stores = jobs_index.get((meta["namespace"], jname))
        job = next(iter(stores)) if stores else None
        manifest = plan_job(run, job, by_fp.get(run["spec"]["classFingerprint"]), settings)
        if manifest is not None:
            await kube.create_if_absent(manifest)
            await kube.patch_status(ADAPTATION_RUN.plural, meta["namespace"], meta["name"], {"jobName": jname})
            continue
        failed = run_status_from_job(run, job, now)
        if failed is not None:
            await kube.patch_status(ADAPTATION_RUN.plural, meta["namespace"], meta["name"], failed)


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items()) or any(k not in new for k in old)


def _count_finished(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Run outcomes, counted on the durable transition of a class out of Adapting."""
    before = {c["fingerprint"]: c for c in old.get("classes", [])}
    for cls in new.get("classes", []):
        was = before.get(cls["fingerprint"], {})
        if was.get("state") == ClassState.ADAPTING and cls.get("state") != ClassState.ADAPTING:
            outcome = "failed" if cls.get("state") in (ClassState.DEGRADED, ClassState.FAILED) else "succeeded"
            RUNS_FINISHED.labels(outcome, cls.get("reason") or outcome).inc()


async def invalid_spec_status(body: kopf.Body, exc: ValidationError) -> None:
    """A policy the schema accepted but core cannot use: a Ready=False condition naming the field."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    message = f"spec.{where}: {err['msg']}"
    meta = body["metadata"]
    previous = [Condition.model_validate(c) for c in (body.get("status") or {}).get("conditions", [])]
    conditions = set_condition(
        previous, ConditionType.READY, "False", Reason.INVALID_SPEC, message, observed_generation=meta.get("generation")
    )
    status = {"observedGeneration": meta.get("generation"), "conditions": [c.to_api() for c in conditions]}
    await kube.patch_status(ADAPTATION_POLICY.plural, meta["namespace"], meta["name"], status)
    kopf.event(body, type="Warning", reason=Reason.INVALID_SPEC, message=message)
