"""prefill-filter, decode-filter, encode-filter."""

from __future__ import annotations

from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import CycleState
from heimdall_proxy.plugins.scheduling.filters.role import DecodeFilter, EncodeFilter, PrefillFilter
from tests.helpers import ep
from tests.plugins.helpers import req

HANDLE = PluginHandle(pool=None)  # type: ignore[arg-type]
ROLES = [
    "prefill",
    "decode",
    "both",
    "encode",
    "encode-prefill",
    "encode-prefill-decode",
    None,
    "other",
]
PODS = [ep(f"p{i}", {"mif.moreh.io/role": r} if r else {}) for i, r in enumerate(ROLES)]


def kept(plugin: object) -> list[str | None]:
    out = plugin.filter(CycleState(), req(), PODS)  # type: ignore[attr-defined]
    return [ROLES[PODS.index(e)] for e in out]


def test_prefill_filter_keeps_prefill_pods() -> None:
    assert kept(PrefillFilter("f", NoParams(), HANDLE)) == ["prefill"]


def test_decode_filter_keeps_decode_both_and_unlabelled() -> None:
    assert kept(DecodeFilter("f", NoParams(), HANDLE)) == ["decode", "both", None]


def test_encode_filter_keeps_encode_roles_and_rejects_unlabelled() -> None:
    assert kept(EncodeFilter("f", NoParams(), HANDLE)) == [
        "encode",
        "encode-prefill",
        "encode-prefill-decode",
    ]


def test_llm_d_role_labels_use_llm_d_role_sets() -> None:
    """llm-d's label, with its README's role table: a pod that does several stages serves
    each of them; the seeds' label keeps the seeds' sets."""
    from heimdall_proxy.framework.params import NoParams
    from heimdall_proxy.plugins.scheduling.filters.role import (
        DecodeFilter,
        EncodeFilter,
        PrefillFilter,
    )
    from tests.helpers import ep
    from tests.plugins.helpers import ledger, req

    roles = ["encode", "prefill", "decode", "encode-prefill", "prefill-decode",
             "encode-prefill-decode", "both"]  # fmt: skip
    pods = [ep(r, labels={"llm-d.ai/role": r}) for r in roles] + [ep("none")]

    def kept(cls: type) -> list[str]:
        plugin = cls(cls.type, NoParams(), ledger())
        return [e.name for e in plugin.filter(None, req(), pods)]

    assert kept(EncodeFilter) == ["encode", "encode-prefill", "encode-prefill-decode"]
    assert kept(PrefillFilter) == ["prefill", "encode-prefill", "prefill-decode",
                                   "encode-prefill-decode", "both"]  # fmt: skip
    assert kept(DecodeFilter) == ["decode", "prefill-decode", "encode-prefill-decode", "both",
                                  "none"]  # fmt: skip
    seeds = [ep("p", labels={"mif.moreh.io/role": "encode-prefill"})]
    plugin = PrefillFilter("prefill-filter", NoParams(), ledger())
    assert plugin.filter(None, req(), seeds) == []  # the seeds' prefill-filter: prefill only
