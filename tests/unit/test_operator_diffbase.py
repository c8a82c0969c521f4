"""The lean diff base must give kopf exactly the essence its own storage builds."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from metainfer.operator.diffbase import LeanAnnotationsDiffBaseStorage

PREFIX = "metainfer.io"
MANAGED_FIELDS = [{"manager": "python", "operation": "Update", "fieldsV1": {"f:spec": {"f:a": {}}}}]


def _policy() -> dict[str, Any]:
    return {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "7",
            "generation": 3,
            "labels": {"team": "a"},
            "annotations": {
                "note": "kept",
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                f"{PREFIX}/last-handled-configuration": "{...}",
            },
            "finalizers": [f"{PREFIX}/finalizer"],
            "managedFields": MANAGED_FIELDS,
        },
        "spec": {"model": {"uri": "file:///m.onnx"}, "slo": {"latencyP95Ms": 10}},
        "status": {"classes": [{"name": f"c{i}", "nodes": [f"n{j}" for j in range(64)]} for i in range(20)]},
    }


def _replica_set() -> dict[str, Any]:
    """kopf keys a Deployment's ReplicaSets differently: the lean body must keep kind and owners."""
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "rs", "ownerReferences": [{"kind": "Deployment", "name": "d"}], "annotations": {}},
        "spec": {"replicas": 1},
        "status": {"replicas": 1},
    }


@pytest.mark.parametrize("make", [_policy, _replica_set, lambda: {"kind": "Node", "metadata": {"name": "n"}}])
def test_lean_essence_equals_kopfs(make: Any) -> None:
    raw = make()
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration")
    lean = LeanAnnotationsDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration")
    assert lean.build(body=kopf.Body(copy.deepcopy(raw))) == kopfs.build(body=kopf.Body(copy.deepcopy(raw)))
    assert list(lean.make_keys("k", body=kopf.Body(raw))) == list(kopfs.make_keys("k", body=kopf.Body(raw)))


def test_extra_fields_in_status_still_reach_the_essence() -> None:
    raw = _policy()
    lean = LeanAnnotationsDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration")
    essence = lean.build(body=kopf.Body(raw), extra_fields=[("status", "classes")])
    assert essence["status"]["classes"] == raw["status"]["classes"]
    assert "status" not in lean.build(body=kopf.Body(raw))


def test_without_changing_handlers_the_essence_is_the_identity_alone() -> None:
    raw = _policy()
    lean = LeanAnnotationsDiffBaseStorage(prefix=PREFIX, key="last-handled-configuration", changing_handlers=False)
    essence = lean.build(body=kopf.Body(copy.deepcopy(raw)))
    assert "spec" not in essence and "status" not in essence
    assert not (essence.get("metadata") or {}).get("annotations")
    changed = {**raw, "spec": {"model": {"uri": "file:///other.onnx"}}}
    assert lean.build(body=kopf.Body(changed)) == essence  # nothing reads the diff: it need not see the change


def test_the_operator_registers_no_handler_that_reads_the_diff_base() -> None:
    """startup.configure keeps only identities in the diff base because of this; a changing handler added later
    makes it keep the essence again (see operator.diffbase)."""
    import metainfer.operator.handlers  # noqa: F401  (registers the operator's handlers)
    from metainfer.operator.diffbase import changing_handlers_registered

    assert not changing_handlers_registered(kopf.get_default_registry())
