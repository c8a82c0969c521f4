"""The default search: space-filling start, evolutionary coarse phase,
Bayesian fine phase, and a surrogate that decides what reaches hardware.

Why this shape: real evaluations are the scarce resource (seconds to minutes
each, 5-40 per run), proposals are free. So every ask draws a pool several
times larger than needed from the phase's generator and lets the cheap linear
surrogate pick the most promising members.

- Start: a space-filling design touches every choice of every dimension, so
  the surrogate learns all main effects before it is trusted.
- Coarse (first ``coarse_fraction`` of the budget): evolutionary offspring of
  the best trials; broad moves, crossover recombines good knobs.
- Fine (the rest): the skopt model's top candidates by expected improvement,
  which also captures interactions the linear surrogate cannot see.

The surrogate's prediction for each asked point is kept (``predicted_score``)
so the engine can record predicted against measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from metainfer.core.engine.search.base import Searcher
from metainfer.core.engine.search.bayes import BayesSearcher
from metainfer.core.engine.search.design import diverse_keys
from metainfer.core.engine.search.evolution import EvolutionSearcher
from metainfer.core.engine.search.space import Key, Point, Space
from metainfer.core.engine.search.surrogate import Featurizer, Surrogate


class HybridSearcher(Searcher):
    """Evolution then Bayes, both filtered through a ridge surrogate."""

    algorithm = "hybrid"

    def __init__(
        self,
        space: Space,
        seed: int = 0,
        budget: int = 40,
        featurizer: Featurizer | None = None,
        coarse_fraction: float = 0.4,
        min_coarse: int = 8,
        n_initial: int | None = None,
        pool_factor: int = 8,
        use_surrogate: bool = True,
        bayes_share: int = 2,
    ) -> None:
        super().__init__(space, seed)
        self.budget = budget
        self.coarse_fraction = coarse_fraction
        self.min_coarse = min_coarse
        dims = max((len(d.choices) for d in space.dimensions), default=1)
        self.n_initial = n_initial if n_initial is not None else max(3, min(dims + 1, budget // 4))
        self.pool_factor = pool_factor
        self.use_surrogate = use_surrogate
        self.bayes_share = bayes_share
        self.surrogate = Surrogate(space, featurizer)
        self._evo = EvolutionSearcher(space, seed, population_size=max(4, self.n_initial))
        self._bayes = BayesSearcher(space, seed, n_initial_points=0)
        self._predictions: dict[Key, float] = {}

    def params(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "coarse_fraction": self.coarse_fraction,
            "min_coarse": self.min_coarse,
            "n_initial": self.n_initial,
            "pool_factor": self.pool_factor,
            "use_surrogate": self.use_surrogate,
            "bayes_share": self.bayes_share,
        }

    @property
    def coarse_end(self) -> int:
        """Trials after which the fine (Bayesian) phase starts."""
        return max(self.min_coarse, math.ceil(self.coarse_fraction * self.budget))

    def tell(self, point: Point, score: float | None) -> None:
        super().tell(point, score)
        self._evo.tell(point, score)
        self._bayes.tell(point, score)

    def predicted_score(self, point: Point) -> float | None:
        return self._predictions.get(self.space.key(point))

    def _propose(self, n: int, rng: np.random.Generator, exclude: set[Key]) -> Sequence[Key]:
        started = len(exclude)  # told + pending
        out: list[Key] = []
        n_init = self.n_initial - started
        if n_init > 0:
            out = diverse_keys(self.space, rng, min(n, n_init), exclude, already=list(exclude))
        if len(out) < n:
            want = n - len(out)
            taken = exclude | set(out)
            pool = self._evo.offspring(self.pool_factor * want, rng, taken)
            if started + len(out) >= self.coarse_end:
                # fine phase: the trees' best expected improvements compete with local moves,
                # so interactions the linear surrogate cannot see still get proposed
                bayes = [k for k, _ in self._bayes.acquire_pool(self.bayes_share * want, rng, taken)]
                pool = bayes + [k for k in pool if k not in set(bayes)]
            out += self._filter(pool, want)
        self._record(out)
        return out

    def _filter(self, pool: list[Key], n: int) -> list[Key]:
        if not self.use_surrogate:
            return pool[:n]
        self.surrogate.fit(self._history)
        if not self.surrogate.fitted:
            return pool[:n]
        pred = self.surrogate.predict_keys(pool)
        return [pool[int(i)] for i in np.argsort(-pred, kind="stable")[:n]]

    def _record(self, keys: list[Key]) -> None:
        if not self.use_surrogate or not keys:
            return
        self.surrogate.fit(self._history)
        if self.surrogate.fitted:
            for k, p in zip(keys, self.surrogate.predict_keys(keys), strict=True):
                self._predictions[k] = float(p)
