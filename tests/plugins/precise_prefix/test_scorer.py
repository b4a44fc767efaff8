"""precise-prefix-cache-scorer: parameters, tokenizer and index selection, the producer step."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.config.build import build_plugins
from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.prefix import prefix_match_reader
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.kvcache.events import decode_batch
from heimdall_proxy.kvcache.index import CostAwareMemoryIndex, InMemoryIndex, parse_bytes
from heimdall_proxy.kvcache.index.redis import RedisIndex
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.precise_prefix.params import PrecisePrefixCacheParams
from heimdall_proxy.plugins.precise_prefix.scorer import PrecisePrefixCacheScorer
from heimdall_proxy.tokenization import InProcessTokenizer
from heimdall_proxy.tokenization.local import LocalTokenizer
from heimdall_proxy.tokenization.uds import UDSTokenizerClient
from tests.helpers import ep
from tests.kvcache.vllm_wire import batch, removed, stored
from tests.plugins.helpers import req
from tests.tokenization.model import make_model_dir

TYPE = "precise-prefix-cache-scorer"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "tiny")


def params(model: str, **extra: Any) -> dict[str, Any]:
    indexer = {"tokenizersPoolConfig": {"modelName": model}, **extra.pop("indexer", {})}
    return {"tokenProcessorConfig": {"blockSize": 4}, "indexerConfig": indexer, **extra}


def make(model: str, **extra: Any) -> PrecisePrefixCacheScorer:
    p = PrecisePrefixCacheParams.model_validate(params(model, **extra))
    return PrecisePrefixCacheScorer(TYPE, p, PluginHandle(EndpointPool([])))


def build(p: dict[str, Any]) -> Any:
    cfg = parse_config({"plugins": [{"type": TYPE, "parameters": p}]})
    return build_plugins(cfg.epp, load_builtin_plugins(), PluginHandle(EndpointPool([])))


def test_defaults_and_names(model_dir: Path) -> None:
    p = PrecisePrefixCacheParams.model_validate(
        {"indexerConfig": {"tokenizersPoolConfig": {"modelName": "m"}}}
    )
    assert p.token_processor_config.block_size == 16
    assert (p.speculative_indexing, p.speculative_ttl) == (False, 2.0)
    ev = p.kv_events_config
    assert (ev.zmq_endpoint, ev.topic_filter, ev.concurrency, ev.discover_pods) == (
        "",
        "kv@",
        4,
        True,
    )
    assert ev.pod_discovery_config.socket_port == 5557
    pool = p.indexer_config.tokenizers_pool_config
    assert pool.workers_count == 5
    kv = p.indexer_config.kv_block_index_config
    assert (kv.enable_metrics, kv.metrics_logging_interval) == (False, 0.0)
    spelled = PrecisePrefixCacheParams.model_validate(
        params(
            "m",
            speculativeIndexing=True,
            speculativeTTL="500ms",
            indexer={
                "kvBlockIndexConfig": {
                    "valkeyConfig": {"enableRDMA": True},
                    "metricsLoggingInterval": "10s",
                },
            },
        )
    )
    assert spelled.speculative_ttl == 0.5
    valkey = spelled.indexer_config.kv_block_index_config.valkey_config
    assert valkey is not None and valkey.enable_rdma
    assert valkey.address == "redis://127.0.0.1:6379"
    uds = PrecisePrefixCacheParams.model_validate(
        {"indexerConfig": {"tokenizersPoolConfig": {"modelName": "m", "uds": {"useTCP": True}}}}
    ).indexer_config.tokenizers_pool_config.uds
    assert (
        uds is not None and uds.use_tcp and uds.socket_file == "/tmp/tokenizer/tokenizer-uds.socket"
    )


def test_validation(model_dir: Path) -> None:
    with pytest.raises(ValidationError, match="indexerConfig"):
        PrecisePrefixCacheParams.model_validate({})
    with pytest.raises(ValidationError, match="modelName"):
        PrecisePrefixCacheParams.model_validate({"indexerConfig": {"tokenizersPoolConfig": {}}})
    with pytest.raises(ConfigError, match="exactly one index backend, got 2"):
        build(
            params(
                str(model_dir),
                indexer={"kvBlockIndexConfig": {"inMemoryConfig": {}, "redisConfig": {}}},
            )
        )
    with pytest.raises(ConfigError, match="invalid size"):
        build(
            params(
                str(model_dir),
                indexer={"kvBlockIndexConfig": {"costAwareMemoryConfig": {"size": "lots"}}},
            )
        )
    with pytest.raises(ConfigError, match="blockSize"):
        build({**params(str(model_dir)), "tokenProcessorConfig": {"blockSize": 0}})
    with pytest.raises(ConfigError, match="unknown storage tier"):
        build({**params(str(model_dir)), "tierWeights": {"tape": 0.1}})


def test_a_tokenizer_cache_miss_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    p = params("org/not-here", indexer={"tokenizersPoolConfig": {
        "modelName": "org/not-here", "local": {"autoDiscoveryDir": str(tmp_path)},
        "hf": {"tokenizersCacheDir": str(tmp_path / "bin")}}})  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"no tokenizer for model 'org/not-here'.*Hugging Face Hub"
    ):
        build(p)


def test_tokenizer_and_index_selection(
    model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = make(str(model_dir))
    assert isinstance(local.tokenizer, InProcessTokenizer) and isinstance(
        local.index, InMemoryIndex
    )
    mapped = make("org/model", indexer={"tokenizersPoolConfig": {
        "modelName": "org/model", "local": {"modelTokenizerMap": {"org/model": str(model_dir)}}}})  # fmt: skip
    assert isinstance(mapped.tokenizer, InProcessTokenizer)
    discovered = make("tiny", indexer={"tokenizersPoolConfig": {
        "modelName": "tiny", "local": {"autoDiscoveryDir": str(model_dir.parent)}}})  # fmt: skip
    assert isinstance(discovered.tokenizer, InProcessTokenizer)
    uds = make("m", indexer={"tokenizersPoolConfig": {
        "modelName": "m", "uds": {"socketFile": "/tmp/x.sock", "modelTokenizerMap": {"m": "served-m"}}}})  # fmt: skip
    assert isinstance(uds.tokenizer, UDSTokenizerClient) and uds.tokenizer.model == "served-m"
    cost = make(
        str(model_dir), indexer={"kvBlockIndexConfig": {"costAwareMemoryConfig": {"size": "64MiB"}}}
    )
    assert isinstance(cost.index, CostAwareMemoryIndex) and cost.index.max_bytes == parse_bytes(
        "64MiB"
    )
    mem = make(
        str(model_dir),
        indexer={"kvBlockIndexConfig": {"inMemoryConfig": {"size": 1000, "podCacheSize": 3}}},
    )
    assert isinstance(mem.index, InMemoryIndex) and (
        mem.index.max_keys,
        mem.index.pod_cache_size,
    ) == (1000, 3)
    red = make(
        str(model_dir),
        indexer={"kvBlockIndexConfig": {"valkeyConfig": {"address": "valkey://h:7"}}},
    )
    assert isinstance(red.index, RedisIndex) and red.index.address == "redis://h:7"
    assert red.index.backend_type == "valkey"
    with caplog.at_level(logging.WARNING):
        build(params(str(model_dir), kvEventsConfig={"podDiscoveryConfig": {"oops": 1}}))
    assert "unknown parameters kvEventsConfig.podDiscoveryConfig.oops" in caplog.text


async def test_produce_looks_up_and_publishes_the_match(model_dir: Path) -> None:
    scorer = make(str(model_dir))
    scorer.ingest.ready = True  # not started: no subscription, the index is fed directly
    tok = LocalTokenizer(model_dir / "tokenizer.json")
    body = {"prompt": "hello world the gateway routes every request to a pod"}
    tokens = tok.tokenize_request("completions", body)
    n = len(tokens) // 4
    await scorer.ingest.apply(
        "a", decode_batch(batch([stored(list(range(n)), tokens[: n * 4], block_size=4)]))
    )
    await scorer.ingest.apply(
        "b", decode_batch(batch([stored([100, 101], tokens[:8], block_size=4)]))
    )
    a, b, c = ep("a"), ep("b"), ep("c")
    r = req("completions", body, model="base")
    state = CycleState()
    await scorer.produce(state, r, [a, b, c])
    assert r.token_ids == tokens  # left on the request for later plugins
    info = prefix_match_reader("", TYPE, TYPE)(state)
    assert info is not None and (info.block_size, info.total_blocks, info.prompt_tokens) == (
        4,
        n,
        len(tokens),
    )
    assert scorer.score(state, r, [a, b, c]) == pytest.approx({"a": 1.0, "b": 2 / n, "c": 0.0})
    await scorer.ingest.apply("a", decode_batch(batch([removed([0])])))
    state = CycleState()
    await scorer.produce(state, r, [a, b, c])
    assert scorer.score(state, r, [a, b, c]) == pytest.approx({"a": 0.0, "b": 2 / n, "c": 0.0})
    # an adapter's blocks are keyed by its name: only requests for that adapter match them
    lora_pod = ep("l")
    lora_pod.model_cards = {
        "base": {"id": "base", "parent": None},
        "ad": {"id": "ad", "parent": "base"},
    }
    await scorer.ingest.apply(
        "l", decode_batch(batch([stored([7, 8], tokens[:8], block_size=4, lora_name="ad")]))
    )
    for model, expected in (("ad", 2 / n), ("base", 0.0)):
        state = CycleState()
        await scorer.produce(state, req("completions", body, model=model), [lora_pod])
        assert scorer.score(state, req(), [lora_pod])["l"] == pytest.approx(expected)


async def test_untokenizable_requests_score_zero(model_dir: Path) -> None:
    scorer = make(str(model_dir))
    scorer.ingest.ready = True
    state = CycleState()
    r = req("chat", {"messages": [{"role": "wizard", "content": "x"}]})
    await scorer.produce(state, r, [ep("a")])
    assert r.token_ids is None
    assert scorer.score(state, r, [ep("a")]) == {"a": 0.0}


async def test_prompts_over_max_prompt_chars_are_not_tokenized(model_dir: Path) -> None:
    pool = {"modelName": str(model_dir), "maxPromptChars": 40}
    scorer = make(str(model_dir), indexer={"tokenizersPoolConfig": pool})
    scorer.ingest.ready = True
    try:
        for _ in range(10):  # never a failure: the breaker stays closed
            state = CycleState()
            r = req("completions", {"prompt": "hello world " * 4})  # 48 characters
            await scorer.produce(state, r, [ep("a")])
            assert r.token_ids is None
            assert scorer.score(state, r, [ep("a")]) == {"a": 0.0}
        assert scorer.skipped == 10
        short = req("completions", {"prompt": "hello world " * 3})
        await scorer.produce(CycleState(), short, [ep("a")])
        assert short.token_ids is not None and len(short.token_ids) == 7
    finally:
        await scorer.tokenizer.close()


async def test_metrics_are_logged_and_an_unreachable_index_fails_open(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scorer = make(
        str(model_dir),
        indexer={"kvBlockIndexConfig": {"enableMetrics": True, "metricsLoggingInterval": "50ms"}},
        kvEventsConfig={"discoverPods": False},
    )
    with caplog.at_level(logging.INFO, logger="heimdall_proxy.plugins.precise_prefix.producer"):
        await scorer.start()
        try:
            assert scorer.ready
            await asyncio.sleep(0.12)
        finally:
            await scorer.stop()
    assert "KV-cache index metrics" in caplog.text
    down = make(
        str(model_dir),
        indexer={"kvBlockIndexConfig": {"redisConfig": {"address": "redis://127.0.0.1:1"}}},
        kvEventsConfig={"discoverPods": False},
    )
    await down.start()  # does not raise: routes without the index, retries in the background
    try:
        assert not down.ready
        state = CycleState()
        r = req("completions", {"prompt": "hello world the gateway routes"})
        await down.produce(state, r, [ep("a")])
        assert down.score(state, r, [ep("a")]) == {"a": 0.0}
    finally:
        await down.stop()


def test_a_misspelt_nested_parameter_is_warned_once(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = params(str(model_dir), indexer={"kvBlockIndexConfig": {"inMemoryConfig": {"sizee": 5}}})
    with caplog.at_level(logging.WARNING):
        build(p)
    warned = [r for r in caplog.records if "sizee" in r.getMessage()]
    assert len(warned) == 1
    assert "indexerConfig.kvBlockIndexConfig.inMemoryConfig.sizee" in warned[0].getMessage()


def test_unhonoured_parameters_are_warned_once_each(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = params(
        str(model_dir),
        indexer={
            "tokenizersPoolConfig": {
                "modelName": str(model_dir),
                "hf": {"huggingFaceToken": "hf_x", "tokenizer": "org/tok"},
            },
            "kvBlockIndexConfig": {"redisConfig": {"enableRDMA": True}},
        },
        kvEventsConfig={"podDiscoveryConfig": {"podNamespace": "llm"}},
    )
    with caplog.at_level(logging.WARNING):
        build(p)
    warned = [r.getMessage() for r in caplog.records if "not honoured" in r.getMessage()]
    assert len(warned) == 2, warned  # the token and hf.tokenizer are honoured (Hub client)
    for name in ("enableRDMA", "podNamespace"):
        assert sum(name in w for w in warned) == 1, name
    assert "hf_x" not in caplog.text  # the token itself is never logged


def test_a_tokenizer_mode_nothing_implements_is_a_config_error(model_dir: Path) -> None:
    p = params(
        str(model_dir),
        indexer={
            "tokenizersPoolConfig": {
                "modelName": str(model_dir),
                "local": {"tokenizerMode": "deepseek_v32"},
            }
        },
    )
    with pytest.raises(ConfigError, match="tokenizerMode 'deepseek_v32' is not supported"):
        build(p)
