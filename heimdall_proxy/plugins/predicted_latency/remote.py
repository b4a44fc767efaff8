"""A client of GIE's latency-predictor sidecars, for a gateway that shares one trained
model with other gateways (or with an EPP) instead of learning its own.

The wire format is that of GIE's `latencypredictor` servers and of the EPP's Go client
(`sidecars/latencypredictorasync`):

* prediction server: `POST /predict/bulk/strict` with `{"requests": [PredictionRequest]}`,
  answered `{"predictions": [{"ttft_ms", "tpot_ms", ...}], "total_requests", ...}`, one
  prediction per request in order (strict: any failure fails the whole call);
* training server: `POST /add_training_data_bulk` with `{"entries": [TrainingEntry]}`,
  answered 202.

A PredictionRequest carries `kv_cache_percentage` (0-1), `input_token_length`,
`num_request_waiting`, `num_request_running`, `num_tokens_generated` and
`prefix_cache_score`; a TrainingEntry the same plus `actual_ttft_ms`, `actual_tpot_ms`
and an RFC 3339 `timestamp`. Latencies are milliseconds on the wire, seconds here.

Prediction is on the request path, so a call has a short timeout, and a failed call marks
the server down for `retry_after` seconds: the caller then uses the in-process model
without paying a timeout per request. Training entries are buffered (at most `max_buffer`,
the oldest dropped first) and sent once per `flush_interval` by a background task."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson

from heimdall_proxy.upstream import UpstreamClient, UpstreamError, UpstreamTimeouts

log = logging.getLogger(__name__)

PREDICT_PATH = "/predict/bulk/strict"
TRAIN_PATH = "/add_training_data_bulk"
_JSON = {"Content-Type": "application/json"}


class PredictorUnavailable(Exception):
    """The prediction server could not answer (down, slow, or an answer we cannot use)."""


def prediction_request(
    kv_cache: float, prompt_tokens: int, waiting: int, running: int, prefix: float
) -> dict[str, Any]:
    """One PredictionRequest (at scheduling time: no token generated yet)."""
    return {
        "kv_cache_percentage": kv_cache,
        "input_token_length": prompt_tokens,
        "num_request_waiting": waiting,
        "num_request_running": running,
        "num_tokens_generated": 0,
        "prefix_cache_score": prefix,
    }


def training_entry(
    request: Mapping[str, Any], ttft: float, tpot: float, generated: int
) -> dict[str, Any]:
    """One TrainingEntry: the PredictionRequest the pod was chosen with, and what was
    observed (seconds; 0 for the latency not measured by this entry)."""
    return {
        **request,
        "num_tokens_generated": generated,
        "actual_ttft_ms": ttft * 1000.0,
        "actual_tpot_ms": tpot * 1000.0,
        "timestamp": datetime.now(UTC).isoformat(),
    }


class RemotePredictor:
    """Prediction and training clients of the sidecars; either URL may be None (no remote
    prediction, or no remote training). Call `start` and `stop` from the event loop."""

    __slots__ = (
        "_buffer",
        "_client",
        "_down_until",
        "_flusher",
        "flush_interval",
        "prediction_url",
        "retry_after",
        "sent",
        "timeout",
        "training_url",
    )

    def __init__(
        self,
        prediction_url: str | None,
        training_url: str | None,
        *,
        timeout: float = 0.1,
        retry_after: float = 5.0,
        flush_interval: float = 1.0,
        max_buffer: int = 1000,
    ) -> None:
        self.prediction_url = prediction_url.rstrip("/") if prediction_url else None
        self.training_url = training_url.rstrip("/") if training_url else None
        self.timeout = timeout
        self.retry_after = retry_after
        self.flush_interval = flush_interval
        #: training entries accepted by the training server so far
        self.sent = 0
        self._buffer: deque[dict[str, Any]] = deque(maxlen=max_buffer)
        self._down_until = 0.0
        #: One prediction per scheduled request: the lean client (heimdall_proxy/upstream).
        self._client: UpstreamClient | None = None
        self._flusher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._client is None:
            self._client = UpstreamClient(connect_timeout=None)  # each call's total bounds it
        if self.training_url and self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_loop())

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self._client is not None:
            await self.flush()
            await self._client.close()
            self._client = None

    @property
    def available(self) -> bool:
        """A prediction server is configured, started, and not marked down."""
        return (
            self.prediction_url is not None
            and self._client is not None
            and time.monotonic() >= self._down_until
        )

    async def predict(self, requests: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
        """(TTFT, TPOT) seconds per request, in order. Raises PredictorUnavailable (and
        marks the server down for `retry_after`) when it cannot answer."""
        if not self.available or self._client is None or self.prediction_url is None:
            raise PredictorUnavailable("prediction server not available")
        url = f"{self.prediction_url}{PREDICT_PATH}"
        try:
            status, payload = await self._client.fetch(
                "POST",
                self.prediction_url,
                PREDICT_PATH,
                orjson.dumps({"requests": list(requests)}),
                _JSON,
                UpstreamTimeouts(total=self.timeout),
            )
            if status != 200:
                raise PredictorUnavailable(f"{url} answered {status}")
            body = orjson.loads(payload)
            preds = body["predictions"]
            if len(preds) != len(requests):
                raise PredictorUnavailable(
                    f"{url} answered {len(preds)} predictions for {len(requests)} requests"
                )
            return [(float(p["ttft_ms"]) / 1000.0, float(p["tpot_ms"]) / 1000.0) for p in preds]
        except (UpstreamError, TimeoutError, orjson.JSONDecodeError) as exc:
            self._mark_down(f"{url}: {type(exc).__name__} {exc}")
            raise PredictorUnavailable(str(exc)) from exc
        except (PredictorUnavailable, KeyError, TypeError, ValueError) as exc:
            self._mark_down(f"{url}: unusable answer ({exc})")
            raise PredictorUnavailable(str(exc)) from exc

    def _mark_down(self, why: str) -> None:
        if time.monotonic() >= self._down_until:
            log.warning(
                "latency prediction server unavailable, using the in-process model for %.0f s: %s",
                self.retry_after,
                why,
            )
        self._down_until = time.monotonic() + self.retry_after

    def train(self, entry: dict[str, Any]) -> None:
        """Queue one training entry for the next flush (no-op without a training server)."""
        if self.training_url:
            self._buffer.append(entry)

    async def flush(self) -> None:
        """Send the queued entries; on failure they are queued again for the next flush."""
        if not self._buffer or self._client is None or not self.training_url:
            return
        entries = list(self._buffer)
        self._buffer.clear()
        url = f"{self.training_url}{TRAIN_PATH}"
        try:
            status, _ = await self._client.fetch(
                "POST",
                self.training_url,
                TRAIN_PATH,
                orjson.dumps({"entries": entries}),
                _JSON,
                UpstreamTimeouts(total=max(self.timeout, 1.0)),
            )
            if status >= 300:
                raise UpstreamError(f"training refused: status {status}")
        except (UpstreamError, TimeoutError, ValueError) as exc:  # ValueError: a bad URL
            log.debug("latency training server unavailable: %s %s", url, exc)
            self._buffer.extendleft(reversed(entries))  # before those queued meanwhile
            return
        self.sent += len(entries)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            await self.flush()
