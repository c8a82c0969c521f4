"""The class's HardwareProfile: reuse this namespace's copy while fresh, else measure and publish one.

A profile is shared by every policy of one namespace adapting to the same
hardware class. It lives in a cluster-scoped HardwareProfile named
``<class fingerprint>.<namespace>`` (one GET finds it): a profile another
tenant's agent measured is never read, because that agent could have forged
it (see docs/tenancy.md). It is reused when it is younger than ``spec.maxAgeSeconds``
and was measured on a machine with this node's fingerprint (same CPU, ISA
features, cores, ONNX Runtime version and providers); a new ORT in the agent
image therefore re-measures. Two Jobs of one class may race to create it: the
loser of the 409 re-reads and reuses the winner's profile if it is already
measured, else measures too and writes its own (both are valid).

``METAINFER_FAST_MEASURE=1`` is a testing knob: tiny micro-benchmarks and
short latency loops, so integration tests finish in seconds. Never set it in
production; the numbers are noisy.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from metainfer.agent.job_api import Kube, KubeError
from metainfer.core.api.conditions import ConditionType, Reason, set_condition
from metainfer.core.api.hardwareprofile import (
    HardwareProfileResource,
    HardwareProfileSpec,
    HardwareProfileStatus,
    profile_name,
)
from metainfer.core.api.names import LABEL_CLASS_FINGERPRINT, LABEL_NAMESPACE
from metainfer.core.api.pod_contract import ENV_FAST_MEASURE
from metainfer.core.api.run import AdaptationRunSpec
from metainfer.core.engine.evaluate import MeasureSettings
from metainfer.core.engine.profile import BenchConfig, HardwareProfile, detect_machine, fingerprint, measure_profile
from metainfer.core.engine.profile.types import SCHEMA_VERSION

FAST_BENCH = BenchConfig(
    op_runs=5, op_warmup=1, gemm_n=128, gemm_repeats=2, gemm_min_seconds=0, bandwidth_mib=4, bandwidth_repeats=2
)
FAST_MEASURE = MeasureSettings(warmup_runs=1, round_runs=5, min_runs=10, max_runs=30, max_seconds=0.3)


def fast_measure() -> bool:
    return os.environ.get(ENV_FAST_MEASURE, "") not in ("", "0", "false")


def bench_config() -> BenchConfig:
    return FAST_BENCH if fast_measure() else BenchConfig()


def measure_settings() -> MeasureSettings | None:
    return FAST_MEASURE if fast_measure() else None


@dataclass(frozen=True)
class ProfileOutcome:
    profile: HardwareProfile
    name: str
    reused: bool


def usable(obj: dict[str, Any] | None, namespace: str, machine_fp: str, now: dt.datetime) -> HardwareProfile | None:
    """The stored profile if it is this namespace's, measured, of this schema, from this machine type, fresh."""
    if obj is None:
        return None
    try:
        resource = HardwareProfileResource.model_validate(obj)
    except ValidationError:
        return None  # a hand-edited or older object: measure again and overwrite its status
    if resource.spec.namespace != namespace:
        return None
    status = resource.status
    if status is None or status.profile is None or status.measured_at is None:
        return None
    profile = status.profile
    if profile.schema_version != SCHEMA_VERSION or profile.fingerprint != machine_fp:
        return None
    if now - status.measured_at > dt.timedelta(seconds=resource.spec.max_age_seconds):
        return None
    return profile


def ensure_profile(
    kube: Kube, spec: AdaptationRunSpec, namespace: str, node: str | None, log: Callable[[str], None]
) -> ProfileOutcome:
    name = profile_name(spec.class_fingerprint, namespace)
    machine_fp = fingerprint(detect_machine())
    now = dt.datetime.now(dt.UTC)
    current = kube.get_profile(name)
    found = usable(current, namespace, machine_fp, now)
    if found is not None:
        return ProfileOutcome(found, name, reused=True)
    if current is None:
        body = HardwareProfileResource(
            metadata={
                "name": name,
                "labels": {
                    LABEL_CLASS_FINGERPRINT: spec.class_fingerprint,
                    LABEL_NAMESPACE: namespace,
                },
            },
            spec=HardwareProfileSpec(
                fingerprint=spec.class_fingerprint, hardware_class=spec.hardware_class, namespace=namespace
            ),
        ).to_api()
        try:
            current = kube.create_profile(body)
        except KubeError as exc:
            if exc.status != 409:
                raise
            current = kube.get_profile(name)  # another Job of this class created it first
            found = usable(current, namespace, machine_fp, now)
            if found is not None:
                return ProfileOutcome(found, name, reused=True)
    log(f"measuring the hardware profile of class {spec.class_fingerprint} (machine {machine_fp})")
    profile = measure_profile(bench_config())
    kube.patch_profile_status(name, _status(current, profile, node))
    return ProfileOutcome(profile, name, reused=False)


def _status(current: dict[str, Any] | None, profile: HardwareProfile, node: str | None) -> dict[str, Any]:
    previous = HardwareProfileStatus()
    if current is not None and current.get("status"):
        try:
            previous = HardwareProfileStatus.model_validate(current["status"])
        except ValidationError:
            previous = HardwareProfileStatus()
    generation = (current or {}).get("metadata", {}).get("generation")
    nodes = previous.nodes if node is None or node in previous.nodes else [*previous.nodes, node][-256:]
    conditions = set_condition(
        previous.conditions,
        ConditionType.READY,
        "True",
        Reason.PROFILE_MEASURED,
        f"measured on {profile.machine.cpu_model} with ONNX Runtime {profile.machine.onnxruntime_version}"
        f" in {profile.duration_s:.1f} s",
        observed_generation=generation,
    )
    status = previous.model_copy(
        update={
            "observed_generation": generation,
            "conditions": conditions,
            "measured_at": profile.measured_at,
            "nodes": nodes,
            "profile": profile,
        }
    )
    return status.to_api()
