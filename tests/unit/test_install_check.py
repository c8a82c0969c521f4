"""`metainfer check-install` (what `helm test` runs): when an operator Deployment counts as rolled out."""

from __future__ import annotations

import pytest
from kubernetes import client

from metainfer.agent.install_check import probe_policy, rollout_finding
from metainfer.core.api.policy import AdaptationPolicy


def _deployment(replicas: int | None, generation: int, status: client.V1DeploymentStatus | None) -> client.V1Deployment:
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name="op", generation=generation),
        spec=client.V1DeploymentSpec(
            replicas=replicas, selector=client.V1LabelSelector(), template=client.V1PodTemplateSpec()
        ),
        status=status,
    )


@pytest.mark.parametrize(
    ("replicas", "generation", "status", "ok", "says"),
    [
        (1, 2, client.V1DeploymentStatus(observed_generation=2, available_replicas=1, updated_replicas=1), True, "1/1"),
        (None, 1, client.V1DeploymentStatus(observed_generation=1, available_replicas=1, updated_replicas=1), True, ""),
        (
            1,
            2,
            client.V1DeploymentStatus(observed_generation=2, available_replicas=0, updated_replicas=1),
            False,
            "0/1",
        ),
        # Available, but the old replica: the new spec's pod is not up yet.
        (1, 3, client.V1DeploymentStatus(observed_generation=3, available_replicas=1, updated_replicas=0), False, ""),
        (
            1,
            3,
            client.V1DeploymentStatus(observed_generation=2, available_replicas=1, updated_replicas=1),
            False,
            "not",
        ),
        (1, 1, None, False, "0/1"),
        (0, 1, client.V1DeploymentStatus(observed_generation=1), False, "scaled to 0"),
    ],
)
def test_rolled_out_means_the_latest_spec_observed_and_every_replica_updated_and_available(
    replicas: int | None, generation: int, status: client.V1DeploymentStatus | None, ok: bool, says: str
) -> None:
    finding = rollout_finding("operator", _deployment(replicas, generation, status))
    assert finding.ok is ok
    assert says in finding.detail
    assert finding.line().startswith("ok: operator: " if ok else "FAIL: operator: ")


def test_the_probe_policy_is_a_valid_policy_of_the_namespace_asked() -> None:
    body = probe_policy("team-a")
    assert AdaptationPolicy.model_validate(body).metadata == {"name": "metainfer-install-check", "namespace": "team-a"}
