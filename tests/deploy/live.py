"""A gateway in front of simulated pods with every family the deploy/ rules and dashboard
read: the recommended routing plus flow control (saturation, shedding), the precise prefix
index fed by the pods' own KV events (prefix hit rate, KV-event feed), outlier ejection and
retries. Used by the Prometheus and Grafana tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from heimdall_proxy.config.gateway import GatewayConfig, parse_config
from tests.conftest import RunningPod

ROOT = Path(__file__).resolve().parents[2]


def live_config(pods: list[RunningPod], model_dir: Path) -> GatewayConfig:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "config" / "recommended.yaml").read_text())
    doc["featureGates"] = ["flowControl"]
    doc["objectives"] = [
        {"name": "interactive", "priority": 10},
        {"name": "batch", "priority": -1},
    ]
    doc["plugins"] += [
        {
            "type": "utilization-detector",
            "parameters": {"queueDepthThreshold": 5, "metricsStalenessThreshold": "2s"},
        },
        {
            "type": "precise-prefix-cache-scorer",
            "parameters": {
                "tokenProcessorConfig": {"blockSize": 16},
                "indexerConfig": {
                    "tokenizersPoolConfig": {"modelName": str(model_dir), "workersCount": 1},
                    "kvBlockIndexConfig": {"enableMetrics": True},
                },
                "kvEventsConfig": {"concurrency": 1, "decodeProcesses": 0},
            },
        },
    ]
    doc["schedulingProfiles"][0]["plugins"].insert(
        -1, {"pluginRef": "precise-prefix-cache-scorer", "weight": 1}
    )
    doc["flowControl"] = {
        "defaultRequestTTL": "5s",
        "saturationDetector": {"pluginRef": "utilization-detector"},
    }
    doc["outlierDetection"] = {"consecutiveFailures": 2}
    doc["endpoints"] = [
        {"name": p.name, "url": p.url, "kvEvents": p.pod.kv_events_endpoint} for p in pods
    ]
    return parse_config(doc, "<deploy-live>")
