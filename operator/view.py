"""The operator's read side: kopf indexes of the cluster, and wake-ups per policy.

Indexes are kopf's in-memory views of watched objects, rebuilt from the watch
streams on every start, so they are a cache of the API server, never a source
of truth. Hardware classes are recomputed only when a node event arrives (a
version counter), not once per policy: 100 policies over 1,000 nodes share one
classification. Wake-ups are hints that something a policy depends on changed;
a periodic resync covers any hint that was lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from metainfer.core.api.names import LABEL_PROVISIONAL
from metainfer.core.api.policy import HardwareSelection
from metainfer.core.control.hardware import (
    ClassGroup,
    LabelMapping,
    NodeClassification,
    classify_nodes,
    select_groups,
    unclassified_for,
)
from metainfer.core.control.naming import job_name, label_value
from metainfer.core.control.schedulability import NodeScheduling, PlatformPlacement, excluded_nodes
from metainfer.core.control.settling import ClassSightings

Body = Mapping[str, Any]


def first(store: Iterable[Any]) -> Any:
    return next(iter(store))


@dataclass(frozen=True)
class Indexes:
    """kopf's indexes as a policy daemon receives them (each key maps to a store of values)."""

    nodes: Mapping[str, Collection[Mapping[str, str]]]
    runs: Mapping[tuple[str, str], Collection[Body]]  # by (namespace, policy)
    jobs: Mapping[tuple[str, str], Collection[Body]]  # by (namespace, name)
    deployments: Mapping[tuple[str, str], Collection[Body]]  # by (namespace, policy)
    in_flight: Mapping[str, Collection[tuple[str, str]]]  # Pending and Running runs by namespace
    # By node name: NodeScheduling.to_index() (cordoned, blocking taints); a node not in it counts as schedulable.
    node_scheduling: Mapping[str, Collection[Mapping[str, Any]]] = field(default_factory=dict)
    services: Mapping[tuple[str, str], Collection[Any]] = field(default_factory=dict)  # ours, by (namespace, name)

    def not_seen(self, objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """``objects`` (created if absent) less the Services the watch shows to exist. Each reconcile plans the
        policy's Service and its classes' again, and a create of one that exists is a refused request: 300 of the
        1,400 a node label change cost at 100 policies. A Service the watch has not shown yet is created (a 409
        at worst), and one deleted is planned and created again by the reconcile its deletion wakes."""
        return [
            o
            for o in objects
            if o["kind"] != "Service" or (o["metadata"]["namespace"], o["metadata"]["name"]) not in self.services
        ]

    def runs_of(self, namespace: str, policy: str) -> list[Body]:
        return list(self.runs.get((namespace, policy), ()))

    def deployments_of(self, namespace: str, policy: str) -> list[Body]:
        # Indexed by the children's policy label, which hashes names longer than a label value allows.
        return list(self.deployments.get((namespace, label_value(policy)), ()))

    def has_provisional(self, namespace: str, policy: str) -> bool:
        """Whether a Deployment of the policy serves provisionally (core.control.provisional)."""
        return any(
            ((d.get("metadata") or {}).get("labels") or {}).get(LABEL_PROVISIONAL) == "true"
            for d in self.deployments_of(namespace, policy)
        )

    def jobs_of(self, namespace: str, run_names: Iterable[str]) -> dict[str, Body]:
        """The Jobs of these runs that exist, by Job name."""
        names = (job_name(run) for run in run_names)
        return {name: first(store) for name in names if (store := self.jobs.get((namespace, name)))}

    def cluster_in_flight(self) -> int:
        return sum(len(runs) for runs in self.in_flight.values())

    def namespace_in_flight(self, namespace: str) -> int:
        return len(self.in_flight.get(namespace, ()))


class ClusterView:
    def __init__(self, mapping: LabelMapping | None = None) -> None:
        self.mapping = mapping
        self.node_version = 0
        self._groups: tuple[int, NodeClassification, dict[str, Mapping[str, str]]] | None = None
        self._selected: dict[str, tuple[list[ClassGroup], dict[str, str]]] = {}
        self._selected_version = -1
        self.sightings = ClassSightings()

    def selected(
        self,
        selection: HardwareSelection | None,
        nodes_index: Mapping[str, Iterable[Mapping[str, str]]],
        scheduling_index: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
        platform: PlatformPlacement | None = None,
    ) -> list[ClassGroup]:
        """A policy's classes, shared by every policy with the same selection until a node changes (100 policies
        with one nodeSelector matched it against every node of every class on each reconcile). Nodes its pods
        cannot be scheduled on (``excluded``) are in none of them."""
        return self._selection(selection, nodes_index, scheduling_index, platform)[0]

    def excluded(
        self,
        selection: HardwareSelection | None,
        nodes_index: Mapping[str, Iterable[Mapping[str, str]]],
        scheduling_index: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
        platform: PlatformPlacement | None = None,
    ) -> dict[str, str]:
        """Nodes this policy would select that are cordoned, tainted beyond its and the platform's tolerations, or
        outside the platform's placement, with why."""
        return self._selection(selection, nodes_index, scheduling_index, platform)[1]

    def _selection(
        self,
        selection: HardwareSelection | None,
        nodes_index: Mapping[str, Iterable[Mapping[str, str]]],
        scheduling_index: Mapping[str, Iterable[Mapping[str, Any]]] | None,
        platform: PlatformPlacement | None,
    ) -> tuple[list[ClassGroup], dict[str, str]]:
        classification, labels = self.classification(nodes_index)
        if self._selected_version != self.node_version:
            self._selected, self._selected_version = {}, self.node_version
        platform = platform or PlatformPlacement()
        key = (selection.model_dump_json() if selection is not None else "") + json.dumps(
            [platform.tolerations, platform.node_selector, platform.affinity], sort_keys=True, default=str
        )
        if key not in self._selected:
            scheduling = {
                name: NodeScheduling.from_index(first(store)) for name, store in (scheduling_index or {}).items()
            }
            excluded = excluded_nodes(selection, labels, scheduling, platform)
            self._selected[key] = (select_groups(classification.groups, selection, labels, excluded), excluded)
        return self._selected[key]

    def nodes_changed(self) -> None:
        self.node_version += 1

    def unclassified(
        self, selection: HardwareSelection | None, nodes_index: Mapping[str, Iterable[Mapping[str, str]]]
    ) -> dict[str, str]:
        """Nodes this policy would select whose labels form no class, with why."""
        classification, labels = self.classification(nodes_index)
        if not classification.unclassified:
            return {}
        return unclassified_for(selection, classification.unclassified, labels)

    def classification(
        self, nodes_index: Mapping[str, Iterable[Mapping[str, str]]]
    ) -> tuple[NodeClassification, dict[str, Mapping[str, str]]]:
        if self._groups is None or self._groups[0] != self.node_version:
            labels = {name: first(store) for name, store in nodes_index.items()}
            self._groups = (self.node_version, classify_nodes(sorted(labels.items()), self.mapping), labels)
            self.sightings.observe(self._groups[1].groups, time.monotonic())
        return self._groups[1], self._groups[2]


class Wakeups:
    """One asyncio.Event per policy daemon; setting it makes the daemon reconcile now.

    Keyed by the policy's label spelling (core.control.naming.label_value): runs name their policy in full, Jobs
    and Deployments in a label, which hashes names over 63 characters; both must reach the same daemon.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}

    def register(self, namespace: str, name: str) -> asyncio.Event:
        return self._events.setdefault((namespace, label_value(name)), asyncio.Event())

    def unregister(self, namespace: str, name: str) -> None:
        self._events.pop((namespace, label_value(name)), None)

    def wake(self, namespace: str | None, name: str | None) -> None:
        event = self._events.get((namespace or "", label_value(name or "")))
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        for event in self._events.values():
            event.set()
