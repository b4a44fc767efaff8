"""prefill-filter, decode-filter and encode-filter: keep the pods of one disaggregation role
(label `mif.moreh.io/role`)."""

from __future__ import annotations

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.disagg import (
    ROLE_BOTH,
    ROLE_DECODE,
    ROLE_ENCODE,
    ROLE_ENCODE_PREFILL,
    ROLE_ENCODE_PREFILL_DECODE,
    ROLE_PREFILL,
)
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import ROLE_LABEL, CycleState, Endpoint, InferenceRequest

PREFILL_FILTER_TYPE = "prefill-filter"
DECODE_FILTER_TYPE = "decode-filter"
ENCODE_FILTER_TYPE = "encode-filter"


@register(PREFILL_FILTER_TYPE)
class PrefillFilter(BasePlugin[NoParams]):
    """Keeps pods whose role label is `prefill`."""

    type = PREFILL_FILTER_TYPE

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        return [e for e in endpoints if e.labels.get(ROLE_LABEL) == ROLE_PREFILL]


_DECODE_ROLES = frozenset({ROLE_DECODE, ROLE_BOTH})


@register(DECODE_FILTER_TYPE)
class DecodeFilter(BasePlugin[NoParams]):
    """Keeps pods whose role label is `decode` or `both`, and pods without the label."""

    type = DECODE_FILTER_TYPE

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        out = []
        for e in endpoints:
            role = e.labels.get(ROLE_LABEL)
            if role is None or role in _DECODE_ROLES:
                out.append(e)
        return out


_ENCODE_ROLES = frozenset({ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE})


@register(ENCODE_FILTER_TYPE)
class EncodeFilter(BasePlugin[NoParams]):
    """Keeps pods whose role label is `encode`, `encode-prefill` or `encode-prefill-decode`;
    pods without the label are rejected."""

    type = ENCODE_FILTER_TYPE

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        return [e for e in endpoints if e.labels.get(ROLE_LABEL) in _ENCODE_ROLES]
