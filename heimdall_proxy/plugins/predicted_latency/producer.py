"""predicted-latency-producer: predicts TTFT and TPOT of the request on every candidate, puts
them (and the headroom against the request's SLO headers) on the CycleState, and trains the
predictor from what the gateway then observes of each response.

The model runs in-process (heimdall_proxy/latency): per request it costs one numpy product
over all candidates, so scoring needs no round trip to a sidecar."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.core import Metric
from pydantic import Field, field_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.inflight import warn_other_expiry
from heimdall_proxy.framework.inherit import changed
from heimdall_proxy.framework.params import Duration
from heimdall_proxy.framework.prefix import PrefixMatchParams
from heimdall_proxy.framework.queue_price import QueuePrice
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import (
    CandidateNames,
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
)
from heimdall_proxy.observability.loop import CounterFamily, GaugeFamily, HistogramFamily
from heimdall_proxy.plugins.predicted_latency.metrics import LatencyMetrics
from heimdall_proxy.plugins.predicted_latency.model import MIN_PREDICTION
from heimdall_proxy.plugins.predicted_latency.predictor import FeatureMatrix, LatencyPredictor
from heimdall_proxy.plugins.predicted_latency.remote import (
    PredictorUnavailable,
    RemotePredictor,
    prediction_request,
    training_entry,
)
from heimdall_proxy.plugins.predicted_latency.sampling import FIRST_SAMPLED_TOKEN, TokenSampler
from heimdall_proxy.plugins.predicted_latency.state import (
    PREDICTIONS_KEY,
    TPOT_SLO_HEADER,
    TTFT_SLO_HEADER,
    LatencyPredictions,
    PodPredictions,
    read_predictions,
    slo_seconds,
)

log = logging.getLogger(__name__)

PREDICTED_LATENCY_PRODUCER_TYPE = "predicted-latency-producer"
#: Output tokens assumed when a request sets no max_tokens (vLLM's own default is larger;
#: this only weighs TPOT against TTFT when ranking pods without SLOs).
DEFAULT_OUTPUT_TOKENS = 64


class PredictedLatencyProducerParams(PrefixMatchParams):
    #: false: train on end-to-end latency (recorded as TTFT; TPOT not trained). true: TTFT
    #: on the first streamed chunk, TPOT on the chunks after it (streamed responses only).
    streaming_mode: bool = False
    #: Multiplies the TPOT SLO of the request before headroom is computed (GIE's knob).
    slo_buffer_factor: float = Field(default=1.0, gt=0.0)
    #: Observations before predictions are made (until then readers use their fallback).
    min_samples: int = Field(default=8, ge=1)
    #: Token estimate for requests that were not tokenized (tokens per character).
    char_to_token_multiplier: float = Field(default=0.25, gt=0.0)
    #: A request in flight longer than this stops counting in the in-flight features.
    request_timeout: Duration = Field(default=600.0, alias="contextTTL")
    #: Streaming mode: TPOT samples per stream at most, the last one at its end (the
    #: others at the tokens `samplingMean` chooses; see plugins/predicted_latency/sampling.py).
    max_tpot_samples: int = Field(default=5, ge=1, alias="maxTPOTSamples")
    #: Streaming mode: GIE's mean interval, in tokens, between TPOT samples after token 2
    #: (Poisson-distributed).
    sampling_mean: float = Field(default=1000.0, gt=0.0)
    #: Ours: GIE's latency-predictor sidecars (the EPP reads PREDICTION_SERVER_URL and
    #: TRAINING_SERVER_URL). With a prediction server, its predictions replace the
    #: in-process model's while it answers within `predictorTimeout`; with a training
    #: server, what the gateway observes is also sent there. The in-process model keeps
    #: learning either way, so it is warm when the prediction server is down.
    prediction_server_url: str | None = Field(default=None, alias="predictionServerURL")
    training_server_url: str | None = Field(default=None, alias="trainingServerURL")
    predictor_timeout: Duration = Field(default=0.1, gt=0.0, alias="predictorTimeout")
    #: Ours: add to each pod's predicted TTFT the wait for what is in flight there that the
    #: in-flight ledger learned from streamed first tokens (framework/queue_price.py: its
    #: free depth, and a replay of its slots from the requests' ages and its service time),
    #: and train the model on the rest. false: the model alone, linear in the in-flight
    #: counts (which underestimates a pod's queue once its slots are full).
    queue_wait: bool = True
    #: The prefill rate the ledger's queue price starts from (prefix-cache-affinity-filter's
    #: parameter of the same name: at the same value both read one price).
    peak_prefill_throughput: float = Field(default=16000.0, gt=0.0)

    @field_validator("prediction_server_url", "training_server_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"want an http:// or https:// URL, got {value!r}")
        return value


@dataclass(slots=True)
class _Attempt:
    pod: str
    row: list[float] | None
    #: the attempt's context: the relay times its answer there
    ctx: RequestContext
    ttft_slo: float | None
    tpot_slo: float | None
    predicted_ttft: float | None = None
    predicted_tpot: float | None = None
    #: the shared (factor-free) TTFT prediction it was scheduled with, less the wait when
    #: the prediction had the wait added (in-process), whole when not (a remote predictor's)
    base_ttft: float | None = None
    #: the queue wait the ledger foresaw on the pod when it was chosen (seconds)
    wait: float = 0.0
    #: the part of that wait `base_ttft` leaves out: the seconds after its start from which
    #: the attempt is late against it (the wait, or 0 for a whole remote prediction)
    base_after: float = 0.0
    #: the remote predictor's view of the pod when it was chosen (with a training server)
    remote_request: dict[str, Any] | None = None
    #: streaming mode: TPOT samples taken so far, and the token index of the next one
    tpot_samples: int = 0
    next_sample: int = FIRST_SAMPLED_TOKEN


def output_tokens(request: InferenceRequest) -> int:
    data = request.data
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return DEFAULT_OUTPUT_TOKENS


def _record(
    actual: float,
    predicted: float | None,
    slo: float | None,
    labels: tuple[str, str],
    families: tuple[GaugeFamily, HistogramFamily, GaugeFamily, CounterFamily],
) -> None:
    """Export one observed latency (TTFT or TPOT, the same families for each): the last value,
    the prediction's relative error, and whether it missed its SLO."""
    gauge, error, violation, violation_total = families
    gauge.labels(*labels).set(actual)
    if predicted is not None and actual > 0.0:
        error.labels(*labels).observe(abs(predicted - actual) / actual)
    if slo is not None:
        missed = actual > slo
        violation.labels(*labels).set(1.0 if missed else 0.0)
        if missed:
            violation_total.labels(*labels).inc()


@register(PREDICTED_LATENCY_PRODUCER_TYPE, PredictedLatencyProducerParams)
class PredictedLatencyProducer(BasePlugin[PredictedLatencyProducerParams]):
    """Producer, PreRequest, ResponseStreaming, ResponseComplete, MetricsSource.

    produce: reads each candidate's last scrape, the prefix match left by the prefix plugin
    (declare it before this one), and this plugin's in-flight ledger; leaves
    LatencyPredictions under PREDICTIONS_KEY (empty `pods` until `minSamples` responses
    trained the model). pre_request / response_streaming / response_complete: keep the
    ledger and train the TTFT (and, in streaming mode, TPOT) model on the chosen pod."""

    type = PREDICTED_LATENCY_PRODUCER_TYPE

    def __init__(
        self, name: str, params: PredictedLatencyProducerParams, handle: PluginHandle
    ) -> None:
        super().__init__(name, params, handle)
        self._match = params.match_reader()
        self.predictor = LatencyPredictor(min_samples=params.min_samples)
        self._features = FeatureMatrix()
        self.remote: RemotePredictor | None = None
        if params.prediction_server_url or params.training_server_url:
            self.remote = RemotePredictor(
                params.prediction_server_url,
                params.training_server_url,
                timeout=params.predictor_timeout,
            )
        #: The gateway's in-flight ledger: its requests and whole prompts per pod are the
        #: model's load features (the producer keeps no count of its own).
        self.load = handle.load
        self.load.count_tokens = True
        #: The ledger's learned queue wait per pod (read only: the ledger learns it), added
        #: to the model's TTFT; None: `queueWait` is off.
        self.queue_price: QueuePrice | None = None
        if params.queue_wait:
            self.queue_price = self.load.queue_price(1.0 / params.peak_prefill_throughput)
        warn_other_expiry(name, "contextTTL", params.request_timeout, self.load)
        self.metrics = LatencyMetrics()
        self._attempts: dict[str, _Attempt] = {}
        self._max_tpot_samples = params.max_tpot_samples
        self._sampler = TokenSampler(params.sampling_mean)
        self._trainer: ThreadPoolExecutor | None = None
        #: per pod with requests in flight, its attempts in start order (the oldest first)
        self._pending: dict[str, dict[str, _Attempt]] = {}

    def inherit(self, previous: PredictedLatencyProducer, gone: frozenset[str]) -> str | None:
        """A reload keeps the metrics, and the trained model (less
        the speed factors of the pods `gone`, under the new `minSamples`) with the attempts
        it trains on, unless what it is trained on (`streamingMode`) changed: then the old
        attempts train the old model to the end, and the new one starts untrained."""
        self.metrics = previous.metrics
        reason = changed(previous.params, self.params, "streaming_mode")
        if reason is not None:
            return f"the model starts untrained: {reason}"
        predictor = previous.predictor
        for pod in gone:
            predictor.forget(pod)
        predictor.set_min_samples(self.params.min_samples)
        self.predictor = predictor
        self._attempts = previous._attempts
        self._pending = previous._pending
        return None

    @property
    def streaming_mode(self) -> bool:
        return self.params.streaming_mode

    async def start(self) -> None:
        # Fits run on a thread of their own, never on the event loop that schedules: the
        # predictions keep reading the last published fit meanwhile (model.py).
        self._trainer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="latency-fit")
        self.predictor.train_on(self._trainer)
        if self.remote is not None:
            await self.remote.start()

    async def stop(self) -> None:
        if self.remote is not None:
            await self.remote.stop()
        trainer, self._trainer = self._trainer, None
        if trainer is not None:
            # the batches handed over are fitted; then a reload's successor (which holds
            # this predictor) fits on its own thread, or where batches fill up
            await asyncio.get_running_loop().run_in_executor(None, trainer.shutdown)

    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        remote = self.remote
        if remote is None or not remote.available:
            self.predict(state, request, endpoints)
            return
        t0 = time.perf_counter()
        preds = self.predict(state, request, endpoints, record=False)
        try:
            got = await remote.predict(self._remote_requests(preds, endpoints))
        except PredictorUnavailable:
            got = None
        if got is not None:
            # the sidecar predicts whole TTFTs from the scraped queues (its wire format is
            # GIE's, shared with other gateways): the ledger's wait is not added to them
            preds.waits_added = False
            self._set_predictions(
                preds,
                endpoints,
                [e.name for e in endpoints],
                [t for t, _ in got],
                [tp for _, tp in got] if self.params.streaming_mode else None,
            )
        if preds.pods:
            self._record_duration(request, time.perf_counter() - t0, preds)

    @staticmethod
    def _remote_requests(
        preds: LatencyPredictions, endpoints: list[Endpoint]
    ) -> list[dict[str, Any]]:
        rows = preds.rows
        prompt = round(rows[0, 3] * 1000.0) if rows is not None and len(rows) else 0
        return [
            prediction_request(
                e.metrics.kv_cache_usage,
                prompt,
                e.metrics.waiting,
                e.metrics.running,
                preds.prefix.get(e.name, 0.0),
            )
            for e in endpoints
        ]

    def predict(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: list[Endpoint],
        *,
        record: bool = True,
    ) -> LatencyPredictions:
        """The in-process model's predictions for `endpoints`, left on `state` (and
        returned); `record` exports how long they took."""
        t0 = time.perf_counter()
        p = self.params
        info = self._match(state)
        if info is not None and info.prompt_tokens:
            prompt = info.prompt_tokens
        elif request.token_ids is not None:
            prompt = len(request.token_ids)
        else:
            prompt = int(len(request.prompt_text()) * p.char_to_token_multiplier)
        out = output_tokens(request)
        tpot_slo = slo_seconds(request.headers, TPOT_SLO_HEADER)
        preds = LatencyPredictions(
            ttft_slo=slo_seconds(request.headers, TTFT_SLO_HEADER),
            tpot_slo=tpot_slo * p.slo_buffer_factor if tpot_slo is not None else None,
            output_tokens=out,
        )
        now = time.monotonic()
        self._censored(now)
        known = CandidateNames.of(endpoints)
        names = known.names
        index = known.index()
        if index is None:  # two candidates share a name (not in a pool): one row each
            index = {n: i for i, n in enumerate(names)}
        # Only the pods with requests in flight or a prefix match differ from the rest: the
        # columns are filled with the common value and those pods set one by one, so the
        # cost follows the pods that can differ, not the pool (at 1,024 pods a per-pod
        # lookup of each was most of a decision).
        n = len(names)
        counts = np.zeros(n)
        tokens = np.zeros(n)
        inflight: dict[str, int] = {}
        waits: dict[str, float] = {}
        prompts = self.load.prompts
        price = self.queue_price
        keys_on = self.load.keys_on
        for pod, c in self.load.requests.items():
            i = index.get(pod)
            if i is not None and c:
                counts[i] = c
                tokens[i] = ahead = float(prompts.get(pod, 0))
                inflight[pod] = c
                if price is not None:  # only pods with requests in flight wait at all
                    w = price.wait(pod, ahead, c, keys_on(pod), now)
                    if w > 0.0:
                        waits[pod] = w
        uncached: np.ndarray | None = None
        ratios: dict[str, float] = {}
        if info is not None:
            uncached = np.full(n, float(info.prompt_tokens))
            for pod in info.matched_blocks:
                i = index.get(pod)
                if i is not None:
                    ratios[pod] = info.ratio(pod)
                    uncached[i] = info.uncached_tokens(pod)
        rows = self._features.build(endpoints, prompt, uncached, counts, tokens, out)
        preds.inflight = inflight
        preds.waits = waits
        preds.prefix = ratios
        preds.rows = rows
        preds.row_index = index
        ttft, tpot = self.predictor.predict(names, rows, index)
        if ttft is not None:
            for pod, w in waits.items():  # a fresh array: the model's part plus the wait
                ttft[index[pod]] += w
            self._set_predictions(preds, endpoints, names, ttft, tpot)
            if record:
                self._record_duration(request, time.perf_counter() - t0, preds)
        state[PREDICTIONS_KEY] = preds
        return preds

    @staticmethod
    def _set_predictions(
        preds: LatencyPredictions,
        endpoints: list[Endpoint],
        names: list[str],
        ttfts: list[float] | np.ndarray,
        tpots: list[float] | np.ndarray | None,
    ) -> None:
        """Fill `preds.pods` (headrooms against the request's SLOs) from seconds per pod."""
        preds.pods = PodPredictions(
            endpoints,
            names,
            preds.row_index,
            np.asarray(ttfts, dtype=float),
            np.asarray(tpots, dtype=float) if tpots is not None else None,
            preds,
        )

    def _record_duration(
        self, request: InferenceRequest, dt: float, preds: LatencyPredictions
    ) -> None:
        labels = (request.model, request.target_model)
        self.metrics.ttft_duration.labels(*labels).observe(dt)
        self.metrics.ttft_duration_gauge.labels(*labels).set(dt)
        pods = preds.pods
        if (
            pods.tpot is not None
            if isinstance(pods, PodPredictions)
            else any(p.tpot is not None for p in pods.values())
        ):
            self.metrics.tpot_duration.labels(*labels).observe(dt)
            self.metrics.tpot_duration_gauge.labels(*labels).set(dt)

    def _censored(self, now: float) -> None:
        """Raise the TTFT factor of a pod whose oldest unanswered request (no first chunk in
        streaming mode, no end otherwise) has outlived its prediction, until it answers
        (model.py: a floor, not what the factor learns). Visits only the pods
        with requests in flight, so an idle fleet costs nothing here."""
        model = self.predictor.ttft
        for pod, pending in self._pending.items():
            if not pending:
                continue
            oldest = next(iter(pending.values()))
            if oldest.base_ttft is not None and not oldest.ctx.first_chunk_at:
                # late against what was predicted: what follows the foreseen wait (in-process
                # predictions), or the whole time to first token (a remote predictor's)
                elapsed = now - oldest.ctx.started_at - oldest.base_after
                model.raise_factor(pod, elapsed, oldest.base_ttft)
            else:
                model.clear_floor(pod)  # answered: its answer teaches the factor

    async def pre_request(self, ctx: RequestContext) -> None:
        preds = read_predictions(ctx.state)
        pod = ctx.target.name
        key = ctx.key
        row = preds.features_of(pod) if preds is not None else None
        prompt = row[3] * 1000.0 if row is not None else 0.0
        att = _Attempt(
            pod,
            row,
            ctx,
            preds.ttft_slo if preds is not None else None,
            preds.tpot_slo if preds is not None else None,
        )
        self._attempts[key] = att
        self._pending.setdefault(pod, {})[key] = att
        if preds is None:
            return
        if self.remote is not None and self.remote.training_url and row is not None:
            att.remote_request = prediction_request(
                row[2], round(prompt), round(row[0] * 8), round(row[1] * 32),
                preds.prefix.get(pod, 0.0),
            )  # fmt: skip
        labels = (ctx.request.model, ctx.request.target_model)
        m = self.metrics
        if preds.ttft_slo is not None:
            m.ttft_slo.labels(*labels).set(preds.ttft_slo)
        if preds.tpot_slo is not None:
            m.tpot_slo.labels(*labels).set(preds.tpot_slo)
        pred = preds.pods.get(pod)
        if pred is not None:
            att.predicted_ttft, att.predicted_tpot = pred.ttft, pred.tpot
            # the in-process model learns what follows the foreseen wait, whichever
            # predictor's TTFT was used
            att.wait = wait = preds.waits.get(pod, 0.0)
            att.base_after = wait if preds.waits_added else 0.0
            own = pred.ttft - att.base_after
            att.base_ttft = max(own, MIN_PREDICTION) / self.predictor.ttft.factors.get(pod, 1.0)
            m.predicted_ttft.labels(*labels).observe(pred.ttft)
            m.predicted_ttft_gauge.labels(*labels).set(pred.ttft)
            if pred.tpot is not None:
                m.predicted_tpot.labels(*labels).observe(pred.tpot)
                m.predicted_tpot_gauge.labels(*labels).set(pred.tpot)

    async def response_streaming(self, ctx: RequestContext, chunk: bytes) -> None:
        # Streaming mode samples TPOT during the stream, at token counts the sampler draws
        # (one SSE event per token, unless the server coalesced several into a chunk).
        if not self.params.streaming_mode:
            return
        att = self._attempts.get(ctx.key)
        token = ctx.events_seen
        if (
            att is None
            or att.row is None
            or ctx.last_chunk_at == ctx.first_chunk_at  # the first chunk: no interval yet
            or token < att.next_sample
            or att.tpot_samples >= self._max_tpot_samples - 1
        ):
            return
        att.tpot_samples += 1
        att.next_sample = self._sampler.after(token)
        tpot = (ctx.last_chunk_at - ctx.first_chunk_at) / (token - 1)
        self.predictor.tpot.observe(att.pod, att.row, tpot)
        self._train_remote(att, 0.0, tpot, token)

    async def response_complete(self, ctx: RequestContext) -> None:
        key = ctx.key
        att = self._attempts.pop(key, None)
        pending = self._pending.get(ctx.target.name)
        # a floor holds while the request that set it is unanswered; the next prediction
        # sets it again from the pod's oldest one still waiting, if that is late too
        self.predictor.ttft.clear_floor(ctx.target.name)
        if pending is not None:
            pending.pop(key, None)
            if not pending:  # only pods with requests in flight are listed (_censored)
                del self._pending[ctx.target.name]
        if att is None or ctx.error is not None or not (ctx.status or 0) < 300:
            return
        labels = (ctx.request.model, ctx.request.target_model)
        m = self.metrics
        # the relay timed the answer and read its usage (tokens, else its SSE events)
        generated = ctx.output_tokens or ctx.events_seen
        if not self.params.streaming_mode:
            ttft: float | None = (ctx.last_chunk_at or time.monotonic()) - ctx.started_at
            tpot: float | None = None
        elif ctx.response_body is not None or not ctx.first_chunk_at:
            return  # not streamed: neither TTFT nor TPOT can be told apart
        else:
            ttft = ctx.first_chunk_at - ctx.started_at
            span = ctx.last_chunk_at - ctx.first_chunk_at
            tpot = span / (generated - 1) if generated > 1 else None
        if ttft is not None:
            _record(
                ttft,
                att.predicted_ttft,
                att.ttft_slo,
                labels,
                (m.ttft_gauge, m.ttft_error, m.ttft_violation, m.ttft_violation_total),
            )
            if att.row is not None:
                self.predictor.ttft.observe(att.pod, att.row, ttft, att.wait)
                self._train_remote(att, ttft, 0.0, 0)
        if tpot is not None:
            _record(
                tpot,
                att.predicted_tpot,
                att.tpot_slo,
                labels,
                (m.tpot_gauge, m.tpot_error, m.tpot_violation, m.tpot_violation_total),
            )
            if att.row is not None:
                self.predictor.tpot.observe(att.pod, att.row, tpot)
                self._train_remote(att, 0.0, tpot, generated)

    def _train_remote(self, att: _Attempt, ttft: float, tpot: float, generated: int) -> None:
        if self.remote is not None and att.remote_request is not None:
            self.remote.train(training_entry(att.remote_request, ttft, tpot, generated))

    def collect_metrics(self) -> Iterable[Metric]:
        return self.metrics.collect()
