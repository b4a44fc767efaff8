"""The dependency circuit breaker, and the tokenizer failing open fast behind it."""

from __future__ import annotations

from pathlib import Path

from heimdall_proxy.plugins.requestcontrol.producers.tokenizer import (
    TokenizerParams,
    TokenizerPlugin,
)
from heimdall_proxy.resilience.breaker import CircuitBreaker
from tests.plugins.helpers import req


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_failures_then_lets_one_trial_through() -> None:
    clock = Clock()
    b = CircuitBreaker("dep", failures=2, cooldown=5.0, clock=clock)
    b.failure()
    assert b.allow() and b.state == "closed"
    b.failure()
    assert not b.allow() and b.state == "open"
    clock.now = 5.0
    assert b.allow() and b.state == "half-open"
    assert not b.allow()  # one trial at a time
    b.failure()  # the trial failed: open again
    assert not b.allow()
    clock.now = 10.0
    assert b.allow()
    b.success()
    assert b.state == "closed" and b.allow()


async def test_a_dead_tokenizer_service_is_skipped_after_a_few_failures(tmp_path: Path) -> None:
    params = TokenizerParams.model_validate(
        {"modelName": "m", "udsTokenizerConfig": {"socketFile": str(tmp_path / "none.sock")}}
    )
    plugin = TokenizerPlugin("tok", params, None)  # type: ignore[arg-type]
    for _ in range(10):
        r = req(api="completions", data={"prompt": "hi"})
        await plugin.prepare_data(r, [])
        assert r.token_ids is None  # fails open
    assert plugin.failures == 3  # then the breaker stopped calling it
    await plugin.stop()
