"""The product on a real one-node cluster, installed the way a platform team installs it.

The module fixture ``platform`` starts the development cluster with its node
(containerd, kubelet, kube-proxy, the scheduler and every controller) and its
registry (TLS from the cluster's CA, htpasswd), builds the project's image with
``hack/image`` and pushes it and the packaged chart to that registry, starts a
real Prometheus on the node's address that discovers serving pods with
kubernetes_sd (the relabelling docs/real-cluster.md documents), and runs
``helm install oci://...`` with the image pinned by digest: the kubelet pulls it
with the pull secret the test creates in each namespace. Nothing plays the
kubelet here: Jobs and Deployments run as containers.

A node changes the host (bridge, iptables, cgroups): it needs root, and only
one runs at a time on a machine. Without root the suite is skipped with that
reason (CI runs as root).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from client_loop import ClientLoop
from kubernetes import client, config

from hack import helm
from hack.controlplane import assets, launch
from hack.controlplane import node as node_mod
from hack.image import build as image_build
from hack.prometheus import PrometheusServer, find_binary_with_kubernetes_sd

REPO = Path(__file__).resolve().parents[2]
RELEASE_NAMESPACE = "metainfer-system"
WORKLOAD_NAMESPACE = "team-a"
PULL_SECRET = "metainfer-registry"
DIGITS_POLICY = "digits"
# Longest a client of the policy may go without an answer while the cluster changes: the loop's own cadence
# (50 ms) plus a request, with room for a CPU-starved moment on a 2-core node running a Job beside the pods.
CONTINUITY_GAP_S = 2.0
# The node has 2 CPUs: the operator (100m), one Job (1 CPU) and serving pods (500m each) fit at once.
CHART_VALUES: dict[str, Any] = {
    "workloadNamespaces": [WORKLOAD_NAMESPACE],
    "agent": {"resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}},
    "serving": {
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}
    },
    "operator": {"classSettleSeconds": 5, "resyncSeconds": 10},
}


def serving_scrape_config(kubeconfig: Path, namespaces: list[str]) -> dict[str, Any]:
    """Prometheus' own Kubernetes discovery of serving pods: the same selection the chart's PodMonitor makes."""
    return {
        "job_name": "metainfer-serving",
        "kubernetes_sd_configs": [
            {"role": "pod", "kubeconfig_file": str(kubeconfig), "namespaces": {"names": namespaces}}
        ],
        "relabel_configs": [
            {
                "source_labels": [
                    "__meta_kubernetes_pod_label_app_kubernetes_io_managed_by",
                    "__meta_kubernetes_pod_label_app_kubernetes_io_component",
                ],
                "regex": "metainfer;serving",
                "action": "keep",
            },
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }


@dataclass
class Platform:
    plane: launch.ControlPlane
    api_client: client.ApiClient
    kubectl_path: Path
    helm_path: Path
    image: image_build.BuiltImage
    published: image_build.Published  # the image and chart in the cluster's registry: what the release runs
    prometheus: PrometheusServer
    log: Callable[[str], None]
    timings: dict[str, Any]  # what bench/real_node.py reports: seconds, p95s, the drift run's outcome

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig)}
        result = subprocess.run(
            [str(self.kubectl_path), *args], input=stdin, capture_output=True, text=True, env=env, timeout=120
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    @property
    def image_ref(self) -> str:
        """The image every pod of the release runs: <registry>/metainfer@sha256:..."""
        return self.published.image

    def chart_args(self, version: str | None = None) -> list[str]:
        """What helm install/upgrade takes to read the chart (this checkout's, or ``version``) from the registry."""
        version = version or self.published.chart_version
        return [self.published.chart, "--version", version, "--ca-file", str(self.published.registry.ca)]

    def pull_secret(self, namespace: str) -> None:
        """The registry's account as a kubernetes.io/dockerconfigjson Secret in ``namespace``."""
        registry = self.published.registry
        self.kubectl(
            "create", "secret", "docker-registry", PULL_SECRET, "-n", namespace,
            f"--docker-server={registry.address}", f"--docker-username={registry.credentials.username}",
            f"--docker-password={registry.credentials.password}",
        )  # fmt: skip

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm_env(self) -> dict[str, str]:
        """helm's environment: this cluster, and caches and registry login of its own."""
        helm_home = self.plane.root / "helm"
        return {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), "HELM_CACHE_HOME": str(helm_home / "cache"),
                "HELM_REGISTRY_CONFIG": str(helm_home / "registry.json")}  # fmt: skip

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = self.helm_env()
        result = subprocess.run([str(self.helm_path), *args], capture_output=True, text=True, env=env, timeout=600)
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def diagnostics(self) -> str:
        """What a failed wait prints: pods, events and the operator's log tail."""
        pods = self.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
        events = self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout
        operator = self.kubectl(
            "logs", "-n", RELEASE_NAMESPACE, "deploy/metainfer-operator", "--tail=40", check=False
        ).stdout
        # Which run each serving Deployment serves, checked on the node first or not, and what the classes say.
        template = (
            "{range .items[*]}{.metadata.name} run={.metadata.labels.metainfer\\.io/run}"
            " created={.metadata.creationTimestamp}"
            " provisional={.metadata.labels.metainfer\\.io/provisional} replicas={.status.replicas}"
            ' ready={.status.readyReplicas}{"\\n"}{end}'
        )
        deployments = self.kubectl(
            "get", "deployments", "-n", WORKLOAD_NAMESPACE, "-o", f"jsonpath={template}", check=False
        ).stdout
        classes = self.kubectl(
            "get", "adaptationpolicies", "-n", WORKLOAD_NAMESPACE, "-o",
            "jsonpath={range .items[*].status.classes[*]}{.name}: {.state} {.reason} current={.current.runName}"
            " rollout={.rollout.phase}:{.rollout.canary.runName}@{.rollout.startedAt}"
            ' {.message}{"\\n"}{end}',
            check=False,
        ).stdout  # fmt: skip
        checks = self.kubectl(
            "logs", "-n", WORKLOAD_NAMESPACE, "-l", "metainfer.io/provisional=true", "-c", "check", "--tail=15",
            "--prefix", check=False,
        )  # fmt: skip
        pending = self.kubectl(
            "get", "events", "-n", WORKLOAD_NAMESPACE, "--field-selector", "reason=FailedScheduling", check=False
        ).stdout
        return (
            f"pods:\n{pods}\ndeployments:\n{deployments}\nclasses:\n{classes[-3000:]}\n"
            f"provisional checks:\n{(checks.stdout + checks.stderr)[-3000:]}\n"
            f"scheduling failures:\n{pending[-2000:]}\nevents:\n{events[-4000:]}\noperator log:\n{operator[-4000:]}"
        )

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 2.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{self.diagnostics()}")
            time.sleep(interval_s)


def reporter(request: pytest.FixtureRequest) -> Callable[[str], None]:
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")

    def log(message: str) -> None:
        if terminal is not None:
            terminal.write_line(f"[e2e] {message}")
        else:
            print(f"[e2e] {message}", file=sys.__stderr__, flush=True)

    return log


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the real node needs root (bridge, iptables, cgroups, containerd); CI runs as root")


@contextlib.contextmanager
def running_platform(root: Path, log: Callable[[str], None], first_chart: Path | None = None) -> Iterator[Platform]:
    """Cluster with node, image and chart in its registry, Prometheus with kubernetes_sd, chart installed from the
    registry; all stopped on exit. ``first_chart``: push that chart directory too and install it instead (an
    earlier release, for upgrade tests); ``Platform.chart_args`` still name this checkout's chart.

    Also used by bench/real_node.py, which times the same steps.
    """
    timings: dict[str, Any] = {}
    found = assets.provide(log, with_node=True)
    kubectl_path = assets.find_kubectl(log)
    helm_path = helm.provide(log)
    started = time.monotonic()
    plane = launch.start(root, found, log=log, die_with_parent=True, node=True, timeout_s=300)
    timings["cluster_up_s"] = time.monotonic() - started
    prometheus: PrometheusServer | None = None
    try:
        log(f"cluster with node up in {timings['cluster_up_s']:.1f}s")
        image = image_build.build(log=log)
        if plane.registry is None:
            raise AssertionError(f"the cluster under {root} runs no registry")
        started = time.monotonic()
        published = image_build.publish(image, plane.registry, helm_path, log)
        timings["image_push_s"] = time.monotonic() - started
        install_version = published.chart_version
        if first_chart is not None:
            _, install_version, _ = plane.registry.push_chart(helm_path, first_chart, root / "first-chart")
        prometheus = PrometheusServer(
            find_binary_with_kubernetes_sd(log),
            root / "prometheus",
            [],
            scrape_interval_s=2.0,
            scrape_configs=[serving_scrape_config(plane.kubeconfig, [WORKLOAD_NAMESPACE])],
            host=node_mod.NODE_IP,
        ).start()
        api_client = config.new_client_from_config(config_file=str(plane.kubeconfig))
        handle = Platform(plane, api_client, kubectl_path, helm_path, image, published, prometheus, log, timings)
        published.registry.helm_login(helm_path, handle.helm_env())
        for namespace in (RELEASE_NAMESPACE, WORKLOAD_NAMESPACE):
            handle.kubectl("create", "namespace", namespace)
            handle.pull_secret(namespace)
        values = root / "values.yaml"
        secrets = [{"name": PULL_SECRET}]
        values.write_text(
            json.dumps(
                {
                    **CHART_VALUES,
                    "image": {"repository": published.repository, "digest": published.digest},
                    "imagePullSecrets": secrets,
                    "workloads": {"imagePullSecrets": secrets},
                    "prometheus": {"url": prometheus.url},
                }
            )
        )
        started = time.monotonic()
        handle.helm(
            "install", "metainfer", *handle.chart_args(install_version), "-n", RELEASE_NAMESPACE,
            "-f", str(values), "--wait", "--timeout", "4m",
        )  # fmt: skip
        timings["helm_install_to_operator_ready_s"] = time.monotonic() - started
        log(f"helm install: operator Ready in {timings['helm_install_to_operator_ready_s']:.1f}s")
        yield handle
        api_client.close()
    finally:
        if prometheus is not None:
            prometheus.stop()
        plane.stop()


@pytest.fixture(scope="module")
def platform(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    require_root()
    with running_platform(tmp_path_factory.mktemp("node-cluster"), reporter(request)) as handle:
        yield handle
        out = os.environ.get("METAINFER_E2E_TIMINGS")  # bench/real_node.py collects the suite's timings
        if out:
            Path(out).write_text(json.dumps(handle.timings, indent=2, sort_keys=True))


def ready_serving_pods(platform: Platform, selector: str) -> list[dict[str, Any]]:
    """The Ready, not terminating, pods of ``selector`` in the workload namespace."""
    pods: list[dict[str, Any]] = platform.get("pods", "-n", WORKLOAD_NAMESPACE, "-l", selector)["items"]
    return [
        p
        for p in pods
        if p.get("metadata", {}).get("deletionTimestamp") is None
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
    ]


def model_ready_at(cluster_ip: str, model: str) -> bool:
    """Whether a Service's address answers the KServe v2 model-ready call for ``model`` with 200."""
    import http.client

    connection = http.client.HTTPConnection(cluster_ip, 8080, timeout=5)
    try:
        connection.request("GET", f"/v2/models/{model}/ready")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def digits_policy(model_sha256: str) -> dict[str, Any]:
    """The digits policy the suites adapt and serve: its model from the ConfigMap ``digits-model``."""
    return {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": DIGITS_POLICY, "namespace": WORKLOAD_NAMESPACE},
        "spec": {
            "model": {"uri": "configmap://digits-model/model.onnx", "sha256": model_sha256},
            "slo": {"latencyP95Ms": 40, "batchSize": 16},
            "search": {"trialBudget": 6, "timeBudgetSeconds": 300},
            "serving": {"replicas": 1},
            "rollout": {"canaryReplicas": 0},
            "readaptation": {"checkIntervalSeconds": 5, "windowSeconds": 30},
        },
    }


def digits_client_loop(platform: Platform, keep_alive: bool = False) -> ClientLoop:
    """One request every 50 ms through the digits policy's Service, as a client that follows status.endpoint does
    (a new connection per request, or one kept alive: ``ClientLoop``)."""
    cluster_ip = platform.get("service", DIGITS_POLICY, "-n", WORKLOAD_NAMESPACE)["spec"]["clusterIP"]
    batch = np.random.default_rng(2).random((16, 64), dtype=np.float32)
    inputs = [{"name": "input", "shape": [16, 64], "datatype": "FP32", "data": batch.ravel().tolist()}]
    return ClientLoop(cluster_ip, 8080, DIGITS_POLICY, inputs, keep_alive=keep_alive)
