"""``make demo-cluster``: the whole operator loop on the local control plane.

Starts the operator against ``.cluster/kubeconfig`` (``make cluster-up`` runs
first), creates Node objects of two hardware classes (an AVX2-only and an
AVX-512 VNNI CPU node), applies a policy for the bundled digits model, and,
since no kubelet runs here, executes each adaptation Job's own command
(``metainfer agent run``) locally so the real agent talks to the real API
server. Prints the policy's status once it is Ready; the cluster stays up for
inspection (``make cluster-down`` stops it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from metainfer.agent.zoo import build_examples
from metainfer.core.api import GROUP, VERSION

REPO = Path(__file__).resolve().parents[1]
KUBECONFIG = REPO / ".cluster" / "kubeconfig"
NAMESPACE = "default"
NFD = "feature.node.kubernetes.io/"
NODES = {
    "demo-cpu-avx2-0": ("AVX2", "FMA3"),
    "demo-cpu-avx2-1": ("AVX2", "FMA3"),
    "demo-cpu-vnni-0": ("AVX2", "FMA3", "AVX512F", "AVX512VNNI"),
}
TIMEOUT_S = 600


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def main() -> int:
    if not KUBECONFIG.exists():
        log("no local cluster: run `make cluster-up` first (make demo-cluster does)")
        return 2
    config.load_kube_config(str(KUBECONFIG))
    models = REPO / "build" / "demo-cluster"
    digits = build_examples(models, ["digits"])["digits"]
    for name, features in NODES.items():
        _apply_node(name, features)
    log(f"nodes: {', '.join(NODES)}")
    env = {
        **os.environ,
        "KUBECONFIG": str(KUBECONFIG),
        "PYTHONSAFEPATH": "1",
        "METAINFER_WAIT_FOR_AVAILABLE": "false",
        "METAINFER_METRICS_PORT": "0",
        "METAINFER_RESYNC_SECONDS": "5",
    }
    operator = SupervisedOperator(env, REPO / ".cluster" / "operator.log")
    try:
        _apply_policy(digits.model_path, digits.sha256, digits.data_path)
        log("applied AdaptationPolicy digits")
        status = _drive(env, operator)
    finally:
        operator.stop()
    subprocess.run(
        [
            str(Path(sys.executable).parent / "kubectl"),
            "get",
            "adaptationpolicies,adaptationruns,deployments",
            "-n",
            NAMESPACE,
        ],
        env=env,
        check=False,
    )
    print(json.dumps(status, indent=2))
    classes = status.get("classes", [])
    log(f"policy Ready: {len(classes)} classes, {len(_deployments())} Deployments")
    return 0


class SupervisedOperator:
    """``metainfer operator`` restarted whenever it exits, as the chart's Deployment would (the operator exits
    on purpose when its reactor dies, e.g. after an API server outage longer than its retries)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env, self.log_path = env, log_path
        self.log_path.write_bytes(b"")
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "metainfer.agent.cli", "operator", "--liveness", ""],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        log(f"operator started (pid {proc.pid}, log {self.log_path})")
        return proc

    def keep_running(self) -> None:
        code = self.proc.poll()
        if code is not None:
            log(f"operator exited with status {code}; restarting it")
            self.proc = self._start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _drive(env: dict[str, str], operator: SupervisedOperator) -> dict[str, Any]:
    """Play the kubelet until the policy is Ready: run each Job's command once."""
    deadline, done = time.monotonic() + TIMEOUT_S, set()
    api = client.CustomObjectsApi()
    while time.monotonic() < deadline:
        operator.keep_running()
        jobs = {j.metadata.name: j for j in client.BatchV1Api().list_namespaced_job(NAMESPACE).items}
        for name, job in sorted(jobs.items()):
            if name in done:
                continue
            container = job.spec.template.spec.containers[0]
            argv = [*(container.command or []), *(container.args or [])]
            log(f"Job {name}: running `{' '.join(argv)}` locally (no kubelet here)")
            proc = subprocess.run(
                [sys.executable, "-m", "metainfer.agent.cli", *argv[argv.index("agent") :]],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            log(f"Job {name}: exit {proc.returncode}; {proc.stdout.strip().splitlines()[-1] if proc.stdout else ''}")
            done.add(name)
        status = (
            api.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "adaptationpolicies", "digits").get("status")
            or {}
        )
        ready = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        if ready.get("status") == "True":
            return status
        time.sleep(1)
    raise SystemExit(f"[demo] the policy was not Ready after {TIMEOUT_S}s; see .cluster/operator.log")


def _apply_node(name: str, features: tuple[str, ...]) -> None:
    labels = {"kubernetes.io/arch": "amd64", f"{NFD}cpu-model.vendor_id": "Intel", "metainfer.io/demo": "true"}
    labels |= {f"{NFD}cpu-cpuid.{f}": "true" for f in features}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    try:
        client.CoreV1Api().create_node(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        client.CoreV1Api().patch_node(name, {"metadata": {"labels": labels}})


def _apply_policy(model: Path, sha: str, data: Path) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": NAMESPACE},
        "spec": {
            "model": {"uri": f"file://{model}", "sha256": sha, "version": "demo",
                      "data": {"uri": f"file://{data}", "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}},
            "slo": {"latencyP95Ms": 50, "maxQualityDrop": 0.01, "batchSize": 16},
            "hardware": {"nodeSelector": {"metainfer.io/demo": "true"}},
            "search": {"trialBudget": 6, "timeBudgetSeconds": 120, "seed": 0},
        },
    }  # fmt: skip
    api = client.CustomObjectsApi()
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "adaptationpolicies", body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        api.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "adaptationpolicies", "digits", body)


def _deployments() -> list[Any]:
    return client.AppsV1Api().list_namespaced_deployment(NAMESPACE).items


if __name__ == "__main__":
    sys.exit(main())
