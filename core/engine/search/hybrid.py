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

With a ``Prior`` (``search.prior``: the engine's built-in one, or one warmed
by history) the start changes, because a short search cannot afford points
chosen for coverage alone:

- the prior's ``first`` points (a related run's winner) are measured first,
  and its ``avoid`` points (known to fail here) never;
- cold (a built-in prior): the start is a coordinate design instead of a
  space-filling one. It measures the prior's best point, then moves one knob
  at a time from the best point measured so far, preferring knobs not yet
  tried and, among them, those the prior is least sure of (threads, numeric
  format) over those it knows (opt level, calibration). Every move covers a
  new choice, so the surrogate still learns main effects, and every move
  starts from the best point known, so the best-so-far climbs from the first
  evaluation;
- warm (a history prior): no exploratory start; the surrogate, centred on the
  prior, ranks the pool from the first ask;
- the pool also holds the best point's one-knob neighbours and the prior's
  best points, so the surrogate can pick a single move that the evolutionary
  operators might not draw.
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
from metainfer.core.engine.search.prior import Prior
from metainfer.core.engine.search.space import Key, Point, Space
from metainfer.core.engine.search.surrogate import Featurizer, Surrogate

SECOND_KNOB_COST = 0.01  # log-score a start move pays for resetting a second knob along with the first
MOVE_ENUMERATE_LIMIT = 100_000


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
        prior: Prior | None = None,
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
        self.prior = prior
        self.surrogate = Surrogate(space, featurizer, prior=prior.mean_keys if prior is not None else None)
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
        if self.prior is not None:
            return self._propose_with_prior(self.prior, n, rng, exclude)
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

    def _propose_with_prior(self, prior: Prior, n: int, rng: np.random.Generator, exclude: set[Key]) -> list[Key]:
        started = len(exclude)  # told + pending
        taken = exclude | prior.avoid
        out: list[Key] = []
        for k in prior.first:
            if len(out) < n and k not in taken and self.space._key_allowed(k):
                out.append(k)
                taken.add(k)
        while len(out) < n and started + len(out) < self.n_initial:
            move = self._design_move(prior, taken, [*self._pending, *out])
            if move is None:
                break
            out.append(move)
            taken.add(move)
        if len(out) < n:
            want = n - len(out)
            anchor = self._anchor(prior, taken)
            pool = [k for k in self.space.neighbours(anchor) if k not in taken] if anchor is not None else []
            pool += self._evo.offspring(self.pool_factor * want, rng, taken | set(pool))
            pool += prior.best_keys(self.space, self.pool_factor * want, taken | set(pool))
            if started + len(out) >= self.coarse_end:
                bayes = [k for k, _ in self._bayes.acquire_pool(self.bayes_share * want, rng, taken)]
                pool = bayes + [k for k in pool if k not in set(bayes)]
            out += self._filter(list(dict.fromkeys(pool)), want)
        self._record(out)
        return out

    def _anchor(self, prior: Prior, taken: set[Key]) -> Key | None:
        """The best point measured so far; before any, the prior's best point."""
        best = self.best()
        if best is not None:
            return self.space.key(best[0])
        firsts = prior.best_keys(self.space, 1, set(prior.avoid))
        return firsts[0] if firsts else None

    def _moves(self, anchor: Key) -> list[Key]:
        """Points one knob away from ``anchor``, and (in spaces small enough to list) two knobs away where
        the second returns to its first choice: a knob that only matters with another one (layers kept in
        float with int8) goes back to its default when the first moves, instead of carrying the old value."""
        near = self.space.neighbours(anchor)
        if self.space.size > MOVE_ENUMERATE_LIMIT:
            return near
        a = np.array(anchor)
        allowed = np.array(self.space.allowed_keys())
        changed = allowed != a
        to_default = (changed & (allowed == 0)).any(axis=1)
        return near + [
            tuple(int(v) for v in allowed[i]) for i in np.flatnonzero((changed.sum(axis=1) == 2) & to_default)
        ]

    def _design_move(self, prior: Prior, taken: set[Key], pending: list[Key]) -> Key | None:
        """The cold start's next point: the prior's best, then one-knob moves from the best measured point."""
        tried = [*self._keys, *pending]
        if not tried:
            firsts = prior.best_keys(self.space, 1, taken)
            return firsts[0] if firsts else None
        anchor = self._anchor(prior, taken)
        if anchor is None:
            anchor = tried[0]
        prior = prior.explore or prior
        cands = [k for k in self._moves(anchor) if k not in taken]
        if not cands:
            return None
        varied = np.array([len({k[i] for k in tried}) > 1 for i in range(len(anchor))])
        gain = prior.mean_keys(cands) - float(prior.mean_keys([anchor])[0])
        changed = np.array(cands) != np.array(anchor)  # (candidates, dimensions)
        # A move into an untried dimension earns the prior's doubt about it; resetting a second knob costs a
        # little, so that it happens only where the prior says the reset pays.
        spread = np.array(prior.spread)
        bonus = np.max(np.where(changed & ~varied, spread, 0.0), axis=1) - SECOND_KNOB_COST * (changed.sum(axis=1) - 1)
        return cands[int(np.argmax(gain + bonus))]

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
