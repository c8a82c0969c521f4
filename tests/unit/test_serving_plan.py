"""What a class serves (core.control.serving): the newest succeeded run rolled out to the class's Deployment, Service
and disruption budget; Ready only once the Deployment is available, and a rollout that waits saying why, once per
cause; a new variant run as a canary beside the untouched stable one until operator.rollout writes Promoted or
RolledBack, which is all the next plan reads. Named apart from the test_serve_* files, which test the serving
process (agent.serve), not this plan. Scenarios on the in-memory cluster of reconcile_cluster: a rollout and a
canary last across reconciles."""

from __future__ import annotations

import copy

from reconcile_cluster import A100, A100_NEW, CPU, NOW, Cluster, ready

from metainfer.core.api.conditions import Reason
from metainfer.core.control.reconcile import RunLimits
from metainfer.core.engine.recipe import Recipe


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
