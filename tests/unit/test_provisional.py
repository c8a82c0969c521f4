"""A class with no variant of its own serves the most similar class's (core.control.provisional): only a variant its
hardware can run, for the policy's current model; and its status says what the pods' on-node checks made of the
lent variant, FP32 where they refused it. On the in-memory cluster of reconcile_cluster, since the donor is a run
of another class that earlier reconciles finished."""

from __future__ import annotations

import json
from typing import Any

from reconcile_cluster import A100, A100_NEW, ARM, CPU, Cluster


def test_a_class_is_provisional_only_with_a_variant_its_hardware_can_run_for_the_current_model() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (cpu_run,) = c.runs
    c.finish(cpu_run)
    c.reconcile({"c1": CPU})
    plan = c.reconcile({"c1": CPU, "g1": A100, "a1": ARM})  # another vendor, another architecture: nothing to lend
    assert {s.state for s in plan.class_statuses if s.hardware_class and s.hardware_class.vendor != "cpu"} == {
        "Adapting"
    }
    assert len(c.deployments) == 1
    c.edit(model={"uri": "https://m/x2.onnx", "sha256": "b" * 64})  # a variant of another model is no donor
    plan = c.reconcile({"c1": CPU, "c2": {**CPU, "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true"}})
    assert all(s.state != "Provisional" for s in plan.class_statuses)
    assert len(c.deployments) == 1


def test_the_most_similar_class_lends_its_variant() -> None:
    from metainfer.core.api.hardwareclass import HardwareClass
    from metainfer.core.control.provisional import class_similarity

    a100 = HardwareClass(vendor="nvidia", product="A100", driver_version="550", memory_mib=81920)
    assert class_similarity(a100, a100) == 1.0
    new_driver = a100.model_copy(update={"driver_version": "555"})
    other_gpu = a100.model_copy(update={"product": "L4", "memory_mib": 24576})
    assert class_similarity(new_driver, a100) > class_similarity(new_driver, other_gpu) > 0
    assert class_similarity(a100, HardwareClass(vendor="cpu", product="generic")) == 0.0
    assert class_similarity(a100, a100.model_copy(update={"cpu_arch": "arm64"})) == 0.0


def _checked_pod(deployment: dict[str, Any], name: str, message: str, exit_code: int = 0) -> dict[str, Any]:
    """A pod of ``deployment`` whose init container ended with ``message``, as the API server returns it."""
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    terminated = {"exitCode": exit_code, "message": message, "reason": "Completed"}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"initContainerStatuses": [{"name": "check", "state": {"terminated": terminated}}]},
    }


def _check(serves: str, reason: str = "", p95: float = 3.0) -> str:
    budget = {"max_quality_drop": 0.01, "latency_p95_ms": 10}
    return json.dumps({"serves": serves, "quality_drop": 0.002, "latency_p95_ms": p95, "budget": budget,
                       "reason": reason, "samples": 64, "variant_sha256": "c" * 64})  # fmt: skip


def test_a_provisional_class_says_what_its_pods_on_node_checks_found() -> None:
    c = Cluster()
    c.reconcile({"g1": A100})
    (donor,) = c.runs
    c.finish(donor)
    c.reconcile({"g1": A100})
    plan = c.reconcile({"g1": A100, "g2": A100_NEW})
    (created,) = [a.manifest for a in plan.deployments_to_apply]
    pod = created["spec"]["template"]["spec"]
    (check,) = pod["initContainers"]
    assert check["args"][0] == "check-provisional" and "--recipe-json" in check["args"]
    assert check["args"][check["args"].index("--latency-p95-ms") + 1] == "10.0"
    (server,) = pod["containers"]
    assert "--recipe-json" not in server["args"], "serve takes what the check left"
    assert server["args"][server["args"].index("--variant") + 1].endswith("/variant.onnx")
    new = next(s for s in plan.class_statuses if s.state == "Provisional")
    assert "checks the variant on its node first" in new.message

    good, bad = _check("variant"), _check("fp32", "p95 31.00 ms over the SLO 10 ms", p95=31.0)
    c.pods = [_checked_pod(created, "p-1", good), _checked_pod(created, "p-2", bad)]
    new = next(s for s in c.reconcile({"g1": A100, "g2": A100_NEW}).class_statuses if s.state == "Provisional")
    assert "1 of 2 pods serve FP32" in new.message and "p95 31.00 ms over the SLO" in new.message
    assert new.current is not None and new.current.run_name == donor
    assert new.current.description == "FP32, default threads", "the donor's recipe, in words: some pods serve it"

    hostile = _checked_pod(created, "p-3", '{"serves": "rm -rf", "budget": {}}' + "x" * 10000)
    unfinished = _checked_pod(created, "p-4", bad, exit_code=1)
    c.pods = [_checked_pod(created, "p-2", bad), hostile, unfinished]
    new = next(s for s in c.reconcile({"g1": A100, "g2": A100_NEW}).class_statuses if s.state == "Provisional")
    assert "every pod serves FP32" in new.message, "unreadable and failed checks are not counted"
    assert new.current is not None and new.current.description
    assert new.current.description.startswith("FP32: the on-node check refused")
    assert new.current.run_name == donor, "the donor stays the stable side of the canary to come"
    assert len(new.message) <= 4096
