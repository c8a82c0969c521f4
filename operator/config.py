"""Operator-wide configuration, read once at startup from the environment.

Everything a platform team sets through Helm values arrives here as an
environment variable (``METAINFER_*``), so the operator has one place where
configuration is parsed and one error message per bad value.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from metainfer.core.control.endpoints import PrometheusEndpoint, prometheus_endpoint


class OperatorConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="METAINFER_", extra="ignore")

    agent_image: str = Field("metainfer:latest", description="Image of the adaptation Job and the serving pods.")
    agent_service_account: str = Field("metainfer-agent", description="Least-privilege account of agent Jobs.")
    label_mapping_file: Path | None = Field(None, description="YAML/JSON LabelMapping for custom node labels.")
    max_concurrent_runs: int = Field(8, ge=1, description="Adaptation runs in flight across the cluster.")
    max_concurrent_runs_per_namespace: int | None = Field(
        None, ge=1, description="Runs one namespace may have in flight; default half the cluster's (at least 1)."
    )

    def prometheus_endpoint(self, policy_url: str | None) -> PrometheusEndpoint:
        """Where a policy's drift and canary checks query: its own URL only if the platform allows it."""
        return prometheus_endpoint(policy_url, self.prometheus_url, self.prometheus_allowed_urls)

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
    allowed_host_paths: list[str] = Field(
        default_factory=list,
        description="Node directories a policy may mount as hostPath (JSON list); none by default.",
    )
    allowed_images: list[str] = Field(
        default_factory=list,
        description="Image prefixes a policy may name in spec.serving.image (JSON list); only agent_image by default.",
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
