"""/health, /ready, /metrics, /v1/models and the background data layer seen through the gateway."""

from __future__ import annotations

import aiohttp

from tests.conftest import GatewayFactory, PodFactory, eventually, make_config

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


async def test_health_ready_metrics(start_pod: PodFactory, start_gateway: GatewayFactory) -> None:
    pods = [await start_pod(), await start_pod()]
    pods[0].pod.metrics_override = {"waiting": 7, "kv_cache_usage": 0.25}
    gw = await start_gateway(make_config(pods))
    await eventually(lambda: gw.gateway.pool.get(pods[0].name).metrics.waiting == 7)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/health") as r:
            assert r.status == 200
        async with http.get(f"{gw.url}/ready") as r:
            assert r.status == 200
            assert (await r.json())["healthy_pods"] == 2
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
        async with http.get(f"{gw.url}/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    assert (
        f'inference_pool_per_pod_queue_size{{model_server_pod="{pods[0].name}",name="heimdall"}} 7.0'
        in text
    )
    assert (
        f'inference_pool_per_pod_kv_cache_utilization{{model_server_pod="{pods[0].name}",name="heimdall"}} 0.25'
        in text
    )
    assert 'inference_pool_ready_pods{name="heimdall"} 2.0' in text
    assert "inference_objective_request_total{" in text
    assert "inference_objective_request_duration_seconds_bucket{" in text
    assert (
        'inference_extension_plugin_duration_seconds_count{extension_point="Scorer",plugin_name="queue-scorer",plugin_type="queue-scorer"} 1.0'
        in text
    )
    assert "inference_extension_scheduler_e2e_duration_seconds_count 1.0" in text


async def test_failing_scrapes_take_a_pod_out_and_back(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    sick, well = await start_pod(), await start_pod()
    gw = await start_gateway(make_config([sick, well]))
    endpoint = gw.gateway.pool.get(sick.name)
    sick.pod.metrics_broken = True
    await eventually(lambda: not endpoint.healthy)
    assert endpoint.consecutive_failures >= 3
    async with aiohttp.ClientSession() as http:
        for _ in range(10):
            async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
                assert r.headers["x-sim-pod"] == well.name
        async with http.get(f"{gw.url}/ready") as r:
            assert (await r.json())["healthy_pods"] == 1
        # every pod unhealthy: not ready, but requests are still tried
        well.pod.metrics_broken = True
        await eventually(lambda: not gw.gateway.pool.get(well.name).healthy)
        async with http.get(f"{gw.url}/ready") as r:
            assert r.status == 503
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
            assert r.status == 200
        sick.pod.metrics_broken = False
    await eventually(lambda: endpoint.healthy)


async def test_models_union_and_background_refresh(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    a = await start_pod(model="llama", lora_modules=["sql-lora"])
    b = await start_pod(model="qwen")
    gw = await start_gateway(make_config([a, b]))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/v1/models") as r:
            ids = [m["id"] for m in (await r.json())["data"]]
        assert ids == ["llama", "qwen", "sql-lora"]
        # model-aware candidates: each model only reaches the pods that serve it
        for model, pod in (("llama", a), ("qwen", b), ("sql-lora", a)):
            for _ in range(4):
                body = {"model": model, "prompt": "x", "max_tokens": 1}
                async with http.post(f"{gw.url}/v1/completions", json=body) as r:
                    assert r.status == 200
                    assert r.headers["x-sim-pod"] == pod.name
        b.pod.options.lora_modules.append("new-lora")
        await eventually(lambda: "new-lora" in (gw.gateway.pool.get(b.name).models or ()))
        async with http.get(f"{gw.url}/v1/models") as r:
            ids = [m["id"] for m in (await r.json())["data"]]
        assert "new-lora" in ids
        # models of an unhealthy pod are not advertised
        b.pod.metrics_broken = True
        await eventually(lambda: not gw.gateway.pool.get(b.name).healthy)
        async with http.get(f"{gw.url}/v1/models") as r:
            ids = [m["id"] for m in (await r.json())["data"]]
        assert ids == ["llama", "sql-lora"]


async def test_loaded_pod_is_avoided(start_pod: PodFactory, start_gateway: GatewayFactory) -> None:
    pods = [await start_pod() for _ in range(3)]
    pods[0].pod.metrics_override = {"waiting": 20}
    pods[1].pod.metrics_override = {"waiting": 5}
    gw = await start_gateway(make_config(pods))
    await eventually(lambda: gw.gateway.pool.get(pods[0].name).metrics.waiting == 20)
    await eventually(lambda: gw.gateway.pool.get(pods[1].name).metrics.waiting == 5)
    async with aiohttp.ClientSession() as http:
        for _ in range(10):
            async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
                assert r.headers["x-sim-pod"] == pods[2].name
