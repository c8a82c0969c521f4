"""The chart's lifecycle on a real API server: upgrade from the previous chart version, uninstall, CRDs kept or not.

The previous chart version (0.1.0) shipped its CRDs in Helm's crds/ folder, which Helm installs once and never
upgrades or owns. From 0.2.0 they are release objects. The upgrade path docs/helm.md gives (adopt the CRDs, then
`helm upgrade`) is played here against that very chart, taken from git history, with a policy that must survive it.

A control plane of its own (no node: nothing here needs a pod to run), because this test installs, upgrades and
deletes the CRDs every other integration test relies on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from hack import helm as hack_helm
from hack.controlplane import assets, launch
from hack.controlplane.errors import AssetError, ControlPlaneError
from hack.helm import HELM_VERSION, provide
from metainfer.core.api import GROUP, VERSION

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "metainfer"
RELEASE, NAMESPACE, WORKLOADS = "metainfer", "metainfer-system", "team-a"
OUR_CRDS = sorted(
    d["metadata"]["name"] for p in (REPO / "crds").glob("*.yaml") for d in yaml.safe_load_all(p.read_text())
)


def _log(message: str) -> None:
    print(f"[lifecycle] {message}", file=sys.__stderr__, flush=True)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[launch.ControlPlane]:
    try:
        found = assets.provide(_log)
    except ControlPlaneError as exc:
        pytest.fail(f"cannot provide kube-apiserver/etcd: {exc}", pytrace=False)
    started = launch.start(tmp_path_factory.mktemp("lifecycle-plane"), found, log=_log, die_with_parent=True)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return str(provide(_log))
    except AssetError as exc:
        pytest.fail(f"cannot provide helm {HELM_VERSION}: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return hack_helm.previous_chart(tmp_path_factory.mktemp("previous-chart"))
    except AssetError as exc:
        pytest.fail(str(exc), pytrace=False)


def _helm(helm: str, plane: launch.ControlPlane, *args: str) -> str:
    result = subprocess.run(
        [helm, "--kubeconfig", str(plane.kubeconfig), *args], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _kubectl(plane: launch.ControlPlane, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
    kubectl = assets.find_kubectl(_log)
    result = subprocess.run([str(kubectl), *args], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def _crds(api: client.ApiClient) -> dict[str, dict[str, Any]]:
    listed = client.ApiextensionsV1Api(api).list_custom_resource_definition()
    return {c.metadata.name: api.sanitize_for_serialization(c) for c in listed.items if c.metadata.name in OUR_CRDS}


def _policy(api: client.ApiClient) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, WORKLOADS, "adaptationpolicies", "digits"
        )
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _wait_until_crds_are_gone(api: client.ApiClient, plane: launch.ControlPlane, timeout_s: float) -> None:
    """Wait for the deleted CRDs to go, nudging any whose cleanup failed as docs/helm.md#uninstall tells users to.

    kube-apiserver (1.37) deletes a CRD's objects before the CRD; when the deletion lands while it re-initialises
    the CRD's storage (right after the update that removed the keep annotation), the cleanup fails with "storage
    is (re)initializing" and, on a conflict with its own status write, is only retried at the next informer
    resync, up to 5 minutes later (seen once in six runs: `helm uninstall --wait` then waits that long). Any
    change to the CRD retries it at once."""
    deadline = time.monotonic() + timeout_s
    while (left := _crds(api)) and time.monotonic() < deadline:
        for name, crd in left.items():
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Terminating" and c.get("reason") == "InstanceDeletionFailed" for c in conditions):
                _kubectl(plane, "annotate", "crd", name, f"metainfer.io/cleanup-retry={time.time_ns()}", "--overwrite")
        time.sleep(0.5)
    assert _crds(api) == {}, f"CRDs left {timeout_s:.0f}s after uninstall: {sorted(_crds(api))}"


def _release_objects(plane: launch.ControlPlane) -> list[str]:
    """Every namespaced or cluster object the release labels as its own, CRDs aside."""
    selector = f"app.kubernetes.io/instance={RELEASE}"
    kinds = "deployments,services,serviceaccounts,configmaps,roles,rolebindings,clusterroles,clusterrolebindings"
    kinds += ",validatingadmissionpolicies,validatingadmissionpolicybindings"
    out = _kubectl(plane, "get", kinds, "-A", "-l", selector, "-o", "name")
    return [line for line in out.splitlines() if line]


def test_upgrade_from_the_crds_folder_chart_then_uninstall_keeps_or_deletes_the_crds_as_asked(
    plane: launch.ControlPlane, helm: str, previous_chart: Path
) -> None:
    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    try:
        for namespace in (NAMESPACE, WORKLOADS):
            client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        common = ["-n", NAMESPACE, "--set", f"workloadNamespaces={{{WORKLOADS}}}"]
        _helm(helm, plane, "install", RELEASE, str(previous_chart), *common)
        before = _crds(api)
        assert sorted(before) == OUR_CRDS
        assert not any("meta.helm.sh/release-name" in (c["metadata"].get("annotations") or {}) for c in before.values())
        policy = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AdaptationPolicy",
            "metadata": {"name": "digits", "namespace": WORKLOADS},
            "spec": {
                "model": {"uri": "https://models.example/digits.onnx", "sha256": "a" * 64},
                "slo": {"latencyP95Ms": 5},
            },
        }
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, WORKLOADS, "adaptationpolicies", policy
        )

        # Without adoption Helm refuses to take over CRDs it did not create: the upgrade says so and changes nothing.
        refused = subprocess.run(
            [helm, "--kubeconfig", str(plane.kubeconfig), "upgrade", RELEASE, str(CHART), *common],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr, refused.stderr

        # docs/helm.md's adoption, command for command.
        for name in OUR_CRDS:
            _kubectl(plane, "label", "crd", name, "app.kubernetes.io/managed-by=Helm", "--overwrite")
            _kubectl(plane, "annotate", "crd", name, f"meta.helm.sh/release-name={RELEASE}",
                     f"meta.helm.sh/release-namespace={NAMESPACE}", "--overwrite")  # fmt: skip
        _helm(helm, plane, "upgrade", RELEASE, str(CHART), *common)
        after = _crds(api)
        assert sorted(after) == OUR_CRDS
        generated = {d["metadata"]["name"]: d for p in (REPO / "crds").glob("*.yaml") for d in yaml.safe_load_all(
            p.read_text())}  # fmt: skip
        for name, crd in after.items():
            assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name
            assert crd["spec"]["versions"] == generated[name]["spec"]["versions"], f"{name} was not upgraded"
        assert _policy(api) is not None, "the upgrade lost the policy"
        assert "0.2.0" in _helm(helm, plane, "list", "-n", NAMESPACE, "-o", "yaml")

        # Uninstall with crds.keep (the default): every release object goes, the CRDs and the policy stay.
        _helm(helm, plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait")
        assert _release_objects(plane) == []
        assert sorted(_crds(api)) == OUR_CRDS
        assert _policy(api) is not None

        # Reinstalled under the same name, Helm adopts the kept CRDs; crds.keep=false lets uninstall remove them.
        _helm(helm, plane, "install", RELEASE, str(CHART), *common, "--set", "crds.keep=false")
        assert all(
            "helm.sh/resource-policy" not in (c["metadata"].get("annotations") or {}) for c in _crds(api).values()
        )
        # Without --wait: a CRD goes once the API server has deleted its objects, and kube-apiserver's cleanup
        # can stall on a CRD whose storage it is re-initialising (see _wait_until_crds_are_gone).
        _helm(helm, plane, "uninstall", RELEASE, "-n", NAMESPACE)
        assert _release_objects(plane) == []
        _wait_until_crds_are_gone(api, plane, timeout_s=120)
        with pytest.raises(ApiException) as gone:
            client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, WORKLOADS, "adaptationpolicies")
        assert gone.value.status == 404
    finally:
        api.close()
