"""The names of the search algorithms, in a module that imports nothing heavy.

The CLI's ``--algorithm`` choices, ``AdaptSettings.algorithm``, the CRD's
``spec.search.algorithm`` enum and ``search.ALGORITHMS`` all read this one list;
it lives outside ``search/`` so that the operator can validate a policy without
loading scikit-optimize.
"""

from __future__ import annotations

from typing import Literal, get_args

Algorithm = Literal["hybrid", "bayes", "evolution", "random", "grid"]
ALGORITHM_NAMES: tuple[Algorithm, ...] = get_args(Algorithm)
DEFAULT_ALGORITHM: Algorithm = "hybrid"
# The most candidates one search measures: the CLI's --budget, AdaptSettings and the CRD's spec.search.trialBudget
# all accept exactly up to this (the CRD used to accept 10000 and silently run 2000).
MAX_TRIAL_BUDGET = 2000
