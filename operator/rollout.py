"""The canary step of a policy's daemon: ask Prometheus for canary vs stable, decide (core.control.canary), write it.

Runs in the same daemon as the reconcile and the drift step, for the same
reason as the drift step: the class list is written as a whole, so one writer
per policy. It writes only ``rollout`` of classes in phase Canary; the next
reconcile acts on it (Promoted: the canary's run becomes the stable one and the
canary Deployment goes; RolledBack: the canary goes, the stable one stays).
Nothing lives in memory: ``rollout.startedAt`` carries the analysis across
operator restarts, so a restarted operator neither restarts nor duplicates it.

Prometheus trouble is a status, never an exception (operator.prometheus
classifies it); without data there is no promotion, and the hard deadline
rolls the canary back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

import kopf

from metainfer.core.api.conditions import Reason
from metainfer.core.api.names import POLICY_PLURAL
from metainfer.core.api.policy import AdaptationPolicySpec, AdaptationPolicyStatus, ClassStatus
from metainfer.core.api.vocabulary import RolloutPhase
from metainfer.core.control import canary
from metainfer.core.control.endpoints import PrometheusEndpoint
from metainfer.operator import api_calls
from metainfer.operator.config import OperatorConfig
from metainfer.operator.drift import QUERY_TIMEOUT_S
from metainfer.operator.metrics import CANARY_DECISIONS, SERIES
from metainfer.operator.prometheus import MetricsUnavailable, query


@dataclass
class RolloutStep:
    """``decided``: classes promoted or rolled back (reconcile at once); ``next_check_s``: when to come back."""

    decided: list[str]
    next_check_s: float | None = None


async def rollout_step(
    body: kopf.Body, policy: dict[str, Any], config: OperatorConfig, logger: logging.Logger, now: dt.datetime
) -> RolloutStep:
    """Analyse every class in phase Canary; never raises for Prometheus trouble.

    ``policy`` is the object as last read or written by this reconcile (see ``drift_step``).
    """
    step = RolloutStep(decided=[])
    namespace, name = policy["metadata"]["namespace"], policy["metadata"]["name"]
    spec = AdaptationPolicySpec.model_validate(policy["spec"])
    settings = spec.rollout
    status = AdaptationPolicyStatus.model_validate(policy.get("status") or {})
    in_canary = [c for c in status.classes if c.rollout is not None and c.rollout.phase == RolloutPhase.CANARY]
    if not in_canary:
        return step
    interval = float(spec.readaptation.check_interval_seconds)
    endpoint = config.prometheus_endpoint(spec.readaptation.prometheus_url)
    changed = False
    updated = {c.fingerprint: c for c in status.classes}
    waits: list[float] = []
    decided: list[tuple[ClassStatus, canary.Decision]] = []
    for cls in in_canary:
        assert cls.rollout is not None
        observation = None
        if canary.needs_metrics(cls.rollout, settings, now):
            observation = await _observe(endpoint, spec, namespace, name, cls)
        decision = canary.decide(cls.rollout, settings, observation, now)
        rollout = canary.apply(cls.rollout, decision)
        if decision.action in ("promote", "rollback"):
            step.decided.append(cls.name)
            decided.append((cls, decision))
        else:
            elapsed = canary.elapsed_s(cls.rollout, now)
            until_window = settings.analysis_window_seconds - elapsed
            until_deadline = settings.deadline_seconds - elapsed
            waits.append(max(0.0, min(until_deadline, until_window if until_window > 0 else interval)))
        if rollout != cls.rollout:
            changed = True
            updated[cls.fingerprint] = ClassStatus.model_validate({**cls.model_dump(), "rollout": rollout.model_dump()})
    if changed:
        patch = status.model_copy(update={"classes": list(updated.values())}).to_api()
        await api_calls.patch_status(
            POLICY_PLURAL, namespace, name, {"classes": patch["classes"]}, read_at=api_calls.read_at(policy)
        )
    # Announced once written: a write refused as planned from an old read (StaleRead) decides again, and the
    # decision was never taken.
    for cls, decision in decided:
        _event(body, cls, decision, logger)
    step.next_check_s = 0.0 if step.decided else (min(waits) if waits else None)
    return step


async def _observe(
    endpoint: PrometheusEndpoint, spec: AdaptationPolicySpec, namespace: str, name: str, cls: ClassStatus
) -> canary.Observation:
    """Canary p95, stable p95 and canary error ratio over the analysis window, or why one is missing."""
    assert cls.rollout is not None and cls.rollout.canary is not None
    url = endpoint.query_url
    if url is None:
        return canary.Observation(
            unavailable=endpoint.reason or Reason.PROMETHEUS_UNREACHABLE, message=endpoint.refusal or ""
        )
    if cls.current is None or not cls.current.recipe_key:
        return canary.Observation(unavailable=Reason.NO_DATA, message="no stable variant to compare with")
    window = spec.rollout.analysis_window_seconds
    # Status written before variants carried the model names them by recipe key, as their metrics do.
    new = cls.rollout.canary.variant or cls.rollout.canary.recipe_key
    old = cls.current.variant or cls.current.recipe_key
    texts = {
        "canary p95": canary.p95_query(name, namespace, cls.fingerprint, new, window),
        "stable p95": canary.p95_query(name, namespace, cls.fingerprint, old, window),
        "canary error ratio": canary.error_ratio_query(name, namespace, cls.fingerprint, new, window),
    }
    timeout = min(QUERY_TIMEOUT_S, spec.readaptation.check_interval_seconds / 2)
    try:
        asked = (query(url, t, timeout_s=timeout, credentials_dir=endpoint.credentials_dir) for t in texts.values())
        results = await asyncio.gather(*asked)
    except Exception as exc:  # a bug in classification must still fail safe
        return canary.Observation(unavailable=Reason.PROMETHEUS_ERROR, message=f"{type(exc).__name__}: {exc}")
    for what, result in zip(texts, results, strict=True):
        if isinstance(result, MetricsUnavailable):
            return canary.Observation(unavailable=result.reason, message=f"{what}: {result.message}")
    # Every MetricsUnavailable returned above, so each result is a sample with a value.
    canary_p95, stable_p95, errors = (r.value for r in results)  # type: ignore[union-attr]  # narrowed above
    return canary.Observation(canary_p95_s=canary_p95, stable_p95_s=stable_p95, canary_error_ratio=errors)


def _event(body: kopf.Body, cls: ClassStatus, decision: canary.Decision, logger: logging.Logger) -> None:
    """Promotion: Normal; rollback: Warning, with the reason and the numbers."""
    message = f"class {cls.name}: {decision.reason}: {decision.message}"
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    outcome = "promoted" if decision.action == "promote" else "rolled_back"
    SERIES.child(CANARY_DECISIONS, namespace, name, cls.fingerprint, outcome, str(decision.reason)).inc()
    if decision.action == "promote":
        logger.info("canary promoted: %s", message)
        kopf.event(body, type="Normal", reason=Reason.CANARY_PROMOTED, message=message)
    else:
        logger.warning("canary rolled back: %s", message)
        kopf.event(body, type="Warning", reason=Reason.CANARY_ROLLED_BACK, message=message)
