"""Helpers for operator tests: a real operator process, labelled Nodes, policies, the agent run locally.

No kubelet runs here, so Jobs never start by themselves: ``run_agent`` does what
a Job's pod would, executing the Job's own command (``metainfer agent run``)
against the real API server.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack.controlplane.processes import stop_child
from metainfer.core.api import GROUP, VERSION

NFD = "feature.node.kubernetes.io/"


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")


class Operator:
    """``metainfer operator`` as a subprocess; SIGKILL-able, restartable."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_dir: Path,
        peering: str | None = None,
        liveness: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig, self.namespace, self.log_dir, self.liveness = kubeconfig, namespace, log_dir, liveness
        self.extra_env = env or {}
        self.peering = peering or f"metainfer-test-{secrets.token_hex(3)}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.log_dir / f"operator-{self.peering}-{self.starts}.log"

    def start(self) -> Operator:
        self.starts += 1
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONSAFEPATH": "1",
            "METAINFER_WAIT_FOR_AVAILABLE": "false",
            "METAINFER_METRICS_PORT": "0",
            "METAINFER_RESYNC_SECONDS": "5",
            "METAINFER_PEERING_NAME": self.peering,
            "METAINFER_CLASS_SETTLE_SECONDS": "1",
            # As the chart's defaults do: GPU classes get the CUDA flavour, not refused (NoImageForHardware).
            "METAINFER_AGENT_IMAGES": '{"nvidia": {"image": "metainfer:latest-cuda"}}',
            **self.extra_env,
        }
        cmd = [
            sys.executable,
            "-m",
            "metainfer.agent.cli",
            "operator",
            "-n",
            self.namespace,
            "--liveness",
            self.liveness,
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        stop_child(self.proc)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextmanager
def operator_process(
    kubeconfig: Path,
    namespace: str,
    log_dir: Path,
    peering: str | None = None,
    liveness: str = "",
    env: dict[str, str] | None = None,
) -> Iterator[Operator]:
    op = Operator(kubeconfig, namespace, log_dir, peering, liveness, env).start()
    try:
        yield op
    finally:
        op.stop()


def cpu_node_labels(test_label: str, features: tuple[str, ...], vendor_id: str = "Intel") -> dict[str, str]:
    labels = {"kubernetes.io/arch": "amd64", f"{NFD}cpu-model.vendor_id": vendor_id, "metainfer.io/test": test_label}
    labels |= {f"{NFD}cpu-cpuid.{f}": "true" for f in features}
    return labels


def create_node(api: client.ApiClient, name: str, labels: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    client.CoreV1Api(api).create_node(body)


def delete_node(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


@dataclass
class Nodes:
    """CPU Node objects labelled ``metainfer.io/test=<namespace>``: only this test's policies select them."""

    api: client.ApiClient
    namespace: str
    names: list[str] = field(default_factory=list)

    def add(self, features: tuple[str, ...]) -> str:
        name = f"{self.namespace}-{'-'.join(f.lower() for f in features)}-{secrets.token_hex(2)}"
        create_node(self.api, name, cpu_node_labels(self.namespace, features))
        self.names.append(name)
        return name

    def delete_all(self) -> None:
        for name in self.names:
            delete_node(self.api, name)


def make_policy(
    namespace: str,
    name: str,
    model: Path,
    sha: str,
    *,
    batch: int = 4,
    latency_p95_ms: float = 1000,
    data: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """An AdaptationPolicy of a file:// model for this test's Nodes: a 2-trial random search; ``spec`` adds or
    replaces top-level spec fields (rollout, readaptation, search...)."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdaptationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": f"file://{model}", "sha256": sha, **({"data": data} if data else {})},
            "slo": {"latencyP95Ms": latency_p95_ms, "maxQualityDrop": 0.05, "batchSize": batch},
            "hardware": {"nodeSelector": {"metainfer.io/test": namespace}},
            "search": {"trialBudget": 2, "algorithm": "random", "timeBudgetSeconds": 60},
        },
    }
    body["spec"].update(spec)
    return body


def apply_policy(api: client.ApiClient, body: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], "adaptationpolicies", body
    )


def runs(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, namespace, "adaptationruns")[
        "items"
    ]


def policy(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies", name
    )


def ready_status(body: dict[str, Any]) -> dict[str, Any] | None:
    """A policy's status once its Ready condition is True, else None (for ``wait_for``)."""
    status = body.get("status") or {}
    ready = [c for c in status.get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
    return status if ready else None


def klass(api: client.ApiClient, namespace: str, name: str = "digits") -> dict[str, Any]:
    """The first hardware class in a policy's status ({} before there is one)."""
    classes = (policy(api, namespace, name).get("status") or {}).get("classes") or [{}]
    return classes[0]


def jobs(api: client.ApiClient, namespace: str) -> list[Any]:
    return client.BatchV1Api(api).list_namespaced_job(namespace).items


def deployments(api: client.ApiClient, namespace: str) -> list[Any]:
    return client.AppsV1Api(api).list_namespaced_deployment(namespace).items


def run_agent(kubeconfig: Path, namespace: str, run_name: str) -> subprocess.CompletedProcess[str]:
    """What the Job's pod would do: the Job's own command, with the kubeconfig instead of a token."""
    env = {**os.environ, "PYTHONSAFEPATH": "1", "METAINFER_FAST_MEASURE": "1", "KUBECONFIG": str(kubeconfig)}
    return subprocess.run(
        [sys.executable, "-m", "metainfer.agent.cli", "agent", "run", f"{namespace}/{run_name}"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def run_pending(control_plane: Any, namespace: str) -> None:
    """Run the agent for every unfinished run, waiting for its Job first (as a kubelet would start its pod)."""
    for run in runs(control_plane.api_client, namespace):
        if (run.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            name = run["metadata"]["name"]
            wait_for(
                f"Job {name}", lambda n=name: n in {j.metadata.name for j in jobs(control_plane.api_client, namespace)}
            )
            proc = run_agent(control_plane.kubeconfig, namespace, name)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def job_command(job: Any) -> list[str]:
    container = job.spec.template.spec.containers[0]
    return [*(container.command or []), *(container.args or [])]


def run_all_pending(cp: Any, namespace: str) -> list[str]:
    """Execute the agent for every run that has a Job and no result yet; returns their names."""
    done = []
    for run in runs(cp.api_client, namespace):
        if (run.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        job_names = {j.metadata.name for j in jobs(cp.api_client, namespace)}
        if run["metadata"]["name"] not in job_names:
            continue
        proc = run_agent(cp.kubeconfig, namespace, run["metadata"]["name"])
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        done.append(run["metadata"]["name"])
    return done
