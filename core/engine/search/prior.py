"""What the search believes before it measures anything: a prior over the space.

Why a prior: a run measures 5 to 40 candidates, and the first few decide how
good a short search can be. A space-filling start spends them on points chosen
for coverage, not for score, and loses at small budgets to any method that
starts from the known-good defaults. The engine knows more than nothing before
the first trial: its knobs list their choices best-known first (opt level
``all``, per-tensor scales, no kept float layers, sequential execution), the
hardware profile says whether int8 pays here (int8 vs fp32 GEMM peak) and how
many cores there are, and the model says whether transformer fusion applies.
Each knob declares what the prior believes of it (``Knob.spread``,
``Knob.effects``, ``Knob.context_effect`` in ``core.engine.knobs``), so a new
knob states its own belief and this module names no knob.

A ``Prior`` is plain data: an additive table of expected log-score effects per
dimension and choice (so the mean of any point is a sum of lookups), optional
per-point corrections (what a history measured at exact points, interactions
included), how unsure it is about each dimension (``spread``: which knob is
worth trying first), points to measure first, and points to avoid. The
built-in prior (``builtin_prior``) is hand-written from the profile and the
model; ``core.engine.history`` builds a warm one from earlier runs on related
hardware. The hybrid uses it to order its first evaluations and as the mean of
its surrogate, whose ridge then only learns the corrections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from metainfer.core.engine.knobs import DEFAULT_SPREAD, KNOBS, Knob
from metainfer.core.engine.recipe import INT8_MODES
from metainfer.core.engine.search.space import Key, Point, Scalar, Space

# A choice the prior knows nothing about ranks by its position: the knobs list known-good values first.
ORDER_STEP = 0.01


@dataclass(frozen=True)
class SearchContext:
    """The hardware and model facts the surrogate's engine features and the built-in prior read.

    Plain numbers, so a history entry can carry the context it was measured in and its trials can be
    featurised as they were on their own hardware.
    """

    int8_gain: float = 0.0  # log2(int8 GEMM peak / fp32 GEMM peak) of the profile
    logical_cores: int = 1
    physical_cores: int = 1
    transformer: bool = False

    @classmethod
    def from_peaks(
        cls, fp32_gflops: float, int8_gops: float, logical_cores: int, physical_cores: int, transformer: bool
    ) -> SearchContext:
        gain = float(np.log2(max(int8_gops, 1e-6) / max(fp32_gflops, 1e-6)))
        return cls(gain, max(1, logical_cores), max(1, physical_cores), transformer)


def context_features(point: Point, context: SearchContext) -> np.ndarray:
    """The engine's hardware-aware surrogate features of ``point`` on ``context``'s hardware.

    int8 gain x int8 mode lets the surrogate tell a fast-int8 machine from a slow one; threads as a
    share of the cores, and fusion on a transformer, carry between machines of different sizes.
    """
    mode = point.get("quantization")
    gain = context.int8_gain if mode in INT8_MODES else 0.0
    threads = float(point.get("intra_op_num_threads") or 0) / context.logical_cores
    fused = float(point.get("fusion", "none") != "none" and context.transformer)
    return np.array([gain, threads, fused, gain * threads])


@dataclass(frozen=True)
class Prior:
    """Belief about a space before (or besides) this run's measurements; see the module docstring.

    ``effects[i][c]``: expected log-score effect of choice ``c`` of dimension ``i``; ``adjust``: extra
    log-score at exact points; ``first``: points to measure first, in order; ``avoid``: points not to
    measure (known to fail here); ``warm``: the belief comes from measurements (history);
    ``explore``: the prior the start's one-knob moves follow when it is not this one (a warm prior
    keeps the built-in one for them: another class's noise-level preferences, such as the layers its
    winner kept in float, must not steer which knob is tried next); ``sources``: labels of what it was
    learnt from, for the report.
    """

    effects: tuple[np.ndarray, ...]
    spread: tuple[float, ...]
    adjust: Mapping[Key, float] = field(default_factory=dict)
    first: tuple[Key, ...] = ()
    avoid: frozenset[Key] = frozenset()
    warm: bool = False
    explore: Prior | None = None
    sources: tuple[str, ...] = ()

    def mean_keys(self, keys: Sequence[Key]) -> np.ndarray:
        """Prior log-score of each key (only differences between keys mean anything)."""
        if not keys:
            return np.zeros(0)
        idx = np.array(keys, dtype=int)
        out = np.zeros(len(keys))
        for i, table in enumerate(self.effects):
            out += table[idx[:, i]]
        if self.adjust:
            out += np.array([self.adjust.get(k, 0.0) for k in keys])
        return out

    def best_keys(self, space: Space, n: int, exclude: set[Key], limit: int = 4096) -> list[Key]:
        """The ``n`` allowed keys not in ``exclude`` with the highest prior mean (ties: product order)."""
        if space.size <= limit:
            cands = [k for k in space.allowed_keys() if k not in exclude]
        else:  # too big to enumerate: the additive optimum and its neighbours, plus the adjusted points
            best = tuple(int(np.argmax(t)) for t in self.effects)
            cands = [k for k in {best, *space.neighbours(best), *self.adjust} if k not in exclude]
            cands = [k for k in cands if space._key_allowed(k)]
        if not cands:
            return []
        mean = self.mean_keys(cands)
        order = np.argsort(-mean, kind="stable")[:n]
        return [cands[int(i)] for i in order]


def _tag(value: object) -> tuple[bool, object]:
    return (isinstance(value, bool), value)  # True == 1 in Python: keep (1, True) apart


def known_effects(
    knob: Knob | None, choices: Sequence[Scalar], context: SearchContext
) -> dict[tuple[bool, object], float]:
    """The built-in prior's expected log-score effect of each choice it has an opinion on (by tagged value).

    The knob's own declaration: its machine-independent ``effects``, and its ``context_effect`` of each of
    ``choices`` on this hardware and model, which wins where it has an opinion. Choices without an opinion
    (and every choice of a dimension that is no declared knob) rank by their position (``ORDER_STEP``).
    """
    if knob is None:
        return {}
    values = {_tag(v): e for v, e in knob.effects.items()}
    if knob.context_effect is not None:
        for c in choices:
            effect = knob.context_effect(c, context)
            if effect is not None:
                values[_tag(c)] = effect
    return values


def _declared(knobs: Sequence[Knob]) -> dict[str, Knob]:
    return {k.name: k for k in knobs}


def builtin_prior(space: Space, context: SearchContext, *, knobs: Sequence[Knob] = KNOBS) -> Prior:
    """The engine's own prior for ``space`` on ``context``: defaults first, int8 where the profile says it pays.

    Effects (``known_effects``) only rank the start and centre the surrogate, whose ridge learns the
    corrections from this run's measurements. Each dimension's spread is its knob's (``DEFAULT_SPREAD`` for
    a dimension no knob declares).
    """
    declared = _declared(knobs)
    effects = []
    for dim in space.dimensions:
        known = known_effects(declared.get(dim.name), dim.choices, context)
        effects.append(np.array([known.get(_tag(c), -ORDER_STEP * i) for i, c in enumerate(dim.choices)]))
    spread = tuple(declared[d.name].spread if d.name in declared else DEFAULT_SPREAD for d in space.dimensions)
    return Prior(tuple(effects), spread)


def builtin_mean(
    space: Space, points: Sequence[Mapping[str, object]], context: SearchContext, *, knobs: Sequence[Knob] = KNOBS
) -> np.ndarray:
    """The built-in prior's mean of points that need not lie in ``space`` (another class's trials).

    Knobs ``space`` lacks are ignored; a value it does not offer gets the effect the prior gives it
    on ``context`` (threads=2 on a 1-core class) or none.
    """
    declared = _declared(knobs)
    out = np.zeros(len(points))
    for dim in space.dimensions:
        values = [p.get(dim.name, dim.choices[0]) for p in points]
        extra = tuple(
            v for v in values if isinstance(v, str | int | float | bool) and _tag(v) not in map(_tag, dim.choices)
        )
        known = known_effects(declared.get(dim.name), (*dim.choices, *extra), context)
        position = {_tag(c): i for i, c in enumerate(dim.choices)}
        out += np.array([known.get(_tag(v), -ORDER_STEP * position.get(_tag(v), 0)) for v in values])
    return out


# -- a prior warmed by earlier measurements ------------------------------------------------------------
RIDGE_ALPHA = 1.0  # shrinks a source's effects toward "as the built-in prior says" where it measured little
INFEASIBLE_PENALTY = 0.5  # log-score below the prior for a point a related run found infeasible or failed


@dataclass(frozen=True)
class Evidence:
    """One earlier run's trials, with how much they should count here.

    ``weight``: its similarity to this run (0..1). ``context``: *its* hardware and model, so that what
    the built-in prior explains there (a bigger int8 gain, more cores) is not transferred as if it were
    a property of the knobs. ``points`` need not lie in this space (threads=2 measured on a 2-core
    class still says what int8 did there). ``scores``: None for infeasible or failed.
    """

    weight: float
    context: SearchContext
    points: tuple[Mapping[str, object], ...]
    scores: tuple[float | None, ...]
    label: str = ""


def _value_effects(
    space: Space, points: Sequence[Mapping[str, object]], target: np.ndarray
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Ridge on one-hot (knob, value) columns over the source's own points; the effects of this space's
    choices (0 for a value the source never measured) and the residual at each point."""
    columns: dict[tuple[str, tuple[bool, object]], int] = {}
    rows = []
    for p in points:
        row = []
        for dim in space.dimensions:
            v = p.get(dim.name, dim.choices[0])
            row.append(columns.setdefault((dim.name, _tag(v)), len(columns)))
        rows.append(row)
    x = np.zeros((len(points), len(columns)))
    for i, row in enumerate(rows):
        x[i, row] = 1.0
    xc, tc = x - x.mean(axis=0), target - target.mean()
    coef = np.linalg.solve(xc.T @ xc + RIDGE_ALPHA * np.eye(x.shape[1]), xc.T @ tc)
    tables = tuple(
        np.array([coef[columns[(d.name, _tag(c))]] if (d.name, _tag(c)) in columns else 0.0 for c in d.choices])
        for d in space.dimensions
    )
    return tables, tc - xc @ coef


def key_in(space: Space, point: Mapping[str, object]) -> Key | None:
    """The key of ``point`` in ``space`` (a knob it lacks: the first choice); None if a value is foreign."""
    key = []
    for d in space.dimensions:
        value = point.get(d.name, d.choices[0])
        tags = [_tag(c) for c in d.choices]
        if _tag(value) not in tags:
            return None
        key.append(tags.index(_tag(value)))
    return tuple(key)


def warm_prior(
    space: Space,
    base: Prior,
    evidence: Sequence[Evidence],
    first: Sequence[Key] = (),
    avoid: Sequence[Key] = (),
    warm: bool = True,
) -> Prior:
    """``base`` (the built-in prior here) plus what related runs measured beyond their own built-in prior.

    Each source's residuals (log score minus the built-in prior's mean on its own hardware) become
    additive effects per knob value (what the knobs did there that the profile does not explain) and
    exact corrections at the points of this space it measured (interactions, noise). Sources count by
    ``(weight / total weight) x best weight``: one very similar run moves the prior almost fully,
    several split it, and a run that is hardly related barely moves it.
    """
    used = [e for e in evidence if e.weight > 0 and e.points]
    total = sum(e.weight for e in used)
    top = max((e.weight for e in used), default=0.0)
    effects = [t.copy() for t in base.effects]
    adjust: dict[Key, float] = {}
    for e in used:
        share = e.weight / total * top
        ok = [i for i, s in enumerate(e.scores) if s is not None and s > 0]
        if len(ok) >= 2:
            points = [e.points[i] for i in ok]
            resid = np.log([float(e.scores[i] or 0.0) for i in ok]) - builtin_mean(space, points, e.context)
            tables, exact = _value_effects(space, points, resid)
            for i, t in enumerate(tables):
                effects[i] += share * t
            for p, r in zip(points, exact, strict=True):
                if (k := key_in(space, p)) is not None:
                    adjust[k] = adjust.get(k, 0.0) + share * float(r)
        for p, s in zip(e.points, e.scores, strict=True):
            if s is None and (k := key_in(space, p)) is not None:
                adjust[k] = adjust.get(k, 0.0) - share * INFEASIBLE_PENALTY
    return Prior(
        tuple(effects),
        base.spread,
        adjust,
        first=tuple(dict.fromkeys(first)),
        avoid=frozenset(avoid),
        warm=warm,
        explore=base,
        sources=tuple(e.label for e in used),
    )


def project(space: Space, point: Mapping[str, object], prior: Prior | None = None) -> Key | None:
    """The allowed key closest to ``point``: equal where possible, else the most dimensions equal.

    A knob ``point`` lacks takes its first choice; a value this space does not offer (threads=2 on a
    1-core class) is replaced by the nearest numeric choice, else the first. Ties between allowed keys
    equally close go to the higher prior mean. None when nothing is allowed or the space is too big.
    """
    want: list[int] = []
    for d in space.dimensions:
        value = point.get(d.name, d.choices[0])
        tags = [_tag(c) for c in d.choices]
        if _tag(value) in tags:
            want.append(tags.index(_tag(value)))
        elif d.ordinal and isinstance(value, int | float) and not isinstance(value, bool):
            vals = np.array(d.choices, dtype=float)
            want.append(int(np.argmin(np.abs(vals - float(value)))))
        else:
            want.append(0)
    key = tuple(want)
    if space._key_allowed(key):
        return key
    try:
        allowed = space.allowed_keys()
    except ValueError:
        return None
    if not allowed:
        return None
    agree = (np.array(allowed, dtype=int) == np.array(key)).sum(axis=1).astype(float)
    if prior is not None:
        mean = prior.mean_keys(allowed)
        agree += 1e-3 * (mean - mean.min()) / (float(np.ptp(mean)) or 1.0)
    return allowed[int(np.argmax(agree))]
