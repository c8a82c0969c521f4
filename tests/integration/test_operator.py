"""The operator on the real control plane: what breaks the loop of classes -> runs -> Jobs -> Deployments
(killed steps, bad models, a second replica, long names, forbidden fields, deleted namespaces and Services), and
what it must release. How Nodes' labels form classes, and what a class change makes: test_operator_classes.py.

Each test runs ``metainfer operator`` as a process watching the test's own
namespace, creates labelled Node objects (tagged with the test's namespace so
tests never see each other's nodes), and plays the kubelet's part by running
each Job's command itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client
from operator_harness import (
    Nodes,
    apply_policy,
    delete_node,
    deployments,
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
from metainfer.core.api.names import LABEL_POLICY


def test_sigkill_between_steps_never_duplicates(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    nodes.add(("AVX2",))
    nodes.add(("AVX2", "AVX512VNNI"))
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
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
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    api = control_plane.api_client
    nodes.add(("AVX2",))
    model, sha = digits_file
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
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
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
            apply_policy(api, make_policy(namespace, "digits", *digits_file))
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


def test_a_policy_with_a_name_longer_than_a_label_value_gets_ready_and_cleans_up(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """Children label their policy with a hashed value past 63 characters; the operator used to look its
    Deployments up by the raw name, so the class never got Ready and its Deployment was orphaned."""
    api = control_plane.api_client
    node = nodes.add(("AVX2",))
    name = "digits-" + "long-" * 14 + "name"  # 81 characters
    apply_policy(api, make_policy(namespace, name, *digits_file))
    with operator_process(control_plane.kubeconfig, namespace, tmp_path) as op:
        wait_for("its Job", lambda: len(jobs(api, namespace)) == 1)
        run_all_pending(control_plane, namespace)
        status = wait_for("Ready policy", lambda: ready_status(policy(api, namespace, name)), timeout=60)
        assert [c["state"] for c in status["classes"]] == ["Ready"], op.output()[-2000:]
        delete_node(api, node)
        wait_for("its Deployment removed with its class", lambda: deployments(api, namespace) == [], timeout=60)


def test_a_policy_asking_for_a_host_path_or_image_the_platform_does_not_allow_gets_nothing(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """A user who may only create policies must not get, through the operator's rights, pods mounting any node
    directory or running any image: refused with a condition naming the field, and no run, Job or Deployment."""
    api = control_plane.api_client
    nodes.add(("AVX2",))
    body = make_policy(namespace, "digits", *digits_file, serving={"image": "attacker.example/miner:latest"})
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
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """Namespaced mode: kopf does not watch a namespace that is already Terminating when it starts, so the
    finalizer on the policy in it was never removed and the namespace stayed Terminating for good."""
    api = control_plane.api_client
    core = client.CoreV1Api(api)
    nodes.add(("AVX2",))
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
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


def _service(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    try:
        return core.read_namespaced_service(name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_a_deleted_policy_service_comes_back_at_once_not_at_the_next_resync(
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """The operator watches its Services: the policy's address, deleted by hand, is back within seconds, not at
    the next resync (5 minutes here), the only reconcile that would have recreated it before."""
    api = control_plane.api_client
    core = client.CoreV1Api(api)
    nodes.add(("AVX2",))
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
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
    control_plane: Any, namespace: str, nodes: Nodes, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """The in-flight index kept a run after it finished (kopf keeps an entry whose handler returns None), so a
    long-running operator counted every finished run as in flight: after the namespace's limit of runs had
    ended, each new one (a drift, a new model version) waited at ConcurrencyLimit until the operator restarted.
    Found reading kopf's indexer; the e2e suite's restarts had hidden it."""
    api = control_plane.api_client
    nodes.add(("AVX2",))
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
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
