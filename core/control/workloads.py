"""The Deployments and Jobs the operator made, as the reconcile reads them.

They are Kubernetes built-ins with no model in core.api, and the operator's
indexes hold them as slimmed mappings (core.control.slim). Every field the
reconcile reads from them is read here, once per object and reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metainfer.core.api._base import one_line
from metainfer.core.api.names import ANNOTATION_SPEC_HASH, LABEL_CLASS


@dataclass(frozen=True)
class DeploymentState:
    name: str
    class_fingerprint: str | None  # its class label
    spec_hash: str | None
    # The controller saw its latest spec, every replica is updated and available, and no old replica is left (what
    # ``kubectl rollout status`` waits for): a surge pod that never starts leaves the old pod available beside it.
    available: bool
    serving: bool = False  # at least one replica is available, whatever spec it runs
    # Why its rollout does not progress, as its controller says: a replica it cannot create (a ResourceQuota), or
    # its progress deadline passed (pods that never became ready). None while nothing says so.
    stuck: str | None = None

    @classmethod
    def read(cls, deployment: Mapping[str, Any]) -> DeploymentState:
        meta = deployment["metadata"]
        want = (deployment.get("spec") or {}).get("replicas", 1)
        status = deployment.get("status") or {}
        fresh = status.get("observedGeneration", 0) >= meta.get("generation", 0)
        return cls(
            name=meta["name"],
            class_fingerprint=(meta.get("labels") or {}).get(LABEL_CLASS),
            spec_hash=(meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH),
            available=fresh and _rolled_out(status, want),
            serving=status.get("availableReplicas", 0) > 0,
            stuck=_stuck(status.get("conditions") or []) if fresh else None,  # not an old spec's
        )


def _rolled_out(status: Mapping[str, Any], want: int) -> bool:
    updated = status.get("updatedReplicas", 0)
    old_left = status.get("replicas", 0) > updated  # status.replicas: every non-terminated pod, old ones too
    return updated >= want and not old_left and status.get("availableReplicas", 0) >= max(want, updated)


STUCK_MAX = 900  # it becomes part of a class message of 4,096 characters


def _stuck(conditions: list[Mapping[str, Any]]) -> str | None:
    by_type = {c.get("type"): c for c in conditions}
    failure, progressing = by_type.get("ReplicaFailure") or {}, by_type.get("Progressing") or {}
    if failure.get("status") == "True":
        said = failure
    elif progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        said = progressing
    else:
        return None
    return one_line(f"{said.get('reason') or ''}: {said.get('message') or ''}", STUCK_MAX)


@dataclass(frozen=True)
class JobEnd:
    """How an adaptation Job ended: failed (with the Job controller's reason and message) or complete."""

    name: str
    failed: bool
    reason: str  # the Failed condition's reason; "" when complete
    message: str


def job_end(job: Mapping[str, Any]) -> JobEnd | None:
    """The Job's end from its conditions; None while it runs."""
    name = str(job["metadata"]["name"])
    ended = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    if "Failed" in ended:
        failed = ended["Failed"]
        return JobEnd(name, failed=True, reason=failed.get("reason") or "", message=failed.get("message") or "")
    if "Complete" in ended:
        return JobEnd(name, failed=False, reason="", message="")
    return None
