"""Search algorithms behind one ask/tell interface, seeded and resumable.

``make_searcher`` is the entry point the engine uses; ``hybrid`` is the
default. Every searcher proposes only allowed, never-repeated points of a
``Space`` and can be rebuilt from its trial history (``Searcher.resume``).
"""

from __future__ import annotations

from metainfer.core.engine.algorithms import Algorithm
from metainfer.core.engine.search.base import History, Searcher, penalised
from metainfer.core.engine.search.bayes import BayesSearcher
from metainfer.core.engine.search.evolution import EvolutionSearcher
from metainfer.core.engine.search.grid import GridSearcher
from metainfer.core.engine.search.hybrid import HybridSearcher
from metainfer.core.engine.search.prior import Prior, SearchContext, builtin_prior, context_features
from metainfer.core.engine.search.random import RandomSearcher
from metainfer.core.engine.search.space import Constraint, Dimension, Key, Point, Scalar, Space
from metainfer.core.engine.search.surrogate import Featurizer, Surrogate

ALGORITHMS: dict[Algorithm, type[Searcher]] = {
    cls.algorithm: cls for cls in (HybridSearcher, BayesSearcher, EvolutionSearcher, RandomSearcher, GridSearcher)
}


def make_searcher(
    algorithm: Algorithm,
    space: Space,
    seed: int,
    budget: int,
    featurizer: Featurizer | None = None,
    prior: Prior | None = None,
) -> Searcher:
    """The named algorithm, configured for ``budget`` evaluations.

    Only the hybrid uses ``budget`` (to place its coarse/fine switch), ``featurizer``
    (extra surrogate features) and ``prior`` (its start and its surrogate's mean, see
    ``search.prior``); the others ignore them.
    """
    if algorithm == "hybrid":
        return HybridSearcher(space, seed, budget=budget, featurizer=featurizer, prior=prior)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[algorithm](space, seed)


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BayesSearcher",
    "Constraint",
    "Dimension",
    "EvolutionSearcher",
    "Featurizer",
    "GridSearcher",
    "History",
    "HybridSearcher",
    "Key",
    "Point",
    "Prior",
    "RandomSearcher",
    "Scalar",
    "SearchContext",
    "Searcher",
    "Space",
    "Surrogate",
    "builtin_prior",
    "context_features",
    "make_searcher",
    "penalised",
]
