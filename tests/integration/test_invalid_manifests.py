"""The API server itself rejects bad objects, naming the offending field.

Each case starts from a valid object and breaks one thing: a wrong type, an
out-of-range number, a bad pattern, an unknown enum value, a missing required
field, a violated CEL cross-field rule, or a change to an immutable field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _objects import create, hardware_profile, policy, rejection, run
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from metainfer.core.api import GROUP, VERSION

Case = tuple[str, Callable[[], dict[str, Any]], list[str]]


def _without(body: dict[str, Any], *path: str) -> dict[str, Any]:
    node = body
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return body


CASES: list[Case] = [
    (
        "p95-wrong-type",
        lambda: policy(slo={"latencyP95Ms": "fast"}),
        ["spec.slo.latencyP95Ms", "must be of type number"],
    ),
    ("p95-zero", lambda: policy(slo={"latencyP95Ms": 0}), ["spec.slo.latencyP95Ms", "greater than 0"]),
    (
        "quality-drop-above-1",
        lambda: policy(slo={"latencyP95Ms": 5, "maxQualityDrop": 1.5}),
        ["spec.slo.maxQualityDrop"],
    ),
    ("batch-too-large", lambda: policy(slo={"latencyP95Ms": 5, "batchSize": 100000}), ["spec.slo.batchSize"]),
    ("sha256-short", lambda: policy(model={"uri": "https://m/x.onnx", "sha256": "abc123"}), ["spec.model.sha256"]),
    ("sha256-uppercase", lambda: policy(model={"uri": "https://m/x.onnx", "sha256": "A" * 64}), ["spec.model.sha256"]),
    ("uri-scheme", lambda: policy(model={"uri": "ftp://m/x.onnx", "sha256": "a" * 64}), ["spec.model.uri"]),
    (
        "uri-credentials",  # they cannot work here and would be copied into status
        lambda: policy(model={"uri": "https://user:secret@m/x.onnx", "sha256": "a" * 64}),
        ["spec.model.uri"],
    ),
    ("algorithm-enum", lambda: policy(search={"algorithm": "annealing"}), ["spec.search.algorithm", "annealing"]),
    # Values Kubernetes would reject in the derived Job or Deployment are rejected here, naming the field.
    ("image-whitespace", lambda: policy(serving={"image": "registry/ml server:1"}), ["spec.serving.image"]),
    (
        "node-selector-key",
        lambda: policy(hardware={"nodeSelector": {"pool name": "gpu"}}),
        ["spec.hardware.nodeSelector"],
    ),
    ("node-selector-value", lambda: policy(hardware={"nodeSelector": {"pool": "a b"}}), ["spec.hardware.nodeSelector"]),
    (
        "toleration-exists-with-value",
        lambda: policy(hardware={"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}),
        ["spec.hardware.tolerations[0].value", "must be empty"],
    ),
    (
        "toleration-seconds-without-noexecute",
        lambda: policy(hardware={"tolerations": [{"key": "k", "tolerationSeconds": 5}]}),
        ["spec.hardware.tolerations[0].tolerationSeconds"],
    ),
    (
        "claim-name-syntax",
        lambda: policy(model={"uri": "file:///models/m.onnx", "sha256": "a" * 64, "volume": {"claimName": "Bad_Name"}}),
        ["spec.model.volume.claimName"],
    ),
    (
        "mount-path-reserved",
        lambda: policy(
            model={"uri": "file:///m/m.onnx", "sha256": "a" * 64, "volume": {"claimName": "m", "mountPath": "/tmp"}}
        ),
        ["spec.model.volume.mountPath", "the pod uses them itself"],
    ),
    ("vendor-enum", lambda: policy(hardware={"vendors": ["nvidia", "qualcomm"]}), ["spec.hardware.vendors[1]"]),
    (
        "vendor-duplicate",
        lambda: policy(hardware={"vendors": ["amd", "amd"]}),
        ["spec.hardware.vendors[1]", "Duplicate"],
    ),
    ("quantization-enum", lambda: policy(searchSpace={"quantization": ["int4"]}), ["spec.searchSpace.quantization[0]"]),
    ("trial-budget-zero", lambda: policy(search={"trialBudget": 0}), ["spec.search.trialBudget"]),
    ("replicas-wrong-type", lambda: policy(serving={"replicas": "two"}), ["spec.serving.replicas"]),
    (
        "quantity-wrong-type",
        lambda: policy(serving={"resources": {"requests": {"cpu": [1]}}}),
        ["spec.serving.resources.requests.cpu"],
    ),
    (
        "input-shape",
        lambda: policy(
            model={"uri": "https://m/x.onnx", "sha256": "a" * 64, "inputs": [{"name": "x", "shape": [-2, 3]}]}
        ),
        ["spec.model.inputs[0].shape[0]"],
    ),
    (
        "prometheus-url",
        lambda: policy(readaptation={"prometheusURL": "prometheus:9090"}),
        ["spec.readaptation.prometheusURL"],
    ),
    (
        "volume-both-sources",
        lambda: policy(
            model={"uri": "file:///models/m.onnx", "sha256": "a" * 64, "volume": {"claimName": "m", "hostPath": "/m"}}
        ),
        ["spec.model.volume", "exactly one of claimName or hostPath"],
    ),
    (
        "toleration-operator",
        lambda: policy(hardware={"tolerations": [{"key": "gpu", "operator": "Maybe"}]}),
        ["spec.hardware.tolerations[0].operator"],
    ),
    ("missing-model", lambda: _without(policy(), "spec", "model"), ["spec.model", "Required value"]),
    ("missing-p95", lambda: policy(slo={"batchSize": 2}), ["spec.slo.latencyP95Ms", "Required value"]),
    ("missing-spec", lambda: _without(policy(), "spec"), ["spec", "Required value"]),
    ("unknown-field", lambda: policy(slo={"latencyP95Ms": 5, "latencyP95": 5}), ["spec.slo.latencyP95"]),
    (
        "cel-p99-below-p95",
        lambda: policy(slo={"latencyP95Ms": 20, "latencyP99Ms": 10}),
        ["spec.slo.latencyP99Ms", "latencyP99Ms must be >= latencyP95Ms"],
    ),
    (
        "cel-canary-ge-replicas",
        lambda: policy(serving={"replicas": 2}, rollout={"canaryReplicas": 2}),
        ["spec.rollout.canaryReplicas", "less than serving.replicas"],
    ),
    ("cel-canary-default-replicas", lambda: policy(serving={"replicas": 1}), ["spec.rollout.canaryReplicas"]),
    (
        "cel-zero-weights",
        lambda: policy(objective={"latency": 0, "quality": 0}),
        ["spec.objective", "at least one objective weight"],
    ),
    (
        "cel-deadline-below-budget",
        lambda: policy(search={"timeBudgetSeconds": 600, "activeDeadlineSeconds": 60}),
        ["spec.search.activeDeadlineSeconds"],
    ),
]


def _run_with(**changes: Any) -> dict[str, Any]:
    body = run()
    body["spec"].update(changes)
    return body


CASES += [
    ("run-sha-mismatch", lambda: _run_with(modelSha256="b" * 64), ["spec.modelSha256", "must equal model.sha256"]),
    ("run-reason-enum", lambda: _run_with(reason="Because"), ["spec.reason"]),
    ("run-fingerprint-pattern", lambda: _run_with(classFingerprint="xyz"), ["spec.classFingerprint"]),
    (
        "run-vendor-enum",
        lambda: _run_with(hardwareClass={"vendor": "tpu", "product": "v5e"}),
        ["spec.hardwareClass.vendor"],
    ),
]


@pytest.mark.parametrize(("name", "make", "expected"), CASES, ids=[c[0] for c in CASES])
def test_invalid_object_is_rejected_naming_the_field(
    control_plane: Any, namespace: str, name: str, make: Callable[[], dict[str, Any]], expected: list[str]
) -> None:
    body = make()
    body["metadata"]["name"] = name
    with pytest.raises(ApiException) as info:
        create(control_plane.api_client, body, namespace)
    message = rejection(info.value)
    assert info.value.status in (400, 422), message
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_hardware_profile_fingerprint_pattern(control_plane: Any) -> None:
    body = hardware_profile("bad-fingerprint")
    body["spec"]["fingerprint"] = "NOT-HEX"
    with pytest.raises(ApiException) as info:
        create(control_plane.api_client, body, None)
    assert "spec.fingerprint" in rejection(info.value)


def test_run_spec_is_immutable(control_plane: Any, namespace: str) -> None:
    create(control_plane.api_client, run("immutable"), namespace)
    api = client.CustomObjectsApi(control_plane.api_client)
    with pytest.raises(ApiException) as info:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "adaptationruns", "immutable", {"spec": {"reason": "Manual"}}
        )
    assert "spec is immutable" in rejection(info.value)
    assert "spec" in rejection(info.value)


def test_hardware_profile_spec_is_immutable(control_plane: Any) -> None:
    api = client.CustomObjectsApi(control_plane.api_client)
    create(control_plane.api_client, hardware_profile("immutable-hwp"), None)
    try:
        with pytest.raises(ApiException) as info:
            api.patch_cluster_custom_object(
                GROUP, VERSION, "hardwareprofiles", "immutable-hwp", {"spec": {"hardwareClass": {"driverVersion": "2"}}}
            )
        assert "spec is immutable" in rejection(info.value)
    finally:
        api.delete_cluster_custom_object(GROUP, VERSION, "hardwareprofiles", "immutable-hwp")


def test_status_condition_reason_is_validated(control_plane: Any, namespace: str) -> None:
    create(control_plane.api_client, policy("status-check"), namespace)
    api = client.CustomObjectsApi(control_plane.api_client)
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Maybe",
                    "reason": "not camel case",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }
    with pytest.raises(ApiException) as info:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "adaptationpolicies", "status-check", status
        )
    message = rejection(info.value)
    assert "status.conditions[0].reason" in message
    assert "status.conditions[0].status" in message


def test_kubectl_apply_reports_the_field(control_plane: Any, namespace: str, tmp_path: Any) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        "apiVersion: metainfer.io/v1alpha1\nkind: AdaptationPolicy\nmetadata: {name: bad}\n"
        "spec:\n  model: {uri: 'https://m/x.onnx', sha256: nothex}\n  slo: {latencyP95Ms: -1}\n"
    )
    result = control_plane.kubectl("apply", "-n", namespace, "-f", str(manifest), check=False)
    assert result.returncode != 0
    assert "spec.model.sha256" in result.stderr and "spec.slo.latencyP95Ms" in result.stderr, result.stderr
