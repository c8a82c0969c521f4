"""The operator on the real control plane: how Nodes' labels form hardware classes, and what a class that
appears, changes or goes makes of runs, Jobs and Deployments.

As in test_operator.py, each test runs ``metainfer operator`` as a process watching the test's own namespace,
creates labelled Node objects tagged with that namespace, and plays the kubelet's part by running each Job's
command itself. The two files are one suite split in halves of about equal length, so that pytest-xdist's
``--dist loadfile`` can spread them over its workers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client
from operator_harness import (
    Nodes,
    apply_policy,
    create_node,
    delete_node,
    deployments,
    job_command,
    jobs,
    make_policy,
    operator_process,
    policy,
    ready_status,
    run_all_pending,
    runs,
    wait_for,
)

from metainfer.core.api import GROUP, VERSION
from metainfer.core.api.names import LABEL_CLASS


def test_two_classes_are_adapted_and_rolled_out(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    avx2 = nodes.add(("AVX2",))
    vnni = nodes.add(("AVX2", "AVX512VNNI"))
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        js = wait_for("two Jobs", lambda: len(jobs(api, namespace)) == 2 and jobs(api, namespace), timeout=60)
        assert len(runs(api, namespace)) == 2
        selectors = {tuple(sorted((j.spec.template.spec.node_selector or {}).items())) for j in js}
        assert len(selectors) == 2, "each class's Job is pinned to its own nodes"
        for job in js:
            cmd = job_command(job)
            assert cmd[-3:-1] == ["agent", "run"] and cmd[-1] == f"{namespace}/{job.metadata.name}"
            pod = job.spec.template.spec
            assert pod.security_context.run_as_non_root
            assert pod.containers[0].security_context.read_only_root_filesystem
            matching = [n for n in (avx2, vnni) if _selects(api, pod.node_selector, pod.affinity, n)]
            assert len(matching) == 1, f"Job {job.metadata.name} would schedule on {matching}"
        assert sorted(run_all_pending(control_plane, namespace))

        def class_deployments() -> list[Any]:
            # The provisional Deployment serves until both classes roll out: wait for it to go, not just for two.
            found = deployments(api, namespace)
            recipes = ["--recipe-json" in " ".join(d.spec.template.spec.containers[0].args or []) for d in found]
            return found if len(found) == 2 and all(recipes) else []

        deps = wait_for("the two classes' Deployments, the provisional one gone", class_deployments)
        for dep in deps:
            args = " ".join(dep.spec.template.spec.containers[0].args or [])
            assert "serve" in " ".join(dep.spec.template.spec.containers[0].command or []) + args
            assert "--recipe-json" in args
        status = wait_for("Ready policy", lambda: ready_status(policy(api, namespace, "digits")), timeout=30)
        assert len(status["classes"]) == 2 and all(c["state"] == "Ready" for c in status["classes"])
        assert all(c.get("current", {}).get("p95Ms") for c in status["classes"])
        assert "Traceback" not in op.output()


def test_driver_label_change_makes_exactly_one_new_run(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """...and (issue 17) the new class's run starts from the trials the old class's run measured."""
    api = control_plane.api_client
    node = nodes.add(("AVX2",))
    search = {"trialBudget": 12, "algorithm": "hybrid", "timeBudgetSeconds": 120}
    apply_policy(api, make_policy(namespace, "digits", *digits_file, search=search))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path):
        wait_for("first Job", lambda: len(jobs(api, namespace)) == 1)
        run_all_pending(control_plane, namespace)
        (old_run,) = runs(api, namespace)
        assert old_run["status"]["trialHistory"]["trials"] >= 1 and not old_run["spec"].get("historyFrom")
        wait_for("Deployment", lambda: len(deployments(api, namespace)) == 1)
        old_class = deployments(api, namespace)[0].metadata.labels[LABEL_CLASS]
        # A new CPU feature label (e.g. a microcode/driver upgrade exposing VNNI) moves the node to a new class.
        client.CoreV1Api(api).patch_node(
            node, {"metadata": {"labels": {"feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI": "true"}}}
        )
        wait_for("second run", lambda: len(runs(api, namespace)) == 2)
        new_runs = [r for r in runs(api, namespace) if r["spec"]["classFingerprint"] != old_class]
        assert len(new_runs) == 1 and new_runs[0]["spec"]["reason"] in ("DriverChange", "NewHardwareClass")
        wait_for("its Job", lambda: len(jobs(api, namespace)) == 2)
        run_all_pending(control_plane, namespace)
        # The new class serves (provisionally with the old class's variant, then its own through the canary),
        # and the old class's Deployment goes.
        wait_for(
            "old class's Deployment removed",
            lambda: (
                {d.metadata.labels[LABEL_CLASS] for d in deployments(api, namespace)}
                == {new_runs[0]["spec"]["classFingerprint"]}
            ),
            timeout=30,
        )
        assert len(runs(api, namespace)) == 2, "exactly one new run"
        new_run = next(r for r in runs(api, namespace) if r["metadata"]["name"] == new_runs[0]["metadata"]["name"])
        assert new_run["spec"]["historyFrom"] == [old_run["metadata"]["name"]]
        history = new_run["status"]["history"]
        assert [s["run"] for s in history["sources"]] == [old_run["metadata"]["name"]], history
        before = old_run["status"]["progress"]["trialsCompleted"]
        after = new_run["status"]["progress"]["trialsCompleted"]
        print(f"driver change: {before} trials cold, {after} warm-started; history {history}")
        assert after + history["trialsSaved"] == before or history["trialsSaved"] == 0, (before, after, history)


def _selects(api: client.ApiClient, selector: dict[str, str] | None, affinity: Any, node: str) -> bool:
    labels = client.CoreV1Api(api).read_node(node).metadata.labels or {}
    if any(labels.get(k) != v for k, v in (selector or {}).items()):
        return False
    terms = (
        affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
        if (affinity and affinity.node_affinity)
        else []
    )
    for term in terms:
        for expr in term.match_expressions or []:
            if expr.operator == "DoesNotExist" and expr.key in labels:
                return False
    return True


def test_batch_change_job_failure_and_class_removal(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    nodes.add(("AVX2",))
    vnni = nodes.add(("AVX2", "AVX512VNNI"))
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path):
        wait_for("two Jobs", lambda: len(jobs(api, namespace)) == 2)
        run_all_pending(control_plane, namespace)
        wait_for("Ready policy", lambda: ready_status(policy(api, namespace, "digits")), timeout=30)
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "adaptationpolicies", "digits", {"spec": {"slo": {"batchSize": 8}}}
        )
        wait_for("a new run per class", lambda: len(runs(api, namespace)) == 4)
        new = [r for r in runs(api, namespace) if r["spec"]["batchSize"] == 8]
        assert len(new) == 2 and {r["spec"]["reason"] for r in new} == {"BatchChange"}
        wait_for("their Jobs", lambda: len(jobs(api, namespace)) == 4)
        # One Job fails for good (what the Job controller reports after its backoff limit).
        failing = new[0]["metadata"]["name"]
        now = "2026-01-01T00:00:00Z"
        failed_status = {"status": {"failed": 3, "startTime": now, "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": now},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit", "lastTransitionTime": now}]}}  # fmt: skip
        client.BatchV1Api(api).patch_namespaced_job_status(failing, namespace, failed_status)
        degraded = wait_for(
            "class Degraded",
            lambda: next((c for c in (policy(api, namespace, "digits").get("status") or {}).get("classes", [])
                          if c["state"] == "Degraded"), None),
        )  # fmt: skip
        assert degraded["reason"] == "BackoffLimitExceeded", degraded
        # The VNNI node goes away: its class, Deployment and Service are cleaned up.
        vnni_fp = next(r["spec"]["classFingerprint"] for r in runs(api, namespace)
                       if "AVX512VNNI" in r["spec"]["hardwareClass"].get("cpuFeatures", []))  # fmt: skip
        delete_node(api, vnni)
        wait_for(
            "the removed class's Deployment deleted",
            lambda: all(d.metadata.labels[LABEL_CLASS] != vnni_fp for d in deployments(api, namespace)),
            timeout=30,
        )
        classes = wait_for(
            "status without the removed class",
            lambda: (
                [c for c in policy(api, namespace, "digits")["status"]["classes"]]
                if all(c["fingerprint"] != vnni_fp for c in policy(api, namespace, "digits")["status"]["classes"])
                else None
            ),
        )
        assert len(classes) == 1


def test_nodes_whose_labels_form_no_class_never_stop_a_policy(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """Node labels are untrusted: an over-long arch value and a GPU memory label beyond int64, on nodes the policy
    does not select, used to make every policy InvalidSpec (or leave it without status). Now the policy adapts
    as usual, and hears only of the unclassifiable nodes it would select."""
    api = control_plane.api_client
    nodes.add(("AVX2",))
    arch = f"{namespace}-elsewhere-arch"[:36].ljust(36, "x")  # longer than the class's 32-character arch
    strangers = {
        f"{namespace}-long-arch": {"kubernetes.io/arch": arch},
        f"{namespace}-huge-gpu": {"nvidia.com/gpu.product": "A100", "nvidia.com/gpu.memory": "9" * 30},
    }
    mine = {f"{namespace}-mine-huge-gpu": {"metainfer.io/test": namespace, **strangers[f"{namespace}-huge-gpu"]}}
    for name, labels in (strangers | mine).items():
        create_node(api, name, labels)
        nodes.names.append(name)
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        wait_for("one Job", lambda: len(jobs(api, namespace)) == 1, timeout=60)
        status = wait_for(
            "the unclassifiable node in status",
            lambda: (policy(api, namespace, "digits").get("status") or {}).get("unclassifiedNodes"),
            timeout=60,
        )
        assert [n["name"] for n in status] == list(mine), "only the node this policy would select is reported"
        assert "nvidia.com/gpu.memory" in status[0]["reason"]
        body = policy(api, namespace, "digits")
        assert body["status"]["classCount"] == 1
        assert not any(c["reason"] == "InvalidSpec" for c in body["status"]["conditions"]), op.output()[-2000:]


def test_flapping_driver_labels_make_one_run_for_the_version_that_stays(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """20 driver versions in 10 s on 5 GPU nodes made a run per passing version; now a class new to the policy
    gets its run only once its labels held still for METAINFER_CLASS_SETTLE_SECONDS."""
    api = control_plane.api_client
    core = client.CoreV1Api(api)
    gpu = {"metainfer.io/test": namespace, "nvidia.com/gpu.product": "A100-SXM4-80GB", "nvidia.com/gpu.count": "1"}
    names = [f"{namespace}-gpu-{i}" for i in range(5)]
    for name in names:
        create_node(api, name, {**gpu, "nvidia.com/cuda.driver-version.full": "535.0.0"})
    try:
        apply_policy(api, make_policy(namespace, "digits", *digits_file))
        with operator_process(control_plane.kubeconfig, namespace, tmp_path,
                              env={"METAINFER_CLASS_SETTLE_SECONDS": "5"}) as op:  # fmt: skip
            wait_for("the first run", lambda: len(runs(api, namespace)) == 1)
            for step in range(20):  # 20 versions in about 10 s, node by node as a rolling upgrade would
                version = f"{540 + step}.0.0"
                for name in names:
                    core.patch_node(name, {"metadata": {"labels": {"nvidia.com/cuda.driver-version.full": version}}})
                time.sleep(0.5)
            final = "559.0.0"
            wait_for("a run for the version that stayed", lambda: any(
                r["spec"]["hardwareClass"].get("driverVersion") == final for r in runs(api, namespace)
            ), timeout=60)  # fmt: skip
            time.sleep(3)
            created = [line for line in op.output().splitlines() if "created run" in line]
            assert len(created) == 2, "\n".join(created)  # the version at the start, and the one that stayed
    finally:
        for name in names:
            delete_node(api, name)
