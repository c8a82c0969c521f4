"""Exhaustive grid search in a fixed order.

Useful as a baseline and, with a budget that covers the allowed space, as the
exhaustive reference of the search-efficiency benchmark. ``itertools.product``
order walks the last dimension fastest, so a small budget only explores the
first choices of the leading dimensions; ``shuffle=True`` visits the grid in a
seed-determined random order instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from metainfer.core.engine.search.base import Searcher
from metainfer.core.engine.search.space import Key, Space


class GridSearcher(Searcher):
    """Visits allowed points in product order (or a seeded permutation of it)."""

    algorithm = "grid"

    def __init__(self, space: Space, seed: int = 0, shuffle: bool = False) -> None:
        super().__init__(space, seed)
        self.shuffle = shuffle
        self._order: list[Key] | None = None

    def params(self) -> dict[str, Any]:
        return {"shuffle": self.shuffle}

    def _propose(self, n: int, rng: np.random.Generator, exclude: set[Key]) -> Sequence[Key]:
        if self._order is None:
            order = list(self.space.allowed_keys())
            if self.shuffle:
                perm = np.random.default_rng(self.seed % 2**63).permutation(len(order))
                order = [order[int(i)] for i in perm]
            self._order = order
        out: list[Key] = []
        for k in self._order:
            if k not in exclude:
                out.append(k)
                if len(out) == n:
                    break
        return out
