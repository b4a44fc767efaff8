"""One online regression of a latency (TTFT or TPOT) from a pod's load features, with a
learned per-pod speed factor.

The regression is a ridge regression solved in closed form from exponentially weighted
sufficient statistics of what the gateway observed (counts, sums, cross products), so each
batch of observations costs one small linear solve, and prediction one numpy product over all
candidates at once.

Why closed form and not stochastic gradient descent: the features are scaled by constants
to about 1, but only about: a 30,000-token prompt is 30 in two columns, a 1,000-token
answer 10. Plain SGD (scikit-learn's `SGDRegressor` at a learning rate of 0.02, which this
replaced) is stable only while the rate times a row's squared norm stays under 2; on
Mooncake's long prompts it was 20 to 50 times that, the coefficients swung to +-1e5 within
a few dozen responses, most pods were predicted at the floor and a few at 1e9 s, and the
picker sent nearly everything to one pod (bench/RESULTS.md, "The latency model diverged").
The solve standardizes the features by their observed spread first, so no column's scale
matters, is exact from the first batch (no learning rate to converge on), and forgets at a
fixed half-life, so it follows a fleet whose behaviour changes.

Why a per-pod factor: the load features (queue, running, KV use, prompt size) look alike on
a fast pod and a slow one, so one shared regression averages them. Latency on a pod several
times slower per token is that many times higher at the same load, so each pod's prediction
is the shared regression times a factor learned online for that pod: an exponentially
weighted mean of actual / shared prediction. The shared regression is trained on actual /
factor, i.e. on what the pod would have taken at the fleet's reference speed.

Training off the event loop: with a `trainer` (one worker thread, the producer's), a full
batch is fitted there and the new coefficients, intercept, sample count and version are
published as one tuple, so a reader on the loop sees the old fit or the new one, never half
of each. Without a trainer (tests, tools) batches are fitted where they fill up."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, Future

import numpy as np

#: Predictions never go below this (seconds): a linear model may extrapolate below zero.
MIN_PREDICTION = 1e-4
#: Observations over which the regression's weight of an observation halves: a few minutes
#: of a busy gateway's responses, long enough that a burst does not wipe what a quiet spell
#: taught, short enough to follow a change of model or hardware.
HALF_LIFE = 256.0
#: Ridge strength on the standardized features (1 would halve a coefficient learned from
#: perfectly correlated data): keeps two nearly collinear columns (a prompt's tokens and its
#: uncached tokens on a cold fleet) from cancelling each other with huge opposite weights.
RIDGE = 0.01
#: Observations' worth of a prior pulling each coefficient to 0: the ridge above is RIDGE +
#: PRIOR_SAMPLES / (weighted observations), so the first batches, which cannot tell eight
#: features apart, give a fit close to the mean rather than to one batch's noise.
PRIOR_SAMPLES = 8.0
#: The largest log ratio one observation moves a factor by (times factor_alpha). A first
#: token's time against the shared prediction is heavy-tailed even on identical pods (a
#: queue wait the linear regression underestimates, a cached prompt answered at once): an
#: unbounded step let ratios of 0.05 and 20 set identical pods' factors 4 times apart, and
#: the picker, squaring, gave them 16 times different shares. A pod truly 4 times slower
#: still reaches its factor within about 20 answers (and is held at least that slow by its
#: late requests meanwhile: raise_factor).
_MAX_STEP = math.log(2.0)
#: Factor changes remembered for factors_changed_since (about a second of changes at
#: thousands of responses per second; a reader further behind reads every factor again).
_CHANGES_KEPT = 8192


class OnlineLatencyModel:
    """Shared ridge regression + per-pod speed factors. Not thread-safe: the gateway calls it
    from its event loop only."""

    __slots__ = (
        "_changed",
        "_changed_base",
        "_fit_lock",
        "_fitted",
        "_fitting",
        "_floors",
        "_learned",
        "_pending_x",
        "_pending_y",
        "batch_size",
        "factor_alpha",
        "factors",
        "factors_version",
        "min_samples",
        "stats",
        "trainer",
    )

    def __init__(
        self,
        n_features: int,
        *,
        batch_size: int = 8,
        min_samples: int = 16,
        factor_alpha: float = 0.1,
    ) -> None:
        #: the regression's weighted sufficient statistics (_Stats), touched by one thread at
        #: a time (the fit lock)
        self.stats = _Stats(n_features)
        self.batch_size = batch_size
        self.min_samples = min_samples
        self.factor_alpha = factor_alpha
        #: each pod's factor as predictions use it: the learned one, or while a request
        #: there is unanswered past its prediction, the floor that sets (raise_factor)
        self.factors: dict[str, float] = {}
        #: the factors learned from answers, and the floors of unanswered requests
        self._learned: dict[str, float] = {}
        self._floors: dict[str, float] = {}
        #: counts changes of `factors`, for readers that cache arrays derived from them
        self.factors_version = 0
        #: the pod of each change, the first one being change number _changed_base + 1
        self._changed: list[str] = []
        self._changed_base = 0
        #: (coefficients, intercept, observations trained on, training steps) as of the last
        #: step: replaced whole, by the trainer's thread when there is one
        self._fitted: tuple[np.ndarray, float, int, int] = (np.zeros(n_features), 0.0, 0, 0)
        #: where full batches are fitted (None: where they fill up); one worker, so batches
        #: are fitted in order and the statistics are only ever touched by one thread
        self.trainer: Executor | None = None
        self._fitting: Future[None] | None = None
        self._fit_lock = threading.Lock()
        self._pending_x: list[Sequence[float]] = []
        self._pending_y: list[float] = []

    @property
    def fitted(self) -> tuple[np.ndarray, float, int, int]:
        """(coefficients, intercept, samples, version) of one training step, read at once."""
        return self._fitted

    @property
    def coef(self) -> np.ndarray:
        """The regression's coefficients as of the last training step."""
        return self._fitted[0]

    @property
    def intercept(self) -> float:
        return self._fitted[1]

    @property
    def samples(self) -> int:
        """Observations the regression was trained on."""
        return self._fitted[2]

    @property
    def version(self) -> int:
        """Training steps so far (readers that cache derived arrays compare it)."""
        return self._fitted[3]

    @property
    def ready(self) -> bool:
        """True once the shared regression has seen `min_samples` observations."""
        return self._fitted[2] >= self.min_samples

    def base(self, features: np.ndarray) -> np.ndarray:
        """The shared regression over rows of features, floored at MIN_PREDICTION."""
        coef, intercept, _, _ = self._fitted  # one fit, whichever thread published it
        out = np.asarray(features @ coef + intercept, dtype=float)
        return np.asarray(np.maximum(out, MIN_PREDICTION), dtype=float)

    def predict(self, pods: Sequence[str], features: np.ndarray) -> np.ndarray:
        """Seconds, one per row (pod). Call only when `ready`."""
        factors = np.fromiter((self.factors.get(p, 1.0) for p in pods), float, len(pods))
        return np.asarray(self.base(features) * factors, dtype=float)

    def observe(
        self, pod: str, features: Sequence[float], actual: float, wait: float = 0.0
    ) -> None:
        """Learn from one observation of `actual` seconds on `pod` with `features` (taken
        when the request was scheduled), of which `wait` seconds were foreseen apart from
        this model when it was sent (the in-flight ledger's queue wait, which predictions
        add to the model's): the regression and the factor learn the rest, which may be
        negative when the wait was overestimated (the regression learns that too; the
        factor's ratio is bounded below anyway)."""
        if not actual > 0.0 or not math.isfinite(actual):
            return
        actual -= wait
        factor = self._learned.get(pod, 1.0)
        if self.ready:
            coef, intercept, _, _ = self._fitted
            base = max(float(np.dot(coef, features)) + intercept, MIN_PREDICTION)
            ratio = min(max(actual / base, 0.05), 20.0)
            # a geometric mean (a pod twice as slow and one twice as fast weigh alike) whose
            # step is bounded: one observation moves the factor by at most a factor of
            # 2 ** factor_alpha, so it follows a median rather than a mean of the ratios
            step = min(max(math.log(ratio / factor), -_MAX_STEP), _MAX_STEP)
            factor = math.exp(math.log(factor) + self.factor_alpha * step)
            self._learned[pod] = factor
            self._publish(pod)
        self._pending_x.append(features)
        self._pending_y.append(actual / factor)
        if len(self._pending_y) >= self.batch_size:
            self._train(wait=False)

    def forget(self, pod: str) -> None:
        """Drop `pod`'s speed factor (it is back at the fleet's reference speed)."""
        self._learned.pop(pod, None)
        self._floors.pop(pod, None)
        if self.factors.pop(pod, None) is not None:
            self._factor_changed(pod)

    def raise_factor(self, pod: str, elapsed: float, base: float) -> None:
        """A censored observation: a request on `pod` whose shared prediction was `base` has
        been running for `elapsed` seconds and is not done, so the pod's factor is at least
        elapsed / base until it answers (clear_floor). Without it a slow pod looks fast until
        its first slow answer returns, and gets a full share of the traffic meanwhile.

        A floor, not a lesson: the answer, when it comes, is what the learned factor learns
        from. Written into the learned factor, one late first token (a long queue the
        regression underestimated, a prediction near its floor) set a pod's factor to 20,
        its predictions 20 times its peers', and its share to nearly nothing, so no answer
        came back to lower it: on Mooncake's conversation trace one pod of four idled for
        most of the run while the others queued (bench/RESULTS.md, "The latency model
        diverged")."""
        if base > 0.0 and elapsed > base:
            floor = min(elapsed / base, 20.0)
            if floor > self._floors.get(pod, 0.0):
                self._floors[pod] = floor
                self._publish(pod)

    def clear_floor(self, pod: str) -> None:
        """The request that set `pod`'s floor answered (or the caller will set the floor
        again from the one now oldest): predictions use the learned factor again."""
        if self._floors.pop(pod, None) is not None:
            self._publish(pod)

    def _publish(self, pod: str) -> None:
        """`factors[pod]` from the learned factor and the floor."""
        learned = self._learned.get(pod)
        floor = self._floors.get(pod)
        if learned is None and floor is None:
            value = None
        else:
            value = max(learned if learned is not None else 1.0, floor or 0.0)
        if self.factors.get(pod) != value:
            if value is None:
                del self.factors[pod]
            else:
                self.factors[pod] = value
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
        """Train on the buffered observations (one SGD pass) and publish the coefficients;
        returns once every batch handed to the trainer so far is fitted too."""
        self._train(wait=True)

    def _train(self, *, wait: bool) -> None:
        if self._pending_y:
            x = np.asarray(self._pending_x, dtype=float)
            y = np.asarray(self._pending_y, dtype=float)
            self._pending_x.clear()
            self._pending_y.clear()
            trainer = self.trainer
            if trainer is None:
                self._fit(x, y)
            else:
                try:
                    self._fitting = trainer.submit(self._fit, x, y)
                except RuntimeError:  # the trainer was shut down (a reload's old plugin)
                    self.trainer = None
                    self._fit(x, y)
        fitting = self._fitting
        if wait and fitting is not None:
            fitting.result()  # one worker: the last batch handed over is fitted last

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        """One batch into the statistics, then the new solution published whole."""
        with self._fit_lock:  # a batch fitted here while the trainer fits another
            self.stats.add(x, y)
            coef, intercept = self.stats.solve()
            _, _, samples, version = self._fitted
            self._fitted = (coef, intercept, samples + len(y), version + 1)


class _Stats:
    """Exponentially weighted sums of 1, x, y, x x^T and x y over the observations (the
    weight of each halves every HALF_LIFE observations after it), and the ridge solution
    they determine."""

    __slots__ = ("decay", "n", "sx", "sxx", "sxy", "sy")

    def __init__(self, n_features: int, half_life: float = HALF_LIFE) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.n = 0.0
        self.sy = 0.0
        self.sx = np.zeros(n_features)
        self.sxx = np.zeros((n_features, n_features))
        self.sxy = np.zeros(n_features)

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        """Rows `x` with targets `y`, in observation order (the last one weighs 1)."""
        k = len(y)
        w = self.decay ** np.arange(k - 1, -1, -1, dtype=float)
        old = self.decay**k
        xw = x * w[:, None]
        self.n = old * self.n + float(w.sum())
        self.sy = old * self.sy + float(w @ y)
        self.sx = old * self.sx + xw.sum(axis=0)
        self.sxx = old * self.sxx + xw.T @ x
        self.sxy = old * self.sxy + xw.T @ y

    def solve(self) -> tuple[np.ndarray, float]:
        """(coefficients, intercept) of the ridge regression on the features standardized
        by their weighted spread; a feature that has not varied yet gets coefficient 0 (the
        intercept carries its constant value)."""
        coef = np.zeros(len(self.sx))
        if self.n <= 0.0:
            return coef, 0.0
        mx = self.sx / self.n
        my = self.sy / self.n
        cov = self.sxx / self.n - np.outer(mx, mx)
        cxy = self.sxy / self.n - mx * my
        spread = np.sqrt(np.maximum(np.diag(cov), 0.0))
        varied = spread > 1e-9 * (1.0 + np.abs(mx))
        if varied.any():
            s = spread[varied]
            corr = cov[np.ix_(varied, varied)] / np.outer(s, s)
            corr[np.diag_indices_from(corr)] += RIDGE + PRIOR_SAMPLES / self.n
            try:
                beta = np.linalg.solve(corr, cxy[varied] / s)
            except np.linalg.LinAlgError:
                beta = np.linalg.lstsq(corr, cxy[varied] / s, rcond=None)[0]
            coef[varied] = beta / s
        return coef, float(my - mx @ coef)
