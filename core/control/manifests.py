"""Pure builders of the objects the operator sends to the API server.

Each builder takes the policy or run as core.api's model (or as the plain dict
the API server returns, validated on the way in) and a ClassGroup, and returns
a plain dict, so unit tests check every field without a cluster and the
handlers stay thin. Specs go through core.api's pydantic types (camelCase,
validated) so a builder can never emit a run the CRD rejects.

Everything a builder emits is owned: runs and serving objects by the policy,
Jobs by their run, so deleting a policy garbage-collects all of it. Pods get
the image, resources and security contexts of the operator's settings
(core.control.settings; hardened by default, core.api.security) and writable
emptyDirs only at /tmp and the cache.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from metainfer.core.api.names import (
    ANNOTATION_CLASS_NAME,
    ANNOTATION_DRIFT_EPOCH,
    ANNOTATION_RERUN,
    ANNOTATION_TOLERATIONS,
    API_VERSION,
    COMPONENT,
    LABEL_CLASS,
    LABEL_POLICY,
    LABEL_PROVISIONAL,
    LABEL_RECIPE_KEY,
    LABEL_RUN,
    LABEL_RUN_KEY,
    LABEL_TRACK,
    MANAGED_BY,
    PRODUCT,
    RUN_KIND,
)
from metainfer.core.api.pod_contract import (
    AGENT_COMMAND,
    AGENT_RUN_COMMAND,
    CACHE_DIR,
    CHECK_PROVISIONAL_COMMAND,
    CONFIGMAP_MOUNT,
    ENV_CLASS,
    ENV_FETCH_ALLOW_CIDRS,
    ENV_NAMESPACE,
    ENV_NODE_NAME,
    ENV_POD_NAME,
    ENV_POLICY,
    ENV_RECIPE_KEY,
    ENV_RUN,
    ENV_SHUTDOWN_DELAY_MAX,
    ENV_STORE_AMBIENT_CREDENTIALS,
    ENV_STORE_CREDENTIALS,
    ENV_VARIANT,
    ENV_VARIANT_STORE,
    FLAG_BATCH_DEPENDENT,
    FLAG_CALIBRATION_SAMPLES,
    FLAG_DATA_SHA256,
    FLAG_DATA_URI,
    FLAG_DRAIN_TIMEOUT,
    FLAG_GRPC_PORT,
    FLAG_LATENCY_P95_MS,
    FLAG_MAX_QUALITY_DROP,
    FLAG_MAX_QUEUE_DELAY_MS,
    FLAG_MODEL_SHA256,
    FLAG_MODEL_URI,
    FLAG_OUT,
    FLAG_PORT,
    FLAG_QUALITY_METRIC,
    FLAG_RECIPE,
    FLAG_RECIPE_JSON,
    FLAG_SHUTDOWN_DELAY,
    FLAG_VARIANT,
    FLAG_VARIANT_SHA256,
    FLAG_VARIANT_STORE,
    GRPC_PORT,
    HTTP_PORT,
    PROGRAM,
    PROVISIONAL_MOUNT,
    PROVISIONAL_RECIPE_FILE,
    PROVISIONAL_VARIANT_FILE,
    SERVE_COMMAND,
    STORE_CREDENTIALS_MOUNT,
    VARIANT_STORE_MOUNT,
)
from metainfer.core.api.policy import (
    AdaptationPolicy,
    ModelVolume,
    PolicyScheduling,
    Slo,
    StoreCredentials,
    VariantStore,
)
from metainfer.core.api.run import AdaptationRun, AdaptationRunSpec
from metainfer.core.api.vocabulary import RunTrigger
from metainfer.core.control.hardware import ClassGroup
from metainfer.core.control.naming import (
    canary_name,
    job_name,
    label_value,
    policy_service_name,
    run_name,
    workload_name,
)
from metainfer.core.control.objects import (
    ApiObject,
    annotation_of,
    as_policy,
    as_run,
    generation_of,
    label_of,
    name_of,
    namespace_of,
    recipe_key,
    uid_of,
    variant_key,
)
from metainfer.core.control.pod_checks import CHECK_CONTAINER
from metainfer.core.control.runkey import run_key
from metainfer.core.control.schedulability import merged_affinity
from metainfer.core.control.settings import (
    AgentJobSettings,
    ServingDefaults,
    WorkloadSettings,
    merged_resources,
)
from metainfer.core.engine.recipe import COMPUTED_FIELDS

# Kubernetes' own node label (not one of ours, so not in core/api/names.py): serving replicas spread over it.
LABEL_HOSTNAME = "kubernetes.io/hostname"
# The command lines, environment variables, mount paths and ports of the pods are the pod contract
# (core.api.pod_contract), imported above; HTTP_PORT, GRPC_PORT, CACHE_DIR and the *_MOUNT paths stay importable
# from here.
DEADLINE_MARGIN_S = 600


def owner_reference(obj: ApiObject) -> dict[str, Any]:
    return {
        "apiVersion": obj.api_version,
        "kind": obj.kind,
        "name": name_of(obj),
        "uid": uid_of(obj),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def class_labels(policy_name: str, group: ClassGroup) -> dict[str, str]:
    """Labels every child of (policy, class) carries; the operator lists children by them."""
    return {MANAGED_BY: PRODUCT, LABEL_POLICY: label_value(policy_name), LABEL_CLASS: group.fingerprint}


def build_run(
    policy: AdaptationPolicy | Mapping[str, Any],
    group: ClassGroup,
    reason: str,
    drift_epoch: str | None = None,
    history_from: Sequence[str] = (),
    rerun: str | None = None,
    *,
    settings: AgentJobSettings | None = None,
    serving_memory_limit_mib: int | None = None,
) -> dict[str, Any]:
    """The AdaptationRun for (policy, class) at the policy's current spec; its name is deterministic. The run
    records the image its Job runs and that image's runtime (``settings``), so the variant it validates can be
    served by that image for as long as the platform's image runs another runtime (``serving_image``), and the
    memory limit the class's serving pods run under (core.control.memory_bound), which bounds its search."""
    policy = as_policy(policy)
    spec, name, generation = policy.spec, name_of(policy), generation_of(policy)
    runtime = settings.runtime if settings else None
    key = run_key(spec, generation, group.fingerprint, drift_epoch, rerun, runtime)
    run_spec = AdaptationRunSpec(
        policy_name=name,
        policy_generation=generation,
        class_fingerprint=group.fingerprint,
        hardware_class=group.hardware_class,
        class_description=group.hardware_class.description(),
        model_sha256=spec.model.sha256,
        batch_size=spec.slo.batch_size,
        reason=RunTrigger(reason),
        model=spec.model,
        slo=spec.slo,
        objective=spec.objective,
        search_space=spec.search_space,
        search=spec.search,
        variant_store=spec.serving.variant_store,
        history_from=list(history_from),
        runtime=runtime,
        image=settings.image if settings else None,
        scheduling=spec.scheduling if spec.scheduling != PolicyScheduling() else None,
        serving_memory_limit_mib=serving_memory_limit_mib,
    )
    tolerations = [t.to_api() for t in spec.hardware.tolerations or []]
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {
            "name": run_name(name, group.hardware_class.name(), key),
            "namespace": namespace_of(policy),
            "labels": {**class_labels(name, group), LABEL_RUN_KEY: key},
            # Not in the run spec (core.api has no field for them yet): the Job builder reads them from here.
            "annotations": {
                ANNOTATION_TOLERATIONS: json.dumps(tolerations, separators=(",", ":")),
                ANNOTATION_CLASS_NAME: group.hardware_class.name(),
                **({ANNOTATION_DRIFT_EPOCH: drift_epoch} if drift_epoch else {}),
                **({ANNOTATION_RERUN: rerun} if rerun else {}),
            },
            "ownerReferences": [owner_reference(policy)],
        },
        "spec": run_spec.to_api(),
    }


def build_job(
    run: AdaptationRun | Mapping[str, Any], group: ClassGroup, settings: AgentJobSettings | None = None
) -> dict[str, Any]:
    """The Job running ``metainfer agent run NS/RUN`` on the run's class, owned by the run."""
    settings = settings or AgentJobSettings()
    run = as_run(run)
    spec = run.spec
    name, namespace = name_of(run), namespace_of(run)
    labels = {
        **class_labels(spec.policy_name, group),
        COMPONENT: "adaptation",
        LABEL_RUN: label_value(name),
        LABEL_RUN_KEY: label_of(run, LABEL_RUN_KEY) or "",
    }
    tolerations = json.loads(annotation_of(run, ANNOTATION_TOLERATIONS) or "[]")
    deadline = spec.search.active_deadline_seconds or spec.search.time_budget_seconds + DEADLINE_MARGIN_S
    env: list[dict[str, Any]] = [
        {"name": ENV_RUN, "value": f"{namespace}/{name}"},
        {"name": ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    container = _container(
        "agent",
        settings,
        group,
        image=settings.image,
        resources=merged_resources(None, settings.resources),  # the policy has no field for the Job's resources
        command=[PROGRAM, AGENT_COMMAND, AGENT_RUN_COMMAND, f"{namespace}/{name}"],
        env=env,
    )
    tolerations = [*tolerations, *settings.tolerations]
    pod = _pod_spec(
        container, group, settings, settings.service_account, tolerations, spec.model.volume, spec.scheduling
    )
    pod |= {"restartPolicy": "Never", "automountServiceAccountToken": True}  # the agent writes the run's status
    if spec.model.credentials is not None:
        _mount_store_credentials(pod, container, spec.model.credentials)
    if spec.variant_store is not None:
        _mount_variant_store(pod, container, spec.variant_store, read_only=False)
        container["env"].append({"name": ENV_VARIANT_STORE, "value": VARIANT_STORE_MOUNT})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(run)],
        },
        "spec": {
            "backoffLimit": spec.search.backoff_limit,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "completions": 1,
            "parallelism": 1,
            # A drained or preempted node is not the run's fault: do not spend a retry on it.
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def serving_image(run: AdaptationRun, settings: ServingDefaults) -> str:
    """The image that serves ``run``'s variant: the platform's, unless the run was made under another runtime and
    recorded its own image. A pod of a new runtime rebuilds the variant into other bytes and refuses to serve it
    (exit 2), so a chart upgrade that changes the runtime would stall every rollout on it; instead the class
    keeps the image that validated its variant until its re-adaptation under the new runtime (the run key
    includes it) is served. A run with no recorded runtime (made before runs recorded one) gets the platform's."""
    recorded = run.spec.runtime
    if recorded and run.spec.image and settings.runtime and recorded != settings.runtime:
        return run.spec.image
    return settings.image


def serving_labels(policy_name: str, group: ClassGroup) -> dict[str, str]:
    """What the Service selects: stable and canary pods of (policy, class) alike."""
    return {**class_labels(policy_name, group), COMPONENT: "serving"}


def build_deployment(
    policy: AdaptationPolicy | Mapping[str, Any],
    group: ClassGroup,
    run: AdaptationRun | Mapping[str, Any],
    settings: ServingDefaults | None = None,
    *,
    track: Literal["stable", "canary"] = "stable",
    replicas: int | None = None,
    provisional: bool = False,
) -> dict[str, Any]:
    """The Deployment of (policy, class) serving the best recipe of a succeeded ``run``.

    ``track`` canary gives the canary beside the stable one: its own name (``canary_name``), its own selector
    (the track label), ``replicas`` (the policy's rollout.canaryReplicas), the same class pinning; the Service
    selects both tracks.

    ``provisional``: ``run`` is another class's (core.control.provisional). An init container checks its variant
    on the node against the policy's SLO first (``metainfer check-provisional``) and leaves it, or the FP32 model
    if it fails, for the serving container; its termination message says which, for the operator to read.
    """
    settings = settings or ServingDefaults()
    policy, run = as_policy(policy), as_run(run)
    spec, policy_name, namespace = policy.spec, name_of(policy), namespace_of(policy)
    # The model is the one the run adapted, not the policy's current one: while a re-adaptation for a new model
    # is under way, the stable Deployment keeps serving the old model with the recipe found for it.
    model = run.spec.model
    recipe = run.status.best_recipe if run.status else None
    if recipe is None:
        raise ValueError(f"run {name_of(run)} has no best recipe to serve")
    key = recipe_key(run)
    namer = canary_name if track == "canary" else workload_name
    name = namer(policy_name, group.hardware_class.name())
    selector = {**serving_labels(policy_name, group), LABEL_TRACK: track}
    labels = {**selector, LABEL_RECIPE_KEY: label_value(key), LABEL_RUN: label_value(name_of(run))}
    if provisional:
        labels[LABEL_PROVISIONAL] = "true"
    cm_volumes: list[tuple[dict[str, Any], dict[str, Any]]] = []
    model_uri = _served_uri(model.uri, cm_volumes)
    source = [FLAG_MODEL_URI, model_uri, FLAG_MODEL_SHA256, model.sha256]
    variant_args = [FLAG_RECIPE_JSON, recipe.model_dump_json(exclude=set(COMPUTED_FIELDS))]
    variant_sha256 = run.status.best_variant_sha256 if run.status else None
    store = run.spec.variant_store if variant_sha256 else None  # the store is addressed by the sha256
    if variant_sha256:  # serve loads these bytes from the store, or rebuilds and checks it got them
        variant_args += [FLAG_VARIANT_SHA256, variant_sha256]
    if store is not None:
        variant_args += [FLAG_VARIANT_STORE, VARIANT_STORE_MOUNT]
    if model.data is not None and (provisional or recipe.transform.quantization.mode == "int8_static"):
        # A static int8 variant is a function of its calibration samples too: serve rebuilds it from the same head.
        # The on-node check measures quality on them.
        data_uri = _served_uri(model.data.uri, cm_volumes)
        variant_args += [FLAG_DATA_URI, data_uri, FLAG_CALIBRATION_SAMPLES, str(model.data.calibration_samples)]
        variant_args += [FLAG_DATA_SHA256, model.data.sha256] if model.data.sha256 else []
    # A provisional pod serves what its check left (FLAG_OUT) in PROVISIONAL_MOUNT: the variant, or the FP32 model.
    recipe_file, variant_file = (
        f"{PROVISIONAL_MOUNT}/{PROVISIONAL_RECIPE_FILE}",
        f"{PROVISIONAL_MOUNT}/{PROVISIONAL_VARIANT_FILE}",
    )
    served = [FLAG_RECIPE, recipe_file, FLAG_VARIANT, variant_file] if provisional else variant_args
    args = [
        SERVE_COMMAND,
        *source,
        *served,
        FLAG_PORT, str(HTTP_PORT),
        FLAG_GRPC_PORT, str(GRPC_PORT),
        # A terminating pod answers while the endpoints drop it, then drains, within its grace period (below).
        FLAG_SHUTDOWN_DELAY, f"{settings.shutdown_delay_seconds:g}",
        FLAG_DRAIN_TIMEOUT, f"{settings.drain_timeout_seconds:g}",
    ]  # fmt: skip
    if spec.serving.max_queue_delay_ms is not None:
        args += [FLAG_MAX_QUEUE_DELAY_MS, f"{spec.serving.max_queue_delay_ms:g}"]
    if spec.serving.batch_dependent is not None:
        args += [FLAG_BATCH_DEPENDENT, spec.serving.batch_dependent]
    env = [
        {"name": ENV_POLICY, "value": policy_name},
        {"name": ENV_NAMESPACE, "value": namespace},
        {"name": ENV_CLASS, "value": group.fingerprint},
        {"name": ENV_RECIPE_KEY, "value": key},
        {"name": ENV_VARIANT, "value": variant_key(run)},
        {"name": ENV_SHUTDOWN_DELAY_MAX, "value": f"{settings.shutdown_delay_max_seconds:g}"},
    ]
    container = _container(
        "server",
        settings,
        group,
        image=spec.serving.image or serving_image(run, settings),
        resources=merged_resources(spec.serving.resources, settings.resources),
        env=env,
    )
    container |= {
        "command": [PROGRAM],
        "args": args,
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": _probe("/v2/health/ready", period=5),
        "livenessProbe": _probe("/v2/health/live", period=10, failures=6),
    }
    tolerations = [*(t.to_api() for t in spec.hardware.tolerations or []), *settings.tolerations]
    pod = _pod_spec(container, group, settings, settings.service_account, tolerations, model.volume, spec.scheduling)
    pod["automountServiceAccountToken"] = False  # serving never talks to the API server
    # The Secret the policy names now (a rotated one, say), else the run's: the run key leaves credentials out.
    if (credentials := spec.model.credentials or model.credentials) is not None:
        _mount_store_credentials(pod, container, credentials)
    pod["terminationGracePeriodSeconds"] = settings.termination_grace_seconds()
    # A Deployment's replicas spread over the class's nodes, so draining one node (a driver upgrade does, node by
    # node) leaves replicas serving on the others. ScheduleAnyway: a class of one node still gets every replica.
    pod["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": LABEL_HOSTNAME,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        }
    ]
    # With a check, its init container reads the variant and the data; the serving container only what it left.
    reader = container
    if provisional:
        reader = _provisional_check(pod, container, [*source, *variant_args], spec.slo)
    if store is not None:
        _mount_variant_store(pod, reader, store, read_only=True)
    for volume, mount in cm_volumes:
        pod["volumes"].append(volume)
        container["volumeMounts"].append(mount)
        if reader is not container:
            reader["volumeMounts"].append(mount)
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(HTTP_PORT),
        "prometheus.io/path": "/metrics",
        LABEL_RECIPE_KEY: key,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "ownerReferences": [owner_reference(policy)]},
        "spec": {
            "replicas": spec.serving.replicas if replicas is None else replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod},
        },
    }  # fmt: skip


def _provisional_check(
    pod: dict[str, Any], container: dict[str, Any], variant_args: list[str], slo: Slo
) -> dict[str, Any]:
    """Add the init container that checks another class's variant on the node (``metainfer check-provisional``)
    and the emptyDir where it leaves what the serving ``container`` serves; returns the init container."""
    budget = [FLAG_MAX_QUALITY_DROP, repr(slo.max_quality_drop), FLAG_LATENCY_P95_MS, repr(slo.serving_p95_ms)]
    if slo.quality_metric != "auto":  # only then: pods of policies that never chose one keep their template
        budget += [FLAG_QUALITY_METRIC, slo.quality_metric]
    check = {
        **container,
        "name": CHECK_CONTAINER,
        "args": [CHECK_PROVISIONAL_COMMAND, *variant_args, *budget, FLAG_OUT, PROVISIONAL_MOUNT],
        "volumeMounts": [*container["volumeMounts"], {"name": "provisional", "mountPath": PROVISIONAL_MOUNT}],
        # The operator reads what the check found from here (core.control.provisional.read_checks).
        "terminationMessagePolicy": "File",
    }
    for key in ("ports", "readinessProbe", "livenessProbe"):
        check.pop(key, None)
    container["volumeMounts"].append({"name": "provisional", "mountPath": PROVISIONAL_MOUNT, "readOnly": True})
    pod["volumes"].append({"name": "provisional", "emptyDir": {}})
    pod["initContainers"] = [check]
    return check


def _served_uri(uri: str, volumes: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """configmap://NAME/KEY becomes a mounted file: serving pods have no API token to read ConfigMaps."""
    if not uri.startswith("configmap://"):
        return uri
    name, _, key = uri.removeprefix("configmap://").partition("/")
    volume_name = f"cm-{len(volumes)}"
    mount_path = f"{CONFIGMAP_MOUNT}/{volume_name}"
    volumes.append((
        {"name": volume_name, "configMap": {"name": name}},
        {"name": volume_name, "mountPath": mount_path, "readOnly": True},
    ))  # fmt: skip
    return f"file://{mount_path}/{key}"


def build_service(policy: AdaptationPolicy | Mapping[str, Any], group: ClassGroup) -> dict[str, Any]:
    """ClusterIP Service in front of the (policy, class) serving pods: REST on 8080, gRPC on 8081 (the port named
    ``grpc``, which is how meshes such as Istio tell that it speaks HTTP/2)."""
    policy = as_policy(policy)
    name = name_of(policy)
    return _serving_service(policy, workload_name(name, group.hardware_class.name()), serving_labels(name, group))


def build_disruption_budget(policy: AdaptationPolicy | Mapping[str, Any], group: ClassGroup) -> dict[str, Any]:
    """A PodDisruptionBudget over the (policy, class) serving pods, stable and canary alike, named like the class's
    Service: a node drain evicts at most one of them at a time, so a class served by several replicas never loses
    all of them to one ``kubectl drain`` (a single replica may still go: nothing else could replace it on a drained
    node anyway, and a budget of zero would block the drain for good)."""
    policy = as_policy(policy)
    name = name_of(policy)
    labels = serving_labels(name, group)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": workload_name(name, group.hardware_class.name()),
            "namespace": namespace_of(policy),
            "labels": labels,
            "ownerReferences": [owner_reference(policy)],
        },
        # maxUnavailable, not minAvailable: it follows the replica count as the policy changes it, and
        # AlwaysAllow lets a drain evict a pod that never became Ready (a crashing pod must not block a drain).
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}, "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def class_serving_objects(
    policy: AdaptationPolicy | Mapping[str, Any], group: ClassGroup
) -> tuple[dict[str, Any], ...]:
    """What a serving class has beside its Deployments, created if absent: its Service and its disruption budget."""
    return build_service(policy, group), build_disruption_budget(policy, group)


def policy_serving_labels(policy_name: str) -> dict[str, str]:
    """What the policy's own Service selects: the serving pods of every class of the policy, stable and canary."""
    return {MANAGED_BY: PRODUCT, LABEL_POLICY: label_value(policy_name), COMPONENT: "serving"}


def build_policy_service(policy: AdaptationPolicy | Mapping[str, Any]) -> dict[str, Any]:
    """The policy's one stable address: a ClusterIP Service named after the policy (``policy_service_name``) in
    front of every Ready serving pod of every class, REST on 8080 and gRPC on 8081.

    Classes come and go with hardware and drivers, and their Services with them; this one stays for the policy's
    life (owned by it), so a client never has to rediscover where the policy serves. Traffic spreads over the Ready
    pods of all classes and tracks, so the canary's share is its share of the pods, as the policy sets it.
    """
    policy = as_policy(policy)
    name = name_of(policy)
    return _serving_service(policy, policy_service_name(name), policy_serving_labels(name))


def _serving_service(policy: AdaptationPolicy, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A ClusterIP Service owned by ``policy``, selecting (and labelled with) ``labels``, on serve's two ports."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace_of(policy),
            "labels": labels,
            "ownerReferences": [owner_reference(policy)],
        },
        "spec": {
            "type": "ClusterIP",
            "selector": dict(labels),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
            ],
        },
    }


def policy_endpoint(policy: AdaptationPolicy | Mapping[str, Any]) -> str:
    """The in-cluster address of ``build_policy_service``'s Service, as status.endpoint shows it."""
    policy = as_policy(policy)
    return f"{policy_service_name(name_of(policy))}.{namespace_of(policy)}.svc:{HTTP_PORT}"


def _container(
    name: str,
    settings: WorkloadSettings,
    group: ClassGroup,
    *,
    image: str,
    resources: dict[str, dict[str, str]],
    env: list[dict[str, Any]],
    command: list[str] | None = None,
) -> dict[str, Any]:
    resources = {k: dict(v) for k, v in resources.items()}
    if group.resource:  # extended resources: requests must equal limits
        for kind in ("requests", "limits"):
            resources.setdefault(kind, {})[group.resource] = "1"  # a quantity string: the client rejects ints
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "env": [
            *env,
            {"name": "HOME", "value": "/tmp"},
            {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
            *_fetch_env(settings),
        ],
        "resources": resources,
        "securityContext": settings.container_security_context.to_api(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": CACHE_DIR}],
    }
    if command:
        container["command"] = command
    return container


def _pod_spec(
    container: dict[str, Any],
    group: ClassGroup,
    settings: WorkloadSettings,
    service_account: str,
    tolerations: list[dict[str, Any]],
    volume: ModelVolume | None,
    scheduling: PolicyScheduling | None = None,
) -> dict[str, Any]:
    """The pod spec of a Job or serving pod; the policy's ``scheduling`` (checked against the platform's
    allow-lists before anything is built: core.control.platform) replaces the platform's classes it names."""
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    if volume is not None:
        source = (
            {"persistentVolumeClaim": {"claimName": volume.claim_name, "readOnly": True}}
            if volume.claim_name
            else {"hostPath": {"path": volume.host_path, "type": "Directory"}}
        )
        volumes.append({"name": "model", **source})
        container["volumeMounts"].append({"name": "model", "mountPath": volume.mount_path, "readOnly": True})
    pod: dict[str, Any] = {
        "serviceAccountName": service_account,
        "enableServiceLinks": False,
        "nodeSelector": {**settings.node_selector, **group.selector},
        "securityContext": settings.pod_security_context.to_api(),
        "containers": [container],
        "volumes": volumes,
    }
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": secret} for secret in settings.image_pull_secrets]
    if affinity := merged_affinity(settings.affinity, group.node_affinity()):
        pod["affinity"] = affinity
    scheduling = scheduling or PolicyScheduling()
    if priority := scheduling.priority_class_name or settings.priority_class_name:
        pod["priorityClassName"] = priority
    if runtime := scheduling.runtime_class_name or settings.runtime_class_name:
        pod["runtimeClassName"] = runtime
    if tolerations:
        pod["tolerations"] = tolerations
    return pod


def _mount_variant_store(
    pod: dict[str, Any], container: dict[str, Any], store: VariantStore, *, read_only: bool
) -> None:
    claim: dict[str, Any] = {"claimName": store.claim_name, "readOnly": read_only}
    pod["volumes"].append({"name": "variants", "persistentVolumeClaim": claim})
    container["volumeMounts"].append({"name": "variants", "mountPath": VARIANT_STORE_MOUNT, "readOnly": read_only})


def _fetch_env(settings: WorkloadSettings) -> list[dict[str, str]]:
    """The platform's fetch settings, only those it made: exceptions to the fetch guard (agent/fetch_guard.py),
    the proxy, workload identity for object stores (agent/object_store.py)."""
    env = []
    if settings.fetch_allow_cidrs:
        env.append({"name": ENV_FETCH_ALLOW_CIDRS, "value": ",".join(settings.fetch_allow_cidrs)})
    if settings.fetch_proxy:
        env += [{"name": name, "value": settings.fetch_proxy} for name in ("HTTPS_PROXY", "HTTP_PROXY")]
    if settings.fetch_no_proxy:
        env.append({"name": "NO_PROXY", "value": settings.fetch_no_proxy})
    if settings.store_workload_identity:
        env.append({"name": ENV_STORE_AMBIENT_CREDENTIALS, "value": "true"})
    return env


def _mount_store_credentials(pod: dict[str, Any], container: dict[str, Any], credentials: StoreCredentials) -> None:
    """The Secret the policy names, read-only where agent/object_store.py reads it (one file per key)."""
    pod["volumes"].append({"name": "store-credentials", "secret": {"secretName": credentials.secret_name}})
    container["volumeMounts"].append(
        {"name": "store-credentials", "mountPath": STORE_CREDENTIALS_MOUNT, "readOnly": True}
    )
    container["env"].append({"name": ENV_STORE_CREDENTIALS, "value": STORE_CREDENTIALS_MOUNT})


def _probe(path: str, *, period: int, failures: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }
