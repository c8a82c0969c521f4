"""Values the API server would reject in a derived Job or Deployment are rejected in the policy, naming the field."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from metainfer.core.api.k8s_syntax import parse_quantity
from metainfer.core.api.policy import AdaptationPolicySpec


def spec(**fields: Any) -> AdaptationPolicySpec:
    model = {"uri": "file:///models/m.onnx", "sha256": "a" * 64, **fields.pop("model", {})}
    return AdaptationPolicySpec.model_validate({"model": model, "slo": {"latencyP95Ms": 5}, **fields})


@pytest.mark.parametrize(
    ("value", "amount"),
    [("500m", Decimal("0.5")), ("2", Decimal(2)), (2, Decimal(2)), ("4Gi", Decimal(4 * 2**30)), ("1e3", Decimal(1000))],
)
def test_quantities_parse_as_kubernetes_reads_them(value: int | str, amount: Decimal) -> None:
    assert parse_quantity(value) == amount


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"serving": {"resources": {"requests": {"cpu": "lots"}}}}, "quantit"),
        ({"serving": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}}, "limits.memory"),
        ({"serving": {"image": "registry.example/ml server:1"}}, "serving.image"),
        ({"hardware": {"nodeSelector": {"pool name": "gpu"}}}, "nodeSelector"),
        ({"hardware": {"nodeSelector": {"pool": "a b"}}}, "nodeSelector"),
        ({"hardware": {"tolerations": [{"key": "nvidia.com/gpu", "value": "has space"}]}}, "tolerations"),
        ({"model": {"volume": {"claimName": "Models_PVC"}}}, "claimName"),
        ({"model": {"volume": {"claimName": "m", "mountPath": "/tmp"}}}, "mountPath"),
        ({"model": {"volume": {"claimName": "m", "mountPath": "/var/run/secrets/kubernetes.io"}}}, "mountPath"),
    ],
)
def test_values_kubernetes_would_reject_downstream_are_rejected_here(fields: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec(**fields)
    assert where.lower() in str(err.value).lower().replace("_", "")


def test_valid_kubernetes_values_pass() -> None:
    ok = spec(
        serving={
            "image": "registry.example/ml/server:1",
            "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": 1}},
        },
        hardware={
            "nodeSelector": {"node.kubernetes.io/pool": "gpu-a100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        model={"volume": {"claimName": "models.team-a", "mountPath": "/models"}},
    )
    assert ok.serving.resources is not None
