"""latency-slo-admitter refuses only sheddable requests that no busy pod can serve in SLO."""

from __future__ import annotations

from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.predicted_latency.state import PREDICTIONS_KEY
from tests.helpers import ep
from tests.plugins.helpers import req
from tests.plugins.predicted_latency.test_latency_scorer import build, preds


def test_refuses_a_sheddable_request_no_pod_can_serve_in_slo() -> None:
    adm = build("latency-slo-admitter")
    r = req()
    r.priority, r.objective = -1, "batch"
    state = CycleState({PREDICTIONS_KEY: preds(0.5, a=2.0, b=0.9)})
    why = adm.admit_request(state, r, [ep("a"), ep("b")])  # type: ignore[attr-defined]
    assert why is not None and "x-slo-ttft-ms 500 ms" in why and "900 ms" in why
    assert "'batch'" in why


def test_admits_otherwise() -> None:
    adm = build("latency-slo-admitter")
    pods = [ep("a"), ep("b")]
    shed = req()
    shed.priority = -1
    unreachable = preds(0.5, a=2.0, b=0.9)
    assert adm.admit_request(CycleState({PREDICTIONS_KEY: unreachable}), req(), pods) is None  # type: ignore[attr-defined]
    for p in (preds(0.5, a=2.0, b=0.4), preds(a=2.0, b=0.9), preds(0.5)):
        assert adm.admit_request(CycleState({PREDICTIONS_KEY: p}), shed, pods) is None  # type: ignore[attr-defined]
    idle = preds(0.5, a=2.0, b=0.9)
    idle.pods["b"].inflight = 0
    assert adm.admit_request(CycleState({PREDICTIONS_KEY: idle}), shed, pods) is None  # type: ignore[attr-defined]


def test_slo_factor_sheds_sooner() -> None:
    """A sheddable request must leave headroom: with sloFactor 0.5 a pod predicted at 0.4 s
    meets a 0.5 s SLO but not half of it."""
    shed = req()
    shed.priority = -1
    state = CycleState({PREDICTIONS_KEY: preds(0.5, a=2.0, b=0.4)})
    pods = [ep("a"), ep("b")]
    assert build("latency-slo-admitter").admit_request(state, shed, pods) is None  # type: ignore[attr-defined]
    why = build("latency-slo-admitter", sloFactor=0.5).admit_request(state, shed, pods)  # type: ignore[attr-defined]
    assert why is not None and "x-slo-ttft-ms 500 ms x 0.5" in why


def test_slo_headers_are_read_under_llm_ds_names_too() -> None:
    from heimdall_proxy.plugins.predicted_latency.state import slo_seconds

    assert slo_seconds({"x-slo-ttft-ms": "250"}, "x-slo-ttft-ms") == 0.25
    assert slo_seconds({"x-llm-d-slo-ttft-ms": "100"}, "x-slo-ttft-ms") == 0.1
    both = {"x-llm-d-slo-tpot-ms": "20", "x-slo-tpot-ms": "50"}
    assert slo_seconds(both, "x-slo-tpot-ms") == 0.02  # llm-d's name first
