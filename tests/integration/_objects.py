"""Valid objects the integration tests start from, and helpers to send them."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from metainfer.core.api import GROUP, VERSION
from metainfer.core.api.hardwareclass import HardwareClass

SHA = "63704d1c9451d28e93972b0bd7068f74777fa040c17d2f184218ce47980e0ee9"
CPU_CLASS = HardwareClass(vendor="cpu", product="Test-CPU", cpu_features=("AVX2",))
PLURALS = {"AdaptationPolicy": "adaptationpolicies", "AdaptationRun": "adaptationruns"}


def policy(name: str = "p", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdaptationPolicy",
        "metadata": {"name": name},
        "spec": {"model": {"uri": "https://models.test/m.onnx", "sha256": SHA}, "slo": {"latencyP95Ms": 10}},
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


def run(name: str = "r", policy_name: str = "p") -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdaptationRun",
        "metadata": {"name": name},
        "spec": {
            "policyName": policy_name,
            "policyGeneration": 1,
            "classFingerprint": CPU_CLASS.fingerprint(),
            "hardwareClass": CPU_CLASS.model_dump(mode="json", by_alias=True, exclude_none=True),
            "classDescription": CPU_CLASS.description(),
            "modelSha256": SHA,
            "batchSize": 1,
            "reason": "NewHardwareClass",
            "model": {"uri": "https://models.test/m.onnx", "sha256": SHA},
            "slo": {"latencyP95Ms": 10, "batchSize": 1},
        },
    }


def hardware_profile(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HardwareProfile",
        "metadata": {"name": name},
        "spec": {
            "fingerprint": CPU_CLASS.fingerprint(),
            "namespace": "ml-team",
            "hardwareClass": CPU_CLASS.model_dump(mode="json", by_alias=True, exclude_none=True),
        },
    }


def create(api_client: client.ApiClient, body: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    """Create a metainfer object with strict field validation (unknown fields are errors, like kubectl)."""
    api = client.CustomObjectsApi(api_client)
    if body["kind"] == "HardwareProfile":
        return api.create_cluster_custom_object(GROUP, VERSION, "hardwareprofiles", body, field_validation="Strict")
    return api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURALS[body["kind"]], body, field_validation="Strict"
    )


def rejection(exc: ApiException) -> str:
    """The API server's message plus every cause's field, for assertions that name the field."""
    body = json.loads(exc.body)
    causes = body.get("details", {}).get("causes", [])
    return body.get("message", "") + "\n" + "\n".join(f"{c.get('field')}: {c.get('message')}" for c in causes)
