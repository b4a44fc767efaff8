"""The director: one request from body to scheduling decision (GIE's director phase).

parse -> candidates -> prepare-data (and data producers) -> schedule. Everything here happens
before any pod is contacted, so every failure is an OpenAI-shaped `RequestError` answered by
the gateway itself."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from heimdall_proxy.datalayer.pool import EndpointPool, ModelNotFoundError, NoEndpointsError
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.loader import PluginSet
from heimdall_proxy.framework.spans import SPANS_KEY
from heimdall_proxy.framework.trace import TRACE_KEY, ScheduleTrace
from heimdall_proxy.framework.types import (
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    SchedulingError,
    SchedulingResult,
)
from heimdall_proxy.observability import GatewayMetrics
from heimdall_proxy.server.flow.controller import Admission, FlowController
from heimdall_proxy.server.outliers import OutlierDetector
from heimdall_proxy.server.parse import parse_body
from heimdall_proxy.server.tracing import RequestTrace
from heimdall_proxy.server.usage import USAGE_ASKED_KEY, ask_for_usage

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Decision:
    """What the director hands the relay: the parsed request, the cycle's state (read by the
    hooks and the disaggregation hops) and the scheduler's result."""

    request: InferenceRequest
    state: CycleState
    result: SchedulingResult
    #: The flow controller's admission, finished by the gateway when the request is over.
    admission: Admission | None = None


#: Body fields that make a pod act on what they name: vLLM's NIXL connector dials the
#: remote_host / remote_port of kv_transfer_params; an EC connector loads what
#: ec_transfer_params points at. The gateway writes them itself for its own hops.
TRANSFER_FIELDS = ("kv_transfer_params", "ec_transfer_params")
#: vLLM's free-form extra arguments: it copies a `kv_transfer_params` found there into the
#: same slot as the top-level field, so the transfer fields are dropped from it too.
XARGS_FIELD = "vllm_xargs"


def untrusted_fields(ireq: InferenceRequest, trust_transfer_params: bool) -> None:
    """Drop what a client must not choose: the transfer parameters, at the top level and in
    `vllm_xargs` (unless the operator trusts its clients), and, on /v1/responses,
    `request_id` (vLLM makes it the response id, so a client could otherwise name, and
    overwrite, another caller's stored response)."""
    data = ireq.data
    drop = []
    xargs = None
    if not trust_transfer_params:
        for name in TRANSFER_FIELDS:  # a loop, not a comprehension: no frame per request
            if name in data:
                drop.append(name)
        extra = data.get(XARGS_FIELD)
        if isinstance(extra, dict) and any(name in extra for name in TRANSFER_FIELDS):
            xargs = {k: v for k, v in extra.items() if k not in TRANSFER_FIELDS}
    if ireq.api == "responses" and "request_id" in data:
        drop.append("request_id")
    if drop or xargs is not None:
        kept = {k: v for k, v in data.items() if k not in drop}
        if xargs is not None:
            kept[XARGS_FIELD] = xargs
        ireq.set_data(kept)


class Director:
    def __init__(
        self,
        pool: EndpointPool,
        plugins: PluginSet,
        metrics: GatewayMetrics,
        trust_transfer_params: bool = False,
        outliers: OutlierDetector | None = None,
        flow: FlowController | None = None,
    ) -> None:
        self.flow = flow
        self.outliers = outliers
        self.pool = pool
        self.plugins = plugins
        self.metrics = metrics
        self.trust_transfer_params = trust_transfer_params
        self._has_prepare = bool(plugins.prepare_data or plugins.producers or plugins.admitters)

    async def decide(
        self,
        api: ApiKind,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        trace: ScheduleTrace | None = None,
        caller: str = "",
        spans: RequestTrace | None = None,
    ) -> Decision:
        """Parse and schedule one request. Raises RequestError for anything the client gets an
        answer to without a pod (bad body, unknown model, no pod can serve it). With `trace`,
        the scheduler records every profile's filters, scores and pick into it; with `spans`
        (tracing on), parse, prepare and each profile get a span."""
        if spans is None:
            ireq = parse_body(api, path, body, headers)
        else:
            with spans.phase("parse") as span:
                ireq = parse_body(api, path, body, headers)
                span.set_attribute("gen_ai.request.model", ireq.model)
                spans.span.set_attribute("heimdall.request_id", ireq.request_id)
        ireq.caller = caller
        untrusted_fields(ireq, self.trust_transfer_params)
        candidates = self.candidates(ireq)
        if self.flow is None or trace is not None:  # a debug trace is never queued or counted
            return await self._schedule(ireq, candidates, trace, None, spans)
        admission = await self.flow.admit(ireq, candidates)
        try:
            if admission.waited:  # the pool may have changed while it waited
                candidates = self.candidates(ireq)
            return await self._schedule(ireq, candidates, trace, admission, spans)
        except BaseException:
            admission.finish()
            raise

    async def _schedule(
        self,
        ireq: InferenceRequest,
        candidates: list[Endpoint],
        trace: ScheduleTrace | None,
        admission: Admission | None,
        spans: RequestTrace | None = None,
    ) -> Decision:
        state = CycleState()
        if ireq.stream and ask_for_usage(ireq):  # only a stream may need to ask
            state[USAGE_ASKED_KEY] = True
        if trace is not None:
            state[TRACE_KEY] = trace
        if spans is not None:
            state[SPANS_KEY] = spans
        if self._has_prepare:
            if spans is None:
                await self._prepare(ireq, state, candidates)
            else:
                with spans.phase("prepare", **{"heimdall.candidates": len(candidates)}):
                    await self._prepare(ireq, state, candidates)
        t0 = time.perf_counter()
        try:
            result = self.plugins.scheduler.schedule(state, ireq, candidates)
        except SchedulingError as exc:
            raise RequestError(
                503,
                f"No endpoint can serve the request: {exc}",
                code="no_endpoint_available",
                headers={"Retry-After": "1"},
            ) from exc
        self.metrics.scheduler_duration.observe(time.perf_counter() - t0)
        return Decision(ireq, state, result, admission)

    def fallback(
        self, ireq: InferenceRequest, state: CycleState, exclude: set[str]
    ) -> list[Endpoint]:
        """Pods to try after every ranked one failed: a new scheduling cycle over the
        candidates minus `exclude`, so that hard filters (roles, labels) still hold while a
        soft one (prefix affinity) that kept only the failed pods no longer can. On a copy of
        the cycle state: the first cycle's results stay as they were."""
        try:
            pods = [e for e in self.candidates(ireq) if e.name not in exclude]
            if not pods:
                return []
            result = self.plugins.scheduler.schedule(CycleState(state), ireq, pods)
        except (RequestError, SchedulingError):
            return []
        return [e for e in result.fallback_order() if e.name not in exclude]

    def candidates(self, ireq: InferenceRequest) -> list[Endpoint]:
        """The pods that may serve `ireq`: those serving its model (or every pod when the body
        names none), healthy ones first as the pool decides, without the pods ejected for
        failing (unless all are)."""
        try:
            if ireq.model:
                found = self.pool.candidates(ireq.model)
            else:
                if not self.pool.endpoints():
                    raise NoEndpointsError("the pool has no endpoints")
                found = self.pool.healthy() or self.pool.endpoints()
            outliers = self.outliers
            if outliers is None or not outliers.any_ejected:  # the usual case: no call
                return found
            return outliers.filter(found)
        except ModelNotFoundError as exc:
            raise RequestError(
                404,
                f"The model `{ireq.model}` does not exist.",
                code="model_not_found",
                param="model",
            ) from exc
        except NoEndpointsError as exc:
            raise RequestError(
                503,
                "No model server is configured.",
                code="no_endpoint_available",
                headers={"Retry-After": "1"},
            ) from exc

    async def _prepare(
        self, ireq: InferenceRequest, state: CycleState, candidates: list[Endpoint]
    ) -> None:
        for plugin in self.plugins.prepare_data:
            try:
                await plugin.prepare_data(ireq, candidates)
            except RequestError:
                raise  # a deliberate answer (e.g. an unknown previous_response_id)
            except Exception:
                # prepare-data plugins fail open: the request goes on without their data
                log.exception("prepare-data plugin %r failed", getattr(plugin, "name", plugin))
        for producer in self.plugins.producers:
            try:
                await producer.produce(state, ireq, candidates)
            except Exception:
                log.exception("producer %r failed", getattr(producer, "name", producer))
        for admitter in self.plugins.admitters:
            reason = admitter.admit_request(state, ireq, candidates)
            if reason is not None:
                raise RequestError(
                    429,
                    reason,
                    type="rate_limit_exceeded",
                    code="slo_unattainable",
                    headers={"Retry-After": "1"},
                )
