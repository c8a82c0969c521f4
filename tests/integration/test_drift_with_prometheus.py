"""Drift detection end to end: a real Prometheus scrapes a real histogram, the real operator re-adapts.

The serving side is a prometheus_client histogram with the exact name and labels
``metainfer serve`` exports (``metainfer_inference_latency_seconds`` with policy,
hardware_class, variant), served over HTTP from this process, so the test sets
the latency users see: normal, a single spike, a sustained breach. Prometheus
(Debian's binary, on loopback, scraping every second) computes the p95; the
operator process queries it like in a cluster. Timings are printed, not asserted.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import cpu_node_labels, create_node, delete_node, operator_process, policy, run_pending, runs
from operator_harness import wait_for as _wait_for
from prometheus import PrometheusServer, PrometheusUnavailable, find_binary, free_port
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from metainfer.agent.zoo import build_examples
from metainfer.core.api import GROUP, VERSION

pytestmark = pytest.mark.integration  # hack/ is on sys.path via conftest.py

INTERVAL_S = 5  # readaptation.checkIntervalSeconds (the API's minimum)
WINDOW_S = 10  # readaptation.windowSeconds (the API's minimum)
BREACHES = 4  # > window/interval + 1: a spike shorter than one interval can never fill the count
NORMAL_S, SLOW_S = 0.004, 0.1  # SLO 50 ms (+20%): 4 ms is fine, 100 ms breaches
BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


def wait_for(what: str, predicate: Any, timeout: float = 60.0, interval: float = 0.25) -> Any:
    return _wait_for(what, predicate, timeout=timeout, interval=interval)


class FakeServing:
    """What serving pods export: one histogram, fed ~100 observations/s at the latency the test chooses."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.histogram = Histogram(
            "metainfer_inference_latency_seconds",
            "Inference latency (test stand-in for metainfer serve).",
            ["policy", "hardware_class", "variant"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self.labels: tuple[str, str, str] | None = None
        self.latency = NORMAL_S
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _feed(self) -> None:
        while not self._stop.wait(0.02):
            if self.labels is not None:
                child = self.histogram.labels(*self.labels)
                child.observe(self.latency)
                child.observe(self.latency)

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    try:
        return find_binary(lambda m: print(m, file=sys.__stderr__))
    except PrometheusUnavailable as exc:
        pytest.fail(f"drift tests need a real Prometheus: {exc}", pytrace=False)


@pytest.fixture
def serving() -> Iterator[FakeServing]:
    fake = FakeServing()
    yield fake
    fake.close()


@pytest.fixture
def prom(prometheus_binary: Path, serving: FakeServing, tmp_path: Path) -> Iterator[PrometheusServer]:
    server = PrometheusServer(prometheus_binary, tmp_path / "prometheus", [serving.target], scrape_interval_s=1.0)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    built = build_examples(tmp_path_factory.mktemp("models"), ["digits"])["digits"]
    return built.model_path, built.sha256


def drift_policy(namespace: str, model: Path, sha: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": namespace},
        "spec": {
            "model": {"uri": f"file://{model}", "sha256": sha},
            "slo": {"latencyP95Ms": 50, "maxQualityDrop": 0.05, "batchSize": 4},
            "hardware": {"nodeSelector": {"metainfer.io/test": namespace}},
            "search": {"trialBudget": 2, "algorithm": "random", "timeBudgetSeconds": 60},
            # A re-adaptation may find another recipe; no canary here (test_canary_with_prometheus.py).
            "rollout": {"canaryReplicas": 0},
            "readaptation": {
                "checkIntervalSeconds": INTERVAL_S,
                "windowSeconds": WINDOW_S,
                "consecutiveBreaches": BREACHES,
                "driftTolerance": 0.2,
                "cooldownSeconds": 3600,
            },
        },
    }


def klass(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    classes = (policy(api, namespace, "digits").get("status") or {}).get("classes") or [{}]
    return classes[0]


def drift(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    return klass(api, namespace).get("drift") or {}


def metrics_condition(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    conditions = (policy(api, namespace, "digits").get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "MetricsAvailable"), {})


def drift_runs(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    return [r for r in runs(api, namespace) if r["spec"]["reason"] == "LatencyDrift"]


def set_query(api: client.ApiClient, namespace: str, query: str | None) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies", "digits", {"spec": {"readaptation": {"query": query}}}
    )


def test_sustained_breach_readapts_once_spike_and_missing_metrics_never(
    control_plane: Any,
    namespace: str,
    digits: tuple[Path, str],
    serving: FakeServing,
    prom: PrometheusServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = control_plane.api_client
    node = f"{namespace}-avx2-{secrets.token_hex(2)}"
    create_node(api, node, cpu_node_labels(namespace, ("AVX2",)))
    monkeypatch.setenv("METAINFER_PROMETHEUS_URL", prom.url)
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies", drift_policy(namespace, *digits)
    )
    try:
        with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
            # A Ready policy: the first run, played by the agent.
            wait_for("first run", lambda: runs(api, namespace))
            run_pending(control_plane, namespace)
            wait_for("class Ready", lambda: klass(api, namespace).get("state") == "Ready", timeout=60)
            cls = klass(api, namespace)
            serving.labels = ("digits", cls["fingerprint"], cls["current"]["recipeKey"])
            assert os.environ["METAINFER_PROMETHEUS_URL"] == prom.url

            # Normal latency: checked, within tolerance, metrics available.
            wait_for("a good check", lambda: drift(api, namespace).get("reason") == "WithinTolerance", timeout=40)
            assert metrics_condition(api, namespace)["status"] == "True"
            baseline = drift(api, namespace)["baselineP95Ms"]
            print(f"\n[drift] baseline p95 {baseline} ms (adapted {cls['current'].get('p95Ms')} ms)")

            # A single spike (2 s of 100 ms): breaches are seen, but never BREACHES in a row.
            serving.latency = SLOW_S
            time.sleep(2)
            serving.latency = NORMAL_S
            seen = wait_for("the spike seen", lambda: drift(api, namespace).get("reason") == "LatencyBreach", 30)
            assert seen
            wait_for("the count reset", lambda: drift(api, namespace).get("reason") == "WithinTolerance", 40)
            assert not drift_runs(api, namespace), "a single spike re-adapted"

            # Prometheus stopped while latency is bad: MetricsUnavailable with the reason, no re-adaptation.
            prom.stop()
            serving.latency = SLOW_S
            wait_for(
                "PrometheusUnreachable", lambda: drift(api, namespace).get("reason") == "PrometheusUnreachable", 30
            )
            cond = metrics_condition(api, namespace)
            assert cond["status"] == "False" and cond["reason"] == "PrometheusUnreachable", cond
            assert "MetricsUnavailable" in cond["message"]
            time.sleep(INTERVAL_S * (BREACHES + 1))
            assert not drift_runs(api, namespace), "re-adapted without data"
            assert drift(api, namespace)["reason"] == "PrometheusUnreachable"

            # Back to normal, Prometheus back: the count starts from good samples again.
            serving.latency = NORMAL_S
            prom.start()
            time.sleep(WINDOW_S + 1)  # the slow samples scraped before the stop leave the window
            wait_for("good again", lambda: drift(api, namespace).get("reason") == "WithinTolerance", 40)
            assert metrics_condition(api, namespace)["status"] == "True"

            # No traffic: the series exist but the rate is 0, so the p95 is NaN -> NoData.
            labels, serving.labels = serving.labels, None
            wait_for("NoData", lambda: drift(api, namespace).get("reason") == "NoData", 40)
            assert metrics_condition(api, namespace)["reason"] == "NoData"
            serving.labels = labels
            # A policy query Prometheus rejects -> PrometheusError, naming Prometheus' own message.
            set_query(api, namespace, "histogram_quantile(0.95, {policy}")
            wait_for("PrometheusError", lambda: drift(api, namespace).get("reason") == "PrometheusError", 40)
            assert "bad_data" in drift(api, namespace)["message"], drift(api, namespace)
            set_query(api, namespace, None)
            wait_for("good again", lambda: drift(api, namespace).get("reason") == "WithinTolerance", 40)
            assert not drift_runs(api, namespace)

            # A sustained breach: exactly one LatencyDrift run.
            serving.latency = SLOW_S
            started = time.monotonic()
            new = wait_for("a LatencyDrift run", lambda: drift_runs(api, namespace), timeout=120, interval=0.1)
            elapsed = time.monotonic() - started
            print(
                f"[drift] sustained breach -> LatencyDrift run {new[0]['metadata']['name']} in {elapsed:.1f}s "
                f"(window {WINDOW_S}s, interval {INTERVAL_S}s, {BREACHES} breaches, scrape 1s)"
            )
            (tmp_path.parent / "drift-timing.txt").write_text(f"{elapsed:.2f} {WINDOW_S} {INTERVAL_S} {BREACHES}\n")
            assert len(new) == 1
            wait_for("class Adapting (LatencyDrift)", lambda: klass(api, namespace).get("reason") == "LatencyDrift", 10)
            time.sleep(INTERVAL_S * (BREACHES + 1))  # still breaching: the run in flight is the answer
            assert len(drift_runs(api, namespace)) == 1

            # The re-adaptation finishes and the breach goes on: the cooldown holds.
            run_pending(control_plane, namespace)
            wait_for("Ready again", lambda: klass(api, namespace).get("state") == "Ready", timeout=60)
            cls = klass(api, namespace)
            serving.labels = ("digits", cls["fingerprint"], cls["current"]["recipeKey"])
            wait_for("cooldown", lambda: drift(api, namespace).get("reason") == "Cooldown", timeout=60)
            assert len(drift_runs(api, namespace)) == 1
            assert len(runs(api, namespace)) == 2
            assert "Traceback" not in op.output(), op.output()[-3000:]
    finally:
        delete_node(api, node)
