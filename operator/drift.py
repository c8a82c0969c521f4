"""The drift step of a policy's daemon: query Prometheus per class, fold the p95 into core.control.drift, write status.

Why a step in the policy daemon and not a separate kopf timer: the class list
in the policy status is written as a whole (a JSON merge patch replaces
lists), so two writers of the same status would undo each other's work. One
daemon per policy, reconcile then drift check, serialises them.

Why the policy is read fresh from the API server: kopf's body is a watch-fed
view that may not yet show the status this daemon just wrote; a drift epoch
lost that way would make the reconcile delete the LatencyDrift run it just
created as "superseded".

A confirmed drift is written as ``drift.lastReadaptationTime`` in the class
status, and nothing else: that time salts the run key (core.control.decisions reads it as the class's drift
epoch, core.control.runkey hashes it), so the
next reconcile creates the LatencyDrift run, idempotently and even after a
crash between the two writes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from metainfer.core.api.conditions import Condition, ConditionType, Reason, set_condition
from metainfer.core.api.names import POLICY_PLURAL
from metainfer.core.api.policy import AdaptationPolicySpec, AdaptationPolicyStatus, ClassStatus
from metainfer.core.api.vocabulary import ClassState
from metainfer.core.control import drift, promql
from metainfer.core.control.endpoints import PrometheusEndpoint
from metainfer.operator import api_calls
from metainfer.operator.config import OperatorConfig
from metainfer.operator.metrics import DRIFT_DECISIONS, SERIES
from metainfer.operator.prometheus import MetricsUnavailable, query

UNAVAILABLE = (Reason.PROMETHEUS_UNREACHABLE, Reason.PROMETHEUS_ERROR, Reason.NO_DATA)
QUERY_TIMEOUT_S = 5.0


@dataclass
class DriftStep:
    """What one step did: ``readapt`` names classes whose drift was confirmed; ``next_check_s`` when to come back."""

    readapt: list[str] = field(default_factory=list)
    next_check_s: float | None = None
    policy: dict[str, Any] | None = None  # the policy as stored after this step's status write, if it wrote


async def fetch_policy(namespace: str, name: str) -> dict[str, Any] | None:
    """The policy as the API server has it now (None once deleted)."""
    return await api_calls.get_custom(POLICY_PLURAL, namespace, name)


def eligible(cls: ClassStatus) -> bool:
    """Checked only while serving its best variant with no run in flight: a re-adaptation is already an answer."""
    return cls.state == ClassState.READY and cls.current is not None and bool(cls.current.recipe_key)


async def drift_step(
    body: kopf.Body, policy: dict[str, Any], config: OperatorConfig, logger: logging.Logger, now: dt.datetime
) -> DriftStep:
    """Check every due class of one policy; never raises for Prometheus trouble (that is a status, not an error).

    ``policy`` is the object as last read or written by this reconcile; the step's own status write comes back
    in ``DriftStep.policy`` for the next step, so a reconcile reads the policy once, not once per step.
    """
    namespace, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
    spec = AdaptationPolicySpec.model_validate(policy["spec"])
    settings = spec.readaptation
    if not settings.enabled:
        return DriftStep()
    status = AdaptationPolicyStatus.model_validate(policy.get("status") or {})
    interval = float(settings.check_interval_seconds)
    classes = [c for c in status.classes if eligible(c)]
    due = [c for c in classes if drift.due(c.drift, interval, now)]
    step = DriftStep()
    if due:
        endpoint = config.prometheus_endpoint(settings.prometheus_url)
        results = await asyncio.gather(*(_p95(endpoint, spec, namespace, name, c) for c in due))
        tails = await asyncio.gather(*(_p99(endpoint, spec, namespace, name, c) for c in due))
        queues = await asyncio.gather(*(_queue_p95(endpoint, spec, namespace, name, c) for c in due))
        updated = {c.fingerprint: c for c in status.classes}
        verdicts: list[tuple[ClassStatus, drift.Verdict]] = []
        for cls, result, tail, queue in zip(due, results, tails, queues, strict=True):
            params = drift.DriftParams.from_settings(
                settings, spec.slo.serving_p95_ms, cls.current.p95_ms if cls.current else None, spec.slo.latency_p99_ms
            )
            variant = cls.current.run_name if cls.current else None
            if isinstance(result, MetricsUnavailable):
                verdict = drift.observe(
                    cls.drift, None, params, now, variant=variant,
                    unavailable_reason=result.reason, unavailable_message=result.message,
                )  # fmt: skip
            else:
                p99_ms = tail * 1000.0 if isinstance(tail, float) else None
                queue_ms = queue * 1000.0 if isinstance(queue, float) else None
                verdict = drift.observe(
                    cls.drift, result * 1000.0, params, now, variant=variant, p99_ms=p99_ms, queue_p95_ms=queue_ms
                )
            verdicts.append((cls, verdict))
            if verdict.readapt:
                step.readapt.append(cls.name)
            updated[cls.fingerprint] = ClassStatus.model_validate({**cls.model_dump(), "drift": verdict.state})
        status = status.model_copy(update={"classes": list(updated.values())})
        status = status.model_copy(update={"conditions": _metrics_condition(status, now)})
        status = status.model_copy(update={"conditions": _saturation_condition(status, now)})
        patch = status.to_api()
        stored = await api_calls.patch_status(
            POLICY_PLURAL, namespace, name, {"classes": patch["classes"], "conditions": patch["conditions"]},
            read_at=api_calls.read_at(policy),
        )  # fmt: skip
        for cls, verdict in verdicts:  # once written: a StaleRead checks again, and this verdict never held
            _events(body, cls, verdict, logger)
        step.policy = stored
        classes = [c for c in status.classes if eligible(c)]
    waits = [max(0.0, drift.seconds_until_due(c.drift, interval, now)) for c in classes]
    step.next_check_s = 0.0 if step.readapt else (min(waits) if waits else None)
    return step


async def _p95(
    endpoint: PrometheusEndpoint, spec: AdaptationPolicySpec, namespace: str, name: str, cls: ClassStatus
) -> Any:
    """p95 in seconds, or MetricsUnavailable; nothing here raises."""
    settings = spec.readaptation
    text = promql.p95_query(name, namespace, cls.fingerprint, settings.window_seconds, settings.query)
    return await _sample(endpoint, spec, text)


async def _p99(
    endpoint: PrometheusEndpoint, spec: AdaptationPolicySpec, namespace: str, name: str, cls: ClassStatus
) -> Any:
    """p99 in seconds where the policy bounds it (not with a query override, which returns a p95), else None."""
    settings = spec.readaptation
    if spec.slo.latency_p99_ms is None or settings.query:
        return None
    text = promql.quantile_query(0.99, name, namespace, cls.fingerprint, settings.window_seconds)
    return await _sample(endpoint, spec, text)


async def _queue_p95(
    endpoint: PrometheusEndpoint, spec: AdaptationPolicySpec, namespace: str, name: str, cls: ClassStatus
) -> Any:
    """p95 of the wait for a worker in seconds (for saturation), or None with a query override (whose meaning the
    operator cannot know)."""
    settings = spec.readaptation
    if settings.query:
        return None
    text = promql.quantile_query(0.95, name, namespace, cls.fingerprint, settings.window_seconds, promql.QUEUE_METRIC)
    return await _sample(endpoint, spec, text)


def _saturation_condition(status: AdaptationPolicyStatus, now: dt.datetime) -> list[Condition]:
    """Saturated: True while a checked class's requests wait for workers beyond the SLO with compute within it."""
    checked = [c for c in status.classes if eligible(c) and c.drift is not None and c.drift.reason is not None]
    if not checked:
        return status.conditions
    busy = [c for c in checked if c.drift and c.drift.reason == Reason.SATURATED]
    if busy:
        message = "; ".join(f"{c.name}: {c.drift.message}" for c in busy if c.drift)[:32768]
        return set_condition(
            status.conditions, ConditionType.SATURATED, "True", Reason.SATURATED, message, now=now
        )  # fmt: skip
    return set_condition(
        status.conditions, ConditionType.SATURATED, "False", Reason.NOT_SATURATED,
        "no class waits for serving workers beyond its SLO", now=now,
    )  # fmt: skip


async def _sample(endpoint: PrometheusEndpoint, spec: AdaptationPolicySpec, text: str) -> Any:
    settings = spec.readaptation
    url = endpoint.query_url
    if url is None:
        return MetricsUnavailable(endpoint.reason or Reason.PROMETHEUS_UNREACHABLE, endpoint.refusal or "")
    timeout = min(QUERY_TIMEOUT_S, settings.check_interval_seconds / 2)
    try:
        result = await query(url, text, timeout_s=timeout, credentials_dir=endpoint.credentials_dir)
    except Exception as exc:  # a bug in classification must still fail safe
        return MetricsUnavailable(Reason.PROMETHEUS_ERROR, f"{type(exc).__name__}: {exc}")
    return result if isinstance(result, MetricsUnavailable) else result.value


def _metrics_condition(status: AdaptationPolicyStatus, now: dt.datetime) -> list[Condition]:
    """MetricsAvailable: False (with the first missing class's reason) while any checked class lacks data."""
    checked = [c for c in status.classes if c.drift is not None and c.drift.reason is not None and eligible(c)]
    missing = [c for c in checked if c.drift and c.drift.reason in UNAVAILABLE]
    if not checked:
        return status.conditions
    if missing:
        first = missing[0].drift
        assert first is not None
        message = "MetricsUnavailable, no re-adaptation without data: " + "; ".join(
            f"{c.name}: {c.drift.reason}: {c.drift.message}" for c in missing if c.drift
        )
        return set_condition(
            status.conditions, ConditionType.METRICS_AVAILABLE, "False", first.reason or Reason.NO_DATA,
            message[:32768], now=now,
        )  # fmt: skip
    summary = ", ".join(
        f"{c.name}: p95 {c.drift.last_observed_p95_ms:.3f} ms"
        for c in checked
        if c.drift and c.drift.last_observed_p95_ms
    )
    return set_condition(
        status.conditions, ConditionType.METRICS_AVAILABLE, "True", Reason.METRICS_OK, summary, now=now
    )


def _events(body: kopf.Body, cls: ClassStatus, verdict: drift.Verdict, logger: logging.Logger) -> None:
    """Events for what a person should notice: a confirmed drift, and metrics going missing (once, not per check)."""
    was = cls.drift.reason if cls.drift else None
    if verdict.readapt:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        SERIES.child(DRIFT_DECISIONS, namespace, name, cls.fingerprint, "readapt").inc()
        logger.info("latency drift on class %s: %s", cls.name, verdict.message)
        kopf.event(body, type="Warning", reason=Reason.LATENCY_DRIFT, message=f"class {cls.name}: {verdict.message}")
    elif verdict.outcome in UNAVAILABLE and was not in UNAVAILABLE:
        logger.warning("metrics unavailable for class %s: %s", cls.name, verdict.message)
        kopf.event(
            body, type="Warning", reason=Reason.METRICS_UNAVAILABLE, message=f"class {cls.name}: {verdict.outcome}: "
            f"{verdict.message}"
        )  # fmt: skip
