"""The policy, GPU class and succeeded run the manifest builders (core.control.manifests) take, and the Job and
serving pod specs they build from a platform's settings (``_pods``): shared by test_manifests, test_settings,
test_runkey, test_naming and test_api_policy, so each builds its inputs the same way."""

from __future__ import annotations

from typing import Any

from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.manifests import build_deployment, build_job, build_run
from metainfer.core.control.settings import AgentJobSettings, ServingDefaults
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec

GPU = {
    "kubernetes.io/arch": "amd64",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
}
CPU = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}


def policy(name: str = "digits", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"uri": "https://models.example.com/digits.onnx", "sha256": "a" * 64, "version": "1"},
        "slo": {"latencyP95Ms": 10, "batchSize": 1},
        "hardware": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        "search": {"timeBudgetSeconds": 600, "backoffLimit": 3},
    }
    return {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": name, "namespace": "team-a", "uid": "uid-policy", "generation": 3},
        "spec": {**base, **spec},
    }


def gpu_group():  # type: ignore[no-untyped-def]
    return next(iter(group_nodes([("gpu-1", GPU), ("gpu-2", GPU)]).values()))


def succeeded(run: dict[str, Any]) -> dict[str, Any]:
    recipe = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic")))
    return {
        **run,
        "metadata": {**run["metadata"], "uid": "uid-run"},
        "status": {
            "phase": "Succeeded",
            "bestRecipe": recipe.model_dump(mode="json"),
            "bestRecipeKey": recipe.key(),
            "bestMetrics": {"p95Ms": 3.5, "qualityDrop": 0.001},
            "completionTime": "2026-01-01T00:10:00Z",
        },
    }


def _pods(settings: tuple[AgentJobSettings, ServingDefaults], **spec: Any) -> list[dict[str, Any]]:
    """The Job's and the Deployment's pod specs for one GPU class, built with ``settings``."""
    group, p = gpu_group(), policy(**spec)
    run = succeeded(build_run(p, group, "NewHardwareClass"))
    job, dep = build_job(run, group, settings[0]), build_deployment(p, group, run, settings[1])
    return [job["spec"]["template"]["spec"], dep["spec"]["template"]["spec"]]
