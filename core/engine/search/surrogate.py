"""A cheap learned model that ranks proposals before they reach hardware.

Why linear: with 5-40 trials, a ridge regression over one-hot choices (plus the
engine's own features such as predicted cost from op counts) is about as much
model as the data supports, fits in a millisecond and extrapolates main
effects to combinations never tried. Latency-like objectives are roughly
multiplicative across knobs, so when every score is positive the model is fit
on log(score), where those effects become additive.

Failed or infeasible trials are kept out of the regression (they have no
meaningful score) but feed a feasibility classifier; a point's predicted score
moves toward the penalty only when p(feasible) < 0.5, so likely failures rank low
without distorting the performance model.

With a prior mean (``prior``: log-score per key, see ``search.prior``), the
ridge learns only this run's corrections to it: before any measurement the
surrogate ranks by the prior, and ridge shrinkage keeps it there until the
measurements say otherwise. That is how a warm start's history, or the
engine's built-in defaults, steer the first evaluations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from metainfer.core.engine.search.space import Key, Point, Space

# scikit-learn is imported where a surrogate is built (a hybrid search), not here: for the reason skopt is (bayes.py).
if TYPE_CHECKING:
    from sklearn.linear_model import LogisticRegression

Featurizer = Callable[[Point], np.ndarray]
PriorMean = Callable[[Sequence[Key]], np.ndarray]
_ALPHAS = tuple(float(a) for a in np.logspace(-2, 2, 9))


class Surrogate:
    """Ridge regression on ``space.encode(point)`` plus optional extra features."""

    def __init__(
        self,
        space: Space,
        featurizer: Featurizer | None = None,
        min_history: int = 3,
        prior: PriorMean | None = None,
    ) -> None:
        self.space = space
        self.featurizer = featurizer
        self.min_history = min_history
        self.prior = prior
        self.fitted = prior is not None  # a prior ranks before the first measurement
        self._ridge_fitted = False
        self._offset = 0.0
        self._fitted_on = -1
        self._log = prior is not None  # the prior is in log-score units; the first scores may say otherwise
        self._penalty = 0.0
        from sklearn.linear_model import RidgeCV
        from sklearn.preprocessing import StandardScaler

        self._scaler = StandardScaler()
        self._ridge = RidgeCV(alphas=_ALPHAS)
        self._clf: LogisticRegression | None = None

    def features(self, keys: Sequence[Key]) -> np.ndarray:
        x = self.space.encode_keys(keys)
        if self.featurizer is None or not keys:
            return x
        extra = np.array([np.ravel(self.featurizer(self.space.point(k))) for k in keys], dtype=float)
        return np.hstack([x, extra])

    def fit(self, history: Sequence[tuple[Point, float | None]]) -> Surrogate:
        """Refit from scratch on the whole history (cheap, and keeps it a pure function)."""
        if self.fitted and self._fitted_on == len(history):
            return self  # histories only grow, so the length identifies the fit
        self._fitted_on = len(history)
        keys = [self.space.key(p) for p, _ in history]
        ok = np.array([s is not None for _, s in history], dtype=bool)
        y = np.array([s if s is not None else np.nan for _, s in history], dtype=float)
        self._log = bool(np.all(y[ok] > 0))
        # The prior is in log-score units: it centres the model only when the scores can be logged.
        use_prior = self.prior is not None and self._log
        base = self.prior(keys) if use_prior and self.prior is not None else np.zeros(len(keys))
        t_all = np.log(np.where(ok, y, 1.0)) if self._log else np.where(ok, y, 0.0)
        self._offset = float(np.mean(t_all[ok] - base[ok])) if use_prior and ok.any() else 0.0
        self._ridge_fitted = int(ok.sum()) >= self.min_history
        self.fitted = self._ridge_fitted or use_prior
        self._clf = None
        if not self._ridge_fitted:
            if ok.any():
                self._penalty = float(t_all[ok].min()) - 0.5 * (float(np.ptp(t_all[ok])) or 1.0)
            return self
        x = self._scaler.fit_transform(self.features(keys))
        t = t_all[ok] - (base[ok] + self._offset if use_prior else 0.0)
        self._ridge.fit(x[ok], t)
        t = t_all[ok]
        spread = float(t.max() - t.min()) or 1.0
        self._penalty = float(t.min()) - 0.5 * spread
        if int((~ok).sum()) > 0:
            from sklearn.linear_model import LogisticRegression

            self._clf = LogisticRegression(C=1.0, solver="liblinear").fit(x, ok.astype(int))
        return self

    def predict_keys(self, keys: Sequence[Key]) -> np.ndarray:
        """Predicted score in the caller's units (higher is better)."""
        if not self.fitted or not keys:
            return np.full(len(keys), np.nan)
        use_prior = self.prior is not None and self._log
        t = self.prior(keys) + self._offset if use_prior and self.prior is not None else np.zeros(len(keys))
        if not self._ridge_fitted:
            out0: np.ndarray = np.exp(t) if self._log else t
            return out0
        x = self._scaler.transform(self.features(keys))
        t = t + self._ridge.predict(x)
        if self._clf is not None:
            # Only confident infeasibility demotes a point: blending every prediction
            # with the penalty let a noisy classifier swamp the performance ranking.
            p = self._clf.predict_proba(x)[:, 1]
            doubt = np.clip(2 * (0.5 - p), 0.0, 1.0)
            t = (1 - doubt) * t + doubt * self._penalty
        out: np.ndarray = np.exp(t) if self._log else t
        return out

    def predict(self, points: Sequence[Point]) -> np.ndarray:
        return self.predict_keys([self.space.key(p) for p in points])

    def rank(self, points: Sequence[Point]) -> list[tuple[Point, float | None]]:
        """Points best-first with their predictions; input order while unfitted."""
        if not self.fitted:
            return [(p, None) for p in points]
        pred = self.predict(points)
        order = np.argsort(-pred, kind="stable")
        return [(points[int(i)], float(pred[i])) for i in order]
