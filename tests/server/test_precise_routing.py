"""precise-prefix-cache-scorer through the gateway: KV events on real ZMQ sockets move the
routing (stored, removed, cleared, per tier, both wire shapes), replicas sharing a Redis index
route alike, and the simulated vLLM's own events bring a warmed prompt back to its pod."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from heimdall_proxy.config.gateway import GatewayConfig, parse_config
from heimdall_proxy.plugins.precise_prefix.scorer import PrecisePrefixCacheScorer
from heimdall_proxy.plugins.scheduling.scorers.session_affinity import encode_token
from heimdall_proxy.tokenization.local import LocalTokenizer
from tests.conftest import GatewayFactory, PodFactory, RunningGateway, RunningPod, eventually
from tests.kvcache.redisns import REDIS_URL, redis_namespace
from tests.kvcache.vllm_wire import Publisher, batch, cleared, removed, stored, until_live
from tests.tokenization.model import make_model_dir

BS = 4
PROMPT = "hello world the gateway routes every request to the pod with the same prefix " * 3


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "tiny")


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    async with redis_namespace() as prefix:
        yield prefix


def precise_epp(model_dir: Path, block_size: int = BS, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "tokenProcessorConfig": {"blockSize": block_size},
        "indexerConfig": {"tokenizersPoolConfig": {"modelName": str(model_dir), "workersCount": 1}},
        "kvEventsConfig": {"concurrency": 2},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(params.get(key), dict):
            params[key] = {**params[key], **value}
        else:
            params[key] = value
    # session affinity (weight 0.1) breaks ties the way a test says, below any real match
    return {
        "plugins": [
            {"type": "precise-prefix-cache-scorer", "parameters": params},
            {"type": "session-affinity-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "precise-prefix-cache-scorer", "weight": 1},
                    {"pluginRef": "session-affinity-scorer", "weight": 0.1},
                ],
            }
        ],
    }


def config(pods: list[RunningPod], kv: list[str | None], epp: dict[str, Any]) -> GatewayConfig:
    doc = dict(epp)
    doc["endpoints"] = [
        {"name": p.name, "url": p.url, **({"kvEvents": k} if k else {})}
        for p, k in zip(pods, kv, strict=True)
    ]
    return parse_config(doc, "<test>")


def scorer_of(gw: RunningGateway) -> PrecisePrefixCacheScorer:
    plugin = gw.gateway.plugins.plugins["precise-prefix-cache-scorer"]
    assert isinstance(plugin, PrecisePrefixCacheScorer)
    return plugin


async def served_by(
    http: aiohttp.ClientSession, gw: RunningGateway, prompt: Any, tie: str = "pod-0"
) -> str:
    """The pod that served `prompt`; `tie` is the pod preferred when nothing is cached."""
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
    headers = {"x-session-token": encode_token(tie)}
    async with http.post(f"{gw.url}/v1/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return r.headers["x-sim-pod"]


async def applied(gw: RunningGateway, check: Callable[[dict[str, int]], bool]) -> None:
    await eventually(lambda: check(scorer_of(gw).stats.as_dict()))


async def warm(
    http: aiohttp.ClientSession, pod: RunningPod, body: dict[str, Any], seen: Callable[[], bool]
) -> None:
    """Send `body` to `pod` until `seen()` says its KV events arrived. ZMQ subscriptions take
    a moment to be live (a PUB drops what it sends before the SUB joined), so the pod's prefix
    cache is cleared before each retry: the retry really stores (and announces) the blocks
    again."""
    for attempt in range(50):
        if attempt:
            async with http.post(f"{pod.url}/reset_prefix_cache") as r:
                assert r.status == 200
        async with http.post(f"{pod.url}/v1/completions", json=body) as r:
            assert r.status == 200
        with contextlib.suppress(AssertionError):
            await eventually(seen, within=0.5)
            return
    raise AssertionError("the simulated pod's KV events never arrived")


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["map", "array"])
async def test_kv_events_move_the_routing(
    start_pod: PodFactory, start_gateway: GatewayFactory, model_dir: Path,
    ctx: zmq.asyncio.Context, shape: str,
) -> None:  # fmt: skip
    pods = [await start_pod() for _ in range(3)]
    pubs = [Publisher(ctx, replay=False, topic=f"kv@{p.name}@sim-model") for p in pods]
    try:
        gw = await start_gateway(config(pods, [p.endpoint for p in pubs], precise_epp(model_dir)))
        sc = scorer_of(gw)
        for p, pub in zip(pods, pubs, strict=True):
            await until_live(pub, sc.ingest.subscriber.received, p.name)
        tokens = LocalTokenizer(model_dir / "tokenizer.json").encode(PROMPT)
        n = len(tokens) // BS
        full = tokens[: n * BS]
        async with aiohttp.ClientSession() as http:
            assert await served_by(http, gw, PROMPT) == pods[0].name  # nothing cached: a tie

            # pod-2 stores the whole prompt, in two events chained by their parent hash
            half = (n // 2) * BS
            await pubs[2].publish(
                batch([stored(list(range(100, 100 + n // 2)), full[:half], block_size=BS)], shape)
            )
            await pubs[2].publish(batch([stored(list(range(200, 200 + n - n // 2)), full[half:],
                                                parent=100 + n // 2 - 1, block_size=BS)], shape))  # fmt: skip
            await applied(gw, lambda s: s["stored_blocks"] >= n)
            assert await served_by(http, gw, PROMPT) == pods[2].name

            # its first block evicted: the run is broken at the start, back to the tie
            await pubs[2].publish(batch([removed([100])], shape))
            await applied(gw, lambda s: s["removed_blocks"] >= 1)
            assert await served_by(http, gw, PROMPT) == pods[0].name

            # pod-1 holds the whole prompt in CPU memory only, pod-0 half of it on GPU:
            # 0.8 * n beats 0.5 * n
            await pubs[1].publish(
                batch([stored(list(range(300, 300 + n)), full, block_size=BS, medium="CPU")], shape)
            )
            await pubs[0].publish(
                batch([stored(list(range(400, 400 + n // 2)), full[:half], block_size=BS)], shape)
            )
            await applied(gw, lambda s: s["stored_blocks"] >= 2 * n + n // 2)
            assert await served_by(http, gw, PROMPT) == pods[1].name

            # pod-1 resets its prefix cache: pod-0's half wins
            await pubs[1].publish(batch([cleared()], shape))
            await applied(gw, lambda s: s["cleared"] >= 1)
            assert await served_by(http, gw, PROMPT) == pods[0].name
        assert sc.stats.orphan_events == 0 and sc.stats.decode_errors == 0
    finally:
        for pub in pubs:
            await pub.close()


@pytest.mark.slow
async def test_speculative_indexing_routes_a_repeat_before_its_events(
    start_pod: PodFactory, start_gateway: GatewayFactory, model_dir: Path
) -> None:
    pods = [await start_pod() for _ in range(3)]
    epp = precise_epp(model_dir, speculativeIndexing=True, speculativeTTL="300ms",
                      kvEventsConfig={"discoverPods": False})  # fmt: skip
    gw = await start_gateway(config(pods, [None] * 3, epp))
    async with aiohttp.ClientSession() as http:
        # no event ever arrives, but the routing decision itself is remembered for a while
        assert await served_by(http, gw, PROMPT, tie="pod-1") == pods[1].name
        assert await served_by(http, gw, PROMPT, tie="pod-2") == pods[1].name
        assert await served_by(http, gw, "yes no " + PROMPT, tie="pod-2") == pods[2].name
        await asyncio.sleep(0.4)  # expired: only the tie-break is left
        assert await served_by(http, gw, PROMPT, tie="pod-0") == pods[0].name
        assert scorer_of(gw).stats.speculative_blocks > 0


@pytest.mark.slow
async def test_replicas_sharing_a_redis_index_route_alike(
    start_pod: PodFactory, start_gateway: GatewayFactory, model_dir: Path,
    ctx: zmq.asyncio.Context, redis_prefix: str,
) -> None:  # fmt: skip
    pods = [await start_pod() for _ in range(3)]
    pubs = [Publisher(ctx, replay=False, topic=f"kv@{p.name}@sim-model") for p in pods]
    index = {
        "kvBlockIndexConfig": {"redisConfig": {"address": REDIS_URL, "keyPrefix": redis_prefix}}
    }
    try:
        base = precise_epp(model_dir)
        params = base["plugins"][0]["parameters"]
        params["indexerConfig"] = {**params["indexerConfig"], **index}
        # replica A follows the pods' events; replica B follows none and only reads Redis
        gw_a = await start_gateway(config(pods, [p.endpoint for p in pubs], base))
        epp_b = precise_epp(model_dir, kvEventsConfig={"discoverPods": False})
        epp_b["plugins"][0]["parameters"]["indexerConfig"].update(index)
        gw_b = await start_gateway(config(pods, [p.endpoint for p in pubs], epp_b))
        assert scorer_of(gw_b).ingest.subscriber.subscriptions() == {}
        for p, pub in zip(pods, pubs, strict=True):
            await until_live(pub, scorer_of(gw_a).ingest.subscriber.received, p.name)
        tokens = LocalTokenizer(model_dir / "tokenizer.json").encode(PROMPT)
        n = len(tokens) // BS
        await pubs[1].publish(
            batch([stored(list(range(10, 10 + n)), tokens[: n * BS], block_size=BS)])
        )
        await applied(gw_a, lambda s: s["stored_blocks"] >= n)
        async with aiohttp.ClientSession() as http:
            assert await served_by(http, gw_a, PROMPT) == pods[1].name
            assert await served_by(http, gw_b, PROMPT) == pods[1].name
            await pubs[1].publish(batch([removed([10])]))
            await applied(gw_a, lambda s: s["removed_blocks"] >= 1)
            assert await served_by(http, gw_a, PROMPT) == pods[0].name
            assert await served_by(http, gw_b, PROMPT) == pods[0].name
    finally:
        for pub in pubs:
            await pub.close()


@pytest.mark.slow
async def test_the_simulated_pods_own_events_bring_a_prompt_back(
    start_pod: PodFactory, start_gateway: GatewayFactory, model_dir: Path
) -> None:
    pods = [await start_pod(kv_events_port=-1) for _ in range(3)]
    kv = [p.pod.kv_events_endpoint for p in pods]
    assert all(kv)
    gw = await start_gateway(config(pods, kv, precise_epp(model_dir, block_size=16)))
    sc = scorer_of(gw)
    await eventually(lambda: len(sc.ingest.subscriber.subscriptions()) == 3)
    prompt = list(range(5000, 5000 + 16 * 8))  # 8 blocks of token ids
    async with aiohttp.ClientSession() as http:
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
        await warm(http, pods[2], body, lambda: sc.stats.stored_blocks >= 8)
        for _ in range(3):
            assert await served_by(http, gw, prompt) == pods[2].name
        assert await served_by(http, gw, list(range(1, 129))) == pods[0].name  # cold: a tie


@pytest.mark.slow
async def test_a_cache_salt_is_scored_only_against_blocks_of_the_same_salt(
    start_pod: PodFactory, start_gateway: GatewayFactory, model_dir: Path
) -> None:
    """vLLM keeps salted blocks apart (the salt is in the first block's hash), and so does the
    simulator; its events list the salt in `extra_keys`, so a salted prompt warmed on pod-2 is
    routed there for the same salt only: unsalted or differently salted, nothing matches."""
    pods = [await start_pod(kv_events_port=-1) for _ in range(3)]
    kv = [p.pod.kv_events_endpoint for p in pods]
    gw = await start_gateway(config(pods, kv, precise_epp(model_dir, block_size=16)))
    sc = scorer_of(gw)
    await eventually(lambda: len(sc.ingest.subscriber.subscriptions()) == 3)
    prompt = list(range(7000, 7000 + 16 * 8))
    salted = {"model": "sim-model", "prompt": prompt, "max_tokens": 20, "cache_salt": "tenant-a"}
    async with aiohttp.ClientSession() as http:
        await warm(http, pods[2], salted, lambda: sc.stats.stored_blocks >= 8)

        async def pod_for(salt: str | None) -> tuple[str, int]:
            body: dict[str, Any] = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
            if salt is not None:
                body["cache_salt"] = salt
            headers = {"x-session-token": encode_token(pods[0].name)}
            async with http.post(f"{gw.url}/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                usage = (await r.json())["usage"]
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                return r.headers["x-sim-pod"], cached

        served, cached = await pod_for("tenant-a")
        assert served == pods[2].name and cached >= 16 * 7  # all but the last block reused
        # the unsalted and the other tenant's requests are not over-scored: a tie, pod-0
        assert (await pod_for(None))[0] == pods[0].name
        assert (await pod_for("tenant-b"))[0] == pods[0].name
        # and pod-2 would indeed have reused nothing for them
        body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1, "cache_salt": "x"}
        async with http.post(f"{pods[2].url}/v1/completions", json=body) as r:
            details = (await r.json())["usage"].get("prompt_tokens_details") or {}
            assert not details.get("cached_tokens")


def scraped(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.slow
@pytest.mark.parametrize("enabled", [True, False])
async def test_enable_metrics_exports_the_index_families(
    start_pod: PodFactory, start_gateway: GatewayFactory, model_dir: Path,
    ctx: zmq.asyncio.Context, enabled: bool,
) -> None:  # fmt: skip
    pods = [await start_pod() for _ in range(2)]
    pubs = [Publisher(ctx, replay=False, topic=f"kv@{p.name}@sim-model") for p in pods]
    try:
        epp = precise_epp(
            model_dir, indexerConfig={"kvBlockIndexConfig": {"enableMetrics": enabled}}
        )
        gw = await start_gateway(config(pods, [p.endpoint for p in pubs], epp))
        sc = scorer_of(gw)
        for p, pub in zip(pods, pubs, strict=True):
            await until_live(pub, sc.ingest.subscriber.received, p.name)
        tok = LocalTokenizer(model_dir / "tokenizer.json")
        tokens = tok.encode(PROMPT)
        n = len(tokens) // BS
        cold_n = len(tok.encode("yes no " + PROMPT)) // BS
        held = n // 2  # pod-1 holds the first half of the prompt
        await sc.ingest.subscriber.drain()
        probes = sc.stats.batches  # until_live's
        await pubs[1].publish(
            batch([stored(list(range(10, 10 + held)), tokens[: held * BS], block_size=BS)])
        )
        await pubs[1].publish(batch([removed([10 + held - 1])]))  # ...less its last block
        await applied(gw, lambda s: s["removed_blocks"] >= 1)
        async with aiohttp.ClientSession() as http:
            assert await served_by(http, gw, PROMPT) == pods[1].name
            assert await served_by(http, gw, "yes no " + PROMPT) == pods[0].name  # cold
            async with http.get(f"{gw.url}/metrics") as r:
                assert r.status == 200
                got = scraped(await r.text())
        names = {name for name, _ in got}
        if not enabled:
            assert not any(
                name.startswith(("kvcache_index_", "heimdall_kvcache_")) for name in names
            )
            return
        assert got["kvcache_index_admissions_total", ()] == held
        assert got["kvcache_index_evictions_total", ()] == 1
        assert got["kvcache_index_lookup_requests_total", ()] == 2
        assert got["kvcache_index_lookup_key_total", (("result", "hit"),)] == held - 1
        assert got["kvcache_index_lookup_key_total", (("result", "miss"),)] == n + cold_n - (
            held - 1
        )
        assert got["kvcache_index_lookup_latency_seconds_count", ()] == 2
        assert got["kvcache_index_lookup_latency_seconds_bucket", (("le", "+Inf"),)] == 2
        assert got["kvcache_index_lookup_latency_seconds_sum", ()] > 0
        assert got["heimdall_kvcache_feed_total", (("kind", "batches"),)] == probes + 2
        assert got["heimdall_kvcache_feed_total", (("kind", "gaps"),)] == 0
    finally:
        for pub in pubs:
            await pub.close()
