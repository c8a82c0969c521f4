"""What the operator keeps in memory of each watched child object.

kopf's indexes hold one copy of every AdaptationRun, Job and Deployment the
operator manages: 4,000 objects at 100 policies x 20 classes. Full copies cost
most of the operator's memory (server-side-apply ``managedFields``, each Job's
pod template, each run's trial table), and none of that is read by the
reconcile. These functions keep only what it reads (runs validate into
core.api's AdaptationRun without their trials; Jobs and Deployments are read
in core.control.workloads); a unit test plans every reconcile scenario on full
and slimmed objects and requires the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# metadata the reconcile and the manifests it builds read (owner references need uid)
METADATA_KEPT = (
    "name",
    "namespace",
    "uid",
    "labels",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "resourceVersion",
)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    out = {k: _copy(meta[k]) for k in METADATA_KEPT if k in meta}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        out["annotations"] = annotations
    return out


def _copy(value: Any) -> Any:
    """A detached plain copy (kopf bodies are live views that change under the reconcile)."""
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def slim_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """An AdaptationRun without its trial table (the agent's report, up to hundreds of rows) and without the data
    of its checkpoint and trial history (up to a megabyte each; the reconcile only asks whether they exist)."""
    status = {k: _copy(v) for k, v in (run.get("status") or {}).items() if k != "trials"}
    for blob in ("checkpoint", "trialHistory"):
        if isinstance(status.get(blob), Mapping):
            status[blob] = {**status[blob], "data": ""}
    return {"metadata": _metadata(run), "spec": _copy(run.get("spec") or {}), "status": status}


def slim_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """A Job as its name, conditions and ready pods: how a run's Job ended, and whether its pod is at work."""
    status = job.get("status") or {}
    kept = {"conditions": _copy(status.get("conditions") or [])}
    if "ready" in status:
        kept["ready"] = status["ready"]
    return {"metadata": _metadata(job), "status": kept}


def slim_deployment(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """A Deployment without its pod template: the reconcile compares spec hashes (an annotation), not templates."""
    spec = {k: _copy(v) for k, v in (deployment.get("spec") or {}).items() if k != "template"}
    return {"metadata": _metadata(deployment), "spec": spec, "status": _copy(deployment.get("status") or {})}
