"""kopf's start-up readiness without its quadratic wake-ups.

On start, kopf holds every handler back until each listed object of each indexed kind has been indexed: one toggle
per object in a ``ToggleSet``, and every object's worker waits for the whole set to turn on. kopf (1.45.2) wakes
every waiter whenever a toggle is added or dropped, and each waiter re-checks the set, so N listed objects cost
about N² wake-ups of the event loop. At 1,000 Nodes that delayed the first reconcile by about 3 s (the scale
benchmark's spawn → first run: 1.5 s at 100 Nodes, 4.8 s at 1,000), and an operator restarting on a cluster that
also holds thousands of runs and Jobs lists and indexes those too.

Who waits on a ``ToggleSet``'s condition: its own ``wait_for``, whose predicate is the set's overall state, and its
toggles' ``wait_for``, whose predicate is their own state (``Toggle.turn_to`` notifies the shared condition itself).
Adding or dropping a toggle changes neither toggle's state, so it needs to wake anyone only when it flips the set's
overall state. ``install`` makes kopf's ``ToggleSet`` notify exactly then; everything else is kopf's own code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet  # the internals this module exists to amend

_INSTALLED = False


async def _make_toggle(self: ToggleSet, __val: bool = False, *, name: str | None = None) -> Toggle:
    toggle = Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        was = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != was:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: ToggleSet, toggle: Toggle) -> None:
    async with self._condition:
        was = self.is_on()
        self._toggles.discard(toggle)
        if self.is_on() != was:
            self._condition.notify_all()


async def _drop_toggles(self: ToggleSet, toggles: Iterable[Toggle]) -> None:
    async with self._condition:
        was = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != was:
            self._condition.notify_all()


def install() -> None:
    """Replace the three methods of kopf's ``ToggleSet`` that add or drop toggles (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    patched: dict[str, Any] = {"make_toggle": _make_toggle, "drop_toggle": _drop_toggle, "drop_toggles": _drop_toggles}
    if not all(hasattr(ToggleSet, name) for name in patched):  # another kopf: leave it whole, not half-patched
        return
    for name, method in patched.items():
        setattr(ToggleSet, name, method)
    _INSTALLED = True
