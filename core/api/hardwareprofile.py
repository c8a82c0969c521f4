"""HardwareProfile (cluster-scoped): a hardware class and what it was measured to do.

Profiles are cached per class fingerprint and shared by every policy, hence
cluster scope. The class is the identity and immutable; the measurement is
written into status by the agent that ran the micro-benchmarks. Name the
object after the fingerprint so any run can find it with one GET.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from metainfer.core.api._base import ApiModel, cel, immutable, map_list
from metainfer.core.api.conditions import Condition
from metainfer.core.api.hardwareclass import FINGERPRINT_PATTERN, HardwareClass
from metainfer.core.engine.profile.types import HardwareProfile as MeasuredProfile


class HardwareProfileSpec(ApiModel):
    model_config = cel(immutable("spec"))

    fingerprint: str = Field(pattern=FINGERPRINT_PATTERN, description="HardwareClass.fingerprint() of hardwareClass.")
    hardware_class: HardwareClass
    max_age_seconds: int = Field(
        604800, ge=60, le=31536000, description="The profile is re-measured when older than this."
    )


class HardwareProfileStatus(ApiModel):
    observed_generation: int | None = Field(None, ge=0)
    conditions: list[Condition] = Field(default_factory=list, max_length=16, json_schema_extra=map_list("type"))
    measured_at: dt.datetime | None = None
    nodes: list[str] = Field(default_factory=list, max_length=256, description="Some nodes of this class (for people).")
    profile: MeasuredProfile | None = Field(
        None, description="core HardwareProfile: dtypes, providers, op support matrix, peak compute, bandwidth."
    )


class HardwareProfileResource(ApiModel):
    api_version: Literal["metainfer.io/v1alpha1"] = "metainfer.io/v1alpha1"
    kind: Literal["HardwareProfile"] = "HardwareProfile"
    metadata: dict[str, object] = Field(default_factory=dict)
    spec: HardwareProfileSpec
    status: HardwareProfileStatus | None = None
