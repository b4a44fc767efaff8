"""The llm-d tokenizer sidecar protocol: gRPC `tokenization.TokenizationService` over a Unix
socket (tokenizerpb/tokenizer.proto), with a client and a server, so the gateway can use the
llm-d kv-cache UDS tokenizer sidecar and an llm-d EPP can use `heimdall-proxy
tokenizer-server`.

How the llm-d client uses the service, and so how this client does:

- `InitializeTokenizer(model)` first (the sidecar loads, or downloads, the model's tokenizer);
  here on first use, and again after a failure.
- chat (and responses, turned into chat messages): `RenderChatCompletion` -> prompt ids, the
  chat template applied as vLLM applies it.
- completions: `RenderCompletion` -> prompt ids (special tokens added); `Tokenize` when the
  request says `add_special_tokens: false`; a prompt already made of ids needs no call.
- `RenderChatTemplate` (the text of a rendered template) is deprecated upstream; both sides
  still implement it.

Every field of the protocol's messages is read or written by both sides, except where the
protocol itself cannot carry a thing, which is warned about once per kind:

- request fields with no field in the protocol (a message's `name`, `tool_call_id` or other
  keys, content parts other than text and image_url, a chat request's `add_special_tokens`)
  are dropped by the client, so the service renders without them (its ids may then differ
  from the pod's). A chat request's `documents` travel in `chat_template_kwargs`, where vLLM
  reads them too.
- `RenderChatCompletionResponse.features` (multimodal hashes and placeholder ranges) need
  vLLM's multimodal processor: the server does not compute them (it warns when a request
  has images) and the client does not use them (the gateway's block keys have no
  multimodal part; it warns when a service sends some).
- `ChatTemplateRequest.return_assistant_tokens_mask` has no field to answer in
  (`ChatTemplateResponse` carries text): the server warns.
- `InitializeTokenizerRequest.enable_thinking` and `add_generation_prompt` are the model's
  defaults for `RenderChatTemplate`, as in the sidecar: `enable_thinking` goes to the template
  unless the request's kwargs set it, and the generation prompt is added when either the
  model's default or the request asks for it (proto3 cannot tell an unset false).

Failures are TokenizerServiceError with a message that says what went wrong (socket missing,
deadline, the service's own error).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar, runtime_checkable

import grpc
import grpc.aio

from heimdall_proxy.tokenization.local import (
    ChatTemplateError,
    LocalTokenizer,
    completion_prompt,
    responses_messages,
)
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2 as pb
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: Messages up to this size both ways (long prompts; the llm-d client allows the same).
MAX_MESSAGE = 100 * 1024 * 1024
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 10 * 60 * 1000),
    ("grpc.keepalive_timeout_ms", 10 * 1000),
    ("grpc.keepalive_permit_without_calls", 1),
    # a service that is back is reconnected to within half a second, not after gRPC's
    # default backoff of up to 2 minutes (calls wait for it within their deadline)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    # clients (and mesh sidecars) may ping every 10 s; do not answer with GOAWAY
    ("grpc.http2.min_ping_interval_without_data_ms", 10 * 1000),
    ("grpc.keepalive_permit_without_calls", 1),
]
_R = TypeVar("_R")


class TokenizerServiceError(RuntimeError):
    """The tokenizer service answered with an error, or could not be reached in time."""


def uds_model_name(model: str, model_tokenizer_map: Mapping[str, str]) -> str:
    """The name a UDS tokenizer pool sends for `model`, as llm-d resolves it: without a
    `modelTokenizerMap` the model name itself; with one, the mapped tokenizer directory (a
    tokenizer.json path stands for its directory), and a model the map lacks is an error."""
    if not model_tokenizer_map:
        return model
    path = model_tokenizer_map.get(model)
    if path is None:
        raise ValueError(
            f"uds.modelTokenizerMap has no entry for model {model!r} "
            f"(it maps {', '.join(sorted(map(repr, model_tokenizer_map)))})"
        )
    return str(Path(path).parent) if Path(path).name == "tokenizer.json" else path


# ---- JSON-like values <-> the protocol's Value ------------------------------------------


def to_value(value: Any) -> pb.Value:
    """A JSON-like Python value as a protocol Value (None: a Value with nothing set)."""
    if isinstance(value, bool):
        return pb.Value(bool_value=value)
    if isinstance(value, int | float):
        return pb.Value(number_value=float(value))
    if isinstance(value, str):
        return pb.Value(string_value=value)
    if isinstance(value, Mapping):
        return pb.Value(struct_value=pb.StructValue(fields=to_value_map(value)))
    if isinstance(value, list | tuple):
        return pb.Value(list_value=pb.ListValue(values=[to_value(v) for v in value]))
    if value is None:
        return pb.Value()
    raise ValueError(f"cannot send a {type(value).__name__} in a template argument")


def to_value_map(values: Mapping[str, Any]) -> dict[str, pb.Value]:
    return {str(k): to_value(v) for k, v in values.items()}


def from_value(value: pb.Value) -> Any:
    """A protocol Value as Python; whole numbers come back as int (JSON has one number
    type, templates print 1 and 1.0 differently)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        n = value.number_value
        return int(n) if n.is_integer() and abs(n) < 2**53 else n
    if kind == "bool_value":
        return value.bool_value
    if kind == "list_value":
        return [from_value(v) for v in value.list_value.values]
    if kind == "struct_value":
        return from_value_map(value.struct_value.fields)
    return None


def from_value_map(values: Mapping[str, pb.Value]) -> dict[str, Any]:
    return {k: from_value(v) for k, v in values.items()}


# ---- chat messages <-> the protocol's ChatMessage ----------------------------------------


def to_chat_message(message: Mapping[str, Any]) -> pb.ChatMessage:
    """An OpenAI chat message as a protocol message. Content parts other than text and
    image_url have no place in the protocol and are left out (as the llm-d client does)."""
    role = message.get("role")
    if not isinstance(role, str):
        raise ValueError("a chat message needs a string role")
    out = pb.ChatMessage(role=role)
    content = message.get("content")
    if isinstance(content, str):
        out.content = content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                out.content_parts.append(pb.ContentPart(type="text", text=part))
            elif not isinstance(part, Mapping):
                raise ValueError("a content part must be an object")
            elif isinstance(part.get("text"), str):
                out.content_parts.append(pb.ContentPart(type="text", text=part["text"]))
            elif part.get("type") == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                if isinstance(url, str):
                    out.content_parts.append(
                        pb.ContentPart(type="image_url", image_url=pb.ImageUrl(url=url))
                    )
    elif content is not None:
        raise ValueError("a message's content must be a string or a list of parts")
    calls = message.get("tool_calls")
    if calls:
        out.tool_calls_json = json.dumps(calls)
    return out


def from_chat_message(message: pb.ChatMessage) -> dict[str, Any]:
    """A protocol message as the OpenAI chat message it stands for."""
    out: dict[str, Any] = {"role": message.role}
    if message.content_parts:
        parts: list[dict[str, Any]] = []
        for part in message.content_parts:
            if part.HasField("image_url"):
                parts.append({"type": part.type, "image_url": {"url": part.image_url.url}})
            else:
                parts.append({"type": part.type or "text", "text": part.text})
        out["content"] = parts
    else:
        out["content"] = message.content if message.HasField("content") else None
    if message.HasField("tool_calls_json") and message.tool_calls_json:
        out["tool_calls"] = json.loads(message.tool_calls_json)
    return out


class WarnOnce:
    """Logs a warning the first time each kind of thing (`what`) happens, after a fixed
    prefix. Called from worker threads too: a set add is atomic enough, and a rare second
    warning is harmless."""

    __slots__ = ("_prefix", "_seen")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._seen: set[str] = set()

    def __call__(self, what: str, message: str) -> None:
        if what not in self._seen:
            self._seen.add(what)
            log.warning("%s: %s", self._prefix, message)


# ---- client ------------------------------------------------------------------------------

#: Keys of an OpenAI chat message the protocol's ChatMessage carries.
_MESSAGE_KEYS = frozenset({"role", "content", "tool_calls"})
#: Content part types ContentPart carries.
_PART_TYPES = frozenset({"text", "image_url"})


def unsent_fields(data: Mapping[str, Any], messages: Sequence[Any]) -> set[str]:
    """What of a chat request the protocol has no field for (see the module docstring), named
    as in the request: `messages[].name`, `content[].type=input_audio`, `add_special_tokens`."""
    out: set[str] = set()
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        out.update(
            f"messages[].{k}" for k, v in m.items() if k not in _MESSAGE_KEYS and v is not None
        )
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and not isinstance(part.get("text"), str):
                    kind = part.get("type")
                    if kind not in _PART_TYPES:
                        out.add(f"messages[].content[].type={kind}")
    if data.get("add_special_tokens") is True:
        out.add("add_special_tokens")
    return out


class UDSTokenizerClient:
    """Client of a TokenizationService (the llm-d sidecar, or `heimdall-proxy
    tokenizer-server`) on a Unix socket, or on TCP host:port with `use_tcp` (tests).

    One gRPC channel, opened on first use and reconnected by gRPC itself. A missing socket
    file fails a call at once; otherwise every call waits for the connection and its answer
    up to a deadline of `timeout` seconds; the model's InitializeTokenizer, which may download it,
    gets `init_timeout` but a request waits for it no longer than `timeout` (it then goes on
    loading in the background)."""

    def __init__(
        self,
        address: str,
        model: str,
        use_tcp: bool = False,
        timeout: float = 5.0,
        init_timeout: float = 60.0,
    ) -> None:
        self.address = address
        self.model = model
        self.use_tcp = use_tcp
        self.timeout = timeout
        self.init_timeout = init_timeout
        self.target = address if use_tcp else "unix:" + os.path.abspath(address)
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._initialized = False
        self._init: asyncio.Task[None] | None = None
        self._warn_once = WarnOnce(f"tokenizer service at {address}, model {model!r}")

    def _service(self) -> Any:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
            self._stub = pb_grpc.TokenizationServiceStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _check_socket(self) -> None:
        """No socket file: fail at once, saying so (a stat, not a connection attempt)."""
        if not self.use_tcp and not os.path.exists(self.address):
            raise TokenizerServiceError(
                f"tokenizer socket {self.address} does not exist: is the tokenizer "
                "sidecar (or `heimdall-proxy tokenizer-server`) running?"
            )

    def _error(self, what: str, exc: grpc.aio.AioRpcError, timeout: float) -> Exception:
        code = exc.code()
        where = f"the tokenizer service at {self.address}"
        if code == grpc.StatusCode.UNAVAILABLE:
            return TokenizerServiceError(f"cannot reach {where}: {exc.details()}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return TokenizerServiceError(f"{where} did not answer {what} within {timeout:g}s")
        return TokenizerServiceError(f"{where} failed {what}: {code.name}: {exc.details()}")

    async def _call(self, method: str, request: Any, deadline: float | None = None) -> Any:
        deadline = self.timeout if deadline is None else deadline
        self._check_socket()
        try:
            # the socket exists, so the service is up or coming back: wait for the
            # connection within the deadline rather than fail while gRPC reconnects
            response = await getattr(self._service(), method)(
                request, timeout=deadline, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error(method, exc, deadline) from exc
        if not response.success:
            raise TokenizerServiceError(
                f"the tokenizer service failed {method} for model {self.model!r}: "
                f"{response.error_message or 'no reason given'}"
            )
        return response

    async def _initialize(self) -> None:
        request = pb.InitializeTokenizerRequest(model_name=self.model, add_generation_prompt=True)
        await self._call("InitializeTokenizer", request, self.init_timeout)
        self._initialized = True

    async def initialize(self, wait: float | None = None) -> None:
        """Have the service load the model's tokenizer (once; again after a failure). Waits
        at most `wait` seconds (default: the init timeout)."""
        if self._initialized:
            return
        if self._init is None or self._init.done():
            self._init = asyncio.create_task(self._initialize())
            # a failure nobody waited for is retried on the next call, not logged at exit
            self._init.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            await asyncio.wait_for(asyncio.shield(self._init), wait or self.init_timeout)
        except TimeoutError as exc:
            raise TokenizerServiceError(
                f"the tokenizer service at {self.address} is still loading model {self.model!r}"
            ) from exc

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`Tokenize`: the ids of raw text."""
        ids, _ = await self.encode_with_offsets(text, add_special_tokens)
        return ids

    async def encode_with_offsets(
        self, text: str, add_special_tokens: bool = True
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """`Tokenize`: ids and (start, end) character offsets (empty if the service's
        tokenizer does not give them)."""
        await self.initialize(self.timeout)
        request = pb.TokenizeRequest(
            input=text, model_name=self.model, add_special_tokens=add_special_tokens
        )
        answer = await self._call("Tokenize", request)
        pairs = list(answer.offset_pairs)
        return list(answer.input_ids), list(zip(pairs[::2], pairs[1::2], strict=False))

    async def render_chat_completion(self, data: Mapping[str, Any], messages: Any) -> list[int]:
        """`RenderChatCompletion`: the prompt ids of a chat request (`data`) with `messages`."""
        if not isinstance(messages, list):
            raise ValueError("messages must be a list of objects")
        for field in unsent_fields(data, messages):
            self._warn_once(
                field,
                f"the protocol has no field for a chat request's {field}: it is left out, so "
                "the service renders without it and its token ids may differ from the pod's",
            )
        request = pb.RenderChatCompletionRequest(
            model_name=self.model,
            messages=[to_chat_message(m) for m in messages if isinstance(m, Mapping)],
            continue_final_message=data.get("continue_final_message") is True,
        )
        if len(request.messages) != len(messages):
            raise ValueError("messages must be a list of objects")
        if "add_generation_prompt" in data:
            request.add_generation_prompt = data["add_generation_prompt"] is not False
        if data.get("tools"):
            request.tools_json = json.dumps(data["tools"])
        if isinstance(data.get("chat_template"), str):
            request.chat_template = data["chat_template"]
        kwargs = data.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, Mapping) else {}
        if data.get("documents") is not None:
            kwargs.setdefault("documents", data["documents"])
        if kwargs:
            request.chat_template_kwargs = json.dumps(kwargs)
        await self.initialize(self.timeout)
        answer = await self._call("RenderChatCompletion", request)
        if answer.HasField("features") and (
            answer.features.mm_hashes or answer.features.mm_placeholders
        ):
            self._warn_once(
                "features",
                "multimodal features in RenderChatCompletion answers are not used: the "
                "gateway's block keys are made of token ids only",
            )
        return list(answer.token_ids)

    async def render_completion(self, prompt: str) -> list[int]:
        """`RenderCompletion`: a completion prompt's ids, special tokens added."""
        await self.initialize(self.timeout)
        request = pb.RenderCompletionRequest(model_name=self.model, prompt=prompt)
        answer = await self._call("RenderCompletion", request)
        return list(answer.token_ids)

    async def render_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        chat_template: str = "",
    ) -> str:
        """`RenderChatTemplate`: the text of the rendered chat template."""
        await self.initialize(self.timeout)
        request = pb.ChatTemplateRequest(
            model_name=self.model,
            conversation_turns=[
                pb.ConversationTurn(messages=[to_chat_message(m) for m in messages])
            ],
            tools=[pb.ToolDescription(tool=to_value_map(t)) for t in tools or ()],
            documents=[pb.Document(document=to_value_map(d)) for d in documents or ()],
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=to_value_map(chat_template_kwargs or {}),
        )
        answer = await self._call("RenderChatTemplate", request)
        return str(answer.rendered_prompt)

    async def tokenize(self, api: str, data: Mapping[str, Any], size_hint: int = 0) -> list[int]:
        """The prompt ids of an OpenAI request body (RequestTokenizer)."""
        if api == "chat":
            return await self.render_chat_completion(data, data.get("messages"))
        if api == "responses":
            return await self.render_chat_completion(data, responses_messages(data))
        prompt = completion_prompt(data)
        if isinstance(prompt, list):
            return prompt
        if data.get("add_special_tokens", True) is False:
            return await self.encode(prompt, add_special_tokens=False)
        return await self.render_completion(prompt)

    async def close(self) -> None:
        if self._init is not None and not self._init.done():
            self._init.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._init
        channel, self._channel, self._stub = self._channel, None, None
        self._initialized = False
        if channel is not None:
            await channel.close()


# ---- server ------------------------------------------------------------------------------


class ServedTokenizer(Protocol):
    """What the server needs of a tokenizer (LocalTokenizer, or one the caller built, such as
    the simulator's)."""

    def tokenize_request(self, api: str, data: Mapping[str, Any]) -> list[int]: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


@runtime_checkable
class OffsetEncoder(Protocol):
    """A tokenizer that also gives each token's character span (Tokenize's offset_pairs)."""

    def encode_with_offsets(
        self, text: str, add_special_tokens: bool = True
    ) -> tuple[list[int], list[tuple[int, int]]]: ...


@runtime_checkable
class ChatRenderer(Protocol):
    """A tokenizer that renders chat templates to text (RenderChatTemplate)."""

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Any = None,
        documents: Any = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> str: ...


def _status(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, LookupError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, ValueError | ChatTemplateError):  # bad input, or the template refused
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED
    return grpc.StatusCode.INTERNAL


class _Servicer(pb_grpc.TokenizationServiceServicer):
    """The five RPCs, each run on the server's worker threads."""

    def __init__(self, server: TokenizerServer) -> None:
        self.server = server

    async def _run(self, context: grpc.aio.ServicerContext[Any, Any], fn: Callable[[], _R]) -> _R:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.server.pool, fn)
        except Exception as exc:  # every failure is an answer with a status, never a hang
            await self._abort(context, exc)

    @staticmethod
    async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: Exception) -> NoReturn:
        await context.abort(_status(exc), f"{type(exc).__name__}: {exc}")
        raise AssertionError("unreachable")  # pragma: no cover - abort raises

    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.TokenizeResponse:
        def work() -> pb.TokenizeResponse:
            tok = self.server.tokenizer(request.model_name)
            if isinstance(tok, OffsetEncoder):
                ids, offsets = tok.encode_with_offsets(request.input, request.add_special_tokens)
            else:
                ids, offsets = tok.encode(request.input, request.add_special_tokens), []
            pairs = [n for pair in offsets for n in pair]
            return pb.TokenizeResponse(input_ids=ids, offset_pairs=pairs, success=True)

        return await self._run(context, work)

    async def RenderChatTemplate(
        self, request: pb.ChatTemplateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ChatTemplateResponse:
        def work() -> pb.ChatTemplateResponse:
            tok = self.server.tokenizer(request.model_name)
            if not isinstance(tok, ChatRenderer):
                raise NotImplementedError(
                    f"the tokenizer of model {request.model_name!r} renders no template text"
                )
            if request.return_assistant_tokens_mask:
                self.server.warn_once(
                    "return_assistant_tokens_mask",
                    "RenderChatTemplate's return_assistant_tokens_mask is ignored: "
                    "ChatTemplateResponse has no field for the mask",
                )
            defaults = self.server.defaults.get(request.model_name)
            kwargs = from_value_map(request.chat_template_kwargs)
            add_generation_prompt = request.add_generation_prompt
            if defaults is not None:  # the model's InitializeTokenizer settings, as the sidecar
                kwargs.setdefault("enable_thinking", defaults.enable_thinking)
                add_generation_prompt = add_generation_prompt or defaults.add_generation_prompt
            text = tok.render_chat(
                [
                    from_chat_message(m)
                    for turn in request.conversation_turns
                    for m in turn.messages
                ],
                add_generation_prompt=add_generation_prompt,
                continue_final_message=request.continue_final_message,
                tools=[from_value_map(t.tool) for t in request.tools] or None,
                documents=[from_value_map(d.document) for d in request.documents] or None,
                chat_template_kwargs=kwargs,
                chat_template=request.chat_template or None,
            )
            return pb.ChatTemplateResponse(rendered_prompt=text, success=True)

        return await self._run(context, work)

    async def InitializeTokenizer(
        self, request: pb.InitializeTokenizerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.InitializeTokenizerResponse:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.server.pool, self.server.tokenizer, request.model_name)
        except Exception as exc:  # the protocol answers a failed load, it does not abort
            return pb.InitializeTokenizerResponse(success=False, error_message=str(exc))
        self.server.defaults[request.model_name] = ModelDefaults(
            request.enable_thinking, request.add_generation_prompt
        )
        return pb.InitializeTokenizerResponse(success=True)

    async def RenderChatCompletion(
        self, request: pb.RenderChatCompletionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RenderChatCompletionResponse:
        def work() -> pb.RenderChatCompletionResponse:
            tok = self.server.tokenizer(request.model_name)
            if any(p.HasField("image_url") for m in request.messages for p in m.content_parts):
                self.server.warn_once(
                    "features",
                    "RenderChatCompletion answers carry no multimodal features (image "
                    "hashes and placeholder ranges need vLLM's multimodal processor)",
                )
            body: dict[str, Any] = {
                "messages": [from_chat_message(m) for m in request.messages],
                "continue_final_message": request.continue_final_message,
            }
            if request.HasField("add_generation_prompt"):
                body["add_generation_prompt"] = request.add_generation_prompt
            if request.HasField("tools_json") and request.tools_json:
                body["tools"] = json.loads(request.tools_json)
            if request.chat_template:
                body["chat_template"] = request.chat_template
            if request.HasField("chat_template_kwargs") and request.chat_template_kwargs:
                kwargs = json.loads(request.chat_template_kwargs)
                if not isinstance(kwargs, dict):
                    raise ValueError("chat_template_kwargs must be a JSON object")
                body["chat_template_kwargs"] = kwargs
            ids = tok.tokenize_request("chat", body)
            return pb.RenderChatCompletionResponse(
                request_id=f"render-{uuid.uuid4().hex}", token_ids=ids, success=True
            )

        return await self._run(context, work)

    async def RenderCompletion(
        self, request: pb.RenderCompletionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RenderCompletionResponse:
        def work() -> pb.RenderCompletionResponse:
            tok = self.server.tokenizer(request.model_name)
            ids = tok.tokenize_request("completions", {"prompt": request.prompt})
            return pb.RenderCompletionResponse(
                request_id=f"render-{uuid.uuid4().hex}", token_ids=ids, success=True
            )

        return await self._run(context, work)


@dataclass(frozen=True, slots=True)
class ModelDefaults:
    """A model's InitializeTokenizer settings, applied to its RenderChatTemplate calls."""

    enable_thinking: bool
    add_generation_prompt: bool


def _prepare_socket_path(address: str) -> str:
    """Create the socket's directory; remove a stale socket left by a previous server.
    Returns the gRPC target to bind."""
    path = Path(address).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        path.unlink()
    return f"unix:{path}"


class TokenizerServer:
    """Serves TokenizationService on a Unix socket (or TCP host:port) for tokenizers by model
    name. `loader` (model name -> tokenizer) loads a model a client names that is not served
    yet, as the llm-d sidecar does; without one, a server with a single tokenizer serves it
    under any name."""

    def __init__(
        self,
        tokenizers: Mapping[str, ServedTokenizer],
        workers: int = 4,
        loader: Callable[[str], ServedTokenizer] | None = None,
    ) -> None:
        if not tokenizers and loader is None:
            raise ValueError("a tokenizer server needs at least one tokenizer or a loader")
        self.tokenizers: dict[str, ServedTokenizer] = dict(tokenizers)
        self.loader = loader
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tok")
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._loading = threading.Lock()
        #: By model name, the settings its last InitializeTokenizer asked for.
        self.defaults: dict[str, ModelDefaults] = {}
        #: Warnings about what the protocol cannot carry, once per kind.
        self.warn_once = WarnOnce("tokenizer server")

    def tokenizer(self, model: str) -> ServedTokenizer:
        """The tokenizer for `model` (loaded through `loader` if need be). Raises
        LookupError, or the loader's error."""
        found = self.tokenizers.get(model)
        if found is not None:
            return found
        if self.loader is not None:
            with self._loading:  # worker threads: load each model once
                found = self.tokenizers.get(model)
                if found is None:
                    found = self.loader(model)
                    self.tokenizers[model] = found
            return found
        if len(self.tokenizers) == 1:
            return next(iter(self.tokenizers.values()))
        raise LookupError(f"no tokenizer for model {model!r} (have {sorted(self.tokenizers)})")

    async def start(self, address: str, use_tcp: bool = False) -> None:
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        pb_grpc.add_TokenizationServiceServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        if use_tcp:
            self.port = server.add_insecure_port(address)
        else:
            server.add_insecure_port(_prepare_socket_path(address))
        await server.start()
        if not use_tcp:
            os.chmod(address, 0o660)
        self._server = server

    async def stop(self, grace: float = 0.5) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        self.pool.shutdown(wait=False, cancel_futures=True)


def load_models(specs: list[str]) -> dict[str, LocalTokenizer]:
    """`[NAME=]MODEL` specs -> tokenizers; MODEL is a directory or tokenizer.json, or a model
    name found in the local caches or on the Hub. NAME defaults to MODEL. Raises
    TokenizerNotFoundError."""
    from heimdall_proxy.tokenization.resolve import model_spec

    return {name: load_model(model) for name, model in map(model_spec, specs)}


def load_model(model: str) -> LocalTokenizer:
    """A model's tokenizer from a directory, the local caches or the Hugging Face Hub."""
    from heimdall_proxy.tokenization.resolve import find_tokenizer

    return LocalTokenizer(find_tokenizer(model))


async def run_server(
    address: str,
    specs: list[str],
    workers: int = 4,
    use_tcp: bool = False,
    extra: Mapping[str, ServedTokenizer] | None = None,
    load_on_demand: bool = False,
) -> None:
    """Serve until cancelled (the `tokenizer-server` command). `extra`: tokenizers the caller
    built itself, by model name (the CLI hands in the simulator's, so this package never
    imports the simulator). `load_on_demand`: load other models clients name."""
    tokenizers: dict[str, ServedTokenizer] = dict(load_models(specs))
    tokenizers.update(extra or {})
    server = TokenizerServer(tokenizers, workers, load_model if load_on_demand else None)
    await server.start(address, use_tcp)
    log.info(
        "tokenizer service (llm-d TokenizationService) for %s on %s%s",
        ", ".join(sorted(server.tokenizers)) or "models clients name",
        "" if use_tcp else "unix:",
        address,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
