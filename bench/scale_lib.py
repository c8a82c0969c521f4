"""Pure pieces of the operator-scale benchmark: synthetic Nodes, policies, and audit-log counting.

Kept apart from ``operator_scale.py`` (which needs a control plane) so a unit test can check that
the generated nodes really form the intended number of hardware classes (per ``core.control.hardware``,
the operator's own classification) and that the audit log is counted the way the section says.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from metainfer.core.api import GROUP, VERSION

SCALE_LABEL = "metainfer.io/scale"
DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
# 4 GPU products x 5 driver versions = 20 classes: products differ in the fields a real GFD labels, drivers in the
# one label a node upgrade changes (the reaction measurement moves a node to a driver no class has yet).
GPUS: tuple[tuple[str, str, str, str], ...] = (
    ("NVIDIA-A100-SXM4-40GB", "40960", "8", "0"),
    ("NVIDIA-H100-80GB-HBM3", "81559", "9", "0"),
    ("NVIDIA-L4", "23034", "8", "9"),
    ("Tesla-T4", "15360", "7", "5"),
)
DRIVERS: tuple[str, ...] = ("535.183.01", "545.29.06", "550.90.07", "555.42.06", "560.35.03")
CLASSES = len(GPUS) * len(DRIVERS)
MODEL_URI = "configmap://digits-model/model.onnx"  # resolved by the agent Job, never at plan time
MODEL_SHA256 = "63704d1c9451d28e93972b0bd7068f74777fa040c17d2f184218ce47980e0ee9"
# User agent of every request the benchmark itself makes: the audit log tells them from the operator's.
BENCH_USER_AGENT = "metainfer-bench/operator-scale"
OTHER_AGENTS = ("kube-apiserver", "kube-controller-manager", BENCH_USER_AGENT)


def node_name(index: int) -> str:
    return f"scale-node-{index:05d}"


def node_labels(index: int) -> dict[str, str]:
    """Labels of node ``index``: class ``index % 20``, so classes stay equally sized at every node count."""
    cls = index % CLASSES
    product, memory, major, minor = GPUS[cls % len(GPUS)]
    return {
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": node_name(index),
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": memory,
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.compute.major": major,
        "nvidia.com/gpu.compute.minor": minor,
        DRIVER_LABEL: DRIVERS[cls // len(GPUS)],
        "nvidia.com/cuda.runtime-version.full": "12.4",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/cpu-cpuid.AVX512F": "true",
        SCALE_LABEL: "true",
    }


def node_manifest(index: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name(index), "labels": node_labels(index)}}


def policy_manifest(namespace: str, index: int, max_concurrent_runs: int) -> dict[str, Any]:
    """A minimal valid policy for every GPU class of the benchmark's nodes.

    ``maxClasses`` 64 (the schema's maximum) so the 21st class of a reaction is adapted too; ``maxConcurrentRuns``
    above the class count (64, the maximum, in the benchmark): no kubelet runs, so every run stays Pending and
    holds a slot, and the reaction's new class would otherwise wait for one (the benchmark measures planning and
    API traffic, not the concurrency limit).
    """
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdaptationPolicy",
        "metadata": {"name": f"scale-{index:03d}", "namespace": namespace},
        "spec": {
            "model": {"uri": MODEL_URI, "sha256": MODEL_SHA256},
            "slo": {"latencyP95Ms": 40},
            "hardware": {"vendors": ["nvidia"], "nodeSelector": {SCALE_LABEL: "true"}, "maxClasses": 64},
            "search": {"maxConcurrentRuns": max_concurrent_runs},
            "readaptation": {"enabled": False},
        },
    }


@dataclass(frozen=True)
class Request:
    """One API request as kube-apiserver audited it (deduplicated over its stages)."""

    audit_id: str
    user_agent: str
    verb: str
    resource: str
    subresource: str
    code: int
    time: str  # requestReceivedTimestamp, RFC 3339 with microseconds

    @property
    def key(self) -> str:
        """``verb resource[/subresource]``, the breakdown's row."""
        res = self.resource or "(non-resource)"
        return f"{self.verb} {res}/{self.subresource}" if self.subresource else f"{self.verb} {res}"


def parse_audit(lines: Iterable[str]) -> list[Request]:
    """Requests in audit-log ``lines`` (JSON, one event per stage), each once, in arrival order.

    A watch logs ResponseStarted and ResponseComplete under one auditID; counting IDs counts requests.
    A torn last line (the server is still writing) is skipped; the caller re-reads it later.
    """
    seen: dict[str, Request] = {}
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        audit_id = event.get("auditID", "")
        if audit_id in seen or event.get("stage") == "RequestReceived":
            continue
        ref = event.get("objectRef") or {}
        seen[audit_id] = Request(
            audit_id=audit_id,
            user_agent=event.get("userAgent", ""),
            verb=event.get("verb", ""),
            resource=ref.get("resource", ""),
            subresource=ref.get("subresource", ""),
            code=int((event.get("responseStatus") or {}).get("code", 0)),
            time=event.get("requestReceivedTimestamp", ""),
        )
    return list(seen.values())


def is_operator(request: Request) -> bool:
    """The operator is every client that is not the control plane itself or this benchmark.

    Its requests come from kopf (``kopf/<version>``) and from the kubernetes client in worker threads
    (``OpenAPI-Generator/...``); both use the bench kubeconfig, so the user name cannot tell them apart.
    """
    return not request.user_agent.startswith(OTHER_AGENTS)


def breakdown(requests: Iterable[Request]) -> dict[str, int]:
    """Request counts by ``verb resource``, largest first."""
    return dict(Counter(r.key for r in requests).most_common())


def mutating(requests: Iterable[Request]) -> list[Request]:
    return [r for r in requests if r.verb in ("create", "update", "patch", "delete", "deletecollection")]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def gpu_job_quantities_are_strings() -> bool:
    """Whether a GPU class's Job carries its extended resource as a string quantity, as the API client requires.

    The kubernetes client validates bodies and rejects an int quantity, so while core.control.manifests writes
    ``nvidia.com/gpu: 1`` no Job of a GPU class can be created: the policy reconcile stops at the first one with
    a ValidationError (and reports InvalidSpec). The benchmark then classifies its GPU nodes through a
    LabelMapping without the extended resource (same classes and fingerprints), and its section says so.
    """
    from metainfer.core.control.hardware import group_nodes
    from metainfer.core.control.manifests import build_job
    from metainfer.core.control.reconcile import build_run

    group = next(iter(group_nodes([(node_name(0), node_labels(0))]).values()))
    policy = policy_manifest("ns", 0, CLASSES)
    policy["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    run = build_run(policy, group, "NewHardwareClass", None)
    run["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    job = build_job(run, group)
    container = job["spec"]["template"]["spec"]["containers"][0]
    limits = (container.get("resources") or {}).get("limits") or {}
    return all(isinstance(v, str) for v in limits.values())


def mapping_without_gpu_resource() -> dict[str, Any]:
    """A LabelMapping (wire form) equal to the default but with no extended resource for NVIDIA GPUs."""
    from metainfer.core.control.hardware import DEFAULT_VENDORS

    nvidia = next(v for v in DEFAULT_VENDORS if v.vendor == "nvidia").model_copy(update={"resource": None})
    return {"extraVendors": [nvidia.model_dump(mode="json", by_alias=True)]}


def class_count(labels: Mapping[str, Mapping[str, str]]) -> int:
    """How many hardware classes the operator would see among these nodes."""
    from metainfer.core.control.hardware import group_nodes

    return len(group_nodes(sorted(labels.items())))
