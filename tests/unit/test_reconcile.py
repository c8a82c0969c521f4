"""plan_policy and plan_class (core.control.reconcile), played against the in-memory API server of reconcile_cluster
that applies each Plan: what the policy decides beyond any one class. The run limits of the policy, its namespace
and the cluster; class plans merged in class order; planning a class without side effects; classes that leave
(their Deployments go only once something else serves: make before break); unreadable runs of no selected class;
unclassifiable nodes; the policy's one Service; suspend; and each class's image from its accelerator vendor. What
one class does with its runs, its serving, a provisional variant or a pin is tested with the module that decides
it: test_runs, test_serving_plan, test_provisional, test_pin."""

from __future__ import annotations

import copy

from reconcile_cluster import A100, A100_NEW, ARM, CPU, NOW, Cluster, _contexts, _plan, _vendor_platform, ready

from metainfer.core.api.conditions import Reason
from metainfer.core.api.policy import AdaptationPolicy
from metainfer.core.control.decisions import Decisions
from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.reconcile import Plan, RunLimits, plan_class, plan_classes, plan_policy
from metainfer.core.control.settings import VendorImage


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


def test_one_namespace_cannot_hold_every_cluster_wide_slot() -> None:
    # One tenant's long runs used to take all cluster-wide slots for up to their 7-day deadline.
    nodes = {"g1": A100, "c1": CPU, "a1": ARM}
    limits = RunLimits(cluster_max_in_flight=8, cluster_in_flight=3, namespace_max_in_flight=4, namespace_in_flight=3)
    assert len(Cluster(search={"maxConcurrentRuns": 5}).reconcile(nodes, limits).runs_to_create) == 1
    full = RunLimits(cluster_max_in_flight=8, cluster_in_flight=4, namespace_max_in_flight=4, namespace_in_flight=4)
    plan = Cluster(search={"maxConcurrentRuns": 5}).reconcile(nodes, full)
    assert plan.runs_to_create == [] and all(s.reason == Reason.CONCURRENCY_LIMIT for s in plan.class_statuses)


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


# --- per-class plans and their merge --------------------------------------------------------------------------------


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
