"""The operator's shared read side: classes computed once per node change, selections shared by policies."""

from __future__ import annotations

from metainfer.core.api.policy import HardwareSelection
from metainfer.core.control.hardware import group_nodes, select_groups
from metainfer.operator.view import ClusterView

A100 = {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "A100", "nvidia.com/cuda.driver-version.full": "550"}
CPU = {"kubernetes.io/arch": "amd64", "feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}


def _index(nodes: dict[str, dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    return {name: [labels] for name, labels in nodes.items()}  # kopf index shape: key -> store of values


def test_selected_classes_match_select_groups_and_follow_node_changes() -> None:
    nodes = {"g1": {**A100, "pool": "a"}, "g2": A100, "c1": {**CPU, "pool": "a"}}
    view = ClusterView()
    pool_a = HardwareSelection(node_selector={"pool": "a"})
    expected = select_groups(group_nodes(sorted(nodes.items())), pool_a, nodes)
    first = view.selected(pool_a, _index(nodes))
    assert first == expected and sorted(g.node_names for g in first) == [("c1",), ("g1",)]
    assert view.selected(HardwareSelection(node_selector={"pool": "a"}), _index(nodes)) is first, "shared"
    assert len(view.selected(None, _index(nodes))) == 2
    nodes["g2"] = {**A100, "pool": "a"}
    assert view.selected(pool_a, _index(nodes)) is first, "no node event yet: the cached view stands"
    view.nodes_changed()
    after = view.selected(pool_a, _index(nodes))
    assert after == select_groups(group_nodes(sorted(nodes.items())), pool_a, nodes)
    assert sorted(n for g in after for n in g.node_names) == ["c1", "g1", "g2"]
