"""The operator's shared read side: classes computed once per node change, selections shared by policies."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from metainfer.core.api.names import LABEL_POLICY
from metainfer.core.api.policy import HardwareSelection
from metainfer.core.control.hardware import group_nodes, select_groups
from metainfer.core.control.naming import job_name, label_value
from metainfer.core.control.schedulability import NodeScheduling, PlatformPlacement
from metainfer.operator.view import ClusterView, Indexes, Wakeups

A100 = {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "A100", "nvidia.com/cuda.driver-version.full": "550"}
CPU = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}


def _index(nodes: dict[str, dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    return {name: [labels] for name, labels in nodes.items()}  # kopf index shape: key -> store of values


def test_selected_classes_match_select_groups_and_follow_node_changes() -> None:
    nodes = {"g1": {**A100, "pool": "a"}, "g2": A100, "c1": {**CPU, "pool": "a"}}
    view = ClusterView()
    pool_a = HardwareSelection(node_selector={"pool": "a"})
    expected = select_groups(group_nodes(sorted(nodes.items())), pool_a, nodes)
    first = view.selected(pool_a, _index(nodes))
    assert first == expected and sorted(g.node_names for g in first) == [("c1",), ("g1",)]
    assert view.selected(HardwareSelection(node_selector={"pool": "a"}), _index(nodes)) is first, "shared"
    assert len(view.selected(None, _index(nodes))) == 2
    nodes["g2"] = {**A100, "pool": "a"}
    assert view.selected(pool_a, _index(nodes)) is first, "no node event yet: the cached view stands"
    view.nodes_changed()
    after = view.selected(pool_a, _index(nodes))
    assert after == select_groups(group_nodes(sorted(nodes.items())), pool_a, nodes)
    assert sorted(n for g in after for n in g.node_names) == ["c1", "g1", "g2"]


def test_cordoned_and_untolerated_nodes_form_no_class_and_are_reported_with_why() -> None:
    nodes = {"g1": A100, "g2": A100, "c1": CPU}
    tainted = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    scheduling = {
        "g1": [NodeScheduling.read(tainted).to_index()],
        "g2": [NodeScheduling.read({"unschedulable": True, **tainted}).to_index()],
        "c1": [NodeScheduling().to_index()],
    }
    view = ClusterView()
    plain = view.selected(None, _index(nodes), scheduling)
    assert [g.node_names for g in plain] == [("c1",)], "the GPU class has no node a pod could land on"
    excluded = view.excluded(None, _index(nodes), scheduling)
    assert sorted(excluded) == ["g1", "g2"] and "cordoned" in excluded["g2"]
    assert "nvidia.com/gpu=present:NoSchedule" in excluded["g1"]
    gpu_ok = HardwareSelection(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert sorted(g.node_names for g in view.selected(gpu_ok, _index(nodes), scheduling)) == [("c1",), ("g1",)]
    # The platform's tolerations (workloads.tolerations) count as the policy's own.
    platform = PlatformPlacement(tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},))
    assert view.excluded(None, _index(nodes), scheduling, platform).keys() == {"g2"}
    # And its placement: a nodeSelector the CPU node lacks leaves it out too.
    pooled = PlatformPlacement(node_selector={"pool": "gpu"})
    assert "workloads.nodeSelector" in view.excluded(None, _index(nodes), scheduling, pooled)["c1"]
    # A policy hears only of nodes its nodeSelector would take.
    assert view.excluded(HardwareSelection(node_selector={"pool": "x"}), _index(nodes), scheduling) == {}


def test_indexes_read_one_policys_children() -> None:
    job = {"metadata": {"name": job_name("run-a"), "namespace": "ns"}}
    indexes = Indexes(
        nodes={},
        runs={("ns", "p"): [{"metadata": {"name": "run-a"}}]},
        jobs={("ns", job_name("run-a")): [job]},
        deployments={("other", "p"): [{"metadata": {"name": "d"}}]},
        in_flight={"ns": [("ns", "run-a")], "ns2": [("ns2", "run-b"), ("ns2", "run-c")]},
    )
    assert indexes.runs_of("ns", "p") == [{"metadata": {"name": "run-a"}}] and indexes.runs_of("ns", "q") == []
    assert indexes.deployments_of("ns", "p") == []
    assert indexes.jobs_of("ns", ["run-a", "run-b"]) == {job_name("run-a"): job}
    assert indexes.cluster_in_flight() == 3 and indexes.namespace_in_flight("ns2") == 2
    assert indexes.namespace_in_flight("other") == 0


def test_reconcile_inputs_validate_the_policys_runs_and_plan_around_one_that_does_not() -> None:
    from metainfer.core.api.vocabulary import ClassState, Reason
    from metainfer.operator.apply import reconcile_inputs
    from metainfer.operator.config import OperatorConfig

    policy = {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": "ns", "uid": "uid-p", "generation": 1},
        "spec": {"model": {"uri": "https://m/x.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 10}},
    }
    nodes = {"c1": CPU}
    (group,) = group_nodes(sorted(nodes.items())).values()
    broken = {
        "metadata": {"name": "digits-by-hand", "namespace": "ns"},
        "spec": {"policyName": "digits", "classFingerprint": group.fingerprint},
    }
    indexes = Indexes(nodes=_index(nodes), runs={("ns", "digits"): [broken]}, jobs={}, deployments={}, in_flight={})
    inputs = reconcile_inputs(policy, ClusterView(), indexes, OperatorConfig())
    (cls,) = inputs.plan.class_statuses
    assert (cls.state, cls.reason) == (ClassState.DEGRADED, Reason.INVALID_SPEC)
    assert "digits-by-hand" in (cls.message or "") and inputs.plan.runs_to_create == []
    healthy = reconcile_inputs(policy, ClusterView(), Indexes(_index(nodes), {}, {}, {}, {}), OperatorConfig())
    assert [p.reason for p in healthy.plan.runs_to_create] == [Reason.NEW_HARDWARE_CLASS]
    cordoned = {"c1": [NodeScheduling(unschedulable=True).to_index()]}
    held = reconcile_inputs(
        policy, ClusterView(), Indexes(_index(nodes), {}, {}, {}, {}, node_scheduling=cordoned), OperatorConfig()
    )
    assert held.plan.runs_to_create == [] and held.plan.class_statuses == []
    assert [(n.name, "cordoned" in n.reason) for n in held.plan.status.excluded_nodes] == [("c1", True)]


def test_a_service_the_watch_shows_is_not_created_again_and_only_services_are_skipped() -> None:
    """Each reconcile plans the policy's Service: created while the watch has not shown it, then left alone (a
    create of an existing one is a refused request, 300 per node label change at 100 policies)."""
    from metainfer.operator.apply import reconcile_inputs
    from metainfer.operator.config import OperatorConfig

    policy = {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": "ns", "uid": "uid-p", "generation": 1},
        "spec": {"model": {"uri": "https://m/x.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 10}},
    }
    nodes = _index({"c1": CPU})
    first = reconcile_inputs(policy, ClusterView(), Indexes(nodes, {}, {}, {}, {}), OperatorConfig())
    assert [(o["kind"], o["metadata"]["name"]) for o in first.plan.objects_to_create] == [("Service", "digits")]
    seen = Indexes(nodes, {}, {}, {}, {}, services={("ns", "digits"): [True]})
    assert reconcile_inputs(policy, ClusterView(), seen, OperatorConfig()).plan.objects_to_create == []
    elsewhere = Indexes(nodes, {}, {}, {}, {}, services={("other", "digits"): [True]})
    assert len(reconcile_inputs(policy, ClusterView(), elsewhere, OperatorConfig()).plan.objects_to_create) == 1
    budget = {"kind": "PodDisruptionBudget", "metadata": {"namespace": "ns", "name": "digits"}}
    assert seen.not_seen([budget]) == [budget], "other kinds are created if absent, as before"


def test_a_policy_name_longer_than_a_label_value_still_finds_and_wakes_its_children() -> None:
    # Children carry the policy in a label, hashed when the name exceeds 63 characters; the policy's lookups and
    # wake-ups use its real name. Compared raw, the class never saw its Deployment: never Ready, and orphaned.
    name = "a-policy-name-that-is-much-longer-than-sixty-three-characters-allow-x"
    label = label_value(name)
    assert label != name
    deployment = {"metadata": {"name": "d", "labels": {LABEL_POLICY: label}}}
    indexes = Indexes(nodes={}, runs={}, jobs={}, deployments={("ns", label): [deployment]}, in_flight={})
    assert indexes.deployments_of("ns", name) == [deployment]
    wakeups = Wakeups()
    event = wakeups.register("ns", name)
    wakeups.wake("ns", label)  # a Job or Deployment event: the policy as its label spells it
    assert event.is_set()
    event.clear()
    wakeups.wake("ns", name)  # a run event: spec.policyName, the real name
    assert event.is_set()


def test_a_run_out_of_flight_maps_to_an_empty_entry_never_none() -> None:
    """kopf keeps an object's earlier index entry when its handler returns None: a finished run kept its slot
    until the operator restarted. {} replaces the entry with nothing (tests/integration/test_operator.py runs it)."""
    import asyncio

    import kopf

    from metainfer.operator.handlers import in_flight_index

    def body(phase: str) -> kopf.Body:
        return kopf.Body({"metadata": {"name": "r", "namespace": "ns"}, "status": {"phase": phase}})

    running = asyncio.run(in_flight_index(namespace="ns", name="r", body=body("Running")))
    finished = asyncio.run(in_flight_index(namespace="ns", name="r", body=body("Succeeded")))
    assert running == {"ns": ("ns", "r")} and finished == {}


def test_a_jobs_wait_is_read_at_most_every_recheck_and_an_unreadable_read_keeps_the_last_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused read (a chart without the events rule, an API hiccup) must not drop the reason from the status,
    or the next good read would announce it again."""
    from metainfer.operator import api_calls, waits

    created = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)).isoformat()
    job = {"metadata": {"name": job_name("run-1"), "creationTimestamp": created}, "status": {"ready": 0}}
    run = {"metadata": {"name": "run-1"}}
    indexes = Indexes({}, {("ns", "p"): [run]}, {("ns", job_name("run-1")): [job]}, {}, {})
    answers: list[tuple[list[dict[str, Any]], list[dict[str, Any]]] | None] = [
        ([], [{"reason": "FailedCreate", "message": "exceeded quota", "lastTimestamp": created}]),
        None,
    ]
    reads: list[str] = []

    async def evidence(namespace: str, name: str) -> Any:
        reads.append(name)
        return answers.pop(0)

    monkeypatch.setattr(api_calls, "job_wait_evidence", evidence)
    monkeypatch.setattr(waits, "_WAITS_SEEN", {})
    clock = [1000.0]
    monkeypatch.setattr(waits.time, "monotonic", lambda: clock[0])
    said = {job_name("run-1"): "the Job cannot create its pod: exceeded quota"}
    assert asyncio.run(waits.job_waits("ns", "p", indexes)) == said
    clock[0] += 1
    assert asyncio.run(waits.job_waits("ns", "p", indexes)) == said and len(reads) == 1, "within the recheck"
    clock[0] += waits.WAIT_RECHECK_S
    assert asyncio.run(waits.job_waits("ns", "p", indexes)) == said and len(reads) == 2, "unreadable: kept"


def test_a_stalled_rollouts_pods_are_read_at_most_every_recheck_and_a_progressing_one_never(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from metainfer.operator import api_calls, waits

    progressed = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)).isoformat()
    selector = {"metainfer.io/policy": "p", "metainfer.io/track": "stable"}

    def deployment(name: str, available: int) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "generation": 1},
            "spec": {"replicas": 1, "selector": {"matchLabels": selector}},
            "status": {
                "observedGeneration": 1,
                "updatedReplicas": 1,
                "availableReplicas": available,
                "conditions": [{"type": "Progressing", "status": "True", "lastUpdateTime": progressed}],
            },
        }

    stalled, serving = deployment("p-stalled", 0), deployment("p-serving", 1)
    indexes = Indexes({}, {}, {}, {("ns", "p"): [stalled, serving]}, {})
    unschedulable = {
        "metadata": {"name": "p-stalled-x", "creationTimestamp": progressed},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "message": "full"}]},
    }
    answers: list[list[dict[str, Any]] | None] = [[unschedulable], None]
    reads: list[dict[str, str]] = []

    async def pods_selected(namespace: str, labels: dict[str, str]) -> Any:
        reads.append(labels)
        return answers.pop(0)

    monkeypatch.setattr(api_calls, "pods_selected", pods_selected)
    monkeypatch.setattr(waits, "_WAITS_SEEN", {})
    clock = [1000.0]
    monkeypatch.setattr(waits.time, "monotonic", lambda: clock[0])
    said = {"p-stalled": "its pod p-stalled-x cannot be scheduled: full"}
    assert asyncio.run(waits.rollout_waits("ns", "p", indexes)) == said and reads == [selector]
    clock[0] += 1
    assert asyncio.run(waits.rollout_waits("ns", "p", indexes)) == said and len(reads) == 1, "within the recheck"
    clock[0] += waits.WAIT_RECHECK_S
    assert asyncio.run(waits.rollout_waits("ns", "p", indexes)) == said and len(reads) == 2, "unreadable: kept"


def test_a_policy_with_a_pod_starting_is_looked_at_again_within_a_recheck_and_a_settled_one_at_its_resync() -> None:
    from metainfer.operator import waits

    def deployment(available: int) -> dict[str, Any]:
        status = {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": available}
        return {"metadata": {"name": "p-c", "generation": 1}, "spec": {"replicas": 1}, "status": status}

    run = {"metadata": {"name": "run-1"}}

    def indexes(job_status: dict[str, Any] | None, available: int) -> Indexes:
        job = {"metadata": {"name": job_name("run-1")}, "status": job_status}
        jobs = {} if job_status is None else {("ns", job_name("run-1")): [job]}
        return Indexes({}, {("ns", "p"): [run]}, jobs, {("ns", "p"): [deployment(available)]}, {})

    assert waits.next_look_s("ns", "p", indexes(None, 1)) is None
    assert waits.next_look_s("ns", "p", indexes({"ready": 1}, 1)) is None, "a Job at work: its run reports"
    done = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert waits.next_look_s("ns", "p", indexes(done, 1)) is None
    assert waits.next_look_s("ns", "p", indexes({"ready": 0}, 1)) == waits.WAIT_RECHECK_S
    assert waits.next_look_s("ns", "p", indexes(None, 0)) == waits.WAIT_RECHECK_S
    assert waits.next_look_s("ns", "p", indexes(None, 0), pods_start=False) is None, "no kubelet: never available"
    waits._WAITS_SEEN[("Deployment", "ns", "p-c")] = (0.0, "its pod x cannot be scheduled: full")
    try:
        assert waits.next_look_s("ns", "p", indexes(None, 0)) is None, "explained: its changes wake the reconcile"
    finally:
        del waits._WAITS_SEEN[("Deployment", "ns", "p-c")]
