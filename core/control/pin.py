"""spec.pin: a class serves one adapted variant as it is, whatever drift, hardware churn or new runs say.

A class with a succeeded run that matches the pin (by run name, or by the sha256 of the variant it validated)
serves that run's variant directly: no canary (one in progress is dropped), no new run (one in flight finishes
and is kept as history), state Ready once the Deployment is rolled out, reason Pinned. A class without such a run
adapts as usual: a pin cannot serve what was never validated on that hardware.
"""

from __future__ import annotations

from metainfer.core.api.conditions import Reason
from metainfer.core.api.run import AdaptationRun
from metainfer.core.api.vocabulary import ClassState, RunPhase
from metainfer.core.control.decisions import ClassContext, ClassPlan, Decisions
from metainfer.core.control.events import Event
from metainfer.core.control.manifests import build_deployment, class_serving_objects
from metainfer.core.control.naming import canary_name
from metainfer.core.control.objects import name_of, run_phase
from metainfer.core.control.runs import class_jobs, discovered, fresh_status
from metainfer.core.control.serving import deployment_action, serving_run


def pinned_run(context: ClassContext) -> AdaptationRun | None:
    """The class's succeeded run the policy's pin names, if any."""
    pin = context.spec.pin
    if pin is None:
        return None
    for run in context.runs:
        if run_phase(run) != RunPhase.SUCCEEDED or run.status is None or run.status.best_recipe is None:
            continue
        if name_of(run) == pin.run_name or (
            pin.variant_sha256 is not None and run.status.best_variant_sha256 == pin.variant_sha256
        ):
            return run
    return None


def plan_pinned(context: ClassContext, run: AdaptationRun) -> ClassPlan:
    """Serve ``run``'s variant from the class's stable Deployment; drop a canary; start nothing."""
    assert context.spec.pin is not None
    desired = build_deployment(context.policy, context.group, run, context.serving)
    name = desired["metadata"]["name"]
    existing = context.deployments.get(name)
    action = deployment_action(desired, existing)
    canary = canary_name(context.policy_name, context.class_name)
    rolled_out = existing is not None and action is None and (not context.wait_for_available or existing.available)
    status = serving_run(
        fresh_status(context),
        run,
        name,
        rollout=None,
        state=ClassState.READY if rolled_out else ClassState.ROLLING_OUT,
        reason=Reason.PINNED,
        message=f"serving the pinned {context.spec.pin.describe()}: drift, driver changes and new runs change"
        " nothing in this class while spec.pin is set",
    )
    events = (Event("Normal", Reason.PINNED, f"{name}: serving the pinned run {name_of(run)}"),) if action else ()
    decisions = Decisions(
        deployments_to_apply=(action,) if action else (),
        deployments_to_delete=(canary,) if canary in context.deployments else (),
        objects_to_create=class_serving_objects(context.policy, context.group),
        events=(*discovered(context, status), *events),
    )
    return ClassPlan(status, decisions + class_jobs(context))
