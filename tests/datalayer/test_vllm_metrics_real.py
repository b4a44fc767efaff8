"""The vLLM metrics parser on a /metrics page captured from a real vLLM 0.32 CPU pod.

The fixture was taken by bench/real_vllm/capture_fixtures.py from a pod serving the tiny test
model with --block-size 32, --max-num-seqs 2 and a 64-block KV cache, while four requests were
in flight: two running, two waiting. It is the full page (586 lines, histograms and all), so it
also checks that the line filter in front of the Prometheus parser keeps what matters.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from heimdall_proxy.datalayer.vllm_metrics import parse_vllm_metrics

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metrics_real.txt"


@pytest.fixture(scope="module")
def text() -> str:
    return FIXTURE.read_text()


def test_real_page_parses_to_the_pod_state(text: str) -> None:
    m = parse_vllm_metrics(text, now=1.0)
    assert m.running == 2
    assert m.waiting == 2
    assert m.kv_cache_usage == pytest.approx(0.2857142857142857)
    assert m.block_size == 32
    assert m.num_gpu_blocks == 64
    assert m.updated_at == 1.0


def test_no_lora_metric_means_no_adapters(text: str) -> None:
    assert "vllm:lora_requests_info" not in text
    m = parse_vllm_metrics(text)
    assert m.lora_running == ()
    assert m.lora_waiting == ()
    assert m.max_lora == 0


def test_waiting_by_reason_is_not_counted_as_waiting(text: str) -> None:
    # vLLM 0.32 adds vllm:num_requests_waiting_by_reason, whose name starts with the waiting
    # gauge's: summing it in would double the queue.
    assert 'vllm:num_requests_waiting_by_reason{engine="0"' in text
    assert parse_vllm_metrics(text).waiting == 2


def test_line_filter_agrees_with_parsing_the_whole_page(text: str) -> None:
    """The full Prometheus parse of the unfiltered page gives the same numbers."""
    values: dict[str, float] = {}
    labels: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
            elif sample.name == "vllm:kv_cache_usage_perc":
                values[sample.name] = sample.value
            elif sample.name == "vllm:cache_config_info":
                labels = sample.labels
    m = parse_vllm_metrics(text)
    assert m.running == int(values["vllm:num_requests_running"])
    assert m.waiting == int(values["vllm:num_requests_waiting"])
    assert m.kv_cache_usage == pytest.approx(values["vllm:kv_cache_usage_perc"])
    assert m.block_size == int(labels["block_size"])
    assert m.num_gpu_blocks == int(labels["num_gpu_blocks"])
