"""Canary analysis: promote or roll back a new variant, decided without side effects.

A new variant never replaces the stable one blindly: it first runs as a canary
Deployment beside it (core.control.serving decides that), and the operator's rollout step feeds
this module what Prometheus says about both over the analysis window. All state
is the class's ``RolloutStatus`` (``startedAt`` above all), so a restarted
operator continues the same analysis instead of starting a new one.

Rules, in order:

1. Not in phase Canary: nothing to decide.
2. Before ``analysisWindowSeconds`` have passed since ``startedAt``: wait (the
   window would still contain time before the canary served anything).
3. Metrics unavailable (Prometheus unreachable, erroring, no data for either
   track): never promote; wait, and once ``deadlineSeconds`` have passed roll
   back with ``RolloutTimeout`` and the missing-metrics reason in the message.
4. Canary error ratio > ``maxErrorRate``: roll back.
5. Canary p95 > stable p95 * (1 + ``tolerance``): roll back.
6. Otherwise promote.

The deadline is hard: whatever the metrics, a canary is decided by then.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from metainfer.core.api.conditions import Reason
from metainfer.core.api.policy import RolloutSettings, RolloutStatus
from metainfer.core.api.vocabulary import RolloutPhase
from metainfer.core.control import promql

Action = Literal["none", "wait", "promote", "rollback"]


@dataclass(frozen=True)
class Observation:
    """What Prometheus said over the window; ``unavailable`` (a reason) when any of the three numbers is missing."""

    canary_p95_s: float | None = None
    stable_p95_s: float | None = None
    canary_error_ratio: float | None = None
    unavailable: str | None = None
    message: str = ""

    @property
    def complete(self) -> bool:
        return (
            self.unavailable is None
            and self.canary_p95_s is not None
            and self.stable_p95_s is not None
            and self.canary_error_ratio is not None
        )


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    message: str


def elapsed_s(rollout: RolloutStatus | None, now: dt.datetime) -> float:
    if rollout is None or rollout.started_at is None:
        return 0.0
    return (now - rollout.started_at).total_seconds()


def needs_metrics(rollout: RolloutStatus | None, settings: RolloutSettings, now: dt.datetime) -> bool:
    """Whether a query is worth making: in phase Canary and the analysis window has passed."""
    if rollout is None or rollout.phase != RolloutPhase.CANARY:
        return False
    return elapsed_s(rollout, now) >= min(settings.analysis_window_seconds, settings.deadline_seconds)


def decide(
    rollout: RolloutStatus | None, settings: RolloutSettings, observation: Observation | None, now: dt.datetime
) -> Decision:
    """The next step of a canary; see the module docstring for the rules."""
    if rollout is None or rollout.phase != RolloutPhase.CANARY:
        return Decision("none", "", "")
    elapsed = elapsed_s(rollout, now)
    window, deadline = settings.analysis_window_seconds, settings.deadline_seconds
    if elapsed < window and elapsed < deadline:
        return Decision("wait", Reason.CANARY_PROGRESSING, f"analysing the canary over a {window}s window")
    if observation is None or not observation.complete:
        why = (observation.unavailable if observation else None) or Reason.NO_DATA
        detail = observation.message if observation else "not queried"
        if elapsed >= deadline:
            return Decision(
                "rollback",
                Reason.ROLLOUT_TIMEOUT,
                f"no decision within the {deadline}s deadline: metrics unavailable ({why}: {detail})",
            )
        return Decision("wait", why, f"metrics unavailable, not promoting: {detail}{_until(rollout, deadline)}")
    assert observation.canary_p95_s is not None and observation.stable_p95_s is not None
    assert observation.canary_error_ratio is not None
    canary_ms, stable_ms = observation.canary_p95_s * 1000, observation.stable_p95_s * 1000
    limit_ms = stable_ms * (1 + settings.tolerance)
    measured = f"canary p95 {canary_ms:.3f} ms vs stable {stable_ms:.3f} ms (limit {limit_ms:.3f} ms), " + (
        f"error ratio {observation.canary_error_ratio:.4f} (max {settings.max_error_rate:g})"
    )
    if observation.canary_error_ratio > settings.max_error_rate:
        return Decision("rollback", Reason.CANARY_ERROR_RATE, f"canary error ratio too high: {measured}")
    if canary_ms > limit_ms:
        return Decision("rollback", Reason.CANARY_LATENCY, f"canary slower than stable beyond tolerance: {measured}")
    return Decision("promote", Reason.CANARY_PROMOTED, f"canary within tolerance: {measured}")


def _until(rollout: RolloutStatus, deadline_s: int) -> str:
    """When a canary that gets no metrics is rolled back: a policy whose clients are idle (no requests, so no p95
    for either track) would otherwise only say that it waits. An absolute time, so the status does not change with
    every reconcile while it waits."""
    if rollout.started_at is None:
        return ""
    at = rollout.started_at + dt.timedelta(seconds=deadline_s)
    return f"; rolled back (RolloutTimeout) at {at.astimezone(dt.UTC).isoformat(timespec='seconds')} unless they arrive"


def apply(rollout: RolloutStatus, decision: Decision) -> RolloutStatus:
    """The rollout status after ``decision``: Promoted/RolledBack are terminal, a wait updates reason and message."""
    if decision.action == "none":
        return rollout
    phase = {"promote": RolloutPhase.PROMOTED, "rollback": RolloutPhase.ROLLED_BACK}.get(decision.action, rollout.phase)
    return rollout.model_copy(update={"phase": phase, "reason": decision.reason, "message": decision.message[:4096]})


# --- PromQL ---------------------------------------------------------------------------------------------------------

REQUESTS = "metainfer_inference_requests_total"
ERRORS = "metainfer_inference_errors_total"


def _matchers(policy: str, namespace: str, class_fingerprint: str, variant: str) -> str:
    return (
        f'policy="{promql.escape(policy)}",hardware_class="{promql.escape(class_fingerprint)}",'
        f'variant="{promql.escape(variant)}",namespace=~"{promql.escape_regex(namespace)}|"'
    )


def p95_query(policy: str, namespace: str, class_fingerprint: str, variant: str, window_seconds: int) -> str:
    """p95 in seconds of one variant (recipe key) of the class over the window: canary and stable are told apart."""
    m = _matchers(policy, namespace, class_fingerprint, variant)
    w = promql.window(window_seconds)
    return f"histogram_quantile({promql.QUANTILE}, sum by (le) (rate({promql.METRIC}_bucket{{{m}}}[{w}])))"


def error_ratio_query(policy: str, namespace: str, class_fingerprint: str, variant: str, window_seconds: int) -> str:
    """Errors per request of one variant over the window; no error series at all counts as 0 errors.

    No requests in the window gives NaN (0/0) or no series: NoData, never a promotion.
    """
    m = _matchers(policy, namespace, class_fingerprint, variant)
    w = promql.window(window_seconds)
    return f"(sum(rate({ERRORS}{{{m}}}[{w}])) or vector(0)) / sum(rate({REQUESTS}{{{m}}}[{w}]))"
