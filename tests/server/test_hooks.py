"""The one hook runner: declaration order, and a failing hook never stops the others."""

from __future__ import annotations

import logging

import pytest

from heimdall_proxy.server.hooks import HookPoint


class Recorder:
    def __init__(self, name: str, calls: list[str], fail: bool = False) -> None:
        self.name = name
        self.calls = calls
        self.fail = fail

    async def response_complete(self, ctx: object) -> None:
        self.calls.append(self.name)
        if self.fail:
            raise RuntimeError("boom")


async def test_hooks_run_in_order_and_a_failure_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    point = HookPoint(
        "response_complete",
        [Recorder("a", calls), Recorder("b", calls, fail=True), Recorder("c", calls)],
    )
    assert point
    with caplog.at_level(logging.ERROR, logger="heimdall_proxy.server.hooks"):
        await point.run(object())
    assert calls == ["a", "b", "c"]
    assert "response_complete hook 'b' failed" in caplog.text


def test_an_empty_point_is_falsy_so_the_relay_skips_it() -> None:
    assert not HookPoint("pre_request", [])
