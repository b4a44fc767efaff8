"""The HTTP API's request bodies: parsed and checked, with the seed's wire names.

Every problem is an `ApiError` naming the field, turned into a 4xx with
`{"error": {"message", "type", "code"}}` by the app; nothing a client sends reaches the
index unchecked."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heimdall_proxy.conductor.model import (
    DEFAULT_TENANT,
    PUBLISHER_TYPES,
    Namespace,
    Registration,
    lora_identity,
    publisher_key,
)

U32 = 1 << 32
U64 = 1 << 64
#: array typecodes of exactly 32 and 64 bits, by the bound of their values
_ARRAY_CODES = {
    bound: code
    for bound, code in ((U32, "I" if array("I").itemsize == 4 else "L"), (U64, "Q"))
    if array(code).itemsize * 8 == bound.bit_length() - 1
}


class ApiError(Exception):
    """A request the service refuses: HTTP `status`, a machine `code`, a clear message."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


def _missing(name: str) -> ApiError:
    return ApiError(400, f"missing required field {name!r}", "missing_field")


def _wrong(name: str, want: str, value: Any) -> ApiError:
    return ApiError(
        400, f"field {name!r} must be {want}, not {type(value).__name__}", "invalid_field"
    )


def _str(body: Mapping[str, Any], name: str, required: bool = False, default: str = "") -> str:
    value = body.get(name)
    if value is None:
        if required:
            raise _missing(name)
        return default
    if not isinstance(value, str):
        raise _wrong(name, "a string", value)
    if required and not value:
        raise ApiError(400, f"field {name!r} must not be empty", "invalid_field")
    return value


def _int(
    body: Mapping[str, Any], name: str, required: bool = False, minimum: int = 0
) -> int | None:
    value = body.get(name)
    if value is None:
        if required:
            raise _missing(name)
        return None
    if type(value) is not int:
        raise _wrong(name, "an integer", value)
    if value < minimum:
        raise ApiError(400, f"field {name!r} must be at least {minimum}", "invalid_field")
    if value >= U32:
        raise ApiError(400, f"field {name!r} must be below 2**32", "invalid_field")
    return value


def _ints(
    body: Mapping[str, Any], name: str, bound: int, limit: int, no_bools: bool = False
) -> Sequence[int]:
    """The array of integers in [0, bound) at `name`. `no_bools`: the body is known to hold
    no JSON true/false, so an array("I" or "Q") conversion checks types and range in one C
    pass and is kept for hashing (bool is an int to array(), the only case it lets by)."""
    value = body.get(name)
    if value is None:
        raise _missing(name)
    if not isinstance(value, list):
        raise _wrong(name, "an array of integers", value)
    if len(value) > limit:
        raise ApiError(
            413, f"field {name!r} has {len(value)} entries, at most {limit} allowed",
            "query_too_large",
        )  # fmt: skip
    if no_bools and bound in _ARRAY_CODES:
        try:
            return array(_ARRAY_CODES[bound], value)
        except (TypeError, OverflowError):
            pass  # refused below, with the message
    # checked in C (an 8k-token query would spend ~0.5 ms in a generator here)
    if value and (set(map(type, value)) != {int} or min(value) < 0 or max(value) >= bound):
        raise ApiError(
            400,
            f"field {name!r} must hold integers in [0, 2**{bound.bit_length() - 1})",
            "invalid_field",
        )
    return value


def as_object(doc: Any) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_body")
    return doc


def _zmq_address(address: str) -> bool:
    """tcp://host:port (a port in 1..65535), or another ZMQ transport (ipc://, inproc://)."""
    scheme, sep, rest = address.partition("://")
    if not sep or not rest:
        return False
    if scheme != "tcp":
        return scheme in ("ipc", "inproc")
    host, _, port = rest.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def parse_register(body: Mapping[str, Any]) -> Registration:
    kind = _str(body, "type", required=True)
    canonical = PUBLISHER_TYPES.get(kind.lower())
    if canonical is None:
        raise ApiError(
            400,
            f"publisher type {kind!r} is not supported (supported: "
            f"{', '.join(PUBLISHER_TYPES.values())})",
            "unsupported_publisher",
        )
    endpoint = _str(body, "endpoint", required=True)
    replay = _str(body, "replay_endpoint") or None
    for name, address in (("endpoint", endpoint), ("replay_endpoint", replay)):
        if address is not None and not _zmq_address(address):
            raise ApiError(
                400, f"field {name!r} must be a ZMQ address such as tcp://host:port",
                "invalid_field",
            )  # fmt: skip
    block_size = _int(body, "block_size", required=True, minimum=1)
    dp_rank = _int(body, "dp_rank", required=True)
    assert block_size is not None
    assert dp_rank is not None
    return Registration(
        endpoint=endpoint,
        replay_endpoint=replay,
        type=canonical,
        model=_str(body, "modelname", required=True),
        lora_name=_str(body, "lora_name"),
        tenant_id=_str(body, "tenant_id") or DEFAULT_TENANT,
        instance_id=_str(body, "instance_id", required=True),
        block_size=block_size,
        dp_rank=dp_rank,
        additional_salt=_str(body, "additionalsalt"),
    )


@dataclass(frozen=True, slots=True)
class Unregister:
    instance_id: str
    tenant_id: str
    dp_rank: int
    #: the other fields the body gave (wire name -> value); they do not select
    described: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return publisher_key(self.instance_id, self.tenant_id, self.dp_rank)


def parse_unregister(body: Mapping[str, Any]) -> Unregister:
    """The subscription is identified by (instance_id, tenant_id, dp_rank), as the seed's
    implementation does; type, modelname, lora_name and block_size are checked when given
    and kept, so a contradiction with the registration can be reported, but do not
    select."""
    described: list[tuple[str, Any]] = []
    for name in ("type", "modelname", "lora_name"):
        if body.get(name) is not None:
            described.append((name, _str(body, name)))
    if body.get("block_size") is not None:
        described.append(("block_size", _int(body, "block_size", minimum=1)))
    rank = _int(body, "dp_rank", required=True)
    assert rank is not None
    return Unregister(
        _str(body, "instance_id", required=True),
        _str(body, "tenant_id") or DEFAULT_TENANT,
        rank,
        tuple(described),
    )


@dataclass(frozen=True, slots=True)
class Query:
    namespace: Namespace
    instance_id: str | None
    #: token ids (/query) or sequence hashes (/query_by_hash)
    values: Sequence[int]
    by_hash: bool


def parse_query(
    body: Mapping[str, Any],
    by_hash: bool,
    max_tokens: int,
    max_blocks: int,
    no_bools: bool = False,
) -> Query:
    """A /query or /query_by_hash body; `no_bools`: see `_ints`."""
    model = _str(body, "model", required=True)
    lora_name = _str(body, "lora_name")
    lora_id = _int(body, "lora_id")
    if lora_id is not None and lora_name:
        raise ApiError(
            400, "give either 'lora_name' or the deprecated 'lora_id', not both", "invalid_field"
        )
    lora = lora_identity(lora_name, lora_id) or ""
    block_size = _int(body, "block_size", required=True, minimum=1)
    assert block_size is not None
    if by_hash:
        name = "seq_hashes" if "seq_hashes" in body or "block_hash" not in body else "block_hash"
        values = _ints(body, name, U64, max_blocks, no_bools)
    else:
        values = _ints(body, "token_ids", U32, max_tokens, no_bools)
    namespace = Namespace(
        model, block_size, _str(body, "cache_salt"), lora, _str(body, "tenant_id") or DEFAULT_TENANT
    )
    return Query(namespace, _str(body, "instance_id") or None, values, by_hash)
