"""Opt-in sharing of a scorer's state between gateway replicas (heimdall_proxy.replicas).

The parameters reuse the KV index's `redisConfig` / `valkeyConfig` shape (address,
backendType, keyPrefix), so one Redis or Valkey serves both. Without either, the state stays
in memory, as before."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from heimdall_proxy.framework.params import Duration, PluginParams
from heimdall_proxy.replicas import hub
from heimdall_proxy.replicas.counters import ReplicaCounters
from heimdall_proxy.replicas.journal import Journal

log = logging.getLogger(__name__)


class RedisConfig(PluginParams):
    """The KV block index's `redisConfig` / `valkeyConfig` (precise-prefix-cache-scorer),
    also used by the scorers that share their state."""

    address: str = "redis://127.0.0.1:6379"
    backend_type: Literal["redis", "valkey"] = "redis"
    enable_rdma: bool = Field(default=False, alias="enableRDMA")
    #: Extension: namespace of this index's keys (several indexes can share one server).
    key_prefix: str = "heimdall:kv:"


class SharedStoreParams(PluginParams):
    """Where the state is shared (neither: not shared) and how often replicas sync."""

    redis_config: RedisConfig | None = None
    valkey_config: RedisConfig | None = None
    #: Extension: seconds between two syncs with the store (one round trip each); the other
    #: replicas' changes are seen up to about two of these late.
    sync_interval: Duration = Field(default=0.02, gt=0)

    @model_validator(mode="after")
    def _one_store(self) -> SharedStoreParams:
        if self.redis_config is not None and self.valkey_config is not None:
            raise ValueError("configure redisConfig or valkeyConfig, not both")
        return self

    def store(self) -> RedisConfig | None:
        return self.redis_config or self.valkey_config


class SharedCountsParams(SharedStoreParams):
    #: Extension: a replica that has not synced for this long is taken for dead and its
    #: in-flight counts are dropped everywhere.
    replica_ttl: Duration = Field(default=2.0, gt=0, alias="replicaTTL")


class SharedJournalParams(SharedStoreParams):
    #: Extension: journal entries (one per replica per tick with changes) kept for replicas
    #: that start later; about the last `historyEntries * syncInterval` seconds of traffic.
    history_entries: int = Field(default=100_000, gt=0)


def store(plugin: Any, params: SharedStoreParams) -> tuple[str, str] | None:
    """The store's address and this plugin's key prefix (`<keyPrefix>state:<type>:<name>:`),
    or None when sharing is not configured. Warns about enableRDMA (TCP is used)."""
    rc = params.store()
    if rc is None:
        return None
    if rc.enable_rdma:
        log.warning(
            "plugin %r (type %r): parameter enableRDMA is accepted but not honoured (TCP is used)",
            plugin.name,
            plugin.type,
        )
    return rc.address, f"{rc.key_prefix}state:{plugin.type}:{plugin.name}:"


def shared_counters(
    plugin: Any, params: SharedCountsParams, local: Callable[[], Mapping[str, float]]
) -> ReplicaCounters | None:
    """The replica counters a plugin publishes its per-pod totals (`local`) through, or None
    when sharing is not configured."""
    where = store(plugin, params)
    if where is None:
        return None
    address, prefix = where
    return ReplicaCounters(address, prefix, local, params.sync_interval, params.replica_ttl)


def shared_journal(
    plugin: Any, params: SharedJournalParams, apply: Callable[[list[Any]], None]
) -> Journal | None:
    """The journal a plugin sends its changes through and `apply`s the other replicas'
    with, or None when sharing is not configured."""
    where = store(plugin, params)
    if where is None:
        return None
    address, prefix = where
    return Journal(address, prefix + "journal", apply, params.sync_interval, params.history_entries)


class SharesState:
    """Mixin for a plugin whose state may be shared between replicas: set `shared` (counters)
    and/or `journal` from shared_counters / shared_journal in __init__, and the plugin's
    start and stop join and leave the process's sync hub for the store (one loop and one
    round trip per tick for every plugin sharing state through that store)."""

    shared: ReplicaCounters | None = None
    journal: Journal | None = None
    #: Set when a config reload handed this plugin's state to its successor (`hand_over`).
    handed_over: bool = False

    def hand_over(self, previous: SharesState) -> None:
        """A config reload gave `previous`'s state to this instance: from now on only this one
        publishes it and applies the other replicas' records and pushed events to it, and
        each instance's counters leave the other's id out (both are this replica; counting
        the other's publication too would count its requests twice)."""
        previous.handed_over = True
        if previous.shared is not None:
            # the events riding on pushes are applied by the successor's counters alone
            previous.shared.rider = None
        if self.shared is not None and previous.shared is not None:
            self.shared.ignore(previous.shared.replica)
            previous.shared.ignore(self.shared.replica)

    async def start(self) -> None:
        for part in (self.shared, self.journal):
            if part is not None:
                await hub.join(part)

    async def stop(self) -> None:
        for part in (self.journal, self.shared):
            if part is not None:
                await hub.leave(part)
