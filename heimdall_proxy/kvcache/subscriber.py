"""Following the pods' KV-event publishers over ZMQ.

Two ways in, as in llm-d's kv-cache indexer:

- per pod (`discoverPods`, the default): the gateway connects to each pod's publisher, the
  endpoint's `kvEvents` address or `tcp://<pod host>:<socketPort>`; pods are followed as
  they join and leave the pool (a departed pod's blocks are forgotten). All of them are
  connected to ONE shared SUB socket (`shared_socket`), so following N pods costs one
  socket, N TCP connections and a constant (the context's threads, a replay DEALER while a
  gap is repaired), not a socket and its descriptors per pod; 1,024 pods fit in the
  descriptors of a default soft limit's worth of pods plus a few. A message on the shared
  socket says nothing of its connection, so the pod is named by its topic,
  `kv@<pod>@<model>` (kvcache.topics: the pod's name, publisher or serving `host:port`, or a
  host no other followed pod has; llm-d names pods in the topic the same way); a topic that
  names no followed pod (or several) is counted (`unattributed_batches`), warned about once,
  and dropped. With `shared_socket` off (the conductor, whose publishers' topics are free)
  each pod has a SUB socket of its own and its messages are its own whatever the topic;
- one bound SUB socket (`zmqEndpoint`) that publishers connect to; the pod is named by the
  topic, `kv@<pod>@<model>` (matched to an endpoint by name, host or host:port).

Every message is (topic, 8-byte big-endian sequence number, msgpack batch). A jump in the
sequence is a gap: the missed batches are asked for on the pod's replay socket (a vLLM ROUTER
on the publisher's port + `replayPortOffset`: send the 8-byte start sequence, receive
(seq, payload) frames ending with seq -1) and applied in order before the batch that revealed
the gap; a pod without a replay socket (no answer within the replay timeout) is not asked
again for a while, and the gap is logged and counted. A sequence that goes backwards means
the publisher restarted: the pod's blocks are forgotten (a restarted vLLM has an empty cache).
A subscription that fails (an address ZMQ refuses, no socket left) is tried again after a
wait that doubles with each failure (`retry_interval` up to `retry_max`, kvcache.backoff): the
first failure of a run is logged as a warning, and the one whose wait reaches the cap; the
repeats at debug; the recovery (the first message received) once at info. A run is per
address, and a failure long after the last one starts a new run.
With `duplicate_window` > 0, a sequence number at most that far behind (and not 0, where a
publisher starts over) is a duplicate instead, dropped and counted.

Batches are applied by `concurrency` workers; a pod always goes to the same worker, so its
events are applied in order. A worker takes everything queued (up to DRAIN_MAX batches),
has it decoded in one `prepare` call (kvcache.prepare: in worker processes, with the tokens
hashed), then applies it in order. It flushes the index (`flush`) when its queue runs dry or
every FLUSH_EVERY batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from heimdall_proxy.framework.handle import EndpointSource
from heimdall_proxy.framework.types import Endpoint
from heimdall_proxy.kvcache.backoff import Backoff
from heimdall_proxy.kvcache.events import EventBatch, decode_payloads
from heimdall_proxy.kvcache.index import KVCacheStats
from heimdall_proxy.kvcache.topics import TopicRoutes

log = logging.getLogger(__name__)

Apply = Callable[[str, EventBatch], Awaitable[None]]
#: Payloads -> their batches in order (an undecodable one as its error message); the
#: iterable may decode lazily, as it is read.
Prepare = Callable[[list[bytes]], Awaitable[Iterable[EventBatch | str]]]
#: The same, told which pod sent each payload (a preparer whose work depends on the pod,
#: such as the conductor's, whose publishers have block sizes of their own).
PrepareFor = Callable[[list[str], list[bytes]], Awaitable[Iterable[EventBatch | str]]]
Forget = Callable[[str], Awaitable[None]]
Flush = Callable[[], Awaitable[None]]
#: (pod, publisher endpoint) -> the pod's replay ROUTER address, or None when it has none.
ReplayAddress = Callable[[str, str], str | None]

END_SEQ = -1
#: How long a pod whose replay socket did not answer is not asked again.
REPLAY_BACKOFF = 30.0
#: A worker flushes the index's queued writes when it has nothing left to apply, or after
#: this many batches (a remote index then gets one round trip per burst, not per batch).
FLUSH_EVERY = 64
#: Batches a worker takes from its queue at most, to prepare them in one call.
DRAIN_MAX = 256
#: Seconds a worker applies batches before it lets the event loop run its other work once:
#: up to DRAIN_MAX batches decoded and applied in one go held the loop for ~16 ms (the
#: gateway's requests and the conductor's queries waited behind them).
APPLY_SLICE = 0.0005
#: Seconds stop() waits for its cancelled tasks before it gives up on them (and says so).
STOP_TIMEOUT = 5.0


#: Sockets one subscriber's ZMQ context may open: one SUB per pod (without the shared
#: socket), a replay DEALER while a gap is repaired, the bound socket.
MAX_SOCKETS = 1 << 16
#: Start-up catch-ups (a replay DEALER and its TCP connection each) run at once at most: a
#: thousand pods joining together would otherwise open a thousand sockets for a moment. A
#: pod without a replay socket holds its slot for `replay_timeout`, so a fleet of 1,024
#: such pods takes 16 of them to catch up (its messages held meanwhile; catch_up_wait
#: bounds how long start-up waits): set replayPortOffset 0 for pods without one.
CATCH_UP_AT_ONCE = 64
#: Descriptors a subscriber holds besides its pods' TCP connections and its replay DEALERs:
#: libzmq's context (reaper and I/O thread: an epoll and a mailbox each, the context's own
#: mailbox) and the shared socket's mailbox, with room to spare.
FD_CONSTANT = 16


def fd_budget(pods: int, catching_up: bool = True) -> int:
    """The most descriptors a subscriber with the shared socket holds for `pods` pods: one
    TCP connection each, a constant, and while catch-ups (or a gap replay) run, a replay
    DEALER and its connection per replay at once, and room for as many again, and half
    that, of finished ones: libzmq's reaper closes their descriptors a little after the next
    replays have opened theirs, later on a loaded machine (bench/kv_fds.py, 1,024 pods:
    N + 6 followed; at the peak of the catch-ups, N + 146 to N + 210 at load 4-5, budget
    N + 336). Without the shared
    socket a pod costs two (its SUB socket's mailbox and its connection), so 1,024 pods
    alone passed a soft limit of 1,024; with it, the CLI still raises the soft limit to the
    hard one at start-up (a thousand pods and the process's own descriptors pass 1,024)."""
    return pods + FD_CONSTANT + (5 * CATCH_UP_AT_ONCE if catching_up else 5)


@dataclass(slots=True)
class SubscriberOptions:
    topic_filter: str = "kv@"
    concurrency: int = 4
    discover_pods: bool = True
    socket_port: int = 5557
    zmq_endpoint: str = ""
    replay_port_offset: int = 1
    replay_timeout: float = 1.0
    reconcile_interval: float = 1.0
    queue_size: int = 10_000
    #: Sequence numbers at most this far behind the expected one (and not 0) are duplicates,
    #: dropped; further back, or 0, a restart. 0: every step back is a restart.
    duplicate_window: int = 0
    #: Replay what each pod still buffers when its subscription starts (`_catch_up`), and
    #: how long `start` waits for the first catch-ups.
    catch_up: bool = False
    catch_up_wait: float = 5.0
    #: The wait after a pod's subscription first fails, doubled after each further failure
    #: up to `retry_max` (seconds).
    retry_interval: float = 1.0
    retry_max: float = 60.0
    #: Connect every pod to one SUB socket, naming the pod by its topic (kvcache.topics);
    #: off: a SUB socket per pod, whose messages are the pod's whatever their topic.
    shared_socket: bool = True


async def decode_inline(payloads: list[bytes]) -> Iterable[EventBatch | str]:
    """The default Prepare: decode on the event loop, each batch as it is applied."""
    return decode_payloads(payloads)


def replay_endpoint(endpoint: str, offset: int) -> str | None:
    """The replay ROUTER of a `tcp://host:port` publisher (port + offset), None otherwise."""
    if not offset or not endpoint.startswith("tcp://"):
        return None
    parts = urlsplit(endpoint)
    if parts.port is None:
        return None
    host = endpoint[len("tcp://") : endpoint.rfind(":")]
    return f"tcp://{host}:{parts.port + offset}"


class KVEventsSubscriber:
    """Keeps one subscription per pod (and optionally one bound socket) and feeds decoded
    batches to `apply(pod, batch)`; `forget(pod)` drops a pod's blocks."""

    def __init__(
        self,
        options: SubscriberOptions,
        pool: EndpointSource,
        apply: Apply,
        forget: Forget,
        stats: KVCacheStats | None = None,
        flush: Flush | None = None,
        prepare: Prepare | None = None,
        replay_address: ReplayAddress | None = None,
        prepare_for: PrepareFor | None = None,
    ) -> None:
        self.options = options
        self._replay_address = replay_address or self._replay_by_offset
        self.pool = pool
        self._apply = apply
        self._forget = forget
        self._flush = flush
        self._prepare = prepare or decode_inline
        self._prepare_for = prepare_for
        self.stats = stats or KVCacheStats()
        self._ctx: zmq.asyncio.Context | None = None
        self._subs: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._queues: list[asyncio.Queue[tuple[str, bytes | None]]] = []
        self._replay_down: dict[str, float] = {}
        #: Messages received per pod (tests wait for a subscription to be live with it).
        self.received: dict[str, int] = {}
        self.bound_endpoint: str | None = None
        #: Set per pod once its start-up catch-up is over (done, or no replay socket).
        self._caught_up: dict[str, asyncio.Event] = {}
        #: Pods whose subscription is failing: their run of failures at one address (a new
        #: address starts its own), ended by a message received, dropped when the pod
        #: leaves.
        self._failing: dict[str, Backoff] = {}
        #: Pods already warned about for sending malformed events.
        self._malformed: set[str] = set()
        #: The shared SUB socket and what it knows of each pod connected to it: the topics
        #: naming them, the next sequence number expected, the messages held while the
        #: pod's catch-up runs, the sequence below which messages repeat the catch-up.
        self._shared: zmq.asyncio.Socket | None = None
        self._routes = TopicRoutes()
        self._attached: dict[str, str] = {}
        self._expected: dict[str, int] = {}
        self._holding: dict[str, list[list[bytes]]] = {}
        self._floor: dict[str, int] = {}
        #: Topics already warned about for naming no followed pod.
        self._unnamed: set[bytes] = set()
        #: Replays (catch-ups and gap repairs) running on the shared socket's pods at once.
        self._replays = asyncio.Semaphore(CATCH_UP_AT_ONCE)
        #: Gap repairs under way: each holds its pod's messages until its replay is applied.
        self._repairs: set[asyncio.Task[None]] = set()

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._ctx is not None:
            return
        self._ctx = zmq.asyncio.Context()
        # libzmq's default (1,023 sockets per context) would fail the subscription of every
        # pod past about the thousandth ("Too many open files"); the slots cost 8 bytes each.
        self._ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
        n = max(1, self.options.concurrency)
        self._queues = [asyncio.Queue(self.options.queue_size) for _ in range(n)]
        self._tasks = [
            asyncio.create_task(self._worker(q), name=f"kv-events-worker-{i}")
            for i, q in enumerate(self._queues)
        ]
        if self.options.zmq_endpoint:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(self.options.zmq_endpoint)
            self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            sock.setsockopt(zmq.SUBSCRIBE, self.options.topic_filter.encode())
            self._tasks.append(asyncio.create_task(self._bound(sock), name="kv-events-bound"))
        if self.options.discover_pods:
            if self.options.shared_socket:
                sock = self._shared = self._ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.RCVHWM, 100_000)
                sock.setsockopt(zmq.SUBSCRIBE, self.options.topic_filter.encode())
                self._tasks.append(asyncio.create_task(self._shared_reader(sock),
                                                       name="kv-events-shared"))  # fmt: skip
            self.reconcile()
            self._tasks.append(asyncio.create_task(self._reconcile_loop(), name="kv-events-pods"))
            await self._first_catch_up()

    async def _first_catch_up(self) -> None:
        """Wait (at most `catch_up_wait`) until every pod's buffered batches are replayed and
        applied, so a gateway that (re)starts routes its first requests with them."""
        if not self._caught_up or not self.options.catch_up:
            return
        waits = [e.wait() for e in self._caught_up.values()]
        try:
            async with asyncio.timeout(self.options.catch_up_wait):
                await asyncio.gather(*waits)
                await self.drain()
        except TimeoutError:
            log.warning("KV events: start-up catch-up not complete after %.1fs, serving anyway",
                        self.options.catch_up_wait)  # fmt: skip

    async def stop(self) -> None:
        tasks = [t for _, t in self._subs.values()] + self._tasks + list(self._repairs)
        self._subs.clear()
        self._failing.clear()
        self._malformed.clear()
        self._unnamed.clear()
        self._tasks = []
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=STOP_TIMEOUT)
            for task in stuck:
                log.warning("KV events task %s did not stop within %.0fs", task, STOP_TIMEOUT)
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: it was logged where it happened
        if self._shared is not None:
            self._shared.close(linger=0)
            self._shared = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    # ---- pods ----------------------------------------------------------------------------

    def endpoint_of(self, endpoint: Endpoint) -> str:
        if endpoint.kv_events:
            return endpoint.kv_events
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        return f"tcp://{host}:{self.options.socket_port}"

    def _replay_by_offset(self, pod: str, endpoint: str) -> str | None:
        return replay_endpoint(endpoint, self.options.replay_port_offset)

    def subscriptions(self) -> dict[str, str]:
        """pod -> publisher endpoint followed."""
        return {pod: ep for pod, (ep, _) in self._subs.items()}

    def reconcile(self) -> None:
        """Subscribe to new pods, drop departed ones, follow changed addresses."""
        pods = {e.name: e for e in self.pool.endpoints()}
        wanted = {name: self.endpoint_of(e) for name, e in pods.items()}
        for pod, (endpoint, task) in list(self._subs.items()):
            if wanted.get(pod) != endpoint:
                task.cancel()
                del self._subs[pod]
                self._caught_up.pop(pod, None)
                if pod not in wanted:
                    self._failing.pop(pod, None)
                    self._malformed.discard(pod)
                self._enqueue_nowait(pod, None)
                log.info("stopped following KV events of %s at %s", pod, endpoint)
        for pod, endpoint in wanted.items():
            current = self._subs.get(pod)
            if current is None or current[1].done():  # new, or its subscription failed
                self._caught_up[pod] = asyncio.Event()
                follow = self._follow(pod, endpoint, pods[pod])
                task = asyncio.create_task(follow, name=f"kv-events-{pod}")
                self._subs[pod] = (endpoint, task)
                log.info("following KV events of %s at %s", pod, endpoint)

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.reconcile_interval)
            self.reconcile()

    def _pod_of_topic(self, topic: bytes) -> str:
        parts = topic.decode("utf-8", "replace").split("@")
        ident = parts[1] if len(parts) >= 2 else parts[0]
        for e in self.pool.endpoints():
            if ident in (e.name, e.host, e.hostport):
                return e.name
        return ident

    # ---- receiving -----------------------------------------------------------------------

    async def _follow(self, pod: str, endpoint: str, where: Endpoint) -> None:
        """Follow `pod`'s publisher at `endpoint` until cancelled, trying a failed
        subscription again after its backoff."""
        while self._ctx is not None:  # None: stopped (a task that outlived stop() ends)
            try:
                if self._shared is not None:
                    await self._attachment(pod, endpoint, where)
                else:
                    await self._subscription(pod, endpoint)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await asyncio.sleep(self._failed(pod, endpoint, exc))

    def _failed(self, pod: str, endpoint: str, exc: Exception) -> float:
        """Count a failure of `pod`'s subscription and log it (a run's first as a warning,
        with its traceback unless ZMQ refused, and the one that reaches the cap; the others
        at debug); returns the wait before the next attempt."""
        run = self._failing.get(pod)
        if run is None or run.target != endpoint:  # a new address starts a run of its own
            opts = self.options
            run = self._failing[pod] = Backoff(opts.retry_interval, opts.retry_max, endpoint)
        wait = run.failed(time.monotonic())
        if run.failures == 1:
            log.warning(
                "KV events subscription of %s at %s failed: %s; retrying in %.3gs",
                pod, endpoint, exc, wait, exc_info=None if isinstance(exc, zmq.ZMQError) else exc,
            )  # fmt: skip
        elif run.capped_now:
            log.warning(
                "KV events subscription of %s at %s still failing after %d attempts: %s; "
                "retrying every %.3gs", pod, endpoint, run.failures, exc, wait,
            )  # fmt: skip
        else:
            log.debug(
                "KV events subscription of %s at %s failed again (%d times): %s; "
                "retrying in %.3gs", pod, endpoint, run.failures, exc, wait,
            )  # fmt: skip
        return wait

    async def _subscription(self, pod: str, endpoint: str) -> None:
        """One SUB socket on `endpoint`, read until cancelled or failed (raises)."""
        assert self._ctx is not None
        sock: zmq.asyncio.Socket | None = None
        try:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.connect(endpoint)
            sock.setsockopt(zmq.SUBSCRIBE, self.options.topic_filter.encode())
            # subscribed first, so nothing published during the catch-up is lost
            expected = await self._catch_up(pod, endpoint) if self.options.catch_up else None
            self._caught_up.setdefault(pod, asyncio.Event()).set()
            floor = expected
            recovered = pod not in self._failing
            while True:
                frames = await sock.recv_multipart()
                if not recovered:  # a run of failures ends with a message, not a connect
                    recovered = True
                    self._recovered(pod, endpoint)
                if floor is not None and len(frames) == 3 and len(frames[1]) == 8:
                    seq = int.from_bytes(frames[1], "big")
                    if 0 < seq < floor:
                        continue  # the catch-up's replay already had it
                    floor = None
                expected = await self._received(pod, endpoint, frames, expected)
        finally:
            if sock is not None:
                sock.close(linger=0)

    def _recovered(self, pod: str, endpoint: str) -> None:
        """End `pod`'s run of failures, if any, with its first message (logged once)."""
        run = self._failing.pop(pod, None)
        if run is not None and run.target == endpoint:
            log.info("KV events subscription of %s at %s recovered after %d failure(s)",
                     pod, endpoint, run.failures)  # fmt: skip
        elif run is not None:
            log.info("KV events subscription of %s at %s receives (%d failure(s) at its "
                     "former address %s)", pod, endpoint, run.failures, run.target)  # fmt: skip

    async def _attachment(self, pod: str, endpoint: str, where: Endpoint) -> None:
        """`pod`'s publisher connected to the shared socket until cancelled (then
        disconnected); raises when ZMQ refuses the address. Messages the pod sends while its
        catch-up runs are held, and handled after the replayed batches."""
        sock = self._shared
        assert sock is not None
        sock.connect(endpoint)
        self._attached[pod] = endpoint
        self._routes.add(pod, where.host, where.hostport, endpoint)
        try:
            if self.options.catch_up:
                self._holding[pod] = []
                async with self._replays:  # a held message's gap replays inside it too
                    caught = await self._catch_up(pod, endpoint)
                    if caught is not None:
                        self._floor[pod] = self._expected[pod] = caught
                    await self._release(pod, endpoint, self._holding[pod])
            self._caught_up.setdefault(pod, asyncio.Event()).set()
            await asyncio.Future()  # connected until cancelled
        finally:
            if self._attached.get(pod) == endpoint:  # not yet the pod's next attachment's
                self._routes.remove(pod)
                del self._attached[pod]
                self._expected.pop(pod, None)
                self._floor.pop(pod, None)
                self._holding.pop(pod, None)
            if self._shared is sock:  # not closed by stop() meanwhile
                with contextlib.suppress(zmq.ZMQError):
                    sock.disconnect(endpoint)

    async def _shared_reader(self, sock: zmq.asyncio.Socket) -> None:
        """Read the shared socket: each message goes to the pod its topic names."""
        while True:
            frames = await sock.recv_multipart()
            pod = self._routes.pod_of(frames[0]) if frames else None
            endpoint = self._attached.get(pod) if pod is not None else None
            if pod is None or endpoint is None:
                self._unattributed(frames[0] if frames else b"")
                continue
            held = self._holding.get(pod)
            if held is not None:
                held.append(frames)
            elif self._gap_ahead(pod, frames):
                # replayed aside, so one pod's replay does not stall every other pod's events
                held = self._holding[pod] = [frames]
                repair = asyncio.create_task(
                    self._repair(pod, endpoint, held), name=f"kv-gap-{pod}"
                )
                self._repairs.add(repair)
                repair.add_done_callback(self._repairs.discard)
            else:
                await self._on_shared(pod, endpoint, frames)

    def _gap_ahead(self, pod: str, frames: list[bytes]) -> bool:
        expected = self._expected.get(pod)
        return (
            expected is not None
            and len(frames) == 3
            and len(frames[1]) == 8
            and int.from_bytes(frames[1], "big") > expected
            and pod not in self._floor
        )

    async def _repair(self, pod: str, endpoint: str, held: list[list[bytes]]) -> None:
        """Handle `pod`'s held messages, the first of which revealed a gap (its replay runs
        in one of the replay slots), then let its messages through again."""
        async with self._replays:
            await self._release(pod, endpoint, held)

    async def _release(self, pod: str, endpoint: str, held: list[list[bytes]]) -> None:
        """Handle `pod`'s held messages in order, then stop holding them."""
        try:
            while held:  # the reader adds to it while a message is handled
                await self._on_shared(pod, endpoint, held.pop(0))
        finally:
            if self._holding.get(pod) is held:
                del self._holding[pod]

    async def _on_shared(self, pod: str, endpoint: str, frames: list[bytes]) -> None:
        """One message of `pod` from the shared socket: recovery, catch-up floor, sequence."""
        if pod in self._failing:
            self._recovered(pod, endpoint)
        floor = self._floor.get(pod)
        if floor is not None and len(frames) == 3 and len(frames[1]) == 8:
            seq = int.from_bytes(frames[1], "big")
            if 0 < seq < floor:
                return  # the catch-up's replay already had it
            del self._floor[pod]
        nxt = await self._received(pod, endpoint, frames, self._expected.get(pod))
        if nxt is not None and pod in self._attached:  # not departed while it was handled
            self._expected[pod] = nxt

    def _unattributed(self, topic: bytes) -> None:
        self.stats.unattributed_batches += 1
        if topic not in self._unnamed and len(self._unnamed) < 1024:
            self._unnamed.add(topic)
            log.warning(
                "KV events with topic %r name no followed pod (or several): dropped; name the "
                "pod in the topic, kv@<pod name, IP or host:port>@<model>, as llm-d does",
                topic.decode("utf-8", "replace"),
            )

    async def _catch_up(self, pod: str, endpoint: str) -> int | None:
        """Ask the pod's replay socket for every batch it still buffers and apply them: what
        the pod cached before this gateway (re)started. Returns the next sequence number
        expected, or None when the pod has no replay socket or nothing buffered."""
        replayed = await self._replay(pod, endpoint, 0, 1 << 62)
        if not replayed:
            return None
        for _, payload in replayed:
            await self._enqueue(pod, payload)
        self.stats.replayed_batches += len(replayed)
        log.info("KV events of %s: caught up %d buffered batch(es)", pod, len(replayed))
        return replayed[-1][0] + 1

    async def _bound(self, sock: zmq.asyncio.Socket) -> None:
        expected: dict[str, int] = {}
        try:
            while True:
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    self.stats.decode_errors += 1
                    continue
                pod = self._pod_of_topic(frames[0])
                nxt = await self._received(pod, None, frames, expected.get(pod))
                if nxt is not None:
                    expected[pod] = nxt
        finally:
            sock.close(linger=0)

    async def _received(
        self, pod: str, endpoint: str | None, frames: list[bytes], expected: int | None
    ) -> int | None:
        """Handle one message; returns the next expected sequence number."""
        if len(frames) != 3 or len(frames[1]) != 8:
            self.stats.decode_errors += 1
            return expected
        _, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big")
        self.received[pod] = self.received.get(pod, 0) + 1
        if expected is not None:
            if seq > expected:
                await self._gap(pod, endpoint, expected, seq)
            elif seq < expected and seq > 0 and expected - seq <= self.options.duplicate_window:
                self.stats.duplicate_batches += 1
                return expected
            elif seq < expected:
                self.stats.publisher_restarts += 1
                log.warning(
                    "KV events of %s restarted at seq %d (expected %d): forgetting its blocks",
                    pod,
                    seq,
                    expected,
                )
                await self._enqueue(pod, None)
        await self._enqueue(pod, payload)
        return seq + 1

    async def _gap(self, pod: str, endpoint: str | None, start: int, end: int) -> None:
        self.stats.gaps += 1
        replayed = await self._replay(pod, endpoint, start, end) if endpoint else None
        if replayed is not None:
            got = {seq for seq, _ in replayed}
            for _, payload in replayed:
                await self._enqueue(pod, payload)
            self.stats.replayed_batches += len(replayed)
            missing = (end - start) - len(got)
        else:
            missing = end - start
        if missing:
            self.stats.missed_batches += missing
            log.warning(
                "KV events of %s: missed %d batch(es) between seq %d and %d%s",
                pod,
                missing,
                start,
                end - 1,
                "" if replayed is not None else " (no replay)",
            )

    async def _replay(
        self, pod: str, endpoint: str, start: int, end: int
    ) -> list[tuple[int, bytes]] | None:
        """Batches [start, end) from the pod's replay socket, or None when it has none."""
        address = self._replay_address(pod, endpoint)
        now = time.monotonic()
        if address is None or self._replay_down.get(address, 0.0) > now or self._ctx is None:
            return None
        try:
            sock = self._ctx.socket(zmq.DEALER)
        except zmq.ZMQError as exc:  # no socket left: as if it had none, not a failed SUB
            log.warning("KV events replay of %s: no socket for %s: %s", pod, address, exc)
            return None
        sock.setsockopt(zmq.LINGER, 0)
        timeout_ms = int(self.options.replay_timeout * 1000)
        out: list[tuple[int, bytes]] = []
        try:
            try:
                sock.connect(address)
            except zmq.ZMQError as exc:  # an address ZMQ refuses: the pod has no replay
                self._replay_down[address] = time.monotonic() + REPLAY_BACKOFF
                log.warning("KV events replay address %s of %s refused: %s", address, pod, exc)
                return None
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await sock.poll(timeout=timeout_ms):
                    self._replay_down[address] = time.monotonic() + REPLAY_BACKOFF
                    log.warning("KV events replay socket %s did not answer", address)
                    return out or None
                frames = await sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) != 2 or len(frames[0]) != 8:
                    continue
                seq = int.from_bytes(frames[0], "big", signed=True)
                if seq == END_SEQ:
                    return out
                if start <= seq < end:
                    out.append((seq, frames[1]))
                if seq >= end - 1:
                    return out  # the rest of the replay repeats what the SUB socket got
        finally:
            sock.close(linger=0)

    # ---- applying ------------------------------------------------------------------------

    def _queue_of(self, pod: str) -> asyncio.Queue[tuple[str, bytes | None]]:
        return self._queues[zlib.crc32(pod.encode()) % len(self._queues)]

    async def feed(self, pod: str, payload: bytes) -> None:
        """Apply a batch received some other way as if `pod`'s publisher had sent it (its
        sequence number is not checked): replay tools, benchmarks, tests."""
        await self._enqueue(pod, payload)

    async def _enqueue(self, pod: str, payload: bytes | None) -> None:
        if self._queues:
            queue = self._queue_of(pod)
            try:
                queue.put_nowait((pod, payload))  # checks for room itself: once per batch
            except asyncio.QueueFull:
                await queue.put((pod, payload))  # back-pressure: wait for the workers

    def _enqueue_nowait(self, pod: str, payload: bytes | None) -> None:
        if self._queues:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue_of(pod).put_nowait((pod, payload))

    async def _worker(self, queue: asyncio.Queue[tuple[str, bytes | None]]) -> None:
        unflushed = 0
        me = asyncio.current_task()
        while True:
            if me is not None and me.cancelling():
                # A library on the apply path (the index's client) can absorb the
                # cancellation that stop() sent; waiting for the next batch would then keep
                # the gateway from ever shutting down.
                raise asyncio.CancelledError
            items = [await queue.get()]
            while len(items) < DRAIN_MAX and not queue.empty():
                items.append(queue.get_nowait())
            try:
                unflushed = await self._process(items, unflushed, queue)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("applying KV events failed")
            finally:
                for _ in items:
                    queue.task_done()

    async def _process(
        self,
        items: list[tuple[str, bytes | None]],
        unflushed: int,
        queue: asyncio.Queue[tuple[str, bytes | None]],
    ) -> int:
        """Prepare the payloads of `items` in one call, then apply them (and forget pods) in
        order; returns the batches applied since the last flush."""
        payloads = [payload for _, payload in items if payload is not None]
        if self._prepare_for is not None:
            pods = [pod for pod, payload in items if payload is not None]
            prepared = iter(await self._prepare_for(pods, payloads))
        else:
            prepared = iter(await self._prepare(payloads))
        perf_counter = time.perf_counter
        slice_end = perf_counter() + APPLY_SLICE
        for pod, payload in items:
            if perf_counter() > slice_end:
                await asyncio.sleep(0)  # requests and queries waiting on the loop go first
                slice_end = perf_counter() + APPLY_SLICE
            try:
                if payload is None:
                    await self._forget(pod)
                    continue
                batch = next(prepared)
                if isinstance(batch, str):
                    self.stats.decode_errors += 1
                    log.warning("undecodable KV event batch from %s: %s", pod, batch)
                    continue
                self.stats.batches += 1
                self.stats.unknown_events += batch.unknown
                if batch.invalid:
                    self.stats.invalid_events += batch.invalid
                    if pod not in self._malformed:  # once per pod: the reasons log at debug
                        self._malformed.add(pod)
                        log.warning("KV events of %s: %d malformed event(s) skipped (the "
                                    "reasons are logged at debug)", pod, batch.invalid)  # fmt: skip
                await self._apply(pod, batch)
                unflushed += 1
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("applying KV events of %s failed", pod)
            if self._flush is not None and unflushed >= FLUSH_EVERY:
                unflushed = 0
                await self._flush()
        if self._flush is not None and unflushed and queue.empty():
            unflushed = 0
            await self._flush()
        return unflushed

    async def drain(self) -> None:
        """Wait until every batch received so far is applied (tests, shutdown)."""
        for q in self._queues:
            await q.join()
