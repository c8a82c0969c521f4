"""What the operator keeps in memory of each child object it watches (core.control.slim): only what the reconcile
reads, detached from the object it came from. Every scenario of reconcile_cluster also plans on slimmed copies and
must plan the same; this checks what slimming drops, which is what saves the operator's memory."""

from __future__ import annotations

from reconcile_cluster import CPU, Cluster, model

from metainfer.core.control.hardware import ClassGroup, group_nodes
from metainfer.core.control.runs import plan_job
from metainfer.core.control.slim import slim_deployment, slim_job, slim_run


def test_slimmed_children_drop_what_the_reconcile_never_reads() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (run,) = c.runs.values()
    group: ClassGroup = next(iter(group_nodes([("c1", CPU)]).values()))
    job = plan_job(model(run), None, group)
    assert job is not None
    managed = [{"manager": "kube-controller-manager", "fieldsV1": {"f:status": {}}}]
    job["metadata"]["managedFields"] = managed
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    slim = slim_job(job)
    assert slim == {
        "metadata": {k: v for k, v in job["metadata"].items() if k in ("name", "namespace", "labels", "annotations")},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    run["metadata"]["managedFields"] = managed
    run["status"] = {"phase": "Succeeded", "trials": [{"index": i} for i in range(200)]}
    assert slim_run(run)["status"] == {"phase": "Succeeded"} and "managedFields" not in slim_run(run)["metadata"]
    deployment = {
        "metadata": {"name": "d", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "serve"}]}}},
        "status": {"availableReplicas": 2},
    }
    assert slim_deployment(deployment) == {
        "metadata": {"name": "d"},
        "spec": {"replicas": 2},
        "status": {"availableReplicas": 2},
    }
    slim["status"]["conditions"][0]["status"] = "False"
    assert job["status"]["conditions"][0]["status"] == "True", "a slimmed copy is detached from its source"
