"""What planning one hardware class starts from, and what it decides.

``ClassContext`` holds everything that is the same for every decision about
one class of one policy in one reconcile; each planning step takes it and
returns a ``ClassPlan``: the class's status and its ``Decisions`` (objects to
create, apply or delete, events). Steps never write to shared state: their
decisions are concatenated, so ``plan_policy`` (core.control.reconcile) sees
what each class asked for and merges them in class order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from metainfer.core.api.conditions import Reason
from metainfer.core.api.names import ANNOTATION_RERUN, LABEL_RUN_KEY
from metainfer.core.api.policy import AdaptationPolicy, AdaptationPolicySpec, ClassStatus
from metainfer.core.api.run import AdaptationRun
from metainfer.core.control.events import Event
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.memory_bound import serving_memory_limit_mib
from metainfer.core.control.objects import InvalidRun, annotation_of, generation_of, label_of, name_of
from metainfer.core.control.pod_checks import PodCheck
from metainfer.core.control.runkey import run_key
from metainfer.core.control.settings import AgentJobSettings, ServingDefaults
from metainfer.core.control.workloads import DeploymentState


@dataclass(frozen=True)
class PlannedRun:
    manifest: dict[str, Any]
    reason: Reason


@dataclass(frozen=True)
class PlannedJob:
    """A run's Job, to create if absent; the run's status.jobName records it after."""

    run_name: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class FailedRun:
    """A status patch failing a run whose Job ended (or vanished) without the agent writing a result."""

    run_name: str
    status: dict[str, Any]


@dataclass(frozen=True)
class DeploymentAction:
    action: Literal["create", "update"]
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Decisions:
    """API writes and events one planning step asks for; ``+`` keeps each step's order."""

    runs_to_create: tuple[PlannedRun, ...] = ()
    runs_to_delete: tuple[str, ...] = ()
    jobs_to_create: tuple[PlannedJob, ...] = ()
    runs_to_fail: tuple[FailedRun, ...] = ()
    deployments_to_apply: tuple[DeploymentAction, ...] = ()
    deployments_to_delete: tuple[str, ...] = ()  # Deployment, Service and PodDisruptionBudget of the same name
    objects_to_create: tuple[dict[str, Any], ...] = ()  # Services and PodDisruptionBudgets: create each if absent
    events: tuple[Event, ...] = ()

    def __add__(self, other: Decisions) -> Decisions:
        return Decisions(**{name: getattr(self, name) + getattr(other, name) for name in _DECISION_FIELDS})


_DECISION_FIELDS = tuple(f.name for f in fields(Decisions))  # once: ``+`` runs a hundred times per reconcile


@dataclass(frozen=True)
class ClassPlan:
    """One class's status after a planning step, and what the steps so far decided for it."""

    status: ClassStatus
    decisions: Decisions = Decisions()

    def then(self, later: ClassPlan) -> ClassPlan:
        """A later step's plan, which started from this status: its status, both steps' decisions."""
        return ClassPlan(later.status, self.decisions + later.decisions)


@dataclass(frozen=True)
class ClassContext:
    policy: AdaptationPolicy
    group: ClassGroup
    runs: tuple[AdaptationRun, ...]  # the class's runs that validated, in listing order
    policy_runs: tuple[AdaptationRun, ...]  # every run of the policy that validated (history for new runs)
    invalid_runs: tuple[InvalidRun, ...]  # the class's runs that did not
    previous_classes: Mapping[str, ClassStatus]  # the policy's class statuses as last written, by fingerprint
    deployments: Mapping[str, DeploymentState]  # the policy's Deployments, by name
    jobs: Mapping[str, Mapping[str, Any]]  # the Jobs of the policy's runs, by name
    job_settings: AgentJobSettings | None
    serving: ServingDefaults | None
    wait_for_available: bool  # False: an applied Deployment counts as rolled out (no kubelet: tests, the demo)
    now: dt.datetime
    # Provisional pods' on-node checks by class fingerprint (core.control.pod_checks); none outside the operator.
    pod_checks: Mapping[str, tuple[PodCheck, ...]] = field(default_factory=dict)
    # Why a Job of the class's runs has no pod at work, by Job name (core.control.job_waits); none outside the operator.
    job_waits: Mapping[str, str] = field(default_factory=dict)
    # Why a Deployment of the policy has pods that do not become Ready, by Deployment name
    # (core.control.rollout_waits); none outside the operator.
    rollout_waits: Mapping[str, str] = field(default_factory=dict)
    # The platform maps no image to the class's accelerator vendor (WorkloadSettings.for_vendor): refused, never
    # adapted or served by the CPU image; ``job_settings`` and ``serving`` are then the platform's as given.
    image_missing: bool = False
    # Derived from the fields above, once: every step of the class's planning reads them.
    drift_epoch: str | None = field(init=False)  # the salt of ``run_key``: the class's last confirmed latency drift
    rerun: str | None = field(init=False)  # the other salt: the policy's manual re-run request (rerun_request)
    # The memory limit of the class's serving container (core.control.memory_bound): it bounds the run's search.
    serving_memory_limit_mib: int | None = field(init=False)
    run_key: str = field(init=False)  # of the run the policy's current spec asks for
    current: AdaptationRun | None = field(init=False)  # the run of ``run_key``, if it exists

    def __post_init__(self) -> None:
        epoch = drift_epoch(self.previous)
        rerun = rerun_request(self.policy)
        runtime = self.job_settings.runtime if self.job_settings else None
        limit = serving_memory_limit_mib(
            self.policy.spec.serving.resources, self.serving.resources if self.serving else None
        )
        key = run_key(self.policy.spec, generation_of(self.policy), self.group.fingerprint, epoch, rerun, runtime)
        current = next((r for r in self.runs if label_of(r, LABEL_RUN_KEY) == key), None)
        object.__setattr__(self, "drift_epoch", epoch)  # a frozen dataclass sets its own derived fields this way
        object.__setattr__(self, "rerun", rerun)
        object.__setattr__(self, "serving_memory_limit_mib", limit)
        object.__setattr__(self, "run_key", key)
        object.__setattr__(self, "current", current)

    @property
    def spec(self) -> AdaptationPolicySpec:
        return self.policy.spec

    @property
    def policy_name(self) -> str:
        return name_of(self.policy)

    @property
    def fingerprint(self) -> str:
        return self.group.fingerprint

    @property
    def class_name(self) -> str:
        return self.group.hardware_class.name()

    @property
    def previous(self) -> ClassStatus | None:
        """The class's status as last written; None for a class new to the policy."""
        return self.previous_classes.get(self.group.fingerprint)


RERUN_MAX = 63  # the annotation is the owner's text: bounded, as everything copied into a run


def rerun_request(policy: AdaptationPolicy) -> str | None:
    """The policy's manual re-run request (annotation metainfer.io/rerun): any new value re-adapts every class
    once, with trigger Manual; an empty or absent one asks for nothing. Longer values count by their first
    ``RERUN_MAX`` characters (a timestamp or a counter fits)."""
    value = (annotation_of(policy, ANNOTATION_RERUN) or "").strip()
    return value[:RERUN_MAX] or None


def drift_epoch(status: ClassStatus | None) -> str | None:
    """The run-key salt of a class: its last confirmed latency drift (core.control.drift), in one canonical spelling."""
    when = status.drift.last_readaptation_time if status and status.drift else None
    return when.astimezone(dt.UTC).isoformat() if when else None


def updated(status: ClassStatus, **changes: Any) -> ClassStatus:
    """``status`` with ``changes``, validated like any ClassStatus."""
    return ClassStatus.model_validate({**status.model_dump(), **changes})
