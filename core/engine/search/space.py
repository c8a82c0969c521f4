"""A discrete search space of named categorical dimensions.

Every knob metainfer tunes (quantization mode, graph optimisation level,
threads...) has a handful of values, so the space is a product of finite
choice lists. Points are plain ``dict[str, scalar]`` so they cross process
boundaries as JSON; internally a point is keyed by its tuple of choice indices,
which is hashable and independent of how JSON spelled the values.

The caller's ``constraint`` prunes combinations that must never be evaluated
(unsupported ops on an execution provider, per-channel scales on fp32...).
When the caller also gives the constraint's ``rules`` one by one, the allowed
points are enumerated depth first, a rule pruning every completion of a
partial point as soon as the dimensions it reads are set: the product of the
knobs runs to billions (most knobs only mean something for one numeric
format), the allowed points to thousands. A rule reads a point by indexing
(``p["name"]``), never with ``get``, so that an unset dimension is noticed.
Every algorithm draws its candidates through this module, so none of them can
propose a disallowed point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

Scalar = str | int | float | bool | None
Point = dict[str, Scalar]
Key = tuple[int, ...]
Constraint = Callable[[Point], bool]


class _Unset(Exception):
    """A rule read a dimension the partial point has not set yet: it cannot decide."""


class _Partial(dict[str, Scalar]):
    def __missing__(self, name: str) -> Scalar:
        raise _Unset(name)


_ENUMERATE_LIMIT = 2_000_000  # beyond this, exhaustive fallbacks would take too long
_SMALL_SPACE = 100_000  # up to this, sampling enumerates the allowed points (cached)


def _tag(value: object) -> tuple[bool, object]:
    # True == 1 in Python; tagging bools keeps (1, True) distinct choices.
    return (isinstance(value, bool), value)


@dataclass(frozen=True)
class Dimension:
    """One knob and its finite list of choices, in a meaningful order."""

    name: str
    choices: tuple[Scalar, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"dimension {self.name!r} has no choices")
        for c in self.choices:
            if c is not None and not isinstance(c, str | int | float | bool):
                raise ValueError(f"dimension {self.name!r}: choice {c!r} is not a JSON scalar")
        if len({_tag(c) for c in self.choices}) != len(self.choices):
            raise ValueError(f"dimension {self.name!r} has duplicate choices")

    @property
    def ordinal(self) -> bool:
        """Numeric choices (threads, batch) whose magnitude carries meaning."""
        return len(self.choices) > 1 and all(
            isinstance(c, int | float) and not isinstance(c, bool) for c in self.choices
        )

    def index(self, value: Scalar) -> int:
        for i, c in enumerate(self.choices):
            if _tag(c) == _tag(value):
                return i
        raise ValueError(f"{value!r} is not a choice of dimension {self.name!r}")


class Space:
    """Product of dimensions, optionally restricted by an ``is_allowed`` predicate."""

    def __init__(
        self,
        dimensions: Sequence[Dimension],
        constraint: Constraint | None = None,
        rules: Sequence[Constraint] = (),
    ) -> None:
        names = [d.name for d in dimensions]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate dimension names in {names}")
        self.dimensions: tuple[Dimension, ...] = tuple(dimensions)
        self.names: tuple[str, ...] = tuple(names)
        self.constraint = constraint
        self.rules = tuple(rules)
        self._allowed: list[Key] | None = None

    @property
    def size(self) -> int:
        """Number of points in the full product, before the constraint."""
        return math.prod(len(d.choices) for d in self.dimensions)

    def key(self, point: Point) -> Key:
        """Hashable identity of a point; raises ValueError for foreign points."""
        if set(point) != set(self.names):
            raise ValueError(f"point keys {sorted(point)} != dimensions {sorted(self.names)}")
        return tuple(d.index(point[d.name]) for d in self.dimensions)

    def point(self, key: Key) -> Point:
        return {d.name: d.choices[i] for d, i in zip(self.dimensions, key, strict=True)}

    def contains(self, point: Point) -> bool:
        try:
            self.key(point)
        except ValueError:
            return False
        return True

    def is_allowed(self, point: Point) -> bool:
        return self.contains(point) and (self.constraint is None or bool(self.constraint(point)))

    def _key_allowed(self, key: Key) -> bool:
        return self.constraint is None or bool(self.constraint(self.point(key)))

    def enumerate(self) -> Iterator[Point]:
        """All points of the product in ``itertools.product`` order (constraint ignored)."""
        for key in itertools.product(*(range(len(d.choices)) for d in self.dimensions)):
            yield self.point(key)

    def allowed_keys(self) -> list[Key]:
        """Keys of every allowed point, in product order; computed once."""
        if self._allowed is None:
            if self.rules:
                self._allowed = self._depth_first()
                return self._allowed
            if self.size > _ENUMERATE_LIMIT:
                raise ValueError(f"space of {self.size} points is too large to enumerate")
            ranges = [range(len(d.choices)) for d in self.dimensions]
            self._allowed = [k for k in itertools.product(*ranges) if self._key_allowed(k)]
        return self._allowed

    def _depth_first(self) -> list[Key]:
        """The allowed keys in product order, by extending partial points that no rule has ruled out yet; each
        rule is asked again only until it has decided (a rule that passed a partial point passes its
        completions: it read only dimensions that are set there)."""
        allowed: list[Key] = []
        point = _Partial()
        dims = self.dimensions

        def extend(depth: int, key: tuple[int, ...], undecided: tuple[Constraint, ...]) -> None:
            if depth == len(dims):
                if not undecided and self._key_allowed(key):  # the whole constraint has the last word
                    allowed.append(key)
                return
            dim = dims[depth]
            for index, choice in enumerate(dim.choices):
                point[dim.name] = choice
                still: list[Constraint] = []
                ruled_out = False
                for rule in undecided:
                    try:
                        if not rule(point):
                            ruled_out = True
                            break
                    except _Unset:
                        still.append(rule)
                if not ruled_out:
                    extend(depth + 1, (*key, index), tuple(still))
            del point[dim.name]

        extend(0, (), self.rules)
        return allowed

    def allowed_points(self) -> list[Point]:
        return [self.point(k) for k in self.allowed_keys()]

    def sample(self, rng: np.random.Generator, n: int, exclude: set[Key]) -> list[Key]:
        """Up to ``n`` distinct allowed keys not in ``exclude``, uniformly.

        Small spaces are enumerated (exact and fast); large ones use rejection
        sampling and fall back to enumeration only when that stalls, so fewer
        than ``n`` keys come back only when the allowed space is exhausted.
        """
        if n < 1:
            return []
        if self.size > _SMALL_SPACE:
            out: list[Key] = []
            taken = set(exclude)
            sizes = [len(d.choices) for d in self.dimensions]
            for _ in range(8):
                for row in rng.integers(0, sizes, size=(4 * n + 16, len(sizes))):
                    k = tuple(int(v) for v in row)
                    if k not in taken and self._key_allowed(k):
                        taken.add(k)
                        out.append(k)
                        if len(out) == n:
                            return out
            return out + self._pick([k for k in self.allowed_keys() if k not in taken], rng, n - len(out))
        return self._pick([k for k in self.allowed_keys() if k not in exclude], rng, n)

    @staticmethod
    def _pick(rest: list[Key], rng: np.random.Generator, n: int) -> list[Key]:
        if n >= len(rest):
            return [rest[int(i)] for i in rng.permutation(len(rest))]
        return [rest[int(i)] for i in rng.choice(len(rest), size=n, replace=False)]

    def mutate(self, key: Key, rng: np.random.Generator, rate: float) -> Key:
        """Resample each dimension with probability ``rate``; at least one changes."""
        movable = [i for i, d in enumerate(self.dimensions) if len(d.choices) > 1]
        if not movable:
            return key
        new = list(key)
        flips = [i for i in movable if rng.random() < rate] or [movable[int(rng.integers(len(movable)))]]
        for i in flips:
            others = [c for c in range(len(self.dimensions[i].choices)) if c != key[i]]
            new[i] = others[int(rng.integers(len(others)))]
        return tuple(new)

    def crossover(self, a: Key, b: Key, rng: np.random.Generator) -> Key:
        """Uniform crossover: each dimension from either parent."""
        return tuple(x if rng.random() < 0.5 else y for x, y in zip(a, b, strict=True))

    def neighbours(self, key: Key) -> list[Key]:
        """Allowed keys that differ from ``key`` in exactly one dimension."""
        out = []
        for i, d in enumerate(self.dimensions):
            for c in range(len(d.choices)):
                if c != key[i]:
                    k = (*key[:i], c, *key[i + 1 :])
                    if self._key_allowed(k):
                        out.append(k)
        return out

    @property
    def n_features(self) -> int:
        return sum(len(d.choices) + (1 if d.ordinal else 0) for d in self.dimensions)

    def encode(self, point: Point) -> np.ndarray:
        row: np.ndarray = self.encode_keys([self.key(point)])[0]
        return row

    def encode_keys(self, keys: Sequence[Key]) -> np.ndarray:
        """One-hot per dimension, plus a [0, 1]-scaled value for ordinal dimensions.

        The scaled value lets a linear model extrapolate along "more threads"
        instead of learning each choice separately.
        """
        x = np.zeros((len(keys), self.n_features))
        col = 0
        for i, d in enumerate(self.dimensions):
            idx = np.fromiter((k[i] for k in keys), dtype=int, count=len(keys))
            x[np.arange(len(keys)), col + idx] = 1.0
            col += len(d.choices)
            if d.ordinal:
                vals = np.array(d.choices, dtype=float)
                span = float(vals.max() - vals.min()) or 1.0
                x[:, col] = (vals[idx] - vals.min()) / span
                col += 1
        return x
