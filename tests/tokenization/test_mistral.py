"""tokenizerMode mistral: prompt ids through mistral-common, as vLLM's mistral mode, from the
tokenizer files mistral-common itself ships (tekken and SentencePiece; no Hub access), found
in a model directory or a prepared Hugging Face cache (HF_HUB_OFFLINE=1, tests/conftest.py);
modes nothing here implements are config errors naming the mode."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mistral_common
import pytest

from heimdall_proxy.config.build import build_plugins
from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.precise_prefix.scorer import PrecisePrefixCacheScorer
from heimdall_proxy.tokenization.mistral import MistralRequestTokenizer, mistral_file
from heimdall_proxy.tokenization.uds import UDSTokenizerClient
from heimdall_proxy.tokenization.uds_wire import TokenizerServiceError
from tests.helpers import hub_cache

DATA = Path(mistral_common.__file__).parent / "data"
TEKKEN = DATA / "tekken_240911.json"  # a tekken tokenizer (v3), as Mistral models ship
SPM = DATA / "mistral_instruct_tokenizer_240323.model.v3"  # a SentencePiece one
BOS, INST, END_INST = 1, 3, 4  # the control tokens of both files
CHAT = {"messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": "hello world"}]}  # fmt: skip


@pytest.fixture(scope="module")
def tekken() -> MistralRequestTokenizer:
    return MistralRequestTokenizer(TEKKEN)


@pytest.mark.slow
def test_completions_and_chat_are_encoded_as_vllms_mistral_mode(
    tekken: MistralRequestTokenizer,
) -> None:
    words = tekken.encode("hello world", add_special_tokens=False)
    assert words and BOS not in words
    assert tekken.tokenize_request("completions", {"prompt": "hello world"}) == [BOS, *words]
    body = {"prompt": "hello world", "add_special_tokens": False}
    assert tekken.tokenize_request("completions", body) == words
    assert tekken.tokenize_request("completions", {"prompt": [7, 8]}) == [7, 8]
    chat = tekken.tokenize_request("chat", CHAT)
    # [BOS] [INST] system + user text [/INST]: no Jinja template, the conversation encoded
    assert chat[:2] == [BOS, INST] and chat[-1] == END_INST
    other = {"messages": [*CHAT["messages"][:1], {"role": "user", "content": "hello there"}]}
    assert tekken.tokenize_request("chat", other)[:3] == chat[:3] != chat
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert tekken.tokenize_request("chat", {**CHAT, "tools": tools}) != chat
    responses = {"instructions": "be brief", "input": "hello world"}
    assert tekken.tokenize_request("responses", responses) == chat
    with pytest.raises(ValueError, match="chat_template is not supported"):
        tekken.tokenize_request("chat", {**CHAT, "chat_template": "{{ 1 }}"})


def test_a_model_directory_gives_its_tekken_file_or_newest_sentencepiece_file(
    tmp_path: Path,
) -> None:
    spm_dir = tmp_path / "spm"
    spm_dir.mkdir()
    shutil.copy(SPM, spm_dir / "tokenizer.model.v3")
    (spm_dir / "tokenizer.model.v1").write_bytes(b"older")
    assert mistral_file(spm_dir) == spm_dir / "tokenizer.model.v3"
    shutil.copy(TEKKEN, spm_dir / "tekken.json")
    assert mistral_file(spm_dir) == spm_dir / "tekken.json"
    assert mistral_file(tmp_path / "none") is None
    spm = MistralRequestTokenizer(SPM)
    assert spm.tokenize_request("chat", CHAT)[:2] == [BOS, INST]


def build(pool: dict[str, Any]) -> Any:
    doc = {
        "plugins": [
            {
                "type": "precise-prefix-cache-scorer",
                "parameters": {"indexerConfig": {"tokenizersPoolConfig": pool}},
            }
        ]
    }
    cfg = parse_config(doc, "<test>")
    return build_plugins(cfg.epp, load_builtin_plugins(), PluginHandle(EndpointPool([])))


def scorer_from_hub_cache(
    tmp_path: Path, repo: str, data: Path, name: str
) -> PrecisePrefixCacheScorer:
    """A precise scorer in mistral mode whose only tokenizer file is `name` of `repo` in a
    prepared Hugging Face cache (no local discovery, the Hub offline)."""
    hub_cache(tmp_path / "cache", repo, data, name=name)
    plugins = build(
        {
            "modelName": repo,
            "hf": {"tokenizerMode": "mistral", "tokenizersCacheDir": str(tmp_path / "cache")},
            "local": {"autoDiscoveryDir": str(tmp_path / "none")},
        }
    )
    scorer = plugins.plugins["precise-prefix-cache-scorer"]
    assert isinstance(scorer, PrecisePrefixCacheScorer)
    return scorer


@pytest.mark.slow
async def test_the_precise_scorer_reads_a_mistral_model_from_a_prepared_hub_cache(
    tmp_path: Path, tekken: MistralRequestTokenizer
) -> None:
    scorer = scorer_from_hub_cache(tmp_path, "mistralai/Tiny", TEKKEN, "tekken.json")
    try:
        assert await scorer.tokenizer.tokenize("chat", CHAT) == tekken.tokenize_request(
            "chat", CHAT
        )
    finally:
        await scorer.tokenizer.close()


async def test_a_sentencepiece_only_repository_is_read_from_the_hub_cache(tmp_path: Path) -> None:
    """Mistral-7B-Instruct-v0.3 ships tokenizer.model.v3 and no tekken.json: the Hub's client
    (offline here) finds it among the repository's Mistral tokenizer files."""
    scorer = scorer_from_hub_cache(tmp_path, "mistralai/Spm", SPM, "tokenizer.model.v3")
    try:
        expected = MistralRequestTokenizer(SPM).tokenize_request("chat", CHAT)
        assert await scorer.tokenizer.tokenize("chat", CHAT) == expected
    finally:
        await scorer.tokenizer.close()
    with pytest.raises(ConfigError, match="the Hugging Face Hub has none either"):
        build({"modelName": "mistralai/Missing", "hf": {"tokenizerMode": "mistral",
               "tokenizersCacheDir": str(tmp_path / "cache")}})  # fmt: skip


@pytest.mark.parametrize("mode", ["slow", "deepseek_v32"])
def test_modes_nothing_here_implements_are_config_errors_naming_the_mode(
    tmp_path: Path, mode: str
) -> None:
    with pytest.raises(ConfigError, match=f"tokenizerMode '{mode}' is not supported"):
        build({"modelName": str(tmp_path), "local": {"tokenizerMode": mode}})


def test_local_and_hf_modes_must_agree(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="disagree"):
        build(
            {
                "modelName": str(tmp_path),
                "local": {"tokenizerMode": "mistral"},
                "hf": {"tokenizerMode": "hf"},
            }
        )


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[str]:
    path = Path("/tmp") / f"hp-mistral-{os.getpid()}-{tmp_path.name[-8:]}.sock"  # AF_UNIX: short
    yield str(path)
    path.unlink(missing_ok=True)


@pytest.mark.slow
async def test_the_tokenizer_server_serves_a_mistral_model(
    tmp_path: Path, sock: str, tekken: MistralRequestTokenizer
) -> None:
    """`tokenizer-server --mistral-model`: an llm-d EPP in front of Mistral pods gets the ids
    those pods compute, over the sidecar's protocol."""
    model = tmp_path / "mistral"
    model.mkdir()
    shutil.copy(TEKKEN, model / "tekken.json")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "heimdall_proxy", "tokenizer-server", "--socket", sock,
        "--mistral-model", f"mistral-tiny={model}", "--workers", "1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    client = UDSTokenizerClient(sock, "mistral-tiny", timeout=2.0)
    try:
        for _ in range(200):  # until the server is up (it loads the tokenizer first)
            try:
                await client.encode("hi")
                break
            except TokenizerServiceError:
                await asyncio.sleep(0.05)
        assert await client.tokenize("chat", CHAT) == tekken.tokenize_request("chat", CHAT)
        completion = {"prompt": "hello world"}
        assert await client.tokenize("completions", completion) == tekken.tokenize_request(
            "completions", completion
        )
    finally:
        await client.close()
        proc.terminate()
        await proc.wait()
