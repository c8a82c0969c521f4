"""The operator's writes against a real API server: an updated serving Deployment is exactly what the reconcile
built, with nothing left over from the version it replaces (operator/kube.py ``apply``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.manifests import build_deployment, build_run
from metainfer.operator import kube


@pytest.fixture
def operator_client(control_plane: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[client.ApiClient]:
    monkeypatch.setattr(kube, "_SHARED", control_plane.api_client)
    yield control_plane.api_client


def _succeeded(run: dict[str, Any]) -> dict[str, Any]:
    run["metadata"]["uid"] = "uid-run"
    run["status"] = {
        "phase": "Succeeded",
        "bestRecipe": {"batch": 1},
        "bestRecipeKey": "k" * 16,
        "bestVariantSha256": "c" * 64,
    }
    return run


def test_a_provisional_deployment_updated_to_the_classs_own_variant_keeps_nothing_of_the_check(
    operator_client: client.ApiClient, namespace: str
) -> None:
    """A merge patch kept the provisional pods' init container (and its CPU request) and their label after the class's
    own variant replaced them: on the real node the next Job stayed Pending for want of CPU."""
    policy = {
        "apiVersion": "metainfer.io/v1alpha1", "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": namespace, "uid": "uid-policy", "generation": 1},
        "spec": {"model": {"uri": "configmap://m/model.onnx", "sha256": "a" * 64,
                           "data": {"uri": "configmap://d/data.npz"}},
                 "slo": {"latencyP95Ms": 50}},
    }  # fmt: skip
    (group,) = group_nodes([("n1", {"kubernetes.io/arch": "amd64"})]).values()
    donor = _succeeded(build_run(policy, group, "NewHardwareClass"))
    lent = build_deployment(policy, group, donor, provisional=True)
    del lent["metadata"]["ownerReferences"]  # no such policy here: the garbage collector would delete it
    lent["metadata"]["labels"]["team.example/owner"] = "ml"  # someone else's label: it stays
    asyncio.run(kube.apply(lent))
    apps = client.AppsV1Api(operator_client)
    stored = apps.read_namespaced_deployment(lent["metadata"]["name"], namespace)
    assert stored.spec.template.spec.init_containers and stored.metadata.labels["metainfer.io/provisional"] == "true"
    apps.patch_namespaced_deployment(
        lent["metadata"]["name"], namespace, {"metadata": {"annotations": {"example.com/note": "kept"}}}
    )

    own = build_deployment(policy, group, donor)  # the same run, now served as the class's own
    del own["metadata"]["ownerReferences"]
    own["metadata"]["labels"].pop("team.example/owner", None)
    asyncio.run(kube.apply(own))
    stored = apps.read_namespaced_deployment(own["metadata"]["name"], namespace)
    pod = stored.spec.template.spec
    assert not pod.init_containers, "the init container of the on-node check is gone"
    assert "metainfer.io/provisional" not in stored.metadata.labels
    assert "metainfer.io/provisional" not in stored.spec.template.metadata.labels
    assert {v.name for v in pod.volumes} == {v["name"] for v in own["spec"]["template"]["spec"]["volumes"]}
    assert stored.metadata.labels["team.example/owner"] == "ml", "labels that are not ours are kept"
    assert stored.metadata.annotations["example.com/note"] == "kept", "annotations that are not ours are kept"
