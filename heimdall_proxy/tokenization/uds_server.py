"""`heimdall-proxy tokenizer-server`: the server side of the llm-d tokenizer protocol (see
uds.py), so an llm-d EPP can use this process as its UDS tokenizer sidecar."""

from __future__ import annotations

import asyncio
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
)
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2 as pb
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2_grpc as pb_grpc
from heimdall_proxy.tokenization.uds_wire import (
    MAX_MESSAGE,
    WarnOnce,
    from_chat_message,
    from_value_map,
)

log = logging.getLogger(__name__)

_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    # clients (and mesh sidecars) may ping every 10 s; do not answer with GOAWAY
    ("grpc.http2.min_ping_interval_without_data_ms", 10 * 1000),
    ("grpc.keepalive_permit_without_calls", 1),
]
_R = TypeVar("_R")


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
