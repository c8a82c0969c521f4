"""The platform's settings of the pods the operator creates (core.control.settings): adaptation Jobs at Guaranteed QoS
by default, so what they measure does not move with their neighbours; a policy's serving resources merged with the
platform's one resource at a time, so requests never exceed limits; a terminating serving pod's grace period
covering its shutdown delay and drain; and vendor images that map only accelerators."""

from __future__ import annotations

import argparse

import pytest
from manifest_inputs import CPU, _pods, gpu_group, policy, succeeded
from pydantic import ValidationError

from metainfer.core.api.policy import ResourceRequirements
from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.manifests import build_deployment, build_job, build_run
from metainfer.core.control.settings import (
    DEFAULT_JOB_RESOURCES,
    SHUTDOWN_DELAY_MAX_ENV,
    TERMINATION_MARGIN_S,
    AgentJobSettings,
    ServingDefaults,
    VendorImage,
    merged_resources,
)


def test_jobs_are_guaranteed_qos_by_default() -> None:
    """requests == limits for every resource (cpu and memory from the platform, the class's GPU): the kubelet gives
    the pod Guaranteed QoS, so its latency measurements do not depend on what else runs on the node."""
    assert DEFAULT_JOB_RESOURCES.requests == DEFAULT_JOB_RESOURCES.limits
    cpu_group = next(iter(group_nodes([("c", CPU)]).values()))
    for group in (gpu_group(), cpu_group):
        run = build_run(policy(), group, "NewHardwareClass")
        run["metadata"]["uid"] = "u"
        (c,) = build_job(run, group)["spec"]["template"]["spec"]["containers"]
        requests, limits = c["resources"]["requests"], c["resources"]["limits"]
        assert requests == limits and {"cpu", "memory"} <= requests.keys()
        assert all(isinstance(q, str) for q in requests.values()), "the Kubernetes client refuses int quantities"
    platform = AgentJobSettings(resources=ResourceRequirements(requests={"cpu": 4}, limits={"cpu": 4}))
    (job_pod, _) = _pods((platform, ServingDefaults()))
    assert job_pod["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "4", "nvidia.com/gpu": "1"},
    }


def test_serving_resources_the_policy_names_win_the_rest_are_the_platforms() -> None:
    platform = ResourceRequirements(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "2Gi"})
    assert merged_resources(None, platform) == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "2Gi"},
    }
    # A memory request above the platform's memory limit: the platform's limit must not come with it (the API
    # server would refuse requests > limits), so memory is the policy's alone.
    own = ResourceRequirements(requests={"memory": "8Gi"})
    assert merged_resources(own, platform) == {"requests": {"cpu": "1", "memory": "8Gi"}, "limits": {"cpu": "1"}}
    own = ResourceRequirements(limits={"cpu": "3", "ephemeral-storage": "1Gi"})
    assert merged_resources(own, platform) == {
        "requests": {"memory": "1Gi"},
        "limits": {"memory": "2Gi", "cpu": "3", "ephemeral-storage": "1Gi"},
    }
    assert merged_resources(own, None) == {"limits": {"cpu": "3", "ephemeral-storage": "1Gi"}}
    assert merged_resources(None, None) == {}
    settings = (AgentJobSettings(), ServingDefaults(resources=platform))
    (_, silent) = _pods(settings)
    assert silent["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}
    (_, named) = _pods(settings, serving={"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}})
    assert named["containers"][0]["resources"] == {
        "requests": {"memory": "1Gi", "cpu": "2", "nvidia.com/gpu": "1"},
        "limits": {"memory": "2Gi", "cpu": "2", "nvidia.com/gpu": "1"},
    }


def test_a_terminating_serving_pod_answers_then_drains_within_its_grace_period() -> None:
    """Make-before-break on pod replacement: serve gets the platform's shutdown delay and drain timeout, and the
    kubelet's SIGKILL comes only after the longest delay, the drain and a margin (55 s with the defaults). The
    longest delay is an environment variable, not a flag: an older serving image ignores it."""
    from metainfer.agent.serve.flags import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    group = gpu_group()
    p = policy()
    run = succeeded(build_run(p, group, "NewHardwareClass"))
    cases = (
        (ServingDefaults(), 55),
        (ServingDefaults(shutdown_delay_seconds=0), 25),  # no delay: its maximum lengthens nothing
        (ServingDefaults(shutdown_delay_seconds=2.5, drain_timeout_seconds=60), 95),
        (ServingDefaults(shutdown_delay_seconds=2.5, shutdown_delay_max_seconds=0.5), 28),  # never under the delay
        (ServingDefaults(shutdown_delay_max_seconds=90, drain_timeout_seconds=10), 105),
    )
    for settings, grace in cases:
        pod = build_deployment(p, group, run, settings)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = parser.parse_args(container["args"][1:])
        assert args.shutdown_delay_max is None, "a flag an older serving image would refuse"
        env = {e["name"]: e["value"] for e in container["env"]}
        longest = float(env[SHUTDOWN_DELAY_MAX_ENV])
        assert (args.shutdown_delay, longest, args.drain_timeout) == (
            settings.shutdown_delay_seconds,
            settings.shutdown_delay_max_seconds,
            settings.drain_timeout_seconds,
        )
        assert pod["terminationGracePeriodSeconds"] == grace == settings.termination_grace_seconds()
        longest_delay = max(args.shutdown_delay, longest) if args.shutdown_delay else 0
        assert grace >= longest_delay + args.drain_timeout + TERMINATION_MARGIN_S
    assert ServingDefaults().shutdown_delay_seconds > 0, "by default a terminating pod keeps answering a while"
    for bad in (
        {"shutdown_delay_seconds": -1},
        {"drain_timeout_seconds": 0},
        {"shutdown_delay_seconds": "inf"},
        {"shutdown_delay_max_seconds": -1},
        {"shutdown_delay_max_seconds": "inf"},
    ):
        with pytest.raises(ValidationError):
            ServingDefaults.model_validate(bad)


def test_vendor_settings_map_only_accelerators_and_no_mapping_keeps_one_image() -> None:
    cuda = VendorImage(image="m:1-cuda")
    mapped = AgentJobSettings(image="m:1", runtime="ort", vendor_images={"nvidia": cuda})
    assert mapped.for_vendor("cpu") is mapped
    nvidia = mapped.for_vendor("nvidia")
    assert nvidia is not None and nvidia.image == "m:1-cuda" and nvidia.runtime == "image m:1-cuda"
    assert mapped.for_vendor("amd") is None
    unmapped = AgentJobSettings(image="m:1")
    assert unmapped.for_vendor("amd") is unmapped  # tests and the demo: no mapping, one image
