"""Parse the vLLM metrics the scorers read out of a pod's Prometheus text exposition."""

from __future__ import annotations

import time
from collections.abc import Iterable

from heimdall_proxy.datalayer.scan import Sample, scan_families
from heimdall_proxy.framework.types import Metrics

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
LORA_INFO = "vllm:lora_requests_info"
CACHE_CONFIG = "vllm:cache_config_info"

#: Read on every scrape whatever the plugins: the gateway's own pool gauges (queue, running,
#: KV usage per pod) and the default saturation detector read them.
CORE_FAMILIES = frozenset({WAITING, RUNNING, KV_USAGE, KV_USAGE_LEGACY})
#: Every family this module knows how to turn into Metrics fields.
ALL_FAMILIES = CORE_FAMILIES | {LORA_INFO, CACHE_CONFIG}


def _plugin_families(plugins: Iterable[object]) -> set[str]:
    return {f for plugin in plugins for f in getattr(plugin, "metric_families", ())}


def needed_families(plugins: Iterable[object]) -> frozenset[str]:
    """The families to scrape: the core ones and every plugin's `metric_families`."""
    return frozenset(CORE_FAMILIES | _plugin_families(plugins))


#: A family read only to stand in for another one its page lacks (an older vLLM's KV usage
#: gauge): family -> the one it stands in for.
STAND_INS = {KV_USAGE_LEGACY: KV_USAGE}


def stand_ins(plugins: Iterable[object]) -> dict[str, str]:
    """The stand-in families no plugin reads for themselves: a page is searched for them
    only when it lacks what they stand in for (metrics_from_families reads them no
    otherwise), which spares a scrape of today's vLLM a search of the whole page."""
    asked = _plugin_families(plugins)
    return {f: primary for f, primary in STAND_INS.items() if f not in asked}


def _adapters(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(a for a in (s.strip() for s in value.split(",")) if a)


def _int_or_none(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def parse_vllm_metrics(
    page: str | bytes, now: float | None = None, families: frozenset[str] = ALL_FAMILIES
) -> Metrics:
    """Build a Metrics snapshot from the `families` found on `page` (the rest of the page is
    never parsed; fields of families not asked for keep their defaults). Counts are summed
    over samples (one per engine or data-parallel rank, whatever their `model_name`), KV usage
    is the maximum, `vllm:lora_requests_info` is read from its newest sample (its value is a
    timestamp). Raises ValueError on a malformed sample line of a wanted family."""
    raw = page.encode() if isinstance(page, str) else page
    return metrics_from_families(scan_families(raw, families), now)


def metrics_from_families(found: dict[str, list[Sample]], now: float | None = None) -> Metrics:
    """The Metrics snapshot of the families scanned out of a page (parse_vllm_metrics)."""
    waiting = sum(v for _, v in found.get(WAITING, ()))
    running = sum(v for _, v in found.get(RUNNING, ()))
    kv = found.get(KV_USAGE) or found.get(KV_USAGE_LEGACY) or ()
    usage = max((v for _, v in kv), default=0.0)
    lora: dict[str, str] = {}
    if LORA_INFO in found:
        lora = max(found[LORA_INFO], key=lambda s: s[1])[0]
    block_size: int | None = None
    num_blocks: int | None = None
    for labels, _ in found.get(CACHE_CONFIG, ()):
        block_size = _int_or_none(labels.get("block_size")) or block_size
        num_blocks = _int_or_none(labels.get("num_gpu_blocks")) or num_blocks
    return Metrics(
        waiting=int(waiting),
        running=int(running),
        kv_cache_usage=min(1.0, max(0.0, usage)),
        lora_running=_adapters(lora.get("running_lora_adapters")),
        lora_waiting=_adapters(lora.get("waiting_lora_adapters")),
        max_lora=_int_or_none(lora.get("max_lora")) or 0,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        updated_at=time.monotonic() if now is None else now,
    )
