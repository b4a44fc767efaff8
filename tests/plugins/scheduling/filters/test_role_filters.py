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
