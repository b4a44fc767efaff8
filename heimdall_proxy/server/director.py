"""The director: one inference request's whole life, in llm-d's order.

parse (and the request-header plugins) -> candidates -> admit (flow control) -> prepare-data
and producers -> admit (admitter plugins) -> schedule -> the disaggregation hops -> attempts
on the ranked pods (pre-request and response hooks run per attempt in the relay; a ranking
used up is scheduled again without the pods that failed) -> finish (the admission, the
request metrics).

The gateway hands it a request whose body it has read and gets a response back; the relay
sends and streams, one attempt at a time. The parser in force for the request's path
(`requestHandler.parsers`) reads it. Until a pod is contacted every failure is a
`RequestError`, answered here in the shape of the request's API."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from heimdall_proxy.config.build import PluginSet
from heimdall_proxy.datalayer.pool import EndpointPool, ModelNotFoundError, NoEndpointsError
from heimdall_proxy.flowcontrol.controller import Admission, FlowController
from heimdall_proxy.framework.disagg import find_prefix_match
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.spans import SPANS_KEY
from heimdall_proxy.framework.trace import TRACE_KEY, ScheduleTrace
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    RequestContext,
    SchedulingError,
    SchedulingResult,
)
from heimdall_proxy.observability.metrics import GatewayMetrics, series_key
from heimdall_proxy.observability.tracing import RequestTrace
from heimdall_proxy.requesthandling.untrusted import untrusted_fields
from heimdall_proxy.requesthandling.usage import USAGE_ASKED_KEY, ask_for_usage
from heimdall_proxy.resilience.outliers import OutlierDetector, Verdicts
from heimdall_proxy.resilience.retry import RetryBudget, backoff, failure_reason
from heimdall_proxy.server.admission import AdmissionControl
from heimdall_proxy.server.answers import UNKNOWN_MODEL
from heimdall_proxy.server.errors import render
from heimdall_proxy.server.picks import PickLog
from heimdall_proxy.server.relay import Relay

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Decision:
    """A scheduled request: the parsed request, the cycle's state (read by the hooks and the
    disaggregation hops) and the scheduler's result."""

    request: InferenceRequest
    state: CycleState
    result: SchedulingResult
    #: The flow controller's admission, finished when the request is over.
    admission: Admission | None = None


class Director:
    def __init__(
        self,
        pool: EndpointPool,
        plugins: PluginSet,
        metrics: GatewayMetrics,
        trust_transfer_params: bool = False,
        outliers: OutlierDetector | None = None,
        flow: FlowController | None = None,
        max_attempts: int = 1,
    ) -> None:
        self.admission = AdmissionControl(flow, plugins.admitters)
        self.outliers = outliers
        self.pool = pool
        self.plugins = plugins
        #: Which parser reads a request, by its path.
        self.parsers = plugins.parsers
        self.metrics = metrics
        self.trust_transfer_params = trust_transfer_params
        self.max_attempts = max(1, max_attempts)
        #: Retries in flight are bounded by the requests in flight (resilience/retry.py).
        self.budget = RetryBudget()
        #: Sends to the pods; set when the routing starts (it needs the upstream client).
        self.relay: Relay | None = None
        self._has_prepare = bool(plugins.prepare_data or plugins.producers)
        #: The recent picks of the live page (server/picks.py); None while it is off.
        self.picks: PickLog | None = None

    # -- the whole life ----------------------------------------------------------------

    async def serve(
        self,
        request: web.Request,
        body: bytes,
        caller: str = "",
        spans: RequestTrace | None = None,
        started: float | None = None,
    ) -> web.StreamResponse:
        """Serve one inference request of `caller` end to end: its answer, or the error the
        client gets in the API's shape. `started` is when its transport began (the request
        duration metric counts from there)."""
        if started is None:
            started = time.perf_counter()
        metrics = self.metrics
        model = target = UNKNOWN_MODEL
        admission: Admission | None = None
        try:
            ireq = self._parse(request.path, body, request.headers, caller, spans)
            model = ireq.model
            target = ireq.target_model
            candidates = self.candidates(ireq)
            admission = await self.admission.enter(ireq, candidates)
            if admission is not None and admission.waited:
                candidates = self.candidates(ireq)  # the pool may have changed meanwhile
            picks = self.picks
            trace = None if picks is None else picks.want_trace()
            decision = await self._schedule(ireq, candidates, trace, admission, spans)
            if picks is not None:
                self._record(picks, decision, trace)
            target = ireq.target_model  # a plugin may have rewritten the body's model
            series = metrics.models.get(series_key(model, target))
            series = series or metrics.model_series(model, target)
            running = series.running or series.running_child()
            running.inc()
            try:
                return await self._forward(request, decision)
            finally:
                running.dec()
                (series.duration or series.histogram("duration")).observe(
                    time.perf_counter() - started
                )
        except RequestError as exc:
            metrics.errors.labels(model, target, exc.code or str(exc.status)).inc()
            return render(exc, request.path)
        finally:
            if admission is not None:
                admission.finish()

    async def decide(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        trace: ScheduleTrace | None = None,
        caller: str = "",
    ) -> Decision:
        """Parse and schedule one request without admitting or sending it (the debug route
        and the decision benchmark): `trace` records every profile's filters, scores and
        pick. Raises RequestError as `serve` would answer it."""
        ireq = self._parse(path, body, headers, caller, None)
        return await self._schedule(ireq, self.candidates(ireq), trace, None)

    # -- steps -------------------------------------------------------------------------

    def _parse(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        caller: str,
        spans: RequestTrace | None,
    ) -> InferenceRequest:
        parser = self.parsers.resolve(path)
        if parser is None:
            raise RequestError(
                400,
                f"No parser of this gateway reads {path} (requestHandler.parsers lists none "
                "that claims it, and no fallback such as passthrough-parser).",
                code="unsupported_path",
            )
        if spans is None:
            ireq = parser.parse_request(path, body, headers)
        else:
            with spans.phase("parse") as span:
                ireq = parser.parse_request(path, body, headers)
                span.set_attribute("gen_ai.request.model", ireq.model)
                spans.span.set_attribute("heimdall.request_id", ireq.request_id)
        ireq.caller = caller
        untrusted_fields(ireq, self.trust_transfer_params)
        for plugin in self.plugins.request_header:  # e.g. agent-identity, before admission
            plugin.request_header(ireq)
        return ireq

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
        if self.admission.admitters:
            self.admission.admit(state, ireq, candidates)
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

    @staticmethod
    def _record(picks: PickLog, decision: Decision, trace: ScheduleTrace | None) -> None:
        result = decision.result
        pod = result.primary.targets[0].name
        match = find_prefix_match(decision.state)
        prefix = None if match is None else match.ratio(pod)
        picks.record(decision.request.model, result.primary_profile, pod, prefix, trace)

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

    async def _forward(self, request: web.Request, decision: Decision) -> web.StreamResponse:
        """Serve `decision` from its pod, falling back to the next-best pods: a pod that
        fails before sending a response, or answers a retryable status while another pod
        may be tried, is replaced (resilience/retry.py says when, the retry budget how often).
        Once a response has started nothing is retried. Raises RequestError(502) when no pod
        could serve it."""
        relay = self.relay
        assert relay is not None, "the routing is not started"
        ireq, state, result = decision.request, decision.state, decision.result
        body, headers, prefill = await relay.prepare(request, ireq, state)
        if decision.admission is not None:
            decision.admission.sent()
        tried = []
        target = result.primary.targets[0]
        order: list[Endpoint] | None = None  # the fallback order, built only when needed
        attempt = 0
        budget = self.budget
        max_attempts = self.max_attempts
        retrying = False

        def another_pod() -> bool:
            """Whether a failed attempt may go to the next pod (builds the order lazily; when
            the scheduled ranking is used up, e.g. a filter kept only the pod that failed,
            the request is scheduled again without the pods already in the order)."""
            nonlocal order
            if order is None:
                order = result.fallback_order()[:max_attempts]
            if attempt + 1 >= len(order) and len(order) < max_attempts:
                more = self.fallback(ireq, state, {e.name for e in order})
                order.extend(more[: max_attempts - len(order)])
            return attempt + 1 < len(order) and budget.allows()

        spans: RequestTrace | None = state.get(SPANS_KEY)
        verdicts = Verdicts(relay.outliers)
        budget.in_flight += 1
        try:
            while True:
                ctx = RequestContext(ireq, state, result, target, prefill=prefill, attempt=attempt)
                if spans is None:
                    response = await relay.attempt(
                        request, ctx, body, headers, verdicts, another_pod
                    )
                else:
                    response = await relay.traced(
                        spans, request, ctx, body, headers, verdicts, another_pod
                    )
                if response is not None:
                    return response
                tried.append(f"{target.name} ({ctx.error})")
                if not another_pod():
                    break
                assert order is not None
                self.metrics.retries.labels(failure_reason(ctx.error)).inc()
                attempt += 1
                if not retrying:
                    retrying = True
                    budget.retries += 1
                await asyncio.sleep(backoff(attempt, ctx.upstream_response_headers))
                target = order[attempt]
        finally:
            budget.in_flight -= 1
            if retrying:
                budget.retries -= 1
        # Which pods failed and how goes to the log only: pod names and addresses are the
        # operator's (the debug routes that show them are locked down too).
        log.warning(
            "no model server could serve the request",
            extra={"request_id": ireq.request_id, "error": "; ".join(tried)},
        )
        raise RequestError(
            502,
            f"No model server could serve the request ({len(tried)} attempts failed; "
            f"request id {ireq.request_id}).",
            code="upstream_unreachable",
        )
