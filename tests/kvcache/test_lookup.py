"""PrefixLookup's keys on both sides: LocalLookup keys a request's namespace (model or LoRA
adapter) and cache_salt apart, as its index keyed the events' blocks, so each finds only its
own blocks; ConductorClient keys every request with the one standard hash and leaves the
namespace and the salt to the query."""

from __future__ import annotations

import pytest

from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.kvcache.events import decode_batch
from heimdall_proxy.kvcache.index import InMemoryIndex
from heimdall_proxy.kvcache.index.conductor import ConductorClient
from heimdall_proxy.kvcache.ingest import KVEventIngest
from heimdall_proxy.kvcache.lookup import LocalLookup
from heimdall_proxy.kvcache.subscriber import SubscriberOptions
from tests.helpers import reference_seq_hashes
from tests.kvcache.vllm_wire import batch, stored

BS = 4
MODEL = "m"
TOKENS = list(range(700, 700 + 4 * BS))


async def test_local_keys_find_the_blocks_of_their_own_namespace_and_salt() -> None:
    index = InMemoryIndex(BS)
    lookup = LocalLookup(index, KVEventIngest(index, EndpointPool([]), SubscriberOptions(), MODEL))
    held = {
        "plain": stored([1, 2, 3, 4], TOKENS, block_size=BS),
        "adapter": stored([5, 6, 7, 8], TOKENS, block_size=BS, lora_name="ad"),
        # the salt as newer vLLM lists it: the first block's extra keys, after the adapter
        "salted": stored([9, 10, 11, 12], TOKENS, block_size=BS, lora_name="ad",
                         extra_keys=[["ad", "s"], ["ad"], ["ad"], ["ad"]]),
    }  # fmt: skip
    for pod, event in held.items():
        await lookup.ingest.apply(pod, decode_batch(batch([event])))
    pods = list(held)
    for namespace, salt, holder in ((MODEL, None, "plain"), ("ad", None, "adapter"),
                                    ("ad", "s", "salted")):  # fmt: skip
        keys = lookup.block_keys(TOKENS, namespace, salt)
        assert len(keys) == 4
        assert await lookup.lookup(keys, pods, namespace, salt) == {holder: 4.0}
    assert await lookup.lookup(lookup.block_keys(TOKENS, MODEL, "s"), pods, MODEL, "s") == {}


@pytest.mark.parametrize(("namespace", "salt"), [(MODEL, None), ("ad", None), ("ad", "s")])
def test_conductor_keys_are_the_standard_hash_whatever_the_namespace(
    namespace: str, salt: str | None
) -> None:
    client = ConductorClient("http://127.0.0.1:9", BS, MODEL, 7)
    assert list(client.block_keys(TOKENS, namespace, salt)) == reference_seq_hashes(TOKENS, BS, 7)
