"""Status conditions per the Kubernetes API conventions, and every reason we use.

Condition types and reasons are CamelCase constants kept here, in one module,
so the operator, the agent, printer columns and tests agree on the spelling.
``set_condition`` keeps ``lastTransitionTime`` when the status did not change,
which is what makes conditions useful for "since when" questions.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from metainfer.core.api._base import ApiModel

ConditionStatus = Literal["True", "False", "Unknown"]


class ConditionType:
    """Condition types. ``Ready`` summarises; the others explain."""

    READY = "Ready"  # policy: every selected class serves its best variant; profile: fresh
    PROGRESSING = "Progressing"  # work is under way (a run, a rollout)
    DEGRADED = "Degraded"  # some class failed or is served by an older variant
    SUCCEEDED = "Succeeded"  # run: True when finished with a result, False when failed
    METRICS_AVAILABLE = "MetricsAvailable"  # policy: Prometheus answered the drift query


class Reason:
    """Reasons (CamelCase, ``^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$``)."""

    # generic lifecycle
    RECONCILING = "Reconciling"
    INVALID_SPEC = "InvalidSpec"
    # policy
    ALL_CLASSES_READY = "AllClassesReady"
    CLASSES_PENDING = "ClassesPending"
    NO_MATCHING_NODES = "NoMatchingNodes"
    ADAPTING = "Adapting"
    CLASS_FAILED = "ClassFailed"
    # run triggers (AdaptationRun.spec.reason) -- also used as condition reasons
    NEW_HARDWARE_CLASS = "NewHardwareClass"
    DRIVER_CHANGE = "DriverChange"
    MODEL_CHANGE = "ModelChange"
    BATCH_CHANGE = "BatchChange"
    SPEC_CHANGE = "SpecChange"
    LATENCY_DRIFT = "LatencyDrift"
    MANUAL = "Manual"
    RETRY = "Retry"
    # run progress and outcome
    PENDING = "Pending"
    JOB_CREATED = "JobCreated"
    PROFILING = "Profiling"
    SEARCHING = "Searching"
    VALIDATING = "Validating"
    SUCCEEDED = "Succeeded"
    MODEL_FETCH_FAILED = "ModelFetchFailed"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    INVALID_MODEL = "InvalidModel"
    UNSUPPORTED_OPERATORS = "UnsupportedOperators"
    NO_FEASIBLE_CANDIDATE = "NoFeasibleCandidate"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    JOB_FAILED = "JobFailed"
    # rollout
    CANARY_PROGRESSING = "CanaryProgressing"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    ROLLOUT_TIMEOUT = "RolloutTimeout"
    # metrics and drift
    METRICS_OK = "MetricsOK"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    PROMETHEUS_ERROR = "PrometheusError"
    NO_DATA = "NoData"
    # hardware profile
    PROFILE_MEASURED = "ProfileMeasured"
    PROFILE_STALE = "ProfileStale"


RUN_TRIGGERS = (
    Reason.NEW_HARDWARE_CLASS,
    Reason.DRIVER_CHANGE,
    Reason.MODEL_CHANGE,
    Reason.BATCH_CHANGE,
    Reason.SPEC_CHANGE,
    Reason.LATENCY_DRIFT,
    Reason.MANUAL,
    Reason.RETRY,
)

REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)


class Condition(ApiModel):
    """One aspect of the object's current state (metav1.Condition)."""

    type: str = Field(max_length=316, pattern=TYPE_PATTERN, description="Condition type in CamelCase, e.g. Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        None, ge=0, description="The .metadata.generation this condition was set from."
    )
    last_transition_time: dt.datetime = Field(description="When status last changed.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=REASON_PATTERN,
        description="CamelCase, machine-readable reason for the last transition.",
    )
    message: str = Field("", max_length=32768, description="Human-readable details.")


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: dt.datetime | None = None,
) -> list[Condition]:
    """A new list with ``type_`` set; ``lastTransitionTime`` moves only when ``status`` changes."""
    now = now or dt.datetime.now(dt.UTC).replace(microsecond=0)
    previous = get_condition(conditions, type_)
    changed = previous is None or previous.status != status
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=observed_generation,
        last_transition_time=now if changed or previous is None else previous.last_transition_time,
    )
    return [updated if c.type == type_ else c for c in conditions] if previous else [*conditions, updated]
