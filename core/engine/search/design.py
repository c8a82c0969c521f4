"""Space-filling initial designs for categorical spaces.

With a budget of 5 to 40 real evaluations, the first few points decide how
much every later model learns. A random start often repeats a quantization
mode and misses another; this greedy design instead covers every choice of
every dimension as evenly as it can (like a Latin hypercube, but for
categories), and breaks ties by Hamming distance so points differ in many
dimensions at once. That gives a one-hot linear model the main effects of all
dimensions after roughly as many points as the largest dimension has choices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metainfer.core.engine.search.space import Key, Space

_POOL = 512


def diverse_keys(
    space: Space,
    rng: np.random.Generator,
    n: int,
    exclude: set[Key],
    already: Sequence[Key] = (),
) -> list[Key]:
    """``n`` allowed keys not in ``exclude`` that best complement ``already``.

    Coverage score of a candidate: for each dimension, 1 / (1 + how often its
    choice was already used), normalised by the number of choices so that big
    dimensions do not dominate. Candidates come from a random allowed pool.
    """
    pool = space.sample(rng, _POOL, exclude)
    if not pool:
        return []
    cand = np.array(pool, dtype=int)  # (m, d)
    dims = space.dimensions
    counts = [np.zeros(len(d.choices)) for d in dims]
    chosen: list[np.ndarray] = []
    for k in already:
        for i, c in enumerate(k):
            counts[i][c] += 1
        chosen.append(np.array(k))
    # choices that are never allowed must not keep attracting the design
    reachable = [np.bincount(cand[:, i], minlength=len(d.choices)) > 0 for i, d in enumerate(dims)]
    alive = np.ones(len(pool), dtype=bool)
    out: list[Key] = []
    for _ in range(min(n, len(pool))):
        cover = np.zeros(len(pool))
        for i in range(len(dims)):
            level = counts[i][reachable[i]].min() if reachable[i].any() else 0.0
            cover += (counts[i][cand[:, i]] <= level) * 1.0
        ham = np.min([(cand != c).sum(axis=1) for c in chosen], axis=0) if chosen else np.zeros(len(pool))
        jitter = rng.random(len(pool)) * 1e-3
        total = np.where(alive, cover * 100 + ham + jitter, -np.inf)
        best = int(np.argmax(total))
        alive[best] = False
        key = pool[best]
        out.append(key)
        chosen.append(cand[best])
        for i, c in enumerate(key):
            counts[i][c] += 1
    return out
