"""Upgrading the chart in place while a policy serves, as a platform team upgrades a release.

The previous release (chart 0.1.0, its CRDs in Helm's crds/ folder) is installed from the cluster's registry, a
digits policy is adapted and served, then docs/helm.md's adoption (command for command) and `helm upgrade` to
this checkout's chart, read from the same registry, run while a client sends a request every 50 ms through the
policy's Service. The policy must not notice: no failed request, no gap, no new run, its serving pods untouched.

The upgraded release then serves the second runtime end to end (one cluster start fewer than a module of its own):
a policy whose search space is OpenVINO alone (its static int8, or the FP32 reference a search always keeps:
on this 2-core AVX2 machine FP32 has won each run) is adapted by the operator's Job onto OpenVINO, rolled out,
and served through the policy's own Service, in the one image that carries both runtimes.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from platform_harness import (
    CONTINUITY_GAP_S,
    DIGITS_POLICY,
    RELEASE_NAMESPACE,
    WORKLOAD_NAMESPACE,
    Platform,
    digits_client_loop,
    digits_policy,
    model_ready_at,
    ready_serving_pods,
    reporter,
    require_root,
    running_platform,
)

from hack import helm as hack_helm
from metainfer.agent.zoo import build_examples
from metainfer.agent.zoo.light import light_model_path
from metainfer.core.api import names
from metainfer.core.engine.recipe import Recipe
from metainfer.core.engine.runtime import create_session

SERVING = f"{names.COMPONENT}=serving,{names.LABEL_POLICY}={DIGITS_POLICY}"


@pytest.fixture(scope="module")
def previous_release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    require_root()
    chart = hack_helm.previous_chart(tmp_path_factory.mktemp("previous-chart"))
    root = tmp_path_factory.mktemp("upgrade-cluster")
    with running_platform(root, reporter(request), first_chart=chart) as handle:
        yield handle


def _release(platform: Platform) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        platform.helm("get", "metadata", "metainfer", "-n", RELEASE_NAMESPACE, "-o", "json").stdout
    )
    return found


def _ours(platform: Platform) -> list[dict[str, Any]]:
    crds: list[dict[str, Any]] = platform.get("crds")["items"]
    return [c for c in crds if c["spec"]["group"] in (names.GROUP, "kopf.dev")]


def _run_names(platform: Platform) -> list[str]:
    return sorted(r["metadata"]["name"] for r in platform.get("adaptationruns", "-n", WORKLOAD_NAMESPACE)["items"])


def _run_reasons(platform: Platform) -> dict[str, str]:
    runs = platform.get("adaptationruns", "-n", WORKLOAD_NAMESPACE)["items"]
    return {r["metadata"]["name"]: r["spec"].get("reason", "") for r in runs}


def test_upgrading_from_the_previous_chart_costs_a_serving_policy_no_request(
    previous_release: Platform, tmp_path: Path
) -> None:
    platform = previous_release
    assert _release(platform)["version"] == hack_helm.PREVIOUS_CHART_VERSION
    assert all("meta.helm.sh/release-name" not in (c["metadata"].get("annotations") or {}) for c in _ours(platform))

    model = build_examples(tmp_path, ["digits"])["digits"].model_path
    platform.kubectl(
        "create", "configmap", "digits-model", "-n", WORKLOAD_NAMESPACE, f"--from-file=model.onnx={model}"
    )  # fmt: skip
    policy = digits_policy(hashlib.sha256(model.read_bytes()).hexdigest())
    # What this test judges is what the upgrade redoes. A starved CI machine (both lanes busy while this module runs
    # first) can push the digits p95 past its 40 ms SLO: a genuine latency drift, whose run then looked like the
    # upgrade's (seen once in CI). Drift has its own e2e test; here the policy does not watch for it.
    policy["spec"]["readaptation"] = {"enabled": False}
    platform.kubectl("apply", "-f", "-", stdin=json.dumps(policy))
    served = platform.wait(
        "a Ready serving pod under the previous chart", lambda: ready_serving_pods(platform, SERVING), 600, 2
    )
    # The first pod's Ready reaches kube-proxy's rules a moment later (CI saw 16 refused connections in the first
    # 0.8 s): the client starts once the policy's address routes, as one following status.endpoint would.
    cluster_ip = platform.get("service", DIGITS_POLICY, "-n", WORKLOAD_NAMESPACE)["spec"]["clusterIP"]
    platform.wait("the policy's Service to route", lambda: model_ready_at(cluster_ip, DIGITS_POLICY), 30, 0.5)
    pods_before = sorted(p["metadata"]["uid"] for p in served)
    runs_before = _run_names(platform)
    (operator_before,) = platform.get("pods", "-n", RELEASE_NAMESPACE, "-l", f"{names.COMPONENT}=operator")["items"]

    with digits_client_loop(platform) as loop:
        started = time.monotonic()
        # docs/helm.md#upgrading-from-chart-010: hand the CRDs to the release, then upgrade.
        for crd in _ours(platform):
            name = crd["metadata"]["name"]
            platform.kubectl("label", "crd", name, "app.kubernetes.io/managed-by=Helm", "--overwrite")
            platform.kubectl("annotate", "crd", name, "meta.helm.sh/release-name=metainfer",
                             f"meta.helm.sh/release-namespace={RELEASE_NAMESPACE}", "--overwrite")  # fmt: skip
        platform.helm(
            "upgrade", "metainfer", *platform.chart_args(), "-n", RELEASE_NAMESPACE, "--reset-then-reuse-values",
            "--wait", "--timeout", "4m",
        )  # fmt: skip
        platform.timings["chart_upgrade_s"] = time.monotonic() - started
        # The new operator has resynced every policy (resyncSeconds 10) before the client stops.
        time.sleep(25)
    report = loop.report
    platform.log(f"continuity, chart upgrade from {hack_helm.PREVIOUS_CHART_VERSION}: {report.describe()}")
    assert report.sent > 0 and report.failed == 0, report.describe()
    assert report.longest_gap_s <= CONTINUITY_GAP_S, report.describe()

    assert _release(platform)["version"] == platform.published.chart_version
    (operator_after,) = platform.get("pods", "-n", RELEASE_NAMESPACE, "-l", f"{names.COMPONENT}=operator")["items"]
    assert operator_after["metadata"]["uid"] != operator_before["metadata"]["uid"], "the operator was not rolled"
    for crd in _ours(platform):
        annotations = crd["metadata"].get("annotations") or {}
        assert annotations.get("meta.helm.sh/release-name") == "metainfer", crd["metadata"]["name"]
        assert annotations.get("helm.sh/resource-policy") == "keep", crd["metadata"]["name"]
    # Nothing the policy had was redone: same runs, the same serving pods, still Ready.
    assert _run_names(platform) == runs_before, _run_reasons(platform)
    assert sorted(p["metadata"]["uid"] for p in ready_serving_pods(platform, SERVING)) == pods_before
    policy = platform.get("adaptationpolicy", DIGITS_POLICY, "-n", WORKLOAD_NAMESPACE)
    ready = next(c for c in policy["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", policy["status"]["conditions"]


OPENVINO_POLICY = "inception"
OPENVINO_SERVING = f"{names.COMPONENT}=serving,{names.LABEL_POLICY}={OPENVINO_POLICY}"
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


def _openvino_policy(model_sha256: str) -> dict[str, Any]:
    return {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": OPENVINO_POLICY, "namespace": WORKLOAD_NAMESPACE},
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
    """The OpenVINO policy's succeeded runs (the digits policy's are garbage-collected in the background)."""
    selector = f"{names.LABEL_POLICY}={OPENVINO_POLICY}"
    runs: list[dict[str, Any]] = platform.get("adaptationruns", "-n", WORKLOAD_NAMESPACE, "-l", selector)["items"]
    failed = [r for r in runs if r.get("status", {}).get("phase") == "Failed"]
    assert not failed, json.dumps(failed[0].get("status"), indent=1)[:3000]
    return [r for r in runs if r.get("status", {}).get("phase") == "Succeeded"]


def test_an_openvino_variant_is_adapted_by_a_job_and_served_through_the_policys_service(
    previous_release: Platform, tmp_path: Path
) -> None:
    tritonhttp = pytest.importorskip("tritonclient.http")
    platform = previous_release
    assert _release(platform)["version"] == platform.published.chart_version, (
        "the OpenVINO test runs on the release the upgrade test upgraded to this checkout's chart: run them together"
    )
    # The Job and the serving pod get the node's CPU to themselves: the upgrade's digits policy and pods go first.
    platform.kubectl("delete", "adaptationpolicies", "--all", "-n", WORKLOAD_NAMESPACE, "--wait", "--timeout=3m")
    platform.wait(
        "the digits serving pods to be gone",
        lambda: not platform.get("pods", "-n", WORKLOAD_NAMESPACE, "-l", SERVING)["items"],
        120,
    )
    model = light_model_path("light_inception_v2")
    _store_volume(platform, tmp_path / "variants")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    platform.kubectl(
        "create", "configmap", "inception-model", "-n", WORKLOAD_NAMESPACE, f"--from-file=model.onnx={model}"
    )
    platform.kubectl("apply", "-f", "-", stdin=json.dumps(_openvino_policy(sha)))

    (run,) = platform.wait("the adaptation run to succeed", lambda: _succeeded_runs(platform), 900, 5)
    recipe = Recipe.model_validate(run["status"]["bestRecipe"])
    platform.log(f"run {run['metadata']['name']}: {recipe.describe()}")
    assert recipe.session.runtime == "openvino", recipe.describe()

    (pod,) = platform.wait("a Ready serving pod", lambda: ready_serving_pods(platform, OPENVINO_SERVING), 300, 2)
    log = platform.kubectl("logs", "-n", WORKLOAD_NAMESPACE, pod["metadata"]["name"], "-c", "server").stdout
    assert "on OpenVINO" in log, log[-2000:]
    # The Job compiled the variant into the store; the pod imported that blob instead of compiling (issue 30).
    assert "OpenVINO model imported from the store's compiled cache" in log, log[-2000:]
    assert list((tmp_path / "variants" / "openvino-cache").iterdir()), "the Job stored no compiled model"
    stored = platform.get("adaptationpolicy", OPENVINO_POLICY, "-n", WORKLOAD_NAMESPACE)
    described = [c.get("current", {}).get("description", "") for c in stored["status"].get("classes", [])]
    assert any("on OpenVINO" in d for d in described), stored["status"]

    cluster_ip = platform.get("service", OPENVINO_POLICY, "-n", WORKLOAD_NAMESPACE)["spec"]["clusterIP"]
    platform.wait(
        "the policy's Service to route to its Ready pod", lambda: model_ready_at(cluster_ip, OPENVINO_POLICY), 30, 0.5
    )
    client = tritonhttp.InferenceServerClient(f"{cluster_ip}:8080")
    assert client.get_model_metadata(OPENVINO_POLICY)["platform"] == "openvino"
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    request = tritonhttp.InferInput("data_0", list(image.shape), "FP32")
    request.set_data_from_numpy(image, binary_data=True)
    answer = client.infer(OPENVINO_POLICY, [request])
    reference = create_session(model.read_bytes(), Recipe())
    (output,) = reference.get_outputs()
    want = reference.run(None, {"data_0": image})[0].ravel()
    got = answer.as_numpy(output.name)
    assert got is not None
    cosine = float(np.dot(got.ravel(), want) / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine >= 1 - QUALITY_BUDGET, cosine
    platform.log(f"served on OpenVINO through {cluster_ip}:8080, cosine to ORT FP32 {cosine:.5f}")
