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


def test_a_policy_schedules_only_with_the_classes_and_taint_keys_the_platform_lists() -> None:
    wanted = spec(scheduling={"priorityClassName": "high", "runtimeClassName": "gvisor"})
    by_default = platform_violations(wanted, PlatformLimits())
    assert len(by_default) == 2 and "policies.allowedPriorityClasses: none" in by_default[0]
    assert "spec.scheduling.runtimeClassName 'gvisor'" in by_default[1]
    listed = PlatformLimits(allowed_priority_classes=("high",), allowed_runtime_classes=("gvisor", "nvidia"))
    assert platform_violations(wanted, listed) == []
    assert platform_violations(spec(scheduling={"priorityClassName": "system-node-critical"}), listed)

    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    everything = {"operator": "Exists"}  # no key: tolerates every taint, a team's reserved nodes included
    tolerant = spec(hardware={"tolerations": [gpu, {"key": "team-b/reserved", "operator": "Exists"}, everything]})
    assert platform_violations(tolerant, PlatformLimits()) == [], "any key by default, as before the list existed"
    gpu_only = PlatformLimits(allowed_toleration_keys=("nvidia.com/gpu",))
    reserved, keyless = platform_violations(tolerant, gpu_only)
    assert reserved.startswith("spec.hardware.tolerations[1] 'team-b/reserved' is not allowed")
    assert keyless.startswith("spec.hardware.tolerations[2] without a key (tolerates every taint)")
    assert "policies.allowedTolerationKeys: nvidia.com/gpu" in keyless


def test_a_scheduling_name_kubernetes_would_refuse_is_refused_at_admission() -> None:
    from pydantic import ValidationError

    for bad in ("High", "a" * 254, "under_score", ""):
        with pytest.raises(ValidationError, match="scheduling"):
            spec(scheduling={"priorityClassName": bad})
