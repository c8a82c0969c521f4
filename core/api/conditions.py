"""Status conditions per the Kubernetes API conventions.

Their types and reasons are the enums of core.api.vocabulary (re-exported here).
``set_condition`` keeps ``lastTransitionTime`` when the status did not change,
which is what makes conditions useful for "since when" questions.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from metainfer.core.api._base import ApiModel, StatusText32768
from metainfer.core.api.vocabulary import ConditionType, Reason

ConditionStatus = Literal["True", "False", "Unknown"]


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
    message: StatusText32768 = Field("", max_length=32768, description="Human-readable details.")


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


__all__ = ["Condition", "ConditionStatus", "ConditionType", "Reason", "get_condition", "set_condition"]
