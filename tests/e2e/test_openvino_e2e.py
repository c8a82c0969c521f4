"""The second runtime end to end on the real node: a model on which OpenVINO runs metainfer's int8 variant faster
than ONNX Runtime runs FP32 is adapted by the operator's Job onto OpenVINO, rolled out, and served through the
policy's own Service, in the one image that carries both runtimes.

Its own module (its own cluster): the policy's Job and serving pods need the node's CPU to themselves.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from platform_harness import WORKLOAD_NAMESPACE, Platform, model_ready_at, ready_serving_pods

from metainfer.agent.zoo.light import light_model_path
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session

tritonhttp = pytest.importorskip("tritonclient.http")

POLICY = "inception"
SERVING = "app.kubernetes.io/component=serving,metainfer.io/policy=" + POLICY
QUALITY_BUDGET = 0.01
STORE_CLAIM = "variants"


def _store_volume(platform: Platform, directory: Path) -> None:
    """A hostPath volume on the one node, claimed in the workload namespace: the policy's variant store."""
    directory.mkdir(mode=0o777, exist_ok=True)
    directory.chmod(0o777)  # the Job's non-root UID writes it
    volume = {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "metainfer-e2e-variants"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(directory)}},
    }  # fmt: skip
    claim = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": STORE_CLAIM, "namespace": WORKLOAD_NAMESPACE},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual", "volumeName": "metainfer-e2e-variants",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    platform.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [volume, claim]})
    )


def _policy(model_sha256: str) -> dict[str, Any]:
    return {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": POLICY, "namespace": WORKLOAD_NAMESPACE},
        "spec": {
            "model": {"uri": "configmap://inception-model/model.onnx", "sha256": model_sha256},
            "slo": {"latencyP95Ms": 2000, "batchSize": 1, "maxQualityDrop": QUALITY_BUDGET},
            # OpenVINO's static int8 only, and no mixed precision (its sensitivity scan would take minutes on one
            # CPU): the search's choice between runtimes is bench/runtime_choice.py's; this is the rollout of one.
            "searchSpace": {"runtimes": ["openvino"], "quantization": ["int8_static"], "maxKeepFloatLayers": 0},
            "search": {"trialBudget": 3, "timeBudgetSeconds": 400},
            "serving": {"replicas": 1, "variantStore": {"claimName": STORE_CLAIM}},
            "rollout": {"canaryReplicas": 0},
        },
    }


def _succeeded_runs(platform: Platform) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = platform.get("adaptationruns", "-n", WORKLOAD_NAMESPACE)["items"]
    failed = [r for r in runs if r.get("status", {}).get("phase") == "Failed"]
    assert not failed, json.dumps(failed[0].get("status"), indent=1)[:3000]
    return [r for r in runs if r.get("status", {}).get("phase") == "Succeeded"]


def test_an_openvino_variant_is_adapted_by_a_job_and_served_through_the_policys_service(
    platform: Platform, tmp_path: Path
) -> None:
    model = light_model_path("light_inception_v2")
    _store_volume(platform, tmp_path / "variants")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    platform.kubectl(
        "create", "configmap", "inception-model", "-n", WORKLOAD_NAMESPACE, f"--from-file=model.onnx={model}"
    )
    platform.kubectl("apply", "-f", "-", stdin=json.dumps(_policy(sha)))

    (run,) = platform.wait("the adaptation run to succeed", lambda: _succeeded_runs(platform), 900, 5)
    recipe = Recipe.model_validate(run["status"]["bestRecipe"])
    platform.log(f"run {run['metadata']['name']}: {recipe.describe()}")
    assert recipe.session.runtime == "openvino", recipe.describe()

    (pod,) = platform.wait("a Ready serving pod", lambda: ready_serving_pods(platform, SERVING), 300, 2)
    log = platform.kubectl("logs", "-n", WORKLOAD_NAMESPACE, pod["metadata"]["name"], "-c", "server").stdout
    assert "on OpenVINO" in log, log[-2000:]
    # The Job compiled the variant into the store; the pod imported that blob instead of compiling (issue 30).
    assert "OpenVINO model imported from the store's compiled cache" in log, log[-2000:]
    assert list((tmp_path / "variants" / "openvino-cache").iterdir()), "the Job stored no compiled model"
    stored = platform.get("adaptationpolicy", POLICY, "-n", WORKLOAD_NAMESPACE)
    described = [c.get("current", {}).get("description", "") for c in stored["status"].get("classes", [])]
    assert any("on OpenVINO" in d for d in described), stored["status"]

    cluster_ip = platform.get("service", POLICY, "-n", WORKLOAD_NAMESPACE)["spec"]["clusterIP"]
    platform.wait("the policy's Service to route to its Ready pod", lambda: model_ready_at(cluster_ip, POLICY), 30, 0.5)
    client = tritonhttp.InferenceServerClient(f"{cluster_ip}:8080")
    assert client.get_model_metadata(POLICY)["platform"] == "openvino"
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    request = tritonhttp.InferInput("data_0", list(image.shape), "FP32")
    request.set_data_from_numpy(image, binary_data=True)
    answer = client.infer(POLICY, [request])
    reference = create_session(model.read_bytes(), Recipe())
    (output,) = reference.get_outputs()
    want = reference.run(None, {"data_0": image})[0].ravel()
    got = answer.as_numpy(output.name)
    assert got is not None
    cosine = float(np.dot(got.ravel(), want) / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine >= 1 - QUALITY_BUDGET, cosine
    platform.log(f"served on OpenVINO through {cluster_ip}:8080, cosine to ORT FP32 {cosine:.5f}")
