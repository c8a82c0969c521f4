"""Every word the API's status speaks, defined once.

Condition types, reasons, run triggers, run phases and stages, class states and
rollout phases are string enums here, and nowhere else: the CRD schemas, the
operator, the agent, printer columns and tests read them from this module, so a
spelling can only change in one place. They are ``StrEnum``s: a member *is* its
string, so it compares, formats and serialises as the wire value, and the
generated CRD schema is a plain ``enum`` of strings. Enums used as field types
are explained in comments, not docstrings: pydantic copies a docstring into the
CRD schema as the field's description.

Reasons follow the Kubernetes API conventions (CamelCase, matching
``REASON_PATTERN``); the engine's failure reasons come from
``core.engine.errors.FailureReason`` and are re-exported here by value, because
the engine sits below the API and cannot import it.
"""

from __future__ import annotations

from enum import StrEnum

from metainfer.core.engine.errors import FailureReason
from metainfer.core.engine.trial import TrialStatus as TrialState


class ConditionType(StrEnum):
    """Condition types. ``Ready`` summarises; the others explain."""

    READY = "Ready"  # policy: every selected class serves its best variant; profile: fresh
    PROGRESSING = "Progressing"  # work is under way (a run, a rollout)
    DEGRADED = "Degraded"  # some class failed or is served by an older variant
    SUCCEEDED = "Succeeded"  # run: True when finished with a result, False when failed
    METRICS_AVAILABLE = "MetricsAvailable"  # policy: Prometheus answered the drift query
    SATURATED = "Saturated"  # policy: requests wait for workers (scale serving); compute itself is fine


# Why an AdaptationRun exists (its `spec.reason`); each is also a condition reason.
class RunTrigger(StrEnum):
    NEW_HARDWARE_CLASS = "NewHardwareClass"
    DRIVER_CHANGE = "DriverChange"
    MODEL_CHANGE = "ModelChange"
    BATCH_CHANGE = "BatchChange"
    SPEC_CHANGE = "SpecChange"
    LATENCY_DRIFT = "LatencyDrift"
    MANUAL = "Manual"
    RETRY = "Retry"
    RUNTIME_CHANGE = "RuntimeChange"  # the platform's image now has another ONNX Runtime (a chart upgrade)


# `AdaptationRun.status.phase`.
class RunPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


IN_FLIGHT: frozenset[RunPhase] = frozenset({RunPhase.PENDING, RunPhase.RUNNING})


class RunStage(StrEnum):
    """``AdaptationRun.status.progress.stage``: what the agent is doing now."""

    FETCHING = "Fetching"
    PROFILING = "Profiling"
    BASELINE = "Baseline"
    SEARCHING = "Searching"
    SENSITIVITY = "Sensitivity"
    VALIDATING = "Validating"
    FINAL_COMPARISON = "FinalComparison"
    DONE = "Done"
    FAILED = "Failed"


# `AdaptationPolicy.status.classes[].state`.
class ClassState(StrEnum):
    PENDING = "Pending"
    ADAPTING = "Adapting"
    PROVISIONAL = "Provisional"  # serving the most similar class's variant while its own run adapts
    ROLLING_OUT = "RollingOut"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"


# `AdaptationPolicy.status.classes[].rollout.phase`.
class RolloutPhase(StrEnum):
    STABLE = "Stable"
    CANARY = "Canary"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"


class Reason(StrEnum):
    """Condition and Event reasons (CamelCase, ``^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$``)."""

    # generic lifecycle
    RECONCILING = "Reconciling"
    INVALID_SPEC = "InvalidSpec"
    FORBIDDEN_BY_PLATFORM = "ForbiddenByPlatform"
    CHILD_REJECTED = "ChildRejected"
    # policy
    ALL_CLASSES_READY = "AllClassesReady"
    CLASSES_PENDING = "ClassesPending"
    NO_MATCHING_NODES = "NoMatchingNodes"
    ADAPTING = "Adapting"
    CLASS_FAILED = "ClassFailed"
    CLASS_REMOVED = "ClassRemoved"
    NODE_UNCLASSIFIABLE = "NodeUnclassifiable"
    CONCURRENCY_LIMIT = "ConcurrencyLimit"
    ROLLING_OUT = "RollingOut"
    SUSPENDED = "Suspended"  # spec.suspend: no new runs or rollouts; serving untouched
    PINNED = "Pinned"  # spec.pin: the class serves the pinned variant and starts no run
    PROVISIONAL = "Provisional"  # core.control.provisional: another class's variant serves until the class's own
    # run triggers (AdaptationRun.spec.reason)
    NEW_HARDWARE_CLASS = RunTrigger.NEW_HARDWARE_CLASS.value
    DRIVER_CHANGE = RunTrigger.DRIVER_CHANGE.value
    MODEL_CHANGE = RunTrigger.MODEL_CHANGE.value
    BATCH_CHANGE = RunTrigger.BATCH_CHANGE.value
    SPEC_CHANGE = RunTrigger.SPEC_CHANGE.value
    LATENCY_DRIFT = RunTrigger.LATENCY_DRIFT.value
    MANUAL = RunTrigger.MANUAL.value
    RETRY = RunTrigger.RETRY.value
    RUNTIME_CHANGE = RunTrigger.RUNTIME_CHANGE.value
    # run progress and outcome
    PENDING = "Pending"
    JOB_CREATED = "JobCreated"
    FETCHING = RunStage.FETCHING.value
    PROFILING = RunStage.PROFILING.value
    SEARCHING = RunStage.SEARCHING.value
    VALIDATING = RunStage.VALIDATING.value
    SUCCEEDED = "Succeeded"
    MODEL_FETCH_FAILED = "ModelFetchFailed"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    INVALID_INPUT = FailureReason.INVALID_INPUT.value
    INVALID_MODEL = FailureReason.INVALID_MODEL.value
    INVALID_DATA = FailureReason.INVALID_DATA.value
    UNSUPPORTED_OPERATORS = FailureReason.UNSUPPORTED_OPERATORS.value
    NO_FEASIBLE_CANDIDATE = FailureReason.NO_FEASIBLE_CANDIDATE.value
    PROVIDER_UNAVAILABLE = FailureReason.PROVIDER_UNAVAILABLE.value
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    JOB_FAILED = "JobFailed"
    OOM_KILLED = "OOMKilled"  # the agent's container was killed at the Job's memory limit (core.control.pod_endings)
    AGENT_SERVICE_ACCOUNT_MISSING = "AgentServiceAccountMissing"
    JOB_WAITING = "JobWaiting"  # a run's Job has no pod at work, and its pods or events say why (job_waits)
    # A serving Deployment's new pods do not become Ready, and their status says why (rollout_waits)
    ROLLOUT_WAITING = "RolloutWaiting"
    NO_IMAGE_FOR_HARDWARE = "NoImageForHardware"  # an accelerator vendor the platform maps no image to
    # rollout
    CANARY_PROGRESSING = "CanaryProgressing"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    CANARY_LATENCY = "CanaryLatency"
    CANARY_ERROR_RATE = "CanaryErrorRate"
    ROLLOUT_TIMEOUT = "RolloutTimeout"
    # metrics and drift
    METRICS_OK = "MetricsOK"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    PROMETHEUS_ERROR = "PrometheusError"
    PROMETHEUS_NOT_ALLOWED = "PrometheusNotAllowed"
    NO_DATA = "NoData"
    WITHIN_TOLERANCE = "WithinTolerance"
    LATENCY_BREACH = "LatencyBreach"
    SATURATED = "Saturated"
    NOT_SATURATED = "NotSaturated"
    COOLDOWN = "Cooldown"
    # hardware profile
    PROFILE_MEASURED = "ProfileMeasured"
    PROFILE_STALE = "ProfileStale"


__all__ = [
    "IN_FLIGHT",
    "ClassState",
    "ConditionType",
    "Reason",
    "RolloutPhase",
    "RunPhase",
    "RunStage",
    "RunTrigger",
    "TrialState",
]
