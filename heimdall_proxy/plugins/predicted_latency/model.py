"""One online regression of a latency (TTFT or TPOT) from a pod's load features, with a
learned per-pod speed factor.

The regression itself is scikit-learn's `SGDRegressor`, trained with `partial_fit` on small
batches of what the gateway observed. Prediction does not call `SGDRegressor.predict`: its
input validation costs more than the arithmetic at 64 candidates, so the learned
coefficients are copied out after each training step and applied with one numpy product
over all candidates at once.

Why a per-pod factor: the load features (queue, running, KV use, prompt size) look alike on
a fast pod and a slow one, so one shared regression averages them. Latency on a pod several
times slower per token is that many times higher at the same load, so each pod's prediction
is the shared regression times a factor learned online for that pod: an exponentially
weighted mean of actual / shared prediction. The shared regression is trained on actual /
factor, i.e. on what the pod would have taken at the fleet's reference speed."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

#: Predictions never go below this (seconds): a linear model may extrapolate below zero.
MIN_PREDICTION = 1e-4
#: Factor changes remembered for factors_changed_since (about a second of changes at
#: thousands of responses per second; a reader further behind reads every factor again).
_CHANGES_KEPT = 8192


class OnlineLatencyModel:
    """Shared SGD regression + per-pod speed factors. Not thread-safe: the gateway calls it
    from its event loop only."""

    __slots__ = (
        "_changed",
        "_changed_base",
        "_pending_x",
        "_pending_y",
        "batch_size",
        "coef",
        "factor_alpha",
        "factors",
        "factors_version",
        "intercept",
        "min_samples",
        "regressor",
        "samples",
        "version",
    )

    def __init__(
        self,
        n_features: int,
        *,
        batch_size: int = 8,
        min_samples: int = 16,
        factor_alpha: float = 0.1,
        eta0: float = 0.02,
    ) -> None:
        # Imported here: scikit-learn (with scipy) takes most of a second to import, which
        # every gateway start paid whether or not a latency plugin was configured.
        from sklearn.linear_model import SGDRegressor

        self.regressor = SGDRegressor(
            loss="squared_error",
            penalty="l2",
            alpha=1e-6,
            learning_rate="invscaling",
            eta0=eta0,
            power_t=0.25,
        )
        self.batch_size = batch_size
        self.min_samples = min_samples
        self.factor_alpha = factor_alpha
        self.samples = 0
        self.factors: dict[str, float] = {}
        #: counts changes of `factors`, for readers that cache arrays derived from them
        self.factors_version = 0
        #: the pod of each change, the first one being change number _changed_base + 1
        self._changed: list[str] = []
        self._changed_base = 0
        #: the regression's coefficients and intercept as of the last training step, and a
        #: counter of those steps (readers that cache derived arrays compare it)
        self.coef = np.zeros(n_features)
        self.intercept = 0.0
        self.version = 0
        self._pending_x: list[Sequence[float]] = []
        self._pending_y: list[float] = []

    @property
    def ready(self) -> bool:
        """True once the shared regression has seen `min_samples` observations."""
        return self.samples >= self.min_samples

    def base(self, features: np.ndarray) -> np.ndarray:
        """The shared regression over rows of features, floored at MIN_PREDICTION."""
        out = np.asarray(features @ self.coef + self.intercept, dtype=float)
        return np.asarray(np.maximum(out, MIN_PREDICTION), dtype=float)

    def predict(self, pods: Sequence[str], features: np.ndarray) -> np.ndarray:
        """Seconds, one per row (pod). Call only when `ready`."""
        factors = np.fromiter((self.factors.get(p, 1.0) for p in pods), float, len(pods))
        return np.asarray(self.base(features) * factors, dtype=float)

    def observe(self, pod: str, features: Sequence[float], actual: float) -> None:
        """Learn from one observation of `actual` seconds on `pod` with `features` (taken
        when the request was scheduled)."""
        if not actual > 0.0 or not math.isfinite(actual):
            return
        factor = self.factors.get(pod, 1.0)
        if self.ready:
            base = max(float(np.dot(self.coef, features)) + self.intercept, MIN_PREDICTION)
            ratio = min(max(actual / base, 0.05), 20.0)
            # a geometric mean: a pod twice as slow and one twice as fast weigh alike
            factor = math.exp(
                (1 - self.factor_alpha) * math.log(factor) + self.factor_alpha * math.log(ratio)
            )
            self.factors[pod] = factor
            self._factor_changed(pod)
        self._pending_x.append(features)
        self._pending_y.append(actual / factor)
        if len(self._pending_y) >= self.batch_size:
            self.flush()

    def forget(self, pod: str) -> None:
        """Drop `pod`'s speed factor (it is back at the fleet's reference speed)."""
        if self.factors.pop(pod, None) is not None:
            self._factor_changed(pod)

    def raise_factor(self, pod: str, elapsed: float, base: float) -> None:
        """A censored observation: a request on `pod` whose shared prediction was `base` has
        been running for `elapsed` seconds and is not done, so the pod's factor is at least
        elapsed / base. Without it a slow pod looks fast until its first slow answer
        returns, and gets a full share of the traffic meanwhile."""
        if base > 0.0 and elapsed > base:
            floor = min(elapsed / base, 20.0)
            if floor > self.factors.get(pod, 1.0):
                self.factors[pod] = floor
                self._factor_changed(pod)

    def _factor_changed(self, pod: str) -> None:
        self.factors_version += 1
        self._changed.append(pod)
        if len(self._changed) > _CHANGES_KEPT:
            del self._changed[: _CHANGES_KEPT // 2]
            self._changed_base += _CHANGES_KEPT // 2

    def factors_changed_since(self, version: int) -> list[str] | None:
        """The pods whose factor changed after `factors_version` was `version` (a pod once
        per change), or None when that is too long ago to say: a reader that keeps the
        factors of many pods updates those instead of reading every pod's again."""
        if version < self._changed_base or version > self.factors_version:
            return None
        return self._changed[version - self._changed_base :]

    def flush(self) -> None:
        """Train on the buffered observations (one SGD pass) and publish the coefficients."""
        if not self._pending_y:
            return
        x = np.asarray(self._pending_x, dtype=float)
        y = np.asarray(self._pending_y, dtype=float)
        self._pending_x.clear()
        self._pending_y.clear()
        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.regressor.partial_fit(x, y)
        self.samples += len(y)
        self.coef = np.asarray(self.regressor.coef_, dtype=float).copy()
        self.intercept = float(np.asarray(self.regressor.intercept_).ravel()[0])
        self.version += 1
