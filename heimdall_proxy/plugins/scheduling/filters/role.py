"""prefill-filter, decode-filter and encode-filter: keep the pods of one disaggregation role
(label `mif.moreh.io/role`). One filter class; the three types differ only in the roles they
keep and in whether a pod without the label counts."""

from __future__ import annotations

from typing import ClassVar

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


class RoleFilter(BasePlugin[NoParams]):
    """Keeps the pods whose role label is one of `roles` (and, with `keep_unlabelled`, the
    pods without the label)."""

    roles: ClassVar[frozenset[str]]
    keep_unlabelled: ClassVar[bool]

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        roles, keep = self.roles, self.keep_unlabelled
        out = []
        for e in endpoints:
            role = e.labels.get(ROLE_LABEL)
            if (role is None and keep) or role in roles:
                out.append(e)
        return out


def role_filter(
    type_name: str, roles: frozenset[str], keep_unlabelled: bool, doc: str
) -> type[RoleFilter]:
    """The RoleFilter declared as plugin type `type_name`."""
    attrs = {"type": type_name, "roles": roles, "keep_unlabelled": keep_unlabelled, "__doc__": doc}
    cls = type(f"RoleFilter[{type_name}]", (RoleFilter,), attrs)
    return register(type_name)(cls)


PrefillFilter = role_filter(
    PREFILL_FILTER_TYPE, frozenset({ROLE_PREFILL}), False, "Keeps pods whose role is `prefill`."
)
DecodeFilter = role_filter(
    DECODE_FILTER_TYPE,
    frozenset({ROLE_DECODE, ROLE_BOTH}),
    True,
    "Keeps pods whose role is `decode` or `both`, and pods without the label.",
)
EncodeFilter = role_filter(
    ENCODE_FILTER_TYPE,
    frozenset({ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE}),
    False,
    "Keeps pods whose role is `encode`, `encode-prefill` or `encode-prefill-decode`; pods "
    "without the label are rejected.",
)
