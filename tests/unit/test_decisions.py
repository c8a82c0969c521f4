"""What planning one class starts from and what it returns (core.control.decisions): ``Decisions`` concatenate field
by field, so plan_policy sees each step's writes in order, and the later step's class status wins; the class
context salts its run key with the policy's manual re-run request (annotation metainfer.io/rerun), so each new
value re-adapts every class once and a long one counts by its first characters."""

from __future__ import annotations

from reconcile_cluster import CPU, Cluster, _contexts

from metainfer.core.api.conditions import Reason
from metainfer.core.control.decisions import ClassPlan, Decisions
from metainfer.core.control.events import Event
from metainfer.core.control.reconcile import plan_class


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
