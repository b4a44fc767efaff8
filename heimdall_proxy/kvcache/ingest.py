"""KVEventIngest: the one owner of an index's KV-event feed.

It subscribes to every pod's vLLM KV-event publisher (kvcache.subscriber: ZMQ, gap replay,
publisher restarts, departed pods), decodes and hashes the batches in worker processes
(kvcache.prepare) and applies them to its index, flushing a remote index once per batch.
An index that cannot be reached at start-up (Redis down) is retried in the background; the
feed starts once it answers, and `ready` says whether lookups can be trusted meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from heimdall_proxy.framework.handle import EndpointSource
from heimdall_proxy.kvcache.events import EventBatch
from heimdall_proxy.kvcache.index import KVBlockIndex
from heimdall_proxy.kvcache.prepare import EventPreparer, apply_batch
from heimdall_proxy.kvcache.subscriber import KVEventsSubscriber, SubscriberOptions

log = logging.getLogger(__name__)

#: How often an unreachable index is tried again.
RECONNECT_INTERVAL = 2.0


class KVEventIngest:
    def __init__(
        self,
        index: KVBlockIndex,
        pods: EndpointSource,
        options: SubscriberOptions,
        model_name: str,
        decode_processes: int = 0,
        name: str = "kv-events",
    ) -> None:
        self.index = index
        self.model_name = model_name
        self.name = name
        self.stats = index.stats
        self.preparer = EventPreparer(index.block_size, model_name, decode_processes)
        self.subscriber = KVEventsSubscriber(
            options,
            pods,
            self.apply,
            index.cleared,
            index.stats,
            index.flush,
            self.preparer.prepare,
        )
        self.ready = False
        self._connect_task: asyncio.Task[None] | None = None

    async def apply(self, pod: str, batch: EventBatch) -> None:
        """Apply one decoded batch of `pod`'s events to the index (a remote index queues the
        writes: the subscriber flushes them after each batch)."""
        await apply_batch(self.index, pod, batch, self.model_name)

    async def start(self) -> None:
        """Open the index and follow the pods' events. Never fails on an unreachable index:
        routing goes on without it (`ready` stays False) until it answers."""
        try:
            await self.index.start()
        except ConnectionError as exc:
            log.error("%s: %s; retrying in the background", self.name, exc)
            self._connect_task = asyncio.create_task(self._connect(), name=f"{self.name}-index")
        else:
            await self._follow()

    async def _follow(self) -> None:
        self.preparer.start()
        await self.subscriber.start()
        self.ready = True

    async def _connect(self) -> None:
        while True:
            await asyncio.sleep(RECONNECT_INTERVAL)
            try:
                await self.index.start()
            except ConnectionError:
                continue
            log.info("%s: index reachable, following KV events", self.name)
            await self._follow()
            return

    async def stop(self) -> None:
        if self._connect_task is not None:
            self._connect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connect_task
            self._connect_task = None
        self.ready = False
        await self.subscriber.stop()
        await self.preparer.close()
        await self.index.close()
