"""The operator's own Prometheus metrics (not the serving latency, which the pods export).

Per-policy series carry ``namespace`` and ``policy`` (the policy's, like the serving pods' series, so alerts
join them without relabelling; the chart's ServiceMonitor honours these labels), per-class ones also
``hardware_class`` (the class fingerprint, as the serving pods label theirs). Cardinality is bounded by the
cluster's objects: policies x their classes x small enums (triggers, reasons, states). Every series of a policy
is removed when its daemon ends (the policy was deleted, or this replica stopped acting), so deleted policies
leave nothing behind.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

from metainfer.core.api.vocabulary import ClassState

POLICY = ["namespace", "policy"]
CLASS = [*POLICY, "hardware_class"]

RUNS_STARTED = Counter(
    "metainfer_operator_runs_started_total", "Adaptation runs created, by trigger.", [*CLASS, "trigger"]
)
RUNS_FINISHED = Counter(
    "metainfer_operator_runs_finished_total",
    "Adaptation runs that ended, by outcome and reason.",
    [*CLASS, "outcome", "reason"],
)
CANARY_DECISIONS = Counter(
    "metainfer_operator_canary_decisions_total",
    "Canary rollouts decided, by decision (promoted, rolled_back) and reason.",
    [*CLASS, "decision", "reason"],
)
DRIFT_DECISIONS = Counter(
    "metainfer_operator_drift_decisions_total",
    "Latency drift checks that confirmed a drift and started a re-adaptation.",
    [*CLASS, "decision"],
)
RECONCILE_SECONDS = Histogram(
    "metainfer_operator_reconcile_seconds",
    "Wall time of one policy reconcile.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("metainfer_operator_reconcile_errors_total", "Reconciles that raised.", ["kind"])
CLASSES = Gauge("metainfer_operator_policy_classes", "Hardware classes selected per policy.", POLICY)
SLO_LATENCY = Gauge(
    "metainfer_policy_slo_latency_seconds",
    "A policy's latency SLO per batch (spec.slo), by quantile (0.95; 0.99 where set).",
    [*POLICY, "quantile"],
)
SLO_QUALITY_DROP = Gauge(
    "metainfer_policy_slo_max_quality_drop",
    "A policy's accepted quality drop vs FP32 (spec.slo.maxQualityDrop).",
    POLICY,
)
CLASS_INFO = Gauge(
    "metainfer_policy_class_info",
    "1 per hardware class of a policy, with the class in words (for legends: join on hardware_class).",
    [*CLASS, "vendor", "product", "driver", "description"],
)
CLASS_STATE = Gauge(
    "metainfer_policy_class_state", "1 for the state a policy's class is in, 0 for the others.", [*CLASS, "state"]
)
CLASS_SERVED_P95 = Gauge(
    "metainfer_policy_class_served_p95_seconds",
    "p95 per batch of the variant a class serves, as measured when it was adapted.",
    CLASS,
)


class PolicySeries:
    """Which labelled series belong to which policy, so a policy's series go when it goes."""

    def __init__(self) -> None:
        self._owned: defaultdict[tuple[str, str], set[tuple[MetricWrapperBase, tuple[str, ...]]]] = defaultdict(set)
        self._published: dict[tuple[str, str], Any] = {}

    def unchanged(self, namespace: str, policy: str, published: Any) -> bool:
        """Whether ``published`` (what a policy's series were last set from) is what they were set from last time;
        remembers it otherwise. Setting 10 series per class on every reconcile was 6 of 312 profiled seconds."""
        if self._published.get((namespace, policy)) == published:
            return True
        self._published[(namespace, policy)] = published
        return False

    def child(self, metric: MetricWrapperBase, namespace: str, policy: str, *rest: str) -> Any:
        values = (namespace, policy, *rest)
        self._owned[(namespace, policy)].add((metric, values))
        return metric.labels(*values)

    def keep_only(
        self, metric: MetricWrapperBase, namespace: str, policy: str, keep: Iterable[tuple[str, ...]]
    ) -> None:
        """Remove the policy's series of ``metric`` whose labels are not in ``keep`` (a class went away)."""
        wanted = {(namespace, policy, *rest) for rest in keep}
        owned = self._owned[(namespace, policy)]
        for entry in [e for e in owned if e[0] is metric and e[1] not in wanted]:
            owned.discard(entry)
            _remove(metric, entry[1])

    def forget(self, namespace: str, policy: str) -> None:
        self._published.pop((namespace, policy), None)
        for metric, values in self._owned.pop((namespace, policy), set()):
            _remove(metric, values)


def _remove(metric: MetricWrapperBase, values: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never set, or already gone
        metric.remove(*values)


SERIES = PolicySeries()


def publish_policy(namespace: str, policy: str, spec: Mapping[str, Any], status: Mapping[str, Any]) -> None:
    """The policy's SLO and each class's identity, state and served p95, from the spec and the status just planned."""
    slo = spec.get("slo") or {}
    read = [
        (
            c.get("fingerprint"),
            _frozen(c.get("hardwareClass") or {}),
            c.get("state"),
            (c.get("current") or {}).get("p95Ms"),
        )
        for c in status.get("classes") or []
    ]
    if SERIES.unchanged(namespace, policy, (_frozen(slo), tuple(read))):
        return
    # A decoder's serving series are per output token: its bound there is slo.decoder.timePerOutputTokenP95Ms, and
    # a decoder policy without one exports no SLO line (0 would put every request over it).
    p95 = slo.get("latencyP95Ms") or (slo.get("decoder") or {}).get("timePerOutputTokenP95Ms")
    if p95 is not None:
        SERIES.child(SLO_LATENCY, namespace, policy, "0.95").set(float(p95) / 1000)
    p99 = slo.get("latencyP99Ms")
    if p99 is not None:
        SERIES.child(SLO_LATENCY, namespace, policy, "0.99").set(float(p99) / 1000)
    kept = [*([("0.95",)] if p95 is not None else []), *([("0.99",)] if p99 is not None else [])]
    SERIES.keep_only(SLO_LATENCY, namespace, policy, kept)
    SERIES.child(SLO_QUALITY_DROP, namespace, policy).set(float(slo.get("maxQualityDrop", 0.01)))
    info, states, served = [], [], []
    for cls in status.get("classes") or []:
        fp = str(cls.get("fingerprint", ""))
        hardware = cls.get("hardwareClass") or {}
        labels = (
            fp,
            str(hardware.get("vendor", "")),
            str(hardware.get("product", "")),
            str(hardware.get("driverVersion") or ""),
            _describe(hardware, fp),
        )
        SERIES.child(CLASS_INFO, namespace, policy, *labels).set(1)
        info.append(labels)
        for state in ClassState:
            SERIES.child(CLASS_STATE, namespace, policy, fp, str(state)).set(1 if cls.get("state") == state else 0)
            states.append((fp, str(state)))
        p95_ms = (cls.get("current") or {}).get("p95Ms")
        if p95_ms is not None:
            SERIES.child(CLASS_SERVED_P95, namespace, policy, fp).set(float(p95_ms) / 1000)
            served.append((fp,))
    SERIES.keep_only(CLASS_INFO, namespace, policy, info)
    SERIES.keep_only(CLASS_STATE, namespace, policy, states)
    SERIES.keep_only(CLASS_SERVED_P95, namespace, policy, served)


def _frozen(value: Any) -> Any:
    """A hashable, comparable copy of a JSON value (the status and spec are live dicts the next reconcile reuses)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _describe(hardware: Mapping[str, Any], fingerprint: str) -> str:
    from pydantic import ValidationError

    from metainfer.core.api.hardwareclass import HardwareClass

    try:
        return HardwareClass.model_validate(hardware).description()
    except ValidationError:
        return fingerprint


def serve(port: int) -> None:
    if port:
        start_http_server(port)
