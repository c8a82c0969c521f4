"""Why a serving Deployment's new pods are not Ready: what ``kubectl describe pod`` would show, said in the class's
status while the pods that served before go on serving.

A rollout whose new pod no node can take (the policy's spec.serving.resources larger than any node has free, a
surge pod on a full node), whose image cannot be pulled, or whose serve process crashes at start (killed for memory
at the container's limit, a model it cannot load) left its class RollingOut, or its canary progressing, with
nothing said until the Deployment's progress deadline, ten minutes later, and then only that it "has timed out
progressing". The operator reads the pods of the Deployments ``waiting_deployments`` names (not available a while
after their last progress: a rollout whose pods take longer than the grace to load is named too, and its pods say
nothing) and
``why_rollout_waits`` says why in one bounded line, as core.control.job_waits does for a run's Job.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metainfer.core.api._base import bounded, one_line
from metainfer.core.control.job_waits import MAX_WHY, last_ended, memory_limits, parse_time, why_pod_waits
from metainfer.core.control.workloads import DeploymentState

# A rollout that progressed this recently is starting its pods as rollouts do: they are not looked at yet.
ROLLOUT_WAIT_GRACE_S = 15.0
# A serving container running again after this many restarts, not Ready, is between two crashes of a crash loop.
CRASH_LOOP_RESTARTS = 2


@dataclass(frozen=True)
class WaitingDeployment:
    name: str
    selector: dict[str, str]  # its pods' labels (spec.selector.matchLabels)


def waiting_deployments(deployments: Iterable[Mapping[str, Any]], now: dt.datetime) -> list[WaitingDeployment]:
    """The Deployments that are not available and have made no progress for the grace (by their Progressing
    condition's last update, else their creation), with the labels that select their pods."""
    waiting = []
    for deployment in deployments:
        if DeploymentState.read(deployment).available:
            continue
        meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if not selector:
            continue  # not one the operator built: every serving Deployment selects its pods by labels
        conditions = (deployment.get("status") or {}).get("conditions") or []
        progressed = next((c.get("lastUpdateTime") for c in conditions if c.get("type") == "Progressing"), None)
        since = parse_time(progressed) or parse_time(meta.get("creationTimestamp"))
        if since is not None and (now - since).total_seconds() >= ROLLOUT_WAIT_GRACE_S:
            waiting.append(WaitingDeployment(str(meta.get("name")), {str(k): str(v) for k, v in selector.items()}))
    return sorted(waiting, key=lambda w: w.name)


def why_rollout_waits(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the Deployment's pods that are not Ready do not become so, from the newest: None when nothing says
    (pods starting as usual, loading their variant)."""
    newest = sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True)
    for pod in newest:
        if (pod.get("metadata") or {}).get("deletionTimestamp") or _ready(pod):
            continue
        why = why_pod_waits(pod) or _between_crashes(pod)
        if why is not None:
            return why
    return None


def _between_crashes(pod: Mapping[str, Any]) -> str | None:
    """A crash loop between two crashes: the container runs again (its status no longer says CrashLoopBackOff)
    but is not Ready; said as the crash loop it is, so that the class's message does not come and go with it."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return None
    limits = memory_limits(pod)
    for container in status.get("containerStatuses") or []:
        restarts = container.get("restartCount") or 0
        if (container.get("state") or {}).get("running") is None or container.get("ready"):
            continue
        if isinstance(restarts, int) and restarts >= CRASH_LOOP_RESTARTS:
            name = one_line((pod.get("metadata") or {}).get("name"), 253)
            container_name = one_line(container.get("name"), 63)
            ended = last_ended(container, limits.get(str(container.get("name"))))
            said = f"its pod {name} waits: container {container_name}: CrashLoopBackOff: running again after"
            return bounded(f"{said} {restarts} restarts, not Ready{ended}", MAX_WHY)
    return None


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
