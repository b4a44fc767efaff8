"""One Redis / Valkey client for the shared routing state, with the KV index's timeouts."""

from __future__ import annotations

import redis.asyncio as aioredis

from heimdall_proxy.kvcache.index.redis import CONNECT_TIMEOUT, normalize_address

#: Per command: a sync tick must not stall for long when the server is slow, but a tick is
#: off the request path, so it may wait longer than an index lookup.
SYNC_COMMAND_TIMEOUT = 2.0


def client(address: str) -> aioredis.Redis:
    """A client for `address` (redis://, rediss://, valkey://, valkeys:// or host:port).
    Nothing is dialled until the first command."""
    return aioredis.from_url(
        normalize_address(address),
        decode_responses=False,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=SYNC_COMMAND_TIMEOUT,
    )
