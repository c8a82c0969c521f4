"""Operator-wide configuration, read once at startup from the environment.

Everything a platform team sets through Helm values arrives here as an
environment variable (``METAINFER_*``), so the operator has one place where
configuration is parsed and one error message per bad value.

A bad value fails the operator's startup with a ``ConfigError`` naming the
variable (``METAINFER_JOB_RESOURCES: requests.cpu must not exceed
limits.cpu``), instead of every Job or Deployment being refused later. The
settings of the pods the operator creates (security contexts, pull secrets,
resources) are JSON, in the Kubernetes spelling of the Helm values they come
from.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from metainfer.core.api.hardwareclass import AcceleratorVendor
from metainfer.core.api.k8s_syntax import DNS1123_SUBDOMAIN
from metainfer.core.api.policy import ResourceRequirements, Toleration
from metainfer.core.api.security import (
    DEFAULT_CONTAINER_SECURITY_CONTEXT,
    DEFAULT_POD_SECURITY_CONTEXT,
    ContainerSecurityContext,
    PodSecurityContext,
)
from metainfer.core.control.endpoints import PrometheusEndpoint, prometheus_endpoint
from metainfer.core.control.platform import PlatformLimits
from metainfer.core.control.schedulability import NODE_OPERATORS, PlatformPlacement, required_terms
from metainfer.core.control.settings import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_JOB_RESOURCES,
    DEFAULT_SERVING_RESOURCES,
    DEFAULT_SHUTDOWN_DELAY_MAX_S,
    DEFAULT_SHUTDOWN_DELAY_S,
    AgentJobSettings,
    ServingDefaults,
    VendorImage,
)

# JSON-valued settings are decoded by OperatorConfig itself, so that bad JSON is reported like any other bad value.
JSON_SETTINGS = (
    "agent_images",
    "workload_image_pull_secrets",
    "workload_fetch_allow_cidrs",
    "workload_tolerations",
    "workload_node_selector",
    "workload_affinity",
    "workload_pod_security_context",
    "workload_container_security_context",
    "job_resources",
    "serving_resources",
)


class ConfigError(ValueError):
    """A METAINFER_* value the operator cannot use; the message names each variable and what is wrong with it."""


class ImagePullSecret(BaseModel):
    """One entry of a pod's imagePullSecrets: a Secret in the pod's own namespace."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)


class OperatorConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="METAINFER_", extra="ignore")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(_described(exc)) from exc

    agent_image: str = Field("metainfer:latest", description="Image of the adaptation Job and the serving pods.")
    agent_images: Annotated[dict[AcceleratorVendor, VendorImage], NoDecode] = Field(
        default_factory=dict,
        description='The image of each accelerator vendor\'s classes (JSON, {"nvidia": {"image": ..., "runtime": '
        "...}}); agent_image is the CPU classes'. A vendor left out has its classes refused (NoImageForHardware), "
        "never adapted or served by an image that cannot use their accelerator.",
    )
    agent_service_account: str = Field("metainfer-agent", description="Least-privilege account of agent Jobs.")
    agent_runtime: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="The ONNX Runtime build of agent_image, as core.engine.runtime.runtime_identity() prints it "
        "there. Unset: the operator's own, right where agent_image is the operator's image (the chart's default).",
    )
    label_mapping_file: Path | None = Field(None, description="YAML/JSON LabelMapping for custom node labels.")
    max_concurrent_runs: int = Field(8, ge=1, description="Adaptation runs in flight across the cluster.")
    max_concurrent_runs_per_namespace: int | None = Field(
        None, ge=1, description="Runs one namespace may have in flight; default half the cluster's (at least 1)."
    )

    def prometheus_endpoint(self, policy_url: str | None) -> PrometheusEndpoint:
        """Where a policy's drift and canary checks query: its own URL only if the platform allows it."""
        auth = str(self.prometheus_auth_dir) if self.prometheus_auth_dir else None
        return prometheus_endpoint(policy_url, self.prometheus_url, self.prometheus_allowed_urls, auth)

    def namespace_run_limit(self) -> int:
        """No tenant can hold every cluster-wide slot: by default a namespace gets at most half of them."""
        if self.max_concurrent_runs_per_namespace is not None:
            return self.max_concurrent_runs_per_namespace
        return max(1, self.max_concurrent_runs // 2)

    resync_seconds: float = Field(60.0, gt=0, description="Reconcile every policy at least this often.")
    prometheus_url: str | None = Field(None, description="The platform's Prometheus for drift and canary checks.")
    prometheus_allowed_urls: list[str] = Field(
        default_factory=list,
        description="Prometheus URLs a policy may name in spec.readaptation.prometheusURL (a JSON list; none by "
        "default).",
    )
    prometheus_auth_dir: Path | None = Field(
        None,
        description="A mounted Secret for the platform's Prometheus: token, or username and password, and ca.crt "
        "(core.control.prometheus_auth); read on every query, sent only to prometheus_url.",
    )
    allowed_host_paths: list[str] = Field(
        default_factory=list,
        description="Node directories a policy may mount as hostPath (JSON list); none by default.",
    )
    allowed_images: list[str] = Field(
        default_factory=list,
        description="Image prefixes a policy may name in spec.serving.image (JSON list); only agent_image by default.",
    )
    allowed_priority_classes: list[str] = Field(
        default_factory=list,
        description="PriorityClasses a policy may name in spec.scheduling (JSON list); none by default.",
    )
    allowed_runtime_classes: list[str] = Field(
        default_factory=list,
        description="RuntimeClasses a policy may name in spec.scheduling (JSON list); none by default.",
    )
    allowed_toleration_keys: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Taint keys a policy's spec.hardware.tolerations may tolerate (JSON list; '*': any, the default).",
    )
    metrics_port: int = Field(8000, ge=0, le=65535, description="Port of the operator's own /metrics (0: off).")
    class_settle_seconds: float = Field(
        30.0,
        ge=0,
        description="A hardware class new to a policy gets a run once its nodes' labels have held still this long.",
    )
    api_retry_seconds: float = Field(
        600.0,
        ge=0,
        description="How long the operator's watches and writes retry an unreachable API server before the "
        "process exits to be restarted.",
    )
    peering_name: str = Field("metainfer", description="kopf peering object shared by the operator replicas.")
    wait_for_available: bool = Field(
        True, description="Roll-out waits for available replicas; off where no kubelet runs (tests, the demo)."
    )
    serving_service_account: str = Field(
        "metainfer-serving",
        min_length=1,
        max_length=253,
        pattern=DNS1123_SUBDOMAIN,
        description="ServiceAccount of the serving pods (no RBAC, no token mounted).",
    )
    workload_image_pull_secrets: Annotated[list[ImagePullSecret], NoDecode] = Field(
        default_factory=list,
        description='imagePullSecrets of adaptation Jobs and serving pods (JSON, [{"name": ...}]); each Secret must '
        "exist in every workload namespace.",
    )
    workload_tolerations: Annotated[list[Toleration], NoDecode] = Field(
        default_factory=list,
        max_length=32,
        description="Tolerations of adaptation Jobs and serving pods, added to each policy's (JSON, as in a Pod "
        'spec, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]); nodes tainted '
        "beyond both form no class.",
    )
    workload_node_selector: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="nodeSelector labels every Job and serving pod gets (JSON object); nodes without them form no "
        "class.",
    )
    workload_affinity: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict,
        description="A Pod affinity for Jobs and serving pods (JSON, Kubernetes' spelling); its required node "
        "terms are ANDed with each class's own, and nodes they rule out form no class.",
    )
    workload_priority_class_name: str | None = Field(
        None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="priorityClassName of both."
    )
    workload_runtime_class_name: str | None = Field(
        None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN, description="runtimeClassName of both."
    )
    workload_pod_security_context: Annotated[PodSecurityContext, NoDecode] = Field(
        DEFAULT_POD_SECURITY_CONTEXT, description="Pod securityContext of adaptation Jobs and serving pods (JSON)."
    )
    workload_container_security_context: Annotated[ContainerSecurityContext, NoDecode] = Field(
        DEFAULT_CONTAINER_SECURITY_CONTEXT,
        description="Container securityContext of adaptation Jobs and serving pods (JSON).",
    )
    workload_fetch_allow_cidrs: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="CIDRs model and data URIs may reach although non-routable (JSON list, e.g. "
        '["10.96.0.0/12"]); loopback, link-local and metadata addresses are refused otherwise.',
    )
    workload_fetch_proxy: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="The proxy model and data fetches of Jobs and serving pods go through (HTTPS_PROXY there).",
    )
    workload_fetch_no_proxy: str | None = Field(
        None, max_length=4096, pattern=r"^[^\s]*$", description="NO_PROXY of Jobs and serving pods."
    )
    workload_store_workload_identity: bool = Field(
        False,
        description="Read object stores without a credentials Secret with the pods' ServiceAccount identity "
        "(cloud workload identity) instead of anonymously.",
    )
    job_resources: Annotated[ResourceRequirements, NoDecode] = Field(
        DEFAULT_JOB_RESOURCES,
        description="Requests/limits of the adaptation Job's container (JSON); Guaranteed QoS by default.",
    )
    serving_resources: Annotated[ResourceRequirements, NoDecode] = Field(
        DEFAULT_SERVING_RESOURCES,
        description="Requests/limits of serving containers for each resource the policy's spec.serving.resources "
        "does not name (JSON).",
    )
    serving_shutdown_delay_seconds: float = Field(
        DEFAULT_SHUTDOWN_DELAY_S,
        ge=0,
        allow_inf_nan=False,
        description="A terminating serving pod still answers new requests this long, while the endpoints drop it, "
        "and on while requests still come until none has for this long (metainfer serve --shutdown-delay).",
    )
    serving_shutdown_delay_max_seconds: float = Field(
        DEFAULT_SHUTDOWN_DELAY_MAX_S,
        ge=0,
        allow_inf_nan=False,
        description="A terminating serving pod that still gets requests drains at the latest this long after its "
        "signal (metainfer serve --shutdown-delay-max).",
    )
    serving_drain_timeout_seconds: float = Field(
        DEFAULT_DRAIN_TIMEOUT_S,
        gt=0,
        allow_inf_nan=False,
        description="Then its requests in flight get this long to finish (metainfer serve --drain-timeout); the "
        "pod's termination grace period covers both.",
    )

    @field_validator(*JSON_SETTINGS, mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value  # given as an object (tests, code), not from the environment
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc})") from None

    @field_validator("agent_images")
    @classmethod
    def _vendor_images(cls, value: dict[str, VendorImage]) -> dict[str, VendorImage]:
        if "cpu" in value:
            raise ValueError("cpu classes run agent_image (METAINFER_AGENT_IMAGE): name accelerator vendors only")
        return value

    @field_validator("prometheus_auth_dir")
    @classmethod
    def _auth_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"{str(value)[:200]!r} is not a directory (the mounted Secret with the credentials)")
        return value

    @field_validator("workload_fetch_allow_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item[:80]!r} is not a CIDR (e.g. 10.96.0.0/12)") from None
        return value

    @field_validator("workload_affinity")
    @classmethod
    def _affinity(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = set(value) - {"nodeAffinity", "podAffinity", "podAntiAffinity"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)[:3]}: an affinity has nodeAffinity, podAffinity, "
                             "podAntiAffinity")  # fmt: skip
        for index, term in enumerate(required_terms(value)):
            if not isinstance(term, dict) or term.get("matchFields"):
                raise ValueError(f"nodeSelectorTerms[{index}]: only matchExpressions are supported (no matchFields)")
            for expression in term.get("matchExpressions") or []:
                if not isinstance(expression, dict) or expression.get("operator") not in NODE_OPERATORS:
                    raise ValueError(
                        f"nodeSelectorTerms[{index}]: each matchExpression needs a key and an operator of "
                        f"{sorted(NODE_OPERATORS)}"
                    )
                if not isinstance(expression.get("key"), str):
                    raise ValueError(f"nodeSelectorTerms[{index}]: each matchExpression needs a key")
        return value

    def platform_limits(self) -> PlatformLimits:
        """What policies may ask for (core.control.platform)."""
        return PlatformLimits(
            allowed_host_paths=self.allowed_host_paths,
            allowed_images=self.allowed_images,
            default_image=self.agent_image,
            allowed_priority_classes=self.allowed_priority_classes,
            allowed_runtime_classes=self.allowed_runtime_classes,
            allowed_toleration_keys=self.allowed_toleration_keys,
        )

    def placement(self) -> PlatformPlacement:
        """Where the platform lets Jobs and serving pods land: its tolerations, nodeSelector, node affinity."""
        return PlatformPlacement(self.platform_tolerations(), self.workload_node_selector, self.workload_affinity)

    def platform_tolerations(self) -> tuple[dict[str, Any], ...]:
        """workloads.tolerations as a Pod spec spells them: every Job and serving pod gets them."""
        return tuple(t.to_api() for t in self.workload_tolerations)

    def runtime(self) -> str:
        """What agent_image runs variants with (part of every run key)."""
        from metainfer.core.engine.runtime_identity import runtime_identity

        return self.agent_runtime or runtime_identity()

    def _placement_settings(self) -> dict[str, Any]:
        return {
            "node_selector": self.workload_node_selector,
            "affinity": self.workload_affinity or None,
            "priority_class_name": self.workload_priority_class_name,
            "runtime_class_name": self.workload_runtime_class_name,
        }

    def job_settings(self) -> AgentJobSettings:
        """What every adaptation Job gets from the platform."""
        return AgentJobSettings(
            image=self.agent_image,
            vendor_images=dict(self.agent_images),
            service_account=self.agent_service_account,
            image_pull_secrets=tuple(s.name for s in self.workload_image_pull_secrets),
            tolerations=self.platform_tolerations(),
            **self._placement_settings(),
            runtime=self.runtime(),
            resources=self.job_resources,
            pod_security_context=self.workload_pod_security_context,
            container_security_context=self.workload_container_security_context,
            fetch_allow_cidrs=tuple(self.workload_fetch_allow_cidrs),
            fetch_proxy=self.workload_fetch_proxy,
            fetch_no_proxy=self.workload_fetch_no_proxy,
            store_workload_identity=self.workload_store_workload_identity,
        )

    def serving_defaults(self) -> ServingDefaults:
        """What every serving pod gets from the platform where its policy says nothing."""
        return ServingDefaults(
            image=self.agent_image,
            vendor_images=dict(self.agent_images),
            service_account=self.serving_service_account,
            image_pull_secrets=tuple(s.name for s in self.workload_image_pull_secrets),
            tolerations=self.platform_tolerations(),
            **self._placement_settings(),
            runtime=self.runtime(),
            resources=self.serving_resources,
            pod_security_context=self.workload_pod_security_context,
            container_security_context=self.workload_container_security_context,
            fetch_allow_cidrs=tuple(self.workload_fetch_allow_cidrs),
            fetch_proxy=self.workload_fetch_proxy,
            fetch_no_proxy=self.workload_fetch_no_proxy,
            store_workload_identity=self.workload_store_workload_identity,
            shutdown_delay_seconds=self.serving_shutdown_delay_seconds,
            shutdown_delay_max_seconds=self.serving_shutdown_delay_max_seconds,
            drain_timeout_seconds=self.serving_drain_timeout_seconds,
        )


def _described(exc: ValidationError) -> str:
    """One entry per error, naming the environment variable the platform set (a field name means nothing there)."""
    lines = []
    for error in exc.errors():
        field, *path = error["loc"]
        where = ".".join(str(part) for part in path)
        message = error["msg"].removeprefix("Value error, ")
        lines.append(f"METAINFER_{str(field).upper()}{f' ({where})' if where else ''}: {message}")
    return "invalid operator configuration: " + "; ".join(lines)
