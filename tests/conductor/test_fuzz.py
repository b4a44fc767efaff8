"""Property-based fuzzing of what clients and publishers send the conductor: any JSON body
is parsed or refused with a 4xx ApiError, any standardized event map becomes an event or a
ValueError, any message bytes a batch or an EventDecodeError; nothing else escapes."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from heimdall_proxy.conductor.api import (
    ApiError,
    parse_query,
    parse_register,
    parse_unregister,
)
from heimdall_proxy.conductor.model import Registration
from heimdall_proxy.conductor.mooncake import MooncakeState, from_mooncake
from heimdall_proxy.conductor.standard import decode_standard, to_event
from heimdall_proxy.kvcache.events import EventDecodeError
from tests.fuzz.test_fuzz_inputs import FUZZ, json_values

REG = Registration("tcp://h:1", None, "Standard", "m", "", "default", "i", 16, 0, "")
api_fields = st.sampled_from(
    ["endpoint", "replay_endpoint", "type", "modelname", "lora_name", "lora_id", "tenant_id",
     "instance_id", "block_size", "dp_rank", "additionalsalt", "model", "token_ids",
     "seq_hashes", "block_hash", "cache_salt"]
)  # fmt: skip
event_fields = st.sampled_from(
    ["event_id", "timestamp", "event_type", "model_name", "block_size", "additional_salt",
     "lora_name", "tenant_id", "backend_id", "medium", "dp_rank", "seq_hashes",
     "base_block_idx", "parent_hash", "token_ids"]
)  # fmt: skip
values = json_values | st.sampled_from(["stored", "removed", "cleared", "vLLM", "Standard"])


@pytest.mark.slow
@FUZZ
@given(st.dictionaries(api_fields | st.text(max_size=6), values, max_size=10), st.booleans())
def test_any_body_is_parsed_or_refused_with_a_4xx(body: dict[str, Any], by_hash: bool) -> None:
    for parse in (
        parse_register,
        parse_unregister,
        lambda b: parse_query(b, by_hash, 1000, 100),
    ):
        refused: ApiError | None = None
        try:
            parse(body)
        except ApiError as exc:
            refused = exc
        assert refused is None or (400 <= refused.status < 500 and refused.message)


@pytest.mark.slow
@FUZZ
@given(st.dictionaries(event_fields, values, max_size=12))
def test_any_event_map_is_an_event_or_a_value_error(raw: dict[str, Any]) -> None:
    try:
        event, order = to_event(REG, raw)
    except ValueError:
        return
    assert event.stream.backend_id == "i" and order.namespace == event.stream.namespace


@pytest.mark.slow
@FUZZ
@given(st.binary(max_size=64) | values.map(lambda v: msgpack.packb(v, use_bin_type=True)))
def test_any_message_is_a_batch_or_a_decode_error(payload: bytes) -> None:
    try:
        batch = decode_standard(payload)
    except EventDecodeError:
        return
    assert all(isinstance(e, dict) for e in batch.raw)


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["BlockStoreEvent", "BlockUpdateEvent", "RemoveAllEvent", "X"]),
            st.lists(values, max_size=8),
        ).map(lambda t: [t[0], *t[1]]),
        max_size=6,
    )
)
@pytest.mark.slow
def test_any_mooncake_events_normalise_without_raising(raw: list[list[Any]]) -> None:
    events, invalid = from_mooncake(REG, raw, MooncakeState())
    assert invalid >= 0 and all(e.stream.backend_id == "i" for e in events)
