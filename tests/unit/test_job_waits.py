"""Why a run's Job has no pod at work, from its pods and events as the API server returns them
(core.control.job_waits); test_runs shows the class's status and events saying it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from metainfer.core.control.job_waits import JOB_WAIT_GRACE_S, MAX_WHY, waiting_jobs, why_job_waits
from metainfer.core.control.slim import slim_job

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
QUOTA = (
    'Error creating: pods "digits-1a2b-x7k2p" is forbidden: exceeded quota: compute, requested: limits.cpu=2,'
    " used: limits.cpu=0, limited: limits.cpu=1"
)
UNSCHEDULABLE = (
    "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims"
    " found for incoming pod."
)


def _job(name: str, age_s: float, **status: Any) -> dict[str, Any]:
    created = (NOW - dt.timedelta(seconds=age_s)).isoformat().replace("+00:00", "Z")
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": status}


def _pod(name: str, phase: str, created: str = "2026-01-01T00:00:00Z", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": {"phase": phase, **status}}


def _event(reason: str, message: str, last: str = "2026-01-01T00:00:05Z") -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": last, "type": "Warning"}


def test_only_jobs_past_the_grace_with_no_ready_pod_and_not_ended_are_looked_at() -> None:
    ended = [{"type": "Complete", "status": "True"}]
    jobs = {
        "young": _job("young", JOB_WAIT_GRACE_S - 1),
        "waiting": _job("waiting", JOB_WAIT_GRACE_S + 1, ready=0),
        "no-ready-field": _job("no-ready-field", 600),
        "at-work": _job("at-work", 600, ready=1),
        "done": _job("done", 600, conditions=ended),
        "undated": {"metadata": {"name": "undated"}},
    }
    assert waiting_jobs(jobs, NOW) == ["no-ready-field", "waiting"]
    # the operator's index holds slimmed Jobs: what this reads survives the slimming
    assert waiting_jobs({k: slim_job(v) for k, v in jobs.items()}, NOW) == ["no-ready-field", "waiting"]


def test_a_refused_pod_is_said_from_the_job_controllers_latest_failed_create() -> None:
    events = [
        _event("FailedCreate", "an older refusal", last="2026-01-01T00:00:01Z"),
        _event("FailedCreate", QUOTA, last="2026-01-01T00:00:09Z"),
        _event("SuccessfulCreate", "Created pod: x", last="2026-01-01T00:00:10Z"),
    ]
    assert why_job_waits([], events) == f"the Job cannot create its pod: {QUOTA}"
    assert why_job_waits([], [_event("SuccessfulCreate", "Created pod: x")]) is None
    # a pod on its way makes an earlier refusal history: the events are not the answer then
    assert why_job_waits([_pod("p", "Pending")], events) is None
    # a failed attempt and no new pod yet: the refusal of the retry is the answer
    assert why_job_waits([_pod("p", "Failed")], events) == f"the Job cannot create its pod: {QUOTA}"
    # ...but not a refusal from before that pod was created: the quota was raised since, and the pod ran
    later = _pod("p", "Failed", created="2026-01-01T00:00:30Z")
    assert why_job_waits([later], events) is None
    undated = {"reason": "FailedCreate", "message": "no time"}
    assert why_job_waits([], [undated]) is None


def test_a_pending_pod_says_why_it_is_not_scheduled_or_not_started() -> None:
    unscheduled = _pod("digits-1a2b-x7k2p", "Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}])  # fmt: skip
    assert why_job_waits([unscheduled], []) == f"its pod digits-1a2b-x7k2p cannot be scheduled: {UNSCHEDULABLE}"
    pulling = _pod("p2", "Pending", containerStatuses=[{"name": "agent", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "reg.local/mi:9"'}}}])  # fmt: skip
    assert why_job_waits([pulling], []) == (
        'its pod p2 waits: container agent: ImagePullBackOff: Back-off pulling image "reg.local/mi:9"'
    )
    secret = _pod("p3", "Pending", initContainerStatuses=[{"name": "fetch", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "model-store" not found'}}}])  # fmt: skip
    assert "container fetch: CreateContainerConfigError" in (why_job_waits([secret], []) or "")
    # a pod being created or pulled as usual, or one at work, says nothing
    creating = _pod("p4", "Pending", containerStatuses=[{"name": "agent", "state": {"waiting": {
        "reason": "ContainerCreating"}}}])  # fmt: skip
    assert why_job_waits([creating], []) is None
    assert why_job_waits([_pod("p5", "Running")], []) is None
    # the newest pod speaks for the Job
    old = _pod("old", "Pending", created="2026-01-01T00:00:00Z", conditions=[
        {"type": "PodScheduled", "status": "False", "message": "old news"}])  # fmt: skip
    new = {**unscheduled, "metadata": {"name": "new", "creationTimestamp": "2026-01-01T00:01:00Z"}}
    assert (why_job_waits([old, new], []) or "").startswith("its pod new cannot be scheduled")


def test_what_the_cluster_says_is_one_bounded_line() -> None:
    flood = "exceeded quota:\n" + "x" * 5000
    why = why_job_waits([], [_event("FailedCreate", flood)])
    assert why is not None and len(why) <= MAX_WHY and "\n" not in why and why.endswith("[truncated]")
    odd = _pod("p" * 400, "Pending", conditions=[{"type": "PodScheduled", "status": "False", "message": None}])
    assert len(why_job_waits([odd], []) or "") <= MAX_WHY
