"""What a client must not choose, dropped from its body before anything reads it."""

from __future__ import annotations

from heimdall_proxy.framework.types import InferenceRequest

#: Body fields that make a pod act on what they name: vLLM's NIXL connector dials the
#: remote_host / remote_port of kv_transfer_params; an EC connector loads what
#: ec_transfer_params points at. The gateway writes them itself for its own hops.
TRANSFER_FIELDS = ("kv_transfer_params", "ec_transfer_params")
#: vLLM's free-form extra arguments: it copies a `kv_transfer_params` found there into the
#: same slot as the top-level field, so the transfer fields are dropped from it too.
XARGS_FIELD = "vllm_xargs"


def untrusted_fields(ireq: InferenceRequest, trust_transfer_params: bool) -> None:
    """Drop what a client must not choose: the transfer parameters, at the top level and in
    `vllm_xargs` (unless the operator trusts its clients), and, on /v1/responses,
    `request_id` (vLLM makes it the response id, so a client could otherwise name, and
    overwrite, another caller's stored response)."""
    data = ireq.data
    drop = []
    xargs = None
    if not trust_transfer_params:
        for name in TRANSFER_FIELDS:  # a loop, not a comprehension: no frame per request
            if name in data:
                drop.append(name)
        extra = data.get(XARGS_FIELD)
        if isinstance(extra, dict) and any(name in extra for name in TRANSFER_FIELDS):
            xargs = {k: v for k, v in extra.items() if k not in TRANSFER_FIELDS}
    if ireq.api == "responses" and "request_id" in data:
        drop.append("request_id")
    if drop or xargs is not None:
        kept = {k: v for k, v in data.items() if k not in drop}
        if xargs is not None:
            kept[XARGS_FIELD] = xargs
        ireq.set_data(kept)
