"""The tokenizer service on a Unix socket: protocol, pipelining, errors, reconnects, CLI."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from heimdall_proxy.tokenization.local import LocalTokenizer
from heimdall_proxy.tokenization.uds import (
    TokenizerServer,
    TokenizerServiceError,
    UDSTokenizerClient,
    encode_frame,
    read_frame,
)

CHAT = {"messages": [{"role": "user", "content": "hello world"}]}


@pytest.fixture
def sock(tmp_path: Path) -> str:
    # AF_UNIX paths are limited to ~100 bytes: keep it short
    path = Path("/tmp") / f"hp-tok-{os.getpid()}-{tmp_path.name[-12:]}.sock"
    yield str(path)
    path.unlink(missing_ok=True)


async def test_round_trip_and_pipelining(tok: LocalTokenizer, sock: str) -> None:
    server = TokenizerServer({"tiny": tok}, workers=2)
    await server.start(sock)
    client = UDSTokenizerClient(sock, "tiny")
    try:
        got = await client.tokenize("chat", CHAT)
        assert got == tok.tokenize_request("chat", CHAT)
        assert await client.encode("hello", add_special_tokens=False) == tok.encode("hello", False)
        prompts = [f"hello {i} world" for i in range(20)]
        many = await asyncio.gather(
            *(client.tokenize("completions", {"prompt": p}) for p in prompts)
        )
        assert many == [tok.encode(p) for p in prompts]
        with pytest.raises(TokenizerServiceError, match=r"messages must be"):
            await client.tokenize("chat", {"messages": "nope"})
        assert (await client.call({"op": "ping"}))["ok"] is True
        with pytest.raises(TokenizerServiceError, match="unknown op"):
            await client.call({"op": "dance"})
    finally:
        await client.close()
        await server.stop()


async def test_models_are_selected_by_name(tok: LocalTokenizer, sock: str) -> None:
    server = TokenizerServer({"a": tok, "b": tok})
    await server.start(sock)
    try:
        assert await UDSTokenizerClient(sock, "a").encode("hello")
        with pytest.raises(TokenizerServiceError, match="no tokenizer for model 'c'"):
            await UDSTokenizerClient(sock, "c").encode("hello")
    finally:
        await server.stop()


async def test_unreachable_then_reconnects(tok: LocalTokenizer, sock: str) -> None:
    client = UDSTokenizerClient(sock, "tiny", timeout=1.0)
    with pytest.raises(TokenizerServiceError, match="cannot reach"):
        await client.encode("hello")
    server = TokenizerServer({"tiny": tok})
    await server.start(sock)
    assert await client.encode("hello") == tok.encode("hello")
    await server.stop()
    with pytest.raises(TokenizerServiceError):
        await client.encode("hello")
    server = TokenizerServer({"tiny": tok})
    await server.start(sock)
    try:
        assert await client.encode("hello") == tok.encode("hello")
    finally:
        await client.close()
        await server.stop()


async def test_raw_frames(tok: LocalTokenizer, sock: str) -> None:
    server = TokenizerServer({"tiny": tok})
    await server.start(sock)
    try:
        reader, writer = await asyncio.open_unix_connection(sock)
        writer.write(encode_frame({"id": 7, "op": "encode", "text": "hello"}))
        writer.write(encode_frame({"id": 8, "op": "tokenize", "api": "chat", "body": CHAT}))
        answers = {m["id"]: m for m in [await read_frame(reader), await read_frame(reader)]}
        assert answers[7]["token_ids"] == tok.encode("hello")
        assert answers[8]["token_ids"] == tok.tokenize_request("chat", CHAT)
        writer.write(b"\xff\xff\xff\xff")  # a frame over the limit closes the connection
        with pytest.raises(asyncio.IncompleteReadError):
            await read_frame(reader)
        writer.close()
    finally:
        await server.stop()


async def test_tcp_mode(tok: LocalTokenizer) -> None:
    server = TokenizerServer({"tiny": tok})
    await server.start("127.0.0.1:0", use_tcp=True)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    client = UDSTokenizerClient(f"127.0.0.1:{port}", "tiny", use_tcp=True)
    try:
        assert await client.encode("hello") == tok.encode("hello")
    finally:
        await client.close()
        await server.stop()


async def test_tokenizer_server_command(model_dir: Path, tok: LocalTokenizer, sock: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "tokenizer-server", "--socket", sock,
        "--model", f"tiny={model_dir}", "--workers", "1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    client = UDSTokenizerClient(sock, "tiny", timeout=2.0)
    try:
        for _ in range(200):
            try:
                assert await client.tokenize("chat", CHAT) == tok.tokenize_request("chat", CHAT)
                break
            except TokenizerServiceError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the tokenizer server did not come up")
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
        for _ in range(200):
            try:
                assert await client.tokenize("chat", chat) == sim.prompt("chat", chat).ids
                break
            except TokenizerServiceError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the tokenizer server did not come up")
        expected = sim.prompt("completions", completion).ids
        assert await client.tokenize("completions", completion) == expected
        assert await client.encode("route these") == [BOS, *tokenize("route these")]
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
