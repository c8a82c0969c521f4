"""core.control.drift on synthetic p95 sequences: hysteresis, reset, cooldown, baseline, no-data, JSON round trip."""

from __future__ import annotations

import datetime as dt
import json

from metainfer.core.api.conditions import Reason
from metainfer.core.api.policy import DriftStatus, ReadaptationSettings
from metainfer.core.control.drift import DriftParams, due, observe

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
PARAMS = DriftParams(slo_p95_ms=10.0, adapted_p95_ms=4.0, tolerance=0.2, consecutive_breaches=3, cooldown_seconds=600)


def play(samples: list[float | None], params: DriftParams = PARAMS, state: DriftStatus | None = None,
         step_s: float = 60, start: dt.datetime = T0) -> tuple[list[str], DriftStatus | None]:  # fmt: skip
    """Feed samples one check apart; the outcomes, and the final state (serialised and parsed back each time)."""
    outcomes = []
    for i, p95 in enumerate(samples):
        verdict = observe(state, p95, params, start + dt.timedelta(seconds=i * step_s), variant="run-a")
        outcomes.append(verdict.outcome)
        state = DriftStatus.model_validate(json.loads(json.dumps(verdict.state.to_api())))  # lives in the status
    return outcomes, state


def test_sustained_breach_triggers_once_on_the_nth_sample() -> None:
    outcomes, state = play([4.0, 13.0, 13.0, 13.0, 13.0, 13.0])
    ok, breach, drift = Reason.WITHIN_TOLERANCE, Reason.LATENCY_BREACH, Reason.LATENCY_DRIFT
    assert outcomes == [ok, breach, breach, drift, breach, breach]
    assert state is not None and state.last_readaptation_time == T0 + dt.timedelta(seconds=180)
    assert outcomes.count(Reason.LATENCY_DRIFT) == 1


def test_single_spike_never_triggers_and_a_good_sample_resets() -> None:
    outcomes, state = play([4.0, 50.0, 4.0, 13.0, 13.0, 4.0, 13.0, 13.0, 4.0])
    assert Reason.LATENCY_DRIFT not in outcomes
    assert state is not None and state.consecutive_breaches == 0 and state.last_readaptation_time is None


def test_no_data_neither_counts_nor_resets() -> None:
    outcomes, state = play([4.0, 13.0, 13.0, None, None, 13.0])
    assert outcomes[3:5] == [Reason.NO_DATA, Reason.NO_DATA]
    assert outcomes[-1] == Reason.LATENCY_DRIFT  # the two breaches before the gap still count
    only_gaps, state = play([None] * 10)
    assert set(only_gaps) == {Reason.NO_DATA} and state is not None and state.consecutive_breaches == 0


def test_unavailable_reason_and_message_are_kept() -> None:
    v = observe(None, None, PARAMS, T0, unavailable_reason=Reason.PROMETHEUS_UNREACHABLE, unavailable_message="refused")
    assert not v.readapt and v.outcome == Reason.PROMETHEUS_UNREACHABLE
    assert v.state.reason == Reason.PROMETHEUS_UNREACHABLE and v.state.message == "refused"
    assert v.state.last_check_time == T0 and v.state.consecutive_breaches == 0


def test_nan_and_inf_are_no_data() -> None:
    for bad in (float("nan"), float("inf")):
        assert not observe(None, bad, PARAMS, T0).readapt


def test_cooldown_blocks_then_a_breach_lasting_through_it_triggers() -> None:
    outcomes, _ = play([13.0] * 3 + [13.0] * 12, step_s=60)  # 600 s cooldown = 10 checks
    first = outcomes.index(Reason.LATENCY_DRIFT)
    assert first == 2
    assert outcomes[3:6] == [
        Reason.LATENCY_BREACH,
        Reason.LATENCY_BREACH,
        Reason.COOLDOWN,
    ]  # counting again, held by the cooldown
    second = outcomes.index(Reason.LATENCY_DRIFT, first + 1)
    assert second == 12  # 600 s after the first
    assert outcomes.count(Reason.LATENCY_DRIFT) == 2


def test_slo_and_baseline_rules_with_tolerance() -> None:
    p = DriftParams(slo_p95_ms=10.0, adapted_p95_ms=None, tolerance=0.2, consecutive_breaches=1, cooldown_seconds=0)
    assert not observe(None, 12.0, p, T0).readapt  # exactly SLO +20%: not above
    assert observe(None, 12.01, p, T0).readapt
    p = DriftParams(slo_p95_ms=100.0, adapted_p95_ms=4.0, tolerance=0.5, consecutive_breaches=1, cooldown_seconds=0)
    assert not observe(None, 6.0, p, T0).readapt  # adapted 4 ms +50%
    assert observe(None, 6.1, p, T0).readapt  # far below the SLO, but drifted from the baseline


def test_first_production_sample_raises_the_baseline() -> None:
    """Production pays HTTP and histogram resolution on top of the bare model: that is not drift."""
    p = DriftParams(slo_p95_ms=100.0, adapted_p95_ms=0.1, tolerance=0.2, consecutive_breaches=2, cooldown_seconds=0)
    outcomes, state = play([2.0, 2.1, 2.3, 1.9, 2.2], params=p)
    assert set(outcomes) == {Reason.WITHIN_TOLERANCE}
    assert state is not None and state.baseline_p95_ms == 2.0 and state.baseline_variant == "run-a"
    outcomes, _ = play([3.0, 3.0], params=p, state=state)
    assert outcomes == [Reason.LATENCY_BREACH, Reason.LATENCY_DRIFT]


def test_a_new_variant_resets_baseline_and_count() -> None:
    p = DriftParams(slo_p95_ms=100.0, adapted_p95_ms=None, tolerance=0.2, consecutive_breaches=3, cooldown_seconds=0)
    _, state = play([2.0, 5.0, 5.0], params=p)
    assert state is not None and state.consecutive_breaches == 2
    v = observe(state, 5.0, p, T0 + dt.timedelta(hours=1), variant="run-b")
    assert v.outcome == Reason.WITHIN_TOLERANCE and v.state.baseline_p95_ms == 5.0 and v.state.consecutive_breaches == 0


def test_params_from_settings_and_due() -> None:
    settings = ReadaptationSettings.model_validate({"driftTolerance": 0.3, "consecutiveBreaches": 4})
    p = DriftParams.from_settings(settings, 10.0, 2.0)
    assert (p.tolerance, p.consecutive_breaches, p.cooldown_seconds) == (0.3, 4, 1800)
    assert due(None, 60, T0)
    state = DriftStatus(last_check_time=T0)
    assert not due(state, 60, T0 + dt.timedelta(seconds=59)) and due(state, 60, T0 + dt.timedelta(seconds=60))


def test_long_messages_fit_the_status() -> None:
    v = observe(None, None, PARAMS, T0, unavailable_message="x" * 5000)
    assert len(v.state.message or "") <= 1024


def test_confirmed_drift_makes_exactly_one_latency_drift_run() -> None:
    """The drift epoch in the class status salts the run key: a new run for the same spec, then none again."""
    from reconcile_cluster import CPU, Cluster  # the in-memory API of the reconcile scenarios

    c = Cluster()
    nodes = {"n1": CPU}
    c.reconcile(nodes)
    (first,) = c.runs
    c.finish(first)
    c.reconcile(nodes)
    assert c.reconcile(nodes).class_statuses[0].state == "Ready"
    # What operator.drift writes on a confirmed drift: only the class's drift status.
    c.policy["status"]["classes"][0]["drift"] = {"lastReadaptationTime": "2026-01-01T01:00:00Z"}
    plan = c.reconcile(nodes)
    assert [p.reason for p in plan.runs_to_create] == [Reason.LATENCY_DRIFT] and plan.runs_to_delete == []
    assert plan.class_statuses[0].drift is not None  # carried, so the key stays salted
    assert plan.deployments_to_apply == [], "the old variant keeps serving while re-adapting"
    again = c.reconcile(nodes)
    assert again.runs_to_create == [] and again.runs_to_delete == [] and len(c.runs) == 2
    new = next(n for n in c.runs if n != first)
    c.finish(new)
    c.reconcile(nodes)
    assert c.reconcile(nodes).class_statuses[0].state == "Ready" and len(c.runs) == 2
    # A later spec change on a drifted class is still a SpecChange, keeping the epoch.
    c.edit(search={"trialBudget": 3})
    assert [p.reason for p in c.reconcile(nodes).runs_to_create] == [Reason.SPEC_CHANGE]


def test_a_p99_bound_is_enforced_where_the_policy_sets_one() -> None:
    """slo.latencyP99Ms was documented as a bound and never checked: a tail over it now breaches like p95 does."""
    params = DriftParams(**{**PARAMS.__dict__, "slo_p99_ms": 20.0})
    state: DriftStatus | None = None
    outcomes = []
    for i, p99 in enumerate([15.0, 30.0, 30.0, 30.0]):  # p95 steady at 4 ms, well inside its SLO
        verdict = observe(state, 4.0, params, T0 + dt.timedelta(minutes=i), variant="run-a", p99_ms=p99)
        outcomes.append(verdict.outcome)
        state = verdict.state
    assert outcomes == [Reason.WITHIN_TOLERANCE, Reason.LATENCY_BREACH, Reason.LATENCY_BREACH, Reason.LATENCY_DRIFT]
    assert (
        state is not None
        and state.last_observed_p99_ms == 30.0
        and "p99 30.000 ms > SLO 20 ms" in (state.message or "")
    )
    # Without a p99 bound (or without a p99 sample) the same tail changes nothing.
    assert observe(None, 4.0, PARAMS, T0, variant="run-a", p99_ms=30.0).outcome == Reason.WITHIN_TOLERANCE
    assert observe(None, 4.0, params, T0, variant="run-a", p99_ms=None).outcome == Reason.WITHIN_TOLERANCE


def test_requests_waiting_for_workers_are_saturation_not_drift() -> None:
    """Compute within tolerance but compute + queue wait over the SLO: Saturated, count reset, never re-adapted."""
    state: DriftStatus | None = None
    outcomes = []
    for i in range(6):
        verdict = observe(state, 4.0, PARAMS, T0 + dt.timedelta(minutes=i), variant="run-a", queue_p95_ms=40.0)
        outcomes.append(verdict.outcome)
        assert not verdict.readapt
        state = verdict.state
    assert outcomes == [Reason.SATURATED] * 6
    assert state is not None and state.consecutive_breaches == 0 and "scale serving.replicas" in (state.message or "")
    # A short queue is not saturation; a slow compute is drift whatever the queue.
    assert observe(None, 4.0, PARAMS, T0, variant="run-a", queue_p95_ms=2.0).outcome == Reason.WITHIN_TOLERANCE
    assert observe(None, 13.0, PARAMS, T0, variant="run-a", queue_p95_ms=40.0).outcome == Reason.LATENCY_BREACH
