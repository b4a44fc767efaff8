"""Disaggregated serving through the gateway, on simulated prefill, decode and encode pods:
the gateway's own prefill and encode hops, the mif-* headers, and failures that fall back to
decode-only."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from heimdall_proxy.config.gateway import ConfigError, parse_config
from heimdall_proxy.config.options import ServerOptions
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.server.gateway import Gateway
from tests.conftest import (
    GatewayFactory,
    PodFactory,
    RunningGateway,
    RunningPod,
    eventually,
    make_config,
)

ROOT = Path(__file__).resolve().parent.parent.parent
ROLE = "mif.moreh.io/role"

#: The reference's canonical example, verbatim.
CANONICAL = """
plugins:
- type: disagg-headers-handler
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: 16
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: prefix-based-pd-decider
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
"""


def canonical(**headers_params: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CANONICAL)
    if headers_params:
        doc["plugins"][0]["parameters"] = headers_params
    return doc


def with_prefix_cache(doc: dict[str, Any]) -> dict[str, Any]:
    doc["plugins"].insert(0, {"type": "prefix-cache-scorer"})
    decode = next(p for p in doc["schedulingProfiles"] if p["name"] == "decode")
    decode["plugins"].insert(1, {"pluginRef": "prefix-cache-scorer"})
    return doc


LONG = "Summarise the following report in detail. " + " ".join(
    f"paragraph-{i} holds numbers" for i in range(120)
)
SHORT = "hi"
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


async def pd_pods(start_pod: PodFactory, **decode_opts: Any) -> tuple[RunningPod, RunningPod]:
    prefill = await start_pod(labels={ROLE: "prefill"}, role="prefill", name="prefill-0")
    decode = await start_pod(labels={ROLE: "decode"}, role="decode", name="decode-0", **decode_opts)
    return prefill, decode


def bodies(pod: RunningPod, path: str | None = None) -> list[dict[str, Any]]:
    return [orjson.loads(r.body) for r in pod.pod.received if path is None or r.path == path]


def headers_of(pod: RunningPod) -> list[dict[str, str]]:
    return [{k.lower(): v for k, v in r.headers.items()} for r in pod.pod.received]


async def chat(
    gw: RunningGateway,
    content: Any,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[int, dict[str, str], bytes]:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": content}], **extra}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{gw.url}/v1/chat/completions", json=body, headers=headers or {}
        ) as r:
            return r.status, dict(r.headers), await r.read()


async def test_canonical_config_long_prompt_takes_a_prefill_hop_then_decode(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()), response_header=True)
    status, headers, body = await chat(
        gw, LONG, max_tokens=5, max_completion_tokens=5, stream_options={"include_usage": True}
    )
    assert status == 200, body
    assert orjson.loads(body)["usage"]["completion_tokens"] == 5
    # the prefill pod: prefill-only, not streamed, one token, no stream_options
    [hop] = bodies(prefill)
    assert hop["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert hop["stream"] is False
    assert hop["max_tokens"] == 1 and hop["max_completion_tokens"] == 1
    assert "stream_options" not in hop
    assert hop["messages"] == [{"role": "user", "content": LONG}]
    # the decode pod: the original request plus the prefill pod's kv_transfer_params
    [final] = bodies(decode)
    kv = final["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_block_ids"] and kv["remote_engine_id"]
    assert final["max_tokens"] == 5 and final["stream_options"] == {"include_usage": True}
    [sent] = headers_of(decode)
    assert sent["mif-prefill-endpoint"] == f"127.0.0.1:{prefill.server.port}"
    assert headers["x-prefiller-host-port"] == f"127.0.0.1:{prefill.server.port}"
    assert headers["x-decoder-host-port"] == f"127.0.0.1:{decode.server.port}"
    assert headers["x-sim-pod"] == "decode-0"
    assert (
        gw.metric("inference_objective_disagg_hops_total", {"stage": "prefill", "pod": "prefill-0"})
        == 1
    )


async def test_short_prompt_goes_to_decode_only(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()), response_header=True)
    status, headers, _ = await chat(gw, SHORT, max_tokens=2)
    assert status == 200
    assert prefill.pod.received == []
    [final] = bodies(decode)
    assert "kv_transfer_params" not in final
    assert "mif-prefill-endpoint" not in headers_of(decode)[0]
    assert "x-prefiller-host-port" not in headers


async def test_cached_prompt_skips_prefill(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], with_prefix_cache(canonical())))
    assert (await chat(gw, LONG, max_tokens=2))[0] == 200
    assert len(prefill.pod.received) == 1
    # the decode pod now holds the prompt (it pulled its KV): decode only, no new hop
    assert (await chat(gw, LONG, max_tokens=2))[0] == 200
    assert len(prefill.pod.received) == 1
    first, second = bodies(decode)
    assert "kv_transfer_params" in first and "kv_transfer_params" not in second


async def test_forged_client_header_is_removed(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    forged = {"mif-prefill-endpoint": "10.0.0.66:9999", "mif-encode-endpoints": "10.0.0.66:1"}
    assert (await chat(gw, SHORT, headers=forged))[0] == 200
    assert (await chat(gw, LONG, headers=forged))[0] == 200
    short, long_ = headers_of(decode)
    assert "mif-prefill-endpoint" not in short and "mif-encode-endpoints" not in short
    assert long_["mif-prefill-endpoint"] == f"127.0.0.1:{prefill.server.port}"
    assert "mif-encode-endpoints" not in long_
    assert all("mif-prefill-endpoint" not in h for h in headers_of(prefill))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_prefill_pod_down_is_served_decode_only_and_counted(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    decode = await start_pod(labels={ROLE: "decode"}, name="decode-0")
    dead = {
        "name": "prefill-dead",
        "url": f"http://127.0.0.1:{_free_port()}",
        "labels": {ROLE: "prefill"},
        "models": ["sim-model"],
    }
    cfg = make_config([decode], canonical(), extra_endpoints=[dead])
    # a long scrape interval keeps the dead pod in rotation (one failed scrape only)
    gw = await start_gateway(cfg, metrics_interval=30.0, response_header=True)
    status, headers, _ = await chat(gw, LONG, max_tokens=3)
    assert status == 200
    [final] = bodies(decode)
    assert "kv_transfer_params" not in final
    assert "mif-prefill-endpoint" not in headers_of(decode)[0]
    assert "x-prefiller-host-port" not in headers
    labels = {"stage": "prefill", "pod": "prefill-dead"}
    assert gw.metric("inference_objective_disagg_hop_failures_total", labels) == 1


async def test_prefill_pod_error_status_is_served_decode_only(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    prefill.pod.fail_status = 503
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    status, _, body = await chat(gw, LONG, max_tokens=3)
    assert status == 200, body
    assert len(prefill.pod.received) == 1
    assert "kv_transfer_params" not in bodies(decode)[0]
    labels = {"stage": "prefill", "pod": "prefill-0"}
    assert gw.metric("inference_objective_disagg_hop_failures_total", labels) == 1
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/metrics") as r:
            exposed = await r.text()
    assert "inference_objective_disagg_hop_failures_total{" in exposed


async def test_streaming_after_a_prefill_hop(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    status, headers, body = await chat(
        gw, LONG, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    usage = orjson.loads(events[-2][6:])["usage"]
    assert usage["completion_tokens"] == 4
    [hop] = bodies(prefill)
    assert hop["stream"] is False and "stream_options" not in hop
    [final] = bodies(decode)
    assert final["stream"] is True and final["kv_transfer_params"]["do_remote_prefill"]


@pytest.mark.parametrize("api", ["completions", "responses"])
async def test_completions_and_responses_take_the_prefill_hop(
    api: str, start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    if api == "completions":
        path, body = "/v1/completions", {"prompt": LONG, "max_tokens": 3}
    else:
        path, body = "/v1/responses", {"input": LONG, "max_output_tokens": 3}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}{path}", json={"model": "sim-model", **body}) as r:
            assert r.status == 200, await r.text()
            answer = await r.json()
    [hop] = bodies(prefill)
    assert hop["kv_transfer_params"]["do_remote_decode"] is True
    if api == "completions":
        assert hop["max_tokens"] == 1 and "max_completion_tokens" not in hop
        assert answer["usage"]["completion_tokens"] == 3
    else:
        assert hop["max_output_tokens"] == 1 and "max_tokens" not in hop
        assert answer["usage"]["output_tokens"] == 3
    [final] = bodies(decode)
    assert final["kv_transfer_params"]["do_remote_prefill"] is True
    assert final.get("max_tokens", final.get("max_output_tokens")) == 3


async def test_a_messages_request_is_served_by_its_decode_pod_alone(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    """The hops are vLLM OpenAI requests with transfer params: a long Messages API prompt,
    which the decider would send to prefill as chat, is served whole on the decode pod."""
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    body = {"model": "sim-model", "max_tokens": 3, "messages": [{"role": "user", "content": LONG}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/messages", json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["usage"]["output_tokens"] == 3
    assert not prefill.pod.received
    [final] = bodies(decode)
    assert "kv_transfer_params" not in final


async def test_headers_mode_sends_no_hop(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical(mode="headers")))
    assert (await chat(gw, LONG, max_tokens=2))[0] == 200
    assert prefill.pod.received == []
    [final] = bodies(decode)
    assert "kv_transfer_params" not in final
    assert headers_of(decode)[0]["mif-prefill-endpoint"] == f"127.0.0.1:{prefill.server.port}"


EPD: dict[str, Any] = {
    "plugins": [
        {"type": "prefill-header-handler"},
        {"type": "always-disagg-multimodal-decider"},
        {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 16}},
        {"type": "encode-filter"},
        {"type": "prefill-filter"},
        {"type": "decode-filter"},
        {"type": "max-score-picker"},
        {"name": "two", "type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 2}},
        {
            "type": "disagg-profile-handler",
            "parameters": {
                "deciders": {
                    "encode": "always-disagg-multimodal-decider",
                    "prefill": "prefix-based-pd-decider",
                }
            },
        },
    ],
    "schedulingProfiles": [
        {"name": "encode", "plugins": [{"pluginRef": "encode-filter"}, {"pluginRef": "two"}]},
        {"name": "prefill", "plugins": [{"pluginRef": "prefill-filter"}]},
        {"name": "decode", "plugins": [{"pluginRef": "decode-filter"}]},
    ],
}


async def test_multimodal_request_takes_the_encode_hop_then_prefill_and_decode(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    encoders = [
        await start_pod(labels={ROLE: "encode"}, role="encode", name=f"encode-{i}")
        for i in range(2)
    ]
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([*encoders, prefill, decode], EPD))
    other = {"type": "image_url", "image_url": {"url": "https://example.com/dog.png"}}
    content = [{"type": "text", "text": LONG}, IMAGE, other]
    status, _, body = await chat(gw, content, max_tokens=2)
    assert status == 200, body
    # one encoder request per image, text removed, one token, spread over both encoders
    hops = [b for e in encoders for b in bodies(e)]
    assert len(hops) == 2 and all(len(e.pod.received) == 1 for e in encoders)
    for hop in hops:
        assert hop["max_tokens"] == 1 and hop["stream"] is False
        [msg] = hop["messages"]
        assert [p["type"] for p in msg["content"]] == ["image_url"]
    [pre] = bodies(prefill)
    [final] = bodies(decode)
    assert len(final["ec_transfer_params"]) == 2
    assert pre["ec_transfer_params"] == final["ec_transfer_params"]
    assert final["kv_transfer_params"]["do_remote_prefill"] is True
    sent = headers_of(decode)[0]
    assert sorted(sent["mif-encode-endpoints"].split(",")) == sorted(
        f"127.0.0.1:{e.server.port}" for e in encoders
    )
    assert sent["mif-prefill-endpoint"] == f"127.0.0.1:{prefill.server.port}"
    # a text-only request skips the encoders
    assert (await chat(gw, SHORT))[0] == 200
    assert sum(len(e.pod.received) for e in encoders) == 2


async def test_responses_image_input_takes_the_encode_hop(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    encoder = await start_pod(labels={ROLE: "encode"}, role="encode", name="encode-0")
    decode = await start_pod(labels={ROLE: "decode"}, name="decode-0")
    gw = await start_gateway(make_config([encoder, decode], EPD))
    body = {
        "model": "sim-model",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": "https://example.com/cat.png"},
                ],
            }
        ],
        "max_output_tokens": 2,
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/responses", json=body) as r:
            assert r.status == 200, await r.text()
    [hop] = bodies(encoder)
    assert hop["messages"][0]["content"] == [IMAGE]
    [final] = bodies(decode)
    assert len(final["ec_transfer_params"]) == 1
    assert headers_of(decode)[0]["mif-encode-endpoints"] == f"127.0.0.1:{encoder.server.port}"


async def test_an_encoder_answering_without_params_counts_as_done(
    start_pod: PodFactory, start_gateway: GatewayFactory, tmp_path: Any
) -> None:
    """vLLM's shared-storage EC connectors answer 2xx without ec_transfer_params: the stage
    ran (the decode pod reads the output from storage), so it is named, not counted failed."""
    shared = {"ec_storage_path": str(tmp_path), "encode_cost_per_item": 0.5}
    encoder = await start_pod(
        labels={ROLE: "encode"}, role="encode", name="encode-0", ec_transfer_params=False,
        **shared,
    )  # fmt: skip
    decode = await start_pod(labels={ROLE: "decode"}, name="decode-0", **shared)
    gw = await start_gateway(make_config([encoder, decode], EPD))
    assert (await chat(gw, [{"type": "text", "text": "look"}, IMAGE]))[0] == 200
    [hop] = bodies(encoder)
    assert "ec_transfer_params" not in hop
    [final] = bodies(decode)
    assert "ec_transfer_params" not in final
    assert headers_of(decode)[0]["mif-encode-endpoints"] == f"127.0.0.1:{encoder.server.port}"
    labels = {"stage": "encode", "pod": "encode-0"}
    assert not gw.metric("inference_objective_disagg_hop_failures_total", labels)
    assert gw.metric("inference_objective_disagg_hops_total", labels) == 1


async def test_encode_pod_failure_is_served_and_counted(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    encoder = await start_pod(labels={ROLE: "encode"}, role="encode", name="encode-0")
    encoder.pod.fail_status = 500
    decode = await start_pod(labels={ROLE: "decode"}, name="decode-0")
    gw = await start_gateway(make_config([encoder, decode], EPD))
    assert (await chat(gw, [{"type": "text", "text": "look"}, IMAGE]))[0] == 200
    [final] = bodies(decode)
    assert "ec_transfer_params" not in final
    assert "mif-encode-endpoints" not in headers_of(decode)[0]
    labels = {"stage": "encode", "pod": "encode-0"}
    assert gw.metric("inference_objective_disagg_hop_failures_total", labels) == 1


LEGACY_PD = """
plugins:
- type: prefill-header-handler
- type: prefix-cache-scorer
  name: my-prefix
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 16}
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: pd-profile-handler
  parameters:
    prefixPluginType: prefix-cache-scorer
    prefixPluginName: my-prefix
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: my-prefix
"""


async def test_legacy_pd_profile_handler(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], yaml.safe_load(LEGACY_PD)))
    assert (await chat(gw, LONG, max_tokens=2))[0] == 200
    assert (await chat(gw, SHORT, max_tokens=2))[0] == 200
    assert (await chat(gw, LONG, max_tokens=2))[0] == 200  # cached on decode-0 now
    assert len(prefill.pod.received) == 1
    first, second, third = bodies(decode)
    assert "kv_transfer_params" in first
    assert "kv_transfer_params" not in second and "kv_transfer_params" not in third
    assert headers_of(decode)[0]["mif-prefill-endpoint"] == f"127.0.0.1:{prefill.server.port}"


# ---- configuration -------------------------------------------------------------------


def build(doc: dict[str, Any]) -> Gateway:
    cfg = parse_config({**doc, "endpoints": [{"name": "p", "url": "http://127.0.0.1:1"}]}, "t")
    return Gateway(cfg, ServerOptions(), load_builtin_plugins())


def test_example_configs_build() -> None:
    for name in ("pd-disagg.yaml", "epd-disagg.yaml"):
        doc = yaml.safe_load((ROOT / "config" / name).read_text())
        gw = build({k: v for k, v in doc.items() if k != "endpoints"})
        assert gw.plugins.handler_name == "disagg-profile-handler"


def test_a_decider_may_be_declared_after_its_handler_but_not_left_out() -> None:
    doc = canonical()
    decider = doc["plugins"].pop(1)
    doc["plugins"].append(decider)  # llm-d's configs do this
    gw = build(doc)
    assert gw.plugins.handler_name == "disagg-profile-handler"
    doc["plugins"].pop()
    with pytest.raises(
        ConfigError,
        match=r"deciders.prefill: decider 'prefix-based-pd-decider' is not declared",
    ):
        build(doc)


def test_the_headers_handler_may_be_declared_after_the_profile_handler() -> None:
    doc = canonical()
    doc["plugins"].append(doc["plugins"].pop(0))
    assert build(doc).plugins.handler_name == "disagg-profile-handler"


async def test_without_a_headers_handler_the_sidecar_does_the_hops_as_in_llm_d(
    start_pod: PodFactory, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """llm-d deprecated disagg-headers-handler: its profile handler names the prefill pod in
    x-prefiller-host-port and the decode pod's sidecar sends the hop. Said at start-up."""
    prefill, decode = await pd_pods(start_pod)
    doc = canonical()
    doc["plugins"].pop(0)  # no disagg-headers-handler
    with caplog.at_level(logging.WARNING):
        gw = await start_gateway(make_config([prefill, decode], doc))
    assert "routing sidecar, which sends the hops" in caplog.text
    forged = {"x-prefiller-host-port": "10.0.0.1:1"}  # never trusted from a client
    status, _, body = await chat(gw, LONG, max_tokens=2, headers=forged)
    assert status == 200, body
    assert not prefill.pod.received  # the gateway sent no hop
    [sent] = headers_of(decode)
    assert sent["x-prefiller-host-port"] == prefill.url.removeprefix("http://")
    assert "mif-prefill-endpoint" not in sent
    status, _, body = await chat(gw, SHORT, max_tokens=2, headers=forged)  # decided: no prefill
    assert "x-prefiller-host-port" not in headers_of(decode)[1]


def test_missing_profile_and_bad_primary_port_are_config_errors() -> None:
    doc = canonical()
    doc["schedulingProfiles"] = [p for p in doc["schedulingProfiles"] if p["name"] != "prefill"]
    with pytest.raises(
        ConfigError, match="no scheduling profile for the prefill profile 'prefill'"
    ):
        build(doc)
    legacy = yaml.safe_load(LEGACY_PD)
    legacy["plugins"][-1]["parameters"]["primaryPort"] = 70000
    with pytest.raises(ConfigError, match="primaryPort must be between 1 and 65535"):
        build(legacy)


def test_pd_profile_handler_decider_defaults_but_a_named_one_must_be_declared() -> None:
    legacy = yaml.safe_load(LEGACY_PD)
    legacy["plugins"] = [p for p in legacy["plugins"] if p["type"] != "prefix-based-pd-decider"]
    # the default decider, undeclared, is made with its defaults (the seeds' PD example)
    decider = build(legacy).plugins.plugins["prefix-based-pd-decider"]
    assert decider.params.non_cached_tokens == 0  # type: ignore[attr-defined]
    handler = next(p for p in legacy["plugins"] if p["type"] == "pd-profile-handler")
    handler.setdefault("parameters", {})["deciderPluginName"] = "my-decider"
    with pytest.raises(ConfigError, match="deciderPluginName: decider 'my-decider'"):
        build(legacy)


def test_no_decider_needs_no_headers_handler() -> None:
    doc = canonical()
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] != "disagg-headers-handler"]
    doc["plugins"][-1]["parameters"] = {}
    assert build(doc).plugins.handler_name == "disagg-profile-handler"


def test_builtin_registry_knows_every_disagg_type() -> None:
    types = set(load_builtin_plugins().types())
    assert {
        "disagg-profile-handler",
        "pd-profile-handler",
        "prefix-based-pd-decider",
        "always-disagg-pd-decider",
        "always-disagg-multimodal-decider",
        "prefill-filter",
        "decode-filter",
        "encode-filter",
        "disagg-headers-handler",
        "prefill-header-handler",
    } <= types


async def test_a_slow_prefill_pod_times_out_and_is_served_decode_only(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # at this time scale the prefill pod needs seconds for the prompt
    prefill = await start_pod(
        labels={ROLE: "prefill"}, role="prefill", name="prefill-0", time_scale=100.0
    )
    decode = await start_pod(labels={ROLE: "decode"}, role="decode", name="decode-0")
    epp = canonical(hopTimeout="200ms")
    gw = await start_gateway(make_config([prefill, decode], epp))
    status, _, _ = await chat(gw, LONG, max_tokens=2)
    assert status == 200
    assert "kv_transfer_params" not in bodies(decode)[0]
    labels = {"stage": "prefill", "pod": "prefill-0"}
    assert gw.metric("inference_objective_disagg_hop_failures_total", labels) == 1


async def test_streamed_responses_after_a_prefill_hop(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    body = {"model": "sim-model", "input": LONG, "max_output_tokens": 3, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/responses", json=body) as r:
            assert r.status == 200
            text = await r.text()
    assert "response.completed" in text
    [hop] = bodies(prefill)
    assert hop["stream"] is False and hop["max_output_tokens"] == 1 and hop["store"] is False
    [final] = bodies(decode)
    assert final["stream"] is True and final["max_output_tokens"] == 3
    assert final["kv_transfer_params"]["do_remote_prefill"] is True


def queue_ranked_prefill() -> dict[str, Any]:
    """The canonical config with queue-scorer ranking the prefill pods (sim pods report the
    waiting counts a test forces), so a test decides which prefill pod is tried first."""
    doc = canonical()
    doc["plugins"].insert(0, {"type": "queue-scorer"})
    prefill = next(p for p in doc["schedulingProfiles"] if p["name"] == "prefill")
    prefill["plugins"].insert(1, {"pluginRef": "queue-scorer"})
    return doc


@pytest.mark.parametrize("failure", ["unreachable", "status 503"])
async def test_a_failed_prefill_hop_goes_to_the_next_prefill_pod(
    start_pod: PodFactory, start_gateway: GatewayFactory, failure: str
) -> None:
    second = await start_pod(labels={ROLE: "prefill"}, role="prefill", name="prefill-1")
    second.pod.metrics_override = {"waiting": 10}  # ranked below the failing pod
    decode = await start_pod(labels={ROLE: "decode"}, role="decode", name="decode-0")
    if failure == "unreachable":
        first_name = "prefill-dead"
        dead = {"name": first_name, "url": f"http://127.0.0.1:{_free_port()}",
                "labels": {ROLE: "prefill"}, "models": ["sim-model"]}  # fmt: skip
        cfg = make_config([second, decode], queue_ranked_prefill(), extra_endpoints=[dead])
    else:
        first = await start_pod(labels={ROLE: "prefill"}, role="prefill", name="prefill-0")
        first.pod.fail_status = 503
        first_name = first.name
        cfg = make_config([first, second, decode], queue_ranked_prefill())
    # a long scrape interval keeps an unreachable pod in rotation (one failed scrape only)
    gw = await start_gateway(cfg, metrics_interval=0.02 if failure != "unreachable" else 30.0,
                             response_header=True)  # fmt: skip
    await _until_scraped(gw, second.name, waiting=10)
    status, headers, body = await chat(gw, LONG, max_tokens=3)
    assert status == 200, body
    [hop] = bodies(second)
    assert hop["kv_transfer_params"]["do_remote_decode"] is True
    [final] = bodies(decode)
    assert final["kv_transfer_params"]["do_remote_prefill"] is True  # the second pod's KV
    assert headers["x-prefiller-host-port"] == f"127.0.0.1:{second.server.port}"
    failed = {"stage": "prefill", "pod": first_name}
    assert gw.metric("inference_objective_disagg_hop_failures_total", failed) == 1
    served = {"stage": "prefill", "pod": second.name}
    assert gw.metric("inference_objective_disagg_hops_total", served) == 1


@pytest.mark.parametrize("limit", ["status 400", "one attempt"])
async def test_a_prefill_hop_is_not_retried_when_no_other_pod_would_do_better(
    start_pod: PodFactory, start_gateway: GatewayFactory, limit: str
) -> None:
    first = await start_pod(labels={ROLE: "prefill"}, role="prefill", name="prefill-0")
    first.pod.fail_status = 400 if limit == "status 400" else 503
    second = await start_pod(labels={ROLE: "prefill"}, role="prefill", name="prefill-1")
    second.pod.metrics_override = {"waiting": 10}
    decode = await start_pod(labels={ROLE: "decode"}, role="decode", name="decode-0")
    options = {"max_attempts": 1} if limit == "one attempt" else {}
    gw = await start_gateway(make_config([first, second, decode], queue_ranked_prefill()),
                             **options)  # fmt: skip
    await _until_scraped(gw, second.name, waiting=10)
    status, _, body = await chat(gw, LONG, max_tokens=3)
    assert status == 200, body
    assert len(first.pod.received) == 1 and not second.pod.received
    assert "kv_transfer_params" not in bodies(decode)[0]  # served decode-only


async def _until_scraped(gw: RunningGateway, pod: str, waiting: int) -> None:
    endpoint = gw.gateway.pool.get(pod)
    assert endpoint is not None
    await eventually(lambda: endpoint.metrics.waiting == waiting)


@pytest.mark.slow
async def test_a_prefill_hop_counts_on_its_pod_in_the_ledger_while_it_runs(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # a slow prefill pod (its prefill takes a good fraction of a second): the hop is seen
    prefill = await start_pod(
        labels={ROLE: "prefill"}, role="prefill", name="prefill-0", time_scale=20.0
    )
    decode = await start_pod(labels={ROLE: "decode"}, role="decode", name="decode-0")
    gw = await start_gateway(make_config([prefill, decode], canonical(hopTimeout="30s")))
    load = gw.gateway.load
    task = asyncio.create_task(chat(gw, LONG, max_tokens=2))
    await eventually(lambda: load.requests.get("prefill-0", 0) == 1)
    assert load.prompts["prefill-0"] > 100  # the prompt's tokens, whole
    assert load.requests.get("decode-0", 0) == 0  # the decode attempt waits for the hop
    status, _, _ = await task
    assert status == 200
    assert not any(load.requests.values()) and not any(load.prompts.values())
    assert load.sent["prefill-0"] == 1 and load.sent["decode-0"] == 1


async def test_a_failed_prefill_hop_leaves_nothing_in_the_ledger(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    prefill, decode = await pd_pods(start_pod)
    prefill.pod.fail_status = 503
    gw = await start_gateway(make_config([prefill, decode], canonical()))
    load = gw.gateway.load
    assert (await chat(gw, LONG, max_tokens=3))[0] == 200
    assert load.sent["prefill-0"] == 1  # the hop was counted, then released on failure
    assert not any(load.requests.values()) and not any(load.tokens.values())
    assert not any(load.prompts.values()) and load.attempts() == 0


async def test_a_failed_encode_hop_leaves_nothing_in_the_ledger(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    encoder = await start_pod(labels={ROLE: "encode"}, role="encode", name="encode-0")
    encoder.pod.fail_status = 500
    decode = await start_pod(labels={ROLE: "decode"}, name="decode-0")
    gw = await start_gateway(make_config([encoder, decode], EPD))
    load = gw.gateway.load
    assert (await chat(gw, [{"type": "text", "text": "look"}, IMAGE]))[0] == 200
    assert load.sent["encode-0"] == 1
    assert not any(load.requests.values()) and load.attempts() == 0


async def test_a_prefill_hop_cancelled_by_the_client_is_released(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    # a slow prefill pod: the client gives up while the hop runs
    prefill = await start_pod(
        labels={ROLE: "prefill"}, role="prefill", name="prefill-0", time_scale=50.0
    )
    decode = await start_pod(labels={ROLE: "decode"}, role="decode", name="decode-0")
    gw = await start_gateway(make_config([prefill, decode], canonical(hopTimeout="60s")))
    load = gw.gateway.load
    task = asyncio.create_task(chat(gw, LONG, max_tokens=2))
    await eventually(lambda: load.requests.get("prefill-0", 0) == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: gw.running() == 0)
    assert not any(load.requests.values()) and not any(load.tokens.values())
    assert not any(load.prompts.values()) and load.attempts() == 0
    assert load.sent.get("decode-0", 0) == 0  # it never got past the hop
