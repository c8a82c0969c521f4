"""Why a run's Job has no pod at work: what ``kubectl describe`` would show, said in the class's status.

A Job whose pod the API server refuses (a namespace's ResourceQuota or LimitRange, a missing ServiceAccount), or
whose pod cannot start (no node has the CPUs it requests, its image cannot be pulled, a Secret it mounts is
missing) left its class Adapting with "Pending: 0/? trials" until the Job's deadline failed it as
DeadlineExceeded, an hour later, saying nothing of the cause. The operator reads the pods and the FailedCreate
events of the Jobs ``waiting_jobs`` names (at most one per run in flight, so the cluster's run limit bounds the
calls), and ``why_job_waits`` says why in one bounded line. Pods and events are the cluster's, so every string
taken from them is cut.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from metainfer.core.api._base import bounded, one_line
from metainfer.core.control.workloads import job_end

# A Job younger than this is starting as Jobs do: its pods are not looked at yet (most Jobs never qualify).
JOB_WAIT_GRACE_S = 10.0
MAX_WHY = 900  # it joins the class's progress in a message of 1,024 characters
# Container waiting reasons that say the pod will not start by itself (ContainerCreating, PodInitializing do not).
STUCK = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)


def waiting_jobs(jobs: Mapping[str, Mapping[str, Any]], now: dt.datetime) -> list[str]:
    """The Jobs (by name) that have not ended, are older than the grace, and have no ready pod."""
    waiting = []
    for name, job in jobs.items():
        if job_end(job) is not None or (job.get("status") or {}).get("ready"):
            continue
        created = parse_time((job.get("metadata") or {}).get("creationTimestamp"))
        if created is not None and (now - created).total_seconds() >= JOB_WAIT_GRACE_S:
            waiting.append(name)
    return sorted(waiting)


def why_job_waits(pods: Sequence[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> str | None:
    """Why the Job's work has not started, from its pods (newest first) and its events; None when nothing says
    (a pod being scheduled or pulled as usual, or one already running)."""
    newest = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True)
    for pod in newest:
        why = why_pod_waits(pod)
        if why is not None:
            return why
    if any((p.get("status") or {}).get("phase") in ("Pending", "Running") for p in pods):
        return None  # a pod is on its way, and nothing says it is stuck
    # A refusal from before the newest pod was created is history: that pod was created after it.
    since = max(
        (t for p in pods if (t := parse_time((p.get("metadata") or {}).get("creationTimestamp")))), default=None
    )
    refused = [
        (when, e)
        for e in events
        if e.get("reason") == "FailedCreate"
        and (when := parse_time(e.get("lastTimestamp") or e.get("eventTime"))) is not None
        and (since is None or when >= since)
    ]
    if not refused:
        return None
    _, last = max(refused, key=lambda pair: pair[0])
    return bounded(f"the Job cannot create its pod: {_text(last.get('message'))}", MAX_WHY)


def why_pod_waits(pod: Mapping[str, Any]) -> str | None:
    """Why a pod does not start or keep running, when its status says so: unschedulable, or a container stuck
    waiting (an image it cannot pull, a config it cannot create, a crash loop, with how the container last ended:
    OOMKilled at its memory limit, an exit code). None for a pod on its way, running, or gone."""
    status = pod.get("status") or {}
    if status.get("phase") not in ("Pending", "Running"):
        return None
    name = _text((pod.get("metadata") or {}).get("name"), 253)
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            why = _text(condition.get("message")) or _text(condition.get("reason"), 64)
            return bounded(f"its pod {name} cannot be scheduled: {why}", MAX_WHY)
    limits = memory_limits(pod)
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = _text(waiting.get("reason"), 64)
        if reason in STUCK:
            container_name = _text(container.get("name"), 63)
            detail = _text(waiting.get("message"))
            ended = last_ended(container, limits.get(str(container.get("name"))))
            said = f"its pod {name} waits: container {container_name}: {reason}: {detail}{ended}"
            return bounded(said, MAX_WHY)
    return None


def memory_limits(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Each container's memory limit, by container name (None where it has none)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return {str(c.get("name")): ((c.get("resources") or {}).get("limits") or {}).get("memory") for c in containers}


def last_ended(container: Mapping[str, Any], memory_limit: Any) -> str:
    """How a restarting container last ended ("" for one that never ran): a crash loop's cause."""
    ended = (container.get("lastState") or {}).get("terminated") or {}
    if not ended:
        return ""
    reason, code = _text(ended.get("reason"), 64), ended.get("exitCode")
    if reason == "OOMKilled":
        at = f" at its memory limit {_text(memory_limit, 32)}" if memory_limit else ""
        return f"; it was last killed for memory (OOMKilled){at}"
    message = _text(ended.get("message"), 300)
    return f"; it last exited with code {_text(code, 16)} ({reason or 'no reason'})" + (
        f": {message}" if message else ""
    )


def _text(value: Any, limit: int = MAX_WHY) -> str:
    return one_line(value, limit)


def parse_time(value: Any) -> dt.datetime | None:
    """A Kubernetes timestamp (RFC 3339 text, or a datetime as the client returns it), aware; None when absent or
    unreadable."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
