"""The llm-d tokenizer sidecar protocol (gRPC TokenizationService on a Unix socket): our client
against our server over real sockets, the wire messages as the llm-d client sends them,
errors (socket missing, deadlines, the service's own errors), and the CLI."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from heimdall_proxy.tokenization.local import LocalTokenizer
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2 as pb
from heimdall_proxy.tokenization.tokenizerpb import tokenizer_pb2_grpc as pb_grpc
from heimdall_proxy.tokenization.uds import UDSTokenizerClient, uds_model_name
from heimdall_proxy.tokenization.uds_server import TokenizerServer, load_model
from heimdall_proxy.tokenization.uds_wire import TokenizerServiceError, from_value, to_value

CHAT = {"messages": [{"role": "user", "content": "hello world"}]}


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[str]:
    # AF_UNIX paths are limited to ~100 bytes: keep it short
    path = Path("/tmp") / f"hp-tok-{os.getpid()}-{tmp_path.name[-12:]}.sock"
    yield str(path)
    path.unlink(missing_ok=True)


async def _until_up(client: UDSTokenizerClient, seconds: float = 10.0) -> None:
    """Wait for a server started in another process to answer."""
    for _ in range(int(seconds / 0.05)):
        try:
            await client.encode("hello")
            return
        except TokenizerServiceError:
            await asyncio.sleep(0.05)
    raise AssertionError("the tokenizer server did not come up")


async def test_every_rpc_round_trips(tok: LocalTokenizer, sock: str) -> None:
    server = TokenizerServer({"tiny": tok}, workers=2)
    await server.start(sock)
    client = UDSTokenizerClient(sock, "tiny")
    try:
        assert await client.tokenize("chat", CHAT) == tok.tokenize_request("chat", CHAT)
        completion = {"prompt": "hello world"}
        assert await client.tokenize("completions", completion) == tok.encode("hello world")
        assert await client.tokenize(
            "completions", {"prompt": "hello", "add_special_tokens": False}
        ) == tok.encode("hello", add_special_tokens=False)
        assert await client.tokenize("completions", {"prompt": [5, 6]}) == [5, 6]
        responses = {"instructions": "the gateway", "input": "hello world"}
        assert await client.tokenize("responses", responses) == tok.tokenize_request(
            "responses", responses
        )
        ids, offsets = await client.encode_with_offsets("hello world")
        assert (ids, offsets) == tok.encode_with_offsets("hello world")
        assert offsets[-1] == (6, 11)
        text = await client.render_chat_template(
            CHAT["messages"], tools=[{"type": "function", "function": {"name": "f"}}]
        )
        assert text == tok.render_chat(CHAT["messages"], tools=[{"type": "function"}])
        assert text.endswith("<|tool|> 1 <|assistant|> ")
        prompts = [f"hello {i} world" for i in range(20)]  # concurrent calls on one channel
        many = await asyncio.gather(
            *(client.tokenize("completions", {"prompt": p}) for p in prompts)
        )
        assert many == [tok.encode(p) for p in prompts]
    finally:
        await client.close()
        await server.stop()


async def test_chat_request_fields_reach_the_template(tok: LocalTokenizer, sock: str) -> None:
    server = TokenizerServer({"tiny": tok})
    await server.start(sock)
    client = UDSTokenizerClient(sock, "tiny")
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"city": "paris"}'}}]  # fmt: skip
    bodies: list[dict[str, Any]] = [
        {"messages": CHAT["messages"], "add_generation_prompt": False},
        {"messages": CHAT["messages"], "chat_template_kwargs": {"greeting": "thanks"}},
        {"messages": CHAT["messages"], "tools": [{"type": "function"}, {"type": "function"}]},
        {
            "messages": [*CHAT["messages"], {"role": "assistant", "content": "hello"}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hello"},
                        {"type": "text", "text": "world"},
                    ],
                }
            ]
        },
        {"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]},
        {"messages": CHAT["messages"], "chat_template": "{{ messages[0]['content'] }} yes"},
    ]
    try:
        for body in bodies:
            assert await client.tokenize("chat", body) == tok.tokenize_request("chat", body), body
        with pytest.raises(TokenizerServiceError, match=r"INVALID_ARGUMENT.*unknown role"):
            await client.tokenize("chat", {"messages": [{"role": "wizard", "content": "x"}]})
        with pytest.raises(ValueError, match="messages must be"):
            await client.tokenize("chat", {"messages": "nope"})
    finally:
        await client.close()
        await server.stop()


def test_values_survive_the_wire() -> None:
    value = {"a": [1, 2.5, "x", True, None, {"b": -3}], "big": 2**60}
    back = from_value(to_value(value))
    assert back == {"a": [1, 2.5, "x", True, None, {"b": -3}], "big": float(2**60)}
    assert isinstance(back["a"][0], int) and back["a"][3] is True
    with pytest.raises(ValueError, match="cannot send a set"):
        to_value({1, 2})


class _Recorder(pb_grpc.TokenizationServiceServicer):  # type: ignore[misc]
    """A stand-in for the llm-d sidecar that records what our client sends (the real
    sidecar runs vLLM, which is not installed here)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    async def InitializeTokenizer(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        return pb.InitializeTokenizerResponse(success=True)

    async def RenderChatCompletion(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        answer = pb.RenderChatCompletionResponse(token_ids=[1, 2, 3], success=True)
        if any(p.HasField("image_url") for m in request.messages for p in m.content_parts):
            # the sidecar's vLLM renderer describes each image (hash, placeholder tokens)
            answer.features.mm_hashes["image"].values.append("img-hash")
            answer.features.mm_placeholders["image"].ranges.add(offset=1, length=2)
        return answer

    async def RenderCompletion(self, request: Any, context: Any) -> Any:
        self.seen.append(request)
        return pb.RenderCompletionResponse(success=False, error_message="model not loaded")

    async def Tokenize(self, request: Any, context: Any) -> Any:
        await asyncio.sleep(5)  # slower than any client deadline below
        return pb.TokenizeResponse(success=True)


@pytest.mark.slow
async def test_the_wire_messages_are_the_llm_d_clients(sock: str) -> None:
    recorder = _Recorder()
    server = grpc.aio.server()
    pb_grpc.add_TokenizationServiceServicer_to_server(recorder, server)
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    client = UDSTokenizerClient(sock, "org/model", timeout=0.5)
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "data:x"}},
                    {"type": "input_audio", "input_audio": {}},
                ],
            },
            {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f"}}]},
        ],
        "tools": [{"type": "function"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "documents": [{"title": "t"}],
    }
    try:
        assert await client.tokenize("chat", body) == [1, 2, 3]
        init, chat = recorder.seen
        assert init.model_name == "org/model" and init.add_generation_prompt
        assert chat.model_name == "org/model"
        assert not chat.HasField("add_generation_prompt")  # unset means true
        assert chat.messages[0].content == "be brief"
        parts = chat.messages[1].content_parts
        assert [p.type for p in parts] == ["text", "image_url"]  # audio has no place
        assert parts[1].image_url.url == "data:x"
        assert not chat.messages[2].HasField("content")
        assert chat.messages[2].tool_calls_json == '[{"id": "1", "function": {"name": "f"}}]'
        assert chat.tools_json == '[{"type": "function"}]'
        assert chat.chat_template_kwargs == (
            '{"enable_thinking": false, "documents": [{"title": "t"}]}'
        )
        # success=false is an error naming the reason; InitializeTokenizer is not repeated
        with pytest.raises(TokenizerServiceError, match=r"RenderCompletion.*model not loaded"):
            await client.tokenize("completions", {"prompt": "hi"})
        assert recorder.seen[-1].prompt == "hi" and len(recorder.seen) == 3
        with pytest.raises(TokenizerServiceError, match=r"did not answer Tokenize within 0.5s"):
            await client.encode("slow")
    finally:
        await client.close()
        await server.stop(0)


async def test_what_the_protocol_cannot_carry_is_warned_about_once(
    sock: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Message keys, content part types and request fields with no protocol field are left
    out with one warning each; multimodal features the sidecar returns are not used (one
    warning)."""
    recorder = _Recorder()
    server = grpc.aio.server()
    pb_grpc.add_TokenizationServiceServicer_to_server(recorder, server)
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    client = UDSTokenizerClient(sock, "org/model")
    body = {
        "messages": [
            {"role": "user", "name": "ann", "content": [
                {"type": "image_url", "image_url": {"url": "data:x"}},
                {"type": "input_audio", "input_audio": {}},
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "42", "reasoning_content": None},
        ],
        "add_special_tokens": True,
    }  # fmt: skip
    try:
        for _ in range(2):
            assert await client.tokenize("chat", body) == [1, 2, 3]
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        unsent = ["messages[].name", "messages[].tool_call_id",
                  "messages[].content[].type=input_audio", "add_special_tokens"]  # fmt: skip
        for field in unsent:
            assert sum(f"no field for a chat request's {field}:" in w for w in warned) == 1
        assert sum("multimodal features" in w for w in warned) == 1
        assert len(warned) == len(unsent) + 1  # a None value is not a field sent
        caplog.clear()
        assert await client.tokenize("chat", CHAT) == [1, 2, 3]  # nothing to say
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
    finally:
        await client.close()
        await server.stop(0)


async def test_the_server_honours_initialize_settings_and_warns_what_it_cannot_answer(
    tok: LocalTokenizer, sock: str, caplog: pytest.LogCaptureFixture
) -> None:
    """InitializeTokenizer's enable_thinking and add_generation_prompt are the model's
    defaults for RenderChatTemplate, as in the sidecar; an assistant-tokens mask and
    multimodal features have no field to answer in, which the server says once."""
    server = TokenizerServer({"tiny": tok})
    await server.start(sock)
    channel = grpc.aio.insecure_channel(f"unix:{sock}")
    stub = pb_grpc.TokenizationServiceStub(channel)  # type: ignore[no-untyped-call]
    probe = "{{ enable_thinking is defined and enable_thinking }}|{{ add_generation_prompt }}"
    turn = pb.ConversationTurn(messages=[pb.ChatMessage(role="user", content="hi")])

    async def render(**fields: Any) -> str:
        request = pb.ChatTemplateRequest(
            model_name="tiny", conversation_turns=[turn], chat_template=probe, **fields
        )
        return str((await stub.RenderChatTemplate(request)).rendered_prompt)

    try:
        assert await render() == "False|False"  # not initialised: the request's own fields
        assert await render(add_generation_prompt=True) == "False|True"
        await stub.InitializeTokenizer(
            pb.InitializeTokenizerRequest(
                model_name="tiny", enable_thinking=True, add_generation_prompt=True
            )
        )
        assert await render() == "True|True"
        kwargs = {"enable_thinking": pb.Value(bool_value=False)}
        assert await render(chat_template_kwargs=kwargs) == "False|True"  # the request wins
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        for _ in range(2):
            await render(return_assistant_tokens_mask=True)
            image = pb.ContentPart(type="image_url", image_url=pb.ImageUrl(url="data:x"))
            answer = await stub.RenderChatCompletion(
                pb.RenderChatCompletionRequest(
                    model_name="tiny",
                    messages=[pb.ChatMessage(role="user", content_parts=[image])],
                )
            )
            assert answer.success and not answer.HasField("features")
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 2
        assert "return_assistant_tokens_mask" in warned[0]
        assert "no multimodal features" in warned[1]
    finally:
        await channel.close()
        await server.stop()


async def test_socket_missing_then_the_service_comes_up(tok: LocalTokenizer, sock: str) -> None:
    client = UDSTokenizerClient(sock, "tiny", timeout=1.0)
    with pytest.raises(TokenizerServiceError, match=f"tokenizer socket {sock} does not exist"):
        await client.encode("hello")
    server = TokenizerServer({"tiny": tok})
    await server.start(sock)
    mode = os.stat(sock).st_mode
    assert stat.S_ISSOCK(mode) and mode & 0o777 == 0o660
    try:
        await _until_up(client, 3.0)  # gRPC reconnects by itself, within a second
        assert await client.tokenize("chat", CHAT) == tok.tokenize_request("chat", CHAT)
        await server.stop()
        with pytest.raises(TokenizerServiceError):
            await client.encode("hello")
        server = TokenizerServer({"tiny": tok})
        await server.start(sock)  # a stale socket file is replaced
        await _until_up(client, 3.0)
    finally:
        await client.close()
        await server.stop()


async def test_a_loading_model_does_not_hold_requests(tok: LocalTokenizer, sock: str) -> None:
    """InitializeTokenizer may download a model: a request waits for it no longer than its
    own deadline, and the load goes on; an unknown model is an error that names it."""
    release = threading.Event()

    def slow_loader(model: str) -> LocalTokenizer:
        if model == "missing":
            raise LookupError("no tokenizer for model 'missing'")
        release.wait(5)
        return tok

    server = TokenizerServer({}, workers=2, loader=slow_loader)
    await server.start(sock)
    client = UDSTokenizerClient(sock, "big", timeout=0.3)
    try:
        with pytest.raises(TokenizerServiceError, match="still loading model 'big'"):
            await client.encode("hello")
        release.set()
        for _ in range(50):
            if "big" in server.tokenizers:
                break
            await asyncio.sleep(0.05)
        assert await client.encode("hello") == tok.encode("hello")
        missing = UDSTokenizerClient(sock, "missing", timeout=1.0)
        with pytest.raises(TokenizerServiceError, match=r"InitializeTokenizer.*'missing'"):
            await missing.encode("hello")
        await missing.close()
    finally:
        release.set()
        await client.close()
        await server.stop()


async def test_models_are_selected_by_name(tok: LocalTokenizer, sock: str) -> None:
    server = TokenizerServer({"a": tok, "b": tok})
    await server.start(sock)
    a, c = UDSTokenizerClient(sock, "a"), UDSTokenizerClient(sock, "c")
    try:
        assert await a.encode("hello") == tok.encode("hello")
        with pytest.raises(TokenizerServiceError, match="no tokenizer for model 'c'"):
            await c.encode("hello")
    finally:
        await a.close()
        await c.close()
        await server.stop()


async def test_tcp_mode(tok: LocalTokenizer) -> None:
    server = TokenizerServer({"tiny": tok})
    await server.start("127.0.0.1:0", use_tcp=True)
    client = UDSTokenizerClient(f"127.0.0.1:{server.port}", "tiny", use_tcp=True)
    try:
        assert await client.encode("hello") == tok.encode("hello")
    finally:
        await client.close()
        await server.stop()


def test_model_names_resolve_as_llm_d_resolves_them() -> None:
    assert uds_model_name("m", {}) == "m"
    mapping: Mapping[str, str] = {"m": "/models/m/tokenizer.json", "n": "/models/n"}
    assert uds_model_name("m", mapping) == "/models/m"
    assert uds_model_name("n", mapping) == "/models/n"
    with pytest.raises(ValueError, match="no entry for model 'x'"):
        uds_model_name("x", mapping)


@pytest.mark.slow
async def test_tokenizer_server_command(model_dir: Path, tok: LocalTokenizer, sock: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "tokenizer-server", "--socket", sock,
        "--model", f"tiny={model_dir}", "--workers", "1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    client = UDSTokenizerClient(sock, "tiny", timeout=2.0)
    try:
        await _until_up(client)
        assert await client.tokenize("chat", CHAT) == tok.tokenize_request("chat", CHAT)
    finally:
        await client.close()
        proc.terminate()
        await proc.wait()
    bad = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "tokenizer-server", "--socket", sock,
        "--model", str(model_dir / "missing"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await bad.communicate()
    assert bad.returncode == 1 and b"no tokenizer for model" in err


@pytest.mark.slow
async def test_load_on_demand_serves_the_models_clients_name(model_dir: Path, sock: str) -> None:
    """`--load-on-demand` with no model, as the llm-d sidecar starts: InitializeTokenizer with
    a directory (what llm-d sends for a modelTokenizerMap entry) loads it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "tokenizer-server", "--socket", sock,
        "--load-on-demand", "--workers", "1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    client = UDSTokenizerClient(sock, str(model_dir), timeout=2.0, init_timeout=10.0)
    try:
        await _until_up(client)
        tok = LocalTokenizer(model_dir / "tokenizer.json")
        assert await client.tokenize("chat", CHAT) == tok.tokenize_request("chat", CHAT)
    finally:
        await client.close()
        proc.terminate()
        await proc.wait()


@pytest.mark.slow
async def test_sim_model_tokenizes_as_the_simulated_pods(sock: str) -> None:
    """`--sim-model NAME`: the simulator's own tokenization, so a gateway's prompt ids (and
    block keys) are those of the `heimdall-proxy sim` pods' KV events."""
    from heimdall_proxy.sim.tokens import BOS, Tokenizer, tokenize

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "tokenizer-server", "--socket", sock,
        "--sim-model", "sim-model", "--workers", "1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    client = UDSTokenizerClient(sock, "sim-model", timeout=2.0)
    sim = Tokenizer()
    chat = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hello wonderful world"},
        ]
    }
    completion = {"prompt": "route these tokens"}
    try:
        await _until_up(client)
        assert await client.tokenize("chat", chat) == sim.prompt("chat", chat).ids
        expected = sim.prompt("completions", completion).ids
        assert await client.tokenize("completions", completion) == expected
        assert await client.encode_with_offsets("route these") == (
            [BOS, *tokenize("route these")],
            [],  # the simulator's tokenizer gives no offsets
        )
        with pytest.raises(TokenizerServiceError, match=r"UNIMPLEMENTED.*renders no template"):
            await client.render_chat_template(chat["messages"])
    finally:
        await client.close()
        proc.terminate()
        await proc.wait()
    bad = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "tokenizer-server", "--socket", sock,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await bad.communicate()
    assert bad.returncode == 1 and b"--sim-model" in err


async def test_the_prefix_cache_pool_config_against_the_server(model_dir: Path, sock: str) -> None:
    """precise-prefix-cache-scorer's tokenizersPoolConfig.uds, as llm-d configures it: the
    modelTokenizerMap entry (a tokenizer.json path) names the model to the service by its
    directory, which a server loading on demand serves."""
    from heimdall_proxy.plugins.precise_prefix.build import build_tokenizer
    from heimdall_proxy.plugins.precise_prefix.params import TokenizersPoolConfig

    cfg = TokenizersPoolConfig.model_validate(
        {
            "modelName": "served/model",
            "uds": {
                "socketFile": sock,
                "modelTokenizerMap": {"served/model": str(model_dir / "tokenizer.json")},
            },
        }
    )
    tokenizer = build_tokenizer(cfg)
    assert isinstance(tokenizer, UDSTokenizerClient) and tokenizer.model == str(model_dir)
    server = TokenizerServer({}, loader=load_model)
    await server.start(sock)
    try:
        tok = LocalTokenizer(model_dir / "tokenizer.json")
        assert await tokenizer.tokenize("chat", CHAT) == tok.tokenize_request("chat", CHAT)
        assert list(server.tokenizers) == [str(model_dir)]
    finally:
        await tokenizer.close()
        await server.stop()
    unmapped = TokenizersPoolConfig.model_validate(
        {"modelName": "other", "uds": {"socketFile": sock, "modelTokenizerMap": {"m": "/x"}}}
    )
    with pytest.raises(ValueError, match="no entry for model 'other'"):
        build_tokenizer(unmapped)
