"""What ended a failed run's pod, from the pod's status as the API server returns it (core.control.pod_endings)."""

from __future__ import annotations

from typing import Any

from metainfer.core.api.conditions import Reason
from metainfer.core.control.pod_endings import MAX_ENDING, pod_ending, with_ending

FAILED = {
    "phase": "Failed",
    "completionTime": "2026-01-01T01:00:00Z",
    "conditions": [{"type": "Succeeded", "status": "False", "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit"}],
}  # fmt: skip


def _pod(
    created: str, terminated: dict[str, Any] | None = None, *, last: bool = False, **status: Any
) -> dict[str, Any]:
    state = {"lastState" if last else "state": {"terminated": terminated}} if terminated else {"state": {"running": {}}}
    return {
        "metadata": {"name": f"run-{created}", "creationTimestamp": created},
        "spec": {"containers": [{"name": "agent", "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}]},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "agent", **state}], **status},
    }


def test_an_agent_killed_for_memory_fails_its_run_as_oomkilled_naming_the_limit_and_what_to_change() -> None:
    oom = _pod("2026-01-01T00:10:00Z", {"reason": "OOMKilled", "exitCode": 137})
    earlier = _pod("2026-01-01T00:00:00Z", {"reason": "Error", "exitCode": 1})
    ending = pod_ending([earlier, oom])
    assert ending is not None and ending.reason == Reason.OOM_KILLED
    assert "OOMKilled, exit code 137) at its memory limit 2Gi" in ending.message
    assert "agent.resources.limits.memory" in ending.message and "spec.slo.batchSize" in ending.message
    status = with_ending(FAILED, ending)
    (condition,) = status["conditions"]
    assert condition["reason"] == "OOMKilled" and condition["status"] == "False"
    assert condition["message"].startswith("Job has reached the specified backoff limit; container agent was killed")
    assert status["phase"] == "Failed" and FAILED["conditions"][0]["reason"] == "BackoffLimitExceeded", "no mutation"
    # a container restarted in place keeps its OOM kill in lastState
    assert pod_ending([_pod("t", {"reason": "OOMKilled", "exitCode": 137}, last=True)]) is not None


def test_signals_and_evictions_are_said_and_the_agents_own_exit_is_not() -> None:
    killed = pod_ending([_pod("t", {"reason": "Error", "exitCode": 137})])
    assert killed is not None and killed.reason is None and "SIGKILL (exit code 137, Error)" in killed.message
    evicted = _pod("t", reason="Evicted", message="The node was low on resource: memory.\nContainer agent used 3Gi")
    ending = pod_ending([evicted])
    assert ending is not None and ending.message.startswith("its pod was evicted: The node was low on resource")
    assert "\n" not in ending.message
    # exit code 1 is the agent's own: its error is in its log and in the result it wrote
    assert pod_ending([_pod("t", {"reason": "Error", "exitCode": 1})]) is None
    assert pod_ending([_pod("t")]) is None and pod_ending([]) is None


def test_what_the_pod_says_is_bounded() -> None:
    evicted = _pod("t", reason="Evicted", message="x" * 10_000)
    ending = pod_ending([evicted])
    assert ending is not None and len(ending.message) <= MAX_ENDING
    hostile = _pod("t", {"reason": "OOMKilled", "exitCode": 137})
    hostile["spec"]["containers"][0]["resources"]["limits"]["memory"] = "9" * 500
    hostile["status"]["containerStatuses"][0]["name"] = "a" * 500
    ending = pod_ending([hostile])
    assert ending is not None and len(ending.message) < 1200
