"""prefix-cache-scorer reading an approx-prefix-cache-producer made with the seeds' defaults for
the scorer (as the loader makes one for a seed config): block keys, match info on the
CycleState, index updates, scores."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from heimdall_proxy.config.defaults import SEED_INDEX_DEFAULTS
from heimdall_proxy.framework.prefix import PrefixCacheMatchInfo, prefix_match_reader
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest, RequestContext
from heimdall_proxy.plugins.requestcontrol.producers.approx_prefix import (
    ApproxPrefixCacheProducer,
    ApproxPrefixProducerParams,
    request_text,
)
from heimdall_proxy.plugins.scheduling.scorers.prefix_cache import (
    PrefixCacheParams,
    PrefixCacheScorer,
)
from tests.helpers import ep
from tests.plugins.helpers import ctx, req

PRODUCER = "approx-prefix-cache-producer"
SCORER_PARAMS = {"matchLengthWeight", "matchLengthScaleTokens"}


def read_prefix_match(state: CycleState) -> PrefixCacheMatchInfo | None:
    return prefix_match_reader()(state)


class Scored(ApproxPrefixCacheProducer):
    """The producer and a scorer that reads it, as one object for these tests: score() runs
    the producer first when it has not run for the request, as the director does."""

    def __init__(self, params: dict[str, Any]) -> None:
        index = {k: v for k, v in params.items() if k not in SCORER_PARAMS}
        own = {k: v for k, v in params.items() if k in SCORER_PARAMS}
        p = ApproxPrefixProducerParams.model_validate({**SEED_INDEX_DEFAULTS, **index})
        super().__init__(PRODUCER, p, None)  # type: ignore[arg-type]
        self.scorer = PrefixCacheScorer(
            "prefix-cache-scorer",
            PrefixCacheParams.model_validate(own),
            None,  # type: ignore[arg-type]
        )

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        self.match(state, request, endpoints)
        return self.scorer.score(state, request, endpoints)


LONG = "The quick brown fox jumps over the lazy dog. " * 20  # 900 chars: 14 blocks of 64


def make(**params: object) -> Scored:
    return Scored(params)


def completion(prompt: str, model: str = "m", **extra: object) -> object:
    return req("completions", {"prompt": prompt, **extra}, model=model)


async def route(scorer: Scored, request: object, target: Endpoint) -> None:
    c: RequestContext = ctx(request, target)  # type: ignore[arg-type]
    await scorer.produce(c.state, c.request, [target])
    await scorer.pre_request(c)


def test_defaults_and_validation() -> None:
    p = ApproxPrefixProducerParams()  # llm-d's
    assert (p.auto_tune, p.block_size_tokens, p.block_size) == (True, 16, 0)
    assert (p.max_prefix_blocks_to_match, p.lru_capacity_per_server) == (2048, 31250)
    assert p.max_prefix_tokens_to_match == 131072
    seed = ApproxPrefixProducerParams.model_validate(SEED_INDEX_DEFAULTS)
    assert (seed.max_prefix_blocks_to_match, seed.max_blocks(16)) == (256, 256)
    with pytest.raises(ValidationError, match=r"blockSize .* deprecated"):
        ApproxPrefixProducerParams.model_validate({"blockSize": 64})
    both = ApproxPrefixProducerParams.model_validate({"blockSize": 64, "blockSizeTokens": 8})
    assert both.block_size_tokens == 8
    with pytest.raises(ValidationError):
        ApproxPrefixProducerParams.model_validate({"blockSizeTokens": 0})
    s = PrefixCacheParams()
    assert (s.match_length_weight, s.match_length_scale_tokens) == (0.0, 8192)
    assert s.prefix_match_info_producer_name == ""


async def test_a_routed_prompt_matches_its_pod_only() -> None:
    scorer = make(autoTune=False)
    a, b = ep("a"), ep("b")
    await route(scorer, completion(LONG), a)
    state = CycleState()
    r = completion(LONG)
    scores = scorer.score(state, r, [a, b])
    assert scores == {"a": 1.0, "b": 0.0}
    info = read_prefix_match(state)
    assert isinstance(info, PrefixCacheMatchInfo)
    assert (info.block_size, info.total_blocks) == (16, len(LONG) // 64)
    assert info.has_hit() and info.cached_tokens("a") == 14 * 16 and info.cached_tokens("b") == 0
    assert info.uncached_tokens("b") == r.estimated_tokens()


async def test_a_longer_prompt_scores_the_shared_fraction() -> None:
    scorer = make(autoTune=False)
    a = ep("a")
    await route(scorer, completion(LONG), a)
    longer = LONG + "x" * len(LONG)
    got = scorer.score(CycleState(), completion(longer), [a])["a"]
    assert got == pytest.approx((len(LONG) // 64) / (len(longer) // 64))
    # a prompt that differs in its first block shares nothing
    assert scorer.score(CycleState(), completion("!" + LONG), [a]) == {"a": 0.0}


async def test_model_and_cache_salt_separate_prefixes() -> None:
    scorer = make(autoTune=False)
    a = ep("a")
    await route(scorer, completion(LONG, cache_salt="s1"), a)
    assert scorer.score(CycleState(), completion(LONG, cache_salt="s1"), [a]) == {"a": 1.0}
    assert scorer.score(CycleState(), completion(LONG, cache_salt="s2"), [a]) == {"a": 0.0}
    assert scorer.score(CycleState(), completion(LONG), [a]) == {"a": 0.0}
    assert scorer.score(CycleState(), completion(LONG, model="other", cache_salt="s1"), [a]) == {
        "a": 0.0
    }


async def test_short_prompts_are_ignored() -> None:
    scorer = make(autoTune=False)
    a = ep("a")
    await route(scorer, completion("hi"), a)
    state = CycleState()
    assert scorer.score(state, completion("hi"), [a]) == {"a": 0.0}
    info = read_prefix_match(state)
    assert info is not None and info.total_blocks == 0 and not info.has_hit()


async def test_a_prompt_shorter_than_one_block_records_nothing_and_one_block_does() -> None:
    scorer = make(autoTune=False, blockSizeTokens=4)  # 16 characters per block
    a = ep("a")
    short = completion("x" * 15)
    c = ctx(short, a)
    await scorer.produce(c.state, c.request, [a])
    assert read_prefix_match(c.state) == PrefixCacheMatchInfo(4, 0, 3, {}, [])
    await scorer.pre_request(c)
    assert scorer.index.size("a") == 0
    tokens = completion("ignored")
    tokens.token_ids = [1, 2, 3]  # type: ignore[attr-defined]
    assert scorer.keys(tokens, 4) == []  # type: ignore[arg-type]
    tokens.token_ids = [1, 2, 3, 4]  # type: ignore[attr-defined]
    assert len(scorer.keys(tokens, 4)) == 1  # type: ignore[arg-type]
    await route(scorer, completion("x" * 16), a)
    assert scorer.index.size("a") == 1
    assert scorer.score(CycleState(), completion("x" * 16), [a]) == {"a": 1.0}


def test_auto_tune_takes_the_most_common_block_size_of_a_mixed_pool() -> None:
    scorer = make()
    same = [ep(n, block_size=32) for n in "abc"]
    assert scorer._block_size(same) == 32
    mixed = [ep("a", block_size=32), ep("b", block_size=16), ep("c", block_size=16)]
    assert scorer._block_size(mixed) == 16
    assert scorer._block_size([ep("a", block_size=32), ep("b", block_size=16)]) == 16
    assert scorer._block_size([ep("a"), ep("b", block_size=32)]) == 32
    assert scorer._block_size([ep("a")]) == scorer.params.block_size_tokens


async def test_max_prefix_blocks_and_token_ids() -> None:
    scorer = make(autoTune=False, maxPrefixBlocksToMatch=4, blockSizeTokens=2)
    a = ep("a")
    r = completion("ignored when tokenized")
    r.token_ids = list(range(20))  # type: ignore[attr-defined]
    await route(scorer, r, a)
    again = completion("different text, same tokens")
    again.token_ids = list(range(20))  # type: ignore[attr-defined]
    state = CycleState()
    assert scorer.score(state, again, [a]) == {"a": 1.0}
    info = read_prefix_match(state)
    assert info is not None and (info.total_blocks, info.block_size, info.prompt_tokens) == (
        4,
        2,
        20,
    )


async def test_lru_capacity_per_server_and_auto_tune() -> None:
    fixed = make(autoTune=False, lruCapacityPerServer=5)
    a = ep("a")
    await route(fixed, completion(LONG), a)
    assert fixed.index.size("a") == 5  # only the last 5 of 14 blocks are kept...
    assert fixed.score(CycleState(), completion(LONG), [a]) == {"a": 0.0}  # ...not the first

    tuned = make()  # autoTune: block size and capacity from vllm:cache_config_info
    small = ep("s", block_size=32, num_gpu_blocks=1000)
    await route(tuned, completion(LONG), small)
    state = CycleState()
    assert tuned.score(state, completion(LONG), [small]) == {"s": 1.0}
    info = read_prefix_match(state)
    assert info is not None and info.block_size == 32 and info.total_blocks == len(LONG) // 128
    tiny = ep("t", block_size=32, num_gpu_blocks=2)
    await route(tuned, completion(LONG), tiny)
    assert tuned.index.size("t") == 2


async def test_the_prefill_pod_is_indexed_too() -> None:
    scorer = make(autoTune=False)
    d, p = ep("d"), ep("p")
    c = ctx(completion(LONG), d)
    c.prefill = p
    await scorer.produce(c.state, c.request, [d, p])
    await scorer.pre_request(c)
    assert scorer.score(CycleState(), completion(LONG), [d, p]) == {"d": 1.0, "p": 1.0}


def test_chat_text_is_tagged_by_role() -> None:
    user = req("chat", {"messages": [{"role": "user", "content": "hello"}]})
    system = req("chat", {"messages": [{"role": "system", "content": "hello"}]})
    assert request_text(user) != request_text(system)
    parts = req(
        "chat",
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}
            ]
        },
    )
    assert "a" in request_text(parts) and "image_url" in request_text(parts)
    assert request_text(req("completions", {"prompt": "p"})) == "p"


async def test_multi_turn_chat_extends_the_prefix() -> None:
    scorer = make(autoTune=False)
    a, b = ep("a"), ep("b")
    turn1 = [{"role": "system", "content": LONG}, {"role": "user", "content": "q1"}]
    await route(scorer, req("chat", {"messages": turn1}), a)
    turn2 = [*turn1, {"role": "assistant", "content": "r1"}, {"role": "user", "content": "q2"}]
    got = scorer.score(CycleState(), req("chat", {"messages": turn2}), [a, b])
    assert got["a"] > 0.9 and got["b"] == 0.0


async def test_scores_equal_the_match_ratio_for_every_pod_in_order() -> None:
    # score() walks only the pods that hold something; the result must be what ratio() gives
    # every candidate, keyed in candidate order, a pod outside the candidates left out.
    scorer = make(autoTune=False)
    pods = [ep(f"p{i}") for i in range(40)]
    await route(scorer, completion(LONG), pods[3])
    await route(scorer, completion(LONG[:400]), pods[17])
    await route(scorer, completion(LONG), pods[39])
    candidates = pods[:30]
    state = CycleState()
    scores = scorer.score(state, completion(LONG + "tail" * 50), candidates)
    info = read_prefix_match(state)
    assert isinstance(info, PrefixCacheMatchInfo)
    assert list(scores.items()) == [(e.name, info.ratio(e.name)) for e in candidates]
    assert 0.0 < scores["p17"] < scores["p3"] < 1.0
    assert "p39" not in scores
