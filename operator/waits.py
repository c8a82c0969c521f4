"""Why a policy's Jobs and serving rollouts wait, as its reconcile reads it: the Jobs core.control.job_waits and the
Deployments core.control.rollout_waits name, their pods (and a Job's FailedCreate events) read through
operator.api_calls, and each answer cached per object, because a reconcile can be woken many times a second and a
reason changes slowly."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Awaitable, Callable

from metainfer.core.control.job_waits import waiting_jobs, why_job_waits
from metainfer.core.control.rollout_waits import waiting_deployments, why_rollout_waits
from metainfer.core.control.workloads import DeploymentState, job_end
from metainfer.operator import api_calls
from metainfer.operator.view import Indexes

# A waiting object's pods and events are read again at most this often: a reconcile can be woken many times a second.
WAIT_RECHECK_S = 15.0
# (kind, namespace, name) -> (when read, why); an object not read for ten rechecks has ended or gone.
_WAITS_SEEN: dict[tuple[str, str, str], tuple[float, str | None]] = {}
# Reads the cluster once: (whether it could, why the object waits).
Read = Callable[[], Awaitable[tuple[bool, str | None]]]


async def job_waits(namespace: str, name: str, indexes: Indexes) -> dict[str, str]:
    """Why each of the policy's Jobs that has had no ready pod for a while waits, by Job name (core.control.job_waits).
    Only Jobs of runs in flight exist unfinished, so the cluster's run limit bounds the reads."""
    runs = [str(r["metadata"]["name"]) for r in indexes.runs_of(namespace, name)]
    waits: dict[str, str] = {}
    for job in waiting_jobs(indexes.jobs_of(namespace, runs), dt.datetime.now(dt.UTC)):

        async def read(job: str = job) -> tuple[bool, str | None]:
            evidence = await api_calls.job_wait_evidence(namespace, job)
            return (False, None) if evidence is None else (True, why_job_waits(*evidence))

        if (why := await _cached(("Job", namespace, job), read)) is not None:
            waits[job] = why
    _forget_old()
    return waits


async def rollout_waits(namespace: str, name: str, indexes: Indexes) -> dict[str, str]:
    """Why each of the policy's Deployments that has made no progress for a while has pods that do not become
    Ready, by Deployment name (core.control.rollout_waits). A rollout that progresses is never read."""
    waits: dict[str, str] = {}
    for waiting in waiting_deployments(indexes.deployments_of(namespace, name), dt.datetime.now(dt.UTC)):

        async def read(selector: dict[str, str] = waiting.selector) -> tuple[bool, str | None]:
            pods = await api_calls.pods_selected(namespace, selector)
            return (False, None) if pods is None else (True, why_rollout_waits(pods))

        if (why := await _cached(("Deployment", namespace, waiting.name), read)) is not None:
            waits[waiting.name] = why
    _forget_old()
    return waits


def next_look_s(namespace: str, name: str, indexes: Indexes, pods_start: bool = True) -> float | None:
    """How soon the policy's reconcile should look again while one of its Jobs has no ready pod or one of its
    Deployments is not available and why is not said yet, so that it is said within the grace and a recheck, not at
    the next resync (a minute by default). None while nothing of it is starting, once every wait is explained (a
    change of the Job or Deployment wakes the reconcile anyway), or without a kubelet (``pods_start`` False:
    nothing ever becomes available there)."""
    if not pods_start:
        return None
    runs = [str(r["metadata"]["name"]) for r in indexes.runs_of(namespace, name)]
    jobs = [
        ("Job", str(n))
        for n, j in indexes.jobs_of(namespace, runs).items()
        if job_end(j) is None and not (j.get("status") or {}).get("ready")
    ]
    deployments = [
        ("Deployment", str(d["metadata"]["name"]))
        for d in indexes.deployments_of(namespace, name)
        if not DeploymentState.read(d).available
    ]
    unexplained = [
        k for k in (*jobs, *deployments) if (_WAITS_SEEN.get((k[0], namespace, k[1])) or (0, None))[1] is None
    ]
    return WAIT_RECHECK_S if unexplained else None


async def _cached(key: tuple[str, str, str], read: Read) -> str | None:
    now = time.monotonic()
    seen = _WAITS_SEEN.get(key)
    if seen is None or now - seen[0] >= WAIT_RECHECK_S:
        readable, why = await read()
        # Unreadable this time: what was last explained stands (dropping it would announce it again later).
        seen = (now, why if readable else seen[1] if seen else None)
        _WAITS_SEEN[key] = seen
    return seen[1]


def _forget_old() -> None:
    """Objects that ended or went: the cache stays as small as what waits."""
    now = time.monotonic()
    for key in [k for k, (at, _) in _WAITS_SEEN.items() if now - at > 10 * WAIT_RECHECK_S]:
        del _WAITS_SEEN[key]
