"""Coalescing the reconcile's Events: one per (type, reason), bounded, nothing silently lost."""

from __future__ import annotations

from metainfer.core.control.events import Event, coalesce


def test_one_event_per_type_and_reason_in_first_seen_order() -> None:
    events = [
        Event("Normal", "NewHardwareClass", "class a: 3 nodes"),
        Event("Normal", "NewHardwareClass", "class b: 1 nodes"),
        Event("Warning", "RunFailed", "run r1 failed: x"),
        Event("Normal", "NewHardwareClass", "class c: 2 nodes"),
    ]
    assert coalesce(events) == [
        Event("Normal", "NewHardwareClass", "3 at once: class a: 3 nodes; class b: 1 nodes; class c: 2 nodes"),
        Event("Warning", "RunFailed", "run r1 failed: x"),
    ]
    assert coalesce([]) == []


def test_long_lists_are_cut_and_say_how_many_were_left_out() -> None:
    events = [Event("Normal", "NewHardwareClass", f"class c{i:02d}: run policy-c{i:02d}-0123456789") for i in range(60)]
    (merged,) = coalesce(events, max_message=300)
    assert len(merged.message) <= 300
    shown = merged.message.count("class c")
    assert merged.message.startswith("60 at once: class c00: ")
    assert merged.message.endswith(f"; ... and {60 - shown} more") and 0 < shown < 60


def test_a_single_long_message_is_truncated_and_a_long_first_one_still_shows() -> None:
    (single,) = coalesce([Event("Warning", "RunFailed", "x" * 5000)], max_message=100)
    assert single.message == "x" * 100
    (merged,) = coalesce([Event("Normal", "R", "y" * 5000), Event("Normal", "R", "z")], max_message=100)
    assert len(merged.message) <= 100 and "yyy" in merged.message and merged.message.endswith("; ... and 1 more")


def test_the_missing_agent_account_message_names_the_namespace_the_account_and_the_fix() -> None:
    from metainfer.core.control.events import MAX_MESSAGE, missing_agent_account

    message = missing_agent_account("team-b", "metainfer-agent", "digits-cpu-1")
    assert "team-b" in message and "metainfer-agent" in message and "workloadNamespaces" in message
    assert len(missing_agent_account("n" * 300, "a" * 300, "r" * 300)) <= MAX_MESSAGE
