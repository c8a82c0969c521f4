"""The AdaptationPolicy type's own rules (core.api.policy), where the API server would refuse or cut: a pin names
exactly one valid run name or variant sha256, a canary weight becomes at least one replica, a model volume cannot
hide the variant store, and status text copied from a run is cut to fit, since one overlong message must not fail
every status write of its policy."""

from __future__ import annotations

import pytest
from manifest_inputs import policy
from pydantic import ValidationError
from reconcile_cluster import A100, CPU, Cluster

from metainfer.core.api.policy import AdaptationPolicy


@pytest.mark.parametrize(
    "pin", [{}, {"runName": "a", "variantSha256": "d" * 64}, {"variantSha256": "D" * 64}, {"runName": "Not_A_Name"}]
)
def test_a_pin_names_exactly_one_valid_run_name_or_sha256(pin: dict[str, str]) -> None:
    c = Cluster(pin=pin)
    with pytest.raises(ValidationError):
        AdaptationPolicy.model_validate(c.policy)


def test_canary_replicas_from_a_weight_are_rounded_and_at_least_one() -> None:
    from metainfer.core.api.policy import RolloutSettings

    assert RolloutSettings(canary_weight_percent=10).canary_replicas_for(2) == 1  # 0.22 -> at least one pod
    assert RolloutSettings(canary_weight_percent=50).canary_replicas_for(3) == 3
    assert RolloutSettings(canary_weight_percent=90).canary_replicas_for(1) == 9
    assert RolloutSettings(canary_replicas=2).canary_replicas_for(10) == 2  # no weight: canaryReplicas


def test_a_failure_message_longer_than_the_class_status_allows_is_cut_not_a_wedge() -> None:
    # A run's condition message may hold 32,768 characters (e.g. a model server's long reason phrase); the class
    # status keeps 4,096. Copying it whole failed validation on every reconcile and froze the policy.
    c = Cluster()
    c.reconcile({"c1": CPU, "a1": A100})
    cpu_run = next(name for name, run in c.runs.items() if run["spec"]["hardwareClass"]["vendor"] == "cpu")
    c.finish(cpu_run, ok=False)
    c.runs[cpu_run]["status"]["conditions"][0]["message"] = "HTTP 502 " + "x" * 30000
    plan = c.reconcile({"c1": CPU, "a1": A100})
    degraded = next(cls for cls in plan.class_statuses if cls.state == "Degraded")
    assert degraded.message is not None and len(degraded.message) <= 4096
    assert degraded.message.startswith("HTTP 502") and degraded.message.endswith("[truncated]")
    assert [e.reason for e in plan.events if e.type == "Warning"] == ["ChecksumMismatch"]  # posted cut (events.py)
    other = next(cls for cls in plan.class_statuses if cls is not degraded)
    assert other.state == "Adapting", "the other class is planned as before"


def test_a_model_volume_cannot_hide_the_variant_store() -> None:
    with pytest.raises(ValidationError, match="must not be"):
        AdaptationPolicy.model_validate(
            policy(model={"uri": "file:///x/m.onnx", "sha256": "a" * 64,
                          "volume": {"claimName": "m", "mountPath": "/var/lib/metainfer/variants"}})
        )  # fmt: skip
