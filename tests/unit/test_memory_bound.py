"""The memory a class's variant may take: the policy's memory SLO and the serving container's memory limit
(core.control.memory_bound), recorded in the run, in its key, and read by the Job's search."""

from __future__ import annotations

import pytest
from manifest_inputs import gpu_group, policy

from metainfer.agent.serve.grpc_server import WAITING_BYTES
from metainfer.agent.serve.unsent import DEFAULT_MAX_UNSENT_MIB
from metainfer.core.api.policy import ResourceRequirements
from metainfer.core.api.run import AdaptationRun
from metainfer.core.control import runstatus
from metainfer.core.control.manifests import build_run
from metainfer.core.control.memory_bound import (
    DATA_PLANE_BUFFERS_MIB,
    serving_memory_limit_mib,
    variant_memory_bound_mib,
)
from metainfer.core.control.runkey import run_key


def _resources(limit: str | None = None, request: str | None = None) -> ResourceRequirements:
    return ResourceRequirements.model_validate(
        {"limits": {"memory": limit} if limit else None, "requests": {"memory": request} if request else None}
    )


def test_the_buffers_are_what_serve_may_hold_beyond_the_variant() -> None:
    assert DATA_PLANE_BUFFERS_MIB == DEFAULT_MAX_UNSENT_MIB + WAITING_BYTES // (1 << 20)


@pytest.mark.parametrize(
    ("own", "platform", "expected"),
    [
        (None, None, None),
        (_resources("1Gi"), None, 1024),
        (_resources("1G"), None, 953),  # decimal gigabytes, rounded down to whole MiB
        (None, _resources("512Mi"), 512),
        (_resources("2Gi"), _resources("512Mi"), 2048),  # the policy's own memory pair wins
        (_resources(request="1Gi"), _resources("512Mi"), None),  # the policy names memory: the platform's limit goes
    ],
)
def test_the_serving_limit_is_the_policys_else_the_platforms(
    own: ResourceRequirements | None, platform: ResourceRequirements | None, expected: int | None
) -> None:
    assert serving_memory_limit_mib(own, platform) == expected


def test_the_limit_leaves_the_variant_what_serve_and_its_buffers_do_not_take() -> None:
    assert variant_memory_bound_mib(None, 140.0) is None
    assert variant_memory_bound_mib(512, 140.0) == 512 - DATA_PLANE_BUFFERS_MIB - 140
    assert variant_memory_bound_mib(200, 140.0) == 1  # nothing fits, and the run says which limit it missed


def test_serves_floor_is_measured_in_a_process_of_this_image() -> None:
    from metainfer.agent.serve.floor import serve_floor_mib

    floor = serve_floor_mib()
    assert 30 < floor < 1024  # Python, numpy, onnx, ONNX Runtime with a session, aiohttp, gRPC: tens of MiB at least


def test_the_run_records_the_limit_the_policys_own_is_in_its_key_and_its_search_is_bounded() -> None:
    group = gpu_group()
    p = policy(slo={"latencyP95Ms": 10, "batchSize": 1, "maxMemoryMiB": 900})
    plain = AdaptationRun.model_validate(build_run(p, group, "NewHardwareClass"))
    bounded = AdaptationRun.model_validate(build_run(p, group, "NewHardwareClass", serving_memory_limit_mib=768))
    assert plain.spec.serving_memory_limit_mib is None and bounded.spec.serving_memory_limit_mib == 768
    # The platform's limit bounds the search but keeps the key (an operator upgrade re-adapts nothing); the
    # policy's own limit is part of it (a new one adapts again).
    assert plain.metadata["name"] == bounded.metadata["name"]
    own = policy(slo=p["spec"]["slo"], serving={"resources": {"limits": {"memory": "768Mi"}}})
    assert run_key(own["spec"], 3, group.fingerprint) != run_key(p["spec"], 3, group.fingerprint)
    requested = policy(slo=p["spec"]["slo"], serving={"resources": {"requests": {"memory": "768Mi"}}})
    assert run_key(requested["spec"], 3, group.fingerprint) == run_key(p["spec"], 3, group.fingerprint)
    unbounded = runstatus.settings_from_spec(plain.spec).constraints
    assert (unbounded.max_memory_mib, unbounded.max_variant_memory_mib) == (900, None)
    limited = runstatus.settings_from_spec(bounded.spec, serve_floor_mib=140.0).constraints
    assert (limited.max_memory_mib, limited.max_variant_memory_mib) == (900, 768 - DATA_PLANE_BUFFERS_MIB - 140)


def test_a_variant_over_what_its_container_leaves_it_is_infeasible() -> None:
    from metainfer.core.engine.scoring import Constraints, violations
    from metainfer.core.engine.trial import LatencyStats, Quality, TrialMetrics

    def metrics(own: float | None) -> TrialMetrics:
        latency = LatencyStats(p50_ms=1, p95_ms=1, p99_ms=1, mean_ms=1, runs=5, warmup_runs=1, throughput_per_s=1000)
        quality = Quality(metric="cosine_similarity", value=1.0, reference=1.0, drop=0.0, samples=8)
        return TrialMetrics(latency=latency, quality=quality, peak_memory_mib=600.0, model_size_mib=100.0,
                            variant_memory_mib=own)  # fmt: skip

    bound = Constraints(max_variant_memory_mib=200.0)
    assert violations(metrics(150.0), bound) == []  # the agent's own 600 MiB peak is not the pod's
    assert violations(metrics(260.0), bound) == [
        "memory: the variant takes 260 MiB > the 200 MiB its serving container leaves it"
    ]
    assert violations(metrics(None), bound)  # a report from before the variant's own memory: its process peak
