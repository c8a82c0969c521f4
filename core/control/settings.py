"""The operator-wide settings of the pods the operator creates: image, pull policy and secrets, tolerations,
resources, security contexts, service accounts.

The operator reads them once at startup (operator/config.py, from the Helm values); the manifest builders
(core.control.manifests) put them into each adaptation Job and serving Deployment. A policy names its own serving
image and resources; ``merged_resources`` says how its resources and the platform's combine.

Resources: adaptation Jobs default to Guaranteed QoS (requests equal limits), so what a Job measures does not move
with its neighbours' load; serving pods get the platform's defaults for every resource the policy's
spec.serving.resources does not name.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from metainfer.core.api.hardwareclass import AcceleratorVendor
from metainfer.core.api.pod_contract import ENV_FETCH_ALLOW_CIDRS, ENV_SHUTDOWN_DELAY_MAX, ENV_STORE_AMBIENT_CREDENTIALS
from metainfer.core.api.policy import ResourceRequirements
from metainfer.core.api.security import (
    DEFAULT_CONTAINER_SECURITY_CONTEXT,
    DEFAULT_POD_SECURITY_CONTEXT,
    ContainerSecurityContext,
    PodSecurityContext,
)

PullPolicy = Literal["Always", "IfNotPresent", "Never"]
# Guaranteed QoS (requests == limits, whole CPUs): the Job measures latency, and a Burstable pod's CPU time depends
# on its neighbours; with the kubelet's static CPU manager policy whole CPUs are also exclusive.
DEFAULT_JOB_RESOURCES = ResourceRequirements(
    requests={"cpu": "2", "memory": "4Gi"}, limits={"cpu": "2", "memory": "4Gi"}
)
# The CPUs the Job measured with, so the served latency is the measured one; less memory: serving holds one variant.
DEFAULT_SERVING_RESOURCES = ResourceRequirements(
    requests={"cpu": "2", "memory": "2Gi"}, limits={"cpu": "2", "memory": "2Gi"}
)

# A terminating serving pod: how long it answers while the endpoints drop it (kube-proxy takes a second or more),
# how long at most while requests still come (the last endpoint serving: its replacement starts meanwhile), then how
# long its requests in flight get.
DEFAULT_SHUTDOWN_DELAY_S = 5.0
DEFAULT_SHUTDOWN_DELAY_MAX_S = 30.0
# How serving pods get the longest delay: a variable, not a flag (core.api.pod_contract says why).
SHUTDOWN_DELAY_MAX_ENV: Final = ENV_SHUTDOWN_DELAY_MAX
DEFAULT_DRAIN_TIMEOUT_S = 20.0
# Between the drain's end and the kubelet's SIGKILL: the process closes its sockets and thread pools and exits.
TERMINATION_MARGIN_S = 5


IMAGE_MAX = 1024  # a registry path with a tag or a digest; bounded as every value copied into a run


class VendorImage(BaseModel):
    """The image the classes of one accelerator vendor adapt and serve with (``make image RUNTIME=<flavour>``:
    cuda for nvidia, openvino for intel), and the runtime it carries."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(min_length=1, max_length=IMAGE_MAX)
    runtime: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="The image's runtime as `metainfer runtime` prints it there. Unset: the image reference stands "
        "for it, so any other image re-adapts the vendor's classes.",
    )

    def runtime_identity(self) -> str:
        return (self.runtime or f"image {self.image}")[:256]


class WorkloadSettings(BaseModel):
    """What adaptation Jobs and serving pods share; each has its own values (``AgentJobSettings``,
    ``ServingDefaults``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = "ghcr.io/metainfer/metainfer:0.1.0"
    vendor_images: dict[AcceleratorVendor, VendorImage] | None = Field(
        None,
        description="The image of each accelerator vendor's classes (``for_vendor``); ``image`` is the CPU classes'. "
        "None: no mapping (tests, the demo), every class gets ``image``; a mapping without a vendor refuses its "
        "classes rather than run them on an image that cannot use their accelerator.",
    )
    image_pull_policy: PullPolicy = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = Field((), description="Secrets of the pod's namespace to pull images with.")
    tolerations: tuple[dict[str, Any], ...] = Field((), description="Added to the policy's tolerations.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Added to each class's nodeSelector (the class's own keys win)."
    )
    affinity: dict[str, Any] | None = Field(
        None,
        description="A Pod affinity; its required nodeAffinity terms are ANDed with the class's own "
        "(core.control.schedulability.merged_affinity), the rest is copied.",
    )
    priority_class_name: str | None = Field(None, max_length=253)
    runtime_class_name: str | None = Field(None, max_length=253)
    resources: ResourceRequirements | None = Field(None, description="Container requests/limits.")
    pod_security_context: PodSecurityContext = DEFAULT_POD_SECURITY_CONTEXT
    container_security_context: ContainerSecurityContext = DEFAULT_CONTAINER_SECURITY_CONTEXT
    runtime: str | None = Field(
        None,
        max_length=256,
        description="The runtime the image builds and runs variants with (core.engine.runtime.runtime_identity): "
        "part of the run key, so a new one re-adapts; None where unknown (tests, the demo).",
    )
    fetch_allow_cidrs: tuple[str, ...] = Field(
        (),
        description="CIDRs model and data URIs may reach although they are loopback, link-local or otherwise "
        f"non-routable ({ENV_FETCH_ALLOW_CIDRS} in the pods); none by default.",
    )
    fetch_proxy: str | None = Field(
        None,
        max_length=2048,
        description="The proxy model and data fetches go through (HTTPS_PROXY and HTTP_PROXY in the pods).",
    )
    fetch_no_proxy: str | None = Field(
        None, max_length=4096, description="Hosts, domains and CIDRs reached without it (NO_PROXY in the pods)."
    )
    store_workload_identity: bool = Field(
        False,
        description="Object stores without a credentials Secret are read with the pods' ambient identity (the "
        f"ServiceAccount's cloud role) instead of anonymously ({ENV_STORE_AMBIENT_CREDENTIALS}).",
    )

    def for_vendor(self, vendor: AcceleratorVendor) -> Self | None:
        """These settings for the classes of ``vendor``: its image and runtime where the platform maps one; None
        for an accelerator vendor a mapping leaves out (core.control.runs refuses the class, naming it)."""
        if vendor == "cpu" or self.vendor_images is None:
            return self
        entry = self.vendor_images.get(vendor)
        if entry is None:
            return None
        return self.model_copy(update={"image": entry.image, "runtime": entry.runtime_identity()})


class AgentJobSettings(WorkloadSettings):
    """Operator-wide settings of adaptation Jobs (from its config / Helm values)."""

    service_account: str = "metainfer-agent"
    ttl_seconds_after_finished: int = Field(86400, ge=0, description="Long enough for the operator to read it.")
    resources: ResourceRequirements | None = Field(DEFAULT_JOB_RESOURCES, description="Container requests/limits.")


class ServingDefaults(WorkloadSettings):
    """Operator-wide defaults of serving Deployments; the policy's spec.serving overrides the image, and the
    resources it names (``merged_resources``).

    A terminating serving pod answers for ``shutdown_delay_seconds`` while the endpoints drop it, on while requests
    still come for at most ``shutdown_delay_max_seconds``, then drains for at most ``drain_timeout_seconds``
    (``metainfer serve --shutdown-delay``, ``--shutdown-delay-max``, ``--drain-timeout``); its termination grace
    period covers them and ``TERMINATION_MARGIN_S`` (``termination_grace_seconds``).
    """

    service_account: str = "metainfer-serving"
    resources: ResourceRequirements | None = Field(
        DEFAULT_SERVING_RESOURCES, description="Requests/limits of each resource the policy names none of."
    )
    shutdown_delay_seconds: float = Field(
        DEFAULT_SHUTDOWN_DELAY_S,
        ge=0,
        allow_inf_nan=False,
        description="After SIGTERM: still answering while endpoints converge, and until requests stop.",
    )
    shutdown_delay_max_seconds: float = Field(
        DEFAULT_SHUTDOWN_DELAY_MAX_S,
        ge=0,
        allow_inf_nan=False,
        description="After SIGTERM: the drain starts by then, however many requests still come.",
    )
    drain_timeout_seconds: float = Field(
        DEFAULT_DRAIN_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="Then: how long the requests in flight get to finish.",
    )

    def termination_grace_seconds(self) -> int:
        """The pod's terminationGracePeriodSeconds: the longest delay, the drain and a margin for the process to
        exit (55 s with the defaults). No delay at all is never lengthened by its maximum (``Server.linger``)."""
        delay, cap = self.shutdown_delay_seconds, self.shutdown_delay_max_seconds
        longest_delay = max(delay, cap) if delay > 0 else 0.0
        return math.ceil(longest_delay + self.drain_timeout_seconds) + TERMINATION_MARGIN_S


def merged_resources(
    own: ResourceRequirements | None, platform: ResourceRequirements | None
) -> dict[str, dict[str, str]]:
    """Container resources: for each resource the policy names (as a request or a limit), the policy's request and
    limit; for every other resource, the platform's.

    Each resource's pair comes from one side only, so requests <= limits, which each side has checked on its own,
    still holds: a policy's 8Gi memory request never meets the platform's 2Gi memory limit. Quantities are strings,
    as the Kubernetes client requires.
    """
    named = set() if own is None else {*(own.requests or {}), *(own.limits or {})}
    out: dict[str, dict[str, str]] = {}
    for part in ("requests", "limits"):
        theirs = (getattr(platform, part) or {}) if platform else {}
        mine = (getattr(own, part) or {}) if own else {}
        amounts = {name: str(q) for name, q in theirs.items() if name not in named}
        amounts |= {name: str(q) for name, q in mine.items()}
        if amounts:
            out[part] = amounts
    return out
