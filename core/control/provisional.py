"""A class with no adapted variant of its own serves at once with the most similar class's validated variant.

New nodes (new hardware of a known vendor, a new driver version, a relabel) make a class whose own run takes
minutes; until then the class would add no serving capacity, and a class replacing another (a rolling driver
upgrade) would depend on the old one's pods alone. So while a class has no servable run, its Deployment serves
the variant of the policy's most similar class (``class_similarity``: same vendor and architecture required, then
product, compute capability, driver, memory and CPU features), for the policy's current model and batch size.
The class shows it (state Provisional, the donor run and class in the message); its own run's variant then
replaces it through the canary like any new variant (core.control.serving).

Before a provisional pod serves, its init container (``metainfer check-provisional``) rebuilds the donor's variant
(the bytes the donor validated, ``--variant-sha256``, under the donor's runtime: manifests.serving_image) and
checks it on the node against the policy's quality budget and p95 SLO (core.engine.onnode_check); a variant that
misses either, or does not run there, is replaced by the FP32 model. The container's termination message carries
what it found; the operator lists the class's provisional pods (``read_pod_checks``) and the status says what
they serve. The class's own run then measures everything thoroughly.
"""

from __future__ import annotations

import math

from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.core.api.policy import ClassStatus, VariantSummary
from metainfer.core.api.run import AdaptationRun
from metainfer.core.api.vocabulary import ClassState, Reason, RunPhase
from metainfer.core.control.decisions import ClassContext, ClassPlan, Decisions, updated
from metainfer.core.control.events import Event
from metainfer.core.control.manifests import build_deployment, class_serving_objects
from metainfer.core.control.naming import label_value
from metainfer.core.control.objects import name_of, run_phase
from metainfer.core.control.pod_checks import PodCheck

# What makes two classes' hardware alike, by weight; vendor and architecture are requirements, not weights.
WEIGHTS = {"product": 4.0, "compute_capability": 2.0, "driver_version": 1.0, "runtime_version": 1.0}


def class_similarity(a: HardwareClass, b: HardwareClass) -> float:
    """0 when a variant of ``b`` cannot run on ``a`` (another vendor or architecture), else in (0, 1]: 1 for the
    same labels."""
    if a.vendor != b.vendor or a.cpu_arch != b.cpu_arch:
        return 0.0
    score = sum(weight for field, weight in WEIGHTS.items() if getattr(a, field) == getattr(b, field))
    total = sum(WEIGHTS.values()) + 2.0
    if a.memory_mib and b.memory_mib:
        score += math.exp(-abs(math.log(a.memory_mib / b.memory_mib)))
    else:
        score += 1.0
    features_a, features_b = set(a.cpu_features), set(b.cpu_features)
    union = features_a | features_b
    score += len(features_a & features_b) / len(union) if union else 1.0
    return max(score / total, 1e-3)


def donor_run(context: ClassContext) -> AdaptationRun | None:
    """The succeeded run of another class whose variant this class serves while it has none: for the policy's
    current model and batch size, on the most similar hardware, the newest on ties."""
    spec, mine = context.spec, context.group.hardware_class
    candidates = [
        run
        for run in context.policy_runs
        if run.spec.class_fingerprint != context.fingerprint
        and run_phase(run) == RunPhase.SUCCEEDED
        and run.status is not None
        and run.status.best_recipe is not None
        and run.spec.model_sha256 == spec.model.sha256
        and run.spec.batch_size == spec.slo.batch_size
        and class_similarity(mine, run.spec.hardware_class) > 0
    ]

    def rank(run: AdaptationRun) -> tuple[float, float, str]:
        ended = run.status.completion_time if run.status else None
        return class_similarity(mine, run.spec.hardware_class), ended.timestamp() if ended else 0.0, name_of(run)

    return max(candidates, key=rank, default=None)


def plan_provisional(context: ClassContext, status: ClassStatus) -> ClassPlan:
    """The class's Deployment serving the donor's variant, if there is a donor; the status says so."""
    # core.control.serving plans what a class serves and calls this when it has nothing of its own.
    from metainfer.core.control.serving import deployment_action, variant_summary

    donor = donor_run(context)
    if donor is None:
        return ClassPlan(status)
    desired = build_deployment(context.policy, context.group, donor, context.serving, provisional=True)
    name = desired["metadata"]["name"]
    action = deployment_action(desired, context.deployments.get(name))
    source = donor.spec.class_description or donor.spec.hardware_class.name()
    waiting = f"; own run {status.run_name}: {status.message}" if status.message else ""
    checks = [c for c in context.pod_checks.get(context.fingerprint, ()) if c.run == label_value(name_of(donor))]
    message = (
        f"provisional: serving the variant of run {name_of(donor)} (class {source}, the most similar with a "
        f"validated variant) until this class's own adapted variant replaces it; {checks_summary(checks)}{waiting}"
    )
    current = variant_summary(donor)
    if checks and all(c.result.serves == "fp32" for c in checks):
        current = fp32_summary(donor)
    state, reason = ClassState.PROVISIONAL, str(Reason.PROVISIONAL)
    if status.state not in (ClassState.ADAPTING, ClassState.PENDING):  # its own run failed: it says so, and serves
        state, reason, message = status.state, status.reason or reason, f"{status.message}; meanwhile {message}"
    status = updated(
        status,
        state=state,
        reason=reason,
        message=message,
        current=current,
        deployment_name=name,
    )
    events = (
        (Event("Normal", Reason.PROVISIONAL, f"{name}: {message}"),) if action and action.action == "create" else ()
    )
    return ClassPlan(
        status,
        Decisions(
            deployments_to_apply=(action,) if action else (),
            objects_to_create=class_serving_objects(context.policy, context.group),
            events=events,
        ),
    )


def checks_summary(checks: list[PodCheck]) -> str:
    """What the class's provisional pods serve after their on-node checks, in a clause of the status message."""
    if not checks:
        return "each pod checks the variant on its node first (quality, p95) and serves FP32 if it misses the SLO"
    fp32 = [c for c in checks if c.result.serves == "fp32"]
    if not fp32:
        return f"{checks[0].result.describe()} ({len(checks)} pod{'s' if len(checks) > 1 else ''})"
    head = "every pod" if len(fp32) == len(checks) else f"{len(fp32)} of {len(checks)} pods"
    return f"{head} serve{'s' if head == 'every pod' else ''} FP32: {fp32[0].result.describe()}"


def fp32_summary(donor: AdaptationRun) -> VariantSummary:
    """The class's current variant when every provisional pod refused the donor's: the FP32 model (its run is
    still the donor's, whose recipe the pods were given and which stays the stable side of the next canary)."""
    from metainfer.core.control.serving import variant_summary

    summary = variant_summary(donor)
    return summary.model_copy(
        update={
            "description": f"FP32: the on-node check refused run {name_of(donor)}'s variant",
            "p95_ms": None,
            "quality_drop": 0.0,
        }
    )
