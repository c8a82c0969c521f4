"""The on-node checks of provisional serving pods, as the operator reads them from the pods' status.

A provisional pod's init container (``metainfer check-provisional``, core.engine.onnode_check) writes what it
found as JSON to its termination message; the kubelet keeps it in the pod's ``initContainerStatuses``, which the
operator may read (it lists pods) and the pod cannot forge beyond its own namespace's writers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from metainfer.core.api.names import LABEL_CLASS, LABEL_PROVISIONAL, LABEL_RUN
from metainfer.core.engine.onnode_result import OnNodeCheck

CHECK_CONTAINER = "check"  # a provisional pod's init container
MESSAGE_LIMIT = 4096  # what the kubelet keeps of a termination message


@dataclass(frozen=True)
class PodCheck:
    """What one provisional pod's on-node check found, and which donor run's variant it checked."""

    pod: str
    run: str  # the pod's run label (core.control.naming.label_value of the donor run's name)
    result: OnNodeCheck


def read_pod_checks(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[PodCheck, ...]]:
    """The finished on-node checks of provisional pods (as the API server returns them), by class fingerprint.

    Pod labels and termination messages are written by whoever can create pods in the namespace: a message that
    does not validate is skipped, as is a pod whose check has not finished."""
    found: dict[str, list[PodCheck]] = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        if labels.get(LABEL_PROVISIONAL) != "true" or not labels.get(LABEL_CLASS):
            continue
        result = _check_result(status.get("initContainerStatuses") or [])
        if result is not None:
            check = PodCheck(str(meta.get("name", "")), str(labels.get(LABEL_RUN, "")), result)
            found.setdefault(str(labels[LABEL_CLASS]), []).append(check)
    return {fingerprint: tuple(sorted(checks, key=lambda c: c.pod)) for fingerprint, checks in found.items()}


def _check_result(statuses: Iterable[Mapping[str, Any]]) -> OnNodeCheck | None:
    for container in statuses:
        if container.get("name") != CHECK_CONTAINER:
            continue
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode") != 0 or not terminated.get("message"):
            return None
        try:
            return OnNodeCheck.model_validate_json(str(terminated["message"])[:MESSAGE_LIMIT])
        except ValidationError:
            return None
    return None
