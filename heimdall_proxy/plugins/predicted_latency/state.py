"""What the latency producer leaves on the CycleState for the filters, scorers and admitters
that read predictions, and the request's SLOs as its headers give them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from heimdall_proxy.framework.types import CycleState, Endpoint

#: CycleState key of the LatencyPredictions of the request (one producer per gateway).
PREDICTIONS_KEY = "heimdall/latency-predictions"
TTFT_SLO_HEADER = "x-slo-ttft-ms"
TPOT_SLO_HEADER = "x-slo-tpot-ms"


#: llm-d's names of the same headers, read first when both are present.
LLMD_SLO_HEADERS = {TTFT_SLO_HEADER: "x-llm-d-slo-ttft-ms", TPOT_SLO_HEADER: "x-llm-d-slo-tpot-ms"}


def slo_seconds(headers: Mapping[str, str], name: str) -> float | None:
    """An SLO header in milliseconds (llm-d's `x-llm-d-` name, else the seeds' `name`), as
    seconds; None when absent, unparsable or <= 0."""
    raw = headers.get(LLMD_SLO_HEADERS.get(name, name)) or headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value / 1000.0 if value > 0.0 else None


@dataclass(slots=True)
class PodPrediction:
    """One candidate's predicted latencies (seconds) and load at scheduling time.

    `ttft` is the time to the first token (end-to-end latency when the producer is not in
    streaming mode); `tpot` is None when no TPOT model is trained. Headrooms are SLO minus
    prediction, None when the request has no such SLO."""

    ttft: float
    tpot: float | None
    ttft_headroom: float | None
    tpot_headroom: float | None
    prefix_ratio: float
    inflight: int

    @property
    def meets_slo(self) -> bool:
        """No SLO is predicted to be violated (True when the request has none)."""
        return (self.ttft_headroom is None or self.ttft_headroom >= 0.0) and (
            self.tpot_headroom is None or self.tpot_headroom >= 0.0
        )


class PodPredictions(Mapping[str, PodPrediction]):
    """Every candidate's predictions as the producer computed them, in candidate order:
    `ttft[i]` (and `tpot[i]`, when TPOT is modelled) are the seconds of the pod at `index`
    position i. A PodPrediction is made when one pod is read; readers of all of them
    (latency-scorer) read the arrays. At 1,024 pods an object per pod per request was most
    of a decision."""

    __slots__ = (
        "_inflight",
        "_prefix",
        "_tpot_slo",
        "_ttft_slo",
        "endpoints",
        "index",
        "names",
        "tpot",
        "ttft",
    )

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        names: list[str],
        index: Mapping[str, int],
        ttft: np.ndarray,
        tpot: np.ndarray | None,
        preds: LatencyPredictions,
    ) -> None:
        #: the candidates predicted for, in the order of the arrays
        self.endpoints = endpoints
        self.names = names
        self.index = index
        self.ttft = ttft
        self.tpot = tpot
        self._ttft_slo, self._tpot_slo = preds.ttft_slo, preds.tpot_slo
        self._prefix, self._inflight = preds.prefix, preds.inflight

    def __getitem__(self, pod: str) -> PodPrediction:
        i = self.index[pod]
        t = float(self.ttft[i])
        tp = float(self.tpot[i]) if self.tpot is not None else None
        ttft_slo, tpot_slo = self._ttft_slo, self._tpot_slo
        return PodPrediction(
            t,
            tp,
            ttft_slo - t if ttft_slo is not None else None,
            tpot_slo - tp if tpot_slo is not None and tp is not None else None,
            self._prefix.get(pod, 0.0),
            self._inflight.get(pod, 0),
        )

    def __contains__(self, pod: object) -> bool:
        return pod in self.index

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


@dataclass(slots=True)
class LatencyPredictions:
    """Predictions for every candidate of one request, or for none (`pods` empty) when the
    model is not trained yet: readers then fall back to what they do without predictions."""

    ttft_slo: float | None
    tpot_slo: float | None
    #: Output tokens the request is expected to produce (for latency without SLOs).
    output_tokens: int
    pods: Mapping[str, PodPrediction] = field(default_factory=dict)
    #: Prefix-cache match ratio by pod, in [0, 1], whether or not there are predictions;
    #: only the pods with a match are listed (read with `.get(pod, 0.0)`).
    prefix: dict[str, float] = field(default_factory=dict)
    #: Requests this gateway has in flight on each pod, whether or not there are
    #: predictions; only the pods with some are listed (read with `.get(pod, 0)`).
    inflight: dict[str, int] = field(default_factory=dict)
    #: Seconds a request sent now would wait for what is in flight on each pod, as the
    #: in-flight ledger learned it (only the pods with some are listed); the in-process
    #: model's TTFT includes it (`waits_added`), a prediction server's does not.
    waits: dict[str, float] = field(default_factory=dict)
    waits_added: bool = True
    #: The candidates' feature rows and each pod's row in it, kept so the training hooks
    #: learn from what was predicted on.
    rows: np.ndarray | None = None
    row_index: dict[str, int] = field(default_factory=dict)

    def features_of(self, pod: str) -> list[float] | None:
        """The feature row `pod` was predicted from (None when it was not a candidate)."""
        i = self.row_index.get(pod)
        return None if i is None or self.rows is None else self.rows[i].tolist()

    @property
    def has_slo(self) -> bool:
        return self.ttft_slo is not None or self.tpot_slo is not None

    def latency(self, pod: str) -> float | None:
        """Predicted seconds to the end of the answer: TTFT plus TPOT times the expected
        output (TTFT alone is the end-to-end latency when TPOT is not modelled)."""
        p = self.pods.get(pod)
        if p is None:
            return None
        return p.ttft + (p.tpot * self.output_tokens if p.tpot is not None else 0.0)


def read_predictions(state: CycleState) -> LatencyPredictions | None:
    found = state.get(PREDICTIONS_KEY)
    return found if isinstance(found, LatencyPredictions) else None
