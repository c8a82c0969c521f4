"""New hardware classes wait until their labels hold still before a run is started for them.

Node labels flap: a driver upgrade rolling over a node pool, or a feature
discovery daemon restarting, can show a node under many driver versions within
seconds, and each is a distinct class. Acting on each created a run per
passing class (18 runs from 20 versions in 10 s on 50 nodes). A class the
policy has never acted on is therefore planned only once it has been seen,
without a break, for ``settle_s``; a class the policy already has runs or
status for is never held back (holding it would read as "class gone" and
remove its serving). The classes present when the operator starts count as
settled: they are the cluster's state, not a flap.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from metainfer.core.control.hardware import ClassGroup


@dataclass
class ClassSightings:
    """Since when each class present has been seen without a break (monotonic seconds)."""

    first_seen: dict[str, float] = field(default_factory=dict)
    started: bool = False

    def observe(self, fingerprints: Iterable[str], now: float) -> None:
        """Record the classes present now; the first observation marks them all as long settled."""
        present = set(fingerprints)
        since = float("-inf") if not self.started else now
        self.first_seen = {fp: self.first_seen.get(fp, since) for fp in present}
        self.started = True


@dataclass(frozen=True)
class Settled:
    groups: list[ClassGroup]
    held_back: list[str]  # fingerprints of new classes still settling
    wait_s: float | None  # until the next of them settles; None when none is settling


def settled_groups(
    groups: Sequence[ClassGroup], sightings: ClassSightings, known: Collection[str], now: float, settle_s: float
) -> Settled:
    """The groups a policy may act on now: those it knows and new ones seen for ``settle_s``."""
    ready: list[ClassGroup] = []
    held: list[str] = []
    wait: float | None = None
    for group in groups:
        since = sightings.first_seen.get(group.fingerprint, now)
        remaining = since + settle_s - now
        if group.fingerprint in known or remaining <= 0:
            ready.append(group)
            continue
        held.append(group.fingerprint)
        wait = remaining if wait is None else min(wait, remaining)
    return Settled(ready, held, wait)
