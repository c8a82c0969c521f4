"""Names and manifests: deterministic, within Kubernetes limits, hardened, owned, valid against core.api."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from metainfer.core.api.names import LABEL_CLASS, LABEL_POLICY, LABEL_RUN_KEY
from metainfer.core.api.policy import AdaptationPolicy, ResourceRequirements
from metainfer.core.api.run import AdaptationRun, AdaptationRunSpec
from metainfer.core.api.security import ContainerSecurityContext, PodSecurityContext
from metainfer.core.control.hardware import classify_node, group_nodes
from metainfer.core.control.manifests import (
    build_deployment,
    build_disruption_budget,
    build_job,
    build_policy_service,
    build_run,
    build_service,
    policy_endpoint,
)
from metainfer.core.control.naming import JOB_MAX, canary_name, job_name, label_value, run_name, workload_name
from metainfer.core.control.runkey import run_key
from metainfer.core.control.settings import (
    DEFAULT_JOB_RESOURCES,
    SHUTDOWN_DELAY_MAX_ENV,
    TERMINATION_MARGIN_S,
    AgentJobSettings,
    ServingDefaults,
    merged_resources,
)
from metainfer.core.engine.recipe import QuantizationSpec, Recipe, TransformSpec

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
GPU = {
    "kubernetes.io/arch": "amd64",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
}
CPU = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}


def policy(name: str = "digits", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"uri": "https://models.example.com/digits.onnx", "sha256": "a" * 64, "version": "1"},
        "slo": {"latencyP95Ms": 10, "batchSize": 1},
        "hardware": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        "search": {"timeBudgetSeconds": 600, "backoffLimit": 3},
    }
    return {
        "apiVersion": "metainfer.io/v1alpha1",
        "kind": "AdaptationPolicy",
        "metadata": {"name": name, "namespace": "team-a", "uid": "uid-policy", "generation": 3},
        "spec": {**base, **spec},
    }


def gpu_group():  # type: ignore[no-untyped-def]
    return next(iter(group_nodes([("gpu-1", GPU), ("gpu-2", GPU)]).values()))


def succeeded(run: dict[str, Any]) -> dict[str, Any]:
    recipe = Recipe(transform=TransformSpec(quantization=QuantizationSpec(mode="int8_dynamic")))
    return {
        **run,
        "metadata": {**run["metadata"], "uid": "uid-run"},
        "status": {
            "phase": "Succeeded",
            "bestRecipe": recipe.model_dump(mode="json"),
            "bestRecipeKey": recipe.key(),
            "bestMetrics": {"p95Ms": 3.5, "qualityDrop": 0.001},
            "completionTime": "2026-01-01T00:10:00Z",
        },
    }


# --- naming ---------------------------------------------------------------------------------------------------------


def test_names_are_deterministic_valid_and_bounded() -> None:
    cls = classify_node(GPU).hardware_class.name()
    assert run_name("digits", cls, "0123456789abcdef") == run_name("digits", cls, "0123456789abcdef")
    assert run_name("digits", cls, "0123456789abcdef") != run_name("digits", cls, "fedcba9876543210")
    long_policy = "p" * 253
    for name in (
        run_name(long_policy, cls, "k" * 16),
        job_name("j" * 100),
        workload_name(long_policy, cls),
        canary_name(long_policy, cls),
        label_value("v" * 200),
    ):
        assert DNS_LABEL.match(name) and len(name) <= 63, name
    assert len(run_name(long_policy, cls, "k" * 16)) <= JOB_MAX and len(job_name("j" * 100)) <= JOB_MAX
    assert canary_name("digits", cls).endswith("-canary")
    assert workload_name("9lives", cls)[0].isalpha()  # Service names are DNS-1035 labels


def test_long_names_sharing_a_prefix_do_not_collide() -> None:
    prefix = "a-very-long-policy-name-" * 5
    names = {workload_name(prefix + str(i), "cpu-generic-0123abcd") for i in range(200)}
    assert len(names) == 200
    assert workload_name("a-b", "c") != workload_name("a", "b-c")
    runs = {run_name(prefix, "cpu-generic-0123abcd", f"{i:016x}") for i in range(200)}
    assert len(runs) == 200


# --- run ------------------------------------------------------------------------------------------------------------


def test_run_key_changes_with_model_batch_class_and_search_but_not_serving() -> None:
    p = policy()
    key = run_key(p["spec"], 3, "0" * 16)
    assert run_key(p["spec"], 4, "0" * 16) == key  # generation alone (e.g. replicas edited) re-adapts nothing
    assert run_key(policy(serving={"replicas": 5})["spec"], 3, "0" * 16) == key
    assert run_key(p["spec"], 3, "1" * 16) != key
    assert run_key({**p["spec"], "model": {**p["spec"]["model"], "sha256": "b" * 64}}, 3, "0" * 16) != key
    assert run_key({**p["spec"], "slo": {"latencyP95Ms": 10, "batchSize": 8}}, 3, "0" * 16) != key
    assert run_key({**p["spec"], "search": {"trialBudget": 99}}, 3, "0" * 16) != key
    # The runtime the platform's image runs salts it: another ONNX Runtime re-adapts, the same one changes nothing.
    with_runtime = run_key(p["spec"], 3, "0" * 16, runtime="onnxruntime 1.20.0")
    assert with_runtime != key and with_runtime == run_key(p["spec"], 3, "0" * 16, runtime="onnxruntime 1.20.0")
    assert run_key(p["spec"], 3, "0" * 16, runtime="onnxruntime-gpu 1.20.0") != with_runtime


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


def _pods(settings: tuple[AgentJobSettings, ServingDefaults], **spec: Any) -> list[dict[str, Any]]:
    """The Job's and the Deployment's pod specs for one GPU class, built with ``settings``."""
    group, p = gpu_group(), policy(**spec)
    run = succeeded(build_run(p, group, "NewHardwareClass"))
    job, dep = build_job(run, group, settings[0]), build_deployment(p, group, run, settings[1])
    return [job["spec"]["template"]["spec"], dep["spec"]["template"]["spec"]]


def test_jobs_are_guaranteed_qos_by_default() -> None:
    """requests == limits for every resource (cpu and memory from the platform, the class's GPU): the kubelet gives
    the pod Guaranteed QoS, so its latency measurements do not depend on what else runs on the node."""
    assert DEFAULT_JOB_RESOURCES.requests == DEFAULT_JOB_RESOURCES.limits
    cpu_group = next(iter(group_nodes([("c", CPU)]).values()))
    for group in (gpu_group(), cpu_group):
        run = build_run(policy(), group, "NewHardwareClass")
        run["metadata"]["uid"] = "u"
        (c,) = build_job(run, group)["spec"]["template"]["spec"]["containers"]
        requests, limits = c["resources"]["requests"], c["resources"]["limits"]
        assert requests == limits and {"cpu", "memory"} <= requests.keys()
        assert all(isinstance(q, str) for q in requests.values()), "the Kubernetes client refuses int quantities"
    platform = AgentJobSettings(resources=ResourceRequirements(requests={"cpu": 4}, limits={"cpu": 4}))
    (job_pod, _) = _pods((platform, ServingDefaults()))
    assert job_pod["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "4", "nvidia.com/gpu": "1"},
    }


def test_serving_resources_the_policy_names_win_the_rest_are_the_platforms() -> None:
    platform = ResourceRequirements(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "2Gi"})
    assert merged_resources(None, platform) == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "2Gi"},
    }
    # A memory request above the platform's memory limit: the platform's limit must not come with it (the API
    # server would refuse requests > limits), so memory is the policy's alone.
    own = ResourceRequirements(requests={"memory": "8Gi"})
    assert merged_resources(own, platform) == {"requests": {"cpu": "1", "memory": "8Gi"}, "limits": {"cpu": "1"}}
    own = ResourceRequirements(limits={"cpu": "3", "ephemeral-storage": "1Gi"})
    assert merged_resources(own, platform) == {
        "requests": {"memory": "1Gi"},
        "limits": {"memory": "2Gi", "cpu": "3", "ephemeral-storage": "1Gi"},
    }
    assert merged_resources(own, None) == {"limits": {"cpu": "3", "ephemeral-storage": "1Gi"}}
    assert merged_resources(None, None) == {}
    settings = (AgentJobSettings(), ServingDefaults(resources=platform))
    (_, silent) = _pods(settings)
    assert silent["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}
    (_, named) = _pods(settings, serving={"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}})
    assert named["containers"][0]["resources"] == {
        "requests": {"memory": "1Gi", "cpu": "2", "nvidia.com/gpu": "1"},
        "limits": {"memory": "2Gi", "cpu": "2", "nvidia.com/gpu": "1"},
    }


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


@pytest.mark.parametrize(
    ("model", "value", "why"),
    [
        (PodSecurityContext, {"runAsUsr": 1000}, "runAsUsr"),  # a typo is an error, not a silent default
        (PodSecurityContext, {"runAsUser": -1}, "runAsUser"),
        (PodSecurityContext, {"runAsNonRoot": True, "runAsUser": 0}, "can never start"),
        (PodSecurityContext, {"seccompProfile": {"type": "Default"}}, "seccompProfile"),
        (ContainerSecurityContext, {"privileged": True, "allowPrivilegeEscalation": False}, "allowPrivilegeEscalation"),
        (ContainerSecurityContext, {"capabilities": {"drop": "ALL"}}, "drop"),
    ],
)
def test_security_contexts_refuse_what_kubernetes_would(model: type, value: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        model.model_validate(value)


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


def test_a_model_volume_cannot_hide_the_variant_store() -> None:
    with pytest.raises(ValidationError, match="must not be"):
        AdaptationPolicy.model_validate(
            policy(model={"uri": "file:///x/m.onnx", "sha256": "a" * 64,
                          "volume": {"claimName": "m", "mountPath": "/var/lib/metainfer/variants"}})
        )  # fmt: skip


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


def test_a_terminating_serving_pod_answers_then_drains_within_its_grace_period() -> None:
    """Make-before-break on pod replacement: serve gets the platform's shutdown delay and drain timeout, and the
    kubelet's SIGKILL comes only after the longest delay, the drain and a margin (55 s with the defaults). The
    longest delay is an environment variable, not a flag: an older serving image ignores it."""
    from metainfer.agent.serve.flags import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    group = gpu_group()
    p = policy()
    run = succeeded(build_run(p, group, "NewHardwareClass"))
    cases = (
        (ServingDefaults(), 55),
        (ServingDefaults(shutdown_delay_seconds=0), 25),  # no delay: its maximum lengthens nothing
        (ServingDefaults(shutdown_delay_seconds=2.5, drain_timeout_seconds=60), 95),
        (ServingDefaults(shutdown_delay_seconds=2.5, shutdown_delay_max_seconds=0.5), 28),  # never under the delay
        (ServingDefaults(shutdown_delay_max_seconds=90, drain_timeout_seconds=10), 105),
    )
    for settings, grace in cases:
        pod = build_deployment(p, group, run, settings)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = parser.parse_args(container["args"][1:])
        assert args.shutdown_delay_max is None, "a flag an older serving image would refuse"
        env = {e["name"]: e["value"] for e in container["env"]}
        longest = float(env[SHUTDOWN_DELAY_MAX_ENV])
        assert (args.shutdown_delay, longest, args.drain_timeout) == (
            settings.shutdown_delay_seconds,
            settings.shutdown_delay_max_seconds,
            settings.drain_timeout_seconds,
        )
        assert pod["terminationGracePeriodSeconds"] == grace == settings.termination_grace_seconds()
        longest_delay = max(args.shutdown_delay, longest) if args.shutdown_delay else 0
        assert grace >= longest_delay + args.drain_timeout + TERMINATION_MARGIN_S
    assert ServingDefaults().shutdown_delay_seconds > 0, "by default a terminating pod keeps answering a while"
    for bad in (
        {"shutdown_delay_seconds": -1},
        {"drain_timeout_seconds": 0},
        {"shutdown_delay_seconds": "inf"},
        {"shutdown_delay_max_seconds": -1},
        {"shutdown_delay_max_seconds": "inf"},
    ):
        with pytest.raises(ValidationError):
            ServingDefaults.model_validate(bad)


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


def test_the_platforms_vendor_images_reach_job_and_serving_settings_and_cpu_is_not_a_vendor_image() -> None:
    from metainfer.operator.config import ConfigError, OperatorConfig

    images = {"nvidia": {"image": "r/metainfer:1-cuda", "runtime": "onnxruntime-gpu 1.31.1"}}
    config = OperatorConfig(agent_image="r/metainfer:1", agent_images=json.dumps(images))
    for settings in (config.job_settings(), config.serving_defaults()):
        nvidia = settings.for_vendor("nvidia")
        assert nvidia is not None and (nvidia.image, nvidia.runtime) == ("r/metainfer:1-cuda", "onnxruntime-gpu 1.31.1")
        assert settings.for_vendor("amd") is None and settings.for_vendor("cpu") is settings
    # Unset: no accelerator vendor has an image, so none is run on the CPU image.
    assert OperatorConfig().job_settings().for_vendor("nvidia") is None
    with pytest.raises(ConfigError, match=r"METAINFER_AGENT_IMAGES: .*cpu classes run agent_image"):
        OperatorConfig(agent_images='{"cpu": {"image": "x"}}')
    with pytest.raises(ConfigError, match="METAINFER_AGENT_IMAGES"):
        OperatorConfig(agent_images='{"nvida": {"image": "x"}}')
    with pytest.raises(ConfigError, match="METAINFER_AGENT_IMAGES: not valid JSON"):
        OperatorConfig(agent_images="{nvidia")


def test_the_platforms_tolerations_reach_job_and_serving_pods_after_the_policys() -> None:
    from metainfer.operator.config import ConfigError, OperatorConfig

    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    config = OperatorConfig(workload_tolerations=json.dumps([gpu]))
    assert config.platform_tolerations() == (gpu,)
    for pod in _pods((config.job_settings(), config.serving_defaults())):
        assert gpu in pod["tolerations"]
    with pytest.raises(ConfigError, match="METAINFER_WORKLOAD_TOLERATIONS"):
        OperatorConfig(workload_tolerations='[{"operator": "Equal"}]')  # no key needs Exists


def test_the_runtime_is_read_from_the_installed_distribution_without_importing_onnxruntime() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from metainfer.core.engine.runtime_identity import runtime_identity as r; "
        "print(r()); print('onnxruntime' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import onnxruntime

    assert out[-1] == "False" and f"onnxruntime {onnxruntime.__version__}" in " ".join(out[:-1])


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


def test_a_spec_field_added_later_moves_no_run_key_until_it_is_set() -> None:
    p = policy()
    key = run_key(p["spec"], 3, "0" * 16)
    assert key == "f4160a6f0d8a5045"  # pinned: what the release before slo.qualityMetric and quantizers gave it
    assert run_key({**p["spec"], "slo": {**p["spec"]["slo"], "qualityMetric": "auto"}}, 3, "0" * 16) == key
    chosen = {**p["spec"], "slo": {**p["spec"]["slo"], "qualityMetric": "argmax_agreement"}}
    assert run_key(chosen, 3, "0" * 16) != key
    nncf = {**p["spec"], "searchSpace": {**p["spec"].get("searchSpace", {}), "quantizers": ["nncf"]}}
    assert run_key(nncf, 3, "0" * 16) != key
    tf32 = {**p["spec"], "searchSpace": {**p["spec"].get("searchSpace", {}), "cudaTf32": [False]}}
    assert run_key(tf32, 3, "0" * 16) != key


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


def test_naming_or_rotating_a_credentials_secret_re_adapts_nothing() -> None:
    model = {"uri": "s3://models/m.onnx", "sha256": "a" * 64}
    keys = {run_key(policy(model={**model, **extra})["spec"], 1, "fp") for extra in
            ({}, {"credentials": {"secretName": "keys"}}, {"credentials": {"secretName": "rotated"}})}  # fmt: skip
    assert len(keys) == 1
