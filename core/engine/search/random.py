"""Uniform random search over the allowed points: the baseline every other
algorithm must beat, and a surprisingly strong one on small budgets."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metainfer.core.engine.search.base import Searcher
from metainfer.core.engine.search.space import Key


class RandomSearcher(Searcher):
    """Samples allowed, unseen points uniformly (rejection sampling, then enumeration)."""

    algorithm = "random"

    def _propose(self, n: int, rng: np.random.Generator, exclude: set[Key]) -> Sequence[Key]:
        return self.space.sample(rng, n, exclude)
