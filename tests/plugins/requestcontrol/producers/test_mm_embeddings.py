"""mm-embeddings-cache-producer: the media items of a request, matched against what each pod
was recently sent (per-pod LRU sized from cacheSizeInMBPerServer), recorded for the chosen
pod after scheduling; its metrics; a departed pod forgotten."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from heimdall_proxy.framework.encoder_cache import EncoderCacheMatchInfo
from heimdall_proxy.framework.types import CycleState, InferenceRequest
from heimdall_proxy.plugins.requestcontrol.producers.mm_embeddings import (
    MMEmbeddingsCacheProducer,
    MMEmbeddingsParams,
    media_items,
)
from tests.conftest import GatewayFactory, PodFactory, make_config
from tests.helpers import ep
from tests.plugins.helpers import ctx, ledger, req

CAT = "https://example.com/cat.png"
DOG = "data:image/png;base64,AAAA"
CLIP = {"data": "UklGRg==", "format": "wav"}


def chat(*parts: dict[str, Any]) -> InferenceRequest:
    content = [{"type": "text", "text": "what is this?"}, *parts]
    return req("chat", {"messages": [{"role": "user", "content": content}]})


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def producer(**params: Any) -> MMEmbeddingsCacheProducer:
    p = MMEmbeddingsParams.model_validate(params)
    return MMEmbeddingsCacheProducer("mm-embeddings-cache-producer", p, ledger())


def test_items_are_distinct_content_hashes_with_modality() -> None:
    items = media_items(
        chat(image(CAT), image(CAT), image(DOG), {"type": "input_audio", "input_audio": CLIP})
    )
    assert [i.modality for i in items] == ["image", "image", "audio"]
    assert len({i.hash for i in items}) == 3
    assert media_items(chat(image(CAT)))[0] == items[0]  # same bytes, same item
    assert media_items(req("chat", {"messages": [{"role": "user", "content": "text only"}]})) == ()


def test_capacity_follows_llm_ds_sizing() -> None:
    assert MMEmbeddingsParams().capacity() == 2048  # 4096 MiB / 2 MiB
    assert MMEmbeddingsParams(cache_size_in_mb_per_server=2048).capacity() == 1024
    assert MMEmbeddingsParams(cache_size_in_mb_per_server=0).capacity() == 2048
    assert MMEmbeddingsParams(cache_size_in_mb_per_server=1).capacity() == 1


async def test_match_follows_where_items_were_sent() -> None:
    plugin = producer()
    a, b = ep("a"), ep("b")
    first = chat(image(CAT), image(DOG))
    state = CycleState()
    await plugin.produce(state, first, [a, b])
    info = state[plugin.state_key]
    assert isinstance(info, EncoderCacheMatchInfo) and info.matched == {}
    c = ctx(first, a)
    c.state = state
    await plugin.pre_request(c)  # sent to a: a now holds both
    second = chat(image(CAT), image("https://example.com/new.png"))
    state2 = CycleState()
    await plugin.produce(state2, second, [a, b])
    info2 = state2[plugin.state_key]
    assert info2.ratio("a") == 0.5 and info2.ratio("b") == 0.0
    # metrics: one lookup per item, a hit per pod holding it, a ratio per candidate
    queries = {s.labels["modality"]: s.value for s in plugin.queries.collect().samples}
    assert queries == {"image": 4.0}
    hits = [s for s in plugin.hits.collect().samples if s.name.endswith("_total")]
    assert [(s.labels["pod"], s.value) for s in hits] == [("a", 1.0)]
    count = [s for s in plugin.hit_ratio.collect().samples if s.name.endswith("_count")]
    assert count[0].value == 4.0


async def test_lru_evicts_per_pod_and_a_departed_pod_is_forgotten() -> None:
    plugin = producer(cacheSizeInMBPerServer=4)  # 2 items a pod
    a = ep("a")
    for url in ("u1", "u2", "u3"):
        r = chat(image(url))
        c = ctx(r, a)
        await plugin.produce(c.state, r, [a])
        await plugin.pre_request(c)
    held = plugin.caches["a"]
    assert len(held) == 2 and media_items(chat(image("u1")))[0].hash not in held
    plugin.endpoint_changed(a, removed=True)
    assert "a" not in plugin.caches


@pytest.mark.parametrize("content", ["text", [{"type": "text", "text": "t"}]])
async def test_a_request_without_media_leaves_nothing(content: Any) -> None:
    plugin = producer()
    state = CycleState()
    await plugin.produce(
        state, req("chat", {"messages": [{"role": "user", "content": content}]}), [ep("a")]
    )
    assert plugin.state_key not in state


async def test_through_a_gateway_the_same_image_goes_where_it_went(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    epp = {
        "plugins": [
            {"type": "mm-embeddings-cache-producer"},
            {"type": "mm-embeddings-cache-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "mm-embeddings-cache-scorer", "weight": 4},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    }
    pods = [await start_pod(), await start_pod()]
    gw = await start_gateway(make_config(pods, epp))
    served = []
    async with aiohttp.ClientSession() as http:
        for url in (CAT, CAT, CAT, DOG, DOG):
            messages = [
                {"role": "user", "content": [{"type": "text", "text": "what?"}, image(url)]}
            ]
            body = {"model": "sim-model", "messages": messages, "max_tokens": 1}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                served.append(r.headers["x-sim-pod"])
                await r.read()
    assert served[0] == served[1] == served[2]
    assert served[3] == served[4]
