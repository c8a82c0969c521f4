"""The in-memory API server the control tests plan against, shared by test_reconcile, test_runs, test_serving_plan,
test_provisional, test_pin, test_decisions, test_slim, test_api_policy, test_manifests and test_drift. ``Cluster``
holds one policy, its runs and its Deployments; ``reconcile`` plans as the operator's handler does and applies the
Plan as the API server would, so a test plays a scenario over several reconciles, each reading only what the last
one wrote. Every plan is made a second time on slimmed copies (core.control.slim) and must be the same: each
scenario checks that the operator's memory keeps what the reconcile reads. ``_plan`` plans without applying;
``_contexts`` builds the per-class contexts a test plans one class from."""

from __future__ import annotations

import copy
import datetime as dt
import itertools
from typing import Any

from metainfer.core.api.policy import AdaptationPolicy
from metainfer.core.api.run import AdaptationRun
from metainfer.core.control.decisions import ClassContext
from metainfer.core.control.hardware import group_nodes
from metainfer.core.control.objects import parse_runs
from metainfer.core.control.pod_checks import read_pod_checks
from metainfer.core.control.reconcile import Plan, RunLimits, plan_policy
from metainfer.core.control.settings import AgentJobSettings, ServingDefaults, VendorImage
from metainfer.core.control.slim import slim_deployment, slim_run
from metainfer.core.engine.recipe import Recipe

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
A100 = {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "A100", "nvidia.com/cuda.driver-version.full": "550"}
A100_NEW = {**A100, "nvidia.com/cuda.driver-version.full": "555"}
CPU = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}
ARM = {"kubernetes.io/arch": "arm64"}


class Cluster:
    """Holds the policy, its runs and Deployments; ``reconcile`` plans and applies like the handler would."""

    def __init__(self, **spec: Any) -> None:
        self.policy: dict[str, Any] = {
            "apiVersion": "metainfer.io/v1alpha1",
            "kind": "AdaptationPolicy",
            "metadata": {"name": "digits", "namespace": "ns", "uid": "uid-p", "generation": 1},
            "spec": {"model": {"uri": "https://m/x.onnx", "sha256": "a" * 64}, "slo": {"latencyP95Ms": 10}, **spec},
        }
        self.runs: dict[str, dict[str, Any]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.clock = itertools.count()
        self.job_settings: AgentJobSettings | None = None
        self.serving: ServingDefaults | None = None
        self.pods: list[dict[str, Any]] = []  # provisional pods, as the operator lists them for their checks
        self.rollout_waits: dict[str, str] = {}  # why a Deployment's pods do not become Ready (operator.waits)

    def reconcile(self, nodes: dict[str, dict[str, str]], limits: RunLimits | None = None) -> Plan:
        groups = list(group_nodes(nodes.items()).values())
        policy = AdaptationPolicy.model_validate(self.policy)
        runs = parse_runs(self.runs.values())
        deployments = list(self.deployments.values())
        settings = {
            "job_settings": self.job_settings,
            "serving": self.serving,
            "pod_checks": read_pod_checks(self.pods),
            "rollout_waits": self.rollout_waits,
        }
        plan = plan_policy(policy, groups, runs.valid, deployments, NOW, limits, invalid_runs=runs.invalid, **settings)
        # The operator plans on slimmed copies (core.control.slim): every scenario must plan the same on them.
        slim_runs = parse_runs(slim_run(r) for r in self.runs.values())
        slimmed = plan_policy(
            policy,
            groups,
            slim_runs.valid,
            [slim_deployment(d) for d in deployments],
            NOW,
            limits,
            invalid_runs=slim_runs.invalid,
            **settings,
        )
        assert slimmed == plan, "core.control.slim dropped a field the reconcile reads"
        for planned in plan.runs_to_create:
            run = copy.deepcopy(planned.manifest)
            run["metadata"] |= {
                "uid": f"uid-{run['metadata']['name']}",
                "creationTimestamp": f"t{next(self.clock):04d}",
            }
            assert run["metadata"]["name"] not in self.runs, "a run is never created twice"
            self.runs[run["metadata"]["name"]] = run
        for name in plan.runs_to_delete:
            del self.runs[name]
        for action in plan.deployments_to_apply:
            dep = copy.deepcopy(action.manifest)
            assert (action.action == "create") == (dep["metadata"]["name"] not in self.deployments)
            dep["metadata"]["generation"] = 1
            want = dep["spec"]["replicas"]
            dep["status"] = {"observedGeneration": 1, "updatedReplicas": want, "availableReplicas": want}
            self.deployments[dep["metadata"]["name"]] = dep
        for name in plan.deployments_to_delete:
            del self.deployments[name]
        assert plan.status is not None
        self.policy["status"] = plan.status.to_api()
        return plan

    def finish(self, name: str, ok: bool = True, history: bool = False, ended: str = "00:30") -> None:
        run = self.runs[name]
        if ok:
            recipe = Recipe()
            run["status"] = {
                "phase": "Succeeded",
                "bestRecipe": recipe.model_dump(mode="json"),
                "bestRecipeKey": recipe.key(),
                "bestMetrics": {"p95Ms": 4.0, "qualityDrop": 0.0},
                "completionTime": f"2026-01-01T{ended}:00Z",
            }
            if history:
                run["status"]["trialHistory"] = {"trials": 3, "searchSeconds": 1.0, "data": "H4sI" + "A" * 400}
        else:
            run["status"] = {
                "phase": "Failed",
                "conditions": [
                    {
                        "type": "Succeeded",
                        "status": "False",
                        "reason": "ChecksumMismatch",
                        "message": "model sha256 is b..., expected a...",
                        "lastTransitionTime": "2026-01-01T00:05:00Z",
                    }
                ],
            }

    def edit(self, **spec: Any) -> None:
        self.policy["spec"] = {**self.policy["spec"], **spec}
        self.policy["metadata"]["generation"] += 1


def model(run: dict[str, Any]) -> AdaptationRun:
    return AdaptationRun.model_validate(run)


def ready(plan: Plan) -> tuple[str, str]:
    cond = next(c for c in plan.conditions if c.type == "Ready")
    return cond.status, cond.reason


def _plan(c: Cluster, nodes: dict[str, dict[str, str]], **kwargs: Any) -> Plan:
    """A plan for the cluster as it is, without applying it."""
    runs = parse_runs(c.runs.values())
    groups = list(group_nodes(nodes.items()).values())
    policy = AdaptationPolicy.model_validate(c.policy)
    return plan_policy(
        policy, groups, runs.valid, list(c.deployments.values()), NOW, invalid_runs=runs.invalid, **kwargs
    )


def _contexts(c: Cluster, nodes: dict[str, dict[str, str]]) -> list[ClassContext]:
    policy = AdaptationPolicy.model_validate(c.policy)
    before = {s.fingerprint: s for s in (policy.status.classes if policy.status else [])}
    runs = parse_runs(c.runs.values()).valid
    return [
        ClassContext(
            policy=policy,
            group=group,
            runs=tuple(r for r in runs if r.spec.class_fingerprint == group.fingerprint),
            policy_runs=tuple(runs),
            invalid_runs=(),
            previous_classes=before,
            deployments={},
            jobs={},
            job_settings=None,
            serving=None,
            wait_for_available=True,
            now=NOW,
        )
        for group in group_nodes(nodes.items()).values()
    ]


def _vendor_platform(c: Cluster, vendor_images: dict[str, VendorImage]) -> None:
    common: dict[str, Any] = {"image": "metainfer:1", "runtime": "onnxruntime 1.31.1", "vendor_images": vendor_images}
    c.job_settings = AgentJobSettings(**common)
    c.serving = ServingDefaults(**common)
