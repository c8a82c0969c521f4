"""The operator's writes against a real API server: an updated serving Deployment is exactly what the reconcile
built, with nothing left over from the version it replaces (operator/api_calls.py ``apply``), and a policy's status is
written only over the version it was planned from (``patch_status``'s ``read_at``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kubernetes import client

from metainfer.core.api.names import GROUP, POLICY_PLURAL, VERSION
from metainfer.core.api.policy import AdaptationPolicyStatus
from metainfer.core.api.vocabulary import Reason
from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.job_waits import why_job_waits
from metainfer.core.control.manifests import build_deployment, build_run
from metainfer.core.control.pod_endings import pod_ending
from metainfer.operator import api_calls
from metainfer.operator.apply import apply_plan, reconcile_inputs, refused_status
from metainfer.operator.config import OperatorConfig
from metainfer.operator.view import ClusterView, Indexes


@pytest.fixture
def operator_client(control_plane: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[client.ApiClient]:
    monkeypatch.setattr(api_calls, "_SHARED", control_plane.api_client)
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
    asyncio.run(api_calls.apply(lent))
    apps = client.AppsV1Api(operator_client)
    stored = apps.read_namespaced_deployment(lent["metadata"]["name"], namespace)
    assert stored.spec.template.spec.init_containers and stored.metadata.labels["metainfer.io/provisional"] == "true"
    apps.patch_namespaced_deployment(
        lent["metadata"]["name"], namespace, {"metadata": {"annotations": {"example.com/note": "kept"}}}
    )

    own = build_deployment(policy, group, donor)  # the same run, now served as the class's own
    del own["metadata"]["ownerReferences"]
    own["metadata"]["labels"].pop("team.example/owner", None)
    asyncio.run(api_calls.apply(own))
    stored = apps.read_namespaced_deployment(own["metadata"]["name"], namespace)
    pod = stored.spec.template.spec
    assert not pod.init_containers, "the init container of the on-node check is gone"
    assert "metainfer.io/provisional" not in stored.metadata.labels
    assert "metainfer.io/provisional" not in stored.spec.template.metadata.labels
    assert {v.name for v in pod.volumes} == {v["name"] for v in own["spec"]["template"]["spec"]["volumes"]}
    assert stored.metadata.labels["team.example/owner"] == "ml", "labels that are not ours are kept"
    assert stored.metadata.annotations["example.com/note"] == "kept", "annotations that are not ours are kept"


def _policy(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": namespace},
        "spec": {"model": {"uri": "configmap://m/model.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 50}},
    }  # fmt: skip


# What the replica that now holds the policy wrote: a class whose canary it promoted. A replica still finishing a
# reconcile planned from before would put the class back in its canary phase, and the canary would run again.
PROMOTED = AdaptationPolicyStatus.model_validate({
    "classes": [{
        "name": "cpu-amd64", "fingerprint": "f" * 16, "state": "Ready", "nodes": 1,
        "current": {"runName": "digits-ffff-1", "recipeKey": "k" * 16},
        "rollout": {"phase": "Stable"},
    }],
}).to_api()  # fmt: skip


def test_a_status_planned_from_an_older_read_is_refused_and_the_newer_one_stays(
    operator_client: client.ApiClient, namespace: str
) -> None:
    """Policy status patches carried no resourceVersion: whichever writer came last won, however old its read."""
    api = client.CustomObjectsApi(operator_client)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, _policy(namespace))
    stale = api.get_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, "digits")
    api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, POLICY_PLURAL, "digits", {"status": PROMOTED})

    # The reconcile's own write, planned from the old read: this cluster has no nodes, so its plan drops the class.
    config = OperatorConfig()
    inputs = reconcile_inputs(stale, ClusterView(), Indexes({}, {}, {}, {}, {}), config)
    assert inputs.plan.status.to_api().get("classes", []) == [], "the stale plan would have dropped the class"
    with pytest.raises(api_calls.StaleRead, match="changed after it was read at resourceVersion"):
        asyncio.run(apply_plan(kopf.Body(stale), inputs, logging.getLogger("test")))
    with pytest.raises(api_calls.StaleRead):
        asyncio.run(refused_status(kopf.Body(stale), stale, Reason.INVALID_SPEC, "refused"))
    stored = api.get_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, "digits")
    assert stored["status"]["classes"][0]["rollout"] == {"phase": "Stable"}, "the newer status stays"
    assert not stored["status"].get("conditions"), "neither stale write got through"

    # Read again, the same plan writes: a conflict costs one more read, not the write.
    fresh = api.get_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, "digits")
    inputs = reconcile_inputs(fresh, ClusterView(), Indexes({}, {}, {}, {}, {}), config)
    written = asyncio.run(apply_plan(kopf.Body(fresh), inputs, logging.getLogger("test")))
    assert written["metadata"]["resourceVersion"] != fresh["metadata"]["resourceVersion"]
    assert written["status"].get("conditions"), "the fresh plan's status was written"


def _event_on_job(namespace: str, job: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {"generateName": f"{job}.", "namespace": namespace},
        "involvedObject": {"kind": "Job", "name": job, "namespace": namespace, "apiVersion": "batch/v1"},
        "reason": "FailedCreate", "message": message, "type": "Warning",
        "source": {"component": "job-controller"}, "lastTimestamp": "2026-01-01T00:00:00Z",
    }  # fmt: skip


def test_a_waiting_jobs_events_are_its_own_and_its_pod_goes_first(
    operator_client: client.ApiClient, namespace: str
) -> None:
    """What the operator reads for core.control.job_waits: the FailedCreate events of that Job only (a field
    selector the API server applies), and none once a pod of the Job is on its way."""
    core = client.CoreV1Api(operator_client)
    refused = 'Error creating: pods "digits-1-abcde" is forbidden: exceeded quota: compute, requested: pods=1'
    core.create_namespaced_event(namespace, _event_on_job(namespace, "digits-1", refused))
    core.create_namespaced_event(namespace, _event_on_job(namespace, "digits-10", "another Job's refusal"))
    created = {**_event_on_job(namespace, "digits-1", "Created pod: x"), "reason": "SuccessfulCreate"}
    core.create_namespaced_event(namespace, created)  # the Job's, but not a refusal
    evidence = asyncio.run(api_calls.job_wait_evidence(namespace, "digits-1"))
    assert evidence is not None
    pods, events = evidence
    assert pods == [] and [e["message"] for e in events] == [refused]
    assert why_job_waits(pods, events) == f"the Job cannot create its pod: {refused}"

    pod = {
        "metadata": {"name": "digits-1-fghij", "labels": {"job-name": "digits-1"}},
        "spec": {"containers": [{"name": "agent", "image": "metainfer:test"}]},
    }
    core.create_namespaced_pod(namespace, pod)  # no scheduler here: it stays Pending, with no reason yet
    evidence = asyncio.run(api_calls.job_wait_evidence(namespace, "digits-1"))
    assert evidence is not None
    pods, events = evidence
    assert [p["metadata"]["name"] for p in pods] == ["digits-1-fghij"] and events == []
    assert why_job_waits(pods, events) is None


def test_an_oom_killed_agents_pod_is_read_as_what_ended_its_run(
    operator_client: client.ApiClient, namespace: str
) -> None:
    """The pod's status as the kubelet writes it, read back through the API server (core.control.pod_endings)."""
    core = client.CoreV1Api(operator_client)
    pod = {
        "metadata": {"name": "digits-2-abcde", "labels": {"job-name": "digits-2"}},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": "agent", "image": "metainfer:test", "resources": {"limits": {"memory": "2Gi"}}}]},
    }  # fmt: skip
    core.create_namespaced_pod(namespace, pod)
    terminated = {"reason": "OOMKilled", "exitCode": 137, "startedAt": "2026-01-01T00:00:00Z",
                  "finishedAt": "2026-01-01T00:01:00Z"}  # fmt: skip
    core.patch_namespaced_pod_status("digits-2-abcde", namespace, {"status": {"phase": "Failed", "containerStatuses": [
        {"name": "agent", "image": "metainfer:test", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": terminated}}]}})  # fmt: skip
    ending = pod_ending(asyncio.run(api_calls.job_pods(namespace, "digits-2")))
    assert ending is not None and ending.reason == Reason.OOM_KILLED and "memory limit 2Gi" in ending.message
    assert asyncio.run(api_calls.job_pods(namespace, "digits-3")) == []
