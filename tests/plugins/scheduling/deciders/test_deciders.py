"""prefix-based-pd-decider, always-disagg-pd-decider, always-disagg-multimodal-decider."""

from __future__ import annotations

from typing import Any

import pytest

from heimdall_proxy.framework.disagg import PREFIX_PLUGIN_HINT_KEY
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.plugins import Decider
from heimdall_proxy.framework.prefix import (
    PrefixCacheMatchInfo,
    prefix_match_key,
    prefix_match_reader,
)
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.deciders.always import (
    AlwaysDisaggMultimodalDecider,
    AlwaysDisaggPDDecider,
)
from heimdall_proxy.plugins.scheduling.deciders.prefix_based import (
    PrefixBasedPDDecider,
    PrefixBasedPDDeciderParams,
)
from tests.helpers import ep
from tests.plugins.helpers import req

HANDLE = PluginHandle(pool=None)  # type: ignore[arg-type]
DECODE = ep("d0")


def prefix_decider(n: int) -> PrefixBasedPDDecider:
    params = PrefixBasedPDDeciderParams.model_validate({"nonCachedTokens": n})
    return PrefixBasedPDDecider("p", params, HANDLE)


def prompt(chars: int) -> Any:
    return req("completions", {"prompt": "x" * chars})


def test_every_decider_implements_the_protocol() -> None:
    for plugin in (
        prefix_decider(1),
        AlwaysDisaggPDDecider("a", NoParams(), HANDLE),
        AlwaysDisaggMultimodalDecider("m", NoParams(), HANDLE),
    ):
        assert isinstance(plugin, Decider)


def test_zero_threshold_never_prefills() -> None:
    assert PrefixBasedPDDeciderParams().non_cached_tokens == 0
    assert not prefix_decider(0).decide(CycleState(), prompt(100_000), DECODE)
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        PrefixBasedPDDeciderParams.model_validate({"nonCachedTokens": -1})


def test_without_prefix_info_the_estimated_prompt_counts() -> None:
    decider = prefix_decider(100)
    assert decider.decide(CycleState(), prompt(400), DECODE)  # 100 estimated tokens
    assert not decider.decide(CycleState(), prompt(396), DECODE)


def test_real_token_count_wins_over_the_estimate() -> None:
    request = prompt(4)
    request.token_ids = list(range(150))
    assert prefix_decider(150).decide(CycleState(), request, DECODE)


def test_cached_prefix_on_the_decode_pod_is_not_counted() -> None:
    state = CycleState()
    info = PrefixCacheMatchInfo(
        block_size=16, total_blocks=10, prompt_tokens=170, matched_blocks={"d0": 8, "d1": 1}
    )
    state[prefix_match_key("prefix-cache-scorer", "prefix-cache-scorer")] = info
    decider = prefix_decider(42)
    assert decider.uncached_tokens(state, prompt(680), DECODE) == 42  # 170 - 8 * 16
    assert decider.decide(state, prompt(680), DECODE)
    assert not prefix_decider(43).decide(state, prompt(680), DECODE)
    assert decider.uncached_tokens(state, prompt(680), ep("d1")) == 154


def test_the_handler_hint_names_the_prefix_plugin() -> None:
    state = CycleState()
    other = PrefixCacheMatchInfo(16, 4, 64, {"d0": 4})
    mine = PrefixCacheMatchInfo(16, 4, 64, {})
    state[prefix_match_key("approx-prefix-cache-producer", "other")] = other
    state[prefix_match_key("approx-prefix-cache-producer", "mine")] = mine
    state[PREFIX_PLUGIN_HINT_KEY] = prefix_match_reader("mine")
    assert prefix_decider(64).decide(state, prompt(256), DECODE)


def test_always_disagg_pd_decider() -> None:
    assert AlwaysDisaggPDDecider("a", NoParams(), HANDLE).decide(CycleState(), prompt(1), DECODE)


@pytest.mark.parametrize(
    ("api", "data", "expected"),
    [
        ("chat", {"messages": [{"role": "user", "content": "hi"}]}, False),
        (
            "chat",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "u"}}],
                    },
                ]
            },
            True,
        ),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            True,
        ),
        ("chat", {"messages": [{"content": [{"type": "video_url"}]}]}, True),
        ("responses", {"input": "hi"}, False),
        ("responses", {"input": [{"type": "input_image", "image_url": "u"}]}, True),
        (
            "responses",
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            True,
        ),
        ("completions", {"prompt": "image_url"}, False),
    ],
)
def test_multimodal_decider(api: Any, data: dict[str, Any], expected: bool) -> None:
    decider = AlwaysDisaggMultimodalDecider("m", NoParams(), HANDLE)
    assert decider.decide(CycleState(), req(api, data), DECODE) is expected
