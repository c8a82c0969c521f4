"""Canary rollout end to end: a real Prometheus compares two variants, the real operator promotes or rolls back.

The serving side is two stand-ins for ``metainfer serve`` pods in one process:
the latency histogram and request/error counters with the exact names and
labels serve exports, one label set per variant (recipe key), so the test sets
what users of the stable and of the canary see. Prometheus (Debian's binary, on
loopback, scraping every second) computes p95s and error ratios; the operator
queries it like in a cluster. The runs' results are written the way the agent
writes them, with recipes the test chooses, so the canary's variant really
differs from the stable one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import Nodes, apply_policy, deployments, klass, make_policy, operator_process, runs, wait_for
from prometheus_client import Counter
from serve_harness import LABELS, ServingMetrics

from hack.prometheus import PrometheusServer
from metainfer.core.api import GROUP, VERSION
from metainfer.core.api.names import LABEL_RUN, LABEL_TRACK
from metainfer.core.engine.recipe import Recipe

WINDOW_S = 30  # rollout.analysisWindowSeconds (the API's minimum)
INTERVAL_S = 5  # the check cadence: readaptation.checkIntervalSeconds (the API's minimum)
SHA = "a" * 64


class Variants(ServingMetrics):
    """Serving pods of several variants: per variant a latency and an error ratio, ~100 requests/s each."""

    def __init__(self) -> None:
        super().__init__(interval_s=0.01)
        self.requests = Counter("metainfer_inference_requests_total", "stand-in", LABELS, registry=self.registry)
        self.errors = Counter("metainfer_inference_errors_total", "stand-in", [*LABELS, "code"], registry=self.registry)
        self.serving: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._ticks = 0

    def serve(self, labels: tuple[str, str, str], latency_s: float, error_ratio: float = 0.0) -> None:
        with self._lock:
            self.serving[labels] = (latency_s, error_ratio)

    def tick(self) -> None:
        self._ticks += 1
        with self._lock:
            serving = dict(self.serving)
        for labels, (latency, error_ratio) in serving.items():
            self.requests.labels(*labels).inc()
            if error_ratio and self._ticks % max(1, round(1 / error_ratio)) == 0:
                self.errors.labels(*labels, "500").inc()
            else:
                self.observe(labels, latency)


@pytest.fixture
def variants() -> Iterator[Variants]:
    with Variants() as fake:
        yield fake


def canary_policy(namespace: str) -> dict[str, Any]:
    """The runs' results are written by the test (``succeed``), so the model is never read."""
    return make_policy(
        namespace, "digits", Path("/nonexistent/digits.onnx"), SHA,
        latency_p95_ms=50,
        search={"trialBudget": 2, "algorithm": "random", "timeBudgetSeconds": 60, "seed": 0},
        serving={"replicas": 2},
        rollout={
            "canaryReplicas": 1,
            "analysisWindowSeconds": WINDOW_S,
            "tolerance": 0.2,
            "maxErrorRate": 0.05,
            "deadlineSeconds": 120,
        },
        # Drift checks off (the canary step keeps the same cadence): the test is about the canary alone.
        readaptation={"enabled": False, "checkIntervalSeconds": INTERVAL_S},
    )  # fmt: skip


def rollout(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    return klass(api, namespace).get("rollout") or {}


def succeed(api: client.ApiClient, namespace: str, threads: int) -> tuple[str, str]:
    """The one unfinished run succeeds with a recipe of ``threads`` threads, written as the agent writes results;
    returns the run's name and its variant (the serving metrics' ``variant`` label: recipe key and model)."""
    run = wait_for(
        "an unfinished run",
        lambda: next((r for r in runs(api, namespace) if (r.get("status") or {}).get("phase") != "Succeeded"), None),
    )
    recipe = Recipe.model_validate({"session": {"intra_op_num_threads": threads}})
    status = {
        "phase": "Succeeded",
        "bestRecipe": recipe.model_dump(mode="json"),
        "bestRecipeKey": recipe.key(),
        "bestMetrics": {"p95Ms": 4.0, "qualityDrop": 0.0},
        "completionTime": "2026-01-01T00:30:00Z",
    }
    name = run["metadata"]["name"]
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "adaptationruns", name, {"status": status}
    )
    return name, f"{recipe.key()}-{run['spec']['modelSha256'][:8]}"


def readapt(api: client.ApiClient, namespace: str, seed: int) -> None:
    """A spec change (the search seed) makes a new run for the class."""
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies", "digits", {"spec": {"search": {"seed": seed}}}
    )


def by_track(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    return {d.metadata.labels.get(LABEL_TRACK): d for d in deployments(api, namespace)}


def events(api: client.ApiClient, namespace: str, reason: str) -> list[Any]:
    return [e for e in client.CoreV1Api(api).list_namespaced_event(namespace).items if e.reason == reason]


def test_canary_promoted_then_rolled_back_across_an_operator_restart(
    control_plane: Any,
    namespace: str,
    nodes: Nodes,
    variants: Variants,
    prometheus: Callable[[list[str]], PrometheusServer],
    tmp_path: Path,
) -> None:
    api = control_plane.api_client
    prometheus([variants.target])  # the operator reads the canary's and the stable's series from it
    nodes.add(("AVX2",))
    apply_policy(api, canary_policy(namespace))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        # The first variant goes straight to the stable Deployment: nothing to compare it with.
        first, key_a = succeed(api, namespace, threads=1)
        wait_for("class Ready", lambda: klass(api, namespace).get("state") == "Ready")
        assert set(by_track(api, namespace)) == {"stable"}
        fp = klass(api, namespace)["fingerprint"]
        variants.serve(("digits", fp, key_a), 0.004)

        # A second variant (same speed): a canary beside the untouched stable one, then promoted.
        readapt(api, namespace, seed=1)
        second, key_b = succeed(api, namespace, threads=2)
        assert key_b != key_a
        wait_for("phase Canary", lambda: rollout(api, namespace).get("phase") == "Canary")
        started = rollout(api, namespace)["startedAt"]
        tracks = wait_for("canary Deployment", lambda: (t := by_track(api, namespace)) and "canary" in t and t)
        assert tracks["stable"].metadata.labels[LABEL_RUN] == first
        assert tracks["canary"].metadata.labels[LABEL_RUN] == second and tracks["canary"].spec.replicas == 1
        assert klass(api, namespace)["state"] == "RollingOut"
        variants.serve(("digits", fp, key_b), 0.0045)

        # SIGKILL mid-analysis, restart: the same analysis goes on (same start, one canary, no new run).
        time.sleep(INTERVAL_S)
        op.kill()
        time.sleep(2)
        op.start()
        time.sleep(INTERVAL_S)
        assert rollout(api, namespace)["phase"] == "Canary" and rollout(api, namespace)["startedAt"] == started
        assert len(deployments(api, namespace)) == 2 and len(runs(api, namespace)) == 2
        t0 = time.monotonic()
        wait_for("Promoted", lambda: rollout(api, namespace).get("phase") == "Promoted", timeout=WINDOW_S + 60)
        print(f"\n[canary] promoted {time.monotonic() - t0:.1f}s after the restart (window {WINDOW_S}s)")
        assert rollout(api, namespace)["startedAt"] == started
        wait_for("canary deleted", lambda: set(by_track(api, namespace)) == {"stable"}, timeout=30)
        assert by_track(api, namespace)["stable"].metadata.labels[LABEL_RUN] == second
        wait_for("Ready on the new variant", lambda: klass(api, namespace).get("state") == "Ready", timeout=30)
        assert klass(api, namespace)["current"]["variant"] == key_b
        assert "CanaryPromoted" in rollout(api, namespace)["reason"]
        wait_for("a CanaryPromoted event", lambda: events(api, namespace, "CanaryPromoted"), timeout=10)

        # A third variant, five times slower than the stable: rolled back with the reason, stable kept.
        readapt(api, namespace, seed=2)
        third, key_c = succeed(api, namespace, threads=3)
        wait_for("phase Canary again", lambda: rollout(api, namespace).get("canary", {}).get("runName") == third)
        variants.serve(("digits", fp, key_c), 0.02)
        wait_for("RolledBack", lambda: rollout(api, namespace).get("phase") == "RolledBack", timeout=WINDOW_S + 60)
        status = rollout(api, namespace)
        assert status["reason"] == "CanaryLatency" and "canary p95" in status["message"], status
        wait_for("canary deleted", lambda: set(by_track(api, namespace)) == {"stable"}, timeout=30)
        assert by_track(api, namespace)["stable"].metadata.labels[LABEL_RUN] == second
        assert klass(api, namespace)["current"]["variant"] == key_b
        warning = wait_for("a CanaryRolledBack event", lambda: events(api, namespace, "CanaryRolledBack"), 10)
        assert warning[0].type == "Warning" and "CanaryLatency" in warning[0].message
        time.sleep(INTERVAL_S)  # and it stays rolled back: the slow run is never retried as a canary
        assert set(by_track(api, namespace)) == {"stable"} and rollout(api, namespace)["phase"] == "RolledBack"
        assert len(runs(api, namespace)) == 3
        assert "Traceback" not in op.output(), op.output()[-3000:]
