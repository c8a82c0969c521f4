"""What ended a failed run's pod when the agent could not say it itself: the kernel's OOM killer, a signal, an
eviction. Read from the pod's status, as the API server returns it, and added to the run's failure.

An agent killed at the Job's memory limit writes no result and no last words: its run failed as
BackoffLimitExceeded ("Job has reached the specified backoff limit") with a log that stops mid-search, and
nothing said that memory was the cause or whose setting to change. The pod's status says so (its container's
``terminated.reason`` OOMKilled, or the pod's ``Evicted``), and the operator reads it with the log tail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metainfer.core.api._base import bounded, one_line
from metainfer.core.api.conditions import Reason

MAX_ENDING = 900
SIGNALS = {137: "SIGKILL", 143: "SIGTERM", 139: "SIGSEGV", 134: "SIGABRT"}


@dataclass(frozen=True)
class PodEnding:
    reason: Reason | None  # replaces the run's failure reason where it says more (OOMKilled); None keeps it
    message: str  # added to the run's failure message


def pod_ending(pods: Sequence[Mapping[str, Any]]) -> PodEnding | None:
    """What ended the newest of the Job's pods, if it was not the agent's own exit: None when its containers
    exited by themselves (the agent's error is its log's and its result's) or there is no pod left to ask."""
    if not pods:
        return None
    pod = max(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    status = pod.get("status") or {}
    if status.get("reason") == "Evicted":
        return PodEnding(None, bounded(f"its pod was evicted: {_text(status.get('message'))}", MAX_ENDING))
    limits = {
        str(c.get("name")): ((c.get("resources") or {}).get("limits") or {}).get("memory")
        for c in [
            *((pod.get("spec") or {}).get("initContainers") or []),
            *((pod.get("spec") or {}).get("containers") or []),
        ]
    }
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        ended = (container.get("state") or {}).get("terminated") or (container.get("lastState") or {}).get("terminated")
        if not ended:
            continue
        name, code = _text(container.get("name"), 63), ended.get("exitCode")
        if ended.get("reason") == "OOMKilled":
            limit = limits.get(str(container.get("name")))
            at = f" at its memory limit {_text(limit, 32)}" if limit else ""
            return PodEnding(
                Reason.OOM_KILLED,
                f"container {name} was killed for memory (OOMKilled, exit code {code}){at}: the model and its search "
                "need more memory than the Job may use. Raise the Job's memory (the chart's agent.resources.limits"
                ".memory), or lower what a trial holds (spec.slo.batchSize, a smaller search space)",
            )
        if code in SIGNALS and ended.get("reason") != "Completed":
            return PodEnding(
                None,
                f"container {name} was killed by {SIGNALS[code]} (exit code {code}, {_text(ended.get('reason'), 64)})",
            )
    return None


def with_ending(status: Mapping[str, Any], ending: PodEnding) -> dict[str, Any]:
    """A failed run's status patch (core.control.runs.run_status_from_job) with ``ending`` in its Succeeded
    condition: the message says what ended the pod, and the reason is the ending's where it has one."""
    conditions = []
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Succeeded":
            message = f"{condition.get('message') or ''}; {ending.message}".lstrip("; ")
            condition = {**condition, "message": bounded(message, 32768)}
            if ending.reason is not None:
                condition["reason"] = ending.reason.value
        conditions.append(condition)
    return {**status, "conditions": conditions}


def _text(value: Any, limit: int = MAX_ENDING) -> str:
    return one_line(value, limit)
