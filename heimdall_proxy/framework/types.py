"""Core data types shared by the server, the data layer and every plugin."""

from __future__ import annotations

import dataclasses
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, overload

import orjson
from yarl import URL

#: What a parser made of a request: an OpenAI route (completions, chat, responses; "other"
#: for the rest it claims, e.g. embeddings), Anthropic's Messages API ("messages",
#: "count_tokens"), a pre-tokenized generate route ("generate": vLLM's /inference/v1/generate,
#: SGLang's /generate), or a body passed through uninterpreted ("passthrough").
ApiKind = Literal[
    "completions",
    "chat",
    "responses",
    "messages",
    "count_tokens",
    "generate",
    "other",
    "passthrough",
]

#: Label that carries a pod's disaggregation role.
ROLE_LABEL = "mif.moreh.io/role"


@dataclass(slots=True, frozen=True)
class Metrics:
    """One scrape of a pod's vLLM /metrics, replaced as a whole on every scrape so readers
    always see a consistent snapshot."""

    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    max_lora: int = 0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    #: time.monotonic() of the scrape; 0.0 means never scraped.
    updated_at: float = 0.0
    #: The data layer vouches for this snapshot until it replaces it: the pod was empty at
    #: the scrape and nothing was sent to it since, and a send replaces the snapshot first
    #: (datalayer/cadence.py). Its age is then 0: as fresh as the gateway can know.
    held: bool = False

    def age(self, now: float | None = None) -> float:
        """Seconds since this snapshot was taken (inf when never scraped, 0 while held)."""
        if self.updated_at == 0.0:
            return float("inf")
        if self.held:
            return 0.0
        return (time.monotonic() if now is None else now) - self.updated_at


_MEMBERSHIP_FIELDS = frozenset({"healthy", "models"})
_WATCHED_FIELDS = _MEMBERSHIP_FIELDS | {"metrics"}
_UNSET = object()


class MetricsWatcher(Protocol):
    """Told of every replaced snapshot, by the writer, as it is replaced."""

    def metrics_replaced(self, endpoint: Endpoint, metrics: Metrics) -> None: ...


#: Held weakly: a watcher that is gone is no longer told.
_METRICS_WATCHERS: weakref.WeakSet[MetricsWatcher] = weakref.WeakSet()


def watch_metrics(watcher: MetricsWatcher) -> None:
    """Call `watcher.metrics_replaced(endpoint, metrics)` whenever any endpoint's `metrics`
    is replaced, right after it is. A reader that keeps columns of many pods' snapshots
    updates the rows of the pods scraped as they are scraped (the scraper's cost, one pod at
    a time), instead of finding and re-reading them per request: at 1,024 pods re-reading
    them all after a pool-wide refresh was a third of a decision."""
    _METRICS_WATCHERS.add(watcher)


@dataclass(slots=True, eq=False)
class Endpoint:
    """A model-server pod. Identity (not value) equality: the pool owns exactly one object
    per pod, and plugins may use it as a dict key."""

    name: str
    url: str
    host: str
    port: int
    labels: dict[str, str] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    #: Model ids (base models and LoRA adapters) the pod serves; None until first learned.
    models: frozenset[str] | None = None
    #: Model cards as the pod reported them in /v1/models, keyed by id.
    model_cards: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: In rotation: its /metrics answers (fewer than 3 failed scrapes in a row) and its active
    #: health check passes. The data layer keeps it from the two signals below.
    healthy: bool = True
    consecutive_failures: int = 0
    scrape_ok: bool = True
    probe_ok: bool = True
    probe_failures: int = 0
    kv_events: str | None = None
    #: Attributes data-layer extractors published, keyed by (attribute, producer) as llm-d
    #: keys them (e.g. ("GPUUtilization", "dcgm-extractor"), ("Topology",
    #: "topology-extractor")); read them with framework/attributes.py, which also answers the
    #: core metrics. A pod whose labels or URL change is a new Endpoint, so what was derived
    #: from them never goes stale.
    attributes: dict[tuple[str, str], object] = field(default_factory=dict)
    #: Bumped whenever any endpoint's `healthy` or `models` changes, so the pool can cache
    #: the candidates of a model instead of scanning every pod on every request.
    membership_generation: ClassVar[int] = 0
    #: Bumped whenever a scrape reports a different KV block size for any endpoint (rare: it
    #: is the server's configuration), so what is derived from the pool's block sizes is
    #: kept until then instead of read from every pod per request.
    block_size_generation: ClassVar[int] = 0

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WATCHED_FIELDS:
            old = getattr(self, name, _UNSET)
            if name == "metrics":
                if not isinstance(old, Metrics) or old.block_size != value.block_size:
                    Endpoint.block_size_generation += 1
                object.__setattr__(self, name, value)
                for watcher in _METRICS_WATCHERS:
                    watcher.metrics_replaced(self, value)
                return
            if old != value:
                Endpoint.membership_generation += 1
        object.__setattr__(self, name, value)

    @property
    def hostport(self) -> str:
        """`host:port` as written into routing headers."""
        return f"{self.host}:{self.port}"

    def with_port(self, port: int) -> Endpoint:
        """This pod reached on `port` (a data-parallel server's primary port): a copy with
        the same name, so the ledger and the metrics still count it as the pod it is, and
        the same attributes; itself when `port` is 0 or its own."""
        if not port or self.port == port:
            return self
        return dataclasses.replace(self, port=port, url=str(URL(self.url).with_port(port)))

    def __repr__(self) -> str:
        return f"Endpoint({self.name!r}, {self.url!r})"


def parse_model_list(doc: Any) -> dict[str, dict[str, Any]]:
    """The model cards of an OpenAI `/v1/models` document (`{"object": "list", "data":
    [{"id": ...}, ...]}`; vLLM lists LoRA adapters there too), keyed by id. Cards without a
    string id are skipped. Raises ValueError when `doc` is not such a list."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, list):
        raise ValueError("not a model list: want an object with a `data` array")
    return {
        card["id"]: card
        for card in data
        if isinstance(card, dict) and isinstance(card.get("id"), str)
    }


def model_card(model: str, endpoints: Sequence[Endpoint]) -> dict[str, Any] | None:
    """The /v1/models card of `model` on the first of `endpoints` that reported one (None
    when none did). vLLM gives a LoRA adapter's card a `parent` (its base model) and a base
    model's card `parent: null`; a card made from a configured model list has no `parent`
    key at all."""
    for e in endpoints:
        card = e.model_cards.get(model)
        if card is not None:
            return card
    return None


def publish_models(endpoint: Endpoint, cards: dict[str, dict[str, Any]]) -> bool:
    """Set the models an endpoint serves; True when the set changed."""
    models = frozenset(cards)
    changed = endpoint.models != models
    endpoint.model_cards = cards
    endpoint.models = models
    return changed


class CycleState(dict[str, Any]):
    """Per-request scratch space shared by the plugins of one scheduling cycle (prefix match
    information, predictions, decider results). Keys are namespaced by the writer, usually
    its plugin name."""

    __slots__ = ()


def _new_request_id() -> str:
    """16 hex digits, as f"{random.getrandbits(64):016x}" gives them at less than two thirds
    of the cost (a format spec is parsed on every call; this runs for every request)."""
    return random.getrandbits(64).to_bytes(8).hex()


class Usage(NamedTuple):
    """Token counts an answer reported: prompt, output, and the prompt tokens the server
    found cached (None where it did not say)."""

    prompt: int | None
    output: int | None
    cached: int | None = None


class AnswerParser(Protocol):
    """How the answers of a request's API carry their usage: the parser that read the request
    reads its answer too (llm-d's ParseResponse), once, in the relay."""

    def body_usage(self, body: bytes) -> Usage | None:
        """The usage of a whole (non-streamed) answer."""
        ...

    def chunk_usage(self, chunk: bytes) -> Usage | None:
        """The usage one chunk of a streamed answer carries, None when none. Fields left
        None do not overwrite what an earlier chunk said."""
        ...


@dataclass(slots=True)
class InferenceRequest:
    """One client request, parsed once. `body` holds the exact bytes to forward; plugins that
    must change the request set `data` and mark `body_modified` so the server re-serialises."""

    api: ApiKind
    path: str
    model: str
    body: bytes
    data: dict[str, Any]
    headers: Mapping[str, str]
    stream: bool = False
    request_id: str = field(default_factory=_new_request_id)
    received_at: float = field(default_factory=time.monotonic)
    body_modified: bool = False
    #: The prompt's token ids, when a tokenizer prepare-data plugin (tokenizer,
    #: token-producer) ran.
    token_ids: list[int] | None = None
    #: True when `token_ids` are made up from the prompt's bytes (token-producer's estimate
    #: backend): fine for counting and approximate prefixes, never for an engine's KV blocks.
    token_ids_estimated: bool = False
    #: Who is asking, as the server authenticated it: "key:<digest>" for an API key, the
    #: owner header's value, or "" (one shared owner). Owns what the request stores.
    caller: str = ""
    #: The request's objective (`x-gateway-inference-objective`), its priority (higher is
    #: more important; negative = sheddable) and its fairness id, set at admission.
    objective: str = ""
    priority: int = 0
    fairness_id: str = ""
    #: The agent session the request belongs to, as a request-header plugin
    #: (agent-identity) read it from the agent's own headers; "" when none did. Flow
    #: control takes it as the fairness id when no fairness header names one.
    agent_identity: str = ""
    #: The parser that read the request, which reads its answer's usage; None when the
    #: answer is not read (a passthrough).
    parser: AnswerParser | None = None
    _prompt_text: str | None = None
    #: output_cap's answer once asked (-1: not yet)
    _output_cap: int | None = -1

    @property
    def target_model(self) -> str:
        """The model the request is sent to: the body's `model` as it stands (a plugin that
        rewrites it changes it), else the model it asked for. Metrics label it
        `target_model_name` beside `model_name`, the model asked for."""
        model = self.data.get("model")
        return model if isinstance(model, str) and model else self.model

    @property
    def session_token(self) -> str | None:
        return self.headers.get("x-session-token")

    def prompt_text(self) -> str:
        """The text the model will read, concatenated: completions `prompt`, chat message
        contents (text parts of list contents included), responses `instructions` + `input`.
        Computed on first use and cached."""
        if self._prompt_text is None:
            self._prompt_text = extract_prompt_text(self.api, self.data)
        return self._prompt_text

    def estimated_tokens(self, chars_per_token: float = 4.0) -> int:
        """Token count: the real one when tokenized, else characters / chars_per_token."""
        if self.token_ids is not None:
            return len(self.token_ids)
        return int(len(self.prompt_text()) / chars_per_token)

    def output_cap(self) -> int | None:
        """The output tokens the request allows (output_cap of its body), computed on first
        use and cached: the load scorers read it for every request in flight, per decision."""
        cap = self._output_cap
        if cap == -1:
            cap = self._output_cap = output_cap(self.data)
        return cap

    def set_data(self, data: dict[str, Any]) -> None:
        """Replace the request JSON; the server re-serialises it before forwarding."""
        self.data = data
        self.body_modified = True
        self._prompt_text = None
        self._output_cap = -1


#: The body keys that cap a request's output, in the order they are looked for.
OUTPUT_CAP_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def output_cap(data: Mapping[str, Any]) -> int | None:
    """The output tokens a request body allows: its max_completion_tokens, max_tokens or
    max_output_tokens (the first one set, a positive integer) times `n`; None when it sets
    none."""
    for key in OUTPUT_CAP_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            n = data.get("n")
            return value * (n if isinstance(n, int) and n > 1 else 1)
    return None


#: For isinstance on the request path: a parsed body holds plain dicts, which match `dict`
#: at once; `Mapping` alone goes through the ABC machinery (_abc_instancecheck) every time.
DICT_OR_MAPPING = (dict, Mapping)


def content_text(content: Any, out: list[str], *, mark_media: bool = False) -> None:
    """Append the text of a message `content` (a string, or a list of parts: strings and
    {"text": ...} parts) to `out`. With `mark_media`, a part without text (an image, audio or
    video part) is marked by its type, so prompts that differ only there do not look alike."""
    if isinstance(content, str):
        out.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, DICT_OR_MAPPING):
                text = part.get("text")
                if isinstance(text, str):
                    out.append(text)
                elif mark_media:
                    out.append(f"\x1d{part.get('type', '')}\x1d")


def anthropic_content_text(content: Any, out: list[str]) -> None:
    """Append the text of an Anthropic Messages `content` (or `system`): a string, or a list
    of blocks. Text blocks give their text; a tool result its content (text or blocks); a
    tool call its name and input as JSON: in an agent's conversation these are most of the
    prompt, and the next turn repeats them, so they must count for prefix routing."""
    if isinstance(content, str):
        out.append(content)
        return
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, DICT_OR_MAPPING):
            continue
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str):
                out.append(text)
        elif kind == "tool_result":
            anthropic_content_text(block.get("content"), out)
        elif kind == "tool_use":
            out.append(f"\x1d{block.get('name', '')}\x1d")
            out.append(orjson.dumps(block.get("input")).decode())
        elif kind is not None:
            out.append(f"\x1d{kind}\x1d")  # an image or document: marked, not read


def extract_prompt_text(api: ApiKind, data: Mapping[str, Any]) -> str:
    """Concatenated prompt text of a request body (see InferenceRequest.prompt_text)."""
    out: list[str] = []
    if api == "chat":
        messages = data.get("messages")
        if isinstance(messages, list):
            for msg in messages:
                if isinstance(msg, DICT_OR_MAPPING):
                    content_text(msg.get("content"), out)
    elif api == "completions":
        prompt = data.get("prompt")
        if isinstance(prompt, str):
            out.append(prompt)
        elif isinstance(prompt, list):
            out.extend(p for p in prompt if isinstance(p, str))
    elif api == "messages":
        system = data.get("system")
        if system is not None:
            anthropic_content_text(system, out)
        messages = data.get("messages")
        if isinstance(messages, list):
            for msg in messages:
                if isinstance(msg, DICT_OR_MAPPING):
                    anthropic_content_text(msg.get("content"), out)
    elif api == "responses":
        instructions = data.get("instructions")
        if isinstance(instructions, str):
            out.append(instructions)
        inp = data.get("input")
        if isinstance(inp, str):
            out.append(inp)
        elif isinstance(inp, list):
            for item in inp:
                if isinstance(item, DICT_OR_MAPPING):
                    content_text(item.get("content"), out)
                    if item.get("type") == "input_text":
                        content_text([item], out)
    return "".join(out)


@dataclass(slots=True)
class ScoredEndpoint:
    endpoint: Endpoint
    score: float


class CandidateNames:
    """The names of a candidate list and name -> position, kept for the list seen last. The
    pool hands out the same list of a model's candidates until one changes (callers must not
    modify it), and the scheduler and several plugins want its names: at 1,024 pods each
    rebuilding them per request was a tenth of a decision."""

    __slots__ = ("_index", "_set", "endpoints", "names")

    _last: ClassVar[CandidateNames | None] = None

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self.names = [e.name for e in endpoints]
        self._index: dict[str, int] | None = None
        self._set: frozenset[str] | None = None

    @classmethod
    def of(cls, endpoints: list[Endpoint]) -> CandidateNames:
        last = cls._last
        if last is None or last.endpoints is not endpoints or len(last.names) != len(endpoints):
            last = cls._last = cls(endpoints)
        return last

    def name_set(self) -> frozenset[str]:
        if self._set is None:
            self._set = frozenset(self.names)
        return self._set

    def index(self) -> dict[str, int] | None:
        """name -> position; None when two candidates share a name (not in a pool)."""
        if self._index is None:
            self._index = dict(zip(self.names, range(len(self.names)), strict=True))
        return self._index if len(self._index) == len(self.names) else None


class DefaultScores(Mapping[str, float]):
    """A scorer's answer where most endpoints score the same: every endpoint of `endpoints`
    scores `default` except those named in `changed` (names in `changed` that are not among
    `endpoints` are ignored). At hundreds of pods most of them are
    idle (no outstanding work, no LoRA adapter), and building and summing a dict entry per
    pod per scorer was most of a decision's CPU; the scheduler reads `default` and `changed`
    directly. To everything else it is the full Mapping the Scorer contract promises."""

    __slots__ = ("_names", "changed", "default", "endpoints")

    def __init__(
        self, endpoints: list[Endpoint], default: float, changed: dict[str, float]
    ) -> None:
        self.endpoints = endpoints
        self.default = default
        self.changed = changed
        self._names: frozenset[str] | None = None

    def __getitem__(self, name: str) -> float:
        if self._names is None:
            self._names = frozenset(e.name for e in self.endpoints)
        if name not in self._names:  # `changed` may name pods that are not candidates
            raise KeyError(name)
        return self.changed.get(name, self.default)

    def __iter__(self) -> Iterator[str]:
        return (e.name for e in self.endpoints)

    def __len__(self) -> int:
        return len(self.endpoints)

    def __repr__(self) -> str:
        return f"DefaultScores(default={self.default!r}, changed={self.changed!r})"


class AlignedScores(Mapping[str, float]):
    """A scorer's answer with its own score for most endpoints, in the candidates' order:
    `ordered[i]` is the score of `endpoints[i]`. The scheduler adds `ordered` to its sums
    position by position; a dict of a thousand names built by the scorer and looked up again
    by the scheduler was a tenth of a decision per such scorer at 1,024 pods. To everything
    else it is the full Mapping the Scorer contract promises (built on first use).
    `ordered` may be a numpy array of floats, which the scheduler adds in one numpy pass."""

    __slots__ = ("_map", "endpoints", "ordered")

    def __init__(self, endpoints: list[Endpoint], ordered: list[float] | Any) -> None:
        if len(ordered) != len(endpoints):
            raise ValueError(f"{len(ordered)} scores for {len(endpoints)} endpoints")
        self.endpoints = endpoints
        self.ordered = ordered
        self._map: dict[str, float] | None = None

    def _dict(self) -> dict[str, float]:
        if self._map is None:
            ordered = self.ordered
            if not isinstance(ordered, list):  # an array: its Python floats
                ordered = ordered.tolist()
            self._map = dict(zip((e.name for e in self.endpoints), ordered, strict=True))
        return self._map

    def __getitem__(self, name: str) -> float:
        return self._dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __bool__(self) -> bool:  # without building the dict
        return len(self.ordered) > 0

    def __repr__(self) -> str:
        return f"AlignedScores({self._dict()!r})"


class ScoredEndpoints(Sequence[ScoredEndpoint]):
    """The candidates a picker chooses among, with their total scores: `endpoints[i]` scored
    `totals[i]`. A Sequence of ScoredEndpoint for pickers that want one (made on first use);
    pickers that only compare totals read the two lists and allocate nothing per pod."""

    __slots__ = ("_items", "endpoints", "totals")

    def __init__(self, endpoints: list[Endpoint], totals: list[float]) -> None:
        self.endpoints = endpoints
        self.totals = totals
        self._items: list[ScoredEndpoint] | None = None

    def _list(self) -> list[ScoredEndpoint]:
        if self._items is None:
            self._items = [
                ScoredEndpoint(e, t) for e, t in zip(self.endpoints, self.totals, strict=True)
            ]
        return self._items

    @overload
    def __getitem__(self, i: int) -> ScoredEndpoint: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[ScoredEndpoint]: ...

    def __getitem__(self, i: int | slice) -> ScoredEndpoint | Sequence[ScoredEndpoint]:
        return self._list()[i]

    def __iter__(self) -> Iterator[ScoredEndpoint]:
        return iter(self._list())

    def __len__(self) -> int:
        return len(self.endpoints)


def split_scored(scored: Sequence[ScoredEndpoint]) -> tuple[list[Endpoint], list[float]]:
    """(endpoints, totals) of a picker's input, without copying a ScoredEndpoints."""
    if isinstance(scored, ScoredEndpoints):
        return scored.endpoints, scored.totals
    return [s.endpoint for s in scored], [s.score for s in scored]


class ProfileResult:
    """What one scheduling profile picked. `targets` are the picked endpoints, best first;
    `ranked` is every candidate that survived the filters, best first, used as the fallback
    order when a picked pod cannot be reached.

    A picker may pass `rank` instead of `ranked`: a function that makes the ranking when
    someone first reads it. Only a failed attempt (or a debug trace) needs the fallback
    order, and ranking 1,024 pods with random tie-breaks cost more than the rest of the
    decision."""

    __slots__ = ("_rank", "_ranked", "targets")

    def __init__(
        self,
        targets: list[Endpoint],
        ranked: list[Endpoint] | None = None,
        *,
        rank: Callable[[], list[Endpoint]] | None = None,
    ) -> None:
        self.targets = targets
        self._ranked = ranked if ranked is not None else ([] if rank is None else None)
        self._rank = rank

    @property
    def ranked(self) -> list[Endpoint]:
        if self._ranked is None:
            assert self._rank is not None
            self._ranked = self._rank()
            self._rank = None
        return self._ranked

    @ranked.setter
    def ranked(self, value: list[Endpoint]) -> None:
        self._ranked = value
        self._rank = None

    def has_ranking(self) -> bool:
        """Whether the picker gave a ranking (made yet or not)."""
        return self._ranked is None or bool(self._ranked)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProfileResult):
            return NotImplemented
        return self.targets == other.targets and self.ranked == other.ranked

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        ranked = self._ranked if self._ranked is not None else "<not made yet>"
        return f"ProfileResult(targets={self.targets!r}, ranked={ranked!r})"


@dataclass(slots=True)
class SchedulingResult:
    """The outcome of a scheduling cycle: every profile's result, and which profile chose the
    primary (the pod that will produce the response)."""

    profile_results: dict[str, ProfileResult | None]
    primary_profile: str

    @property
    def primary(self) -> ProfileResult:
        result = self.profile_results.get(self.primary_profile)
        if result is None:  # process_results guarantees this never happens
            raise LookupError(f"primary profile {self.primary_profile!r} has no result")
        return result

    def fallback_order(self) -> list[Endpoint]:
        """Endpoints to try for the primary hop, in order: the picked ones, then the rest of
        the ranked candidates."""
        primary = self.primary
        order = list(primary.targets)
        seen = {id(e) for e in order}
        order.extend(e for e in primary.ranked if id(e) not in seen)
        return order


class SchedulingError(Exception):
    """No endpoint can serve the request (every candidate filtered out)."""


@dataclass(slots=True)
class RequestContext:
    """Everything the request-control hooks see about one attempt to serve a request.

    The server creates it after scheduling; `target` is the pod of the current attempt (it
    changes when the server falls back to the next pod). Hooks may add headers to the
    upstream request (`upstream_headers`) and to the client response (`response_headers`).
    """

    request: InferenceRequest
    state: CycleState
    result: SchedulingResult
    target: Endpoint
    prefill: Endpoint | None = None
    upstream_headers: dict[str, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)
    #: Upstream status, once response headers arrived.
    status: int | None = None
    #: Upstream response headers, once they arrived.
    upstream_response_headers: Mapping[str, str] | None = None
    #: Full body of a non-streamed response (set before response_complete).
    response_body: bytes | None = None
    #: Why the attempt ended without a complete response (connect error, disconnect, ...).
    error: str | None = None
    #: Set by at most one plugin (in response_received) to change a stream in flight: the
    #: relay passes every chunk through it before writing, writes what it returns (bytes it
    #: holds back come out with a later call), and calls it with b"" at the end for the rest.
    chunk_filter: Callable[[bytes], Awaitable[bytes]] | None = None
    attempt: int = 0
    # The answer as the relay reads it, once, for every hook that asks: no plugin keeps its
    # own clock or scans a chunk again (monotonic seconds; 0.0 until it happened).
    #: When this attempt started (the ledger counted it, before the pre_request hooks).
    started_at: float = 0.0
    #: When the answer's first chunk arrived (a whole answer: when all of it had).
    first_chunk_at: float = 0.0
    #: When its latest chunk arrived.
    last_chunk_at: float = 0.0
    #: SSE data events in the chunk the response_streaming hooks are given ([DONE] not
    #: counted).
    events: int = 0
    #: SSE data events so far in the whole stream, this chunk's included.
    events_seen: int = 0
    #: The answer's usage (prompt and output tokens), set before response_complete when the
    #: pod reported it (the gateway asks streams for it); None where it did not.
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    #: Of the prompt tokens, those the pod found in its cache, when it said.
    cached_tokens: int | None = None
    #: "<request id>:<attempt>", which hooks key per-attempt state by: made once, when the
    #: context is (several plugins read it in several hooks, and a call per read added up).
    key: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.key = f"{self.request.request_id}:{self.attempt}"

    def chunk_arrived(self, events: int, now: float) -> None:
        """The relay read a chunk of the answer, holding `events` SSE data events, at `now`."""
        self.last_chunk_at = now
        if not self.first_chunk_at:
            self.first_chunk_at = now
        self.events = events
        self.events_seen += events
