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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from heimdall_proxy.tokenization import DEFAULT_MAX_PROMPT_CHARS, check_prompt_length
from heimdall_proxy.tokenization.local import (
    completion_prompt,
    prompt_chars,
    responses_messages,
)
from heimdall_proxy.tokenization.messages import tokenizable
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2 as pb
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2_grpc as pb_grpc
from heimdall_proxy.tokenization.uds_wire import (
    MAX_MESSAGE,
    TokenizerServiceError,
    WarnOnce,
    to_chat_message,
    to_value_map,
)

log = logging.getLogger(__name__)

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
_R = TypeVar("_R")


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
    loading in the background).

    A request whose prompt is over `max_prompt_chars` characters is not sent
    (TokenizeSkippedError): the service would spend seconds on it, past the deadline, and
    its answer, millions of ids, would be decoded on the event loop."""

    def __init__(
        self,
        address: str,
        model: str,
        use_tcp: bool = False,
        timeout: float = 5.0,
        init_timeout: float = 60.0,
        max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS,
    ) -> None:
        self.address = address
        self.max_prompt_chars = max_prompt_chars
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
        """The prompt ids of an OpenAI or Messages API request body (RequestTokenizer)."""
        api, data = tokenizable(api, data)
        check_prompt_length(prompt_chars(api, data), self.max_prompt_chars)
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
