"""The manifests the operator writes (core.control.manifests): runs, Jobs, Deployments, Services and disruption
budgets that are deterministic, owned, hardened, pinned to their class and valid against core.api, carrying the
platform's settings into every Job and serving pod; and the image that serves a variant, which stays the one that
validated it until a re-adaptation under a new runtime is served. The names they carry are tested in test_naming,
the run key in test_runkey, the settings themselves in test_settings."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
from manifest_inputs import CPU, GPU, _pods, gpu_group, policy, succeeded
from pydantic import ValidationError
from reconcile_cluster import Cluster

from metainfer.core.api.conditions import Reason
from metainfer.core.api.names import LABEL_CLASS, LABEL_POLICY, LABEL_RUN_KEY
from metainfer.core.api.policy import AdaptationPolicy
from metainfer.core.api.run import AdaptationRun, AdaptationRunSpec
from metainfer.core.api.security import ContainerSecurityContext, PodSecurityContext
from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.manifests import (
    build_deployment,
    build_disruption_budget,
    build_job,
    build_policy_service,
    build_run,
    build_service,
    policy_endpoint,
)
from metainfer.core.control.naming import JOB_MAX, workload_name
from metainfer.core.control.runkey import run_key
from metainfer.core.control.settings import AgentJobSettings, ServingDefaults
from metainfer.core.engine.recipe import Recipe

# --- run ------------------------------------------------------------------------------------------------------------


def test_build_run_validates_and_is_owned() -> None:
    group = gpu_group()
    run = build_run(policy(), group, "NewHardwareClass")
    spec = AdaptationRunSpec.model_validate(run["spec"])
    assert spec.class_fingerprint == group.fingerprint and spec.hardware_class == group.hardware_class
    assert (spec.policy_generation, spec.batch_size, spec.reason) == (3, 1, "NewHardwareClass")
    assert "classFingerprint" in run["spec"] and "class_fingerprint" not in run["spec"]
    meta = run["metadata"]
    assert meta["namespace"] == "team-a" and len(meta["name"]) <= JOB_MAX
    assert meta["labels"][LABEL_POLICY] == "digits" and meta["labels"][LABEL_CLASS] == group.fingerprint
    assert meta["labels"][LABEL_RUN_KEY] == run_key(policy()["spec"], 3, group.fingerprint)
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "name": "digits",
        "uid": "uid-policy",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert build_run(policy(), group, "NewHardwareClass") == run
    with pytest.raises(ValueError):
        build_run(policy(), group, "Whatever")


# --- job ------------------------------------------------------------------------------------------------------------


def _hardened(pod: dict[str, Any]) -> None:
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and "runAsUser" not in sc and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/tmp" in mounts and {"name": "HOME", "value": "/tmp"} in c["env"]
    assert all("emptyDir" in v or "persistentVolumeClaim" in v or "hostPath" in v for v in pod["volumes"])


def test_build_job_is_pinned_hardened_and_owned() -> None:
    group = gpu_group()
    run = {**build_run(policy(), group, "NewHardwareClass")}
    run["metadata"] = {**run["metadata"], "uid": "uid-run"}
    job = build_job(run, group, AgentJobSettings(image="registry.local/metainfer:1", service_account="agent-sa"))
    assert job["apiVersion"] == "batch/v1" and job["metadata"]["name"] == run["metadata"]["name"]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "AdaptationRun"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-run"
    assert job["spec"]["backoffLimit"] == 3 and job["spec"]["activeDeadlineSeconds"] == 600 + 600
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == group.selector and pod["serviceAccountName"] == "agent-sa"
    assert pod["restartPolicy"] == "Never"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (c,) = pod["containers"]
    assert c["command"] == ["metainfer", "agent", "run", f"team-a/{run['metadata']['name']}"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" and c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    _hardened(pod)
    cpu_group = next(iter(group_nodes([("c", CPU)]).values()))
    cpu_job = build_job(run, cpu_group)
    cpu_pod = cpu_job["spec"]["template"]["spec"]
    assert "affinity" in cpu_pod and cpu_pod["serviceAccountName"] == "metainfer-agent"
    assert "nvidia.com/gpu" not in json.dumps(cpu_pod["containers"][0]["resources"])


def test_a_mig_mixed_class_s_job_and_pods_request_one_instance_of_its_profile_and_no_whole_gpu() -> None:
    mixed = {**GPU, "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.count": "7",
             "nvidia.com/mig-1g.5gb.memory": "4864"}  # fmt: skip
    group = next(iter(group_nodes([("mig-1", mixed)]).values()))
    p = policy()
    run = succeeded(build_run(p, group, "NewHardwareClass"))
    run["metadata"]["uid"] = "u"
    for pod in (
        build_job(run, group)["spec"]["template"]["spec"],
        build_deployment(p, group, run)["spec"]["template"]["spec"],
    ):
        resources = pod["containers"][0]["resources"]
        assert resources["requests"]["nvidia.com/mig-1g.5gb"] == resources["limits"]["nvidia.com/mig-1g.5gb"] == "1"
        assert "nvidia.com/gpu" not in resources["requests"]
        assert pod["nodeSelector"]["nvidia.com/mig-1g.5gb.memory"] == "4864"


def test_platform_security_contexts_and_pull_secrets_reach_jobs_and_serving_pods() -> None:
    """OpenShift's restricted SCC assigns UIDs and refuses pinned ones: without runAsUser/runAsGroup/fsGroup in the
    platform's pod securityContext, no UID is pinned anywhere in the Job or the serving pod."""
    for pod in _pods((AgentJobSettings(), ServingDefaults())):
        assert "imagePullSecrets" not in pod
        assert pod["securityContext"]["fsGroup"] == 65532
    openshift = PodSecurityContext.model_validate({"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}})
    container = ContainerSecurityContext.model_validate(
        {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}
    )
    common = {"pod_security_context": openshift, "container_security_context": container,
              "image_pull_secrets": ("regcred", "mirror")}  # fmt: skip
    for pod in _pods((AgentJobSettings(**common), ServingDefaults(**common))):
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["containers"][0]["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        }
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(re.findall(r'"(\w+)":', json.dumps(pod)))


def test_job_deadline_from_spec_and_model_volume() -> None:
    group = gpu_group()
    p = policy(
        search={"timeBudgetSeconds": 600, "activeDeadlineSeconds": 900},
        model={"uri": "file:///models/m.onnx", "sha256": "a" * 64, "volume": {"claimName": "models"}},
    )
    run = build_run(p, group, "NewHardwareClass")
    run["metadata"]["uid"] = "u"
    job = build_job(run, group)
    assert job["spec"]["activeDeadlineSeconds"] == 900
    pod = job["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in pod["containers"][0]["volumeMounts"]


def test_a_variant_store_is_written_by_the_job_and_read_by_serving_pods_by_sha256() -> None:
    from metainfer.agent.serve.flags import add_arguments

    group = gpu_group()
    p = policy(serving={"variantStore": {"claimName": "variants"}})
    run = build_run(p, group, "NewHardwareClass")
    run["metadata"]["uid"] = "u"
    assert run["spec"]["variantStore"] == {"claimName": "variants"}
    assert build_run(policy(), group, "NewHardwareClass")["metadata"]["name"] == run["metadata"]["name"], (
        "the store is where a variant is kept, not part of the adaptation: setting it must not re-adapt"
    )
    job_pod = build_job(run, group)["spec"]["template"]["spec"]
    (agent,) = job_pod["containers"]
    claim = {"name": "variants", "persistentVolumeClaim": {"claimName": "variants", "readOnly": False}}
    assert claim in job_pod["volumes"]
    mount = {"name": "variants", "mountPath": "/var/lib/metainfer/variants", "readOnly": False}
    assert mount in agent["volumeMounts"]
    assert {"name": "METAINFER_VARIANT_STORE", "value": "/var/lib/metainfer/variants"} in agent["env"]

    done = succeeded(run)
    done["status"]["bestVariantSha256"] = "c" * 64
    pod = build_deployment(p, group, done)["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(server["args"][1:])
    assert args.variant_sha256 == "c" * 64 and str(args.variant_store) == "/var/lib/metainfer/variants"
    assert {"name": "variants", "persistentVolumeClaim": {"claimName": "variants", "readOnly": True}} in pod["volumes"]
    assert {"name": "variants", "mountPath": "/var/lib/metainfer/variants", "readOnly": True} in server["volumeMounts"]

    no_store = succeeded(build_run(policy(), group, "NewHardwareClass"))
    no_store["status"]["bestVariantSha256"] = "c" * 64
    pod = build_deployment(policy(), group, no_store)["spec"]["template"]["spec"]
    args = parser.parse_args(pod["containers"][0]["args"][1:])
    assert args.variant_sha256 == "c" * 64 and args.variant_store is None, "rebuilt, and checked against the sha"
    assert all(v["name"] != "variants" for v in pod["volumes"])


def test_a_provisional_pod_checks_the_variant_in_an_init_container_and_serves_what_it_leaves() -> None:
    from metainfer.agent.serve.flags import add_arguments, add_check_arguments

    group = gpu_group()
    data = {"uri": "configmap://digits-data/data.npz", "sha256": "d" * 64}
    p = policy(
        model={"uri": "configmap://digits-model/model.onnx", "sha256": "a" * 64, "data": data},
        serving={"variantStore": {"claimName": "variants"}},
        slo={"latencyP95Ms": 12.5, "maxQualityDrop": 0.02},
    )
    done = succeeded(build_run(p, group, "NewHardwareClass"))
    done["status"]["bestVariantSha256"] = "c" * 64
    deployment = build_deployment(p, group, done, provisional=True)
    assert deployment["spec"]["template"]["metadata"]["labels"]["metainfer.io/provisional"] == "true"
    assert "metainfer.io/provisional" not in deployment["spec"]["selector"]["matchLabels"], "the same pods, relabelled"
    pod = deployment["spec"]["template"]["spec"]
    (check,), (server,) = pod["initContainers"], pod["containers"]
    assert check["command"] == ["metainfer"] and check["image"] == server["image"]
    assert "readinessProbe" not in check and "ports" not in check, "init containers take no probes or ports"
    checker = argparse.ArgumentParser()
    add_check_arguments(checker)
    args = checker.parse_args(check["args"][1:])
    assert args.variant_sha256 == "c" * 64 and str(args.variant_store) == "/var/lib/metainfer/variants"
    assert args.max_quality_drop == 0.02 and args.latency_p95_ms == 12.5
    assert args.data_uri.startswith("file:///var/lib/metainfer/configmaps/"), "the quality check reads the data"
    assert args.model_uri.startswith("file:///var/lib/metainfer/configmaps/")
    server_parser = argparse.ArgumentParser()
    add_arguments(server_parser)
    served = server_parser.parse_args(server["args"][1:])
    assert served.variant == Path(args.out) / "variant.onnx" and served.recipe == Path(args.out) / "recipe.json"
    assert served.variant_sha256 is None and served.variant_store is None and served.data_uri is None
    mounts = {m["name"]: m for m in check["volumeMounts"]}
    assert mounts["variants"]["readOnly"] and not mounts["provisional"].get("readOnly")
    server_mounts = {m["name"]: m for m in server["volumeMounts"]}
    assert "variants" not in server_mounts and server_mounts["provisional"]["readOnly"]
    cm_volumes = {v["name"] for v in pod["volumes"] if "configMap" in v}
    assert len(cm_volumes) == 2 and cm_volumes <= set(mounts) and cm_volumes <= set(server_mounts)
    assert {"name": "provisional", "emptyDir": {}} in pod["volumes"]

    plain = build_deployment(p, group, done)["spec"]["template"]
    assert "initContainers" not in plain["spec"] and "metainfer.io/provisional" not in plain["metadata"]["labels"]


# --- serving --------------------------------------------------------------------------------------------------------


def test_build_deployment_serves_the_recipe_on_the_class() -> None:
    group = gpu_group()
    p = policy(serving={"replicas": 3, "resources": {"requests": {"cpu": "2"}}})
    run = succeeded(build_run(p, group, "NewHardwareClass"))
    dep = build_deployment(p, group, run)
    assert dep["metadata"]["name"] == workload_name("digits", group.hardware_class.name())
    assert dep["spec"]["replicas"] == 3 and dep["metadata"]["ownerReferences"][0]["uid"] == "uid-policy"
    tmpl = dep["spec"]["template"]
    assert set(dep["spec"]["selector"]["matchLabels"].items()) <= set(tmpl["metadata"]["labels"].items())
    assert tmpl["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert tmpl["metadata"]["labels"]["metainfer.io/recipe-key"] == run["status"]["bestRecipeKey"]
    pod = tmpl["spec"]
    assert pod["nodeSelector"] == group.selector
    (c,) = pod["containers"]
    args = c["args"]
    recipe = Recipe.model_validate_json(args[args.index("--recipe-json") + 1])
    assert recipe.key() == run["status"]["bestRecipeKey"]
    assert args[args.index("--model-sha256") + 1] == "a" * 64
    assert c["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
        {"name": "grpc", "containerPort": 8081, "protocol": "TCP"},
    ]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # The policy names cpu: its request wins and the platform's cpu limit goes with it; memory is the platform's.
    assert c["resources"] == {
        "requests": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "2Gi", "nvidia.com/gpu": "1"},
    }
    _hardened(pod)
    svc = build_service(p, group)
    assert svc["metadata"]["name"] == dep["metadata"]["name"] and svc["spec"]["type"] == "ClusterIP"
    assert set(svc["spec"]["selector"].items()) <= set(tmpl["metadata"]["labels"].items())
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"},
        {"name": "grpc", "port": 8081, "targetPort": "grpc", "protocol": "TCP"},
    ]
    budget = build_disruption_budget(p, group)
    assert budget["apiVersion"] == "policy/v1" and budget["metadata"]["name"] == svc["metadata"]["name"]
    assert budget["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert budget["metadata"]["ownerReferences"] == svc["metadata"]["ownerReferences"]
    assert set(budget["spec"]["selector"]["matchLabels"].items()) <= set(tmpl["metadata"]["labels"].items())


def test_the_serving_container_listens_where_its_ports_say() -> None:
    """The args are what `metainfer serve` parses: REST on the port named http, KServe v2 gRPC on the one named
    grpc, which the Service exposes under the same names."""
    from metainfer.agent.serve.flags import add_arguments

    group = gpu_group()
    p = policy()
    deployment = build_deployment(p, group, succeeded(build_run(p, group, "NewHardwareClass")))
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert c["args"][0] == "serve"
    args = parser.parse_args(c["args"][1:])
    ports = {port["name"]: port["containerPort"] for port in c["ports"]}
    assert ports == {"http": args.port, "grpc": args.grpc_port} and args.grpc_port != args.port
    service_ports = {port["name"]: port["targetPort"] for port in build_service(p, group)["spec"]["ports"]}
    assert service_ports == {"http": "http", "grpc": "grpc"}


def test_serving_replicas_spread_over_the_classs_nodes_without_ever_blocking_scheduling() -> None:
    group = gpu_group()
    p = policy()
    deployment = build_deployment(p, group, succeeded(build_run(p, group, "NewHardwareClass")))
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # a class of one node still gets every replica
    # It counts the replicas of this Deployment (policy, class and track), not the canary's or another class's.
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_deployment_serves_the_runs_model_not_the_policys_new_one() -> None:
    group = gpu_group()
    run = succeeded(build_run(policy(), group, "NewHardwareClass"))
    newer = policy(model={"uri": "https://models.example.com/v2.onnx", "sha256": "b" * 64})
    args = build_deployment(newer, group, run)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--model-sha256") + 1] == "a" * 64


def test_configmap_models_are_mounted_for_serving() -> None:
    """Serving pods carry no API token, so a configmap:// model must reach them as a mounted file."""
    group = gpu_group()
    p = policy(model={"uri": "configmap://digits-model/model.onnx", "sha256": "a" * 64})
    pod = build_deployment(p, group, succeeded(build_run(p, group, "NewHardwareClass")))["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    uri = c["args"][c["args"].index("--model-uri") + 1]
    assert uri.startswith("file:///var/lib/metainfer/configmaps/") and uri.endswith("/model.onnx")
    volume = next(v for v in pod["volumes"] if "configMap" in v)
    assert volume["configMap"] == {"name": "digits-model"}
    mount = next(m for m in c["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] and uri == f"file://{mount['mountPath']}/model.onnx"
    assert pod["automountServiceAccountToken"] is False


def test_builders_take_the_models_or_the_plain_objects_alike() -> None:
    group = gpu_group()
    plain = policy()
    typed = AdaptationPolicy.model_validate(plain)
    run = succeeded(build_run(plain, group, "NewHardwareClass"))
    assert build_run(typed, group, "NewHardwareClass") == build_run(plain, group, "NewHardwareClass")
    assert build_job(AdaptationRun.model_validate(run), group) == build_job(run, group)
    assert build_deployment(typed, group, AdaptationRun.model_validate(run)) == build_deployment(plain, group, run)
    assert build_service(typed, group) == build_service(plain, group)


def test_a_policys_batching_settings_reach_serve_and_serves_defaults_otherwise() -> None:
    import argparse

    from metainfer.agent.serve.flags import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    group = gpu_group()

    def served(p: dict[str, Any]) -> argparse.Namespace:
        args = build_deployment(p, group, succeeded(build_run(p, group, "NewHardwareClass")))["spec"]["template"][
            "spec"
        ]["containers"][0]["args"]
        return parser.parse_args(args[1:])

    assert served(policy(serving={"replicas": 2, "maxQueueDelayMs": 5})).max_queue_delay_ms == 5
    assert served(policy()).max_queue_delay_ms == parser.get_default("max_queue_delay_ms")
    assert served(policy(serving={"replicas": 2, "batchDependent": "isolate"})).batch_dependent == "isolate"
    assert served(policy()).batch_dependent == parser.get_default("batch_dependent") == "combine"
    with pytest.raises(ValidationError, match=r"batchDependent|batch_dependent"):
        AdaptationPolicy.model_validate(policy(serving={"replicas": 2, "batchDependent": "sometimes"}))


def test_the_policy_service_selects_every_class_and_track_of_the_policy_and_nothing_else() -> None:
    p = policy()
    svc = build_policy_service(p)
    assert svc["metadata"]["name"] == "digits" and svc["spec"]["type"] == "ClusterIP"
    assert svc["metadata"]["ownerReferences"][0]["kind"] == "AdaptationPolicy"
    assert [(port["name"], port["port"]) for port in svc["spec"]["ports"]] == [("http", 8080), ("grpc", 8081)]
    selector = set(svc["spec"]["selector"].items())
    cpu_group = next(iter(group_nodes([("cpu-1", {"kubernetes.io/arch": "amd64"})]).values()))
    for group in (gpu_group(), cpu_group):
        run = succeeded(build_run(p, group, "NewHardwareClass"))
        for track in ("stable", "canary"):
            pod_labels = build_deployment(p, group, run, track=track)["spec"]["template"]["metadata"]["labels"]
            assert selector <= set(pod_labels.items()), (group.fingerprint, track)
    other_run = succeeded(build_run(policy("other"), gpu_group(), "NewHardwareClass"))
    other = build_deployment(policy("other"), gpu_group(), other_run)
    assert not selector <= set(other["spec"]["template"]["metadata"]["labels"].items())
    assert (
        build_job(build_run(p, gpu_group(), "NewHardwareClass"), gpu_group())["spec"]["template"]["metadata"]["labels"][
            "app.kubernetes.io/component"
        ]
        != "serving"
    )  # adaptation Jobs never receive the policy's traffic
    assert policy_endpoint(p) == f"digits.{p['metadata']['namespace']}.svc:8080"


@pytest.mark.parametrize("name", ["9-lives", "a" * 70, "x.y"])
def test_a_policy_name_that_is_no_service_name_gets_a_valid_stable_one(name: str) -> None:
    first = build_policy_service(policy(name))["metadata"]["name"]
    assert first == build_policy_service(policy(name))["metadata"]["name"]
    assert len(first) <= 63 and first[0].isalpha() and all(ch.isalnum() or ch == "-" for ch in first)


def test_the_platforms_fetch_exceptions_reach_job_and_serving_pods_only_when_set() -> None:
    from metainfer.operator.config import ConfigError, OperatorConfig

    config = OperatorConfig(workload_fetch_allow_cidrs='["10.96.0.0/12", "127.0.0.1/32"]')
    for pod in _pods((config.job_settings(), config.serving_defaults())):
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["METAINFER_FETCH_ALLOW_CIDRS"] == "10.96.0.0/12,127.0.0.1/32"
    for pod in _pods((AgentJobSettings(), ServingDefaults())):
        assert "METAINFER_FETCH_ALLOW_CIDRS" not in json.dumps(pod["containers"][0]["env"])
    with pytest.raises(ConfigError, match="METAINFER_WORKLOAD_FETCH_ALLOW_CIDRS: 'nope' is not a CIDR"):
        OperatorConfig(workload_fetch_allow_cidrs='["nope"]')


def test_the_platforms_tolerations_reach_job_and_serving_pods_after_the_policys() -> None:
    from metainfer.operator.config import ConfigError, OperatorConfig

    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    config = OperatorConfig(workload_tolerations=json.dumps([gpu]))
    assert config.platform_tolerations() == (gpu,)
    for pod in _pods((config.job_settings(), config.serving_defaults())):
        assert gpu in pod["tolerations"]
    with pytest.raises(ConfigError, match="METAINFER_WORKLOAD_TOLERATIONS"):
        OperatorConfig(workload_tolerations='[{"operator": "Equal"}]')  # no key needs Exists


def test_the_platforms_placement_reaches_job_and_serving_pods_and_a_bad_affinity_is_named() -> None:
    from metainfer.operator.config import ConfigError, OperatorConfig

    zone = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    config = OperatorConfig(
        workload_node_selector='{"pool": "inference"}',
        workload_affinity=json.dumps({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": zone}}),
        workload_priority_class_name="serving-high",
        workload_runtime_class_name="nvidia",
    )
    for pod in _pods((config.job_settings(), config.serving_defaults())):
        assert pod["nodeSelector"]["pool"] == "inference" and pod["priorityClassName"] == "serving-high"
        assert pod["runtimeClassName"] == "nvidia"
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert all(any(e["key"] == "zone" for e in t["matchExpressions"]) for t in terms)
    for pod in _pods((AgentJobSettings(), ServingDefaults())):
        assert "priorityClassName" not in pod and "runtimeClassName" not in pod
    fields = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}
    with pytest.raises(ConfigError, match=r"METAINFER_WORKLOAD_AFFINITY.*matchFields"):
        OperatorConfig(workload_affinity=json.dumps({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": fields}}))  # fmt: skip
    with pytest.raises(ConfigError, match=r"METAINFER_WORKLOAD_AFFINITY.*unknown keys"):
        OperatorConfig(workload_affinity='{"nodeAfinity": {}}')


def test_a_policys_scheduling_replaces_the_platforms_classes_in_its_job_and_serving_pods() -> None:
    from metainfer.operator.config import OperatorConfig

    config = OperatorConfig(
        workload_priority_class_name="batch-low",
        workload_runtime_class_name="nvidia",
        allowed_priority_classes=["serving-high"],
        allowed_toleration_keys=["nvidia.com/gpu"],
    )
    limits = config.platform_limits()
    assert limits.allowed_priority_classes == ["serving-high"] and limits.allowed_toleration_keys == ["nvidia.com/gpu"]
    assert OperatorConfig().platform_limits().allowed_toleration_keys == ["*"]
    settings = (config.job_settings(), config.serving_defaults())
    for pod in _pods(settings, scheduling={"priorityClassName": "serving-high"}):
        assert pod["priorityClassName"] == "serving-high", "the policy's class wins"
        assert pod["runtimeClassName"] == "nvidia", "the platform's where the policy names none"
    run = build_run(policy(scheduling={"runtimeClassName": "kata"}), gpu_group(), "NewHardwareClass")
    assert run["spec"]["scheduling"] == {"runtimeClassName": "kata"}, "the Job reads it from its run"
    assert "scheduling" not in build_run(policy(), gpu_group(), "NewHardwareClass")["spec"]
    assert build_run(policy(), gpu_group(), "NewHardwareClass")["metadata"]["name"] == run["metadata"]["name"], (
        "where pods are scheduled is not part of the adaptation: setting it must not re-adapt"
    )


def test_a_credentials_secret_is_mounted_read_only_into_the_job_and_every_serving_container() -> None:
    """The Secret the policy names reaches the agent, the serving container and a provisional check alike, at the
    path agent/object_store.py reads; the run carries it, so serving a run's model uses the run's credentials."""
    from metainfer.agent.object_store import CREDENTIALS_ENV

    group = gpu_group()
    model = {"uri": "s3://models/m.onnx", "sha256": "a" * 64, "credentials": {"secretName": "store-keys"}}
    p = policy(model=model)
    run = succeeded(build_run(p, group, "NewHardwareClass"))
    job_pod = build_job(run, group)["spec"]["template"]["spec"]
    serving_pod = build_deployment(p, group, run, provisional=True)["spec"]["template"]["spec"]
    for pod in (job_pod, serving_pod):
        assert {"name": "store-credentials", "secret": {"secretName": "store-keys"}} in pod["volumes"]
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            mount = next(m for m in container["volumeMounts"] if m["name"] == "store-credentials")
            assert mount["readOnly"] and mount["mountPath"].startswith("/var/run/secrets/")
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env[CREDENTIALS_ENV] == mount["mountPath"]
    plain = build_job(build_run(policy(), group, "NewHardwareClass"), group)["spec"]["template"]["spec"]
    assert "store-credentials" not in json.dumps(plain)


def test_the_platforms_proxy_and_workload_identity_reach_the_pods_only_when_set() -> None:
    from metainfer.operator.config import ConfigError, OperatorConfig

    config = OperatorConfig(workload_fetch_proxy="http://proxy.corp:3128", workload_fetch_no_proxy=".svc,10.0.0.0/8",
                            workload_store_workload_identity=True)  # fmt: skip
    group = gpu_group()
    run = succeeded(build_run(policy(), group, "NewHardwareClass"))
    job = build_job(run, group, config.job_settings())
    deployment = build_deployment(policy(), group, run, config.serving_defaults())
    for pod in (job["spec"]["template"]["spec"], deployment["spec"]["template"]["spec"]):
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == "http://proxy.corp:3128"
        assert env["NO_PROXY"] == ".svc,10.0.0.0/8" and env["METAINFER_STORE_AMBIENT_CREDENTIALS"] == "true"
    default = json.dumps(build_job(run, group, OperatorConfig().job_settings()))
    assert "HTTPS_PROXY" not in default and "METAINFER_STORE_AMBIENT_CREDENTIALS" not in default
    with pytest.raises(ConfigError, match="METAINFER_WORKLOAD_FETCH_PROXY"):
        OperatorConfig(workload_fetch_proxy="proxy.corp:3128")


# --- the image that serves a variant --------------------------------------------------------------------------------


def _image_of(c: Cluster) -> str:
    (deployment,) = c.deployments.values()
    image: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    return image


def _platform(c: Cluster, image: str, runtime: str) -> None:
    c.job_settings = AgentJobSettings(image=image, runtime=runtime)
    c.serving = ServingDefaults(image=image, runtime=runtime)


def test_a_new_runtime_re_adapts_while_the_image_that_validated_the_variant_keeps_serving_it() -> None:
    """A chart upgrade: a pod of another ONNX Runtime rebuilds a variant into other bytes and refuses it (exit 2),
    so the class keeps the run's own image until its re-adaptation under the new runtime is served. An upgrade
    that keeps the runtime re-adapts nothing and rolls the serving pods to the new image."""
    c = Cluster()
    _platform(c, "metainfer:1", "onnxruntime 1.20.0")
    c.reconcile({"c1": CPU})
    (first,) = c.runs
    assert c.runs[first]["spec"]["runtime"] == "onnxruntime 1.20.0" and c.runs[first]["spec"]["image"] == "metainfer:1"
    c.finish(first)
    c.reconcile({"c1": CPU})
    assert _image_of(c) == "metainfer:1"

    _platform(c, "metainfer:1.1", "onnxruntime 1.20.0")  # a re-tag: same runtime
    retag = c.reconcile({"c1": CPU})
    assert retag.runs_to_create == [] and _image_of(c) == "metainfer:1.1"

    _platform(c, "metainfer:2", "onnxruntime 1.22.0")
    upgrade = c.reconcile({"c1": CPU})
    assert [p.reason for p in upgrade.runs_to_create] == [Reason.RUNTIME_CHANGE]
    assert _image_of(c) == "metainfer:1", "the image that validated the variant serves it meanwhile"
    (second,) = (name for name in c.runs if name != first)
    assert c.runs[second]["spec"]["runtime"] == "onnxruntime 1.22.0"
    c.finish(second)
    c.reconcile({"c1": CPU})
    assert _image_of(c) == "metainfer:2"
    assert c.reconcile({"c1": CPU}).runs_to_create == []


def test_runs_recorded_before_runtimes_were_get_the_platforms_image() -> None:
    c = Cluster()
    c.reconcile({"c1": CPU})
    (run,) = c.runs
    assert c.runs[run]["spec"].get("runtime") is None  # no settings: tests, the demo
    c.finish(run)
    _platform(c, "metainfer:2", "onnxruntime 1.22.0")
    c.reconcile({"c1": CPU})
    assert _image_of(c) == "metainfer:2"
