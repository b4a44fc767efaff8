"""--live-page: the page, its JSON routes' content, and who may read them."""

from __future__ import annotations

from typing import Any

import aiohttp

from heimdall_proxy.framework.trace import ScheduleTrace
from heimdall_proxy.server.picks import PickLog
from tests.conftest import GatewayFactory, PodFactory, eventually, make_config

EPP = {
    "plugins": [
        {"type": "prefix-cache-scorer"},
        {"type": "queue-scorer"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "queue-scorer", "weight": 1},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def call(
    method: str, url: str, body: Any = None, key: str | None = None
) -> tuple[int, Any, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url, json=body, headers=headers) as resp,
    ):
        text = await resp.text()
        doc = await resp.json() if resp.content_type == "application/json" else None
        return resp.status, doc, text


async def test_live_page_is_off_by_default(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(make_config([await start_pod()]))
    assert gw.gateway.picks is None and gw.gateway.director.picks is None
    for path in ("/live", "/live/api/pool"):
        status, _, _ = await call("GET", gw.url + path)
        assert status == 404


async def test_pool_shows_pods_load_and_picks(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    a, b = await start_pod(), await start_pod()
    gw = await start_gateway(make_config([a, b], EPP), live_page=True)
    status, _, html = await call("GET", gw.url + "/live")
    assert status == 200 and '"/live/api"' in html and "<script>" in html
    assert "http://" not in html and "https://" not in html  # nothing fetched off-site

    status, doc, _ = await call("GET", gw.url + "/live/api/pool")
    assert status == 200, doc
    assert doc["total_picks"] == 0 and doc["picks"] == []
    pods = {p["name"]: p for p in doc["pods"]}
    assert set(pods) == {a.name, b.name}
    for p in pods.values():
        assert p["healthy"] and not p["ejected"] and p["ejected_for"] == 0
        assert p["in_flight"] == 0 and p["recent_picks"] == 0 and p["prefix_hit_rate"] is None
        assert {"waiting", "running", "kv_cache_usage", "scrape_age", "address"} <= set(p)

    long = {**BODY, "messages": [{"role": "user", "content": "the same long prompt " * 200}]}
    for _ in range(3):
        status, _, _ = await call("POST", gw.url + "/v1/chat/completions", long)
        assert status == 200
    status, doc, _ = await call("GET", gw.url + "/live/api/pool")
    assert doc["total_picks"] == 3 and len(doc["picks"]) == 3
    assert [p["id"] for p in doc["picks"]] == [3, 2, 1]  # newest first
    first = doc["picks"][-1]
    assert first["traced"] and first["model"] == "sim-model" and first["profile"] == "default"
    # the same prompt three times: the later ones found it cached where the first went
    assert first["prefix"] == 0.0
    assert doc["picks"][0]["pod"] == first["pod"] and doc["picks"][0]["prefix"] > 0.5
    assert sum(p["recent_picks"] for p in doc["pods"]) == 3
    went = {p["name"]: p for p in doc["pods"]}[first["pod"]]
    assert went["prefix_hit_rate"] is not None

    # the first pick kept its trace: filters, scores and the pick, as the debug route's
    status, trace, _ = await call("GET", gw.url + f"/live/api/trace/{first['id']}")
    assert status == 200, trace
    (profile,) = trace["profiles"]
    assert trace["pick"]["name"] == first["pod"] and profile["picked"] == [first["pod"]]
    assert {s["scorer"] for s in profile["scorers"]} == {"prefix-cache-scorer", "queue-scorer"}
    assert sorted(profile["totals"]) == sorted([a.name, b.name])
    status, _, _ = await call("GET", gw.url + "/live/api/trace/999")
    assert status == 404


async def test_in_flight_and_ejection_are_shown(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    a = await start_pod()
    gw = await start_gateway(make_config([a]), live_page=True)
    gw.gateway.load.requests[a.name] = 2
    detector = gw.gateway.outliers
    for _ in range(max(1, detector.config.consecutive_failures)):
        detector.failure(a.name)
    status, doc, _ = await call("GET", gw.url + "/live/api/pool")
    assert status == 200, doc
    (pod,) = doc["pods"]
    assert pod["in_flight"] == 2
    assert pod["ejected"] and pod["ejected_for"] > 0 and pod["ejections"] == 1


async def test_decide_explains_a_body_and_forwards_nothing(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    a, b = await start_pod(), await start_pod()
    gw = await start_gateway(make_config([a, b], EPP), live_page=True)
    status, doc, _ = await call("POST", gw.url + "/live/api/decide/v1/chat/completions", BODY)
    assert status == 200, doc
    assert doc["forwarded"] is False and doc["pick"]["name"] in (a.name, b.name)
    assert doc["profiles"][0]["scorers"]
    assert gw.gateway.picks is not None and gw.gateway.picks.count == 0


async def test_api_needs_an_admin_key_when_keys_are_on(
    start_pod: PodFactory, start_gateway: GatewayFactory
) -> None:
    gw = await start_gateway(
        make_config([await start_pod()]),
        live_page=True,
        api_keys=("user",),
        admin_api_keys=("admin",),
    )
    # the page itself holds no data; it asks for the key
    status, _, html = await call("GET", gw.url + "/live")
    assert status == 200 and "admin key" in html
    for method, path, body in (
        ("GET", "/live/api/pool", None),
        ("GET", "/live/api/trace/1", None),
        ("POST", "/live/api/decide/v1/chat/completions", BODY),
    ):
        status, doc, _ = await call(method, gw.url + path, body)
        assert status == 401, (path, doc)
        status, doc, _ = await call(method, gw.url + path, body, key="user")
        assert status == 403, (path, doc)
        assert doc["error"]["code"] == "permission_denied"
    status, doc, _ = await call("GET", gw.url + "/live/api/pool", key="admin")
    assert status == 200 and len(doc["pods"]) == 1


async def test_picks_survive_a_reload(start_pod: PodFactory, start_gateway: GatewayFactory) -> None:
    a = await start_pod()
    gw = await start_gateway(make_config([a]), live_page=True)
    await call("POST", gw.url + "/v1/chat/completions", BODY)
    await gw.gateway.reload(make_config([a, await start_pod()]))
    assert gw.gateway.director.picks is gw.gateway.picks
    await call("POST", gw.url + "/v1/chat/completions", BODY)
    await eventually(lambda: gw.gateway.picks is not None and gw.gateway.picks.count == 2)


def test_pick_log_samples_traces_and_bounds_itself() -> None:
    log = PickLog(size=3, traces=2, trace_every=3600)
    first = log.want_trace()
    assert isinstance(first, ScheduleTrace) and log.want_trace() is None
    log.record("m", "default", "p1", 0.5, first)
    for pod in ("p1", "p2", "p2"):
        log.record("m", "default", pod, None, None)
    assert log.count == 4 and [p["id"] for p in log.recent()] == [4, 3, 2]
    assert log.per_pod() == {"p1": (1, None), "p2": (2, None)}
    assert log.find(1) is not None and log.find(2) is None
