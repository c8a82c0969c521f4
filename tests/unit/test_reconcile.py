"""plan_policy scenarios, played against a tiny in-memory 'API server' that applies each Plan."""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
from typing import Any

import pytest
from pydantic import ValidationError

from metainfer.core.api.conditions import Reason
from metainfer.core.api.policy import AdaptationPolicy
from metainfer.core.api.run import AdaptationRun
from metainfer.core.control.decisions import ClassContext, ClassPlan, Decisions
from metainfer.core.control.events import Event
from metainfer.core.control.hardware import ClassGroup, group_nodes
from metainfer.core.control.naming import job_name
from metainfer.core.control.objects import parse_runs
from metainfer.core.control.pod_checks import read_pod_checks
from metainfer.core.control.reconcile import (
    Plan,
    RunLimits,
    plan_class,
    plan_classes,
    plan_job,
    plan_policy,
    run_phase,
    run_status_from_job,
)
from metainfer.core.control.settings import AgentJobSettings, ServingDefaults, VendorImage
from metainfer.core.control.slim import slim_deployment, slim_job, slim_run
from metainfer.core.engine.recipe import Recipe

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
A100 = {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "A100", "nvidia.com/cuda.driver-version.full": "550"}
A100_NEW = {**A100, "nvidia.com/cuda.driver-version.full": "555"}
CPU = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}
ARM = {"kubernetes.io/arch": "arm64"}


class Cluster:
    """Holds the policy, its runs and Deployments; ``reconcile`` plans and applies like the handler would."""

    def __init__(self, **spec: Any) -> None:
        self.policy: dict[str, Any] = {
            "apiVersion": "metainfer.io/v1alpha1",
            "kind": "AdaptationPolicy",
            "metadata": {"name": "digits", "namespace": "ns", "uid": "uid-p", "generation": 1},
            "spec": {"model": {"uri": "https://m/x.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 10}, **spec},
        }
        self.runs: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.clock = itertools.count()
        self.job_settings: AgentJobSettings | None = None
        self.serving: ServingDefaults | None = None
        self.pods: list[dict[str, Any]] = []  # provisional pods, as the operator lists them for their checks
        self.rollout_waits: dict[str, str] = {}  # why a Deployment's pods do not become Ready (operator.waits)

    def reconcile(self, nodes: dict[str, dict[str, str]], limits: RunLimits | None = None) -> Plan:
        groups = list(group_nodes(nodes.items()).values())
        policy = AdaptationPolicy.model_validate(self.policy)
        runs = parse_runs(self.runs.values())
        deployments = list(self.deployments.values())
        settings = {
            "job_settings": self.job_settings,
            "serving": self.serving,
            "pod_checks": read_pod_checks(self.pods),
            "rollout_waits": self.rollout_waits,
        }
        plan = plan_policy(policy, groups, runs.valid, deployments, NOW, limits, invalid_runs=runs.invalid, **settings)
        # The operator plans on slimmed copies (core.control.slim): every scenario must plan the same on them.
        slim_runs = parse_runs(slim_run(r) for r in self.runs.values())
        slimmed = plan_policy(
            policy,
            groups,
            slim_runs.valid,
            [slim_deployment(d) for d in deployments],
            NOW,
            limits,
            invalid_runs=slim_runs.invalid,
            **settings,
        )
        assert slimmed == plan, "core.control.slim dropped a field the reconcile reads"
        for planned in plan.runs_to_create:
            run = copy.deepcopy(planned.manifest)
            run["metadata"] |= {
                "uid": f"uid-{run['metadata']['name']}",
                "creationTimestamp": f"t{next(self.clock):04d}",
            }
            assert run["metadata"]["name"] not in self.runs, "a run is never created twice"
            self.runs[run["metadata"]["name"]] = run
        for name in plan.runs_to_delete:
            del self.runs[name]
        for action in plan.deployments_to_apply:
            dep = copy.deepcopy(action.manifest)
            assert (action.action == "create") == (dep["metadata"]["name"] not in self.deployments)
            dep["metadata"]["generation"] = 1
            want = dep["spec"]["replicas"]
            dep["status"] = {"observedGeneration": 1, "updatedReplicas": want, "availableReplicas": want}
            self.deployments[dep["metadata"]["name"]] = dep
        for name in plan.deployments_to_delete:
            del self.deployments[name]
        assert plan.status is not None
        self.policy["status"] = plan.status.to_api()
        return plan

    def finish(self, name: str, ok: bool = True, history: bool = False, ended: str = "00:30") -> None:
        run = self.runs[name]
        if ok:
            recipe = Recipe()
            run["status"] = {
                "phase": "Succeeded",
                "bestRecipe": recipe.model_dump(mode="json"),
                "bestRecipeKey": recipe.key(),
                "bestMetrics": {"p95Ms": 4.0, "qualityDrop": 0.0},
                "completionTime": f"2026-01-01T{ended}:00Z",
            }
            if history:
                run["status"]["trialHistory"] = {"trials": 3, "searchSeconds": 1.0, "data": "H4sI" + "A" * 400}
        else:
            run["status"] = {
                "phase": "Failed",
                "conditions": [
                    {
                        "type": "Succeeded",
                        "status": "False",
                        "reason": "ChecksumMismatch",
                        "message": "model sha256 is b..., expected a...",
                        "lastTransitionTime": "2026-01-01T00:05:00Z",
                    }
                ],
            }

    def edit(self, **spec: Any) -> None:
        self.policy["spec"] = {**self.policy["spec"], **spec}
        self.policy["metadata"]["generation"] += 1


def model(run: dict[str, Any]) -> AdaptationRun:
    return AdaptationRun.model_validate(run)


def ready(plan: Plan) -> tuple[str, str]:
    cond = next(c for c in plan.conditions if c.type == "Ready")
    return cond.status, cond.reason


def test_new_class_gets_one_run_and_planning_again_creates_nothing() -> None:
    c = Cluster()
    plan = c.reconcile({"n1": CPU, "n2": CPU})
    assert [p.reason for p in plan.runs_to_create] == [Reason.NEW_HARDWARE_CLASS]
    (cls,) = plan.class_statuses
    assert (cls.state, cls.nodes, cls.node_names) == ("Adapting", 2, ["n1", "n2"])
    assert ready(plan) == ("False", Reason.ADAPTING)
    assert any(e.reason == Reason.NEW_HARDWARE_CLASS for e in plan.events)
    again = c.reconcile({"n1": CPU, "n2": CPU})
    assert again.runs_to_create == [] and again.runs_to_delete == [] and again.deployments_to_apply == []
    assert not any(e.reason == Reason.NEW_HARDWARE_CLASS for e in again.events)
    assert again.class_statuses[0].state == "Adapting"


def test_two_classes_success_rolls_out_then_ready() -> None:
    c = Cluster()
    nodes = {"g1": A100, "c1": CPU}
    plan = c.reconcile(nodes)
    assert len(plan.runs_to_create) == 2 and len(c.runs) == 2
    for name in c.runs:
        c.finish(name)
    plan = c.reconcile(nodes)
    assert sorted(a.action for a in plan.deployments_to_apply) == ["create", "create"]
    class_services = [s for s in plan.objects_to_create if s["kind"] == "Service" and s["metadata"]["name"] != "digits"]
    assert len(class_services) == 2 and {s.state for s in plan.class_statuses} == {"RollingOut"}
    # Each serving class gets a disruption budget over the pods its own Service selects: a drain takes one at a time.
    budgets = {b["metadata"]["name"]: b for b in plan.objects_to_create if b["kind"] == "PodDisruptionBudget"}
    assert sorted(budgets) == sorted(s["metadata"]["name"] for s in class_services)
    for service in class_services:
        budget = budgets[service["metadata"]["name"]]
        assert budget["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        assert budget["spec"]["maxUnavailable"] == 1
    plan = c.reconcile(nodes)
    assert plan.deployments_to_apply == [] and plan.runs_to_create == []
    assert {s.state for s in plan.class_statuses} == {"Ready"}
    assert ready(plan) == ("True", Reason.ALL_CLASSES_READY)
    assert plan.status is not None and plan.status.classes_summary == "2/2" and plan.status.worst_class_p95_ms == 4.0
    cls = plan.class_statuses[0]
    assert cls.current is not None and cls.current.p95_ms == 4.0 and cls.last_adaptation_reason == "NewHardwareClass"


def test_rollout_waits_for_available_replicas() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    c.finish(next(iter(c.runs)))
    c.reconcile({"c1": CPU})
    (dep,) = c.deployments.values()
    dep["status"] = {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 0}
    assert c.reconcile({"c1": CPU}).class_statuses[0].state == "RollingOut"
    assert c.reconcile({"c1": CPU}, RunLimits(wait_for_available=False)).class_statuses[0].state == "Ready"


def test_a_rollout_its_controller_cannot_progress_says_why() -> None:
    """A ResourceQuota refusing the serving pods left the class RollingOut with the run's last progress line."""
    c = Cluster()
    c.reconcile({"c1": CPU})
    c.finish(next(iter(c.runs)))
    c.reconcile({"c1": CPU})
    (dep,) = c.deployments.values()
    refused = 'pods "digits-c1-5d9f-abcde" is forbidden: exceeded quota: compute, requested: limits.cpu=500m'
    dep["status"] = {
        "observedGeneration": 1, "updatedReplicas": 0, "availableReplicas": 0,
        "conditions": [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetCreated"},
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": refused},
        ],
    }  # fmt: skip
    (cls,) = c.reconcile({"c1": CPU}).class_statuses
    assert cls.state == "RollingOut" and cls.message == f"rolling out {dep['metadata']['name']}: waiting: " + (
        f"FailedCreate: {refused}"
    )
    timed_out = 'ReplicaSet "x" has timed out progressing.' + "\n" * 3 + "z" * 5000
    dep["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": timed_out}
    ]
    (cls,) = c.reconcile({"c1": CPU}).class_statuses
    assert "waiting: ProgressDeadlineExceeded: ReplicaSet" in (cls.message or "") and len(cls.message or "") < 1100
    dep["status"] = {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2}
    assert c.reconcile({"c1": CPU}).class_statuses[0].message == "serving the best variant"


def test_a_rollout_whose_new_pod_cannot_start_says_why_once_while_the_old_one_serves() -> None:
    """A spec.serving.resources no node has room for: the class said nothing until the Deployment's progress
    deadline, ten minutes later. Its pods say why (core.control.rollout_waits), and a Warning says it once."""
    c = Cluster()
    c.reconcile({"c1": CPU})
    c.finish(next(iter(c.runs)))
    c.reconcile({"c1": CPU})
    (name,) = c.deployments
    c.deployments[name]["status"] = {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1}
    why = "its pod digits-c1-5d9f-abcde cannot be scheduled: 0/1 nodes are available: 1 Insufficient cpu."
    c.rollout_waits = {name: why}
    plan = c.reconcile({"c1": CPU})
    (cls,) = plan.class_statuses
    assert cls.state == "RollingOut" and cls.message == f"rolling out {name}: waiting: {why}"
    (event,) = [e for e in plan.events if e.reason == Reason.ROLLOUT_WAITING]
    assert event.type == "Warning" and event.message == cls.message
    c.rollout_waits = {name: why.replace("abcde", "fghij")}  # the next try's pod: the same cause, said once
    again = c.reconcile({"c1": CPU})
    assert "fghij" in (again.class_statuses[0].message or "")
    assert not [e for e in again.events if e.reason == Reason.ROLLOUT_WAITING]
    pulling = "its pod digits-c1-5d9f-fghij waits: container server: ImagePullBackOff: Back-off pulling image"
    c.rollout_waits = {name: pulling}
    assert [e.reason for e in c.reconcile({"c1": CPU}).events if e.type == "Warning"] == [Reason.ROLLOUT_WAITING]
    crashing = "its pod digits-c1-5d9f-fghij waits: container server: CrashLoopBackOff: back-off 10s"
    c.rollout_waits = {name: crashing}
    assert [e.reason for e in c.reconcile({"c1": CPU}).events] == [Reason.ROLLOUT_WAITING], "another cause"
    c.deployments[name]["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}
    ]
    late = c.reconcile({"c1": CPU})
    assert "CrashLoopBackOff" in (late.class_statuses[0].message or ""), "the pod's reason, not the deadline's"
    assert not late.events
    c.rollout_waits = {}
    c.deployments[name]["status"] = {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2}
    assert c.reconcile({"c1": CPU}).class_statuses[0].message == "serving the best variant"


def test_a_canary_whose_pod_cannot_start_says_why_beside_its_analysis() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    _second_run_with_new_recipe(c, nodes)
    c.reconcile(nodes)
    (canary,) = [n for n in c.deployments if n.endswith("-canary")]
    c.deployments[canary]["status"] = {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 0}
    why = "its pod x waits: container serve: CrashLoopBackOff: back-off; it was last killed for memory (OOMKilled)"
    c.rollout_waits = {canary: why}
    plan = c.reconcile(nodes)
    (cls,) = plan.class_statuses
    assert cls.rollout is not None and cls.rollout.phase == "Canary", "the analysis decides: it rolls back"
    assert cls.message == f"{cls.rollout.message}: waiting: {why}"
    assert [e.reason for e in plan.events if e.type == "Warning"] == [Reason.ROLLOUT_WAITING]
    assert plan.deployments_to_apply == [], "nothing re-applied for it"


def test_driver_change_new_run_and_old_class_cleaned_up() -> None:
    c = Cluster()
    c.reconcile({"g1": A100, "g2": A100})
    c.finish(next(iter(c.runs)))
    c.reconcile({"g1": A100, "g2": A100})
    c.reconcile({"g1": A100, "g2": A100})
    assert len(c.deployments) == 1
    old_dep = next(iter(c.deployments))
    (old_run,) = c.runs
    plan = c.reconcile({"g1": A100_NEW, "g2": A100})  # g1 upgraded: both classes exist
    assert [p.reason for p in plan.runs_to_create] == [Reason.DRIVER_CHANGE]
    new_run = plan.runs_to_create[0].manifest["metadata"]["name"]
    assert plan.deployments_to_delete == [] and len(plan.class_statuses) == 2
    # The new class serves at once, provisionally, with the old class's variant (the same GPU, another driver).
    new_class = next(s for s in plan.class_statuses if s.hardware_class and s.hardware_class.driver_version == "555")
    assert new_class.state == "Provisional" and new_class.reason == Reason.PROVISIONAL
    assert new_class.current is not None and new_class.current.run_name == old_run and old_run in new_class.message
    (created,) = [a for a in plan.deployments_to_apply if a.manifest["metadata"]["name"] != old_dep]
    assert created.manifest["metadata"]["labels"]["metainfer.io/run"] == old_run
    assert any(e.reason == Reason.PROVISIONAL for e in plan.events)
    plan = c.reconcile({"g1": A100_NEW, "g2": A100_NEW})  # g2 upgraded: the old class has no nodes left
    # Make before break: the old class's Deployment goes only because the new class's provisional pods serve.
    assert plan.runs_to_create == [] and plan.deployments_to_delete == [old_dep]
    assert any(e.reason == "ClassRemoved" and "serves from a selected class" in e.message for e in plan.events)
    assert [s.hardware_class.driver_version for s in plan.class_statuses if s.hardware_class] == ["555"]
    c.finish(new_run)
    plan = c.reconcile({"g1": A100_NEW, "g2": A100_NEW})  # the class's own variant replaces the provisional one
    (update,) = plan.deployments_to_apply
    assert update.action == "update" and update.manifest["metadata"]["labels"]["metainfer.io/run"] == new_run
    assert plan.class_statuses[0].state == "RollingOut"
    assert c.reconcile({"g1": A100_NEW, "g2": A100_NEW}).class_statuses[0].state == "Ready"
    assert len(c.runs) == 2  # the old class's finished run stays as history


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


def test_a_provisional_class_keeps_its_checked_pods_while_its_own_variant_is_a_canary() -> None:
    c = Cluster(serving={"replicas": 2})
    c.reconcile({"g1": A100})
    (donor,) = c.runs
    c.finish(donor)
    c.reconcile({"g1": A100})
    nodes = {"g1": A100, "g2": A100_NEW}
    c.reconcile(nodes)
    (own,) = set(c.runs) - {donor}
    (lent,) = [d for d in c.deployments.values() if d["metadata"]["labels"]["metainfer.io/run"] == donor
               and "metainfer.io/provisional" in d["metadata"]["labels"]]  # fmt: skip
    lent_before = copy.deepcopy(lent)
    c.finish(own)
    recipe = Recipe.model_validate({"session": {"intra_op_num_threads": 4}})  # another variant than the donor's
    c.runs[own]["status"] |= {"bestRecipe": recipe.model_dump(mode="json"), "bestRecipeKey": recipe.key()}
    plan = c.reconcile(nodes)
    (canary,) = [a.manifest for a in plan.deployments_to_apply]
    assert canary["metadata"]["name"].endswith("-canary") and canary["metadata"]["labels"]["metainfer.io/run"] == own
    assert "initContainers" not in canary["spec"]["template"]["spec"], "its own variant needs no on-node check"
    assert c.deployments[lent["metadata"]["name"]] == lent_before, (
        "the checked provisional pods keep serving as they are"
    )
    (in_canary,) = [cls for cls in c.policy["status"]["classes"] if (cls.get("rollout") or {}).get("phase") == "Canary"]
    in_canary["rollout"]["phase"] = "RolledBack"  # a rolled-back canary leaves the lent variant, still checked
    plan = c.reconcile(nodes)
    assert plan.deployments_to_delete == [canary["metadata"]["name"]]
    assert all(a.manifest["metadata"]["name"] != lent["metadata"]["name"] for a in plan.deployments_to_apply)
    assert c.deployments[lent["metadata"]["name"]] == lent_before


def test_new_runs_name_the_policys_ended_runs_as_history_own_class_first_newest_first() -> None:
    c = Cluster()
    c.reconcile({"g1": A100, "c1": CPU})
    names = {model(r).spec.class_fingerprint: name for name, r in c.runs.items()}
    assert all(not model(r).spec.history_from for r in c.runs.values()), "nothing has ended yet: a cold start"
    gpu_run, cpu_run = names[_fingerprint(A100)], names[_fingerprint(CPU)]
    c.finish(gpu_run, history=True, ended="00:30")
    c.finish(cpu_run, history=True, ended="00:40")
    c.reconcile({"g1": A100, "c1": CPU})
    plan = c.reconcile({"g1": A100_NEW, "c1": CPU})  # a driver change: the new class learns from both
    (created,) = plan.runs_to_create
    assert model(created.manifest).spec.history_from == [cpu_run, gpu_run]
    c.edit(slo={"latencyP95Ms": 10, "batchSize": 4})  # a batch change: each class first learns from its own run
    plan = c.reconcile({"g1": A100_NEW, "c1": CPU})
    by_class = {
        model(p.manifest).spec.class_fingerprint: model(p.manifest).spec.history_from for p in plan.runs_to_create
    }
    assert by_class[_fingerprint(CPU)] == [cpu_run, gpu_run]
    assert slim_run(c.runs[cpu_run])["status"]["trialHistory"]["data"] == "", "the operator keeps no trial data"


def test_model_change_readapts_every_class_and_keeps_serving_the_old_variant() -> None:
    c = Cluster()
    nodes = {"g1": A100, "c1": CPU}
    c.reconcile(nodes)
    for name in c.runs:
        c.finish(name)
    c.reconcile(nodes)
    c.edit(model={"uri": "https://m/y.onnx", "sha256": "b" * 64})
    plan = c.reconcile(nodes)
    assert [p.reason for p in plan.runs_to_create] == [Reason.MODEL_CHANGE] * 2
    assert plan.deployments_to_apply == [] and plan.deployments_to_delete == []
    assert all(s.state == "Adapting" and s.current is not None for s in plan.class_statuses)


def test_batch_and_spec_changes() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    c.edit(slo={"latencyP95Ms": 10, "batchSize": 8})
    plan = c.reconcile({"c1": CPU})
    assert [p.reason for p in plan.runs_to_create] == [Reason.BATCH_CHANGE]
    assert len(plan.runs_to_delete) == 1, "the superseded unfinished run is cancelled"
    c.edit(search={"trialBudget": 64})
    assert [p.reason for p in c.reconcile({"c1": CPU}).runs_to_create] == [Reason.SPEC_CHANGE]
    c.edit(serving={"replicas": 3})  # not part of the run key: nothing re-adapts
    assert c.reconcile({"c1": CPU}).runs_to_create == []


def test_concurrency_limits_per_policy_and_cluster() -> None:
    c = Cluster(search={"maxConcurrentRuns": 2})
    nodes = {"g1": A100, "c1": CPU, "a1": ARM}
    plan = c.reconcile(nodes)
    assert len(plan.runs_to_create) == 2
    waiting = [s for s in plan.class_statuses if s.state == "Pending"]
    assert len(waiting) == 1 and waiting[0].reason == Reason.CONCURRENCY_LIMIT
    assert c.reconcile(nodes).runs_to_create == []  # still two in flight
    c.finish(next(iter(c.runs)))
    assert len(c.reconcile(nodes).runs_to_create) == 1
    fresh = Cluster(search={"maxConcurrentRuns": 5})
    assert len(fresh.reconcile(nodes, RunLimits(cluster_max_in_flight=8, cluster_in_flight=7)).runs_to_create) == 1


def test_failed_run_degrades_the_class_once() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    c.finish(next(iter(c.runs)), ok=False)
    plan = c.reconcile({"c1": CPU})
    (cls,) = plan.class_statuses
    assert (cls.state, cls.reason) == ("Degraded", "ChecksumMismatch") and "sha256" in (cls.message or "")
    assert ready(plan) == ("False", Reason.CLASS_FAILED)
    assert [e.type for e in plan.events if e.reason == "ChecksumMismatch"] == ["Warning"]
    again = c.reconcile({"c1": CPU})
    assert again.runs_to_create == [] and not any(e.type == "Warning" for e in again.events)


def test_all_nodes_gone() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    c.finish(next(iter(c.runs)))
    c.reconcile({"c1": CPU})
    names = list(c.deployments)
    assert len(names) == 1
    plan = c.reconcile({})  # the node relabelled away: its pods still serve, and nothing else would
    assert plan.deployments_to_delete == [] and plan.runs_to_delete == []
    assert plan.class_statuses == [] and ready(plan) == ("False", Reason.NO_MATCHING_NODES)
    c.deployments[names[0]]["status"]["availableReplicas"] = 0  # the node drained: nothing left to keep
    plan = c.reconcile({})
    assert plan.deployments_to_delete == names
    assert any(e.reason == "ClassRemoved" and "no available replica" in e.message for e in plan.events)


def test_plan_job_and_job_outcome() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (run,) = c.runs.values()
    group: ClassGroup = next(iter(group_nodes([("c1", CPU)]).values()))
    assert run_phase(model(run)) == "Pending"
    job = plan_job(model(run), None, group)
    assert job is not None and job["metadata"]["name"] == run["metadata"]["name"]
    assert plan_job(model(slim_run(run)), None, group) == job
    assert plan_job(model(run), job, group) is None
    assert plan_job(model(run), None, None) is None
    run["status"] = {"jobName": job["metadata"]["name"]}
    assert run_phase(model(run)) == "Running"
    assert plan_job(model(run), None, group) is None, "a recorded Job is never recreated"
    assert run_status_from_job(model(run), job, NOW) is None
    failed = {**job, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    patch = run_status_from_job(model(run), failed, NOW)
    assert patch is not None and patch["phase"] == "Failed"
    assert run_status_from_job(model(slim_run(run)), slim_job(failed), NOW) == patch
    assert patch["conditions"][0]["reason"] == Reason.BACKOFF_LIMIT_EXCEEDED
    gone = run_status_from_job(model(run), None, NOW)
    assert gone is not None and "deleted" in gone["conditions"][0]["message"]
    c.finish(run["metadata"]["name"])
    assert plan_job(model(run), None, group) is None and run_status_from_job(model(run), failed, NOW) is None


# --- canary rollout -------------------------------------------------------------------------------------------------


def _second_run_with_new_recipe(c: Cluster, nodes: dict[str, dict[str, str]]) -> str:
    """A Ready class, then a spec change whose run finds a different recipe (4 threads): returns the new run."""
    c.reconcile(nodes)
    (first,) = c.runs
    c.finish(first)
    c.reconcile(nodes)
    c.reconcile(nodes)
    c.edit(search={"trialBudget": 64})
    c.reconcile(nodes)
    (second,) = set(c.runs) - {first}
    c.finish(second)
    recipe = Recipe.model_validate({"session": {"intra_op_num_threads": 4}})
    c.runs[second]["status"] |= {"bestRecipe": recipe.model_dump(mode="json"), "bestRecipeKey": recipe.key()}
    return second


def _rollout(c: Cluster, phase: str) -> None:
    cls = c.policy["status"]["classes"][0]
    cls["rollout"]["phase"] = phase


def test_a_new_recipe_runs_as_a_canary_beside_the_unchanged_stable() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    second = _second_run_with_new_recipe(c, nodes)
    (stable_name,) = c.deployments
    stable_before = copy.deepcopy(c.deployments[stable_name])
    plan = c.reconcile(nodes)
    assert [a.action for a in plan.deployments_to_apply] == ["create"]
    canary = plan.deployments_to_apply[0].manifest
    assert canary["metadata"]["name"] == f"{stable_name}-canary"
    assert canary["spec"]["replicas"] == 1
    assert canary["spec"]["selector"]["matchLabels"]["metainfer.io/track"] == "canary"
    assert (
        canary["spec"]["template"]["spec"]["nodeSelector"] == stable_before["spec"]["template"]["spec"]["nodeSelector"]
    )
    assert c.deployments[stable_name] == stable_before, "the stable Deployment is not touched"
    (cls,) = plan.class_statuses
    assert cls.rollout is not None and cls.rollout.phase == "Canary" and cls.rollout.started_at == NOW
    assert cls.rollout.canary is not None and cls.rollout.canary.run_name == second
    assert cls.current is not None and cls.current.run_name != second and cls.state == "RollingOut"
    assert any(e.reason == Reason.CANARY_PROGRESSING for e in plan.events)
    again = c.reconcile(nodes)  # idempotent: no second canary, the analysis keeps its start
    assert again.deployments_to_apply == [] and again.deployments_to_delete == []
    assert again.class_statuses[0].rollout == cls.rollout
    assert not any(e.reason == Reason.CANARY_PROGRESSING for e in again.events)


def test_promoted_canary_becomes_stable_and_the_canary_goes() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    second = _second_run_with_new_recipe(c, nodes)
    c.reconcile(nodes)
    _rollout(c, "Promoted")  # what operator.rollout writes
    plan = c.reconcile(nodes)
    (stable_name,) = [n for n in c.deployments if not n.endswith("-canary")]
    assert [a.action for a in plan.deployments_to_apply] == ["update"]
    assert plan.deployments_to_apply[0].manifest["metadata"]["name"] == stable_name
    assert plan.deployments_to_delete == [f"{stable_name}-canary"]
    assert c.deployments[stable_name]["metadata"]["labels"]["metainfer.io/run"] == second
    plan = c.reconcile(nodes)
    (cls,) = plan.class_statuses
    assert cls.state == "Ready" and cls.current is not None and cls.current.run_name == second
    assert cls.rollout is not None and cls.rollout.phase == "Promoted"
    assert plan.deployments_to_apply == [] and plan.deployments_to_delete == []


def test_rolled_back_canary_goes_and_the_stable_stays() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    second = _second_run_with_new_recipe(c, nodes)
    c.reconcile(nodes)
    (stable_name,) = [n for n in c.deployments if not n.endswith("-canary")]
    stable_before = copy.deepcopy(c.deployments[stable_name])
    _rollout(c, "RolledBack")
    plan = c.reconcile(nodes)
    assert plan.deployments_to_apply == [] and plan.deployments_to_delete == [f"{stable_name}-canary"]
    assert c.deployments == {stable_name: stable_before}
    for _ in range(2):  # and it stays that way: the rolled-back run is never retried as a canary
        plan = c.reconcile(nodes)
        assert plan.deployments_to_apply == [] and plan.deployments_to_delete == []
    (cls,) = plan.class_statuses
    assert cls.state == "Ready" and cls.current is not None and cls.current.run_name != second
    assert cls.rollout is not None and cls.rollout.phase == "RolledBack"


def test_zero_canary_replicas_rolls_out_directly() -> None:
    c = Cluster(rollout={"canaryReplicas": 0})
    nodes = {"c1": CPU}
    second = _second_run_with_new_recipe(c, nodes)
    plan = c.reconcile(nodes)
    assert [a.action for a in plan.deployments_to_apply] == ["update"]
    assert not any(n.endswith("-canary") for n in c.deployments)
    assert c.policy["status"]["classes"][0].get("rollout") is None
    assert next(iter(c.deployments.values()))["metadata"]["labels"]["metainfer.io/run"] == second


def test_slimmed_children_drop_what_the_reconcile_never_reads() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (run,) = c.runs.values()
    group: ClassGroup = next(iter(group_nodes([("c1", CPU)]).values()))
    job = plan_job(model(run), None, group)
    assert job is not None
    managed = [{"manager": "kube-controller-manager", "fieldsV1": {"f:status": {}}}]
    job["metadata"]["managedFields"] = managed
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    slim = slim_job(job)
    assert slim == {
        "metadata": {k: v for k, v in job["metadata"].items() if k in ("name", "namespace", "labels", "annotations")},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    run["metadata"]["managedFields"] = managed
    run["status"] = {"phase": "Succeeded", "trials": [{"index": i} for i in range(200)]}
    assert slim_run(run)["status"] == {"phase": "Succeeded"} and "managedFields" not in slim_run(run)["metadata"]
    deployment = {
        "metadata": {"name": "d", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "serve"}]}}},
        "status": {"availableReplicas": 2},
    }
    assert slim_deployment(deployment) == {
        "metadata": {"name": "d"},
        "spec": {"replicas": 2},
        "status": {"availableReplicas": 2},
    }
    slim["status"]["conditions"][0]["status"] = "False"
    assert job["status"]["conditions"][0]["status"] == "True", "a slimmed copy is detached from its source"


# --- Jobs in the plan -----------------------------------------------------------------------------------------------


def _fingerprint(labels: dict[str, str]) -> str:
    return next(iter(group_nodes([("n", labels)]).values())).fingerprint


def _plan(c: Cluster, nodes: dict[str, dict[str, str]], **kwargs: Any) -> Plan:
    """A plan for the cluster as it is, without applying it."""
    runs = parse_runs(c.runs.values())
    groups = list(group_nodes(nodes.items()).values())
    policy = AdaptationPolicy.model_validate(c.policy)
    return plan_policy(
        policy, groups, runs.valid, list(c.deployments.values()), NOW, invalid_runs=runs.invalid, **kwargs
    )


def test_a_run_without_a_job_gets_one_and_an_ended_job_fails_its_run() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    c.reconcile(nodes)
    (name,) = c.runs
    (job,) = c.reconcile(nodes).jobs_to_create
    assert job.run_name == name and job.manifest["metadata"]["name"] == job_name(name)
    assert _plan(c, nodes, jobs={job_name(name): job.manifest}).jobs_to_create == []
    c.runs[name]["status"] = {"jobName": job_name(name)}
    conditions = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]
    ended = {**job.manifest, "status": {"conditions": conditions}}
    plan = _plan(c, nodes, jobs={job_name(name): slim_job(ended)})
    (failed,) = plan.runs_to_fail
    assert failed.run_name == name and failed.status["conditions"][0]["reason"] == Reason.DEADLINE_EXCEEDED
    assert plan.jobs_to_create == []


def test_the_class_says_why_its_run_waits_with_one_warning_while_it_lasts() -> None:
    """A Job whose pod a ResourceQuota refused left the class at "Pending: 0/? trials" until its deadline."""
    c = Cluster()
    nodes = {"c1": CPU}
    c.reconcile(nodes)
    (name,) = c.runs
    c.runs[name]["status"] = {"phase": "Pending", "jobName": job_name(name)}
    why = 'the Job cannot create its pod: pods "x" is forbidden: exceeded quota: compute, requested: limits.cpu=2'

    plan = _plan(c, nodes, job_waits={job_name(name): why})
    (cls,) = plan.class_statuses
    assert cls.state == "Adapting" and cls.message == f"Pending: 0/? trials; waiting: {why}"
    (event,) = [e for e in plan.events if e.reason == Reason.JOB_WAITING]
    assert event.type == "Warning" and name in event.message and "exceeded quota" in event.message
    assert plan.status is not None
    c.policy["status"] = plan.status.to_api()
    again = _plan(c, nodes, job_waits={job_name(name): why})
    assert again.class_statuses[0].message == cls.message
    assert not [e for e in again.events if e.reason == Reason.JOB_WAITING], "said once while it lasts"
    # the Job controller's next try: another generated pod name, the same cause
    retried = _plan(c, nodes, job_waits={job_name(name): why.replace('"x"', '"y"')})
    assert '"y"' in (retried.class_statuses[0].message or "")
    assert not [e for e in retried.events if e.reason == Reason.JOB_WAITING]
    # the quota raised: the pod runs and the message is the run's progress again
    assert _plan(c, nodes).class_statuses[0].message == "Pending: 0/? trials"


# --- runs that do not validate --------------------------------------------------------------------------------------


def test_an_unreadable_run_holds_its_class_and_only_its_class() -> None:
    nodes = {"g1": A100, "c1": CPU}
    c = Cluster()
    c.reconcile(nodes)
    for name in c.runs:
        c.finish(name)
    c.reconcile(nodes)
    c.reconcile(nodes)
    cpu, gpu = _fingerprint(CPU), _fingerprint(A100)
    (bad,) = [n for n, r in c.runs.items() if r["spec"]["classFingerprint"] == cpu]
    c.runs[bad]["status"]["surprise"] = "a field this operator does not know"
    deployments = copy.deepcopy(c.deployments)
    plan = c.reconcile(nodes)
    held = next(s for s in plan.class_statuses if s.fingerprint == cpu)
    assert (held.state, held.reason) == ("Degraded", Reason.INVALID_SPEC)
    assert bad in (held.message or "") and "status.surprise" in (held.message or "")
    assert held.current is not None and held.current.run_name == bad, "what it serves stays in the status"
    assert plan.runs_to_create == [] and plan.runs_to_delete == []
    assert plan.deployments_to_apply == [] and plan.deployments_to_delete == [] and c.deployments == deployments
    assert [e.type for e in plan.events if e.reason == Reason.INVALID_SPEC] == ["Warning"]
    assert next(s for s in plan.class_statuses if s.fingerprint == gpu).state == "Ready"
    degraded = next(cond for cond in plan.conditions if cond.type == "Degraded")
    assert degraded.status == "True" and Reason.INVALID_SPEC in degraded.message
    assert not any(e.reason == Reason.INVALID_SPEC for e in c.reconcile(nodes).events), "said once"
    c.edit(search={"trialBudget": 64})  # while held, only the readable class re-adapts
    assert [p.manifest["spec"]["classFingerprint"] for p in c.reconcile(nodes).runs_to_create] == [gpu]
    del c.runs[bad]["status"]["surprise"]  # readable again: the class catches up
    plan = c.reconcile(nodes)
    assert [(p.manifest["spec"]["classFingerprint"], p.reason) for p in plan.runs_to_create] == [
        (cpu, Reason.SPEC_CHANGE)
    ]


def test_a_held_class_still_gets_the_jobs_of_its_readable_runs() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    c.reconcile(nodes)
    (name,) = c.runs
    broken = copy.deepcopy(c.runs[name])
    broken["metadata"]["name"] = "digits-by-hand"
    broken["spec"]["reason"] = "Because"
    c.runs["digits-by-hand"] = broken
    plan = c.reconcile(nodes)
    (cls,) = plan.class_statuses
    assert (cls.state, cls.reason) == ("Degraded", Reason.INVALID_SPEC) and "spec.reason" in (cls.message or "")
    assert plan.runs_to_create == [] and plan.runs_to_delete == []
    assert [j.run_name for j in plan.jobs_to_create] == [name]


def test_an_unreadable_run_of_no_selected_class_is_reported_and_changes_nothing_else() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    c.reconcile(nodes)
    expected = _plan(c, nodes)
    c.runs["stray"] = {"metadata": {"name": "stray", "namespace": "ns"}, "spec": {"classFingerprint": "xyz"}}
    plan = c.reconcile(nodes)
    (warning,) = [e for e in plan.events if e.reason == Reason.INVALID_SPEC]
    assert warning.type == "Warning" and "stray" in warning.message and "spec.policyName" in warning.message
    assert plan == Plan(**{**vars(expected), "events": [*expected.events, warning]})


# --- per-class plans and their merge --------------------------------------------------------------------------------


def _contexts(c: Cluster, nodes: dict[str, dict[str, str]]) -> list[ClassContext]:
    policy = AdaptationPolicy.model_validate(c.policy)
    before = {s.fingerprint: s for s in (policy.status.classes if policy.status else [])}
    runs = parse_runs(c.runs.values()).valid
    return [
        ClassContext(
            policy=policy,
            group=group,
            runs=tuple(r for r in runs if r.spec.class_fingerprint == group.fingerprint),
            policy_runs=tuple(runs),
            invalid_runs=(),
            previous_classes=before,
            deployments={},
            jobs={},
            job_settings=None,
            serving=None,
            wait_for_available=True,
            now=NOW,
        )
        for group in group_nodes(nodes.items()).values()
    ]


def test_the_plan_is_the_class_plans_merged_in_class_order() -> None:
    c = Cluster(search={"maxConcurrentRuns": 2})
    nodes = {"g1": A100, "c1": CPU, "a1": ARM}
    class_plans = plan_classes(_contexts(c, nodes), slots=2)
    assert [p.status.state for p in class_plans] == ["Adapting", "Adapting", "Pending"], "slots go in class order"
    merged = sum((p.decisions for p in class_plans), Decisions())
    plan = c.reconcile(nodes)
    assert plan.class_statuses == [p.status for p in class_plans]
    assert plan.runs_to_create == list(merged.runs_to_create) and plan.events == list(merged.events)
    assert plan.jobs_to_create == list(merged.jobs_to_create) == []


def test_planning_a_class_is_pure() -> None:
    c = Cluster()
    nodes = {"c1": CPU}
    c.reconcile(nodes)
    c.finish(next(iter(c.runs)))
    (context,) = _contexts(c, nodes)
    untouched = copy.deepcopy(context)
    first = plan_class(context, slot_free=True)
    assert plan_class(context, slot_free=True) == first and context == untouched
    assert first.status.state == "RollingOut" and len(first.decisions.deployments_to_apply) == 1
    assert plan_class(context, slot_free=False) == first, "a class with a current run needs no slot"


def test_decisions_concatenate_field_by_field_and_the_later_status_wins() -> None:
    first = Decisions(runs_to_delete=("r1",), events=(Event("Normal", Reason.ADAPTING, "one"),))
    later = Decisions(runs_to_delete=("r2",), deployments_to_delete=("d",), events=(Event("Warning", "X", "two"),))
    both = first + later
    assert both.runs_to_delete == ("r1", "r2") and both.deployments_to_delete == ("d",)
    assert [e.message for e in both.events] == ["one", "two"] and both.runs_to_create == ()
    (context,) = _contexts(Cluster(), {"c1": CPU})
    pending = plan_class(context, slot_free=False).status
    adapting = plan_class(context, slot_free=True).status
    assert ClassPlan(pending, first).then(ClassPlan(adapting, later)) == ClassPlan(adapting, both)


def test_a_failure_message_longer_than_the_class_status_allows_is_cut_not_a_wedge() -> None:
    # A run's condition message may hold 32,768 characters (e.g. a model server's long reason phrase); the class
    # status keeps 4,096. Copying it whole failed validation on every reconcile and froze the policy.
    c = Cluster()
    c.reconcile({"c1": CPU, "a1": A100})
    cpu_run = next(name for name, run in c.runs.items() if run["spec"]["hardwareClass"]["vendor"] == "cpu")
    c.finish(cpu_run, ok=False)
    c.runs[cpu_run]["status"]["conditions"][0]["message"] = "HTTP 502 " + "x" * 30000
    plan = c.reconcile({"c1": CPU, "a1": A100})
    degraded = next(cls for cls in plan.class_statuses if cls.state == "Degraded")
    assert degraded.message is not None and len(degraded.message) <= 4096
    assert degraded.message.startswith("HTTP 502") and degraded.message.endswith("[truncated]")
    assert [e.reason for e in plan.events if e.type == "Warning"] == ["ChecksumMismatch"]  # posted cut (events.py)
    other = next(cls for cls in plan.class_statuses if cls is not degraded)
    assert other.state == "Adapting", "the other class is planned as before"


def test_unclassifiable_nodes_are_listed_in_status_with_one_warning_and_the_classes_go_on() -> None:
    c = Cluster()
    policy = AdaptationPolicy.model_validate(c.policy)
    groups = list(group_nodes({"c1": CPU}.items()).values())
    bad = {f"gpu-{i:02d}": "accelerator memory label nvidia.com/gpu.memory = '999' is out of range" for i in range(20)}
    plan = plan_policy(policy, groups, [], [], NOW, unclassified_nodes=bad)
    assert plan.status is not None and len(plan.status.unclassified_nodes) == 16  # bounded, first by name
    assert plan.status.unclassified_nodes[0].name == "gpu-00"
    assert [e.reason for e in plan.events if e.type == "Warning"] == [Reason.NODE_UNCLASSIFIABLE]
    assert len(plan.runs_to_create) == 1, "the classifiable class is adapted as usual"
    c.policy["status"] = plan.status.to_api()
    again = plan_policy(AdaptationPolicy.model_validate(c.policy), groups, [], [], NOW, unclassified_nodes=bad)
    assert not any(e.reason == Reason.NODE_UNCLASSIFIABLE for e in again.events), "warned once, not every pass"
    fixed = plan_policy(AdaptationPolicy.model_validate(c.policy), groups, [], [], NOW)
    assert fixed.status is not None and fixed.status.unclassified_nodes == []


def test_a_new_model_with_the_same_recipe_still_goes_through_a_canary() -> None:
    # The variant served is (model, recipe): a new model whose best recipe equals the served one used to switch
    # every stable replica to the new model at once, untested.
    c = Cluster()
    nodes = {"c1": CPU}
    c.reconcile(nodes)
    (first,) = c.runs
    c.finish(first)
    c.reconcile(nodes)
    c.reconcile(nodes)
    c.edit(model={"uri": "https://m/x2.onnx", "sha256": "b" * 64})
    c.reconcile(nodes)
    (second,) = set(c.runs) - {first}
    c.finish(second)  # the same (default) recipe as the first run
    assert c.runs[second]["status"]["bestRecipeKey"] == c.runs[first]["status"]["bestRecipeKey"]
    plan = c.reconcile(nodes)
    (cls,) = plan.class_statuses
    assert cls.rollout is not None and cls.rollout.phase == "Canary"
    assert cls.rollout.canary is not None and cls.rollout.canary.run_name == second
    assert cls.current is not None and cls.rollout.canary.variant != cls.current.variant
    assert cls.current.recipe_key == cls.rollout.canary.recipe_key
    (canary,) = [a.manifest for a in plan.deployments_to_apply]
    env = {e["name"]: e["value"] for e in canary["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["METAINFER_VARIANT"] == cls.rollout.canary.variant, "its metrics are told apart from the stable's"


def test_one_namespace_cannot_hold_every_cluster_wide_slot() -> None:
    # One tenant's long runs used to take all cluster-wide slots for up to their 7-day deadline.
    nodes = {"g1": A100, "c1": CPU, "a1": ARM}
    limits = RunLimits(cluster_max_in_flight=8, cluster_in_flight=3, namespace_max_in_flight=4, namespace_in_flight=3)
    assert len(Cluster(search={"maxConcurrentRuns": 5}).reconcile(nodes, limits).runs_to_create) == 1
    full = RunLimits(cluster_max_in_flight=8, cluster_in_flight=4, namespace_max_in_flight=4, namespace_in_flight=4)
    plan = Cluster(search={"maxConcurrentRuns": 5}).reconcile(nodes, full)
    assert plan.runs_to_create == [] and all(s.reason == Reason.CONCURRENCY_LIMIT for s in plan.class_statuses)


def test_the_operators_default_gives_a_namespace_half_the_cluster() -> None:
    from metainfer.operator.config import OperatorConfig

    assert OperatorConfig(max_concurrent_runs=8).namespace_run_limit() == 4
    assert OperatorConfig(max_concurrent_runs=1).namespace_run_limit() == 1
    assert OperatorConfig(max_concurrent_runs=8, max_concurrent_runs_per_namespace=8).namespace_run_limit() == 8


def test_canary_weight_sets_the_canarys_share_of_pods() -> None:
    """canaryWeightPercent used to be validated and ignored; it now decides the canary's replicas."""
    c = Cluster(rollout={"canaryWeightPercent": 25}, serving={"replicas": 6})
    nodes = {"c1": CPU}
    _second_run_with_new_recipe(c, nodes)
    c.reconcile(nodes)
    (canary,) = [d for n, d in c.deployments.items() if n.endswith("-canary")]
    assert canary["spec"]["replicas"] == 2  # 2 / (2 + 6) = 25 %
    rollout = c.policy["status"]["classes"][0]["rollout"]
    assert "2 of 8 pods, about 25% of requests" in rollout["message"]


def test_canary_replicas_from_a_weight_are_rounded_and_at_least_one() -> None:
    from metainfer.core.api.policy import RolloutSettings

    assert RolloutSettings(canary_weight_percent=10).canary_replicas_for(2) == 1  # 0.22 -> at least one pod
    assert RolloutSettings(canary_weight_percent=50).canary_replicas_for(3) == 3
    assert RolloutSettings(canary_weight_percent=90).canary_replicas_for(1) == 9
    assert RolloutSettings(canary_replicas=2).canary_replicas_for(10) == 2  # no weight: canaryReplicas


def test_the_policy_has_one_stable_service_from_the_start_and_says_where() -> None:
    """Before any class serves, and unchanged when a driver upgrade replaces a class: clients keep one address."""
    c = Cluster()
    first = c.reconcile({"c1": CPU})
    (service,) = [s for s in first.objects_to_create if s["metadata"]["name"] == "digits"]
    selector = service["spec"]["selector"]
    assert selector["metainfer.io/policy"] == "digits" and selector["app.kubernetes.io/component"] == "serving"
    assert first.status.endpoint == f"digits.{service['metadata']['namespace']}.svc:8080"
    for name in c.runs:
        c.finish(name)
    c.reconcile({"c1": CPU})
    upgraded = c.reconcile({"c1": {**CPU, "feature.node.kubernetes.io/cpu-model.family": "99"}})
    assert [s for s in upgraded.objects_to_create if s["metadata"]["name"] == "digits"] == [service]
    assert upgraded.status.endpoint == first.status.endpoint


def test_a_suspended_policy_starts_and_rolls_out_nothing_and_keeps_what_serves() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (run,) = c.runs
    c.finish(run)
    c.reconcile({"c1": CPU})  # rolls out
    served = dict(c.deployments)
    c.edit(suspend=True, model={"uri": "https://m/x2.onnx", "sha256": "b" * 64})  # a new model, while held
    held = c.reconcile({"c1": CPU, "g1": A100})  # and new hardware
    assert held.runs_to_create == [] and held.jobs_to_create == [] and held.runs_to_delete == []
    assert held.deployments_to_apply == [] and held.deployments_to_delete == [] and c.deployments == served
    assert [s["metadata"]["name"] for s in held.objects_to_create] == ["digits"]  # the address stays
    progressing = next(x for x in held.conditions if x.type == "Progressing")
    assert (progressing.status, progressing.reason) == ("False", Reason.SUSPENDED)
    states = {s.name: (s.state, s.reason) for s in held.class_statuses}
    assert ("Pending", Reason.SUSPENDED) in states.values() and len(states) == 2
    assert held.status.endpoint == "digits.ns.svc:8080"
    c.edit(suspend=False)
    resumed = c.reconcile({"c1": CPU, "g1": A100})
    assert {p.reason for p in resumed.runs_to_create} == {Reason.MODEL_CHANGE, Reason.NEW_HARDWARE_CLASS}


def test_a_new_rerun_annotation_value_adapts_every_class_once_with_trigger_manual() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (first,) = c.runs
    c.finish(first)
    c.reconcile({"c1": CPU})
    c.policy["metadata"]["annotations"] = {"metainfer.io/rerun": "2026-12-01T17:00"}
    plan = c.reconcile({"c1": CPU})
    assert [p.reason for p in plan.runs_to_create] == [Reason.MANUAL]
    manual = plan.runs_to_create[0].manifest
    assert manual["spec"]["reason"] == "Manual" and manual["metadata"]["name"] != first
    assert manual["metadata"]["annotations"]["metainfer.io/rerun"] == "2026-12-01T17:00"
    assert c.reconcile({"c1": CPU}).runs_to_create == []  # the same value: no second run
    c.policy["metadata"]["annotations"] = {"metainfer.io/rerun": "x" * 5000}  # the owner's text, bounded
    (long_run,) = c.reconcile({"c1": CPU}).runs_to_create
    assert len(long_run.manifest["metadata"]["annotations"]["metainfer.io/rerun"]) == 63


def test_a_pinned_run_serves_directly_and_its_class_starts_no_run_while_others_adapt() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (first,) = c.runs
    c.finish(first)
    c.reconcile({"c1": CPU})
    c.reconcile({"c1": CPU})
    (stable,) = c.deployments
    # A new model version: its run succeeds and goes to a canary beside the first variant.
    c.edit(model={"uri": "https://m/x2.onnx", "sha256": "b" * 64})
    (second,) = [p.manifest["metadata"]["name"] for p in c.reconcile({"c1": CPU}).runs_to_create]
    c.runs[second]["status"] = {"phase": "Running"}
    c.edit(pin={"runName": first})  # the platform team pins the first variant
    plan = c.reconcile({"c1": CPU, "g1": A100})  # and new hardware joins
    (cpu,) = [s for s in plan.class_statuses if s.fingerprint == model(c.runs[first]).spec.class_fingerprint]
    assert (cpu.state, cpu.reason) == ("Ready", Reason.PINNED) and cpu.current is not None
    assert cpu.current.run_name == first and "pinned run " + first in (cpu.message or "")
    assert cpu.rollout is None and plan.deployments_to_apply == [] and stable in c.deployments
    assert second in c.runs and second not in plan.runs_to_delete  # the run in flight finishes, as history
    # The new class has nothing pinned: it adapts as usual.
    assert [p.reason for p in plan.runs_to_create] == [Reason.NEW_HARDWARE_CLASS]
    assert plan.status.pinned == f"run {first}"
    # Drift, a driver change or a new model change nothing in the pinned class; removing the pin resumes.
    c.edit(model={"uri": "https://m/x3.onnx", "sha256": "c" * 64})
    again = c.reconcile({"c1": CPU, "g1": A100})
    assert not [p for p in again.runs_to_create if p.manifest["spec"]["classFingerprint"] == cpu.fingerprint]
    c.edit(pin=None)
    resumed = c.reconcile({"c1": CPU, "g1": A100})
    assert resumed.status.pinned is None
    assert [p.reason for p in resumed.runs_to_create if p.manifest["spec"]["classFingerprint"] == cpu.fingerprint] == [
        Reason.MODEL_CHANGE
    ]


def test_a_pin_by_variant_sha256_moves_a_class_off_its_canary_to_the_pinned_variant() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (first,) = c.runs
    c.finish(first)
    c.runs[first]["status"]["bestVariantSha256"] = "d" * 64
    c.reconcile({"c1": CPU})
    c.reconcile({"c1": CPU})
    c.edit(model={"uri": "https://m/x2.onnx", "sha256": "b" * 64})
    (second,) = [p.manifest["metadata"]["name"] for p in c.reconcile({"c1": CPU}).runs_to_create]
    c.finish(second, ended="00:40")
    canary = c.reconcile({"c1": CPU})
    assert [s.rollout.phase for s in canary.class_statuses if s.rollout] == ["Canary"]
    canaries = [name for name in c.deployments if name.endswith("-canary")]
    assert canaries
    c.edit(pin={"variantSha256": "d" * 64})
    pinned = c.reconcile({"c1": CPU})
    assert pinned.deployments_to_delete == canaries  # the canary goes; the stable Deployment serves the pin
    (cls,) = pinned.class_statuses
    assert cls.current is not None and cls.current.run_name == first and cls.reason == Reason.PINNED
    assert pinned.status.pinned == "variant sha256 " + "d" * 16


@pytest.mark.parametrize(
    "pin", [{}, {"runName": "a", "variantSha256": "d" * 64}, {"variantSha256": "D" * 64}, {"runName": "Not_A_Name"}]
)
def test_a_pin_names_exactly_one_valid_run_name_or_sha256(pin: dict[str, str]) -> None:
    c = Cluster(pin=pin)
    with pytest.raises(ValidationError):
        AdaptationPolicy.model_validate(c.policy)


def _image_of(c: Cluster) -> str:
    (deployment,) = c.deployments.values()
    image: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    return image


def _platform(c: Cluster, image: str, runtime: str) -> None:
    c.job_settings = AgentJobSettings(image=image, runtime=runtime)
    c.serving = ServingDefaults(image=image, runtime=runtime)


def test_a_new_runtime_re_adapts_while_the_image_that_validated_the_variant_keeps_serving_it() -> None:
    """A chart upgrade: a pod of another ONNX Runtime rebuilds a variant into other bytes and refuses it (exit 2),
    so the class keeps the run's own image until its re-adaptation under the new runtime is served. An upgrade
    that keeps the runtime re-adapts nothing and rolls the serving pods to the new image."""
    c = Cluster()
    _platform(c, "metainfer:1", "onnxruntime 1.20.0")
    c.reconcile({"c1": CPU})
    (first,) = c.runs
    assert c.runs[first]["spec"]["runtime"] == "onnxruntime 1.20.0" and c.runs[first]["spec"]["image"] == "metainfer:1"
    c.finish(first)
    c.reconcile({"c1": CPU})
    assert _image_of(c) == "metainfer:1"

    _platform(c, "metainfer:1.1", "onnxruntime 1.20.0")  # a re-tag: same runtime
    retag = c.reconcile({"c1": CPU})
    assert retag.runs_to_create == [] and _image_of(c) == "metainfer:1.1"

    _platform(c, "metainfer:2", "onnxruntime 1.22.0")
    upgrade = c.reconcile({"c1": CPU})
    assert [p.reason for p in upgrade.runs_to_create] == [Reason.RUNTIME_CHANGE]
    assert _image_of(c) == "metainfer:1", "the image that validated the variant serves it meanwhile"
    (second,) = (name for name in c.runs if name != first)
    assert c.runs[second]["spec"]["runtime"] == "onnxruntime 1.22.0"
    c.finish(second)
    c.reconcile({"c1": CPU})
    assert _image_of(c) == "metainfer:2"
    assert c.reconcile({"c1": CPU}).runs_to_create == []


def test_runs_recorded_before_runtimes_were_get_the_platforms_image() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (run,) = c.runs
    assert c.runs[run]["spec"].get("runtime") is None  # no settings: tests, the demo
    c.finish(run)
    _platform(c, "metainfer:2", "onnxruntime 1.22.0")
    c.reconcile({"c1": CPU})
    assert _image_of(c) == "metainfer:2"


def _vendor_platform(c: Cluster, vendor_images: dict[str, VendorImage]) -> None:
    common: dict[str, Any] = {"image": "metainfer:1", "runtime": "onnxruntime 1.31.1", "vendor_images": vendor_images}
    c.job_settings = AgentJobSettings(**common)
    c.serving = ServingDefaults(**common)


def test_each_accelerator_class_adapts_and_serves_on_the_image_its_vendor_maps_to() -> None:
    c = Cluster()
    cuda = VendorImage(image="metainfer:1-cuda", runtime="onnxruntime-gpu 1.31.1")
    _vendor_platform(c, {"nvidia": cuda})
    c.reconcile({"g1": A100, "c1": CPU})
    jobs = c.reconcile({"g1": A100, "c1": CPU}).jobs_to_create  # the Jobs of the runs just created
    images = {job.manifest["spec"]["template"]["spec"]["containers"][0]["image"] for job in jobs}
    assert images == {"metainfer:1-cuda", "metainfer:1"}
    by_vendor = {r["spec"]["hardwareClass"]["vendor"]: r["spec"] for r in c.runs.values()}
    assert by_vendor["nvidia"]["image"] == "metainfer:1-cuda"
    assert by_vendor["nvidia"]["runtime"] == "onnxruntime-gpu 1.31.1"
    assert by_vendor["cpu"]["image"] == "metainfer:1" and by_vendor["cpu"]["runtime"] == "onnxruntime 1.31.1"
    for name in list(c.runs):
        c.finish(name)
    c.reconcile({"g1": A100, "c1": CPU})
    served = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"] for d in c.deployments.values()
    }
    assert sorted(served.values()) == ["metainfer:1", "metainfer:1-cuda"]

    # A new CUDA image with no runtime named: its reference stands for the runtime, so the nvidia class re-adapts
    # and the cpu class does not.
    _vendor_platform(c, {"nvidia": VendorImage(image="metainfer:2-cuda")})
    again = c.reconcile({"g1": A100, "c1": CPU})
    assert [r.manifest["spec"]["hardwareClass"]["vendor"] for r in again.runs_to_create] == ["nvidia"]
    assert [r.reason for r in again.runs_to_create] == [Reason.RUNTIME_CHANGE]


def test_an_accelerator_class_with_no_image_is_refused_naming_the_setting_and_never_gets_the_cpu_image() -> None:
    c = Cluster()
    _vendor_platform(c, {"intel": VendorImage(image="metainfer:1-openvino")})
    plan = c.reconcile({"g1": A100, "c1": CPU})
    assert [r.manifest["spec"]["hardwareClass"]["vendor"] for r in plan.runs_to_create] == ["cpu"]
    jobs = c.reconcile({"g1": A100, "c1": CPU}).jobs_to_create
    assert [job.manifest["spec"]["template"]["spec"]["containers"][0]["image"] for job in jobs] == ["metainfer:1"]
    (gpu,) = [s for s in plan.class_statuses if s.hardware_class.vendor == "nvidia"]
    assert (gpu.state, gpu.reason) == ("Degraded", Reason.NO_IMAGE_FOR_HARDWARE)
    assert gpu.message and "agent.vendorImages.nvidia" in gpu.message and "METAINFER_AGENT_IMAGES" in gpu.message
    warnings = [e for e in plan.events if e.reason == Reason.NO_IMAGE_FOR_HARDWARE]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    # Said once: later reconciles repeat neither the event nor a run.
    later = c.reconcile({"g1": A100, "c1": CPU})
    assert not [e for e in later.events if e.reason == Reason.NO_IMAGE_FOR_HARDWARE]
    assert not [r for r in later.runs_to_create if r.manifest["spec"]["hardwareClass"]["vendor"] == "nvidia"]

    # The platform maps one: the class starts its run on that image.
    _vendor_platform(c, {"nvidia": VendorImage(image="metainfer:1-cuda")})
    mapped = c.reconcile({"g1": A100, "c1": CPU})
    (run,) = mapped.runs_to_create
    assert run.manifest["spec"]["image"] == "metainfer:1-cuda"


def test_a_refused_class_keeps_serving_what_it_served_and_starts_no_job() -> None:
    c = Cluster()
    _vendor_platform(c, {"nvidia": VendorImage(image="metainfer:1-cuda", runtime="onnxruntime-gpu 1.31.1")})
    c.reconcile({"g1": A100})
    (run,) = c.runs
    c.finish(run)
    c.reconcile({"g1": A100})
    assert len(c.deployments) == 1
    _vendor_platform(c, {})  # the platform drops the mapping
    plan = c.reconcile({"g1": A100})
    (status,) = plan.class_statuses
    assert status.reason == Reason.NO_IMAGE_FOR_HARDWARE and status.run_name == run
    assert plan.deployments_to_delete == [] and plan.jobs_to_create == [] and len(c.deployments) == 1


def test_vendor_settings_map_only_accelerators_and_no_mapping_keeps_one_image() -> None:
    cuda = VendorImage(image="m:1-cuda")
    mapped = AgentJobSettings(image="m:1", runtime="ort", vendor_images={"nvidia": cuda})
    assert mapped.for_vendor("cpu") is mapped
    nvidia = mapped.for_vendor("nvidia")
    assert nvidia is not None and nvidia.image == "m:1-cuda" and nvidia.runtime == "image m:1-cuda"
    assert mapped.for_vendor("amd") is None
    unmapped = AgentJobSettings(image="m:1")
    assert unmapped.for_vendor("amd") is unmapped  # tests and the demo: no mapping, one image
