"""Steady-state evolutionary search over categorical dimensions.

Why steady-state (mu + lambda): trials arrive one at a time and may be told in
any order, so there are no generation barriers. The population is simply the
``population_size`` best trials of the whole history, which makes elitism
automatic (the best point always stays a parent) and makes the state a pure
function of the history, as resume requires.

Offspring come from tournament selection, uniform crossover and per-dimension
mutation (rate ~ 1/d, at least one dimension changes), retried until they are
allowed and unseen. The first ``population_size`` points are a space-filling
design rather than random ones, so every choice of every dimension is tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from metainfer.core.engine.search.base import Searcher
from metainfer.core.engine.search.design import diverse_keys
from metainfer.core.engine.search.space import Key, Space

_RETRIES = 50


class EvolutionSearcher(Searcher):
    """Tournament selection, uniform crossover, categorical mutation, elitism."""

    algorithm = "evolution"

    def __init__(
        self,
        space: Space,
        seed: int = 0,
        population_size: int = 8,
        tournament_size: int = 3,
        crossover_rate: float = 0.5,
        mutation_rate: float | None = None,
    ) -> None:
        super().__init__(space, seed)
        self.population_size = population_size
        self.tournament_size = tournament_size
        self.crossover_rate = crossover_rate
        self.mutation_rate = mutation_rate if mutation_rate is not None else 1.0 / max(1, len(space.names))

    def params(self) -> dict[str, Any]:
        return {
            "population_size": self.population_size,
            "tournament_size": self.tournament_size,
            "crossover_rate": self.crossover_rate,
            "mutation_rate": self.mutation_rate,
        }

    def _propose(self, n: int, rng: np.random.Generator, exclude: set[Key]) -> Sequence[Key]:
        n_init = self.population_size - len(self._history) - (len(exclude) - len(self._seen))
        out: list[Key] = []
        if n_init > 0:
            out = diverse_keys(self.space, rng, min(n, n_init), exclude, already=list(exclude))
        if len(out) < n and self._history:
            out += self.offspring(n - len(out), rng, exclude | set(out))
        return out

    def population(self) -> tuple[list[Key], np.ndarray]:
        """The best ``population_size`` trials (failures rank last)."""
        keys, scores = self._scored()
        order = np.argsort(-scores, kind="stable")[: self.population_size]
        return [keys[int(i)] for i in order], scores[order]

    def offspring(self, n: int, rng: np.random.Generator, exclude: set[Key]) -> list[Key]:
        """Up to ``n`` distinct allowed children of the current population."""
        pop, fit = self.population()
        if not pop:
            return []
        taken = set(exclude)
        out: list[Key] = []
        for _ in range(n * _RETRIES):
            if len(out) == n:
                break
            child = self._select(pop, fit, rng)
            if rng.random() < self.crossover_rate and len(pop) > 1:
                child = self.space.crossover(child, self._select(pop, fit, rng), rng)
            child = self.space.mutate(child, rng, self.mutation_rate)
            if child not in taken and self.space._key_allowed(child):
                taken.add(child)
                out.append(child)
        return out

    def _select(self, pop: list[Key], fit: np.ndarray, rng: np.random.Generator) -> Key:
        contenders = rng.integers(len(pop), size=min(self.tournament_size, len(pop)))
        return pop[int(max(contenders, key=lambda i: fit[i]))]
