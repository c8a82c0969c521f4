"""Which nodes a policy's pods may be scheduled on: not cordoned, and every blocking taint tolerated.

A node the scheduler would never give the policy's Jobs or serving pods must not form a class: its run would wait
Pending until its deadline, and a Deployment for it would never have a Ready pod. ``exclusions`` names each such
node with why, from what the nodes index keeps of a node (``NodeScheduling.read``) and the tolerations the pods
get (the policy's spec.hardware.tolerations plus the platform's workloads.tolerations). Matching follows the
scheduler's own rules (k8s.io/api/core/v1 Toleration.ToleratesTaint); PreferNoSchedule taints never block.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
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
            if isinstance(key, str) and isinstance(value, str) and effect in BLOCKING_EFFECTS:
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


def exclusions(nodes: Iterable[tuple[str, NodeScheduling]], tolerations: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Node name -> why, for every node the policy's pods cannot be scheduled on."""
    return {name: why for name, node in nodes if (why := exclusion_reason(node, tolerations)) is not None}
