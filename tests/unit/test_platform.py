"""A policy author gets through the operator only what the platform allows (core.control.platform)."""

from __future__ import annotations

from typing import Any

import pytest

from metainfer.core.api.policy import AdaptationPolicySpec
from metainfer.core.control.platform import (
    ForbiddenByPlatform,
    PlatformLimits,
    check_platform_limits,
    platform_violations,
)

OWN = "registry.example/metainfer:0.1.0"


def spec(**fields: Any) -> AdaptationPolicySpec:
    model = {"uri": "file:///models/m.onnx", "sha256": "a" * 64, **fields.pop("model", {})}
    return AdaptationPolicySpec.model_validate({"model": model, "slo": {"latencyP95Ms": 5}, **fields})


def test_by_default_no_host_path_and_no_image_but_the_operators() -> None:
    limits = PlatformLimits(default_image=OWN)
    assert platform_violations(spec(), limits) == []
    assert platform_violations(spec(serving={"image": OWN}), limits) == []
    (host,) = platform_violations(spec(model={"volume": {"hostPath": "/"}}), limits)
    assert "spec.model.volume.hostPath" in host and "claimName" in host
    (image,) = platform_violations(spec(serving={"image": "evil/miner:latest"}), limits)
    assert "spec.serving.image" in image
    with pytest.raises(ForbiddenByPlatform, match="hostPath"):
        check_platform_limits(spec(model={"volume": {"hostPath": "/var/lib/kubelet"}}), limits)


def test_allow_lists_admit_what_is_below_them_and_nothing_beside() -> None:
    limits = PlatformLimits(allowed_host_paths=("/srv/models",), allowed_images=("registry.example/ml/",))
    ok = spec(model={"volume": {"hostPath": "/srv/models/team-a"}}, serving={"image": "registry.example/ml/s:1"})
    assert platform_violations(ok, limits) == []
    for path in ("/srv/models-evil", "/srv/models/../../etc", "/srv"):
        assert platform_violations(spec(model={"volume": {"hostPath": path}}), limits), path
    assert platform_violations(spec(serving={"image": "registry.example/mlx/s:1"}), limits)
