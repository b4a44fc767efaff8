"""The online latency model learns a load-dependent latency and tells a slow pod from a fast
one from observations alone (the closed-form ridge underneath, nothing mocked)."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from heimdall_proxy.plugins.predicted_latency.model import OnlineLatencyModel


def _truth(x: list[float], slow: bool) -> float:
    base = 0.02 + 0.05 * x[0] + 0.03 * x[1]
    return base * (4.0 if slow else 1.0)


def test_learns_load_and_a_per_pod_speed_factor() -> None:
    rng = random.Random(7)
    model = OnlineLatencyModel(2, min_samples=16)
    assert not model.ready
    for _ in range(3000):
        pod = rng.choice(["fast", "slow"])
        x = [rng.uniform(0, 2), rng.uniform(0, 2)]
        model.observe(pod, x, _truth(x, pod == "slow") * rng.uniform(0.95, 1.05))
    assert model.ready
    errors = []
    for _ in range(200):
        x = [rng.uniform(0, 2), rng.uniform(0, 2)]
        got = model.predict(["fast", "slow"], np.asarray([x, x]))
        for value, slow in zip(got, (False, True), strict=True):
            errors.append(abs(value - _truth(x, slow)) / _truth(x, slow))
    assert sum(errors) / len(errors) < 0.15
    assert 3.0 < model.factors["slow"] / model.factors["fast"] < 5.0


def test_ignores_non_positive_and_non_finite_observations() -> None:
    model = OnlineLatencyModel(1, min_samples=1, batch_size=1)
    model.observe("a", [1.0], 0.0)
    model.observe("a", [1.0], float("nan"))
    assert model.samples == 0 and not model.ready
    model.observe("a", [1.0], 0.5)
    assert model.samples == 1 and model.ready


def test_an_unanswered_request_raises_its_pods_factor() -> None:
    model = OnlineLatencyModel(1, min_samples=1, batch_size=1)
    model.observe("a", [1.0], 0.5)
    model.raise_factor("a", elapsed=0.4, base=0.5)  # not late yet: nothing learned
    assert model.factors.get("a", 1.0) == 1.0
    model.raise_factor("a", elapsed=2.0, base=0.5)
    assert model.factors["a"] == 4.0
    model.raise_factor("a", elapsed=1.0, base=0.5)  # a floor, never lowered by it
    assert model.factors["a"] == 4.0


def test_batches_fitted_on_the_trainer_thread_publish_the_same_fit() -> None:
    """With a trainer, a full batch is fitted off the caller's thread and published whole,
    batch for batch as where the batches fill up; observe returns while the trainer is busy,
    predictions read the last published fit meanwhile, and flush waits for every batch."""
    rng = random.Random(38)
    rows = [[rng.random() for _ in range(3)] for _ in range(40)]
    inline = OnlineLatencyModel(3, batch_size=8, min_samples=8)
    threaded = OnlineLatencyModel(3, batch_size=8, min_samples=8)
    with ThreadPoolExecutor(max_workers=1) as trainer:
        threaded.trainer = trainer
        for i, row in enumerate(rows[:16]):
            inline.observe(f"p{i % 3}", row, 0.1 + sum(row))
            threaded.observe(f"p{i % 3}", row, 0.1 + sum(row))
        threaded.flush()
        assert threaded.fitted[2:] == inline.fitted[2:] == (16, 2)
        hold = threading.Event()
        trainer.submit(hold.wait, 30.0)  # the trainer is busy (at most 30 s if this fails)
        before = threaded.fitted
        assert np.array_equal(threaded.coef, threaded.stats.solve()[0])  # the fit, published
        for i, row in enumerate(rows[16:]):
            threaded.observe(f"p{i % 3}", row, 0.1 + sum(row))
        assert threaded.fitted is before  # three batches handed over, none fitted yet
        assert threaded.predict(["p0"], np.array([rows[0]]))[0] > 0.0
        hold.set()
        threaded.flush()
    assert threaded.fitted[2:] == (40, 5)
    assert np.array_equal(threaded.coef, threaded.stats.solve()[0])


def _long_prompt_row(rng: random.Random) -> tuple[list[float], float]:
    """A row of predictor.FEATURES as Mooncake's traces make them (prompts of 2,000 to
    30,000 tokens, answers of up to 1,000: columns of 2 to 30 at the predictor's scales) and
    the TTFT of a pod with 2 slots: a reply-length wait per request beyond the slots, plus
    the prefill of the uncached tokens."""
    prompt = rng.uniform(2.0, 30.0)
    uncached = prompt * rng.choice([0.15, 0.5, 1.0])
    inflight = rng.randrange(0, 9)
    row = [
        0.0,
        0.0,
        0.0,
        prompt,
        uncached,
        inflight / 8.0,
        inflight * 8.0 / 4.0,
        rng.uniform(0, 10),
    ]
    return row, 0.05 + 0.06 * uncached + 1.5 * max(inflight - 1, 0)


def test_long_prompts_do_not_make_the_regression_diverge() -> None:
    """Columns far above 1 (long prompts) are learned as well as small ones: the fit stays
    finite and close after a few dozen responses, and ranks a loaded pod behind an idle one.
    (Stochastic gradient descent at a fixed learning rate diverged on such rows: its
    coefficients reached 1e5 and most pods were predicted at the floor.)"""
    rng = random.Random(36)
    model = OnlineLatencyModel(8, min_samples=8)
    for _ in range(96):
        row, ttft = _long_prompt_row(rng)
        model.observe("pod", row, ttft)
    assert np.all(np.abs(model.coef) < 100.0)
    errors, truths = [], []
    for _ in range(200):
        row, ttft = _long_prompt_row(rng)
        errors.append(abs(model.predict(["pod"], np.asarray([row]))[0] - ttft))
        truths.append(ttft)
    assert sum(errors) / sum(truths) < 0.3  # linear in a wait that is not: about 0.15
    idle, _ = _long_prompt_row(rng)
    idle[5], idle[6] = 0.0, 0.0
    busy = [*idle[:5], 6 / 8.0, 6 * 8.0 / 4.0, idle[7]]
    got = model.predict(["pod", "pod"], np.asarray([idle, busy]))
    assert got[1] > got[0] + 4.0


def test_a_late_answer_lifts_its_pods_factor_only_until_it_comes() -> None:
    """The floor an unanswered request sets holds until it answers; then the pod is
    predicted from what it learned, not 20 times its peers for good (a pod predicted 20
    times slower gets no traffic, so no answer would ever lower a learned 20)."""
    model = OnlineLatencyModel(1, min_samples=1, batch_size=1)
    model.observe("a", [1.0], 0.5)
    learned = model.factors.get("a", 1.0)
    version = model.factors_version
    model.raise_factor("a", elapsed=50.0, base=0.5)
    assert model.factors["a"] == 20.0
    assert model.factors_changed_since(version) == ["a"]  # readers see the floor
    model.clear_floor("a")
    assert model.factors.get("a", 1.0) == learned
    model.observe("a", [1.0], 0.5)  # its answers teach the factor as before
    assert model.factors["a"] < 2.0
