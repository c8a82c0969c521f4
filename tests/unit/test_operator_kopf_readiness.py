"""kopf's start-up readiness: same semantics, without waking every waiter on every toggle (operator.kopf_readiness)."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits.aiotoggles import ToggleSet

from metainfer.operator import kopf_readiness


def _counting_all() -> tuple[list[int], object]:
    checks = [0]

    def fn(states: object) -> bool:
        checks[0] += 1
        return all(states)  # type: ignore[call-overload]

    return checks, fn


async def _start_up(objects: int) -> int:
    """kopf's pattern at start-up: one toggle per listed object, a waiter per object, the toggles dropped one by
    one as the objects are indexed. Returns how often the set's state was evaluated."""
    checks, fn = _counting_all()
    readiness = ToggleSet(fn)  # type: ignore[arg-type]
    toggles = [await readiness.make_toggle(name=f"object {i}") for i in range(objects)]
    ready = [asyncio.create_task(readiness.wait_for(True)) for _ in range(objects)]
    await asyncio.sleep(0)  # every waiter is waiting
    for toggle in toggles[:-1]:
        await readiness.drop_toggle(toggle)
        await asyncio.sleep(0)
    assert not any(task.done() for task in ready), "ready before the last object was indexed"
    await readiness.drop_toggle(toggles[-1])
    await asyncio.wait_for(asyncio.gather(*ready), timeout=5)
    return checks[0]


def test_every_waiter_wakes_when_the_last_object_is_indexed_and_not_before() -> None:
    kopf_readiness.install()
    asyncio.run(_start_up(50))


def test_start_up_costs_grow_linearly_with_the_objects_listed() -> None:
    kopf_readiness.install()
    small, large = asyncio.run(_start_up(100)), asyncio.run(_start_up(400))
    # kopf's own methods woke all N waiters on each of N drops: 4x the objects cost 16x the checks.
    assert large < 6 * small, (small, large)


def test_a_toggle_turned_still_wakes_the_sets_waiters() -> None:
    kopf_readiness.install()

    async def scenario() -> None:
        paused = ToggleSet(any)
        flag = await paused.make_toggle(True, name="peering conflict")
        resumed = asyncio.create_task(paused.wait_for(False))
        await asyncio.sleep(0)
        assert not resumed.done()
        await flag.turn_to(False)
        await asyncio.wait_for(resumed, timeout=5)
        await paused.drop_toggle(flag)
        assert paused.is_off()

    asyncio.run(scenario())
