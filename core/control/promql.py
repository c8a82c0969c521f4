"""The PromQL that turns the serving histograms into one p95 per (policy, class).

Serving pods export ``metainfer_inference_latency_seconds`` (the server-side
total) and its parts ``metainfer_inference_compute_seconds`` (ONNX Runtime: the
variant on this hardware) and ``metainfer_inference_queue_seconds`` (waiting
for a worker: load), histograms in seconds labelled ``policy``,
``hardware_class`` (the class fingerprint) and ``variant`` (the recipe key).
Drift is decided on compute: a traffic surge queues requests without changing
the hardware, and re-adapting cannot help it (the queue is reported apart, as
saturation). The default query aggregates every pod and
variant of the class (stable and canary alike: what users of that class get)
and filters on ``namespace`` only where the scrape added one: Prometheus'
usual Kubernetes pod scrape config copies the pod's namespace into a
``namespace`` label, a static scrape config does not, and ``=~"ns|"`` matches
both (an absent label reads as ""). Policies may replace the whole query.

Pure text manipulation: the placeholders are replaced literally, never with
``str.format``, because PromQL itself is full of braces.
"""

from __future__ import annotations

import re

METRIC = "metainfer_inference_latency_seconds"  # what users get: canary comparisons and SLO alerts
COMPUTE_METRIC = "metainfer_inference_compute_seconds"  # the variant on the hardware: drift
QUEUE_METRIC = "metainfer_inference_queue_seconds"  # waiting for a worker: saturation
QUANTILE = 0.95
PLACEHOLDERS = ("{policy}", "{namespace}", "{class}", "{window}")
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def window(seconds: int) -> str:
    """A PromQL duration for a range selector."""
    return f"{int(seconds)}s"


def escape(value: str) -> str:
    """``value`` inside a double-quoted PromQL string."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_regex(value: str) -> str:
    """``value`` as a literal in a double-quoted RE2 regex matcher."""
    return escape(_RE2_SPECIAL.sub(r"\\\1", value))


def p95_query(
    policy: str, namespace: str, class_fingerprint: str, window_seconds: int, override: str | None = None
) -> str:
    """The instant query whose single result is the p95 compute latency in seconds over the last ``window_seconds``
    (a policy's own query replaces it)."""
    if override:
        return substitute(override, policy, namespace, class_fingerprint, window_seconds)
    return quantile_query(QUANTILE, policy, namespace, class_fingerprint, window_seconds)


def quantile_query(
    quantile: float,
    policy: str,
    namespace: str,
    class_fingerprint: str,
    window_seconds: int,
    metric: str = COMPUTE_METRIC,
) -> str:
    """The instant query whose single result is the ``quantile`` of ``metric`` in seconds over ``window_seconds``."""
    matchers = (
        f'policy="{escape(policy)}",hardware_class="{escape(class_fingerprint)}",'
        f'namespace=~"{escape_regex(namespace)}|"'
    )
    return (
        f"histogram_quantile({quantile:g}, sum by (le) (rate({metric}_bucket{{{matchers}}}[{window(window_seconds)}])))"
    )


def substitute(template: str, policy: str, namespace: str, class_fingerprint: str, window_seconds: int) -> str:
    """A policy's own query with ``{policy}``, ``{namespace}``, ``{class}`` (fingerprint) and ``{window}`` filled in."""
    values = {
        "{policy}": escape(policy),
        "{namespace}": escape(namespace),
        "{class}": escape(class_fingerprint),
        "{window}": window(window_seconds),
    }
    return re.sub("|".join(re.escape(p) for p in PLACEHOLDERS), lambda m: values[m.group(0)], template)
