"""The operator's settings as its environment gives them (operator/config.py): by default no namespace holds more
than half the cluster's run slots, and the per-vendor images reach the Job and serving settings, refused at startup
when they are not JSON, name no known vendor, or name cpu (cpu classes run the agent image)."""

from __future__ import annotations

import json

import pytest


def test_the_operators_default_gives_a_namespace_half_the_cluster() -> None:
    from metainfer.operator.config import OperatorConfig

    assert OperatorConfig(max_concurrent_runs=8).namespace_run_limit() == 4
    assert OperatorConfig(max_concurrent_runs=1).namespace_run_limit() == 1
    assert OperatorConfig(max_concurrent_runs=8, max_concurrent_runs_per_namespace=8).namespace_run_limit() == 8


def test_the_platforms_vendor_images_reach_job_and_serving_settings_and_cpu_is_not_a_vendor_image() -> None:
    from metainfer.operator.config import ConfigError, OperatorConfig

    images = {"nvidia": {"image": "r/metainfer:1-cuda", "runtime": "onnxruntime-gpu 1.31.1"}}
    config = OperatorConfig(agent_image="r/metainfer:1", agent_images=json.dumps(images))
    for settings in (config.job_settings(), config.serving_defaults()):
        nvidia = settings.for_vendor("nvidia")
        assert nvidia is not None and (nvidia.image, nvidia.runtime) == ("r/metainfer:1-cuda", "onnxruntime-gpu 1.31.1")
        assert settings.for_vendor("amd") is None and settings.for_vendor("cpu") is settings
    # Unset: no accelerator vendor has an image, so none is run on the CPU image.
    assert OperatorConfig().job_settings().for_vendor("nvidia") is None
    with pytest.raises(ConfigError, match=r"METAINFER_AGENT_IMAGES: .*cpu classes run agent_image"):
        OperatorConfig(agent_images='{"cpu": {"image": "x"}}')
    with pytest.raises(ConfigError, match="METAINFER_AGENT_IMAGES"):
        OperatorConfig(agent_images='{"nvida": {"image": "x"}}')
    with pytest.raises(ConfigError, match="METAINFER_AGENT_IMAGES: not valid JSON"):
        OperatorConfig(agent_images="{nvidia")
