"""The Helm chart without a cluster: CRDs in sync, values schema, RBAC without wildcards, real metric names.

Rendering uses the pinned helm from hack/helm.py (built once with Go and cached,
like the control plane; ``make test`` builds it through ``make assets``).
PromQL is checked twice: every ``metainfer_*`` name must be a metric the code
defines (found by reading the prometheus_client constructors in core/, agent/
and operator/), and every expression must parse (promtool, when installed).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.controlplane.errors import AssetError
from hack.helm import HELM_VERSION, all_optional_on, provide

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "metainfer"
DASHBOARD = CHART / "dashboards" / "metainfer-slo.json"

# Every optional feature on, and every value that changes what is rendered set.
ALL_ON = [
    *all_optional_on("ml-a"),
    "--set", "workloadNamespaces={ml-a,ml-b}",
    "--set", "operator.watchNamespaces={ml-a,ml-b}",
]  # fmt: skip
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
    args = ["template", "mi", str(CHART), "--namespace", "metainfer-system", *(ALL_ON if all_on else [])]
    return tuple(d for d in yaml.safe_load_all(run_helm(*args).stdout) if d)


def docs_of(kind: str, all_on: bool = True) -> list[dict[str, Any]]:
    return [d for d in rendered(all_on) if d["kind"] == kind]


# --- CRDs --------------------------------------------------------------------------------------------------------


def test_chart_crds_are_byte_identical_to_crds_dir() -> None:
    source = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert source, "crds/ is empty"
    stale = sorted(n for n in source.keys() | chart.keys() if source.get(n) != chart.get(n))
    assert not stale, (
        f"charts/metainfer/crds differs from crds/ in {stale}: run `cp crds/*.yaml charts/metainfer/crds/`"
    )


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

    def walk(value: Any, node: dict[str, Any], where: str) -> None:
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
        (["--set-json", 'prometheusRule.sloBreach.policies=[{"namespace":"a"}]'], "policy"),
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
        ("", "services", "create"),
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
    assert len([r for r in roles if r["kind"] == "ClusterRole"]) == 2
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
    from metainfer.core.control.manifests import COMPONENT, HTTP_PORT, MANAGED_BY

    (pm,) = docs_of("PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {MANAGED_BY: "metainfer", COMPONENT: "serving"}
    assert pm["spec"]["namespaceSelector"]["matchNames"] == ["ml-a", "ml-b"]
    assert HTTP_PORT == 8080 and pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"


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
    for wanted in ("p95 latency vs slo per hardware class", "adaptations over time by reason", "run outcomes",
                   "best p95 per hardware class", "canary decisions"):  # fmt: skip
        assert wanted in titles, f"dashboard lacks a panel for {wanted!r}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    (cm,) = [d for d in docs_of("ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    embedded = json.loads(cm["data"]["metainfer-slo.json"])
    slo = next(v for v in embedded["templating"]["list"] if v["name"] == "slo_ms")
    assert slo["query"] == "50", "the default SLO line comes from values (dashboard.defaultSloMs)"


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
    assert "hardware_class" in slo["expr"] and "> 0.005" in slo["expr"], "p95 per class vs the 5 ms SLO"
    assert 'outcome="failed"' in alerts["MetainferAdaptationFailed"]["expr"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promql_parses_with_promtool(tmp_path: Path) -> None:
    (rule,) = docs_of("PrometheusRule")
    alerts = tmp_path / "alerts.yaml"
    alerts.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    grafana = {"$namespace": ".*", "$policy": ".*", "$window": "5m", "$__rate_interval": "1m", "$slo_ms": "50"}
    records = []
    for i, expr in enumerate(dashboard_exprs()):
        if expr.startswith("label_values("):
            expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
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
