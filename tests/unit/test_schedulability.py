"""Which nodes a policy's pods may land on: the scheduler's toleration rules, cordons, and bounded reasons."""

from __future__ import annotations

from typing import Any

import pytest

from metainfer.core.control.schedulability import NodeScheduling, Taint, exclusion_reason, exclusions, tolerates

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
    assert exclusions([("a", NodeScheduling()), ("b", tainted)], []) == {"b": reason}


def test_only_blocking_taints_are_read_from_a_node_and_junk_counts_as_absent() -> None:
    spec = {
        "unschedulable": True,
        "taints": [
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "evict", "effect": "NoExecute"},
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
