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
request goes on without that stage: the decode pod computes it itself. In `headers` mode no
hop is sent; the chosen pods are only named in the mif-* headers, for a sidecar on the
decode pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict
from yarl import URL

from heimdall_proxy.framework.disagg import DisaggPlan, multimodal_parts, read_plan
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest
from heimdall_proxy.observability import GatewayMetrics

log = logging.getLogger("heimdall_proxy.server.hops")

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
_HOP_FAILURES = (aiohttp.ClientError, TimeoutError, ValueError)


class HopError(Exception):
    """A hop's answer was not usable."""


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

    def __init__(self, session: aiohttp.ClientSession, metrics: GatewayMetrics) -> None:
        self.session = session
        self.metrics = metrics

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
        extra: dict[str, Any] = {}
        if plan.encode:
            ec_params = await self._encode(ireq, plan, hop_headers)
            if ec_params:
                extra["ec_transfer_params"] = ec_params
        if plan.prefill is not None:
            data = {**ireq.data, **extra} if extra else ireq.data
            kv_params = await self._prefill(ireq, plan, plan.prefill, data, hop_headers)
            if kv_params is not None:
                plan.prefill_done = plan.prefill
                extra["kv_transfer_params"] = kv_params
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
    ) -> dict[str, Any]:
        url = URL(f"{endpoint.url}{path}", encoded=True)
        async with self.session.post(
            url,
            data=orjson.dumps(doc),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=limit),
        ) as resp:
            payload = await resp.read()
            if not 200 <= resp.status < 300:
                raise HopError(f"status {resp.status}: {payload[:200]!r}")
        answer = orjson.loads(payload)
        if not isinstance(answer, dict):
            raise HopError("the answer is not a JSON object")
        return answer

    def _failed(self, stage: str, endpoint: Endpoint, ireq: InferenceRequest, exc: Any) -> None:
        self.metrics.disagg_hop_failures.labels(stage, endpoint.name).inc()
        log.warning(
            "%s hop failed; the decode pod does that stage itself",
            stage,
            extra={
                "stage": stage,
                "endpoint": endpoint.name,
                "error": f"{type(exc).__name__}: {exc}",
                "request_id": ireq.request_id,
            },
        )

    async def _prefill(
        self,
        ireq: InferenceRequest,
        plan: DisaggPlan,
        endpoint: Endpoint,
        data: Mapping[str, Any],
        headers: CIMultiDict[str],
    ) -> dict[str, Any] | None:
        try:
            answer = await self._post(
                endpoint,
                ireq.path,
                prefill_request(ireq, data),
                headers,
                plan.hop_timeout,
            )
            kv_params = answer.get("kv_transfer_params")
            if not isinstance(kv_params, dict) or not kv_params:
                raise HopError("the answer carries no kv_transfer_params")
        except (*_HOP_FAILURES, HopError) as exc:
            self._failed("prefill", endpoint, ireq, exc)
            return None
        self.metrics.disagg_hops.labels("prefill", endpoint.name).inc()
        return kv_params

    async def _encode(
        self, ireq: InferenceRequest, plan: DisaggPlan, headers: CIMultiDict[str]
    ) -> dict[str, Any]:
        docs = encode_requests(ireq)
        pods = plan.encode

        async def one(i: int, doc: dict[str, Any]) -> tuple[Endpoint, dict[str, Any] | None]:
            endpoint = pods[i % len(pods)]
            try:
                answer = await self._post(endpoint, ENCODE_PATH, doc, headers, plan.hop_timeout)
                params = answer.get("ec_transfer_params")
                if not isinstance(params, dict) or not params:
                    raise HopError("the answer carries no ec_transfer_params")
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
