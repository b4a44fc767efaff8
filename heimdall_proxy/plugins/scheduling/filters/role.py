"""prefill-filter, decode-filter and encode-filter: keep the pods of one disaggregation role
(label `mif.moreh.io/role`, or llm-d's `llm-d.ai/role`). One filter class; the three types
differ only in the roles they keep and in whether a pod without the label counts."""

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


#: llm-d's role label. A pod labelled with it (and not with the seeds' `mif.moreh.io/role`)
#: is judged by llm-d's role sets, which also know `prefill-decode` and let a pod that does
#: several stages serve each of them.
LLMD_ROLE_LABEL = "llm-d.ai/role"


class RoleFilter(BasePlugin[NoParams]):
    """Keeps the pods whose role label is one of `roles` (`llmd_roles` for llm-d's label),
    and, with `keep_unlabelled`, the pods with neither label."""

    roles: ClassVar[frozenset[str]]
    llmd_roles: ClassVar[frozenset[str]]
    keep_unlabelled: ClassVar[bool]

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> list[Endpoint]:
        roles, llmd_roles, keep = self.roles, self.llmd_roles, self.keep_unlabelled
        out = []
        for e in endpoints:
            labels = e.labels
            role = labels.get(ROLE_LABEL)
            if role is not None:
                if role in roles:
                    out.append(e)
                continue
            role = labels.get(LLMD_ROLE_LABEL)
            if (role is None and keep) or role in llmd_roles:
                out.append(e)
        return out


def role_filter(
    type_name: str,
    roles: frozenset[str],
    llmd_roles: frozenset[str],
    keep_unlabelled: bool,
    doc: str,
) -> type[RoleFilter]:
    """The RoleFilter declared as plugin type `type_name`."""
    attrs = {
        "type": type_name,
        "roles": roles,
        "llmd_roles": llmd_roles,
        "keep_unlabelled": keep_unlabelled,
        "__doc__": doc,
    }
    cls = type(f"RoleFilter[{type_name}]", (RoleFilter,), attrs)
    return register(type_name)(cls)


PREFILL_DECODE = "prefill-decode"

PrefillFilter = role_filter(
    PREFILL_FILTER_TYPE,
    frozenset({ROLE_PREFILL}),
    frozenset(
        {ROLE_PREFILL, ROLE_ENCODE_PREFILL, PREFILL_DECODE, ROLE_BOTH, ROLE_ENCODE_PREFILL_DECODE}
    ),
    False,
    "Keeps pods whose role is `prefill` (with llm-d's label, any role that prefills).",
)
DecodeFilter = role_filter(
    DECODE_FILTER_TYPE,
    frozenset({ROLE_DECODE, ROLE_BOTH}),
    frozenset({ROLE_DECODE, PREFILL_DECODE, ROLE_BOTH, ROLE_ENCODE_PREFILL_DECODE}),
    True,
    "Keeps pods whose role is `decode` or `both` (with llm-d's label, any role that decodes), "
    "and pods without a role label.",
)
EncodeFilter = role_filter(
    ENCODE_FILTER_TYPE,
    frozenset({ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE}),
    frozenset({ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE}),
    False,
    "Keeps pods whose role is `encode`, `encode-prefill` or `encode-prefill-decode`; pods "
    "without a role label are rejected.",
)
