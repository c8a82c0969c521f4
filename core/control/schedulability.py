"""Which nodes a policy's pods may be scheduled on: not cordoned, every blocking taint tolerated, and matched by
the platform's placement (workloads.nodeSelector and the required node affinity of workloads.affinity).

A node the scheduler would never give the policy's Jobs or serving pods must not form a class: its run would wait
Pending until its deadline, and a Deployment for it would never have a Ready pod. ``exclusion_reason`` and
``PlatformPlacement.placement_reason`` say why such a node is left out, from what the nodes index keeps of a node
(``NodeScheduling.read``), its labels, and what the pods get (the policy's spec.hardware.tolerations plus the
platform's workloads settings). Matching follows the scheduler's own rules (k8s.io/api/core/v1
Toleration.ToleratesTaint, NodeSelectorRequirement); PreferNoSchedule taints never block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metainfer.core.api.policy import HardwareSelection
from metainfer.core.control.hardware import selector_matches

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# Kubernetes' own taints for a node's health (not-ready, unreachable, memory/disk/PID pressure, network, and the
# unschedulable taint a cordon adds beside spec.unschedulable): the API server puts not-ready on every new Node and
# the node controller on any node that misses a heartbeat. They say how a node is now, not where the platform wants
# pods; dropping a class for them would cancel its runs on every hiccup. A cordon counts through spec.unschedulable.
HEALTH_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
# A node's taints are untrusted input copied into status: a reason names at most this many, each bounded.
MAX_TAINTS_NAMED = 3
MAX_TAINT_TEXT = 160


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def describe(self) -> str:
        text = f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        return text[:MAX_TAINT_TEXT]


@dataclass(frozen=True)
class NodeScheduling:
    """What of a Node decides whether pods may land there (kept small: the index holds one per node)."""

    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()  # only NoSchedule and NoExecute ones

    @classmethod
    def read(cls, spec: Mapping[str, Any] | None) -> NodeScheduling:
        """From a Node's spec as the API server returns it; anything malformed counts as absent."""
        spec = spec or {}
        taints = []
        for raw in spec.get("taints") or ():
            if not isinstance(raw, Mapping):
                continue
            key, value, effect = raw.get("key"), raw.get("value") or "", raw.get("effect")
            if not isinstance(key, str) or not isinstance(value, str) or effect not in BLOCKING_EFFECTS:
                continue
            if not key.startswith(HEALTH_TAINT_PREFIXES):
                taints.append(Taint(key, value, str(effect)))
        return cls(unschedulable=spec.get("unschedulable") is True, taints=tuple(taints))

    def to_index(self) -> dict[str, Any]:
        return {"unschedulable": self.unschedulable, "taints": [[t.key, t.value, t.effect] for t in self.taints]}

    @classmethod
    def from_index(cls, value: Mapping[str, Any]) -> NodeScheduling:
        return cls(bool(value.get("unschedulable")), tuple(Taint(*t) for t in value.get("taints", ())))


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """The scheduler's rule: effects match (an empty effect matches all), keys match (an empty key with Exists
    matches all), and Exists ignores the value while Equal (the default) compares it."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.key:
        return False
    if operator == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == taint.value


def exclusion_reason(node: NodeScheduling, tolerations: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the policy's pods cannot be scheduled on ``node``; None when they can."""
    if node.unschedulable:
        return "cordoned (spec.unschedulable): no new pods are scheduled there"
    blocking = [t for t in node.taints if not any(tolerates(tol, t) for tol in tolerations)]
    if not blocking:
        return None
    named = ", ".join(t.describe() for t in blocking[:MAX_TAINTS_NAMED])
    more = f" and {len(blocking) - MAX_TAINTS_NAMED} more" if len(blocking) > MAX_TAINTS_NAMED else ""
    return (
        f"taint {named}{more} not tolerated: add a toleration to spec.hardware.tolerations "
        "(or the platform's workloads.tolerations)"
    )


NODE_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


def _matches(labels: Mapping[str, str], expression: Mapping[str, Any]) -> bool:
    """One NodeSelectorRequirement, as the scheduler evaluates it on a node's labels."""
    key, operator, values = expression["key"], expression["operator"], list(expression.get("values") or [])
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if key not in labels:
        return False  # In, Gt and Lt need the label; NotIn too (the scheduler's rule: an absent key does not match)
    value = labels[key]
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    try:
        number, bound = int(value), int(values[0])
    except (ValueError, IndexError):
        return False
    return number > bound if operator == "Gt" else number < bound


def required_terms(affinity: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The nodeSelectorTerms of an affinity's requiredDuringSchedulingIgnoredDuringExecution (ORed)."""
    node = (affinity or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


@dataclass(frozen=True)
class PlatformPlacement:
    """What the platform adds to every Job and serving pod that decides where it may land."""

    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] | None = None
    affinity: Mapping[str, Any] | None = None

    def placement_reason(self, labels: Mapping[str, str]) -> str | None:
        """Why the platform's nodeSelector or required node affinity keeps pods off a node with ``labels``."""
        missing = [f"{k}={v}" for k, v in (self.node_selector or {}).items() if labels.get(k) != v]
        if missing:
            return f"not matched by the platform's workloads.nodeSelector ({', '.join(missing[:3])})"[:MAX_TAINT_TEXT]
        terms = required_terms(self.affinity)
        if terms and not any(all(_matches(labels, e) for e in t.get("matchExpressions") or []) for t in terms):
            return "not matched by the required node affinity of the platform's workloads.affinity"
        return None


def merged_affinity(platform: Mapping[str, Any] | None, own: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A pod's affinity from the platform's (workloads.affinity) and a class's own (DoesNotExist terms): each side's
    required node terms must hold, so each of the platform's terms (ORed) gains the class's expressions; preferred
    node terms and pod (anti-)affinity are the platform's."""
    if not platform:
        return dict(own) if own else None
    merged: dict[str, Any] = {k: v for k, v in platform.items() if k != "nodeAffinity"}
    node = dict(platform.get("nodeAffinity") or {})
    mine = [e for t in required_terms(own) for e in t.get("matchExpressions") or []]
    terms = required_terms(platform) or ([{"matchExpressions": []}] if mine else [])
    if terms:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{**t, "matchExpressions": [*(t.get("matchExpressions") or []), *mine]} for t in terms]
        }
    if node:
        merged["nodeAffinity"] = node
    return merged or None


def excluded_nodes(
    selection: HardwareSelection | None,
    labels: Mapping[str, Mapping[str, str]],
    scheduling: Mapping[str, NodeScheduling],
    platform: PlatformPlacement,
) -> dict[str, str]:
    """Node name -> why, for each node the policy's nodeSelector takes that its pods cannot land on: outside the
    platform's placement, cordoned, or tainted beyond the policy's and the platform's tolerations."""
    wanted = dict((selection.node_selector if selection else None) or {})
    tolerations = [*(t.to_api() for t in (selection.tolerations if selection else None) or []), *platform.tolerations]
    excluded: dict[str, str] = {}
    for name in sorted(labels):
        if not selector_matches(labels[name], wanted):
            continue
        node = scheduling.get(name, NodeScheduling())
        why = platform.placement_reason(labels[name]) or exclusion_reason(node, tolerations)
        if why is not None:
            excluded[name] = why
    return excluded
