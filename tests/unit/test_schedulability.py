"""Which nodes a policy's pods may land on: the scheduler's toleration rules, cordons, and bounded reasons."""

from __future__ import annotations

from typing import Any

import pytest

from metainfer.core.control.schedulability import (
    NodeScheduling,
    PlatformPlacement,
    Taint,
    exclusion_reason,
    merged_affinity,
    tolerates,
)

GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),  # another effect
        ({"key": "nvidia.com/gpu", "value": "present"}, True),  # Equal is the default operator
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}, False),
        ({"key": "nvidia.com/gpu"}, False),  # Equal with no value matches only an empty value
        ({"operator": "Exists"}, True),  # no key with Exists: every taint
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "amd.com/gpu", "operator": "Exists"}, False),
    ],
)
def test_tolerations_match_taints_as_the_scheduler_does(toleration: dict[str, Any], expected: bool) -> None:
    assert tolerates(toleration, GPU_TAINT) is expected


def test_a_node_is_excluded_while_cordoned_or_tainted_beyond_the_tolerations_and_says_which_taint() -> None:
    tainted = NodeScheduling(taints=(GPU_TAINT,))
    assert exclusion_reason(NodeScheduling(), []) is None
    reason = exclusion_reason(tainted, [])
    assert reason is not None and "nvidia.com/gpu=present:NoSchedule" in reason
    assert "spec.hardware.tolerations" in reason
    assert exclusion_reason(tainted, [{"key": "nvidia.com/gpu", "operator": "Exists"}]) is None
    cordoned = exclusion_reason(NodeScheduling(unschedulable=True), [{"operator": "Exists"}])
    assert cordoned is not None and "cordoned" in cordoned  # a cordon is the platform's word: no toleration lifts it


def test_only_blocking_taints_are_read_from_a_node_and_junk_counts_as_absent() -> None:
    spec = {
        "unschedulable": True,
        "taints": [
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "evict", "effect": "NoExecute"},
            # The API server's and node controller's health taints: transient, not placement (never excluded for).
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            "not a taint",
            {"key": 7, "effect": "NoSchedule"},
        ],
    }
    node = NodeScheduling.read(spec)
    assert node.unschedulable and node.taints == (GPU_TAINT, Taint("evict", "", "NoExecute"))
    assert NodeScheduling.from_index(node.to_index()) == node
    assert NodeScheduling.read(None) == NodeScheduling() == NodeScheduling.read({"unschedulable": "yes"})


def test_a_hostile_node_with_many_long_taints_gets_a_bounded_reason() -> None:
    taints = tuple(Taint("k" * 250 + str(i), "v" * 63, "NoSchedule") for i in range(50))
    reason = exclusion_reason(NodeScheduling(taints=taints), [])
    assert reason is not None and len(reason) < 1024 and "and 47 more" in reason


ZONE_A = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}


def test_the_platforms_placement_leaves_out_nodes_its_selector_or_required_affinity_rule_out() -> None:
    placement = PlatformPlacement(
        node_selector={"pool": "inference"},
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": ZONE_A}},
    )
    assert placement.placement_reason({"pool": "inference", "zone": "a"}) is None
    off_pool = placement.placement_reason({"pool": "batch", "zone": "a"})
    assert off_pool is not None and "workloads.nodeSelector (pool=inference)" in off_pool
    off_zone = placement.placement_reason({"pool": "inference", "zone": "b"})
    assert off_zone is not None and "workloads.affinity" in off_zone
    gt = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}]},
        {"matchExpressions": [{"key": "legacy", "operator": "DoesNotExist"}, {"key": "x", "operator": "NotIn",
                                                                            "values": ["1"]}]},
    ]}}}  # fmt: skip
    terms = PlatformPlacement(affinity=gt)
    assert terms.placement_reason({"gen": "4"}) is None  # the first term
    assert terms.placement_reason({"x": "2"}) is None  # the second: no legacy label, x not 1
    assert terms.placement_reason({"gen": "3", "x": "1"}) is not None
    assert terms.placement_reason({"gen": "three", "legacy": ""}) is not None


def test_a_pods_affinity_ands_the_platforms_required_node_terms_with_the_classs_own() -> None:
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"}]}]}}}  # fmt: skip
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}
    platform = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": ZONE_A}, "podAntiAffinity": anti}
    merged = merged_affinity(platform, own)
    assert merged is not None and merged["podAntiAffinity"] == anti
    (term,) = merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [e["key"] for e in term["matchExpressions"]] == ["zone", "nvidia.com/gpu.product"]
    assert merged_affinity(None, own) == own and merged_affinity(None, None) is None
    only_pods = merged_affinity({"podAntiAffinity": anti}, own)
    assert only_pods is not None and only_pods["nodeAffinity"] == own["nodeAffinity"]
