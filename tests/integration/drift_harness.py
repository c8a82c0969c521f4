"""What the drift tests share: the policy fields that turn drift checks on, and readers of what the operator
writes about them (the class's ``drift`` status, the MetricsAvailable condition, LatencyDrift runs)."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from operator_harness import klass, policy, runs


def drift_checks(interval_s: int, window_s: int, breaches: int, tolerance: float) -> dict[str, Any]:
    """``make_policy`` fields for drift re-adaptation without a canary (a re-adapted recipe goes live at once)."""
    return {
        "rollout": {"canaryReplicas": 0},
        "readaptation": {
            "checkIntervalSeconds": interval_s,
            "windowSeconds": window_s,
            "consecutiveBreaches": breaches,
            "driftTolerance": tolerance,
            "cooldownSeconds": 3600,
        },
    }


def drift(api: client.ApiClient, namespace: str, name: str = "digits") -> dict[str, Any]:
    return klass(api, namespace, name).get("drift") or {}


def metrics_condition(api: client.ApiClient, namespace: str, name: str = "digits") -> dict[str, Any]:
    return condition(api, namespace, "MetricsAvailable", name)


def condition(api: client.ApiClient, namespace: str, type_: str, name: str = "digits") -> dict[str, Any]:
    conditions = (policy(api, namespace, name).get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), {})


def drift_runs(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    return [r for r in runs(api, namespace) if r["spec"]["reason"] == "LatencyDrift"]
