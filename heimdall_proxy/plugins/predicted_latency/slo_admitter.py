"""latency-slo-admitter: refuses a sheddable request (priority < 0, from its objective) with
an SLO when no candidate is predicted to meet it, instead of sending it where it would miss
its SLO and add load for the requests that still can meet theirs."""

from __future__ import annotations

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.plugins.predicted_latency.state import (
    TPOT_SLO_HEADER,
    TTFT_SLO_HEADER,
    read_predictions,
)

LATENCY_SLO_ADMITTER_TYPE = "latency-slo-admitter"


class LatencySLOAdmitterParams(PluginParams):
    #: Ours: a sheddable request is admitted only while some pod is predicted to meet this
    #: fraction of its SLOs. 1 is GIE's rule (shed only what cannot meet its SLO at all);
    #: below 1 sheds sooner, keeping headroom for the requests that cannot be shed.
    slo_factor: float = Field(default=1.0, gt=0.0, le=1.0)


@register(LATENCY_SLO_ADMITTER_TYPE, LatencySLOAdmitterParams)
class LatencySLOAdmitter(BasePlugin[LatencySLOAdmitterParams]):
    """Admitter. Reads the LatencyPredictions on the CycleState and the request's priority.
    Admits when the request is not sheddable, has no SLO, there are no predictions yet, some
    pod is predicted to meet the SLO, or some pod has nothing in flight from this gateway
    (an idle pod is the best chance left, and its prediction the least certain)."""

    type = LATENCY_SLO_ADMITTER_TYPE

    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> str | None:
        if request.priority >= 0:
            return None
        preds = read_predictions(state)
        if preds is None or not preds.has_slo or not preds.pods:
            return None
        pods = [preds.pods[e.name] for e in endpoints if e.name in preds.pods]
        if not pods or any(p.inflight == 0 for p in pods):
            return None
        f = self.params.slo_factor
        ttft_slo = preds.ttft_slo * f if preds.ttft_slo is not None else None
        tpot_slo = preds.tpot_slo * f if preds.tpot_slo is not None else None
        if any(
            (ttft_slo is None or p.ttft <= ttft_slo)
            and (tpot_slo is None or p.tpot is None or p.tpot <= tpot_slo)
            for p in pods
        ):
            return None
        why = []
        best = min(p.ttft for p in pods)
        share = f" x {f:g}" if f != 1.0 else ""
        if ttft_slo is not None and best > ttft_slo:
            why.append(
                f"best predicted TTFT {best * 1000:.0f} ms > {TTFT_SLO_HEADER} "
                f"{ttft_slo / f * 1000:.0f} ms{share}"
            )
        tpots = [p.tpot for p in pods if p.tpot is not None]
        if tpot_slo is not None and tpots and min(tpots) > tpot_slo:
            why.append(
                f"best predicted TPOT {min(tpots) * 1000:.1f} ms > {TPOT_SLO_HEADER} "
                f"{tpot_slo / f * 1000:.1f} ms{share}"
            )
        detail = "; ".join(why) or "each pod misses one of them"
        return (
            f"No endpoint is predicted to meet the request's latency SLO ({detail}) "
            f"and the request is sheddable (objective {request.objective!r}, priority "
            f"{request.priority}); retry later."
        )
