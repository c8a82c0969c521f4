"""Why a serving Deployment's new pods do not become Ready, from the Deployment and its pods as the API server
returns them (core.control.rollout_waits); test_serving_plan shows the class's status and events saying it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from metainfer.core.control.job_waits import MAX_WHY, why_pod_waits
from metainfer.core.control.rollout_waits import ROLLOUT_WAIT_GRACE_S, waiting_deployments, why_rollout_waits
from metainfer.core.control.slim import slim_deployment
from metainfer.core.control.workloads import DeploymentState

NOW = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
SELECTOR = {"metainfer.io/policy": "digits", "metainfer.io/class": "abc", "metainfer.io/track": "stable"}
UNSCHEDULABLE = "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available."


def _at(seconds_ago: float) -> str:
    return (NOW - dt.timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def _deployment(name: str, progressed_s_ago: float | None, ready: int, replicas: int = 1) -> dict[str, Any]:
    conditions = []
    if progressed_s_ago is not None:
        conditions.append(
            {
                "type": "Progressing",
                "status": "True",
                "reason": "ReplicaSetUpdated",
                "lastUpdateTime": _at(progressed_s_ago),
            }
        )
    return {
        "metadata": {"name": name, "generation": 2, "creationTimestamp": _at(3600), "labels": SELECTOR},
        "spec": {"replicas": replicas, "selector": {"matchLabels": SELECTOR}, "template": {"spec": {}}},
        "status": {
            "observedGeneration": 2,
            "updatedReplicas": replicas,
            "availableReplicas": ready,
            "conditions": conditions,
        },
    }


def _pod(name: str, created: str, phase: str, ready: bool = False, **status: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}, *status.pop("conditions", [])]
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"containers": [{"name": "serve", "resources": {"limits": {"memory": "512Mi"}}}]},
        "status": {"phase": phase, "conditions": conditions, **status},
    }


def test_only_deployments_without_progress_for_the_grace_and_not_available_are_looked_at() -> None:
    deployments = [
        _deployment("available", 600, ready=1),
        _deployment("just-updated", ROLLOUT_WAIT_GRACE_S - 1, ready=0),
        _deployment("stalled", ROLLOUT_WAIT_GRACE_S + 1, ready=0),
        _deployment("half", 600, ready=1, replicas=2),
        _deployment("never-progressed", None, ready=0),  # by its creation, an hour ago
    ]
    names = [w.name for w in waiting_deployments(deployments, NOW)]
    assert names == ["half", "never-progressed", "stalled"]
    assert all(w.selector == SELECTOR for w in waiting_deployments(deployments, NOW))
    # the operator's index holds slimmed Deployments: what this reads survives the slimming
    assert [w.name for w in waiting_deployments(map(slim_deployment, deployments), NOW)] == names
    foreign = _deployment("no-selector", 600, ready=0)
    foreign["spec"]["selector"] = {"matchExpressions": [{"key": "app", "operator": "Exists"}]}
    assert waiting_deployments([foreign], NOW) == []


def test_an_unschedulable_new_pod_is_said_while_the_old_one_serves() -> None:
    pods = [
        _pod("old", "2026-01-01T10:00:00Z", "Running", ready=True),
        _pod(
            "new",
            "2026-01-01T11:59:00Z",
            "Pending",
            conditions=[
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
            ],
        ),
    ]
    assert why_rollout_waits(pods) == f"its pod new cannot be scheduled: {UNSCHEDULABLE}"
    assert why_rollout_waits([pods[0]]) is None, "every pod Ready: nothing waits"


def test_a_crash_loop_says_how_the_container_last_ended() -> None:
    killed = _pod(
        "new",
        "2026-01-01T11:59:00Z",
        "Running",
        containerStatuses=[
            {
                "name": "serve",
                "state": {
                    "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
                },
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
            }
        ],
    )
    why = why_rollout_waits([killed])
    assert why == (
        "its pod new waits: container serve: CrashLoopBackOff: back-off 40s restarting failed container; it was last"
        " killed for memory (OOMKilled) at its memory limit 512Mi"
    )
    exited = _pod(
        "new",
        "2026-01-01T11:59:00Z",
        "Running",
        containerStatuses=[
            {
                "name": "serve",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                "lastState": {"terminated": {"reason": "Error", "exitCode": 2, "message": "cannot load\nthe model"}},
            }
        ],
    )
    assert why_pod_waits(exited) == (
        "its pod new waits: container serve: CrashLoopBackOff: back-off; it last exited with code 2 (Error): cannot"
        " load the model"
    )


def test_pods_starting_as_usual_or_leaving_say_nothing() -> None:
    loading = _pod(
        "new", "2026-01-01T11:59:00Z", "Running", containerStatuses=[{"name": "serve", "state": {"running": {}}}]
    )
    creating = _pod(
        "new",
        "2026-01-01T11:59:00Z",
        "Pending",
        containerStatuses=[{"name": "serve", "state": {"waiting": {"reason": "ContainerCreating"}}}],
    )
    leaving = _pod(
        "gone",
        "2026-01-01T11:00:00Z",
        "Pending",
        conditions=[{"type": "PodScheduled", "status": "False", "message": "old news"}],
    )
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T11:59:30Z"
    assert why_rollout_waits([loading, creating, leaving]) is None


def test_what_a_pod_says_is_bounded_and_on_one_line() -> None:
    hostile = _pod(
        "new",
        "2026-01-01T11:59:00Z",
        "Pending",
        conditions=[{"type": "PodScheduled", "status": "False", "message": "x\n" * 10_000}],
    )
    why = why_rollout_waits([hostile])
    assert why is not None and len(why) <= MAX_WHY and "\n" not in why


def test_a_surge_pod_that_never_starts_leaves_the_rollout_unfinished_though_the_old_pod_is_available() -> None:
    """status.updatedReplicas counts the new pods that exist, availableReplicas the old ones too: a Pending surge
    pod beside the old Ready one read as rolled out, and the class said Ready while the old variant served."""
    surge = _deployment("d", 600, ready=1)
    surge["status"]["replicas"] = 2  # the old pod and the new one
    assert not DeploymentState.read(surge).available and DeploymentState.read(surge).serving
    done = _deployment("d", 600, ready=1)
    done["status"]["replicas"] = 1
    assert DeploymentState.read(done).available
    assert not DeploymentState.read(_deployment("d", 600, ready=0)).available
    stale = _deployment("d", 600, ready=1)
    stale["status"]["observedGeneration"] = 1  # the controller has not seen generation 2 yet
    assert not DeploymentState.read(stale).available


def test_a_crash_loop_between_two_crashes_is_still_said_as_one() -> None:
    """Between crashes the container runs (its status no longer says CrashLoopBackOff) but is not Ready: the
    class's message must not come and go, nor its Warning be sent again, with every restart."""
    running_again = _pod(
        "new", "2026-01-01T11:59:00Z", "Running",
        containerStatuses=[{
            "name": "serve", "ready": False, "restartCount": 3, "state": {"running": {}},
            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
        }],
    )  # fmt: skip
    assert why_rollout_waits([running_again]) == (
        "its pod new waits: container serve: CrashLoopBackOff: running again after 3 restarts, not Ready; it was"
        " last killed for memory (OOMKilled) at its memory limit 512Mi"
    )
    once = _pod(
        "new", "2026-01-01T11:59:00Z", "Running",
        containerStatuses=[{"name": "serve", "ready": False, "restartCount": 1, "state": {"running": {}},
                            "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}],
    )  # fmt: skip
    assert why_rollout_waits([once]) is None, "one restart, loading again: not a loop yet"
