"""Plugin contracts, one Protocol per extension point.

A plugin is any object with `type` and `name` attributes; the extension points it serves are
found by Protocol membership (the methods it has), so one class can be a Filter and a Scorer,
or a Scorer and a response hook. Filters, scorers, pickers and profile handlers are
synchronous and pure CPU. Anything that needs I/O runs before scheduling as a Producer or a
PrepareData plugin and leaves its result on the CycleState or the request. Request-control
hooks are all async.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from heimdall_proxy.framework.flowcontrol import (
    FairnessPolicy,
    OrderingPolicy,
    SaturationDetector,
    UsageLimitPolicy,
)
from heimdall_proxy.framework.inflight import LoadEstimator
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    RequestContext,
    SchedulingResult,
    ScoredEndpoint,
    Usage,
)

if TYPE_CHECKING:
    import aiohttp
    from prometheus_client import Metric


@runtime_checkable
class Plugin(Protocol):
    """Every plugin: `type` is the registered type name, `name` the instance name."""

    type: str
    name: str


@runtime_checkable
class Parser(Protocol):
    """Reads one API's requests and answers (llm-d's RequestParsing and ResponseParsing).
    `claims` are the path suffixes it serves ("chat/completions"); a parser that claims none
    is the fallback for any path the others do not. The request path resolves to the parser
    with the longest claimed suffix (requesthandling/parsers.py)."""

    claims: tuple[str, ...]
    #: What a claim is served under as a route of this gateway: "/v1/" for the OpenAI and
    #: Anthropic APIs, "/" for the engines' own routes (/inference/v1/generate, /generate).
    route_prefix: str

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
        """The request, parsed; raises RequestError (400) for a body it cannot route."""
        ...

    def body_usage(self, body: bytes) -> Usage | None: ...

    def chunk_usage(self, chunk: bytes) -> Usage | None: ...


@runtime_checkable
class Filter(Protocol):
    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        """Return the subset of `endpoints` that may serve the request, order preserved.
        An empty list ends the profile without a result."""
        ...


@runtime_checkable
class Scorer(Protocol):
    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        """Score every endpoint by name in [0, 1], higher is better. Missing names score 0;
        values outside [0, 1] are clamped by the scheduler. A scorer under which most pods
        score the same may return `DefaultScores(endpoints, default, changed)` (the
        `endpoints` it was given): the scheduler then touches only the pods in `changed`."""
        ...


@runtime_checkable
class Picker(Protocol):
    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        """Choose the target endpoint(s) among the scored candidates (never empty). From the
        scheduler `scored` is a `ScoredEndpoints`, whose `endpoints` and `totals` lists
        (`split_scored`) spare a picker one object per pod. The ProfileResult may carry its
        fallback ranking as a function (`rank=`), made only when read."""
        ...


class SchedulerProfileView(Protocol):
    """What a profile handler sees of a scheduling profile."""

    name: str

    def run(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> ProfileResult | None: ...


@runtime_checkable
class ProfileHandler(Protocol):
    def validate_profiles(self, profiles: Mapping[str, SchedulerProfileView]) -> None:
        """Called once at start-up with every configured profile. Raises ValueError (shown as
        a config error) when the handler cannot work with them, e.g. a missing decode
        profile."""
        ...

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        """Name the profiles to run next, given the results so far; [] ends the cycle."""
        ...

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        """Turn the profile results into the scheduling result. Raises SchedulingError when
        the primary profile found no endpoint."""
        ...


@runtime_checkable
class Decider(Protocol):
    """A disaggregation decider (prefill or encode), consulted by disagg-profile-handler or
    pd-profile-handler after the decode profile picked its pod. Synchronous and pure CPU,
    like the profile handler that calls it."""

    def decide(self, state: CycleState, request: InferenceRequest, decode: Endpoint) -> bool:
        """True when the stage this decider guards should run for `request`, whose decode
        pod is `decode`. May read what producers left on `state` (prefix match info)."""
        ...


@runtime_checkable
class RequestHeader(Protocol):
    """Reads the request's headers once it is parsed, before admission (llm-d's
    RequestHeaderProcessor): what it sets on the request (e.g. `agent_identity`) is in place
    when flow control classifies the request. Synchronous and pure CPU."""

    def request_header(self, request: InferenceRequest) -> None: ...


@runtime_checkable
class PrepareData(Protocol):
    async def prepare_data(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        """Enrich the request before scheduling (token ids, a rewritten body, ...)."""
        ...


@runtime_checkable
class Producer(Protocol):
    async def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> None:
        """Do the I/O a scorer needs (index lookups, predictions) over all candidates and
        leave the result on `state`. Runs once per request, before the profile loop."""
        ...


@runtime_checkable
class Admitter(Protocol):
    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> str | None:
        """Decide, after the producers ran and before scheduling, whether the request may be
        served at all. Returns None to admit it, or the reason it is refused (the client
        gets a 429 with that message). Synchronous and pure CPU: it reads what producers
        left on `state`."""
        ...


@runtime_checkable
class PreRequest(Protocol):
    async def pre_request(self, ctx: RequestContext) -> None:
        """Called once per attempt after a target is chosen, before the upstream request is
        sent. May add `ctx.upstream_headers`. Every call is matched by one response_complete
        call on the same ctx attempt."""
        ...


@runtime_checkable
class ResponseReceived(Protocol):
    async def response_received(self, ctx: RequestContext) -> None:
        """Upstream response headers arrived (`ctx.status`, `ctx.upstream_response_headers`);
        may add `ctx.response_headers` before they are sent to the client."""
        ...


@runtime_checkable
class ResponseStreaming(Protocol):
    async def response_streaming(self, ctx: RequestContext, chunk: bytes) -> None:
        """Called after each chunk of a streamed response was sent to the client."""
        ...


@runtime_checkable
class ResponseComplete(Protocol):
    async def response_complete(self, ctx: RequestContext) -> None:
        """The attempt ended: response fully sent, upstream failed, or the client went away
        (`ctx.error` says which). Always called, exactly once per attempt, also when the
        client went away while the pre_request hooks ran (some of them may not have)."""
        ...


@runtime_checkable
class MetricsSource(Protocol):
    """Plugins with metrics of their own on the gateway's /metrics. Called at scrape time;
    families of the same name from several plugins are summed sample by sample."""

    def collect_metrics(self) -> Iterable[Metric]: ...


@runtime_checkable
class ChecksPeers(Protocol):
    """A plugin whose parameters name other plugins that may be declared after it: once every
    plugin is built, the loader calls `check_peers` with all of them (by name). Raising
    ValueError fails the config with the message."""

    def check_peers(self, plugins: Mapping[str, object]) -> None: ...


@runtime_checkable
class Inherits(Protocol):
    """A plugin whose learned state (an index, an in-flight ledger, a trained model, stored
    responses) is worth keeping across a config reload. The reload calls `inherit` on the new
    instance with the instance of the same name and type that it replaces, once the new one
    has started and right before it takes new requests (nothing can fail the reload after
    that), and the pods whose per-pod state is stale: gone from the pool, or back under the
    same name at another URL (a fresh server). Return None when the whole state was taken
    over, or what was not and why (that part starts empty, as on a restart). Take all or
    nothing of each part: check first, assign last, so that a raise leaves both as they were.

    The state is shared, not copied: the old instance keeps serving its requests in flight
    on the same objects, so their completions land where the new instance reads. Hence
    neither instance's `stop` may clear or close what it shares, and whatever was built at
    construction around the state (a publisher of its totals, a journal's apply) must reach
    it through the attribute, so that it follows the swap."""

    def inherit(self, previous: Any, gone: frozenset[str]) -> str | None: ...


@runtime_checkable
class Lifecycle(Protocol):
    """Plugins with background work (subscribers, refreshers)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class ResponsesStoreAPI(Protocol):
    """A store of Responses API objects that the server exposes as `GET /v1/responses/{id}`,
    `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`. The server finds
    the (at most one) plugin implementing it; the routes answer 404 when there is none.

    Every entry has an owner (InferenceRequest.caller of the request that stored it); a
    caller other than its owner is answered as if it did not exist."""

    async def get_response(self, response_id: str, owner: str) -> dict[str, Any] | None:
        """The stored response object as the model server produced it, or None when unknown
        (never stored, expired, evicted, deleted, or `owner` does not own it)."""
        ...

    async def delete_response(self, response_id: str, owner: str) -> bool:
        """Delete a stored response `owner` owns; False when there was none."""
        ...

    async def get_input_items(self, response_id: str, owner: str) -> list[dict[str, Any]] | None:
        """Every input item the model read for that response, oldest first, each an object
        with a string `id` (earlier turns of a conversation included), or None when the
        response is unknown. Raises RequestError (rendered as is) when they cannot be
        listed, e.g. an earlier turn is gone. The server pages and orders them."""
        ...


#: The kinds of data (a source's `output_type`) the data layer treats apart:
#: an OpenAI model list, polled on the model-list interval; when a source of it is wired,
#: it replaces the built-in `/v1/models` refresh.
MODEL_LIST_DATA = "openai-model-list"
#: A Prometheus page's families (datalayer/scan.py: name -> [(labels, value)]): the built-in
#: metrics scrape (metrics-data-source) or another page polled on its own interval
#: (dcgm-data-source).
PROMETHEUS_DATA = "prometheus-metrics"
#: Endpoint lifecycle events: not polled; the extractors (EndpointExtractor) are told when a
#: pod joins, changes or leaves the pool.
ENDPOINT_EVENTS = "endpoint-events"


@runtime_checkable
class DataSource(Protocol):
    """A data-layer source: fetches one kind of raw data from a pod. Wired to extractors by
    the config's `dataLayer.sources`; polled by the data layer (on the model-list interval
    for a model list, else on the source's `interval` attribute when it has one, else on
    the metrics interval)."""

    #: Names what collect() returns; an extractor is wired to it only if its `input_type`
    #: is the same.
    output_type: str

    async def collect(self, endpoint: Endpoint, session: aiohttp.ClientSession) -> object:
        """Fetch the pod's raw data over the data layer's shared session. Raises on any
        failure (the data layer logs it and keeps the pod's last published data)."""
        ...


@runtime_checkable
class DataExtractor(Protocol):
    """A data-layer extractor: turns what a source collected into fields of the Endpoint
    the scheduler reads (models, model cards, ...)."""

    #: The `output_type` of the sources this extractor understands.
    input_type: str

    def extract(self, endpoint: Endpoint, data: object) -> None:
        """Publish `data` onto `endpoint` in place. Raises ValueError on data it cannot
        read (the endpoint is then left unchanged)."""
        ...


@runtime_checkable
class EndpointExtractor(Protocol):
    """An extractor of an endpoint-notification-source: told when a pod joins or changes
    (`removed` False) or leaves the pool (`removed` True), so it can drop what it keeps
    about a departed pod at once."""

    def endpoint_changed(self, endpoint: Endpoint, removed: bool) -> None: ...


#: Extension points, as named in logs, metrics and `check-config` output.
EXTENSION_POINTS: dict[str, type] = {
    "Parser": Parser,
    "ProfileHandler": ProfileHandler,
    "Decider": Decider,
    "Filter": Filter,
    "Scorer": Scorer,
    "Picker": Picker,
    "RequestHeader": RequestHeader,
    "PrepareData": PrepareData,
    "Producer": Producer,
    "Admitter": Admitter,
    "PreRequest": PreRequest,
    "ResponseReceived": ResponseReceived,
    "ResponseStreaming": ResponseStreaming,
    "ResponseComplete": ResponseComplete,
    "ResponsesStore": ResponsesStoreAPI,
    "DataSource": DataSource,
    "DataExtractor": DataExtractor,
    "EndpointExtractor": EndpointExtractor,
    "SaturationDetector": SaturationDetector,
    "LoadEstimator": LoadEstimator,
    "FairnessPolicy": FairnessPolicy,
    "OrderingPolicy": OrderingPolicy,
    "UsageLimitPolicy": UsageLimitPolicy,
}


def extension_points(plugin: object) -> list[str]:
    """Names of the extension points `plugin` implements."""
    return [name for name, proto in EXTENSION_POINTS.items() if isinstance(plugin, proto)]
