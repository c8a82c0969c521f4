"""spec.pin (core.control.pin): a class with a succeeded run matching the pin, by run name or variant sha256, serves
that run's variant directly, drops its canary and starts no run whatever changes, while classes without one adapt
as usual. On the in-memory cluster of reconcile_cluster: a pin is set over the runs, canaries and Deployments
earlier reconciles made, and removing it resumes from there."""

from __future__ import annotations

from reconcile_cluster import A100, CPU, Cluster, model

from metainfer.core.api.conditions import Reason


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
