"""The Helm chart on the real control plane: lint, render, apply server-side, then run the operator under its RBAC.

The operator and the agent run with tokens of the chart's own ServiceAccounts
(TokenRequest; the control plane signs service-account tokens), never as admin,
so the operator loop succeeding proves the chart's RBAC is sufficient, and the
denied requests below prove it is not more than that.

The Prometheus Operator's CRDs are not part of this project: minimal stand-ins
for ServiceMonitor, PodMonitor and PrometheusRule (any spec accepted) let the
API server store those documents; the real schemas are not checked here.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from _objects import run as run_object
from kubernetes import client, config
from operator_harness import (
    Nodes,
    apply_policy,
    deployments,
    jobs,
    make_policy,
    operator_process,
    ready_status,
    run_agent,
    runs,
    wait_for,
)
from operator_harness import policy as get_policy

from hack.controlplane.errors import AssetError
from hack.helm import HELM_VERSION, all_optional_on, provide
from metainfer.core.api import GROUP, VERSION
from metainfer.core.api.hardwareclass import HardwareClass
from metainfer.core.api.hardwareprofile import HardwareProfileResource, HardwareProfileSpec, profile_name
from metainfer.core.api.names import MANAGED_BY

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "metainfer"
ALL_ON = all_optional_on()
# The release's objects without its CRDs (the session's come from crds/, and a test's teardown deletes the
# cluster-scoped objects it applied) and without `helm test`'s hooks.
RELEASE_OBJECTS = ["--set", "crds.enabled=false", "--skip-tests"]
MONITORING_KINDS = [("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors"),
                    ("PrometheusRule", "prometheusrules")]  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        return str(provide(print))
    except AssetError as exc:
        pytest.fail(f"cannot provide helm {HELM_VERSION}: {exc}", pytrace=False)


def run_helm(helm: str, *args: str) -> str:
    result = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def monitoring_crds(control_plane: Any) -> None:
    """Stand-in monitoring.coreos.com CRDs (schema-less), installed once and left for the session."""
    for kind, plural in MONITORING_KINDS:
        crd = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
            },
        }  # fmt: skip
        control_plane.kubectl("apply", "--server-side", "--field-manager=metainfer-test", "-f", "-",
                              stdin=yaml.safe_dump(crd))  # fmt: skip
        control_plane.kubectl(
            "wait", "--for=condition=Established", "--timeout=30s", f"crd/{plural}.monitoring.coreos.com"
        )


@pytest.mark.parametrize("all_on", [False, True], ids=["defaults", "all-optional-on"])
def test_lint_template_and_server_side_apply(
    control_plane: Any, namespace: str, helm: str, monitoring_crds: None, tmp_path: Path, all_on: bool
) -> None:
    extra = ALL_ON if all_on else []
    lint = run_helm(helm, "lint", "--strict", str(CHART), *extra)
    assert "0 chart(s) failed" in lint, lint
    release = f"r{secrets.token_hex(3)}"
    manifest = run_helm(helm, "template", release, str(CHART), "--namespace", namespace,
                        "--set", f"workloadNamespaces={{{namespace}}}", *extra)  # fmt: skip
    documents = [d for d in yaml.safe_load_all(manifest) if d]
    crds = [d for d in documents if d["kind"] == "CustomResourceDefinition"]
    objects = [d for d in documents if d["kind"] != "CustomResourceDefinition"]
    assert len(crds) == len(list((CHART / "files" / "crds").glob("*.yaml")))
    kinds = {d["kind"] for d in objects}
    optional = {kind for kind, _ in MONITORING_KINDS}
    assert kinds & optional == (optional if all_on else set())
    # The session's CRDs come from crds/ and other tests rely on them: the chart's are checked, not swapped in.
    crd_file = tmp_path / "crds.yaml"
    crd_file.write_text(yaml.safe_dump_all(crds))
    control_plane.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts", "-f", str(crd_file))
    objects_file = tmp_path / "objects.yaml"
    objects_file.write_text(yaml.safe_dump_all(objects))
    try:
        applied = control_plane.kubectl("apply", "--server-side", "--field-manager=helm-test", "-f", str(objects_file))
        assert applied.stdout.count("serverside-applied") == len(objects), applied.stdout
        for doc in objects:
            ns = doc["metadata"].get("namespace")
            got = control_plane.kubectl("get", doc["kind"], doc["metadata"]["name"], *(["-n", ns] if ns else []),
                                        "-o", "name")  # fmt: skip
            assert got.stdout.strip(), f"{doc['kind']} {doc['metadata']['name']} was not stored"
    finally:
        cluster_scoped = [d for d in objects if "namespace" not in d["metadata"]]
        (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(cluster_scoped))
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(tmp_path / "cluster.yaml"), check=False)


# --- the operator and the agent with the chart's ServiceAccounts -------------------------------------------------


def sa_kubeconfig(control_plane: Any, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig authenticating as ``namespace/account`` with a bound token from the TokenRequest API."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = (
        client.CoreV1Api(control_plane.api_client)
        .create_namespaced_service_account_token(account, namespace, request)
        .status.token
    )
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return path


def agent_kubeconfig(control_plane: Any, namespace: str, run_name: str, path: Path) -> Path:
    """What a kubelet gives the agent of run ``run_name``: a token of the agent account bound to a pod of the
    run's Job (``<run>-<5 characters>``). No kubelet runs here, so the Pod object only exists to bind to."""
    core = client.CoreV1Api(control_plane.api_client)
    pod = core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{run_name}-{secrets.token_hex(3)[:5]}"},
            "spec": {"serviceAccountName": "metainfer-agent", "containers": [{"name": "agent", "image": "metainfer"}]},
        },
    )
    bound = client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid)
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600, bound_object_ref=bound)
    token = core.create_namespaced_service_account_token(
        "metainfer-agent", namespace, client.AuthenticationV1TokenRequest(spec=spec)
    ).status.token
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["users"] = [{"name": "agent", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "agent"
    path.write_text(yaml.safe_dump(config))
    return path


def can_i(control_plane: Any, kubeconfig: Path, *args: str) -> bool:
    result = subprocess.run([str(control_plane.kubectl_path), "--kubeconfig", str(kubeconfig), "auth", "can-i", *args],
                            capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    return result.stdout.strip() == "yes"


@pytest.fixture
def installed(control_plane: Any, namespace: str, helm: str, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """The chart's objects (defaults) in the test namespace; kubeconfigs of its operator and agent accounts."""
    release = f"r{secrets.token_hex(3)}"
    # The harness runs the operator with --namespace (one test, one namespace): the chart is told the same.
    manifest = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *RELEASE_OBJECTS,
                        "--set", f"workloadNamespaces={{{namespace}}}",
                        "--set", f"operator.watchNamespaces={{{namespace}}}")  # fmt: skip
    objects = [d for d in yaml.safe_load_all(manifest) if d]
    path = tmp_path / "chart.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    control_plane.kubectl("apply", "--server-side", "--field-manager=helm-test", "-f", str(path))
    (operator_sa,) = [d["metadata"]["name"] for d in objects
                      if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-operator")]  # fmt: skip
    try:
        yield {
            "operator": sa_kubeconfig(control_plane, namespace, operator_sa, tmp_path / "operator.kubeconfig"),
            "agent": sa_kubeconfig(control_plane, namespace, "metainfer-agent", tmp_path / "agent.kubeconfig"),
            "serving": sa_kubeconfig(control_plane, namespace, "metainfer-serving", tmp_path / "serving.kubeconfig"),
        }
    finally:
        cluster_scoped = [d for d in objects if "namespace" not in d["metadata"]]
        (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(cluster_scoped))
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(tmp_path / "cluster.yaml"), check=False)


def test_rbac_grants_what_the_code_needs_and_no_more(control_plane: Any, namespace: str, installed: dict) -> None:
    op, agent, serving = installed["operator"], installed["agent"], installed["serving"]
    assert can_i(control_plane, op, "create", "jobs.batch", "-n", namespace)
    for verb, resource in [("create", "jobs.batch"), ("create", "deployments.apps"), ("create", "services"),
                           ("create", "adaptationruns.metainfer.io")]:  # fmt: skip
        assert not can_i(control_plane, op, verb, resource, "-n", "default"), f"operator may {verb} {resource}"
    assert can_i(control_plane, op, "patch", "adaptationpolicies.metainfer.io", "--subresource=status", "-n", namespace)
    assert not can_i(control_plane, op, "get", "secrets", "-n", namespace)
    assert not can_i(control_plane, op, "create", "pods", "-n", namespace)
    assert not can_i(control_plane, op, "create", "clusterroles.rbac.authorization.k8s.io")
    assert can_i(control_plane, agent, "get", "adaptationruns.metainfer.io", "-n", namespace)
    assert can_i(control_plane, agent, "create", "hardwareprofiles.metainfer.io")
    for verb, resource in [("list", "adaptationruns.metainfer.io"), ("delete", "adaptationruns.metainfer.io"),
                           ("patch", "adaptationruns.metainfer.io"), ("list", "configmaps"), ("get", "secrets"),
                           ("delete", "hardwareprofiles.metainfer.io"), ("create", "jobs.batch")]:  # fmt: skip
        assert not can_i(control_plane, agent, verb, resource, "-n", namespace), f"agent may {verb} {resource}"
    assert not can_i(control_plane, agent, "get", "adaptationruns.metainfer.io", "-n", "default")
    assert not can_i(control_plane, serving, "get", "adaptationruns.metainfer.io", "-n", namespace)


def test_operator_loop_runs_with_the_charts_service_accounts(
    control_plane: Any, namespace: str, nodes: Nodes, installed: dict, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """Two classes -> two runs -> two Jobs -> agent results -> two Deployments, Ready; nothing as admin."""
    api = control_plane.api_client  # admin: only to set the scene (nodes, policy) and to observe
    nodes.add(("AVX2",))
    nodes.add(("AVX2", "AVX512VNNI"))
    apply_policy(api, make_policy(namespace, "digits", *digits_file))
    with operator_process(installed["operator"], namespace, tmp_path) as op:
        wait_for("two Jobs", lambda: len(jobs(api, namespace)) == 2, timeout=90)
        for run in runs(api, namespace):
            name = run["metadata"]["name"]
            proc = run_agent(
                agent_kubeconfig(control_plane, namespace, name, tmp_path / f"{name}.kubeconfig"), namespace, name
            )
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
            assert "forbidden" not in (proc.stdout + proc.stderr).lower(), proc.stderr[-2000:]
        try:
            wait_for("two serving Deployments", lambda: len(serving(api, namespace)) == 2, timeout=60)
        except AssertionError as exc:
            names = [d.metadata.name for d in deployments(api, namespace)]
            raise AssertionError(f"{exc}: {names}\noperator log:\n{op.output()[-6000:]}") from exc
        status = wait_for("Ready policy", lambda: ready_status(get_policy(api, namespace, "digits")), timeout=60)
        assert len(status["classes"]) == 2 and all(c["state"] == "Ready" for c in status["classes"])
        assert all(r["status"]["phase"] == "Succeeded" for r in runs(api, namespace))
        log = op.output()
        assert "Traceback" not in log and "forbidden" not in log.lower(), log[-4000:]


def serving(api: client.ApiClient, namespace: str) -> list[Any]:
    """The operator's Deployments (the chart's own operator Deployment lives in the same namespace here)."""
    return [d for d in deployments(api, namespace) if (d.metadata.labels or {}).get(MANAGED_BY) == "metainfer"]


def test_an_agent_writes_only_the_status_of_its_own_run(
    control_plane: Any, namespace: str, installed: dict, tmp_path: Path
) -> None:
    """RBAC lets the agent account patch any run's status in its namespace; the chart's admission policy narrows
    that to the run whose Job's pod the token is bound to. A forged result for another run is refused."""
    api = client.CustomObjectsApi(control_plane.api_client)
    for name in ("run-a", "run-b", "probe"):
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, "adaptationruns", run_object(name))
    own = agent_kubeconfig(control_plane, namespace, "run-a", tmp_path / "a.kubeconfig")
    forged = {"status": {"phase": "Succeeded", "bestMetrics": {"p95Ms": 0.001}}}

    def patch(kubeconfig: Path, name: str) -> str:
        """'' when the write landed, else the API server's refusal (as the agent writes: a status merge-patch)."""
        as_agent = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
        try:
            as_agent.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "adaptationruns", name, forged)
        except client.exceptions.ApiException as exc:
            return f"{exc.status} {exc.body}"
        return ""

    # The API server loads admission policies asynchronously: wait until this one is enforced.
    wait_for("the admission policy in force", lambda: patch(own, "probe").startswith("403"), timeout=30)
    assert patch(own, "run-a") == "", "its own run"
    refused = patch(own, "run-b")
    assert refused.startswith("403") and "its own run" in refused, refused
    unbound = patch(installed["agent"], "run-a")  # a token not bound to any pod of the run's Job
    assert unbound.startswith("403") and "its own run" in unbound, unbound
    assert (
        api.get_namespaced_custom_object(GROUP, VERSION, namespace, "adaptationruns", "run-b").get("status") or {}
    ) == {}


def test_an_agent_writes_only_its_own_namespaces_hardware_profiles(
    control_plane: Any, namespace: str, installed: dict, tmp_path: Path
) -> None:
    """Profiles are cluster-scoped and the agent ClusterRole may create them and patch their status. A profile
    is trusted only by runs of the namespace whose agent measured it, so the chart's admission policy lets an
    agent write only ``<fingerprint>.<its namespace>``: another tenant's profile cannot be poisoned."""
    admin = client.CustomObjectsApi(control_plane.api_client)
    as_agent = client.CustomObjectsApi(config.new_client_from_config(config_file=str(installed["agent"])))
    cls = HardwareClass(vendor="cpu", product=f"Tenancy-{secrets.token_hex(3)}")
    fp = cls.fingerprint()
    other = f"other-{secrets.token_hex(3)}"

    def body(tenant: str, name: str | None = None) -> dict[str, Any]:
        spec = HardwareProfileSpec(fingerprint=fp, hardware_class=cls, namespace=tenant)
        return HardwareProfileResource(metadata={"name": name or profile_name(fp, tenant)}, spec=spec).to_api()

    def refusal(call: Any, *args: Any) -> str:
        try:
            call(*args)
        except client.exceptions.ApiException as exc:
            return f"{exc.status} {exc.body}"
        return ""

    probe = f"probe-{secrets.token_hex(3)}"
    victims = [profile_name(fp, other), profile_name(fp, namespace), f"{fp}.x", profile_name(fp, probe)]
    admin.create_cluster_custom_object(GROUP, VERSION, "hardwareprofiles", body(other))  # another tenant's
    admin.create_cluster_custom_object(GROUP, VERSION, "hardwareprofiles", body(probe))
    try:
        poisoned = {"status": {"measuredAt": "2026-01-01T00:00:00Z"}}
        # The API server loads admission policies asynchronously: wait on a probe object, so that a write that
        # lands before the policy is in force never touches the victim.
        wait_for("the admission policy in force", lambda: refusal(
            as_agent.patch_cluster_custom_object_status, GROUP, VERSION, "hardwareprofiles", victims[3], poisoned
        ).startswith("403"), timeout=30)  # fmt: skip
        refused = refusal(
            as_agent.patch_cluster_custom_object_status, GROUP, VERSION, "hardwareprofiles", victims[0], poisoned
        )
        assert refused.startswith("403") and "its own namespace" in refused, refused
        refused = refusal(
            as_agent.create_cluster_custom_object, GROUP, VERSION, "hardwareprofiles", body(other, f"{fp}.x")
        )
        assert refused.startswith("403") and "its own namespace" in refused, refused
        mislabelled = body(namespace, f"{fp}.x")  # its own namespace in spec, under a name another run may GET
        refused = refusal(as_agent.create_cluster_custom_object, GROUP, VERSION, "hardwareprofiles", mislabelled)
        assert refused.startswith("403"), refused
        # Its own namespace's profile: create it and write its measurement.
        assert refusal(as_agent.create_cluster_custom_object, GROUP, VERSION, "hardwareprofiles", body(namespace)) == ""
        assert refusal(as_agent.patch_cluster_custom_object_status, GROUP, VERSION, "hardwareprofiles",
                       victims[1], poisoned) == ""  # fmt: skip
        untouched = admin.get_cluster_custom_object(GROUP, VERSION, "hardwareprofiles", victims[0])
        assert not (untouched.get("status") or {}).get("measuredAt")
    finally:
        for name in victims:
            try:
                admin.delete_cluster_custom_object(GROUP, VERSION, "hardwareprofiles", name)
            except client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise


# --- platform settings: OpenShift-style security contexts, accounts the chart does not create, pull secrets ------

# What an OpenShift install sets (restricted-v2 assigns UID and fsGroup), plus the other platform settings.
PLATFORM = [
    *(arg for part in ("operator.podSecurityContext", "workloads.podSecurityContext")
      for key in ("runAsUser", "runAsGroup", "fsGroup") for arg in ("--set", f"{part}.{key}=null")),
    "--set", "agent.serviceAccount.create=false", "--set", "agent.serviceAccount.name=team-agent",
    "--set", "serving.serviceAccount.create=false", "--set", "serving.serviceAccount.name=team-serving",
    "--set", "serving.resources.limits.cpu=null", "--set", "serving.resources.requests.cpu=500m",
]  # fmt: skip


def test_platform_settings_render_objects_and_pods_that_restricted_pod_security_admits(
    control_plane: Any, namespace: str, helm: str, monitoring_crds: None, tmp_path: Path, monkeypatch: Any
) -> None:
    """The API server stores everything the chart renders with the platform's settings, and Pod Security
    Admission's "restricted" level (the hardening OpenShift's restricted-v2 also demands) admits the operator's
    pod and the Job and serving pods the operator builds from the chart's METAINFER_* variables, none of which pins
    a UID. A pod without the hardening is refused there: the check can fail."""
    from metainfer.core.control.hardware import group_nodes
    from metainfer.core.control.manifests import build_deployment, build_job, build_run
    from metainfer.core.engine.recipe import Recipe
    from metainfer.operator.config import OperatorConfig

    control_plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    release = f"r{secrets.token_hex(3)}"
    manifest = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *RELEASE_OBJECTS,
                        "--set", f"workloadNamespaces={{{namespace}}}", *ALL_ON, *PLATFORM)  # fmt: skip
    objects = [d for d in yaml.safe_load_all(manifest) if d]
    accounts = [d["metadata"]["name"] for d in objects if d["kind"] == "ServiceAccount"]
    assert len(accounts) == 1 and accounts[0].endswith("-operator"), "agent and serving accounts are the platform's"
    (path := tmp_path / "chart.yaml").write_text(yaml.safe_dump_all(objects))
    control_plane.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=helm-test", "-f", str(path))

    (operator,) = [d for d in objects if d["kind"] == "Deployment"]
    env = {e["name"]: e["value"] for e in operator["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    for name in [n for n in os.environ if n.startswith("METAINFER_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("METAINFER_"):
            monkeypatch.setenv(name, value)
    config = OperatorConfig()
    labels = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}
    group = next(iter(group_nodes([("node", labels)]).values()))
    policy = make_policy(namespace, "digits", Path("/models/digits.onnx"), "a" * 64)
    policy["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    run = build_run(policy, group, "NewHardwareClass")
    run["metadata"]["uid"] = "00000000-0000-0000-0000-000000000002"
    run["status"] = {
        "phase": "Succeeded",
        "bestRecipe": Recipe().model_dump(mode="json"),
        "bestRecipeKey": Recipe().key(),
    }
    job = build_job(run, group, config.job_settings())
    serving_deployment = build_deployment(policy, group, run, config.serving_defaults())

    def pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}

    pods = [pod("operator", operator["spec"]["template"]["spec"]), pod("job", job["spec"]["template"]["spec"]),
            pod("serving", serving_deployment["spec"]["template"]["spec"])]  # fmt: skip
    # A pod's account must exist even in a dry run; the platform brings the ones the chart was told not to create.
    for account in {p["spec"]["serviceAccountName"] for p in pods}:
        control_plane.kubectl("create", "serviceaccount", account, "-n", namespace)
    for doc in pods:
        assert "runAsUser" not in yaml.safe_dump(doc) and "fsGroup" not in yaml.safe_dump(doc), doc["metadata"]["name"]
    (path := tmp_path / "pods.yaml").write_text(yaml.safe_dump_all([job, serving_deployment, *pods]))
    control_plane.kubectl("create", "--dry-run=server", "-f", str(path))

    loose = pod("loose", {**job["spec"]["template"]["spec"], "securityContext": {}})
    loose["spec"]["containers"] = [{**c, "securityContext": {}} for c in loose["spec"]["containers"]]
    refused = control_plane.kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(loose), check=False)
    assert refused.returncode != 0 and "PodSecurity" in refused.stderr, refused.stderr


def test_the_platform_allow_lists_hold_under_the_charts_operator_account(
    control_plane: Any, namespace: str, nodes: Nodes, installed: dict, digits_file: tuple[Path, str], tmp_path: Path
) -> None:
    """A policy asking for a node directory and a foreign image gets a refusal naming both fields and nothing
    else, with the operator acting under the chart's own ServiceAccount (chart defaults: nothing allowed)."""
    api = control_plane.api_client
    nodes.add(("AVX2",))
    body = make_policy(namespace, "digits", *digits_file, serving={"image": "attacker.example/miner:latest"})
    body["spec"]["model"]["volume"] = {"hostPath": "/", "mountPath": "/models"}
    apply_policy(api, body)
    with operator_process(installed["operator"], namespace, tmp_path) as op:
        ready = wait_for("the refusal", lambda: next(
            (c for c in (get_policy(api, namespace, "digits").get("status") or {}).get("conditions", [])
             if c["type"] == "Ready" and c["reason"] == "ForbiddenByPlatform"), None), timeout=60)  # fmt: skip
        assert "spec.model.volume.hostPath" in ready["message"] and "spec.serving.image" in ready["message"]
        time.sleep(2)
        assert runs(api, namespace) == [] and jobs(api, namespace) == [] and serving(api, namespace) == []
        assert " 403 " not in op.output() and "Traceback" not in op.output()  # RBAC refused nothing


def test_namespace_editors_manage_policies_and_viewers_read_them(
    control_plane: Any, namespace: str, installed: dict, tmp_path: Path
) -> None:
    """The chart's user roles fold into Kubernetes' default ones (the clusterrole-aggregation controller runs):
    `edit` in a namespace manages its AdaptationPolicies and reads runs, `view` reads; neither writes a run."""
    core, rbac = client.CoreV1Api(control_plane.api_client), client.RbacAuthorizationV1Api(control_plane.api_client)
    people = {}
    for person, role in (("alice", "edit"), ("bob", "view")):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": person}})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": f"{person}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": person, "namespace": namespace}],
        })  # fmt: skip
        people[person] = sa_kubeconfig(control_plane, namespace, person, tmp_path / f"{person}.kubeconfig")
    alice, bob = people["alice"], people["bob"]
    deadline = time.monotonic() + 30
    while not can_i(control_plane, alice, "create", "adaptationpolicies.metainfer.io", "-n", namespace):
        assert time.monotonic() < deadline, "edit never gained adaptationpolicies: the roles were not aggregated"
        time.sleep(0.5)
    for verb in ("update", "patch", "delete", "list", "watch"):
        assert can_i(control_plane, alice, verb, "adaptationpolicies.metainfer.io", "-n", namespace), verb
    assert can_i(control_plane, alice, "get", "adaptationruns.metainfer.io", "-n", namespace)
    assert can_i(control_plane, bob, "list", "adaptationpolicies.metainfer.io", "-n", namespace)
    assert can_i(control_plane, bob, "get", "adaptationruns.metainfer.io", "-n", namespace)
    for person in (alice, bob):
        for denied in [("create", "adaptationruns.metainfer.io"), ("patch", "adaptationruns.metainfer.io"),
                       ("patch", "adaptationpolicies.metainfer.io", "--subresource=status")]:  # fmt: skip
            assert not can_i(control_plane, person, *denied, "-n", namespace), f"{person} may {denied}"
    assert not can_i(control_plane, bob, "create", "adaptationpolicies.metainfer.io", "-n", namespace)
    assert not can_i(control_plane, alice, "create", "adaptationpolicies.metainfer.io", "-n", "default")


def test_the_helm_test_check_runs_under_its_own_account_and_says_what_is_not_ready(
    control_plane: Any, namespace: str, helm: str, tmp_path: Path
) -> None:
    """`helm test`'s pod runs `metainfer check-install` under the hook's ServiceAccount. No kubelet runs here, so
    the pod itself is not started: its command runs as a process with a token of that account. The operator
    Deployment has no pod, so the check must fail on it and say so, while the dry-run policy is admitted (and not
    stored); a namespace the account has no Role in is refused, and said so."""
    release = f"r{secrets.token_hex(3)}"
    manifest = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, "--set", "crds.enabled=false",
                        "--set", f"workloadNamespaces={{{namespace}}}")  # fmt: skip
    objects = [d for d in yaml.safe_load_all(manifest) if d]
    hooks = [d for d in objects if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    (pod,) = [d for d in hooks if d["kind"] == "Pod"]
    (operator,) = [d for d in objects if d["kind"] == "Deployment"]
    scene = [d for d in hooks if d["kind"] != "Pod"] + [operator]
    path = tmp_path / "scene.yaml"
    path.write_text(yaml.safe_dump_all(scene))
    control_plane.kubectl("apply", "--server-side", "--field-manager=helm-test", "-f", str(path))
    account = pod["spec"]["serviceAccountName"]
    kubeconfig = sa_kubeconfig(control_plane, namespace, account, tmp_path / "check.kubeconfig")
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["metainfer"]

    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "metainfer.agent.cli",
            *container["args"],
            *extra,
            "--kubeconfig",
            str(kubeconfig),
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    first = check()
    assert first.returncode == 1, first.stdout + first.stderr
    assert f"FAIL: operator Deployment {namespace}/{operator['metadata']['name']}:" in first.stdout
    assert f"ok: a dry-run AdaptationPolicy in {namespace}: admitted" in first.stdout, first.stdout
    stored = client.CustomObjectsApi(control_plane.api_client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "adaptationpolicies"
    )
    assert stored["items"] == []
    elsewhere = check("--policy-namespace", "default")
    assert "FAIL: a dry-run AdaptationPolicy in default: refused: HTTP 403" in elsewhere.stdout, elsewhere.stdout


def test_a_policy_names_only_credentials_its_author_may_read(
    control_plane: Any, namespace: str, installed: dict, tmp_path: Path
) -> None:
    """The chart's admission policy asks the authorizer whether the writer of a policy may get the Secret its
    spec.model.credentials names: carol, who may write policies but not read that Secret, is refused (and learns
    nothing of it but its name, which she gave); given `get` on it, she is admitted; edits that keep the name are
    not asked again."""
    core, rbac = client.CoreV1Api(control_plane.api_client), client.RbacAuthorizationV1Api(control_plane.api_client)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "store-keys"}, "stringData": {"HF_TOKEN": "t"}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "carol"}})
    rules = [{"apiGroups": [GROUP], "resources": ["adaptationpolicies"], "verbs": ["create", "get", "update", "patch"]}]
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "policy-writer"}, "rules": rules})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "carol-policy-writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "policy-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "carol", "namespace": namespace}],
    })  # fmt: skip
    carol = sa_kubeconfig(control_plane, namespace, "carol", tmp_path / "carol.kubeconfig")
    policy = make_policy(namespace, "from-bucket", Path("/models/m.onnx"), "a" * 64)
    policy["spec"]["model"] = {"uri": "hf://org/repo/m.onnx", "sha256": "a" * 64,
                               "credentials": {"secretName": "store-keys"}}  # fmt: skip
    manifest = tmp_path / "policy.yaml"
    manifest.write_text(yaml.safe_dump(policy))

    def create_as_carol() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(control_plane.kubectl_path), "--kubeconfig", str(carol), "create", "-f",
                               str(manifest)], capture_output=True, text=True, timeout=30, check=False)  # fmt: skip

    deadline = time.monotonic() + 30
    while (refused := create_as_carol()).returncode == 0 or "may not get the Secret" not in refused.stderr:
        if refused.returncode == 0:  # admitted before the policy took effect: undo and retry
            control_plane.kubectl("delete", "adaptationpolicy", "from-bucket", "-n", namespace, check=False)
        assert time.monotonic() < deadline, f"never refused: {refused.stdout} {refused.stderr}"
        time.sleep(0.5)
    assert "spec.model.credentials.secretName" in refused.stderr and "store-keys" in refused.stderr

    rbac.create_namespaced_role(namespace, {"metadata": {"name": "store-keys-reader"}, "rules": [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["store-keys"], "verbs": ["get"]}]})  # fmt: skip
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "carol-store-keys"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "store-keys-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "carol", "namespace": namespace}],
    })  # fmt: skip
    deadline = time.monotonic() + 30
    while (admitted := create_as_carol()).returncode != 0:
        assert time.monotonic() < deadline, f"never admitted: {admitted.stderr}"
        time.sleep(0.5)
    # The binding goes: an edit that keeps the name (what the operator's finalizer patch is) is still admitted.
    rbac.delete_namespaced_role_binding("carol-store-keys", namespace)
    time.sleep(1)
    patched = control_plane.kubectl("patch", "adaptationpolicy", "from-bucket", "-n", namespace, "--type=merge",
                                    "-p", '{"spec":{"slo":{"latencyP95Ms": 500}}}', "--as", f"system:serviceaccount:"
                                    f"{namespace}:carol", check=False)  # fmt: skip
    assert patched.returncode == 0, patched.stderr
