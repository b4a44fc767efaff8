"""/metrics of a simulated pod in vLLM V1's Prometheus text exposition: the same metric names,
labels (`model_name`, `engine="0"`) and histogram buckets."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping

from heimdall_proxy.sim.engine import Engine, Histogram
from heimdall_proxy.sim.options import SimOptions


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    return repr(float(value))


class MetricsWriter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_num(value)}")

    def gauge(self, name: str, help_text: str, labels: Mapping[str, str], value: float) -> None:
        self.family(name, "gauge", help_text)
        self.sample(name, labels, value)

    def counter(self, name: str, help_text: str, labels: Mapping[str, str], value: float) -> None:
        self.family(name, "counter", help_text)
        self.sample(f"{name}_total", labels, value)

    def histogram(
        self, name: str, help_text: str, labels: Mapping[str, str], hist: Histogram
    ) -> None:
        self.family(name, "histogram", help_text)
        for bound, count in zip(hist.bounds, hist.counts, strict=True):
            self.sample(f"{name}_bucket", {**labels, "le": _num(bound)}, count)
        self.sample(f"{name}_bucket", {**labels, "le": "+Inf"}, hist.count)
        self.sample(f"{name}_count", labels, hist.count)
        self.sample(f"{name}_sum", labels, hist.total)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class LoraInfo:
    """vllm:lora_requests_info keeps one sample per label set it was ever set with, its value
    the time it was last set; readers take the newest. Kept bounded here."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.samples: OrderedDict[tuple[str, str], float] = OrderedDict()

    def update(self, running: list[str], waiting: list[str]) -> None:
        key = (",".join(running), ",".join(waiting))
        self.samples[key] = time.time()
        self.samples.move_to_end(key)
        while len(self.samples) > self.keep:
            self.samples.popitem(last=False)


def render(
    options: SimOptions,
    engine: Engine,
    lora_info: LoraInfo,
    override: Mapping[str, float],
) -> str:
    o = options
    base = {"model_name": o.model, "engine": "0"}
    s = engine.stats
    w = MetricsWriter()
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        base,
        override.get("running", engine.num_running),
    )
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        base,
        override.get("waiting", engine.num_waiting),
    )
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        base,
        override.get("kv_cache_usage", engine.pool.usage),
    )
    if o.lora_modules:
        running, waiting = engine.lora_adapters()
        lora_info.update(running, waiting)
        w.family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
        for (run, wait), ts in lora_info.samples.items():
            labels = {
                "max_lora": str(o.max_loras),
                "running_lora_adapters": run,
                "waiting_lora_adapters": wait,
            }
            w.sample("vllm:lora_requests_info", labels, ts)
    w.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        {
            "block_size": str(o.block_size),
            "cache_dtype": "auto",
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": str(o.enable_prefix_caching),
            "engine": "0",
            "gpu_memory_utilization": "0.9",
            "num_cpu_blocks": str(o.cpu_offload_blocks or "None"),
            "num_gpu_blocks": str(o.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
            "swap_space": "4",
        },
        1.0,
    )
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        base,
        s.preemptions,
    )
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        base,
        s.prefix_queries,
    )
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        base,
        s.prefix_hits,
    )
    w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", base, s.prompt_tokens)
    w.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        base,
        s.generation_tokens,
    )
    w.family("vllm:request_success", "counter", "Count of successfully processed requests.")
    for reason in ("stop", "length", "abort"):
        w.sample(
            "vllm:request_success_total",
            {**base, "finished_reason": reason},
            s.success.get(reason, 0),
        )
    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        base,
        s.ttft,
    )
    w.histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.",
        base,
        s.tpot,
    )
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        base,
        s.e2e,
    )
    w.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        base,
        s.queue,
    )
    return w.text()
