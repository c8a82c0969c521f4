"""Why a policy's Jobs wait, as its reconcile reads it: the Jobs core.control.job_waits names, their pods and
FailedCreate events read through operator.kube, and the answer cached per Job, because a reconcile can be woken
many times a second and a Job's reason changes slowly."""

from __future__ import annotations

import datetime as dt
import time

from metainfer.core.control.job_waits import waiting_jobs, why_job_waits
from metainfer.operator import kube
from metainfer.operator.view import Indexes

# A waiting Job's pods and events are read again at most this often: a reconcile can be woken many times a second.
JOB_WAIT_RECHECK_S = 15.0
_WAITS_SEEN: dict[tuple[str, str], tuple[float, str | None]] = {}


async def job_waits(namespace: str, name: str, indexes: Indexes) -> dict[str, str]:
    """Why each of the policy's Jobs that has had no ready pod for a while waits, by Job name (core.control.job_waits).
    Only Jobs of runs in flight exist unfinished, so the cluster's run limit bounds the reads."""
    runs = [str(r["metadata"]["name"]) for r in indexes.runs_of(namespace, name)]
    waits: dict[str, str] = {}
    now = time.monotonic()
    for job in waiting_jobs(indexes.jobs_of(namespace, runs), dt.datetime.now(dt.UTC)):
        seen = _WAITS_SEEN.get((namespace, job))
        if seen is None or now - seen[0] >= JOB_WAIT_RECHECK_S:
            evidence = await kube.job_wait_evidence(namespace, job)
            # Unreadable this time: what was last explained stands (dropping it would announce it again later).
            seen = (now, why_job_waits(*evidence) if evidence is not None else seen[1] if seen else None)
            _WAITS_SEEN[(namespace, job)] = seen
        if seen[1] is not None:
            waits[job] = seen[1]
    for key in [k for k, (at, _) in _WAITS_SEEN.items() if now - at > 10 * JOB_WAIT_RECHECK_S]:
        del _WAITS_SEEN[key]  # Jobs that ended or went: the cache stays as small as the runs in flight
    return waits
