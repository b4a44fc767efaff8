"""Opt-in sharing of a scorer's state between gateway replicas (heimdall_proxy.replicas).

The parameters reuse the KV index's `redisConfig` / `valkeyConfig` shape (address,
backendType, keyPrefix), so one Redis or Valkey serves both. Without either, the state stays
in memory, as before."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from heimdall_proxy.framework.inflight import InFlightLoad
from heimdall_proxy.framework.params import Duration, PluginParams
from heimdall_proxy.replicas import hub
from heimdall_proxy.replicas.counters import Rider
from heimdall_proxy.replicas.journal import Journal
from heimdall_proxy.replicas.ledger import Store, share_of

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
    """Where the gateway's in-flight ledger is shared (replicas/ledger.py)."""

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


def ledger_store(plugin: Any, params: SharedCountsParams) -> Store | None:
    """Where `params` would share the gateway's in-flight ledger (replicas/ledger.py), or
    None when they name no store."""
    where = store(plugin, params)
    rc = params.store()
    if where is None or rc is None:
        return None
    return Store(where[0], rc.key_prefix, params.sync_interval, params.replica_ttl)


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


def warn_ledger_alias(plugin: Any) -> None:
    """A load scorer's own store parameters, from before the gateway had one ledger: they
    still share it (what a replica upgraded with its old config expects), and say where
    they now belong."""
    log.warning(
        "plugin %r (type %r): redisConfig/valkeyConfig here is deprecated: the in-flight "
        "ledger it reads is shared once per gateway; put redisConfig (and syncInterval, "
        "replicaTTL) on inflight-load-producer instead. Honoured meanwhile: the ledger is "
        "shared through this store",
        plugin.name,
        plugin.type,
    )


class SharesState:
    """Mixin for a plugin whose state may be shared between replicas: set `journal` from
    shared_journal, and/or `ledger_store` (the gateway's in-flight ledger is then shared
    through that store while the plugin runs, replicas/ledger.py) and `ledger_rider` (events
    sent with the ledger's pushes), in __init__; the plugin's start and stop join and leave
    the process's sync hub for the store (one loop and one round trip per tick for every
    plugin sharing state through that store)."""

    journal: Journal | None = None
    ledger_store: Store | None = None
    ledger_rider: Rider | None = None
    #: 0 for inflight-load-producer, whose store wins; 1 for the others'
    ledger_rank: int = 1
    #: Set when a config reload handed this plugin's state to its successor (`hand_over`).
    handed_over: bool = False

    def hand_over(self, previous: SharesState) -> None:
        """A config reload gave `previous`'s state to this instance: from now on only this one
        applies the other replicas' records to it."""
        previous.handed_over = True

    def _ledger(self) -> InFlightLoad | None:
        """The gateway's ledger, when this plugin has a say in its sharing."""
        if self.ledger_store is None and self.ledger_rank != 0:
            return None
        load: InFlightLoad = getattr(self, "load")  # noqa: B009 - the plugin's, set in __init__
        return load

    async def start(self) -> None:
        load = self._ledger()
        if load is not None:
            share = share_of(load)
            name = str(getattr(self, "name", ""))
            if self.ledger_rider is not None:
                share.ride(f"{getattr(self, 'type', '')}/{name}", self.ledger_rider)
            await share.hold(self, name, self.ledger_store, self.ledger_rank)
        if self.journal is not None:
            await hub.join(self.journal)

    async def stop(self) -> None:
        if self.journal is not None:
            await hub.leave(self.journal)
        load = self._ledger()
        if load is not None:
            share = share_of(load)
            key = f"{getattr(self, 'type', '')}/{getattr(self, 'name', '')}"
            if self.ledger_rider is not None and share.rider(key) is self.ledger_rider:
                share.ride(key, None)
            await share.release(self)
