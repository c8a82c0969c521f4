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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from drift_harness import condition, drift, drift_checks, drift_runs, metrics_condition
from kubernetes import client
from operator_harness import Nodes, apply_policy, klass, make_policy, operator_process, run_pending, runs, wait_for
from serve_harness import ServingMetrics

from hack.prometheus import PrometheusServer
from metainfer.core.api import GROUP, VERSION

INTERVAL_S = 5  # readaptation.checkIntervalSeconds (the API's minimum)
WINDOW_S = 10  # readaptation.windowSeconds (the API's minimum)
BREACHES = 4  # > window/interval + 1: a spike shorter than one interval can never fill the count
NORMAL_S, SLOW_S = 0.004, 0.1  # SLO 50 ms (+20%): 4 ms is fine, 100 ms breaches


class FakeServing(ServingMetrics):
    """Serving pods of one variant: ~100 observations/s at the latency the test chooses, once ``labels`` are set."""

    def __init__(self) -> None:
        super().__init__(interval_s=0.02)
        self.labels: tuple[str, str, str] | None = None
        self.latency = NORMAL_S
        self.queue_wait = 0.0

    def tick(self) -> None:
        if self.labels is not None:
            for _ in range(2):
                self.observe(self.labels, self.latency, self.queue_wait)


@pytest.fixture
def serving() -> Iterator[FakeServing]:
    with FakeServing() as fake:
        yield fake


def drift_policy(namespace: str, model: Path, sha: str) -> dict[str, Any]:
    # A re-adaptation may find another recipe; no canary here (test_canary_with_prometheus.py).
    return make_policy(
        namespace, "digits", model, sha, latency_p95_ms=50, **drift_checks(INTERVAL_S, WINDOW_S, BREACHES, 0.2)
    )


def set_query(api: client.ApiClient, namespace: str, query: str | None) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies", "digits", {"spec": {"readaptation": {"query": query}}}
    )


def test_sustained_breach_readapts_once_spike_and_missing_metrics_never(
    control_plane: Any,
    namespace: str,
    nodes: Nodes,
    digits_file: tuple[Path, str],
    serving: FakeServing,
    prometheus: Callable[[list[str]], PrometheusServer],
    tmp_path: Path,
) -> None:
    api = control_plane.api_client
    prom = prometheus([serving.target])
    nodes.add(("AVX2",))
    apply_policy(api, drift_policy(namespace, *digits_file))
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
        wait_for("PrometheusUnreachable", lambda: drift(api, namespace).get("reason") == "PrometheusUnreachable", 30)
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

        # A load surge on unchanged hardware: requests wait 100 ms for a worker, compute stays at 4 ms. Saturated
        # (a scaling matter, on the class and as a policy condition), and never a re-adaptation.
        serving.queue_wait = SLOW_S
        wait_for("Saturated", lambda: drift(api, namespace).get("reason") == "Saturated", 40)
        assert condition(api, namespace, "Saturated")["status"] == "True"
        time.sleep(INTERVAL_S * (BREACHES + 1))
        assert drift(api, namespace)["reason"] == "Saturated" and not drift_runs(api, namespace), "load re-adapted"
        serving.queue_wait = 0.0
        wait_for("good again", lambda: drift(api, namespace).get("reason") == "WithinTolerance", 40)
        assert condition(api, namespace, "Saturated")["status"] == "False"

        # A sustained breach of compute (the hardware got slower): exactly one LatencyDrift run.
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
