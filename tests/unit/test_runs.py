"""A class's adaptation runs and their Jobs (core.control.runs): one run per current run key, started with the reason
that triggered it (new hardware, a model, batch or spec change) and the ended runs it warm-starts from; superseded
runs cancelled; a failed run degrading its class, said once; a run whose Job cannot start saying why; an
unreadable run holding its class; a class of an accelerator the platform maps no image to refused; and each run's
Job created once and failing its run when it ends without a result. Scenarios on the in-memory cluster of
reconcile_cluster, since what a class does next depends on the runs and status earlier reconciles left."""

from __future__ import annotations

import copy

from reconcile_cluster import A100, A100_NEW, CPU, NOW, Cluster, _plan, _vendor_platform, model, ready

from metainfer.core.api.conditions import Reason
from metainfer.core.control.hardware import ClassGroup, group_nodes
from metainfer.core.control.naming import job_name
from metainfer.core.control.objects import run_phase
from metainfer.core.control.runs import plan_job, run_status_from_job
from metainfer.core.control.settings import VendorImage
from metainfer.core.control.slim import slim_job, slim_run


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


# --- Jobs -----------------------------------------------------------------------------------------------------------


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


def _fingerprint(labels: dict[str, str]) -> str:
    return next(iter(group_nodes([("n", labels)]).values())).fingerprint


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


# --- classes the platform maps no image to --------------------------------------------------------------------------


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
