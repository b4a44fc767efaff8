"""tokenizer prepare-data plugin: feature gate, in-process and UDS modes, failing open, and
token ids reused by the prefix-cache scorer through the gateway."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from heimdall_proxy.config.build import build_plugins
from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import ApproxPrefixCacheProducer
from heimdall_proxy.plugins.requestcontrol.producers.tokenizer import (
    TokenizerParams,
    TokenizerPlugin,
)
from heimdall_proxy.tokenization.local import LocalTokenizer
from heimdall_proxy.tokenization.uds_server import TokenizerServer
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.plugins.helpers import req
from tests.tokenization.model import make_model_dir


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "tiny")


def make(**params: Any) -> TokenizerPlugin:
    return TokenizerPlugin("tokenizer", TokenizerParams.model_validate(params), None)  # type: ignore[arg-type]


def epp(model: str, gates: bool = True, **params: Any) -> dict[str, Any]:
    return {
        "featureGates": ["prepareDataPlugins"] if gates else [],
        "plugins": [
            {"type": "tokenizer", "parameters": {"modelName": model, **params}},
            {
                "type": "prefix-cache-scorer",
                "parameters": {"autoTune": False, "blockSizeTokens": 4},
            },
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {"name": "default", "plugins": [{"pluginRef": "prefix-cache-scorer"}]}
        ],
    }


def build(doc: dict[str, Any]) -> Any:
    cfg = parse_config(doc)
    handle = PluginHandle(EndpointPool([]), frozenset(cfg.epp.feature_gates))
    return build_plugins(cfg.epp, load_builtin_plugins(), handle)


def test_feature_gate_and_validation(model_dir: Path) -> None:
    skipped = build(epp(str(model_dir), gates=False))
    assert "tokenizer" in skipped.skipped and not skipped.prepare_data
    active = build(epp(str(model_dir)))
    assert [p.name for p in active.prepare_data] == ["tokenizer"]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="modelName"):
        build(epp(""))
    with pytest.raises(ConfigError, match="no tokenizer for model"):
        build(epp(str(model_dir / "missing")))
    p = TokenizerParams.model_validate({"modelName": "m", "udsTokenizerConfig": {}})
    assert p.uds_tokenizer_config is not None
    assert p.uds_tokenizer_config.socket_file == "/tmp/tokenizer/tokenizer-uds.socket"


async def test_sets_token_ids_and_fails_open(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plugin = make(modelName=str(model_dir))
    tok = LocalTokenizer(model_dir / "tokenizer.json")
    try:
        r = req("chat", {"messages": [{"role": "user", "content": "hello world"}]})
        await plugin.prepare_data(r, [])
        assert r.token_ids == tok.tokenize_request("chat", r.data)
        pre = req("completions", {"prompt": "hello"})
        pre.token_ids = [42]
        await plugin.prepare_data(pre, [])
        assert pre.token_ids == [42]
        other = req("other", {"input": "hello"})
        await plugin.prepare_data(other, [])
        assert other.token_ids is None
        bad = req("chat", {"messages": [{"role": "wizard", "content": "x"}]})
        with caplog.at_level(logging.WARNING):
            await plugin.prepare_data(bad, [])
        assert bad.token_ids is None and plugin.failures == 1
        assert "untokenized" in caplog.text
    finally:
        await plugin.stop()


async def test_prompts_over_max_prompt_chars_go_on_untokenized(
    model_dir: Path, tmp_path: Path
) -> None:
    local = make(modelName=str(model_dir), maxPromptChars=40)
    # UDS: not even sent (no service listens here: sending would be a failure)
    uds = make(
        modelName="tiny",
        maxPromptChars=40,
        udsTokenizerConfig={"socketFile": str(tmp_path / "none.sock")},
    )
    try:
        for plugin in (local, uds):
            for _ in range(10):
                r = req("chat", {"messages": [{"role": "user", "content": "hello world " * 4}]})
                await plugin.prepare_data(r, [])
                assert r.token_ids is None
            assert (plugin.skipped, plugin.failures) == (10, 0)
            assert plugin.breaker.allow()  # skipped requests are not failures
        short = req("chat", {"messages": [{"role": "user", "content": "hello world"}]})
        await local.prepare_data(short, [])
        assert short.token_ids is not None
    finally:
        await local.stop()
        await uds.stop()


async def test_a_conversations_next_turn_reuses_its_tokens(model_dir: Path) -> None:
    on = make(modelName=str(model_dir))
    off = make(modelName=str(model_dir), conversationCacheBytes=0)
    messages = [{"role": "system", "content": "the gateway is a router " * 300}]
    try:
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn} please " * 50})
            ids = []
            for plugin in (on, off):
                r = req("chat", {"messages": list(messages)})
                await plugin.prepare_data(r, [])
                ids.append(r.token_ids)
            assert ids[0] is not None and ids[0] == ids[1]
            messages.append({"role": "assistant", "content": "the answer is yes " * 40})
        local = [p.tokenizer.tokenizer.conversations for p in (on, off)]  # type: ignore[union-attr]
        assert (local[0].stats.hits, local[0].stats.misses) == (2, 1)
        assert not local[1].enabled and local[1].stats.hits == 0
    finally:
        await on.stop()
        await off.stop()


async def test_uds_mode_and_service_down(model_dir: Path, tmp_path: Path) -> None:
    sock = f"/tmp/hp-tokp-{os.getpid()}-{tmp_path.name[-8:]}.sock"
    plugin = make(modelName="tiny", udsTokenizerConfig={"socketFile": sock})
    tok = LocalTokenizer(model_dir / "tokenizer.json")
    r = req("completions", {"prompt": "hello world"})
    await plugin.prepare_data(r, [])  # nothing listening: fails open
    assert r.token_ids is None and plugin.failures == 1
    server = TokenizerServer({"tiny": tok})
    await server.start(sock)
    try:
        await plugin.prepare_data(r, [])
        assert r.token_ids == tok.encode("hello world")
    finally:
        await plugin.stop()
        await server.stop()
        with contextlib.suppress(FileNotFoundError):  # the server removes it when it stops
            os.unlink(sock)


async def test_prefix_scorer_uses_the_token_ids_through_the_gateway(
    model_dir: Path, start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    pods = [await start_pod() for _ in range(3)]
    gw = await start_gateway(make_config(pods, epp(str(model_dir))))
    scorer = gw.gateway.plugins.plugins["approx-prefix-cache-producer"]
    assert isinstance(scorer, ApproxPrefixCacheProducer)
    words = "the gateway routes every request to a pod with the same prefix " * 8
    async with aiohttp.ClientSession() as http:
        served = []
        for i in range(4):
            body = {"model": "sim-model", "max_tokens": 1, "prompt": f"{words} question {i}"}
            async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                assert r.status == 200
                served.append(r.headers["x-sim-pod"])
        assert len(set(served)) == 1
    tokenized = req("completions", {"prompt": words}, model="sim-model")
    tokenized.token_ids = LocalTokenizer(model_dir / "tokenizer.json").encode(words)
    state = CycleState()
    endpoints = gw.gateway.pool.endpoints()
    info = scorer.match(state, tokenized, endpoints)
    assert info is not None
    assert info.prompt_tokens == len(tokenized.token_ids)
    assert info.matched_blocks == {served[0]: float(len(tokenized.token_ids) // 4)}
    tok_plugin = gw.gateway.plugins.plugins["tokenizer"]
    assert isinstance(tok_plugin, TokenizerPlugin) and tok_plugin.failures == 0
