"""Latency drift detection: one pure decision per Prometheus sample, with hysteresis and a cooldown.

Why pure: the operator feeds it one p95 per check and writes the returned state
into the policy's class status, so a restarted operator (or the other replica)
continues the count exactly where it stopped, and unit tests replay synthetic
sequences without Prometheus or a cluster.

Rules, per (policy, class):

- A sample *breaches* when its p95 exceeds the SLO by more than the tolerance,
  or exceeds the baseline by more than the tolerance, or (where the policy sets
  ``slo.latencyP99Ms``) its p99 exceeds that bound by more than the tolerance. The baseline is the p95
  measured at adaptation time, raised to the first p95 production reported for
  that variant: the agent times the bare model while production also pays HTTP,
  batching and histogram-bucket resolution, so an adaptation-only baseline
  would see "drift" in a perfectly healthy deployment and re-adapt forever.
- Saturation is not drift: when compute is within tolerance but compute plus
  the wait for a worker (queue p95) is over the SLO, the outcome is
  ``Saturated`` (scale ``serving.replicas``), never counted towards a
  re-adaptation, which could not help.
- ``consecutive_breaches`` breaches in a row confirm drift (one spike never
  does); a good sample resets the count.
- No sample (Prometheus unreachable, erroring, no data) neither counts nor
  resets: the outcome says why, and nothing is ever re-adapted without data.
- After a re-adaptation nothing triggers again for ``cooldown_seconds``; a
  breach that lasts through the cooldown triggers on the first breaching
  sample after it (the count keeps running during the cooldown).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from metainfer.core.api.conditions import Reason
from metainfer.core.api.policy import DriftStatus, ReadaptationSettings

MESSAGE_MAX = 1024  # DriftStatus.message


@dataclass(frozen=True)
class DriftParams:
    """What a check compares against; built from the policy spec and the class's current variant."""

    slo_p95_ms: float
    adapted_p95_ms: float | None
    tolerance: float
    consecutive_breaches: int
    cooldown_seconds: float
    slo_p99_ms: float | None = None

    @classmethod
    def from_settings(
        cls,
        settings: ReadaptationSettings,
        slo_p95_ms: float,
        adapted_p95_ms: float | None,
        slo_p99_ms: float | None = None,
    ) -> DriftParams:
        return cls(
            slo_p95_ms=slo_p95_ms,
            slo_p99_ms=slo_p99_ms,
            adapted_p95_ms=adapted_p95_ms,
            tolerance=settings.drift_tolerance,
            consecutive_breaches=settings.consecutive_breaches,
            cooldown_seconds=settings.cooldown_seconds,
        )


@dataclass(frozen=True)
class Verdict:
    """The new durable state, and whether to re-adapt now (``outcome`` is also ``state.reason``)."""

    state: DriftStatus
    outcome: str
    readapt: bool
    message: str


def observe(
    state: DriftStatus | None,
    p95_ms: float | None,
    params: DriftParams,
    now: dt.datetime,
    *,
    variant: str | None = None,
    unavailable_reason: str = Reason.NO_DATA,
    unavailable_message: str = "",
    p99_ms: float | None = None,
    queue_p95_ms: float | None = None,
) -> Verdict:
    """Fold one check into ``state``. ``variant`` identifies the serving variant (its run name) for the baseline;
    ``p99_ms`` is compared with ``params.slo_p99_ms`` where both exist (the p95 alone decides otherwise)."""
    state = state or DriftStatus()
    if p95_ms is None or not math.isfinite(p95_ms):
        message = unavailable_message or "no p95 sample"
        new = _update(state, last_check_time=now, reason=unavailable_reason, message=message)
        return Verdict(new, unavailable_reason, False, f"{message}; not counted, never re-adapted without data")

    baseline_fields: dict[str, object] = {}
    if variant is not None and state.baseline_variant != variant:
        # A new variant is serving: its first production p95 becomes the baseline, the count starts over.
        baseline_fields = {"baseline_variant": variant, "baseline_p95_ms": p95_ms, "consecutive_breaches": 0}
        state = _update(state, **baseline_fields)
    baseline = max((b for b in (params.adapted_p95_ms, state.baseline_p95_ms) if b is not None), default=None)
    if p99_ms is not None and not math.isfinite(p99_ms):
        p99_ms = None
    breaches = _breaches(p95_ms, params, baseline, p99_ms)
    common: dict[str, object] = {
        "last_check_time": now,
        "last_observed_p95_ms": round(p95_ms, 6),
        "last_observed_p99_ms": round(p99_ms, 6) if p99_ms is not None else None,
    }
    if not breaches:
        queued = queue_p95_ms if queue_p95_ms is not None and math.isfinite(queue_p95_ms) else 0.0
        if p95_ms + queued > params.slo_p95_ms * (1 + params.tolerance):
            message = (
                f"requests wait {queued:.3f} ms for a worker (p95) on top of compute p95 {p95_ms:.3f} ms, over the SLO"
                f" {params.slo_p95_ms:g} ms +{params.tolerance:.0%}: a load matter (scale serving.replicas), not"
                " re-adapted"
            )
            new = _update(state, consecutive_breaches=0, reason=Reason.SATURATED, message=message, **common)
            return Verdict(new, Reason.SATURATED, False, new.message or "")
        new = _update(
            state,
            consecutive_breaches=0,
            reason=Reason.WITHIN_TOLERANCE,
            message=_describe(p95_ms, params, baseline),
            **common,
        )
        return Verdict(new, Reason.WITHIN_TOLERANCE, False, new.message or "")

    count = state.consecutive_breaches + 1
    why = "; ".join(breaches)
    if count < params.consecutive_breaches:
        message = f"{why} ({count}/{params.consecutive_breaches} in a row)"
        new = _update(state, consecutive_breaches=count, reason=Reason.LATENCY_BREACH, message=message, **common)
        return Verdict(new, Reason.LATENCY_BREACH, False, message)
    cooling = _cooldown_left(state, params, now)
    if cooling > 0:
        last = f"{state.last_readaptation_time:%Y-%m-%dT%H:%M:%SZ}"
        message = f"{why} ({count} in a row) but re-adapted at {last}: cooldown, {cooling:.0f}s left"
        new = _update(state, consecutive_breaches=count, reason=Reason.COOLDOWN, message=message, **common)
        return Verdict(new, Reason.COOLDOWN, False, message)
    message = f"{why} ({count} in a row): re-adapting"
    new = _update(
        state,
        consecutive_breaches=0,
        last_readaptation_time=now,
        reason=Reason.LATENCY_DRIFT,
        message=message,
        **common,
    )
    return Verdict(new, Reason.LATENCY_DRIFT, True, message)


def due(state: DriftStatus | None, interval_seconds: float, now: dt.datetime) -> bool:
    """Whether a check is due: never checked, or the last one is ``interval_seconds`` old."""
    return state is None or state.last_check_time is None or seconds_until_due(state, interval_seconds, now) <= 0


def seconds_until_due(state: DriftStatus | None, interval_seconds: float, now: dt.datetime) -> float:
    if state is None or state.last_check_time is None:
        return 0.0
    return interval_seconds - (now - state.last_check_time).total_seconds()


def _breaches(p95_ms: float, params: DriftParams, baseline: float | None, p99_ms: float | None) -> list[str]:
    tol = params.tolerance
    out = []
    if p99_ms is not None and params.slo_p99_ms is not None and p99_ms > params.slo_p99_ms * (1 + tol):
        out.append(f"p99 {p99_ms:.3f} ms > SLO {params.slo_p99_ms:g} ms +{tol:.0%}")
    if p95_ms > params.slo_p95_ms * (1 + tol):
        out.append(f"p95 {p95_ms:.3f} ms > SLO {params.slo_p95_ms:g} ms +{tol:.0%}")
    if baseline is not None and p95_ms > baseline * (1 + tol):
        out.append(f"p95 {p95_ms:.3f} ms > baseline {baseline:.3f} ms +{tol:.0%}")
    return out


def _describe(p95_ms: float, params: DriftParams, baseline: float | None) -> str:
    base = f", baseline {baseline:.3f} ms" if baseline is not None else ""
    return f"p95 {p95_ms:.3f} ms within {params.tolerance:.0%} of SLO {params.slo_p95_ms:g} ms{base}"


def _cooldown_left(state: DriftStatus, params: DriftParams, now: dt.datetime) -> float:
    if state.last_readaptation_time is None:
        return 0.0
    return params.cooldown_seconds - (now - state.last_readaptation_time).total_seconds()


def _update(state: DriftStatus, **changes: object) -> DriftStatus:
    if isinstance(changes.get("message"), str):
        changes["message"] = str(changes["message"])[:MESSAGE_MAX]
    return DriftStatus.model_validate({**state.model_dump(), **changes})
