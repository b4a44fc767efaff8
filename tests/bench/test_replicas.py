"""bench/replicas.py: the shared config it derives from a gateway config."""

from __future__ import annotations

from bench.replicas import shared_config


def test_redis_config_goes_on_the_shareable_plugins_only() -> None:
    doc = {
        "config": {
            "plugins": [
                {"type": "prefix-cache-scorer", "parameters": {"autoTune": False}},
                {"type": "outstanding-work-scorer"},
                {"type": "load-aware-scorer"},
            ]
        }
    }
    out = shared_config(doc, "redis://h:1", "k:", "50ms")
    plugins = out["config"]["plugins"]
    rc = {"address": "redis://h:1", "keyPrefix": "k:"}
    assert plugins[0]["parameters"] == {
        "autoTune": False,
        "redisConfig": rc,
        "syncInterval": "50ms",
    }
    assert plugins[1]["parameters"] == {"redisConfig": rc, "syncInterval": "50ms"}
    assert "parameters" not in plugins[2]
    assert "parameters" not in doc["config"]["plugins"][1]  # the input is left as it was
