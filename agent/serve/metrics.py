"""Prometheus metrics of one serving process; the operator's drift and canary checks read them.

Every series carries ``policy``, ``hardware_class`` (the class fingerprint) and
``variant`` (the recipe key and the model's sha256 prefix, from the operator's
``METAINFER_VARIANT``; the recipe key alone when run by hand), so one PromQL ``histogram_quantile`` over
``metainfer_inference_latency_seconds_bucket`` grouped by those labels gives
the p95 per (policy, class, variant) — stable and canary side by side —
without relying on pod labels the scrape config may or may not copy.

A private registry, not the global default: the process exports exactly these
series (plus process/platform collectors), and tests can build several.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from metainfer.core.api.pod_contract import ENV_CLASS, ENV_NAMESPACE, ENV_POLICY, ENV_RECIPE_KEY, ENV_VARIANT

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# ms-scale inference: 0.5 ms .. 10 s, about three buckets per decade, so p95 interpolation stays within ~40%.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
LABELS = ("policy", "hardware_class", "variant")


@dataclass(frozen=True)
class Identity:
    """What the series are labelled with: set by the operator's Deployment env, "local" otherwise."""

    policy: str
    hardware_class: str
    variant: str
    namespace: str

    @classmethod
    def from_env(cls, recipe_key: str) -> Identity:
        env = os.environ
        return cls(
            policy=env.get(ENV_POLICY) or "local",
            hardware_class=env.get(ENV_CLASS) or "local",
            variant=env.get(ENV_VARIANT) or env.get(ENV_RECIPE_KEY) or recipe_key,
            namespace=env.get(ENV_NAMESPACE) or "local",
        )

    def labels(self) -> dict[str, str]:
        return {"policy": self.policy, "hardware_class": self.hardware_class, "variant": self.variant}


class ServingMetrics:
    """The serving series, already bound to this process's identity."""

    def __init__(self, identity: Identity, model_name: str, recipe: str) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        labels = identity.labels()
        self.latency = Histogram(
            "metainfer_inference_latency_seconds",
            "Server-side latency of successful inference requests (read, decode, queue, run, encode), seconds.",
            LABELS, buckets=LATENCY_BUCKETS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.queue_wait = Histogram(
            "metainfer_inference_queue_seconds",
            "Time a request waited for an inference worker (saturation, not the model), seconds.",
            LABELS, buckets=LATENCY_BUCKETS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.compute = Histogram(
            "metainfer_inference_compute_seconds",
            "Time ONNX Runtime spent on a request (the variant on this hardware; what drift reads), seconds.",
            LABELS, buckets=LATENCY_BUCKETS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.batch_rows = Histogram(
            "metainfer_inference_batch_rows",
            "Rows of the ONNX Runtime run a request was part of (dynamic batching combines concurrent requests).",
            LABELS, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self._aborted = Counter(
            "metainfer_inference_aborted_total",
            "Requests that got no answer, by reason (client_disconnect, slow_reader, deadline, drain_timeout).",
            (*LABELS, "reason"), registry=self.registry,
        )  # fmt: skip
        self.requests = Counter(
            "metainfer_inference_requests_total",
            "Inference requests received, whatever their outcome.",
            LABELS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self._errors = Counter(
            "metainfer_inference_errors_total",
            "Inference requests answered with an error, by HTTP status code.",
            (*LABELS, "code"), registry=self.registry,
        )  # fmt: skip
        self._labels = labels
        self.labels = labels
        info = Gauge(
            "metainfer_serving_info",
            "Always 1: what this process serves (model name, namespace, recipe description).",
            (*LABELS, "model", "namespace", "recipe"), registry=self.registry,
        )  # fmt: skip
        info.labels(**labels, model=model_name, namespace=identity.namespace, recipe=recipe).set(1)
        self.batcher_failures = Counter(
            "metainfer_serving_batcher_failures_total",
            "Unexpected exceptions in the batching machinery (a bug; the requests it held were answered 500).",
            LABELS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.runs_stopped_at_drain = Counter(
            "metainfer_serving_runs_stopped_at_drain_total",
            "ONNX Runtime runs still in progress when the drain timed out, stopped so the process could exit.",
            LABELS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.stalled = Gauge(
            "metainfer_serving_stalled",
            "1 while inference cannot make progress (every worker past its deadline, or no dispatcher).",
            LABELS, registry=self.registry,
        ).labels(**labels)  # fmt: skip
        self.ready = Gauge(
            "metainfer_serving_ready", "1 once the variant is loaded and warmed up.", LABELS, registry=self.registry
        ).labels(**labels)

    def error(self, code: int) -> None:
        self._errors.labels(**self._labels, code=str(code)).inc()

    def aborted(self, reason: str, count: int = 1) -> None:
        self._aborted.labels(**self._labels, reason=reason).inc(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
