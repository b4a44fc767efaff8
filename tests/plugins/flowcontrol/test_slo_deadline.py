"""slo-deadline-ordering-policy: the TTFT SLO header read as llm-d reads it, and a queue that
lets its requests out by received time + SLO, earliest first, those without one last."""

from __future__ import annotations

import pytest

from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.plugins.flowcontrol.slo_deadline import SLODeadlineOrdering, ttft_slo_ms
from tests.flowcontrol.harness import controller, hold, release_order, request
from tests.plugins.helpers import ledger


@pytest.mark.parametrize(
    ("headers", "ms"),
    [
        ({"x-llm-d-slo-ttft-ms": "200"}, 200),
        ({"x-llm-d-slo-ttft-ms": " 200 "}, 200),
        ({"x-slo-ttft-ms": "300"}, 300),  # the older name
        ({"x-llm-d-slo-ttft-ms": "100", "x-slo-ttft-ms": "300"}, 100),  # the new one wins
        ({"x-llm-d-slo-ttft-ms": "0"}, 0),
        ({}, None),
        ({"x-some-header": "200"}, None),
        ({"x-llm-d-slo-ttft-ms": ""}, None),
        ({"x-llm-d-slo-ttft-ms": "abc"}, None),
        ({"x-llm-d-slo-ttft-ms": "1.5"}, None),
        ({"x-llm-d-slo-ttft-ms": "-5"}, None),
        ({"x-llm-d-slo-ttft-ms": str(10**20)}, None),  # beyond what a Go duration holds
    ],
)
def test_the_header(headers: dict[str, str], ms: int | None) -> None:
    assert ttft_slo_ms(headers) == ms


def test_the_key_is_received_time_plus_the_slo() -> None:
    policy = SLODeadlineOrdering("slo", NoParams(), ledger())
    r = request(headers={"x-llm-d-slo-ttft-ms": "250"})
    assert policy.order_key(r.received_at + 5.0, 99.0, r) == pytest.approx(r.received_at + 0.25)
    assert policy.order_key(0.0, 99.0, request()) == float("inf")


async def test_a_queue_lets_the_tightest_deadline_out_first() -> None:
    policy = SLODeadlineOrdering("slo", NoParams(), ledger())
    fc = controller(ordering=policy)
    hold(fc, 1)

    def slo(ms: str | None) -> dict[str, str]:
        return {"x-llm-d-slo-ttft-ms": ms} if ms is not None else {}

    labelled = [
        (label, request(headers=slo(ms)))
        for label, ms in [("5s", "5000"), ("none", None), ("1s", "1000"), ("3s", "3000")]
    ]
    # arrival order would be 5s, none, 1s, 3s
    assert await release_order(fc, labelled, held=1) == ["1s", "3s", "5s", "none"]
