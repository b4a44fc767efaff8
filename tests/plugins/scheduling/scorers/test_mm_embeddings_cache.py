"""mm-embeddings-cache-scorer: matched over total media items of the request, per pod (the
README's formula); 0 everywhere without media or without the producer's match."""

from __future__ import annotations

from heimdall_proxy.framework.encoder_cache import EncoderCacheMatchInfo, MMItem, match_key
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.scorers.mm_embeddings_cache import (
    MMEmbeddingsCacheScorer,
    MMEmbeddingsScorerParams,
)
from tests.helpers import ep
from tests.plugins.helpers import ledger, req

ITEMS = (MMItem("h1", "image"), MMItem("h2", "image"), MMItem("h3", "video"), MMItem("h4", "audio"))


def scorer(producer: str = "") -> MMEmbeddingsCacheScorer:
    params = MMEmbeddingsScorerParams(producer_name=producer)
    return MMEmbeddingsCacheScorer("mm-embeddings-cache-scorer", params, ledger())


def test_score_is_the_share_of_items_held() -> None:
    state = CycleState()
    state[match_key("mm-embeddings-cache-producer")] = EncoderCacheMatchInfo(
        ITEMS, {"a": ITEMS[:3], "b": ITEMS[:1]}
    )
    pods = [ep("a"), ep("b"), ep("c")]
    assert scorer().score(state, req(), pods) == {"a": 0.75, "b": 0.25, "c": 0.0}


def test_named_producer_and_missing_match() -> None:
    state = CycleState()
    state[match_key("mine")] = EncoderCacheMatchInfo(ITEMS[:2], {"a": ITEMS[:2]})
    assert scorer("mine").score(state, req(), [ep("a")]) == {"a": 1.0}
    assert scorer().score(state, req(), [ep("a")]) == {}  # the default producer did not run
    empty = CycleState()
    empty[match_key("mine")] = EncoderCacheMatchInfo((), {})
    assert scorer("mine").score(empty, req(), [ep("a")]) == {"a": 0.0}
