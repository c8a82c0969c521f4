"""The Helm chart rendered by a real helm, without a cluster: CRDs in sync, values schema, RBAC without wildcards,
real metric names.

An integration test because rendering runs the pinned helm from hack/helm.py (built once with Go and cached,
like the control plane; ``make test-integration`` builds it through ``make assets``).
PromQL is checked twice: every ``metainfer_*`` name must be a metric the code
defines (found by reading the prometheus_client constructors in core/, agent/
and operator/), and every expression must parse (promtool, when installed).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.controlplane.errors import AssetError
from hack.helm import HELM_VERSION, all_optional_on, provide
from metainfer.core.control.settings import SHUTDOWN_DELAY_MAX_ENV

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "metainfer"
DASHBOARD = CHART / "dashboards" / "metainfer-slo.json"

# Every optional feature on, and every value that changes what is rendered set.
ALL_ON = [
    *all_optional_on(),
    "--set", "workloadNamespaces={ml-a,ml-b}",
    "--set", "operator.watchNamespaces={ml-a,ml-b}",
]  # fmt: skip
# OpenShift's restricted-v2 SCC assigns UID and fsGroup from the namespace's range: nothing may pin them.
OPENSHIFT = [
    arg
    for part in ("operator.podSecurityContext", "workloads.podSecurityContext")
    for key in ("runAsUser", "runAsGroup", "fsGroup")
    for arg in ("--set", f"{part}.{key}=null")
]
PINNED_IDS = {"runAsUser", "runAsGroup", "fsGroup"}
# Prometheus's own series that alerts may use besides the project's metrics.
PROMETHEUS_BUILTIN = {"up"}
METRIC_CLASSES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


@cache
def helm() -> str:
    try:
        return str(provide(lambda message: print(f"[helm] {message}", file=sys.stderr)))
    except AssetError as exc:  # no Go and no cached helm
        pytest.fail(f"cannot provide helm {HELM_VERSION}: {exc}", pytrace=False)


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


@cache
def rendered(all_on: bool) -> tuple[dict[str, Any], ...]:
    args = [
        "template",
        "mi",
        str(CHART),
        "--namespace",
        "metainfer-system",
        "--skip-tests",
        *(ALL_ON if all_on else []),
    ]
    return tuple(d for d in yaml.safe_load_all(run_helm(*args).stdout) if d)


def docs_of(kind: str, all_on: bool = True) -> list[dict[str, Any]]:
    return [d for d in rendered(all_on) if d["kind"] == kind]


def template(*args: str) -> list[dict[str, Any]]:
    """The release's objects (`helm test`'s hooks aside: test_the_helm_test_hook_* look at those)."""
    result = run_helm("template", "mi", str(CHART), "--namespace", "metainfer-system", "--skip-tests", *args)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def operator_env(docs: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> dict[str, str]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}


def operator_config(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The OperatorConfig the chart's operator would read: its METAINFER_* variables and nothing else."""
    from metainfer.operator.config import OperatorConfig

    for name in [n for n in os.environ if n.startswith("METAINFER_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("METAINFER_"):
            monkeypatch.setenv(name, value)
    return OperatorConfig()


def workload_templates(config: Any) -> dict[str, dict[str, Any]]:
    """The pod templates (labels and spec) of the adaptation Job and the serving Deployment the operator builds
    with ``config``."""
    from metainfer.core.control.hardware import group_nodes
    from metainfer.core.control.manifests import build_deployment, build_job, build_run
    from metainfer.core.engine.recipe import Recipe

    labels = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}
    group = next(iter(group_nodes([("node", labels)]).values()))
    policy = {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": "digits", "namespace": "ml-a", "uid": "uid-policy", "generation": 1},
        "spec": {"model": {"uri": "https://models.example/d.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 5}},
    }
    run = build_run(policy, group, "NewHardwareClass")
    run["metadata"]["uid"] = "uid-run"
    run["status"] = {
        "phase": "Succeeded",
        "bestRecipe": Recipe().model_dump(mode="json"),
        "bestRecipeKey": Recipe().key(),
    }
    job = build_job(run, group, config.job_settings())
    deployment = build_deployment(policy, group, run, config.serving_defaults())
    return {"job": job["spec"]["template"], "serving": deployment["spec"]["template"]}


def workload_pods(config: Any) -> dict[str, dict[str, Any]]:
    """The pod specs of the adaptation Job and the serving Deployment the operator builds with ``config``."""
    return {role: template["spec"] for role, template in workload_templates(config).items()}


def keys_in(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | set().union(*(keys_in(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(keys_in(v) for v in obj))
    return set()


# --- CRDs --------------------------------------------------------------------------------------------------------


def test_chart_crds_are_byte_identical_to_crds_dir() -> None:
    source = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "files" / "crds").glob("*.yaml")}
    assert source, "crds/ is empty"
    stale = sorted(n for n in source.keys() | chart.keys() if source.get(n) != chart.get(n))
    assert not stale, f"charts/metainfer/files/crds differs from crds/ in {stale}: run `make crds`"


def _crd_files() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for p in (REPO / "crds").glob("*.yaml") for d in yaml.safe_load_all(p.read_text())}


@pytest.mark.parametrize("keep", [True, False], ids=["keep", "no-keep"])
def test_the_release_installs_the_crds_as_generated_with_the_keep_annotation_when_asked(keep: bool) -> None:
    docs = template("--set", f"crds.keep={str(keep).lower()}")
    rendered_crds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "CustomResourceDefinition"}
    expected = _crd_files()
    assert rendered_crds.keys() == expected.keys()
    for name, crd in rendered_crds.items():
        annotations = crd["metadata"].pop("annotations", {})
        kept = {"helm.sh/resource-policy": "keep", "argocd.argoproj.io/sync-options": "Delete=false"}
        assert annotations == (kept if keep else {}), name
        assert crd == expected[name], f"{name} is not the CRD of crds/ once rendered"


def test_crds_disabled_renders_none_and_helm_crds_folder_is_not_used() -> None:
    assert not [d for d in template("--set", "crds.enabled=false") if d["kind"] == "CustomResourceDefinition"]
    # Helm's crds/ folder is installed once and never upgraded: the chart must not carry one.
    assert not (CHART / "crds").exists()


# --- values and schema ---------------------------------------------------------------------------------------------


def test_values_schema_is_a_valid_json_schema_and_accepts_the_defaults() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed; helm's own checks below still run")
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(values)


def test_values_schema_covers_every_default_value() -> None:
    """additionalProperties is false everywhere, so each key in values.yaml must be described (no silent typos)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:  # local references only: "#/definitions/<name>"
            node = schema["definitions"][node["$ref"].removeprefix("#/definitions/")]
        return node

    def walk(value: Any, node: dict[str, Any], where: str) -> None:
        node = resolve(node)
        if node.get("type") != "object" or not isinstance(value, dict) or "properties" not in node:
            return
        assert node.get("additionalProperties") is False, f"{where or 'values'}: schema must forbid unknown keys"
        for key, sub in value.items():
            assert key in node["properties"], f"{where}.{key} is in values.yaml but not in values.schema.json"
            walk(sub, node["properties"][key], f"{where}.{key}" if where else key)

    walk(values, schema, "")


def test_helm_enforces_the_schema() -> None:
    run_helm("lint", "--strict", str(CHART))  # defaults validate
    for bad, why in [
        (["--set", "operator.maxConcurrentRuns=0"], "maxConcurrentRuns"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "operator.maxConcurentRuns=3"], "maxConcurentRuns"),  # a typo is an error, not ignored
        (["--set", "prometheusRule.sloBreach.window=five"], "window"),
        (["--set-json", 'prometheusRule.sloBreach.policies=[{"namespace":"a"}]'], "policies"),
        (["--set", "operator.podSecurityContext.runAsUsr=1"], "runAsUsr"),
        (["--set", "workloads.podSecurityContext.runAsUser=-1"], "runAsUser"),
        (["--set", "workloads.securityContext.capabilities.drop=ALL"], "drop"),
        (["--set", "agent.resources.requests.cpu=lots"], "cpu"),
        (["--set-json", "serving.resources.limits.cpu=1.5"], "cpu"),  # a float: the operator reads strings or integers
        (["--set", "agent.serviceAccount.name=Agent_SA"], "name"),
        (["--set-json", 'workloads.imagePullSecrets=[{"nam":"regcred"}]'], "nam"),
        (["--set", "metrics.serviceMonitor.scrapeTimeout=ten"], "scrapeTimeout"),
        (["--set-json", 'metrics.podMonitor.relabelings=[{"action":"explode"}]'], "action"),
        (["--set", "prometheusRule.namespace=Monitoring"], "namespace"),
        (["--set", "serving.shutdownDelaySeconds=-1"], "shutdownDelaySeconds"),
        (["--set", "serving.drainTimeoutSeconds=0"], "drainTimeoutSeconds"),
    ]:
        result = run_helm("template", "mi", str(CHART), *bad, check=False)
        assert result.returncode != 0, f"schema accepted {bad}"
        assert why in result.stderr, result.stderr


# --- rendering ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("all_on", [False, True], ids=["defaults", "all-optional-on"])
def test_renders_and_lints(all_on: bool) -> None:
    lint = run_helm("lint", "--strict", str(CHART), *(ALL_ON if all_on else []))
    assert "0 chart(s) failed" in lint.stdout
    kinds = {d["kind"] for d in rendered(all_on)}
    optional = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert kinds & optional == (optional if all_on else set()), "optional features are off by default, on with --set"


def test_operator_deployment_is_hardened_and_configured() -> None:
    (dep,) = docs_of("Deployment")
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"
    health = next(p for p in container["ports"] if p["name"] == "health")
    assert health["containerPort"] == 8080 and "http://0.0.0.0:8080/healthz" in container["args"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["METAINFER_PROMETHEUS_URL"] == "http://prometheus.monitoring:9090"
    assert env["METAINFER_AGENT_SERVICE_ACCOUNT"] == "metainfer-agent"
    assert env["METAINFER_METRICS_PORT"] == "8000"
    mapping_path = Path(env["METAINFER_LABEL_MAPPING_FILE"])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "label-mapping")
    assert mapping_path.parent == Path(mount["mountPath"])
    (cm,) = [d for d in docs_of("ConfigMap") if d["metadata"]["name"].endswith("label-mapping")]
    assert yaml.safe_load(cm["data"][mapping_path.name]) == {"cpuFeatures": ["AVX2", "AVX512VNNI"]}
    assert container["args"].count("--namespace") == 2


def test_config_env_names_match_operator_config() -> None:
    """Every METAINFER_* the chart sets is a field of OperatorConfig (a renamed field would be silently ignored)."""
    from metainfer.operator.config import OperatorConfig

    known = {f"METAINFER_{name.upper()}" for name in OperatorConfig.model_fields}
    for all_on in (False, True):
        (dep,) = docs_of("Deployment", all_on)
        names = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert {n for n in names if n.startswith("METAINFER_")} <= known


def test_defaults_need_no_label_mapping_and_watch_all_namespaces() -> None:
    (dep,) = docs_of("Deployment", all_on=False)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "METAINFER_LABEL_MAPPING_FILE" not in {e["name"] for e in container["env"]}
    assert "--namespace" not in container["args"]
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs_of("ServiceAccount", False)}
    assert {("metainfer-system", "metainfer-agent"), ("metainfer-system", "metainfer-serving")} <= accounts


def test_service_accounts_per_workload_namespace() -> None:
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs_of("ServiceAccount")}
    for ns in ("ml-a", "ml-b"):
        assert (ns, "metainfer-agent") in accounts
        assert accounts[(ns, "metainfer-serving")]["automountServiceAccountToken"] is False
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs_of("Role")}
    assert roles == {(ns, f"mi-metainfer-{who}") for ns in ("ml-a", "ml-b") for who in ("agent", "operator")}


def _rules(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v) for rule in doc["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }


def _operator(kind: str, all_on: bool) -> list[dict[str, Any]]:
    return [d for d in docs_of(kind, all_on) if d["metadata"]["name"].endswith("-operator")]


def test_operator_writes_workloads_only_in_the_namespaces_it_watches() -> None:
    """Watching all namespaces the ClusterRole holds every rule; with watchNamespaces, what creates Jobs,
    Deployments, Services and runs is a Role in each watched namespace, and the ClusterRole keeps only the
    cluster-scoped reads (nodes, CRDs, namespaces), the peering object and the policies (whose finalizer must come
    off while their namespace is deleted, after its RoleBindings are gone)."""
    (everywhere,) = _operator("ClusterRole", all_on=False)
    assert not _operator("Role", all_on=False)
    (cluster,) = _operator("ClusterRole", all_on=True)
    roles = _operator("Role", all_on=True)
    assert {r["metadata"]["namespace"] for r in roles} == {"ml-a", "ml-b"}
    namespaced = {
        ("batch", "jobs", "create"),
        ("apps", "deployments", "create"),
        ("apps", "deployments", "get"),  # api_calls.apply reads a serving Deployment, then replaces it
        ("apps", "deployments", "update"),
        ("", "services", "create"),
        ("", "services", "watch"),  # one that exists is not created again on every reconcile
        ("policy", "poddisruptionbudgets", "create"),
        ("metainfer.io", "adaptationruns", "create"),
        ("metainfer.io", "adaptationpolicies/status", "patch"),
    }
    assert namespaced <= _rules(everywhere)
    assert not namespaced & _rules(cluster)
    assert all(_rules(role) == _rules(everywhere) - _rules(cluster) for role in roles)
    assert {g for g, _, _ in _rules(cluster)} == {"", "kopf.dev", "apiextensions.k8s.io", "metainfer.io"}
    assert {(r, v) for g, r, v in _rules(cluster) if g == "metainfer.io"} == {
        ("adaptationpolicies", v) for v in ("get", "list", "watch", "patch")
    }
    assert {r for g, r, _ in _rules(cluster) if g == ""} == {"nodes", "namespaces"}
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in _operator("RoleBinding", all_on=True)}
    assert bindings == {("ml-a", "mi-metainfer-operator"), ("ml-b", "mi-metainfer-operator")}


@pytest.mark.parametrize("all_on", [False, True], ids=["defaults", "all-optional-on"])
def test_no_wildcards_in_rbac(all_on: bool) -> None:
    roles = [d for d in rendered(all_on) if d["kind"] in ("ClusterRole", "Role")]
    # The operator's, the agent's, and the two user roles folded into edit/admin and view.
    assert len([r for r in roles if r["kind"] == "ClusterRole"]) == 4
    for role in roles:
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(field, []), f"{role['kind']} {role['metadata']['name']}: {rule}"
            assert not rule.get("nonResourceURLs"), rule
            for verb in ("escalate", "bind", "impersonate"):
                assert verb not in rule["verbs"]


def test_agent_rbac_is_exactly_its_run_its_status_configmaps_and_profiles() -> None:
    def rules(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
        return {
            (g, r, v)
            for rule in doc["rules"]
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    (cluster_role,) = [d for d in docs_of("ClusterRole") if d["metadata"]["name"].endswith("-agent")]
    assert rules(cluster_role) == {
        ("metainfer.io", "hardwareprofiles", "get"),
        ("metainfer.io", "hardwareprofiles", "create"),
        ("metainfer.io", "hardwareprofiles/status", "patch"),
    }
    for role in [d for d in docs_of("Role") if d["metadata"]["name"].endswith("-agent")]:
        assert rules(role) == {
            ("metainfer.io", "adaptationruns", "get"),
            ("metainfer.io", "adaptationruns/status", "patch"),
            ("", "configmaps", "get"),
        }


def test_pod_monitor_selects_the_operators_serving_pods() -> None:
    from metainfer.core.api.names import COMPONENT, MANAGED_BY
    from metainfer.core.control.manifests import HTTP_PORT

    (pm,) = docs_of("PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {MANAGED_BY: "metainfer", COMPONENT: "serving"}
    assert pm["spec"]["namespaceSelector"]["matchNames"] == ["ml-a", "ml-b"]
    assert HTTP_PORT == 8080 and pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"


# --- what a platform team sets: security contexts, accounts, pull secrets, resources, monitors ----------------------


def test_chart_defaults_are_the_operators_own_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chart-installed operator builds the same pods as one started with no configuration at all (but for the
    images, which the chart names from its repository and appVersion: the CPU image and each vendor's flavour)."""
    from metainfer.core.control.settings import DEFAULT_JOB_RESOURCES

    charted = operator_config(operator_env(rendered(False)), monkeypatch)
    bare = operator_config({}, monkeypatch)
    for settings in ("job_settings", "serving_defaults"):
        mine, theirs = getattr(charted, settings)(), getattr(bare, settings)()
        images = {"image", "vendor_images"}
        assert mine.model_dump(exclude=images) == theirs.model_dump(exclude=images), settings
    assert charted.job_resources == DEFAULT_JOB_RESOURCES


def test_operator_pod_security_contexts_are_values_hardened_by_default() -> None:
    (dep,) = docs_of("Deployment", all_on=False)
    pod = dep["spec"]["template"]["spec"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["operator"]
    assert pod["securityContext"] == values["podSecurityContext"]
    assert pod["containers"][0]["securityContext"] == values["securityContext"]
    changed = template("--set", "operator.securityContext.readOnlyRootFilesystem=false",
                       "--set-json", 'operator.podSecurityContext.supplementalGroups=[1000]')  # fmt: skip
    (dep,) = [d for d in changed if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"] == [1000]
    assert dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


def test_openshift_values_pin_no_uid_in_the_operator_or_the_pods_it_creates(monkeypatch: pytest.MonkeyPatch) -> None:
    """restricted-v2 refuses a pod whose runAsUser or fsGroup is outside the namespace's range, so nothing the chart
    renders or the operator builds may pin one; everything else stays hardened (restricted-v2 requires it too)."""
    docs = template(*OPENSHIFT)
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert not PINNED_IDS & keys_in(pod)
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"]
    pods = workload_pods(operator_config(operator_env(docs), monkeypatch))
    for kind, spec in pods.items():
        assert not PINNED_IDS & keys_in(spec), f"{kind} pins a UID or GID"
        assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        container = spec["containers"][0]["securityContext"]
        assert container["allowPrivilegeEscalation"] is False and container["capabilities"] == {"drop": ["ALL"]}
    # The defaults do pin them (the image's nonroot user), in the operator and in its pods alike.
    defaults = workload_pods(operator_config(operator_env(rendered(False)), monkeypatch))
    assert all(spec["securityContext"]["runAsUser"] == 65532 for spec in defaults.values())


def test_image_pull_secrets_for_the_operator_and_the_pods_it_creates(monkeypatch: pytest.MonkeyPatch) -> None:
    (dep,) = docs_of("Deployment")
    assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    pods = workload_pods(operator_config(operator_env(rendered(True)), monkeypatch))
    assert all(spec["imagePullSecrets"] == [{"name": "regcred"}] for spec in pods.values())
    (default,) = docs_of("Deployment", all_on=False)
    assert "imagePullSecrets" not in default["spec"]["template"]["spec"]
    pods = workload_pods(operator_config(operator_env(rendered(False)), monkeypatch))
    assert not any("imagePullSecrets" in spec for spec in pods.values())


def test_jobs_get_guaranteed_qos_and_serving_its_resources_from_values(monkeypatch: pytest.MonkeyPatch) -> None:
    pods = workload_pods(operator_config(operator_env(rendered(False)), monkeypatch))
    job = pods["job"]["containers"][0]["resources"]
    assert job["requests"] == job["limits"] and {"cpu", "memory"} <= job["requests"].keys(), "Guaranteed QoS"
    docs = template("--set", "agent.resources.requests.cpu=4", "--set", "agent.resources.limits.cpu=4",
                    "--set", "serving.resources.requests.memory=3Gi", "--set", "serving.resources.limits.memory=3Gi",
                    "--set", "serving.resources.limits.cpu=null",
                    "--set", "serving.resources.requests.cpu=500m")  # fmt: skip
    pods = workload_pods(operator_config(operator_env(docs), monkeypatch))
    assert pods["job"]["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "4Gi"}
    assert pods["serving"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "3Gi"},
        "limits": {"memory": "3Gi"},
    }


def test_serving_pods_shutdown_delay_and_drain_come_from_values(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = template(
        "--set-json", "serving.shutdownDelaySeconds=2.5",
        "--set", "serving.shutdownDelayMaxSeconds=12",
        "--set", "serving.drainTimeoutSeconds=60",
    )  # fmt: skip
    serving = workload_pods(operator_config(operator_env(docs), monkeypatch))["serving"]
    args = serving["containers"][0]["args"]
    assert args[args.index("--shutdown-delay") + 1] == "2.5" and args[args.index("--drain-timeout") + 1] == "60"
    assert {e["name"]: e["value"] for e in serving["containers"][0]["env"]}[SHUTDOWN_DELAY_MAX_ENV] == "12"
    assert serving["terminationGracePeriodSeconds"] == 77  # ceil(max(2.5, 12) + 60) + the margin of 5


def test_the_charts_placement_values_reach_job_and_serving_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    zone = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    affinity = json.dumps({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}})
    docs = template(
        "--set", "workloads.nodeSelector.pool=inference",
        "--set-json", f"workloads.affinity={affinity}",
        "--set-json", 'workloads.tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]',
        "--set", "workloads.priorityClassName=serving-high",
        "--set", "workloads.runtimeClassName=nvidia",
    )  # fmt: skip
    for pod in workload_pods(operator_config(operator_env(docs), monkeypatch)).values():
        assert pod["nodeSelector"]["pool"] == "inference" and pod["priorityClassName"] == "serving-high"
        assert pod["runtimeClassName"] == "nvidia" and {"key": "nvidia.com/gpu", "operator": "Exists",
                                                         "effect": "NoSchedule"} in pod["tolerations"]  # fmt: skip
        required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert required["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "zone"


def test_the_charts_policy_allow_lists_reach_the_operators_platform_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    default = operator_config(operator_env(rendered(False)), monkeypatch).platform_limits()
    bare = operator_config({}, monkeypatch).platform_limits()
    assert replace(default, default_image="") == replace(bare, default_image=""), "the chart's image is its own"
    assert default.allowed_toleration_keys == ["*"] and not default.allowed_priority_classes
    docs = template(
        "--set-json", 'policies.allowedPriorityClasses=["serving-high"]',
        "--set-json", 'policies.allowedRuntimeClasses=["nvidia", "kata"]',
        "--set-json", 'policies.allowedTolerationKeys=["nvidia.com/gpu"]',
    )  # fmt: skip
    limits = operator_config(operator_env(docs), monkeypatch).platform_limits()
    assert limits.allowed_priority_classes == ["serving-high"]
    assert limits.allowed_runtime_classes == ["nvidia", "kata"] and limits.allowed_toleration_keys == ["nvidia.com/gpu"]


@pytest.mark.parametrize(
    ("args", "variable", "why"),
    [
        (["--set", "agent.resources.requests.cpu=8"], "METAINFER_JOB_RESOURCES", "requests.cpu must not exceed"),
        (["--set", "serving.resources.requests.memory=3Gi"], "METAINFER_SERVING_RESOURCES", "requests.memory"),
        (["--set", "workloads.podSecurityContext.runAsUser=0"], "METAINFER_WORKLOAD_POD_SECURITY_CONTEXT", "never"),
    ],
)
def test_values_the_schema_cannot_judge_stop_the_operator_naming_the_variable(
    args: list[str], variable: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metainfer.operator.config import ConfigError

    with pytest.raises(ConfigError, match=f"{variable}.*{why}"):
        operator_config(operator_env(template(*args)), monkeypatch)


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("METAINFER_WORKLOAD_CONTAINER_SECURITY_CONTEXT", "{readOnlyRootFilesystem: true}", "not valid JSON"),
        ("METAINFER_WORKLOAD_POD_SECURITY_CONTEXT", '{"fsGroupp": 1}', "fsGroupp"),
        ("METAINFER_WORKLOAD_IMAGE_PULL_SECRETS", '["regcred"]', "0"),
        ("METAINFER_JOB_RESOURCES", '{"requests": {"cpu": "lots"}}', "quantity"),
    ],
)
def test_bad_workload_settings_name_the_variable(
    variable: str, value: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from metainfer.operator.config import ConfigError

    with pytest.raises(ConfigError, match=f"^invalid operator configuration: {variable}.*{why}"):
        operator_config({variable: value}, monkeypatch)


def test_service_accounts_the_chart_does_not_create_are_still_the_ones_used(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = template("--set", "workloadNamespaces={ml-a,ml-b}",
                    "--set", "operator.serviceAccount.create=false", "--set", "operator.serviceAccount.name=ops",
                    "--set", "agent.serviceAccount.create=false", "--set", "agent.serviceAccount.name=team-agent",
                    "--set", "serving.serviceAccount.create=false",
                    "--set", "serving.serviceAccount.name=team-serving")  # fmt: skip
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    subjects = {(b["metadata"]["name"].rsplit("-", 1)[-1], s["name"]) for b in bindings for s in b["subjects"]}
    assert subjects == {("operator", "ops"), ("agent", "team-agent")}
    agents = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
              and d["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"]  # fmt: skip
    assert len(agents) == 2
    for vap in agents:
        assert vap["spec"]["matchConditions"][0]["expression"].endswith("':team-agent')")
    pods = workload_pods(operator_config(operator_env(docs), monkeypatch))
    assert pods["job"]["serviceAccountName"] == "team-agent" and pods["serving"]["serviceAccountName"] == "team-serving"
    # Created: in each workload namespace, with their annotations (e.g. a cloud workload identity).
    docs = template("--set", "workloadNamespaces={ml-a,ml-b}",
                    "--set", "agent.serviceAccount.annotations.iam\\.example/role=models-reader")  # fmt: skip
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "ServiceAccount"}
    assert accounts.keys() == {("metainfer-system", "mi-metainfer-operator")} | {
        (ns, name) for ns in ("ml-a", "ml-b") for name in ("metainfer-agent", "metainfer-serving")
    }
    assert accounts[("ml-b", "metainfer-agent")]["metadata"]["annotations"] == {"iam.example/role": "models-reader"}
    missing = run_helm("template", "mi", str(CHART), "--set", "operator.serviceAccount.create=false", check=False)
    assert missing.returncode != 0 and "operator.serviceAccount.name must name" in missing.stderr


def test_monitors_and_rule_take_namespace_labels_interval_and_relabelings() -> None:
    (sm,), (pm,), (rule,) = docs_of("ServiceMonitor"), docs_of("PodMonitor"), docs_of("PrometheusRule")
    for doc in (sm, pm, rule):
        assert doc["metadata"]["namespace"] == "metainfer-system", "the release namespace by default"
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (sm_endpoint,), (pm_endpoint,) = sm["spec"]["endpoints"], pm["spec"]["podMetricsEndpoints"]
    for endpoint, interval in ((sm_endpoint, "30s"), (pm_endpoint, "15s")):
        assert endpoint["interval"] == interval and endpoint["scrapeTimeout"] == "10s"
        assert endpoint["relabelings"][-1]["targetLabel"] == "node"
        assert endpoint["metricRelabelings"] == [
            {"action": "drop", "sourceLabels": ["__name__"], "regex": "python_gc_.*"}
        ]
    moved = template(*ALL_ON, *(arg for what in ("metrics.serviceMonitor", "metrics.podMonitor", "prometheusRule")
                                for arg in ("--set", f"{what}.namespace=monitoring")))  # fmt: skip
    by_kind = {d["kind"]: d for d in moved if d["kind"] in ("ServiceMonitor", "PodMonitor", "PrometheusRule")}
    assert {d["metadata"]["namespace"] for d in by_kind.values()} == {"monitoring"}
    assert by_kind["ServiceMonitor"]["spec"]["namespaceSelector"] == {"matchNames": ["metainfer-system"]}
    assert by_kind["PodMonitor"]["spec"]["namespaceSelector"] == {"matchNames": ["ml-a", "ml-b"]}
    # The alert on unscrapable serving pods selects a job label; the PodMonitor gives its targets that job wherever
    # it lives (Prometheus Operator's default is "<the PodMonitor's namespace>/<its name>").
    alerts = {r["alert"]: r for g in by_kind["PrometheusRule"]["spec"]["groups"] for r in g["rules"]}
    (job,) = re.findall(r'job="([^"]+)"', alerts["MetainferServingMetricsUnavailable"]["expr"])
    (pin, *_) = by_kind["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert pin == {"action": "replace", "targetLabel": "job", "replacement": job}
    (default_pm,) = [d for d in template("--set", "metrics.podMonitor.enabled=true") if d["kind"] == "PodMonitor"]
    assert default_pm["spec"]["podMetricsEndpoints"][0]["relabelings"] == [pin]
    assert "scrapeTimeout" not in default_pm["spec"]["podMetricsEndpoints"][0]


# --- dashboard and alerts: valid, and only metrics the project exports --------------------------------------------


def exported_metric_names() -> set[str]:
    """Series names the code exports, read from prometheus_client constructors with a literal name."""
    names: set[str] = set()
    for folder in ("core", "agent", "operator"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                first = node.args[0]
                if func in METRIC_CLASSES and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    names |= _series(func, first.value)
    return names


def _series(kind: str, name: str) -> set[str]:
    if kind == "Counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "Histogram":
        return {name, f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "Summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "Info":
        return {f"{name}_info"}
    return {name}


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    return exprs


def rule_exprs() -> list[str]:
    (rule,) = docs_of("PrometheusRule")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def referenced_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\bmetainfer_[a-z0-9_]+", expr))


def test_operator_metrics_are_found_by_the_scanner() -> None:
    """The scanner sees what the operator registers (guards the scanner itself)."""
    from prometheus_client.metrics import MetricWrapperBase

    from metainfer.operator import metrics

    kinds = {"counter": "Counter", "gauge": "Gauge", "histogram": "Histogram", "summary": "Summary"}
    collectors = [v for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)]
    assert len(collectors) >= 5
    registered = {s for c in collectors for d in c.describe() for s in _series(kinds[d.type], d.name)}
    assert registered <= exported_metric_names()


def test_dashboard_is_valid_json_with_the_required_panels() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 30
    titles = " | ".join(p["title"] for p in board["panels"]).lower()
    for wanted in ("p95 latency vs slo per hardware class", "adaptations over time by trigger", "run outcomes",
                   "adapted p95 of the served variant", "canary decisions", "class states"):  # fmt: skip
        assert wanted in titles, f"dashboard lacks a panel for {wanted!r}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    (cm,) = [d for d in docs_of("ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["metainfer-slo.json"]) == board


def test_dashboard_reads_the_slo_from_prometheus_and_names_classes_in_words() -> None:
    """No SLO typed into the chart: the SLO line per policy is the exported metric; a hardware-class variable shows
    the classes in words (its value is the fingerprint the series carry); legends never show a fingerprint; runs,
    promotions, rollbacks and drift re-adaptations are annotations."""
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert "slo_ms" not in variables
    hw = variables["hardware_class"]
    assert (
        "metainfer_policy_class_info" in hw["definition"] and "(?<text>" in hw["regex"] and "(?<value>" in hw["regex"]
    )
    targets = [t for p in board["panels"] for t in p.get("targets", [])]
    (latency,) = [p for p in board["panels"] if p["title"] == "p95 latency vs SLO per hardware class"]
    assert any("metainfer_policy_slo_latency_seconds" in t["expr"] for t in latency["targets"])
    for target in targets:
        assert "{{hardware_class}}" not in target.get("legendFormat", ""), target
        if "metainfer_inference_" in target["expr"]:
            assert 'hardware_class=~"$hardware_class"' in target["expr"], target["expr"]
    annotations = {a["name"]: a["expr"] for a in board["annotations"]["list"]}
    assert "metainfer_operator_runs_started_total" in annotations["Adaptation runs"]
    assert 'decision="promoted"' in annotations["Canary promotions"]
    assert 'decision="rolled_back"' in annotations["Canary rollbacks"]
    assert "metainfer_operator_drift_decisions_total" in annotations["Drift re-adaptations"]


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_promql_references_only_exported_metrics(source: str) -> None:
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    exported = exported_metric_names()
    referenced = set().union(*(referenced_metrics(e) for e in exprs))
    assert referenced, f"no metainfer metric found in the {source}"
    missing = sorted(referenced - exported)
    assert not missing, f"{source} references metrics no code exports: {missing}"
    other = {m for e in exprs for m in re.findall(r"\b([a-z_:][a-z0-9_:]*)\{", e)} - referenced
    assert other <= PROMETHEUS_BUILTIN, f"{source} references unknown series {sorted(other - PROMETHEUS_BUILTIN)}"


def test_every_required_alert_exists() -> None:
    (rule,) = docs_of("PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"MetainferSLOBreach", "MetainferAdaptationFailed", "MetainferOperatorMetricsUnavailable",
            "MetainferServingMetricsUnavailable"} <= alerts.keys()  # fmt: skip
    slo = alerts["MetainferSLOBreach"]
    assert "hardware_class" in slo["expr"] and "metainfer_policy_slo_latency_seconds" in slo["expr"]
    assert all(r["annotations"]["runbook_url"].startswith("docs/runbooks.md#") for r in alerts.values())
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    for name, alert in alerts.items():
        anchor = alert["annotations"]["runbook_url"].split("#", 1)[1]
        assert f"## {anchor}" in runbooks.lower().replace("`", ""), f"docs/runbooks.md has no section for {name}"
    assert 'outcome="failed"' in alerts["MetainferAdaptationFailed"]["expr"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promql_parses_with_promtool(tmp_path: Path) -> None:
    (rule,) = docs_of("PrometheusRule")
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    grafana = {"$namespace": ".*", "$policy": ".*", "$hardware_class": ".*", "$window": "5m", "$__rate_interval": "1m"}
    records = []
    for i, expr in enumerate(dashboard_exprs()):
        if expr.startswith("label_values("):
            expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
        if expr.startswith("query_result("):
            expr = expr.removeprefix("query_result(").removesuffix(")")
        for var, value in grafana.items():
            expr = expr.replace(var, value)
        records.append({"record": f"metainfer:dashboard_panel_{i}", "expr": expr})
    board = tmp_path / "dashboard.yaml"
    board.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = subprocess.run(["promtool", "check", "rules", str(alerts), str(board)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_allowed_prometheus_urls_reach_the_operator_as_its_config_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    urls = ["http://team-a-prometheus.monitoring:9090", "https://prom.example/team-b"]
    args = ["template", "mi", str(CHART), "--set-json", f"prometheus.allowedURLs={json.dumps(urls)}"]
    (dep,) = [d for d in yaml.safe_load_all(run_helm(*args).stdout) if d and d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    from metainfer.operator.config import OperatorConfig

    monkeypatch.setenv("METAINFER_PROMETHEUS_ALLOWED_URLS", env["METAINFER_PROMETHEUS_ALLOWED_URLS"])
    assert OperatorConfig().prometheus_allowed_urls == urls
    (default,) = docs_of("Deployment", False)
    names = {e["name"] for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "METAINFER_PROMETHEUS_ALLOWED_URLS" not in names, "none by default"
    bad = run_helm("template", "mi", str(CHART), "--set-json", 'prometheus.allowedURLs=["http://x/#"]', check=False)
    assert bad.returncode != 0 and "allowedURLs" in bad.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_slo_alerts_read_each_policys_exported_slo_and_name_the_class_in_words(tmp_path: Path) -> None:
    """promtool plays synthetic series through the rendered rules: the policy whose serving p95 (48 ms) exceeds its
    exported 10 ms SLO alerts, naming its class in words and the runbook; the one with a 100 ms SLO does not; a p99
    bound alerts only for the policy that sets one."""
    (rule,) = docs_of("PrometheusRule")
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    series = []
    for policy in ("slow", "relaxed"):
        labels = f'namespace="ml",policy="{policy}",hardware_class="aaaabbbbccccdddd"'
        for le, per_minute in (("0.01", 0), ("0.05", 600), ("+Inf", 600)):
            series.append({"series": f'metainfer_inference_latency_seconds_bucket{{{labels},le="{le}"}}',
                           "values": f"0+{per_minute}x40"})  # fmt: skip
    slo = {("slow", "0.95"): 0.01, ("slow", "0.99"): 0.02, ("relaxed", "0.95"): 0.1}
    for (policy, quantile), seconds in slo.items():
        name = f'metainfer_policy_slo_latency_seconds{{namespace="ml",policy="{policy}",quantile="{quantile}"}}'
        series.append({"series": name, "values": f"{seconds}x40"})
    info = 'namespace="ml",policy="slow",hardware_class="aaaabbbbccccdddd",description="nvidia A100, driver 535"'
    series.append({"series": f"metainfer_policy_class_info{{{info}}}", "values": "1x40"})

    def expected(quantile: str, value: str) -> dict[str, Any]:
        return {
            "exp_labels": {"severity": "warning", "namespace": "ml", "policy": "slow",
                           "hardware_class": "aaaabbbbccccdddd"},
            "exp_annotations": {
                "summary": f"{quantile} of a metainfer policy above its SLO on a hardware class",
                "description": f"{quantile} latency of policy ml/slow on nvidia A100, driver 535 is {value} over 5m, "
                "above the policy's spec.slo. The operator re-adapts on sustained drift (reason LatencyDrift); see "
                "the policy's status.",
                "runbook_url": "docs/runbooks.md#metainferslobreach",
            },
        }  # fmt: skip

    play_rules(tmp_path, series, [
        {"eval_time": "20m", "alertname": "MetainferSLOBreach", "exp_alerts": [expected("p95", "48ms")]},
        {"eval_time": "20m", "alertname": "MetainferSLOBreachP99", "exp_alerts": [expected("p99", "49.6ms")]},
    ])  # fmt: skip


def play_rules(tmp_path: Path, series: list[dict[str, str]], alert_tests: list[dict[str, Any]]) -> None:
    """``promtool test rules``: the rendered rules, fed ``series`` at one sample a minute, must fire as expected."""
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["alerts.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alert_tests}],
    }))  # fmt: skip
    result = subprocess.run(["promtool", "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _alerts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_each_alert_can_be_switched_off_and_given_labels() -> None:
    alerts = {"MetainferReconcileErrors": {"enabled": False},
              "MetainferSLOBreach": {"labels": {"team": "ml-serving", "severity": "critical"}}}  # fmt: skip
    on = _alerts(template("--set", "prometheusRule.enabled=true",
                          "--set-json", f"prometheusRule.alerts={json.dumps(alerts)}"))  # fmt: skip
    assert "MetainferReconcileErrors" not in on and "MetainferAdaptationFailed" in on
    assert on["MetainferSLOBreach"]["labels"] == {"severity": "critical", "team": "ml-serving"}
    assert on["MetainferSLOBreachP99"]["labels"] == {"severity": "warning"}, "labels are per alert"
    every = {name: {"enabled": False} for name in _alerts(template("--set", "prometheusRule.enabled=true"))}
    switches = "prometheusRule.alerts=" + json.dumps(every)
    none_on = template("--set", "prometheusRule.enabled=true", "--set-json", switches)
    (rule,) = [d for d in none_on if d["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == [], "no group is left with no rules"
    bad = run_helm("template", "mi", str(CHART), "--set", "prometheusRule.enabled=true",
                   "--set", "prometheusRule.alerts.MetainferSLOBreech.enabled=false", check=False)  # fmt: skip
    assert bad.returncode != 0 and "MetainferSLOBreech" in bad.stderr, "a misspelt alert name is refused"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_adaptation_failures_alert_per_policy_and_class(tmp_path: Path) -> None:
    """Failures of two policies in two namespaces give two alerts, each with its namespace, policy and class (an
    Alertmanager route per team needs them); a success alerts for nobody."""
    (rule,) = docs_of("PrometheusRule")
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    series = []
    runs = (("team-a", "bert", "failed"), ("team-b", "yolo", "failed"), ("team-c", "ok", "succeeded"))
    for ns, policy, outcome in runs:
        labels = f'namespace="{ns}",policy="{policy}",hardware_class="aaaabbbbccccdddd",outcome="{outcome}"'
        series.append({"series": f'metainfer_operator_runs_finished_total{{{labels},reason="OutOfMemory"}}',
                       "values": "0x5 1x30"})  # fmt: skip

    def expected(ns: str, policy: str) -> dict[str, Any]:
        return {
            "exp_labels": {"severity": "warning", "namespace": ns, "policy": policy,
                           "hardware_class": "aaaabbbbccccdddd", "reason": "OutOfMemory"},
            "exp_annotations": {
                "summary": "Adaptation runs of a metainfer policy failed",
                "description": f"1 adaptation run(s) of policy {ns}/{policy} on class aaaabbbbccccdddd failed with "
                f"reason OutOfMemory in the last 1h; the class is Degraded. `kubectl get adaptationruns -n {ns}` and "
                "the policy's conditions name the cause.",
                "runbook_url": "docs/runbooks.md#metainferadaptationfailed",
            },
        }  # fmt: skip

    failed = [expected("team-a", "bert"), expected("team-b", "yolo")]
    play_rules(tmp_path, series, [{"eval_time": "10m", "alertname": "MetainferAdaptationFailed", "exp_alerts": failed}])


def test_prometheus_credentials_are_a_mounted_secret_the_operator_reads() -> None:
    docs = template("--set", "prometheus.url=https://prometheus.monitoring:9090",
                    "--set", "prometheus.auth.secretName=prometheus-reader")  # fmt: skip
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "prometheus-auth"]
    assert volume["secret"]["secretName"] == "prometheus-reader"
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "prometheus-auth"]
    assert mount["readOnly"] is True
    assert operator_env(docs)["METAINFER_PROMETHEUS_AUTH_DIR"] == mount["mountPath"]
    (plain,) = [d for d in template() if d["kind"] == "Deployment"]
    assert "prometheus-auth" not in json.dumps(plain), "anonymous by default"


def test_user_roles_fold_into_the_default_ones_and_write_no_run() -> None:
    roles = {d["metadata"]["name"]: d for d in template() if d["kind"] == "ClusterRole"}
    edit, view = roles["mi-metainfer-edit"], roles["mi-metainfer-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    for role in (edit, view):
        for rule in role["rules"]:
            if set(rule["resources"]) - {"adaptationpolicies"}:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
    off = {d["metadata"]["name"] for d in template("--set", "rbac.aggregateToDefaultRoles=false")}
    assert not {"mi-metainfer-edit", "mi-metainfer-view"} & off


def test_kubernetes_older_than_the_admission_policies_is_refused_at_install() -> None:
    """ValidatingAdmissionPolicy v1 is GA in 1.30: a 1.29 cluster is told so by helm, not half-installed."""
    old = run_helm("template", "mi", str(CHART), "--kube-version", "1.29.9", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr
    assert any(d["kind"] == "ValidatingAdmissionPolicy" for d in template("--kube-version", "1.30.0"))


# --- NetworkPolicies ------------------------------------------------------------------------------------------------
NETWORK = ["--set", "networkPolicy.enabled=true", "--set", "networkPolicy.apiServer.cidrs={10.96.0.1/32}"]


def _selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    return all(labels.get(k) == v for k, v in wanted.items())


def test_network_policies_are_off_by_default_and_need_the_api_servers_address() -> None:
    assert not docs_of("NetworkPolicy", all_on=False)
    refused = run_helm("template", "mi", str(CHART), "--set", "networkPolicy.enabled=true", check=False)
    assert refused.returncode != 0 and "networkPolicy.apiServer.cidrs" in refused.stderr


def test_network_policies_select_exactly_the_pods_the_operator_and_chart_create(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = template(*NETWORK, "--set", "workloadNamespaces={ml-a,ml-b}")
    policies = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "NetworkPolicy"}
    assert set(policies) == {("metainfer-system", "mi-metainfer-operator")} | {
        (ns, f"mi-metainfer-{role}") for ns in ("ml-a", "ml-b") for role in ("adaptation", "serving")
    }
    config = operator_config(operator_env(docs), monkeypatch)
    templates = workload_templates(config)
    job, serving = templates["job"], templates["serving"]
    (operator,) = [d for d in docs if d["kind"] == "Deployment"]
    pods = {
        "operator": operator["spec"]["template"],
        "adaptation": job,
        "serving": serving,
    }
    for role, pod in pods.items():
        chosen = [name for (_, name), p in policies.items() if _selects(p, pod["metadata"]["labels"])]
        assert set(chosen) == {f"mi-metainfer-{role}"}, (role, chosen)
    # Every port a policy names by name is one the selected pod's container declares.
    for role, pod in pods.items():
        declared = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        (np,) = [
            p
            for (_, name), p in policies.items()
            if name == f"mi-metainfer-{role}" and p["metadata"]["namespace"] != "ml-b"
        ]
        named = {port["port"] for rule in np["spec"].get("ingress", []) for port in rule.get("ports", [])}
        assert {p for p in named if isinstance(p, str)} <= declared, (role, named, declared)
    # The serving account has no token: serving pods get no route to the API server; Jobs and the operator do.
    api = {"ipBlock": {"cidr": "10.96.0.1/32"}}
    for name, np in policies.items():
        reaches_api = any(api in rule.get("to", []) for rule in np["spec"]["egress"])
        assert reaches_api == (not name[1].endswith("-serving")), name


def test_serving_clients_narrow_who_may_call_serving_pods_and_prometheus_still_scrapes() -> None:
    clients = '[{"namespaceSelector":{"matchLabels":{"team":"a"}}}]'
    docs = template(*NETWORK, "--set-json", f"networkPolicy.servingClients={clients}")
    (serving,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-serving")]
    (rule,) = serving["spec"]["ingress"]
    assert rule["from"][0] == {"namespaceSelector": {"matchLabels": {"team": "a"}}}
    assert rule["from"][1]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert {p["port"] for p in rule["ports"]} == {"http", "grpc"}


# --- helm test ------------------------------------------------------------------------------------------------------


def test_the_helm_test_hook_may_read_the_operator_and_create_policies_only() -> None:
    result = run_helm(
        "template", "mi", str(CHART), "--namespace", "metainfer-system",
        "--set", "workloadNamespaces={ml-a,ml-b}", "--show-only", "templates/tests/install-check.yaml",
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert all(d["metadata"]["annotations"]["helm.sh/hook"] == "test" for d in docs)
    rules = {(d["metadata"]["namespace"], r) for d in docs if d["kind"] == "Role" for r in _rules(d)}
    assert rules == {("metainfer-system", ("apps", "deployments", "get"))} | {
        (ns, ("metainfer.io", "adaptationpolicies", "create")) for ns in ("ml-a", "ml-b")
    }
    (read,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "metainfer-system"]
    assert read["rules"][0]["resourceNames"] == ["mi-metainfer-operator"]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    (operator,) = docs_of("Deployment", all_on=False)
    assert pod["spec"]["securityContext"] == operator["spec"]["template"]["spec"]["securityContext"]
    (check,) = pod["spec"]["containers"]
    assert check["securityContext"] == operator["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert check["args"] == ["check-install", "--deployment", "metainfer-system/mi-metainfer-operator",
                             "--policy-namespace", "ml-a", "--policy-namespace", "ml-b"]  # fmt: skip


def test_the_operators_disruption_budget_is_optional_selects_it_and_never_pins_a_broken_pod() -> None:
    assert not docs_of("PodDisruptionBudget", all_on=False)
    (budget,) = [
        d for d in template("--set", "operator.podDisruptionBudget.enabled=true") if d["kind"] == "PodDisruptionBudget"
    ]
    (operator,) = docs_of("Deployment", all_on=False)
    labels = operator["spec"]["template"]["metadata"]["labels"]
    assert budget["kind"] == "PodDisruptionBudget" and budget["metadata"]["namespace"] == "metainfer-system"
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    strict_args = [
        "--set",
        "operator.podDisruptionBudget.enabled=true",
        "--set",
        "operator.podDisruptionBudget.minAvailable=1",
    ]
    (strict,) = [d for d in template(*strict_args) if d["kind"] == "PodDisruptionBudget"]
    assert strict["spec"]["minAvailable"] == 1 and "maxUnavailable" not in strict["spec"]


# Values added since chart 0.1.0 that render as their default when absent (null), so a reused older release's
# values need not name them; every other added value is in metainfer.valuesCheck.
ABSENT_AS_DEFAULT = {"workloads.fetchProxy", "workloads.fetchNoProxy", "workloads.storeWorkloadIdentity"}


def values_added_since_the_previous_chart() -> list[str]:
    """Dotted paths of the values this chart's values.yaml has and the previous release's (git history) lacks:
    the outermost added key of each branch. Without git history (a shallow clone), one entry that says so: the
    tests parametrized by it fail with that reason instead of the module failing to collect."""
    import tempfile

    from hack.helm import previous_chart

    with tempfile.TemporaryDirectory() as scratch:
        try:
            old = yaml.safe_load((previous_chart(Path(scratch)) / "values.yaml").read_text())
        except AssetError as error:
            return [f"<no previous chart: {error}>"]
    new = yaml.safe_load((CHART / "values.yaml").read_text())

    def added(before: Any, after: dict[str, Any], prefix: str) -> list[str]:
        found: list[str] = []
        for key, value in after.items():
            if not isinstance(before, dict) or key not in before:
                found.append(prefix + key)
            elif isinstance(value, dict) and value:
                found += added(before[key], value, f"{prefix}{key}.")
        return found

    return added(old, new, "")


@pytest.mark.parametrize("dropped", values_added_since_the_previous_chart())
def test_values_of_an_older_chart_reused_as_they_were_are_refused_with_what_to_run(dropped: str) -> None:
    """`helm upgrade --reuse-values` from chart 0.1.0 brings values without those this chart added (null removes a
    key, as an older release's values lack it): the render names them and the flag to use instead, instead of an
    operator started with an empty setting; a value whose absence renders as its default is accepted, and renders
    so. The parameters are every value added since, read from git: one added in neither place fails here."""
    assert not dropped.startswith("<"), dropped
    reused = run_helm(
        "template", "mi", str(CHART), "--namespace", "metainfer-system", "--skip-tests", "--set", f"{dropped}=null",
        check=False,
    )  # fmt: skip
    if dropped in ABSENT_AS_DEFAULT:
        assert reused.returncode == 0, reused.stderr
        assert [d for d in yaml.safe_load_all(reused.stdout) if d] == list(rendered(all_on=False)), dropped
        return
    assert reused.returncode != 0
    assert f"values {dropped} are missing" in reused.stderr and "--reset-then-reuse-values" in reused.stderr


def test_the_previous_releases_values_reused_whole_are_refused_naming_each_added_value(tmp_path: Path) -> None:
    """What `--reuse-values` renders: this chart's templates over the previous release's values.yaml alone."""
    from hack.helm import previous_chart

    reused = tmp_path / "reused"
    shutil.copytree(CHART, reused)
    shutil.copy2(previous_chart(tmp_path) / "values.yaml", reused / "values.yaml")
    refused = run_helm("template", "mi", str(reused), check=False)
    assert refused.returncode != 0
    named = re.search(r"values (.+) are missing", refused.stderr)
    assert named is not None, refused.stderr
    assert sorted(named.group(1).split(", ")) == sorted(
        set(values_added_since_the_previous_chart()) - ABSENT_AS_DEFAULT
    )


def test_each_accelerator_vendor_gets_its_flavours_image_and_a_vendor_left_out_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defaults: nvidia classes run <repository>:<tag>-cuda, intel ones -openvino, amd and huawei none (refused by
    the operator, not run on the CPU image). A digest pins a flavour; null drops a vendor."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    config = operator_config(operator_env(template("--set", "image.repository=reg/mi")), monkeypatch)
    nvidia, intel = (config.job_settings().for_vendor(v) for v in ("nvidia", "intel"))
    assert nvidia is not None and nvidia.image == f"reg/mi:{version}-cuda"
    assert intel is not None and intel.image == f"reg/mi:{version}-openvino"
    assert config.job_settings().for_vendor("amd") is None and config.serving_defaults().for_vendor("huawei") is None
    assert config.job_settings().image == f"reg/mi:{version}"

    digest = "sha256:" + "b" * 64
    pinned = template(
        "--set", "image.repository=reg/mi",
        "--set", f"agent.vendorImages.nvidia.digest={digest}",
        "--set", "agent.vendorImages.nvidia.runtime=onnxruntime-gpu 1.31.1",
        "--set", "agent.vendorImages.intel=null",
        "--set", "agent.vendorImages.amd.image=other/mi-rocm:7",
    )  # fmt: skip
    config = operator_config(operator_env(pinned), monkeypatch)
    nvidia = config.serving_defaults().for_vendor("nvidia")
    assert nvidia is not None and (nvidia.image, nvidia.runtime) == (f"reg/mi@{digest}", "onnxruntime-gpu 1.31.1")
    amd = config.job_settings().for_vendor("amd")
    assert amd is not None and amd.image == "other/mi-rocm:7"
    assert config.job_settings().for_vendor("intel") is None

    empty = run_helm("template", "mi", str(CHART), "--set", "agent.vendorImages.amd.runtime=x", check=False)
    assert empty.returncode != 0 and "agent.vendorImages.amd names no flavour, digest or image" in empty.stderr
    typo = run_helm("template", "mi", str(CHART), "--set", "agent.vendorImages.nvida.flavour=cuda", check=False)
    assert typo.returncode != 0 and "nvida" in typo.stderr
