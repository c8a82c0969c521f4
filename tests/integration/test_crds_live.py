"""The generated CRDs on a real API server: established, defaulted like the types, usable with kubectl."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from _objects import CPU_CLASS, create, policy, run
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from metainfer.core.api import GROUP, RESOURCES, VERSION, AdaptationPolicySpec, set_condition

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def test_every_crd_is_established_with_its_names(control_plane: Any) -> None:
    api = client.ApiextensionsV1Api(control_plane.api_client)
    for resource in RESOURCES:
        crd = api.read_custom_resource_definition(resource.crd_name)
        conditions = {c.type: c.status for c in crd.status.conditions}
        assert conditions.get("Established") == "True", conditions
        assert conditions.get("NamesAccepted") == "True", conditions
        assert crd.spec.scope == resource.scope
        assert "metainfer" in crd.spec.names.categories
        assert crd.spec.versions[0].subresources.status is not None


def test_every_example_applies(control_plane: Any) -> None:
    """As they are: the examples name their namespace (team-a, a workload namespace of the chart's e2e install)."""
    control_plane.kubectl("create", "namespace", "team-a", check=False)
    result = control_plane.kubectl("apply", "-f", str(EXAMPLES))
    try:
        for path in sorted(EXAMPLES.glob("*.yaml")):
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            assert name in result.stdout, f"{path.name} not applied:\n{result.stdout}"
        listed = control_plane.kubectl("get", "metainfer", "-n", "team-a", "-o", "name").stdout
        assert "adaptationpolicy.metainfer.io/digits-from-bucket" in listed
    finally:
        control_plane.kubectl("delete", "-f", str(EXAMPLES), "--ignore-not-found")


@pytest.mark.parametrize("example", ["digits-policy.yaml", "bert-mini-policy.yaml", "digits-cpu-policy.yaml"])
def test_server_defaults_equal_the_pydantic_defaults(control_plane: Any, namespace: str, example: str) -> None:
    doc = yaml.safe_load((EXAMPLES / example).read_text())
    doc["metadata"].pop("namespace", None)  # into this test's namespace
    create(control_plane.api_client, doc, namespace)
    stored = client.CustomObjectsApi(control_plane.api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies", doc["metadata"]["name"]
    )
    expected = AdaptationPolicySpec.model_validate(doc["spec"]).to_api()
    assert stored["spec"] == expected


def test_kubectl_get_shows_the_printer_columns(control_plane: Any, namespace: str) -> None:
    create(control_plane.api_client, policy("columns", slo={"latencyP95Ms": 7.5, "batchSize": 4}), namespace)
    conditions = set_condition([], "Ready", "True", "AllClassesReady", "2/2 classes ready", observed_generation=1)
    status = {
        "observedGeneration": 1,
        "conditions": [c.to_api() for c in conditions],
        "classCount": 2,
        "readyClasses": 2,
        "classesSummary": "2/2",
        "worstClassP95Ms": 3.25,
    }
    client.CustomObjectsApi(control_plane.api_client).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "adaptationpolicies", "columns", {"status": status}
    )
    out = control_plane.kubectl("get", "adaptationpolicies", "-n", namespace).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "SLO", "P95", "BATCH", "CLASSES", "WORST", "CLASS", "P95", "READY", "AGE"], header
    assert row.split()[:7] == ["columns", "7.5", "4", "2/2", "3.25", "True", row.split()[6]]
    wide = control_plane.kubectl("get", "ap", "-n", namespace, "-o", "wide").stdout
    assert "AllClassesReady" in wide
    # A run names its class in words; the fingerprint is kept for -o wide.
    create(control_plane.api_client, run("columns-run"), namespace)
    runs_out = control_plane.kubectl("get", "adaptationruns", "-n", namespace).stdout
    assert CPU_CLASS.description() in runs_out and CPU_CLASS.fingerprint() not in runs_out, runs_out
    runs_wide = control_plane.kubectl("get", "ar", "-n", namespace, "-o", "wide").stdout
    assert CPU_CLASS.fingerprint() in runs_wide, runs_wide


def test_kubectl_explain_describes_the_slo(control_plane: Any) -> None:
    out = control_plane.kubectl("explain", "adaptationpolicy.spec.slo").stdout
    for text in (
        "latencyP95Ms",
        "latencyP99Ms",
        "maxQualityDrop",
        "maxMemoryMiB",
        "batchSize",
        "p95 latency per batch",
    ):
        assert text in out, out


def test_status_subresource_separates_spec_and_status(control_plane: Any, namespace: str) -> None:
    api = client.CustomObjectsApi(control_plane.api_client)
    create(control_plane.api_client, policy("split"), namespace)
    # A status write through the main resource is ignored, and a spec write through /status too.
    api.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies", "split", {"status": {"classCount": 9}}
    )
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "adaptationpolicies", "split", {"spec": {"slo": {"latencyP95Ms": 99}}}
    )
    obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, "adaptationpolicies", "split")
    assert obj.get("status", {}).get("classCount") in (None, 0)
    assert obj["spec"]["slo"]["latencyP95Ms"] == 10
    assert obj["metadata"]["generation"] == 1


def test_deleting_a_policy_deletes_its_runs(control_plane: Any, namespace: str) -> None:
    """Owner references cascade: the garbage collector of kube-controller-manager runs here."""
    if control_plane.plane.pids.get("kube-controller-manager") is None:
        pytest.fail("kube-controller-manager is not running: owner-reference cascades cannot be exercised")
    api = client.CustomObjectsApi(control_plane.api_client)
    owner = create(control_plane.api_client, policy("owner"), namespace)
    child = run("owned", policy_name="owner")
    child["metadata"]["ownerReferences"] = [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AdaptationPolicy",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    create(control_plane.api_client, child, namespace)
    api.delete_namespaced_custom_object(GROUP, VERSION, namespace, "adaptationpolicies", "owner")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            api.get_namespaced_custom_object(GROUP, VERSION, namespace, "adaptationruns", "owned")
        except ApiException as exc:
            assert exc.status == 404
            return
        time.sleep(0.2)
    pytest.fail("the owned AdaptationRun survived its policy for 60s")


def test_deleting_a_namespace_completes(control_plane: Any) -> None:
    """The namespace controller runs: a deleted namespace with custom objects in it goes away."""
    core = client.CoreV1Api(control_plane.api_client)
    core.create_namespace({"metadata": {"name": "t-ns-deletion"}})
    create(control_plane.api_client, policy("inside"), "t-ns-deletion")
    core.delete_namespace("t-ns-deletion")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespace("t-ns-deletion")
        except ApiException as exc:
            assert exc.status == 404
            return
        time.sleep(0.2)
    pytest.fail("namespace t-ns-deletion still Terminating after 60s")
