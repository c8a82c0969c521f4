"""The operator's own Prometheus metrics (not the serving latency, which the pods export)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RUNS_STARTED = Counter(
    "metainfer_operator_runs_started_total", "Adaptation runs created, by trigger reason.", ["reason"]
)
RUNS_FINISHED = Counter(
    "metainfer_operator_runs_finished_total",
    "Adaptation runs that ended, by outcome and reason.",
    ["outcome", "reason"],
)
RECONCILE_SECONDS = Histogram(
    "metainfer_operator_reconcile_seconds",
    "Wall time of one policy reconcile.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("metainfer_operator_reconcile_errors_total", "Reconciles that raised.", ["kind"])
CLASSES = Gauge("metainfer_operator_policy_classes", "Hardware classes selected per policy.", ["namespace", "policy"])


def serve(port: int) -> None:
    if port:
        start_http_server(port)
