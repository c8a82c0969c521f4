"""core.control.canary: the pure promote / roll back decision, and its PromQL."""

from __future__ import annotations

import datetime as dt

from metainfer.core.api.policy import RolloutSettings, RolloutStatus, VariantSummary
from metainfer.core.api.vocabulary import Reason
from metainfer.core.control import canary

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SETTINGS = RolloutSettings(analysis_window_seconds=60, tolerance=0.1, max_error_rate=0.01, deadline_seconds=600)
IN_CANARY = RolloutStatus(phase="Canary", canary=VariantSummary(recipe_key="new", run_name="r2"), started_at=T0)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def seen(canary_ms: float, stable_ms: float = 10.0, errors: float = 0.0) -> canary.Observation:
    return canary.Observation(canary_p95_s=canary_ms / 1000, stable_p95_s=stable_ms / 1000, canary_error_ratio=errors)


def test_promotes_within_tolerance_after_the_window() -> None:
    d = canary.decide(IN_CANARY, SETTINGS, seen(10.9), at(61))
    assert d.action == "promote" and d.reason == "CanaryPromoted" and "10.900 ms" in d.message
    after = canary.apply(IN_CANARY, d)
    assert after.phase == "Promoted" and after.started_at == T0 and after.canary == IN_CANARY.canary


def test_waits_for_the_window_even_with_good_numbers() -> None:
    assert not canary.needs_metrics(IN_CANARY, SETTINGS, at(59))
    assert canary.decide(IN_CANARY, SETTINGS, seen(5.0), at(59)).action == "wait"
    assert canary.needs_metrics(IN_CANARY, SETTINGS, at(60))


def test_rolls_back_on_latency() -> None:
    d = canary.decide(IN_CANARY, SETTINGS, seen(11.1), at(61))
    assert (d.action, d.reason) == ("rollback", Reason.CANARY_LATENCY)
    assert canary.apply(IN_CANARY, d).phase == "RolledBack"


def test_rolls_back_on_errors_even_when_fast() -> None:
    d = canary.decide(IN_CANARY, SETTINGS, seen(5.0, errors=0.02), at(61))
    assert (d.action, d.reason) == ("rollback", Reason.CANARY_ERROR_RATE)
    assert canary.decide(IN_CANARY, SETTINGS, seen(5.0, errors=0.01), at(61)).action == "promote"


def test_no_data_waits_then_the_deadline_rolls_back() -> None:
    missing = canary.Observation(unavailable="NoData", message="canary p95: p95 is NaN")
    d = canary.decide(IN_CANARY, SETTINGS, missing, at(300))
    assert (d.action, d.reason) == ("wait", "NoData") and "not promoting" in d.message
    # When it gives up, as a time that stays the same while it waits (no status write per reconcile).
    assert d.message.endswith("rolled back (RolloutTimeout) at 2026-01-01T00:10:00+00:00 unless they arrive")
    assert canary.decide(IN_CANARY, SETTINGS, missing, at(400)).message == d.message
    assert canary.decide(IN_CANARY, SETTINGS, None, at(300)).action == "wait"
    d = canary.decide(IN_CANARY, SETTINGS, missing, at(600))
    assert (d.action, d.reason) == ("rollback", "RolloutTimeout") and "NoData" in d.message
    partial = canary.Observation(canary_p95_s=0.001, stable_p95_s=None, canary_error_ratio=0.0)
    assert canary.decide(IN_CANARY, SETTINGS, partial, at(61)).action == "wait"


def test_deadline_before_window_is_still_hard() -> None:
    slow = RolloutSettings(analysis_window_seconds=3600, deadline_seconds=600)
    assert canary.decide(IN_CANARY, slow, None, at(599)).action == "wait"
    assert canary.needs_metrics(IN_CANARY, slow, at(600))
    assert canary.decide(IN_CANARY, slow, seen(5.0), at(600)).action == "promote"
    assert canary.decide(IN_CANARY, slow, None, at(600)).action == "rollback"


def test_idempotent_terminal_phases_and_restart() -> None:
    done = canary.apply(IN_CANARY, canary.decide(IN_CANARY, SETTINGS, seen(10.0), at(61)))
    for later in (at(61), at(10_000)):
        assert canary.decide(done, SETTINGS, seen(50.0), later).action == "none"
        assert canary.apply(done, canary.decide(done, SETTINGS, seen(50.0), later)) == done
    assert canary.decide(None, SETTINGS, None, at(1)).action == "none"
    # A restarted operator decides from the durable status alone: same inputs, same answer, same window.
    again = RolloutStatus.model_validate(IN_CANARY.to_api())
    assert canary.decide(again, SETTINGS, seen(10.9), at(61)) == canary.decide(IN_CANARY, SETTINGS, seen(10.9), at(61))
    waiting = canary.decide(IN_CANARY, SETTINGS, None, at(10))
    assert canary.apply(IN_CANARY, waiting) == canary.apply(canary.apply(IN_CANARY, waiting), waiting)


def test_queries_select_one_variant() -> None:
    p95 = canary.p95_query("digits", "ns", "fp1", "key-a", 60)
    assert 'variant="key-a"' in p95 and 'policy="digits"' in p95 and "[60s]" in p95
    assert p95.startswith("histogram_quantile(0.95,")
    ratio = canary.error_ratio_query("digits", "ns", "fp1", "key-a", 60)
    assert "metainfer_inference_errors_total" in ratio and "or vector(0)" in ratio
    assert "metainfer_inference_requests_total" in ratio
