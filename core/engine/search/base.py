"""The ask/tell interface every search algorithm implements.

Why ask/tell: the agent evaluates candidates on real hardware, possibly in
another process or after a restart, so the algorithm must never drive the loop
itself. Why history-derived randomness: a run that resumes from its trial
history (the only durable state, kept in the AdaptationRun status) must ask
exactly what the uninterrupted run would have asked. Each ``ask`` therefore
seeds a fresh generator from ``(seed, len(history), number pending)`` and
derives everything else from the history; no hidden state accumulates.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Self

import numpy as np

from metainfer.core.engine.algorithms import Algorithm
from metainfer.core.engine.search.space import Key, Point, Space

History = list[tuple[Point, float | None]]


class Searcher(ABC):
    """Proposes allowed, never-repeated points; learns from scored results.

    Scores are "higher is better"; ``None`` (or NaN) marks an infeasible or
    failed trial, which algorithms treat as worse than anything seen.
    """

    algorithm: ClassVar[Algorithm]

    def __init__(self, space: Space, seed: int = 0) -> None:
        self.space = space
        self.seed = int(seed)
        self._history: History = []
        self._keys: list[Key] = []
        self._seen: set[Key] = set()
        self._pending: dict[Key, None] = {}  # insertion-ordered set

    # -- public interface -------------------------------------------------
    def ask(self, n: int = 1) -> list[Point]:
        """Up to ``n`` new allowed points; fewer only when the space is exhausted."""
        if n < 1:
            return []
        exclude = self._seen | set(self._pending)
        rng = np.random.default_rng([self.seed % 2**63, len(self._history), len(self._pending)])
        keys: list[Key] = []
        for k in self._propose(n, rng, exclude):
            if len(keys) < n and k not in exclude and self.space._key_allowed(k):
                exclude.add(k)
                keys.append(k)
        if len(keys) < n:  # an algorithm ran dry early: top up so only exhaustion stops us
            keys += self.space.sample(rng, n - len(keys), exclude)
        for k in keys:
            self._pending[k] = None
        return [self.space.point(k) for k in keys]

    def tell(self, point: Point, score: float | None) -> None:
        """Record a result; ``point`` may also come from elsewhere (replay, seeding)."""
        key = self.space.key(point)
        if score is not None and not math.isfinite(score):
            score = None
        self._history.append((self.space.point(key), None if score is None else float(score)))
        self._keys.append(key)
        self._seen.add(key)
        self._pending.pop(key, None)

    def exclude(self, point: Point) -> None:
        """Never propose ``point``, without telling the algorithms a score for it: a measurement made for another
        reason (a peer's default configuration, core.engine.anchors) whose failure would mislead them about its
        neighbours."""
        key = self.space.key(point)
        self._seen.add(key)
        self._pending.pop(key, None)

    @property
    def history(self) -> History:
        return list(self._history)

    def best(self) -> tuple[Point, float] | None:
        """Best feasible (point, score) so far, earliest first on ties."""
        scored = [(p, s) for p, s in self._history if s is not None]
        return max(scored, key=lambda ps: ps[1]) if scored else None

    def predicted_score(self, point: Point) -> float | None:
        """The surrogate's prediction for a point this searcher asked, if it made one."""
        return None

    def params(self) -> dict[str, Any]:
        """Algorithm parameters needed to rebuild an equivalent searcher."""
        return {}

    def state(self) -> dict[str, Any]:
        """JSON-serialisable checkpoint: seed, parameters and the full history."""
        return {
            "algorithm": self.algorithm,
            "seed": self.seed,
            "params": self.params(),
            "history": [{"point": p, "score": s} for p, s in self._history],
        }

    @classmethod
    def resume(cls, space: Space, seed: int, history: Iterable[tuple[Point, float | None]], **params: Any) -> Self:
        """A fresh searcher that replays ``history``; its next asks match the original's."""
        searcher = cls(space, seed, **params)
        for point, score in history:
            searcher.tell(point, score)
        return searcher

    # -- for subclasses -----------------------------------------------------
    @abstractmethod
    def _propose(self, n: int, rng: np.random.Generator, exclude: set[Key]) -> Sequence[Key]:
        """Up to ``n`` keys, preferably allowed and not in ``exclude`` (the base filters)."""

    def _scored(self) -> tuple[list[Key], np.ndarray]:
        """Keys and scores of the history; failures get a penalty below the worst seen."""
        return self._keys, penalised(s for _, s in self._history)


def penalised(scores: Iterable[float | None], margin: float = 0.5) -> np.ndarray:
    """Scores with ``None`` replaced by ``worst - margin * spread`` (spread >= tiny).

    Scale-free, so it works for 1/latency and weighted objectives alike, and it
    keeps failures informative ("this region is bad") without dwarfing the rest.
    """
    vals = list(scores)
    finite = [s for s in vals if s is not None]
    if not finite:
        return np.zeros(len(vals))
    lo, hi = min(finite), max(finite)
    spread = hi - lo or (abs(hi) or 1.0)
    pen = lo - margin * spread
    return np.array([pen if s is None else s for s in vals], dtype=float)
