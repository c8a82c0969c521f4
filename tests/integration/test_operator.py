"""The operator on the real control plane: classes -> runs -> Jobs -> Deployments, and what breaks them.

Each test runs ``metainfer operator`` as a process watching the test's own
namespace, creates labelled Node objects (tagged with the test's namespace so
tests never see each other's nodes), and plays the kubelet's part by running
each Job's command itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
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
    run_agent,
    runs,
    wait_for,
)

from metainfer.agent.zoo import build_examples
from metainfer.core.api import GROUP, VERSION
from metainfer.core.api.names import LABEL_CLASS, LABEL_POLICY


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    built = build_examples(tmp_path_factory.mktemp("models"), ["digits"])["digits"]
    return built.model_path, built.sha256


def run_all_pending(cp: Any, namespace: str) -> list[str]:
    """Execute the agent for every run that has a Job and no result yet; returns their names."""
    done = []
    for run in runs(cp.api_client, namespace):
        if (run.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        job_names = {j.metadata.name for j in jobs(cp.api_client, namespace)}
        if run["metadata"]["name"] not in job_names:
            continue
        proc = run_agent(cp.kubeconfig, namespace, run["metadata"]["name"])
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        done.append(run["metadata"]["name"])
    return done


def test_two_classes_are_adapted_and_rolled_out(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    avx2 = nodes.add(("AVX2",))
    vnni = nodes.add(("AVX2", "AVX512VNNI"))
    apply_policy(api, make_policy(namespace, "digits", *digits))
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
        deps = wait_for(
            "two Deployments", lambda: len(deployments(api, namespace)) == 2 and deployments(api, namespace)
        )
        for dep in deps:
            args = " ".join(dep.spec.template.spec.containers[0].args or [])
            assert "serve" in " ".join(dep.spec.template.spec.containers[0].command or []) + args
            assert "--recipe-json" in args
        status = wait_for("Ready policy", lambda: ready_status(policy(api, namespace, "digits")), timeout=30)
        assert len(status["classes"]) == 2 and all(c["state"] == "Ready" for c in status["classes"])
        assert all(c.get("current", {}).get("p95Ms") for c in status["classes"])
        assert "Traceback" not in op.output()


def test_driver_label_change_makes_exactly_one_new_run(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    """...and (issue 17) the new class's run starts from the trials the old class's run measured."""
    api = control_plane.api_client
    node = nodes.add(("AVX2",))
    search = {"trialBudget": 12, "algorithm": "hybrid", "timeBudgetSeconds": 120}
    apply_policy(api, make_policy(namespace, "digits", *digits, search=search))
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


def test_sigkill_between_steps_never_duplicates(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    nodes.add(("AVX2",))
    nodes.add(("AVX2", "AVX512VNNI"))
    apply_policy(api, make_policy(namespace, "digits", *digits))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        # Killed as soon as the first run exists: possibly before its Job, possibly before the second run.
        wait_for("a run", lambda: runs(api, namespace), interval=0.02)
        op.kill()
        first = {r["metadata"]["name"] for r in runs(api, namespace)}
        op.start()
        wait_for("two Jobs", lambda: len(jobs(api, namespace)) == 2)
        assert first <= {r["metadata"]["name"] for r in runs(api, namespace)}
        op.kill()
        # Job "completes" (the agent writes the result) while no operator runs.
        run_all_pending(control_plane, namespace)
        op.start()
        wait_for("both Deployments", lambda: len(deployments(api, namespace)) == 2)
        wait_for("Ready policy", lambda: ready_status(policy(api, namespace, "digits")), timeout=30)
        op.kill()
        op.start()
        wait_for("the restarted operator to reconcile", lambda: "Handler" in op.output() or op.output(), timeout=60)
    assert len(runs(api, namespace)) == 2 and len(jobs(api, namespace)) == 2 and len(deployments(api, namespace)) == 2


def test_bad_model_fails_only_its_run_and_deletion_removes_children(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    nodes.add(("AVX2",))
    model, sha = digits
    apply_policy(api, make_policy(namespace, "good", model, sha))
    apply_policy(api, make_policy(namespace, "wrongsha", model, "0" * 64))
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 50)
    import hashlib

    apply_policy(api, make_policy(namespace, "corrupt", corrupt, hashlib.sha256(corrupt.read_bytes()).hexdigest()))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path):
        wait_for("three Jobs", lambda: len(jobs(api, namespace)) == 3)
        run_all_pending(control_plane, namespace)
        wait_for("good policy Ready", lambda: ready_status(policy(api, namespace, "good")), timeout=30)
        for name, reason in (("wrongsha", "ChecksumMismatch"), ("corrupt", "InvalidModel")):
            cls = wait_for(
                f"{name} Degraded",
                lambda name=name: next(
                    (c for c in (policy(api, namespace, name).get("status") or {}).get("classes", [])
                     if c["state"] == "Degraded"), None),
                timeout=30,
            )  # fmt: skip
            assert cls["reason"] == reason, cls
            assert cls.get("message")
        assert len(deployments(api, namespace)) == 1
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "adaptationpolicies", "good"
        )

        def services_of(policy_name: str) -> list[str]:
            items = client.CoreV1Api(api).list_namespaced_service(
                namespace, label_selector=f"{LABEL_POLICY}={policy_name}"
            )
            return [s.metadata.name for s in items.items]

        wait_for(
            "children of the deleted policy garbage-collected",
            lambda: (
                not deployments(api, namespace)
                and not [r for r in runs(api, namespace) if r["spec"]["policyName"] == "good"]
                and len(jobs(api, namespace)) == 2
                and not services_of("good")
            ),
            timeout=60,
        )
        # The other two policies keep their own address (a Service per policy, whatever serves behind it).
        assert services_of("wrongsha") == ["wrongsha"] and services_of("corrupt") == ["corrupt"]


def test_two_replicas_never_both_act(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    nodes.add(("AVX2",))
    peering = f"metainfer-{namespace}"
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    with operator_process(control_plane.kubeconfig, namespace, tmp_path / "old", peering) as old:
        wait_for("first replica up", lambda: "configured" in old.output())
        with operator_process(control_plane.kubeconfig, namespace, tmp_path / "new", peering) as new:
            # The newest replica wins; the older one pauses (its daemons stop).
            wait_for("older replica to pause", lambda: "Pausing operations" in old.output(), timeout=30)
            apply_policy(api, make_policy(namespace, "digits", *digits))
            wait_for("one Job", lambda: len(jobs(api, namespace)) == 1)
            assert "created run" in new.output()
            assert "created run" not in old.output()
            new.stop()
            wait_for("older replica to take over", lambda: "Resuming operations" in old.output(), timeout=90)
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "adaptationpolicies", "digits", {"spec": {"slo": {"batchSize": 2}}}
        )
        # The superseded in-flight run is deleted in the same step, so count BatchChange runs, not all runs.
        wait_for(
            "the resumed replica to act",
            lambda: [r for r in runs(api, namespace) if r["spec"]["reason"] == "BatchChange"],
            timeout=30,
        )


def test_batch_change_job_failure_and_class_removal(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    nodes.add(("AVX2",))
    vnni = nodes.add(("AVX2", "AVX512VNNI"))
    apply_policy(api, make_policy(namespace, "digits", *digits))
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
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
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
    apply_policy(api, make_policy(namespace, "digits", *digits))
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


def test_a_policy_with_a_name_longer_than_a_label_value_gets_ready_and_cleans_up(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    """Children label their policy with a hashed value past 63 characters; the operator used to look its
    Deployments up by the raw name, so the class never got Ready and its Deployment was orphaned."""
    api = control_plane.api_client
    node = nodes.add(("AVX2",))
    name = "digits-" + "long-" * 14 + "name"  # 81 characters
    apply_policy(api, make_policy(namespace, name, *digits))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        wait_for("its Job", lambda: len(jobs(api, namespace)) == 1)
        run_all_pending(control_plane, namespace)
        status = wait_for("Ready policy", lambda: ready_status(policy(api, namespace, name)), timeout=60)
        assert [c["state"] for c in status["classes"]] == ["Ready"], op.output()[-2000:]
        delete_node(api, node)
        wait_for("its Deployment removed with its class", lambda: deployments(api, namespace) == [], timeout=60)


def test_a_policy_asking_for_a_host_path_or_image_the_platform_does_not_allow_gets_nothing(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    """A user who may only create policies must not get, through the operator's rights, pods mounting any node
    directory or running any image: refused with a condition naming the field, and no run, Job or Deployment."""
    api = control_plane.api_client
    nodes.add(("AVX2",))
    body = make_policy(namespace, "digits", *digits, serving={"image": "attacker.example/miner:latest"})
    body["spec"]["model"]["volume"] = {"hostPath": "/", "mountPath": "/models"}
    apply_policy(api, body)
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        ready = wait_for(
            "the refusal",
            lambda: next(
                (c for c in (policy(api, namespace, "digits").get("status") or {}).get("conditions", [])
                 if c["type"] == "Ready" and c["reason"] == "ForbiddenByPlatform"),
                None,
            ),
        )  # fmt: skip
        assert "spec.model.volume.hostPath" in ready["message"] and "spec.serving.image" in ready["message"]
        time.sleep(2)  # a reconcile or two later: still nothing created
        assert runs(api, namespace) == [] and jobs(api, namespace) == [] and deployments(api, namespace) == []
        assert "Traceback" not in op.output()


def test_a_namespace_deleted_while_the_operator_is_down_is_released_after_restart(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    """Namespaced mode: kopf does not watch a namespace that is already Terminating when it starts, so the
    finalizer on the policy in it was never removed and the namespace stayed Terminating for good."""
    api = control_plane.api_client
    core = client.CoreV1Api(api)
    nodes.add(("AVX2",))
    apply_policy(api, make_policy(namespace, "digits", *digits))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        wait_for("the policy's finalizer", lambda: policy(api, namespace, "digits")["metadata"].get("finalizers"))
        wait_for("a Job", lambda: jobs(api, namespace))
        op.stop()
        core.delete_namespace(namespace)
        wait_for(
            "the namespace to be Terminating", lambda: core.read_namespace(namespace).status.phase == "Terminating"
        )
        # The namespace controller deletes the policy, and is blocked by its finalizer.
        wait_for("the policy to be marked deleted", lambda: policy(api, namespace, "digits")["metadata"].get(
            "deletionTimestamp"), timeout=60)  # fmt: skip
        time.sleep(2)
        op.start()

        def gone() -> bool:
            try:
                core.read_namespace(namespace)
            except client.exceptions.ApiException as exc:
                return exc.status == 404
            return False

        try:
            wait_for("the namespace to be deleted", gone, timeout=90, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{op.output()[-4000:]}") from exc


def test_flapping_driver_labels_make_one_run_for_the_version_that_stays(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
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
        apply_policy(api, make_policy(namespace, "digits", *digits))
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


def _service(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    try:
        return core.read_namespaced_service(name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_deleted_policy_service_comes_back_at_once_not_at_the_next_resync(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    """The operator watches its Services: the policy's address, deleted by hand, is back within seconds, not at
    the next resync (5 minutes here), the only reconcile that would have recreated it before."""
    api = control_plane.api_client
    core = client.CoreV1Api(api)
    nodes.add(("AVX2",))
    apply_policy(api, make_policy(namespace, "digits", *digits))
    env = {"METAINFER_RESYNC_SECONDS": "300"}
    with operator_process(control_plane.kubeconfig, namespace, tmp_path, env=env) as op:
        first = wait_for("the policy's Service", lambda: _service(core, namespace, "digits"), timeout=60)
        wait_for("the run's Job", lambda: jobs(api, namespace), timeout=60)
        time.sleep(2)  # the burst of the run's creation is over: nothing else will wake the policy
        core.delete_namespaced_service("digits", namespace)
        again = wait_for(
            "the Service created again",
            lambda: (s := _service(core, namespace, "digits")) is not None and s.metadata.uid != first.metadata.uid,
            timeout=30,
        )
        assert again
        assert "Traceback" not in op.output()


def test_a_finished_run_frees_its_slot_in_a_long_running_operator(
    control_plane: Any, namespace: str, nodes: Nodes, digits: tuple[Path, str], tmp_path: Path
) -> None:
    """The in-flight index kept a run after it finished (kopf keeps an entry whose handler returns None), so a
    long-running operator counted every finished run as in flight: after the namespace's limit of runs had
    ended, each new one (a drift, a new model version) waited at ConcurrencyLimit until the operator restarted.
    Found reading kopf's indexer; the e2e suite's restarts had hidden it."""
    api = control_plane.api_client
    nodes.add(("AVX2",))
    apply_policy(api, make_policy(namespace, "digits", *digits))
    env = {"METAINFER_MAX_CONCURRENT_RUNS_PER_NAMESPACE": "1"}
    with operator_process(control_plane.kubeconfig, namespace, tmp_path, env=env):
        for batch in (4, 8, 16):  # make_policy's batch, then two changes: three runs, one at a time
            if batch != 4:
                client.CustomObjectsApi(api).patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "adaptationpolicies", "digits", {"spec": {"slo": {"batchSize": batch}}}
                )
            wait_for(f"the batch-{batch} run's Job", lambda b=batch: any(
                r["spec"]["batchSize"] == b and r["metadata"]["name"] in {j.metadata.name for j in jobs(api, namespace)}
                for r in runs(api, namespace)
            ), timeout=120)  # fmt: skip
            assert run_all_pending(control_plane, namespace), f"the batch-{batch} run ran"
        phases = sorted((r["spec"]["batchSize"], r["status"]["phase"]) for r in runs(api, namespace))
        assert phases == [(4, "Succeeded"), (8, "Succeeded"), (16, "Succeeded")], phases
