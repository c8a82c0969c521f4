"""A class's serving: which succeeded run its Deployment serves, its canary, and when the class is Ready.

The newest succeeded run is served; the class is Ready once its Deployment
serves it and is available. A new recipe for a class that already serves one
goes through a canary first (``plan_canary``); operator.rollout decides from
Prometheus and writes Promoted or RolledBack into the status, which is all
the next plan reads, so a restarted operator continues the same canary.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from metainfer.core.api.conditions import Reason
from metainfer.core.api.names import ANNOTATION_SPEC_HASH
from metainfer.core.api.policy import ClassStatus, RolloutStatus, VariantSummary
from metainfer.core.api.run import AdaptationRun
from metainfer.core.api.vocabulary import ClassState, RolloutPhase, RunPhase
from metainfer.core.control.decisions import ClassContext, ClassPlan, Decisions, DeploymentAction, updated
from metainfer.core.control.events import Event
from metainfer.core.control.manifests import build_deployment, class_serving_objects
from metainfer.core.control.naming import canary_name, workload_name
from metainfer.core.control.objects import latest, name_of, recipe_key, run_phase, variant_key
from metainfer.core.control.provisional import plan_provisional
from metainfer.core.control.workloads import DeploymentState

# A pod named in a wait's reason (core.control.job_waits.why_pod_waits): the cause is the same whichever pod it names.
_POD_NAMED = re.compile(r"its pod \S+ ")
_CONTAINER_WAITS = re.compile(r"its pod waits: container [^:]*: [^:]*")


def plan_serving(context: ClassContext, status: ClassStatus) -> ClassPlan:
    """Apply the Deployment of the run the class should serve; Ready once it is current and available."""
    servable = [r for r in context.runs if run_phase(r) == RunPhase.SUCCEEDED and r.status and r.status.best_recipe]
    current = context.current
    best = current if any(r is current for r in servable) else latest(servable)
    if best is None:
        return plan_provisional(context, status)
    served, canary = plan_canary(context, servable, best, status)
    status = canary.status
    # The stable side of a provisional class's first canary (or what a rollback keeps) is still another class's
    # variant: its pods keep checking it on their node (core.control.provisional), and the Deployment is not rolled.
    lent = served.spec.class_fingerprint != context.fingerprint
    desired = build_deployment(context.policy, context.group, served, context.serving, provisional=lent)
    name = desired["metadata"]["name"]
    existing = context.deployments.get(name)
    action = deployment_action(desired, existing)
    events: tuple[Event, ...] = ()
    if action is not None and served is current:
        events = (Event("Normal", Reason.ROLLING_OUT, f"{name}: serving run {name_of(served)}"),)
    status = serving_run(status, served, name)
    in_canary = status.rollout is not None and status.rollout.phase == RolloutPhase.CANARY
    up_to_date = existing is not None and action is None
    if status.state == ClassState.ROLLING_OUT and not in_canary and up_to_date:
        assert existing is not None
        if not context.wait_for_available or existing.available:
            status = ready(status)
        elif why := context.rollout_waits.get(name) or existing.stuck:  # a pod's reason is the more precise
            # Whatever served before keeps serving: a rollout swaps in only available pods.
            status, said = rollout_waiting(context, status, f"rolling out {name}", why)
            events += said
    stable = Decisions(
        deployments_to_apply=(action,) if action else (),
        objects_to_create=class_serving_objects(context.policy, context.group),
        events=events,
    )
    return ClassPlan(status, canary.decisions + stable)


def rollout_waiting(
    context: ClassContext, status: ClassStatus, doing: str, why: str
) -> tuple[ClassStatus, tuple[Event, ...]]:
    """The class's message says why its rollout waits, for as long as it does; a Warning RolloutWaiting says it
    once per cause (what precedes the first colon, whichever of the Deployment's pods it names: the ReplicaSet
    replaces a failed pod under a new name), as core.control.runs does for a run's Job."""
    message = f"{doing}: waiting: {why}"
    cause = "waiting: " + _cause(why)
    was = context.previous
    said = was is not None and cause in _any_pod(was.message or "")
    events = () if said else (Event("Warning", Reason.ROLLOUT_WAITING, message),)
    return updated(status, message=message), events


def _any_pod(text: str) -> str:
    return _POD_NAMED.sub("its pod ", text)


def _cause(why: str) -> str:
    """What a wait is, without its details: ``its pod cannot be scheduled``, ``its pod waits: container serve:
    ImagePullBackOff``, or a controller's reason."""
    said = _any_pod(why)
    container = _CONTAINER_WAITS.match(said)
    return container.group(0) if container else said.split(":", 1)[0]


def serving_run(status: ClassStatus, run: AdaptationRun, deployment_name: str, **changes: Any) -> ClassStatus:
    """The class status of a class whose Deployment ``deployment_name`` serves ``run``'s variant."""
    return updated(
        status,
        current=variant_summary(run),
        deployment_name=deployment_name,
        last_adaptation_time=run.status.completion_time if run.status else None,
        last_adaptation_reason=run.spec.reason,
        **changes,
    )


def ready(status: ClassStatus) -> ClassStatus:
    rollout = status.rollout
    if rollout is not None and rollout.phase == RolloutPhase.ROLLED_BACK:
        message = f"serving the stable variant, canary rolled back: {rollout.reason}"
    else:
        message = "serving the best variant"
    return updated(status, state=ClassState.READY, reason=Reason.SUCCEEDED, message=message)


def plan_canary(
    context: ClassContext, servable: list[AdaptationRun], best: AdaptationRun, status: ClassStatus
) -> tuple[AdaptationRun, ClassPlan]:
    """The run the stable Deployment serves, and the canary Deployment and rollout status that go with it.

    A class that serves a stable variant keeps it while a succeeded run with a different variant (another recipe,
    or the same recipe for another model) runs as a canary beside it (phase Canary, ``startedAt`` now).
    Promoted: the new run becomes stable; RolledBack: the stable run stays and the canary goes. No stable variant
    yet, or ``canaryReplicas`` 0: the new run is served directly.
    """
    spec, was = context.spec, context.previous
    canary_deployment = canary_name(context.policy_name, context.class_name)
    stable_name = was.current.run_name if was is not None and was.current is not None else None
    # A provisional class's stable variant is another class's run (core.control.provisional).
    stable = next((r for r in (*servable, *context.policy_runs) if name_of(r) == stable_name), None)
    rollout = status.rollout
    serve, canary_run = best, None
    events: tuple[Event, ...] = ()
    if (
        stable is not None
        and stable is not best
        and variant_key(stable) != variant_key(best)
        and spec.rollout.canary_replicas_for(spec.serving.replicas) > 0
        and workload_name(context.policy_name, context.class_name) in context.deployments
    ):
        same = rollout is not None and rollout.canary is not None and rollout.canary.run_name == name_of(best)
        phase = rollout.phase if same and rollout is not None else None
        if phase == RolloutPhase.ROLLED_BACK:
            serve = stable
        elif phase != RolloutPhase.PROMOTED:
            serve, canary_run = stable, best
            if phase != RolloutPhase.CANARY:
                share = canary_share(spec.rollout.canary_replicas_for(spec.serving.replicas), spec.serving.replicas)
                rollout = RolloutStatus(
                    phase=RolloutPhase.CANARY,
                    canary=variant_summary(best),
                    started_at=context.now,
                    reason=Reason.CANARY_PROGRESSING,
                    message=f"canary {canary_deployment} serving run {name_of(best)} ({share})",
                )
                message = f"{canary_deployment}: canary of run {name_of(best)}"
                events = (Event("Normal", Reason.CANARY_PROGRESSING, message),)
    elif rollout is not None and rollout.phase == RolloutPhase.CANARY:  # superseded: the stable variant is the canary's
        rollout = rollout.model_copy(update={"phase": RolloutPhase.STABLE, "message": "canary superseded"})
    if canary_run is None:
        gone = (canary_deployment,) if canary_deployment in context.deployments else ()
        return serve, ClassPlan(updated(status, rollout=rollout), Decisions(deployments_to_delete=gone, events=events))
    assert rollout is not None
    desired = build_deployment(
        context.policy,
        context.group,
        canary_run,
        context.serving,
        track="canary",
        replicas=spec.rollout.canary_replicas_for(spec.serving.replicas),
    )
    existing = context.deployments.get(canary_deployment)
    action = deployment_action(desired, existing)
    status = updated(status, rollout=rollout, reason=Reason.CANARY_PROGRESSING, message=rollout.message)
    # The canary's pods that never become Ready: the analysis waits for metrics and rolls back at its deadline
    # (core.control.canary); meanwhile the class says why.
    if action is None and existing is not None and (why := context.rollout_waits.get(existing.name) or existing.stuck):
        status, said = rollout_waiting(context, status, rollout.message or f"canary {canary_deployment}", why)
        events += said
    return serve, ClassPlan(status, Decisions(deployments_to_apply=(action,) if action else (), events=events))


def canary_share(canary: int, stable: int) -> str:
    """What share of requests the canary gets: the Service spreads them evenly over ready pods."""
    return f"{canary} of {canary + stable} pods, about {100 * canary / (canary + stable):.0f}% of requests"


def variant_summary(run: AdaptationRun) -> VariantSummary:
    """The variant a succeeded run found, as the class status shows it (served or canary)."""
    metrics = run.status.best_metrics if run.status else None
    best = run.status.best_recipe if run.status else None
    return VariantSummary(
        recipe_key=recipe_key(run),
        # What serves, in words (runtime included), so `kubectl get -o yaml` says "... on OpenVINO (...)".
        description=best.describe()[:256] if best is not None else None,
        variant=variant_key(run),
        run_name=name_of(run),
        p95_ms=metrics.p95_ms if metrics else None,
        quality_drop=metrics.quality_drop if metrics else None,
    )


def deployment_action(desired: dict[str, Any], existing: DeploymentState | None) -> DeploymentAction | None:
    """Stamp ``desired`` with its spec hash; an action unless a Deployment of that name already has that hash."""
    # The digest covers the manifest as built, before the stamp adds metadata.annotations: that is the digest the
    # stamped Deployments in the cluster carry, so hashing after the stamp would re-apply every one of them.
    digest = spec_hash(desired)
    desired["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = digest
    if existing is not None and existing.spec_hash == digest:
        return None
    return DeploymentAction("create" if existing is None else "update", desired)


def spec_hash(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()[:16]
