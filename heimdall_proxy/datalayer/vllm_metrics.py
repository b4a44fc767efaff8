"""Parse the vLLM metrics the scorers read out of a pod's Prometheus text exposition."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from heimdall_proxy.framework.types import Metrics

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
LORA_INFO = "vllm:lora_requests_info"
CACHE_CONFIG = "vllm:cache_config_info"

_WANTED = (WAITING, RUNNING, KV_USAGE, KV_USAGE_LEGACY, LORA_INFO, CACHE_CONFIG)
_WANTED_SET = frozenset(_WANTED)


def _relevant_lines(text: str) -> str:
    """Keep only the families we read: vLLM exposes hundreds of histogram lines, and the
    pure-Python parser's cost is per line."""
    keep = []
    for line in text.splitlines():
        if line.startswith("vllm:"):
            if line.startswith(_WANTED):
                name_end = min((i for i in (line.find("{"), line.find(" ")) if i > 0), default=-1)
                if line[:name_end] in _WANTED_SET:
                    keep.append(line)
        elif line.startswith("# "):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2] in _WANTED_SET:
                keep.append(line)
    keep.append("")
    return "\n".join(keep)


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


def parse_vllm_metrics(text: str, now: float | None = None) -> Metrics:
    """Build a Metrics snapshot. Counts are summed over samples (one per engine or data-parallel
    rank), KV usage is the maximum, `vllm:lora_requests_info` is read from its newest sample
    (its value is a timestamp). Raises ValueError on text the Prometheus parser rejects."""
    waiting = running = 0.0
    kv_usage: float | None = None
    kv_legacy: float | None = None
    lora_ts = float("-inf")
    lora_labels: dict[str, str] | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    for family in text_string_to_metric_families(_relevant_lines(text)):
        for sample in family.samples:
            name = sample.name
            if name == WAITING:
                waiting += sample.value
            elif name == RUNNING:
                running += sample.value
            elif name == KV_USAGE:
                kv_usage = sample.value if kv_usage is None else max(kv_usage, sample.value)
            elif name == KV_USAGE_LEGACY:
                kv_legacy = sample.value if kv_legacy is None else max(kv_legacy, sample.value)
            elif name == LORA_INFO:
                if sample.value >= lora_ts:
                    lora_ts = sample.value
                    lora_labels = sample.labels
            elif name == CACHE_CONFIG:
                block_size = _int_or_none(sample.labels.get("block_size")) or block_size
                num_blocks = _int_or_none(sample.labels.get("num_gpu_blocks")) or num_blocks
    usage = kv_usage if kv_usage is not None else (kv_legacy or 0.0)
    lora = lora_labels or {}
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
