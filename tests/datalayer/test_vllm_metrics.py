"""Parsing a vLLM /metrics page into a Metrics snapshot."""

from __future__ import annotations

import pytest

from heimdall_proxy.datalayer.vllm_metrics import CORE_FAMILIES, parse_vllm_metrics

# Abridged from a vLLM 0.3x pod running two engines (data parallel); the histogram, counter
# and process families are there to be skipped.
VLLM_METRICS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
python_gc_objects_collected_total{generation="1"} 678.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.2345678e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.2-1B"} 2.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.2-1B"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.2-1B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.2-1B"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.2-1B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.2-1B"} 0.4
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old-a",waiting_lora_adapters=""} 1.7000000001e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora, chat-lora",waiting_lora_adapters="tool-lora"} 1.7000000009e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="older",waiting_lora_adapters="x"} 1.7000000005e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048",num_gpu_blocks_override="None",swap_space="4"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.2-1B"} 5120.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.2-1B"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.2-1B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.005",model_name="meta-llama/Llama-3.2-1B"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.2-1B"} 17.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.2-1B"} 17.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.2-1B"} 1.234
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="meta-llama/Llama-3.2-1B"} 9.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.2-1B"} 9.0
vllm:request_queue_time_seconds_count{engine="0",model_name="meta-llama/Llama-3.2-1B"} 9.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="meta-llama/Llama-3.2-1B"} 0.5
# HELP vllm:num_requests_waiting_time_seconds Not a real vLLM family: shares a wanted prefix.
# TYPE vllm:num_requests_waiting_time_seconds histogram
vllm:num_requests_waiting_time_seconds_bucket{le="+Inf"} 99.0
vllm:num_requests_waiting_time_seconds_count 99.0
vllm:num_requests_waiting_time_seconds_sum 12.0
vllm:num_requests_running_total 50.0
"""

LEGACY = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.625
"""


def test_realistic_page() -> None:
    m = parse_vllm_metrics(VLLM_METRICS, now=123.5)
    assert m.waiting == 7  # 3 + 4 over the two engines
    assert m.running == 3  # 2 + 1; the histogram and the *_total lookalike are ignored
    assert m.kv_cache_usage == 0.4  # the fuller engine
    assert m.lora_running == ("sql-lora", "chat-lora")  # newest sample, split on commas
    assert m.lora_waiting == ("tool-lora",)
    assert m.max_lora == 4
    assert m.block_size == 16
    assert m.num_gpu_blocks == 2048
    assert m.updated_at == 123.5
    assert m.age(now=125.0) == 1.5


def test_gpu_cache_usage_fallback() -> None:
    m = parse_vllm_metrics(LEGACY, now=1.0)
    assert (m.waiting, m.running, m.kv_cache_usage) == (1, 5, 0.625)
    assert (m.lora_running, m.lora_waiting, m.max_lora) == ((), (), 0)
    assert (m.block_size, m.num_gpu_blocks) == (None, None)


def test_new_name_wins_over_legacy_name() -> None:
    text = LEGACY + (
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
    )
    assert parse_vllm_metrics(text).kv_cache_usage == 0.1


def test_kv_usage_is_clamped() -> None:
    text = "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 1.5\n"
    assert parse_vllm_metrics(text).kv_cache_usage == 1.0


def test_lora_newest_sample_wins_regardless_of_order() -> None:
    lines = [
        "# TYPE vllm:lora_requests_info gauge",
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="new",'
        'waiting_lora_adapters="a,b,,c"} 200.0',
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="old",'
        'waiting_lora_adapters=""} 100.0',
    ]
    m = parse_vllm_metrics("\n".join(lines) + "\n")
    assert m.lora_running == ("new",)
    assert m.lora_waiting == ("a", "b", "c")
    assert m.max_lora == 2


def test_untyped_samples_without_help_lines() -> None:
    text = "vllm:num_requests_waiting 2\nvllm:num_requests_running 9\n"
    m = parse_vllm_metrics(text)
    assert (m.waiting, m.running) == (2, 9)


def test_empty_text_gives_an_empty_snapshot() -> None:
    m = parse_vllm_metrics("", now=5.0)
    assert (m.waiting, m.running, m.kv_cache_usage) == (0, 0, 0.0)
    assert m.updated_at == 5.0


def test_updated_at_defaults_to_monotonic_now() -> None:
    import time

    before = time.monotonic()
    m = parse_vllm_metrics(LEGACY)
    assert before <= m.updated_at <= time.monotonic()


@pytest.mark.parametrize(
    "text",
    [
        'vllm:num_requests_waiting{engine="0"} not-a-number\n',
        'vllm:num_requests_running{engine="0} 1\n',
        'vllm:num_requests_waiting{engine="0"} 1 2 3\n',
        "vllm:num_requests_running\n",
        "# HELP vllm:kv_cache_usage_perc x\n# TYPE vllm:kv_cache_usage_perc gauge\n"
        "vllm:kv_cache_usage_perc{a=b} 0.5\n",
    ],
)
def test_garbage_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the parser's messages vary
        parse_vllm_metrics(text)


def test_only_the_asked_families_are_read() -> None:
    m = parse_vllm_metrics(VLLM_METRICS, families=CORE_FAMILIES)
    assert (m.waiting, m.running, m.kv_cache_usage) == (7, 3, 0.4)
    assert (m.lora_running, m.max_lora, m.block_size) == ((), 0, None)


def test_garbage_in_a_family_not_asked_for_is_never_looked_at() -> None:
    text = VLLM_METRICS + "vllm:lora_requests_info{max_lora=4} x\n"
    assert parse_vllm_metrics(text, families=CORE_FAMILIES).waiting == 7
    with pytest.raises(ValueError, match="malformed label"):
        parse_vllm_metrics(text)


def test_bytes_and_first_line_and_crlf() -> None:
    page = b'vllm:num_requests_waiting{a="x"} 2\r\nvllm:num_requests_waiting 3 1700000000\r\n'
    assert parse_vllm_metrics(page).waiting == 5
