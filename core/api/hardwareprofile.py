"""HardwareProfile (cluster-scoped): a hardware class and what it was measured to do.

A profile is measured by an agent, that is by code running with a tenant's
rights, so it is trusted only inside the namespace whose agent measured it:
one object per (class fingerprint, namespace), named ``<fingerprint>.<namespace>``
so a run finds its own with one GET. The chart's admission policy lets an
agent write only profiles of its own namespace; one tenant can no longer make
another tenant's runs fail by publishing a poisoned op-support matrix. The
class, the fingerprint and the namespace are the identity and immutable.
"""

from __future__ import annotations

import datetime as dt

from pydantic import Field

from metainfer.core.api._base import ApiModel, cel, immutable, map_list
from metainfer.core.api.conditions import Condition
from metainfer.core.api.hardwareclass import FINGERPRINT_PATTERN, HardwareClass
from metainfer.core.api.k8s_syntax import DNS1123_LABEL
from metainfer.core.api.names import API_VERSION, PROFILE_KIND, ApiVersion, ProfileKind
from metainfer.core.engine.profile.types import HardwareProfile as MeasuredProfile


class HardwareProfileSpec(ApiModel):
    model_config = cel(immutable("spec"))

    fingerprint: str = Field(pattern=FINGERPRINT_PATTERN, description="HardwareClass.fingerprint() of hardwareClass.")
    hardware_class: HardwareClass
    namespace: str = Field(
        max_length=63,
        pattern=DNS1123_LABEL,
        description="The namespace whose agents measured this profile; only runs in it reuse it.",
    )
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
    # Literal types (core.api.names says why): an object of another API version or kind fails validation.
    api_version: ApiVersion = API_VERSION
    kind: ProfileKind = PROFILE_KIND
    metadata: dict[str, object] = Field(default_factory=dict)
    spec: HardwareProfileSpec
    status: HardwareProfileStatus | None = None


def profile_name(fingerprint: str, namespace: str) -> str:
    """The object name of the profile of class ``fingerprint`` measured for ``namespace`` (a DNS subdomain)."""
    return f"{fingerprint}.{namespace}"
