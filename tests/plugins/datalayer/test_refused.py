"""Types that cannot run here are refused at load, saying why and what to use instead: the
integration-test harness's mock-metrics-source and llm-d's multicluster types. llm-d's own
test configs that name the mock fail loudly rather than load without metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from heimdall_proxy.plugins.datalayer.refused import MULTICLUSTER_TYPES
from tests.plugins.datalayer.test_models import build_error

LLMD_DATALAYER_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: openai-parser
  - type: mock-metrics-source
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
requestHandler:
  parsers:
  - pluginRef: openai-parser
dataLayer:
  sources:
  - pluginRef: mock-metrics-source
"""


def test_mock_metrics_source_is_a_test_fake() -> None:
    error = build_error(yaml.safe_load(LLMD_DATALAYER_CONFIG))
    assert "mock-metrics-source is not a plugin of llm-d's" in error
    assert "metrics-data-source with core-metrics-extractor" in error


@pytest.mark.parametrize("type_name", MULTICLUSTER_TYPES)
def test_multicluster_types_say_why(type_name: str) -> None:
    error = build_error({"plugins": [{"type": type_name, "parameters": {"scheme": "https"}}]})
    assert f"(type {type_name!r})" in error
    assert "route between clusters" in error and "one pool" in error


def test_the_fixtures_substitute_the_real_metrics_for_the_mock() -> None:
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "llm_d"
    for stem in ("datalayer-config", "request-attribute-reporter-config"):
        doc = yaml.safe_load((fixtures / f"{stem}.yaml").read_text())
        types = {p["type"] for p in doc["plugins"]}
        assert "mock-metrics-source" not in types
        assert {"metrics-data-source", "core-metrics-extractor"} <= types
