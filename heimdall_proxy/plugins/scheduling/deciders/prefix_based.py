"""prefix-based-pd-decider: runs prefill when enough of the prompt is not cached."""

from __future__ import annotations

from pydantic import Field

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.disagg import find_prefix_match
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import CycleState, Endpoint, InferenceRequest

PREFIX_BASED_PD_DECIDER_TYPE = "prefix-based-pd-decider"
#: Characters per token when no prefix plugin ran and the request was not tokenized.
CHARS_PER_TOKEN = 4.0


class PrefixBasedPDDeciderParams(PluginParams):
    non_cached_tokens: int = Field(default=0, ge=0)


@register(PREFIX_BASED_PD_DECIDER_TYPE, PrefixBasedPDDeciderParams)
class PrefixBasedPDDecider(BasePlugin[PrefixBasedPDDeciderParams]):
    """Prefill decider. Reads the prefix-cache match information a prefix-cache scorer left
    on the CycleState (pd-profile-handler names which one) and counts the prompt tokens the
    decode pod does not hold; without it, the whole prompt counts (real token count when a
    tokenizer ran, else characters / 4). Prefill runs when that count is at least
    `nonCachedTokens`; 0 (the default) disables prefill altogether."""

    type = PREFIX_BASED_PD_DECIDER_TYPE

    def uncached_tokens(
        self, state: CycleState, request: InferenceRequest, decode: Endpoint
    ) -> int:
        info = find_prefix_match(state)
        if info is None:
            return request.estimated_tokens(CHARS_PER_TOKEN)
        return info.uncached_tokens(decode.name)

    def decide(self, state: CycleState, request: InferenceRequest, decode: Endpoint) -> bool:
        threshold = self.params.non_cached_tokens
        if threshold <= 0:
            return False
        return self.uncached_tokens(state, request, decode) >= threshold
