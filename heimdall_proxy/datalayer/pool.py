"""The endpoint pool: the pods, their health and the models they serve."""

from __future__ import annotations

from typing import Any

from heimdall_proxy.config.gateway import EndpointConfig
from heimdall_proxy.framework.types import Endpoint

#: Models whose candidates are cached at once (client-chosen names must not grow it unbounded;
#: an unknown model raises and is never cached anyway).
_MAX_CACHED_MODELS = 256


class ModelNotFoundError(LookupError):
    """No pod serves the requested model."""


class NoEndpointsError(LookupError):
    """The pool is empty."""


class EndpointPool:
    """Owns one Endpoint object per pod. The data layer updates them in place (health, models)
    and replaces their `metrics` snapshot; the scheduler reads them."""

    def __init__(self, configs: list[EndpointConfig], previous: EndpointPool | None = None) -> None:
        """`previous`: the pool a reloaded config replaces. A pod listed there with the same
        URL, labels, KV-event address and model list keeps its Endpoint object, so its health
        and metrics snapshot carry over and no request sees it unscraped."""
        self._by_name: dict[str, Endpoint] = {}
        self.static_models: set[str] = set()
        self._all: list[Endpoint] = []
        self._generation = Endpoint.membership_generation
        self.replace(configs, previous)

    def replace(self, configs: list[EndpointConfig], previous: EndpointPool | None = None) -> None:
        """Make `configs` the pool's pods in one step (a discovery source's change). Pods
        unchanged keep their Endpoint objects (see `__init__`); readers holding the old list
        keep a consistent one."""
        previous = previous if previous is not None else self
        by_name: dict[str, Endpoint] = {}
        for cfg in configs:
            kept = previous.get(cfg.name)
            if kept is not None and _same(kept, cfg, previous):
                by_name[cfg.name] = kept
                continue
            endpoint = Endpoint(
                name=cfg.name,
                url=cfg.url,
                host=cfg.host,
                port=cfg.port,
                labels=dict(cfg.labels),
                kv_events=cfg.kv_events,
            )
            if cfg.models is not None:
                endpoint.models = frozenset(cfg.models)
                endpoint.model_cards = {m: {"id": m, "object": "model"} for m in cfg.models}
            by_name[cfg.name] = endpoint
        self.static_models = {cfg.name for cfg in configs if cfg.models is not None}
        self._by_name = by_name
        self._all = list(by_name.values())
        self._candidates: dict[str, list[Endpoint]] = {}

    def is_static(self, name: str) -> bool:
        return name in self.static_models

    def endpoints(self) -> list[Endpoint]:
        return self._all

    def get(self, name: str) -> Endpoint | None:
        return self._by_name.get(name)

    def healthy(self) -> list[Endpoint]:
        return [e for e in self._all if e.healthy]

    def candidates(self, model: str) -> list[Endpoint]:
        """Pods that may serve `model`: the healthy pods serving it; if none is healthy, the
        unhealthy ones serving it (a failed scrape does not prove a pod dead); pods whose model
        list is still unknown when nobody is known to serve it. Raises ModelNotFoundError or
        NoEndpointsError.

        Cached per model until a pod's health or model list changes
        (`Endpoint.membership_generation`) or the pool is replaced, and the cached list
        itself is returned (as `endpoints()` returns the pool's own): callers must not modify
        it. Scanning 1,024 pods per request, and a new 1,024-item list per request in
        flight for the garbage collector to walk, were a tenth of a decision."""
        if self._generation != Endpoint.membership_generation:
            self._candidates = {}
            self._generation = Endpoint.membership_generation
        found = self._candidates.get(model)
        if found is None:
            found = self._scan(model)
            if len(self._candidates) < _MAX_CACHED_MODELS:
                self._candidates[model] = found
        return found

    def _scan(self, model: str) -> list[Endpoint]:
        if not self._all:
            raise NoEndpointsError("the pool has no endpoints")
        serving: list[Endpoint] = []
        unhealthy_serving: list[Endpoint] = []
        unknown: list[Endpoint] = []
        for e in self._all:
            models = e.models
            if models is None:
                unknown.append(e)
            elif model in models:
                (serving if e.healthy else unhealthy_serving).append(e)
        if serving:
            return serving
        if unhealthy_serving:
            return unhealthy_serving
        if unknown:
            healthy_unknown = [e for e in unknown if e.healthy]
            return healthy_unknown or unknown
        raise ModelNotFoundError(model)

    def models(self) -> list[dict[str, Any]]:
        """The union of the model cards of the healthy pods, sorted by id."""
        cards: dict[str, dict[str, Any]] = {}
        for e in self._all:
            if e.healthy:
                for model_id, card in e.model_cards.items():
                    cards.setdefault(model_id, card)
        return [cards[k] for k in sorted(cards)]


def _same(endpoint: Endpoint, cfg: EndpointConfig, pool: EndpointPool) -> bool:
    """Whether `cfg` describes `endpoint` (a pod of `pool`) exactly as it is."""
    if (endpoint.url, endpoint.labels, endpoint.kv_events) != (cfg.url, cfg.labels, cfg.kv_events):
        return False
    if cfg.models is None:
        return not pool.is_static(endpoint.name)
    return pool.is_static(endpoint.name) and endpoint.models == frozenset(cfg.models)
