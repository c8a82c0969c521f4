"""Per-policy and per-class operator metrics: the SLO, the classes in words, their state; gone with the policy."""

from __future__ import annotations

from prometheus_client import REGISTRY

from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.operator.metrics import RUNS_STARTED, SERIES, publish_policy

GPU = HardwareClass(vendor="nvidia", product="A100-SXM4-80GB", driver_version="535.104.05")


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def status(state: str, p95_ms: float | None = 2.5) -> dict:
    cls = {"fingerprint": GPU.fingerprint(), "hardwareClass": GPU.model_dump(mode="json", by_alias=True)}
    return {"classes": [{**cls, "state": state, **({"current": {"p95Ms": p95_ms}} if p95_ms else {})}]}


def test_a_policys_slo_and_classes_are_exported_and_removed_with_it() -> None:
    spec = {"slo": {"latencyP95Ms": 10, "latencyP99Ms": 25, "maxQualityDrop": 0.02}}
    publish_policy("team-a", "bert", spec, status("Ready"))
    policy = {"namespace": "team-a", "policy": "bert"}
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.95") == 0.01
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.99") == 0.025
    assert value("metainfer_policy_slo_max_quality_drop", **policy) == 0.02
    fp = GPU.fingerprint()
    info = {
        **policy, "hardware_class": fp, "vendor": "nvidia", "product": "A100-SXM4-80GB", "driver": "535.104.05",
        "description": "nvidia A100-SXM4-80GB, driver 535.104.05",
    }  # fmt: skip
    assert value("metainfer_policy_class_info", **info) == 1
    assert value("metainfer_policy_class_state", **policy, hardware_class=fp, state="Ready") == 1
    assert value("metainfer_policy_class_state", **policy, hardware_class=fp, state="Adapting") == 0
    assert value("metainfer_policy_class_served_p95_seconds", **policy, hardware_class=fp) == 0.0025

    # p99 dropped from the spec, the class no longer serving: those series go.
    publish_policy("team-a", "bert", {"slo": {"latencyP95Ms": 10}}, status("Adapting", p95_ms=None))
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.99") is None
    assert value("metainfer_policy_class_served_p95_seconds", **policy, hardware_class=fp) is None
    assert value("metainfer_policy_class_state", **policy, hardware_class=fp, state="Adapting") == 1

    SERIES.child(RUNS_STARTED, "team-a", "bert", fp, "NewHardwareClass").inc()
    assert value("metainfer_operator_runs_started_total", **policy, hardware_class=fp, trigger="NewHardwareClass") == 1
    SERIES.forget("team-a", "bert")
    for name, labels in [
        ("metainfer_policy_slo_latency_seconds", {**policy, "quantile": "0.95"}),
        ("metainfer_policy_class_info", info),
        ("metainfer_policy_class_state", {**policy, "hardware_class": fp, "state": "Adapting"}),
        ("metainfer_operator_runs_started_total", {**policy, "hardware_class": fp, "trigger": "NewHardwareClass"}),
    ]:
        assert value(name, **labels) is None, name


def test_a_policy_published_again_after_it_went_gets_its_series_back() -> None:
    """Unchanged inputs skip the work, but not once the policy's series were removed (same spec, same status)."""
    spec, policy = {"slo": {"latencyP95Ms": 10}}, {"namespace": "team-b", "policy": "bert"}
    publish_policy("team-b", "bert", spec, status("Ready"))
    publish_policy("team-b", "bert", spec, status("Ready"))
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.95") == 0.01
    SERIES.forget("team-b", "bert")
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.95") is None
    publish_policy("team-b", "bert", spec, status("Ready"))
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.95") == 0.01
    state = {**policy, "hardware_class": GPU.fingerprint()}
    publish_policy("team-b", "bert", spec, status("Adapting"))
    assert value("metainfer_policy_class_state", **state, state="Adapting") == 1
    SERIES.forget("team-b", "bert")


def test_a_decoder_policys_slo_line_is_its_time_per_output_token_and_absent_without_one() -> None:
    """A decoder's serving latency series is per output token: its SLO line (and the SLO breach alert) is
    slo.decoder.timePerOutputTokenP95Ms; without one there is no line, never a 0 every request would be over."""
    policy = {"namespace": "team-a", "policy": "llm"}
    publish_policy("team-a", "llm", {"slo": {"decoder": {"timePerOutputTokenP95Ms": 40}}}, status("Ready"))
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.95") == 0.04
    publish_policy("team-a", "llm", {"slo": {"decoder": {"timeToFirstTokenP95Ms": 500}}}, status("Ready"))
    assert value("metainfer_policy_slo_latency_seconds", **policy, quantile="0.95") is None
    SERIES.forget("team-a", "llm")
