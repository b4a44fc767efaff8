"""The gateway's own disaggregation hops: encode, then prefill, before the decode request.

The profile handler left a DisaggPlan on the CycleState naming the encode pods and the
prefill pod it chose. In `gateway` mode this module sends them their requests, as vLLM's
disaggregated proxies do, and returns the body the decode pod gets:

- Encode (vLLM's disaggregated encoder, EPD): one chat completion per image / audio / video
  part, the text removed, `max_tokens` 1, not streamed, spread round-robin over the chosen
  encode pods, all at once. Each answers `ec_transfer_params` ({mm_hash: {do_remote_encode,
  ...}}); their union goes into the prefill and decode requests, so those pods load the
  encoder output instead of running the encoder.
- Prefill (NIXL): the request with `kv_transfer_params` {do_remote_decode: true, ...},
  `stream` false, its token limit 1 and no `stream_options`; the `kv_transfer_params` the
  prefill pod answers go into the decode request, which keeps the client's stream and limits.

A hop that fails (connect error, timeout, non-2xx status, an answer without the transfer
parameters) is logged and counted (`inference_objective_disagg_hop_failures_total`) and the
request goes on without that stage: the decode pod computes it itself. A prefill hop that
could not reach its pod, lost the connection or got a 5xx is first sent to the prefill
profile's next candidates, up to the gateway's attempt limit (`--max-attempts`); a timeout
(the hop's budget is spent) or a 4xx (the request itself) is not retried. In `headers` mode no
hop is sent; the chosen pods are only named in the mif-* headers, for a sidecar on the
decode pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import orjson
from multidict import CIMultiDict

from heimdall_proxy.framework.disagg import DisaggPlan, multimodal_parts, read_plan
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.spans import SPANS_KEY
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.observability.metrics import GatewayMetrics
from heimdall_proxy.observability.tracing import RequestTrace
from heimdall_proxy.upstream import UpstreamClient, UpstreamError, UpstreamTimeouts

log = logging.getLogger(__name__)

ENCODE_PATH = "/v1/chat/completions"
#: What a prefill pod is asked to do: compute the prompt's KV and keep it for a remote
#: decode (vLLM's NIXL connector fills in the remote_* fields in its answer).
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_HOP_FAILURES = (UpstreamError, TimeoutError, ValueError)


class HopError(Exception):
    """A hop's answer was not usable; `status` is its HTTP status when that was the reason."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def another_pod_may_serve(exc: BaseException) -> bool:
    """Whether a failed hop is worth sending to another pod: the pod was unreachable, went
    away mid-answer or answered 5xx. Not a timeout, a 4xx or an unusable 2xx answer."""
    if isinstance(exc, TimeoutError):
        return False
    if isinstance(exc, HopError):
        return exc.status is not None and exc.status >= 500
    return isinstance(exc, UpstreamError)


def prefill_request(ireq: InferenceRequest, data: Mapping[str, Any]) -> dict[str, Any]:
    """The body for the prefill pod: `data` made prefill-only."""
    doc = dict(data)
    doc["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    doc["stream"] = False
    doc.pop("stream_options", None)
    if ireq.api == "responses":
        doc["max_output_tokens"] = 1
        # not a response the client will ever ask the pod about
        doc["store"] = False
        doc.pop("background", None)
    else:
        doc["max_tokens"] = 1
        if ireq.api == "chat":
            doc["max_completion_tokens"] = 1
    return doc


def _chat_part(part: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses API media part as the chat API writes it (chat parts pass unchanged)."""
    if part.get("type") == "input_image":
        url = part.get("image_url") or part.get("file_id")
        if isinstance(url, str):
            return {"type": "image_url", "image_url": {"url": url}}
    return dict(part)


def encode_requests(ireq: InferenceRequest) -> list[dict[str, Any]]:
    """One chat completion per multimodal part of the request, text removed."""
    model = ireq.data.get("model")
    return [
        {
            "model": model,
            "messages": [{"role": "user", "content": [_chat_part(part)]}],
            "max_tokens": 1,
            "stream": False,
        }
        for part in multimodal_parts(ireq.api, ireq.data)
    ]


class Hops:
    """Sends the hops of one gateway; stateless between requests."""

    def __init__(
        self,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        max_attempts: int = 1,
        load: InFlightLoad | None = None,
    ) -> None:
        self.client = client
        #: Told of every hop, so a quiet prefill/encode pod is scraped again (cadence.py).
        self.load = load or InFlightLoad()
        self.metrics = metrics
        self.max_attempts = max(1, max_attempts)

    async def run(
        self,
        ireq: InferenceRequest,
        state: CycleState,
        headers: CIMultiDict[str],
        body: bytes,
    ) -> tuple[Endpoint | None, bytes]:
        """Run the plan's hops. Returns the prefill pod whose KV the decode request uses (or
        None) and the body for the decode pod (`body` itself when no hop changed it)."""
        plan = read_plan(state)
        if plan is None or (plan.prefill is None and not plan.encode):
            return None, body
        if plan.mode == "headers":
            plan.prefill_done = plan.prefill
            plan.encode_done = list(plan.encode)
            return plan.prefill, body
        hop_headers = headers.copy()
        hop_headers.popall("Accept-Encoding", None)  # the hop's answer is parsed here
        hop_headers["Content-Type"] = "application/json"
        spans: RequestTrace | None = state.get(SPANS_KEY)
        extra: dict[str, Any] = {}
        if plan.encode:
            ec_params = await self._encode(ireq, plan, hop_headers, spans)
            if ec_params:
                extra["ec_transfer_params"] = ec_params
        if plan.prefill is not None:
            doc = prefill_request(ireq, {**ireq.data, **extra} if extra else ireq.data)
            candidates = [plan.prefill, *plan.prefill_fallback][: self.max_attempts]
            for i, endpoint in enumerate(candidates):
                nxt = candidates[i + 1] if i + 1 < len(candidates) else None
                kv_params = await self._prefill(ireq, plan, endpoint, doc, hop_headers, nxt, spans)
                if isinstance(kv_params, dict):
                    plan.prefill_done = endpoint
                    extra["kv_transfer_params"] = kv_params
                    break
                if kv_params is False:  # not worth another pod
                    break
        if not extra:
            return None, body
        return plan.prefill_done, orjson.dumps({**ireq.data, **extra})

    async def _post(
        self,
        endpoint: Endpoint,
        path: str,
        doc: dict[str, Any],
        headers: CIMultiDict[str],
        limit: float,
        stage: str,
        spans: RequestTrace | None,
        key: str,
        tokens: int = 0,
    ) -> dict[str, Any]:
        """POST `doc` to the pod, counted in the in-flight ledger as attempt `key` with
        `tokens` prompt tokens to compute until its answer (a hop is a request the pod
        serves: the load scorers and detectors must see it); with `spans`, inside a
        `hop <stage>` span whose traceparent the pod receives."""
        load = self.load
        load.acquire(key, endpoint.name, tokens, 0, tokens)
        try:
            if spans is None:
                return await self._send(endpoint, path, doc, headers, limit)
            attributes = {"heimdall.pod": endpoint.name, "server.address": endpoint.host,
                          "server.port": endpoint.port}  # fmt: skip
            with spans.client(f"hop {stage}", **attributes) as span:
                traced = headers.copy()
                spans.inject(span, traced)
                return await self._send(endpoint, path, doc, traced, limit)
        finally:
            load.release(key)

    async def _send(
        self,
        endpoint: Endpoint,
        path: str,
        doc: dict[str, Any],
        headers: CIMultiDict[str],
        limit: float,
    ) -> dict[str, Any]:
        status, payload = await self.client.fetch(
            "POST", endpoint.url, path, orjson.dumps(doc), headers, UpstreamTimeouts(total=limit)
        )
        if not 200 <= status < 300:
            raise HopError(f"status {status}: {payload[:200]!r}", status)
        answer = orjson.loads(payload)
        if not isinstance(answer, dict):
            raise HopError("the answer is not a JSON object")
        return answer

    def _failed(
        self,
        stage: str,
        endpoint: Endpoint,
        ireq: InferenceRequest,
        exc: Any,
        next_pod: Endpoint | None = None,
    ) -> None:
        self.metrics.disagg_hop_failures.labels(stage, endpoint.name).inc()
        extra = {
            "stage": stage,
            "endpoint": endpoint.name,
            "error": f"{type(exc).__name__}: {exc}",
            "request_id": ireq.request_id,
        }
        if next_pod is not None:
            log.warning("%s hop failed; trying %s", stage, next_pod.name, extra=extra)
        else:
            log.warning("%s hop failed; the decode pod does that stage itself", stage, extra=extra)

    async def _prefill(
        self,
        ireq: InferenceRequest,
        plan: DisaggPlan,
        endpoint: Endpoint,
        doc: dict[str, Any],
        headers: CIMultiDict[str],
        next_pod: Endpoint | None,
        spans: RequestTrace | None = None,
    ) -> dict[str, Any] | bool:
        """The pod's kv_transfer_params, or False, or True when another pod is worth a try."""
        try:
            answer = await self._post(
                endpoint, ireq.path, doc, headers, plan.hop_timeout, "prefill", spans,
                f"{ireq.request_id}:prefill:{endpoint.name}", ireq.estimated_tokens(),
            )  # fmt: skip
            kv_params = answer.get("kv_transfer_params")
            if not isinstance(kv_params, dict) or not kv_params:
                raise HopError("the answer carries no kv_transfer_params")
        except (*_HOP_FAILURES, HopError) as exc:
            retry = next_pod is not None and another_pod_may_serve(exc)
            self._failed("prefill", endpoint, ireq, exc, next_pod if retry else None)
            return retry
        self.metrics.disagg_hops.labels("prefill", endpoint.name).inc()
        return kv_params

    async def _encode(
        self,
        ireq: InferenceRequest,
        plan: DisaggPlan,
        headers: CIMultiDict[str],
        spans: RequestTrace | None = None,
    ) -> dict[str, Any]:
        docs = encode_requests(ireq)
        pods = plan.encode

        async def one(i: int, doc: dict[str, Any]) -> tuple[Endpoint, dict[str, Any] | None]:
            endpoint = pods[i % len(pods)]
            try:
                answer = await self._post(
                    endpoint, ENCODE_PATH, doc, headers, plan.hop_timeout, "encode", spans,
                    f"{ireq.request_id}:encode:{i}",
                )  # fmt: skip
                params = answer.get("ec_transfer_params")
                if params is None:
                    # vLLM's shared-storage EC connectors answer 2xx without parameters: the
                    # encoder output is in storage the decode pod reads by the item's hash.
                    params = {}
                elif not isinstance(params, dict):
                    raise HopError("the answer's ec_transfer_params is not an object")
            except (*_HOP_FAILURES, HopError) as exc:
                self._failed("encode", endpoint, ireq, exc)
                return endpoint, None
            self.metrics.disagg_hops.labels("encode", endpoint.name).inc()
            return endpoint, params

        results = await asyncio.gather(*(one(i, doc) for i, doc in enumerate(docs)))
        merged: dict[str, Any] = {}
        done: list[Endpoint] = []
        for endpoint, params in results:
            if params is None:
                continue
            merged.update(params)
            if all(e is not endpoint for e in done):
                done.append(endpoint)
        plan.encode_done = done
        return merged
