"""responses-store parameters, with the reference's names and defaults."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, model_validator

from heimdall_proxy.framework.params import Duration, PluginParams

DAY = 24 * 3600.0
DEFAULT_MAX_ENTRY_BYTES = 1048576

NonNegativeDuration = Annotated[Duration, Field(ge=0)]
PositiveDuration = Annotated[Duration, Field(gt=0)]


class InMemoryConfig(PluginParams):
    #: 0 keeps entries until evicted.
    ttl: NonNegativeDuration = DAY
    max_entries: int = Field(default=10000, ge=1)
    max_entry_bytes: int = Field(default=DEFAULT_MAX_ENTRY_BYTES, ge=1)
    #: Ours: all entries together at most (the oldest are evicted first), so the store's
    #: memory is bounded in bytes, not only in entries. 1 GiB.
    max_total_bytes: int = Field(default=1 << 30, ge=1)


class RedisConfig(PluginParams):
    #: Standalone `redis://` / `rediss://` / `valkey://` / `valkeys://` URL.
    address: str | None = None
    #: host:port entries: with `masterName` the Sentinels, several without it a Cluster.
    addresses: list[str] | None = None
    master_name: str = ""
    username: str = ""
    password: SecretStr = SecretStr("")
    db: int = Field(default=0, ge=0)
    #: 0 keeps entries until Redis evicts them.
    ttl: NonNegativeDuration = DAY
    max_entry_bytes: int = Field(default=DEFAULT_MAX_ENTRY_BYTES, ge=1)

    @model_validator(mode="after")
    def _one_address_form(self) -> RedisConfig:
        if self.address and self.addresses:
            raise ValueError("redis: set either address or addresses, not both")
        if not self.address and not self.addresses:
            raise ValueError("redis: set address (a redis:// URL) or addresses")
        if self.master_name and not self.addresses:
            raise ValueError("redis: masterName needs the Sentinel addresses in addresses")
        return self


class MongoConfig(PluginParams):
    uri: str = Field(min_length=1)
    database: str = "heimdall"
    collection: str = "responses"
    #: 0 keeps entries forever.
    ttl: NonNegativeDuration = 30 * DAY
    timeout: PositiveDuration = 0.5


class StreamConfig(PluginParams):
    key: str = "heimdall:responses:mongo_sync"
    consumer_group: str = "mongo-sync"
    max_len: int = Field(default=1000000, ge=1)
    batch_size: int = Field(default=100, ge=1)
    block_timeout: PositiveDuration = 1.0
    claim_age: PositiveDuration = 30.0


class TieredConfig(PluginParams):
    redis: RedisConfig | None = None
    mongo: MongoConfig | None = None
    stream: StreamConfig = Field(default_factory=StreamConfig)

    @model_validator(mode="after")
    def _needs_redis(self) -> TieredConfig:
        if self.redis is None:
            raise ValueError("tieredConfig needs redis (MongoDB is only the second tier)")
        return self


class StoreConfig(PluginParams):
    in_memory_config: InMemoryConfig | None = None
    #: Takes precedence over inMemoryConfig when both are set.
    tiered_config: TieredConfig | None = None

    @model_validator(mode="after")
    def _one_backend(self) -> StoreConfig:
        if self.in_memory_config is None and self.tiered_config is None:
            raise ValueError("storeConfig: set inMemoryConfig or tieredConfig")
        return self


class ResponsesStoreParams(PluginParams):
    #: Omitted: an in-memory backend with a 24h ttl.
    store_config: StoreConfig | None = None
