"""The flow controller: admits a request when its pool has room, queues it when not, and lets
queued requests go, highest priority band first and fairly across flows, as room returns.

Room is judged by the saturation detector over the request's candidate pods (so a saturated
model does not block another model's requests). Without the `flowControl` feature gate there
are no queues: a saturated pool sheds sheddable requests (priority < 0) with a 429 and lets
the others through, as GIE's admission does. With it, the others wait, bounded in requests and
bytes (per band and overall) and in time (`defaultRequestTTL`; `noEndpointRequestTTL` while
the request has no candidate), and a client that hangs up leaves the queue.

A usage-limit policy (flowControl.usageLimitPolicyPluginRef) lowers that room per band: a
request goes only while the saturation is below its band's ceiling, asked at every dispatch
decision (an admission that need not wait is one) with the active priorities, highest first.

Sending is late-bound: the dispatcher only releases a request; the director then schedules it
against the pods' state at that moment. Released requests count as `pending` in the in-flight
ledger until their first attempt, so the detector sees them before any scrape does."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from heimdall_proxy.config.flow import FlowControlConfig, PriorityBandConfig
from heimdall_proxy.flowcontrol.metrics import FlowMetrics
from heimdall_proxy.flowcontrol.objectives import MAX_FLOW_LABELS, Objectives
from heimdall_proxy.flowcontrol.queues import Band, Queued
from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.flowcontrol import (
    FairnessPolicy,
    FlowHead,
    OrderingPolicy,
    SaturationDetector,
    UsageLimitPolicy,
)
from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.types import Endpoint, InferenceRequest

log = logging.getLogger(__name__)

#: While requests wait, the dispatcher looks again at least this often (scrapes change the
#: pods' state without any request finishing).
TICK = 0.02
Policies = Callable[[PriorityBandConfig], tuple[FairnessPolicy, OrderingPolicy]]


class Admission:
    """A request let through. `sent()` when its first attempt holds a pod (it stops counting
    as pending); `finish()` when it is over, which wakes the dispatcher."""

    __slots__ = ("_controller", "_pending", "waited")

    def __init__(self, controller: FlowController, waited: bool = False) -> None:
        self._controller = controller
        self._pending = True
        #: It was queued (the dispatcher counted it as pending when it released it).
        self.waited = waited
        if not waited:
            controller.load.pending += 1

    def sent(self) -> None:
        if self._pending:
            self._pending = False
            self._controller.load.pending -= 1

    def finish(self) -> None:
        # `sent()` and the controller's `wake()`, inline: this runs for every request
        controller = self._controller
        if self._pending:
            self._pending = False
            controller.load.pending -= 1
        if controller.queued:
            controller._wake.set()


class FlowController:
    def __init__(
        self,
        detector: SaturationDetector,
        load: InFlightLoad,
        objectives: Objectives,
        config: FlowControlConfig | None,
        policies: Policies,
        metrics: FlowMetrics | None = None,
        judge: bool = True,
        usage_limit: UsageLimitPolicy | None = None,
    ) -> None:
        #: False when admission cannot refuse anything (no queues, no sheddable objective):
        #: then the detector is not consulted at all.
        self.judge = judge
        self.detector = detector
        self.load = load
        self.objectives = objectives
        self.config = config
        self.queues = config is not None
        self._shed_sheddable = config is None or not config.queues_sheddable()
        self._policies = policies
        self.metrics = metrics or FlowMetrics(None)
        self._bands: dict[int, Band] = {}
        self._order: list[Band] = []  # by priority, highest first
        self.queued = 0
        self.queued_bytes = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flow_labels: set[str] = set()
        #: The usage-limit policy (flowControl.usageLimitPolicyPluginRef), with queues only.
        #: None: every band may fill the pool to saturation 1.0 (llm-d's static default).
        self.usage_limit = usage_limit if self.queues else None
        self._priorities: list[int] = []  # of the bands, highest first
        if config is not None:  # configured bands are active from the start, as in llm-d
            for band_cfg in config.priority_bands:
                self._band(band_cfg.priority)

    # -- admission ---------------------------------------------------------------------

    async def admit(self, ireq: InferenceRequest, candidates: Sequence[Endpoint]) -> Admission:
        """Let `ireq` through now, or once its pool has room. Raises RequestError(429/503)."""
        self.objectives.classify(ireq)
        if not self.judge:
            return Admission(self)
        saturation = self.detector.saturation(candidates)
        self.metrics.saturation.set(saturation)
        if (
            saturation < 1.0
            and (self.queued == 0 or not self.queues)
            and (self.usage_limit is None or self._open(ireq.priority, saturation))
        ):
            return Admission(self)
        if ireq.priority < 0 and self._shed_sheddable and saturation >= 1.0:
            raise self._reject(ireq, "shed", "The pool is saturated and the request is sheddable")
        if not self.queues:
            return Admission(self)
        return await self._wait(ireq, candidates)

    async def _wait(self, ireq: InferenceRequest, candidates: Sequence[Endpoint]) -> Admission:
        assert self.config is not None
        band = self._band(ireq.priority)
        size = len(ireq.body)
        cfg = self.config
        if (
            band.count >= band.config.request_limit
            or band.bytes + size > band.config.byte_limit
            or (cfg.max_requests and self.queued >= cfg.max_requests)
            or (cfg.max_bytes and self.queued_bytes + size > cfg.max_bytes)
        ):
            raise self._reject(ireq, "queue_full", "The gateway's queue for this priority is full")
        ttl = cfg.default_request_ttl if candidates else cfg.no_endpoint_request_ttl
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        deadline = now + ttl if ttl > 0 else float("inf")
        item = Queued(ireq, candidates, size, now, deadline, loop.create_future())
        band.push(item)
        self._count(item, +1)
        self._ensure_dispatcher()
        self.wake()
        outcome = "Dispatched"
        try:
            async with asyncio.timeout(ttl if ttl > 0 else None):
                await item.waiter
            return Admission(self, waited=True)
        except TimeoutError:
            if item.released:
                return Admission(self, waited=True)  # released as the budget ran out
            outcome = "EvictedTTL"
            reason = "no_endpoint" if not candidates else "ttl"
            status = 503 if not candidates else 429
            raise self._reject(
                ireq,
                reason,
                f"The request waited {ttl:g}s in the gateway's queue and "
                + ("no endpoint appeared" if not candidates else "the pool stayed saturated"),
                status=status,
            ) from None
        except asyncio.CancelledError:
            outcome = "EvictedContextCancelled"
            if item.released:  # its client left between release and resumption
                self.load.pending -= 1
                self.wake()
            raise
        finally:
            if not item.gone:
                self._unqueue(band, item)
            self.metrics.queue_duration.labels(*self._labels(ireq), outcome).observe(
                time.monotonic() - now
            )

    def _reject(
        self, ireq: InferenceRequest, reason: str, message: str, status: int = 429
    ) -> RequestError:
        self.metrics.rejections.labels(str(ireq.priority), reason, self.metrics.pool_name).inc()
        return RequestError(
            status,
            f"{message}; retry later.",
            type="rate_limit_exceeded" if status == 429 else "service_unavailable",
            code={"shed": "pool_saturated", "queue_full": "queue_full"}.get(
                reason, "queue_timeout"
            ),
            headers={"Retry-After": "1"},
        )

    # -- dispatch ----------------------------------------------------------------------

    def wake(self) -> None:
        if self.queued:
            self._wake.set()

    def _ensure_dispatcher(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while self.queued:
            self._wake.clear()
            try:
                self.dispatch()
            except Exception:
                log.exception("flow-control dispatch failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK):
                    await self._wake.wait()

    def dispatch(self) -> int:
        """Release every queued request whose pool has room, best band first. Returns how
        many went."""
        released = 0
        while True:
            found = self._next()
            if found is None:
                return released
            band, item = found
            self._unqueue(band, item)
            item.released = True
            item.waiter.set_result(None)
            self.load.pending += 1
            released += 1

    def _open(self, priority: int, saturation: float) -> bool:
        """Whether a request of `priority` may go now, by the usage-limit policy's ceiling
        for its band at this saturation (one dispatch decision, as llm-d asks it once per
        dispatch cycle)."""
        self._band(priority)
        return saturation < self._ceilings(saturation)[self._priorities.index(priority)]

    def _ceilings(self, saturation: float) -> list[float]:
        """The policy's ceiling per active band (highest priority first); an entry it leaves
        out is 1.0 (no gating), as llm-d pre-fills its buffer."""
        assert self.usage_limit is not None
        n = len(self._priorities)
        ceilings = list(self.usage_limit.compute_limit(saturation, tuple(self._priorities)))[:n]
        return ceilings + [1.0] * (n - len(ceilings))

    def _next(self) -> tuple[Band, Queued] | None:
        # per candidate set: its saturation, and the ceilings of the bands at it
        judged: dict[tuple[int, ...], tuple[float, list[float] | None]] = {}
        for rank, band in enumerate(self._order):
            ready: list[FlowHead] = []
            heads: list[Queued] = []
            for fid, head, length in band.heads():
                if head.waiter.done():  # its client left: drop it now
                    self._unqueue(band, head)
                    return self._next()
                key = tuple(id(e) for e in head.candidates)
                if key not in judged:
                    saturation = self.detector.saturation(head.candidates)
                    limits = self._ceilings(saturation) if self.usage_limit is not None else None
                    judged[key] = (saturation, limits)
                saturation, limits = judged[key]
                if saturation < (limits[rank] if limits is not None else 1.0):
                    request = head.request
                    ready.append(
                        FlowHead(
                            fid, head.key[0], request.fairness_id, head.arrival, length, request
                        )
                    )
                    heads.append(head)
            if ready:
                i = band.fairness.pick_flow(ready, band.last_flow)
                band.last_flow = ready[i].flow
                return band, heads[i]
        return None

    # -- bookkeeping -------------------------------------------------------------------

    def _band(self, priority: int) -> Band:
        band = self._bands.get(priority)
        if band is None:
            cfg = self.config.band(priority) if self.config else PriorityBandConfig()
            fairness, ordering = self._policies(cfg)
            band = Band(cfg, fairness, ordering)
            self._bands[priority] = band
            self._order = sorted(self._bands.values(), key=lambda b: -b.priority)
            self._priorities = [b.priority for b in self._order]
        return band

    def _labels(self, ireq: InferenceRequest) -> tuple[str, str, str]:
        fid = ireq.fairness_id
        if fid not in self._flow_labels:
            if len(self._flow_labels) >= MAX_FLOW_LABELS:
                fid = "other"
            else:
                self._flow_labels.add(fid)
        return fid, str(ireq.priority), self.metrics.pool_name

    def _unqueue(self, band: Band, item: Queued) -> None:
        band.remove(item)
        self._count(item, -1)

    def _count(self, item: Queued, sign: int) -> None:
        self.queued += sign
        self.queued_bytes += sign * item.size
        labels = self._labels(item.request)
        self.metrics.queue_size.labels(*labels).inc(sign)
        self.metrics.queue_bytes.labels(*labels).inc(sign * item.size)
