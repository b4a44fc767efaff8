"""Config parsing (heimdall_proxy.config.gateway) and plugin assembly (framework.loader.build_plugins)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from heimdall_proxy.config.build import PluginSet, build_plugins
from heimdall_proxy.config.gateway import (
    ConfigError,
    GatewayConfig,
    PluginConfig,
    load_config,
    parse_config,
)
from heimdall_proxy.datalayer.pool import EndpointPool
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams, PluginParams
from heimdall_proxy.framework.plugins import SchedulerProfileView
from heimdall_proxy.framework.registry import Registry
from heimdall_proxy.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ProfileResult,
    SchedulingResult,
)
from heimdall_proxy.plugins.builtins import load_builtin_plugins
from heimdall_proxy.plugins.requestcontrol.response_header import ResponseHeaderHandler
from heimdall_proxy.plugins.scheduling.filters.by_label import ByLabelFilter
from heimdall_proxy.plugins.scheduling.pickers.common import PickerParams
from heimdall_proxy.plugins.scheduling.pickers.max_score import MaxScorePicker
from heimdall_proxy.plugins.scheduling.profiles.single import SingleProfileHandler
from heimdall_proxy.plugins.scheduling.scorers.queue import QueueScorer

BUILTIN = load_builtin_plugins()

ENDPOINTS = [
    {"name": "pod-a", "url": "http://10.0.0.1:8000", "labels": {"tier": "gold"}},
    {"name": "pod-b", "url": "http://10.0.0.2:8000", "labels": {"tier": "silver"}},
]


def build(
    doc: Any, registry: Registry = BUILTIN, extra: list[PluginConfig] | None = None
) -> tuple[GatewayConfig, PluginSet]:
    cfg = parse_config(doc, "test.yaml")
    handle = PluginHandle(
        pool=EndpointPool(cfg.endpoints), feature_gates=frozenset(cfg.epp.feature_gates)
    )
    return cfg, build_plugins(cfg.epp, registry, handle, extra=extra)


def build_error(doc: Any, registry: Registry = BUILTIN) -> str:
    with pytest.raises(ConfigError) as info:
        build(doc, registry)
    return str(info.value)


def req() -> InferenceRequest:
    return InferenceRequest(
        api="completions", path="/v1/completions", model="m", body=b"{}", data={}, headers={}
    )


EPP = {
    "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [
        {"type": "by-label", "parameters": {"label": "tier", "validValues": ["gold"]}},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer", "name": "kv"},
        {"type": "max-score-picker"},
    ],
    "schedulingProfiles": [
        {
            "name": "default",
            "plugins": [
                {"pluginRef": "by-label"},
                {"pluginRef": "queue-scorer", "weight": 2.5},
                {"pluginRef": "kv"},
                {"pluginRef": "max-score-picker"},
            ],
        }
    ],
}


def check_epp(pset: PluginSet) -> None:
    assert list(pset.plugins) == ["by-label", "queue-scorer", "kv", "max-score-picker"]
    assert isinstance(pset.plugins["by-label"], ByLabelFilter)
    assert isinstance(pset.plugins["queue-scorer"], QueueScorer)
    [prof] = pset.resolved_profiles
    assert prof.name == "default"
    assert prof.filters == ["by-label"]
    assert prof.scorers == [("queue-scorer", 2.5), ("kv", 1.0)]
    assert prof.picker == "max-score-picker"
    assert prof.picker_defaulted is False
    assert pset.handler_name == "single-profile-handler"
    assert pset.handler_defaulted is True


# -- where the EPP config lives -----------------------------------------------------------


def test_epp_config_at_top_level() -> None:
    cfg, pset = build({**EPP, "endpoints": ENDPOINTS})
    check_epp(pset)
    assert cfg.source == "test.yaml"
    assert cfg.epp.kind == "EndpointPickerConfig"
    assert [e.name for e in cfg.endpoints] == ["pod-a", "pod-b"]


def test_epp_config_under_config_key_with_helm_keys_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    doc = {
        "global": {"imagePullSecrets": []},
        "gateway": {"name": "mif"},
        "config": EPP,
        "endpoints": ENDPOINTS,
    }
    with caplog.at_level(logging.INFO, logger="heimdall_proxy.config.gateway"):
        cfg, pset = build(doc)
    check_epp(pset)
    assert len(cfg.endpoints) == 2
    assert any("ignoring Helm keys gateway, global" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


def test_epp_config_as_embedded_yaml_string() -> None:
    import yaml

    cfg, pset = build({"config": yaml.safe_dump(EPP), "endpoints": ENDPOINTS, "global": {}})
    check_epp(pset)
    assert cfg.epp.api_version == "inference.networking.x-k8s.io/v1alpha1"


def test_endpoints_may_live_inside_config() -> None:
    cfg, _ = build({"config": {**EPP, "endpoints": ENDPOINTS}})
    assert [e.name for e in cfg.endpoints] == ["pod-a", "pod-b"]


def test_unknown_top_level_keys_are_ignored() -> None:
    _, pset = build({**EPP, "global": {"x": 1}, "somethingElse": 3})
    check_epp(pset)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ([1, 2], "the config must be a YAML mapping"),
        ({"config": [1]}, "`config:` must be a mapping"),
        ({"config": "plugins: [\n"}, "`config:` is not valid YAML"),
        ({"plugins": [{"name": "x"}]}, "plugins.0.type"),
        ({"endpoints": {"a": 1}}, "endpoints must be a list"),
    ],
)
def test_malformed_documents(doc: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc, "bad.yaml")
    assert str(info.value).startswith("bad.yaml: ")
    assert fragment in str(info.value)


def test_feature_gates_as_list_or_map() -> None:
    assert parse_config({"featureGates": ["a", "b"]}).epp.feature_gates == ["a", "b"]
    gates = parse_config({"featureGates": {"a": True, "b": False, "c": 1}}).epp.feature_gates
    assert gates == ["a", "c"]
    assert parse_config({"featureGates": None}).epp.feature_gates == []


# -- defaults -----------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [None, {}, {"plugins": []}, {"endpoints": ENDPOINTS}])
def test_default_plugins_when_none_declared(doc: Any) -> None:
    _, pset = build(doc)
    assert list(pset.plugins) == ["queue-scorer", "kv-cache-utilization-scorer", "max-score-picker"]
    [prof] = pset.resolved_profiles
    assert prof.name == "default"
    assert prof.filters == []
    assert prof.scorers == [("queue-scorer", 1.0), ("kv-cache-utilization-scorer", 1.0)]
    assert prof.picker == "max-score-picker"
    assert prof.picker_defaulted is False
    assert pset.handler_name == "single-profile-handler"
    assert isinstance(pset.scheduler.handler, SingleProfileHandler)


def test_default_profile_holds_every_filter_scorer_and_picker() -> None:
    doc = {
        "plugins": [
            {"type": "response-header-handler"},
            {"type": "by-label", "parameters": {"label": "tier", "validValues": ["gold"]}},
            {"type": "single-profile-handler", "name": "handler"},
            {"type": "running-requests-size-scorer"},
            {"type": "by-label-selector", "name": "sel"},
            {"type": "random-picker"},
        ]
    }
    _, pset = build(doc)
    [prof] = pset.resolved_profiles
    assert prof.name == "default"
    assert prof.filters == ["by-label", "sel"]
    assert prof.scorers == [("running-requests-size-scorer", 1.0)]
    assert prof.picker == "random-picker"
    assert prof.picker_defaulted is False
    assert pset.handler_name == "handler"
    assert pset.handler_defaulted is False
    assert list(pset.scheduler.profiles) == ["default"]
    assert [type(p) for p in pset.response_received] == [ResponseHeaderHandler]


def test_single_profile_gets_the_single_profile_handler_by_default() -> None:
    doc = {
        "plugins": [{"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "only", "plugins": [{"pluginRef": "queue-scorer"}]}],
    }
    _, pset = build(doc)
    assert pset.handler_defaulted is True
    assert pset.handler_name == "single-profile-handler"
    assert isinstance(pset.scheduler.handler, SingleProfileHandler)
    assert "single-profile-handler" not in pset.plugins


def test_missing_picker_defaults_to_max_score_picker() -> None:
    doc = {
        "plugins": [{"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "only", "plugins": [{"pluginRef": "queue-scorer"}]}],
    }
    _, pset = build(doc)
    [prof] = pset.resolved_profiles
    assert prof.picker == "max-score-picker"
    assert prof.picker_defaulted is True
    assert isinstance(pset.scheduler.profiles["only"].picker, MaxScorePicker)


def test_weight_defaults_to_one_and_zero_is_allowed() -> None:
    doc = {
        "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}],
        "schedulingProfiles": [
            {
                "name": "p",
                "plugins": [
                    {"pluginRef": "queue-scorer"},
                    {"pluginRef": "kv-cache-utilization-scorer", "weight": 0},
                ],
            }
        ],
    }
    _, pset = build(doc)
    assert pset.resolved_profiles[0].scorers == [
        ("queue-scorer", 1.0),
        ("kv-cache-utilization-scorer", 0.0),
    ]
    weights = [s.weight for s in pset.scheduler.profiles["p"].scorers]
    assert weights == [1.0, 0.0]


def test_built_scheduler_routes_by_config() -> None:
    _, pset = build({**EPP, "endpoints": [*ENDPOINTS, {"name": "pod-c", "url": "http://c:1"}]})
    pool_eps = [
        Endpoint("pod-a", "http://a:1", "a", 1, {"tier": "gold"}, Metrics(waiting=9)),
        Endpoint("pod-b", "http://b:1", "b", 1, {"tier": "silver"}, Metrics(waiting=0)),
        Endpoint("pod-c", "http://c:1", "c", 1, {"tier": "gold"}, Metrics(waiting=1)),
    ]
    result = pset.scheduler.schedule(CycleState(), req(), pool_eps)
    # by-label keeps a and c; c has the shorter queue.
    assert [e.name for e in result.primary.targets] == ["pod-c"]
    assert [e.name for e in result.fallback_order()] == ["pod-c", "pod-a"]


def test_extra_plugins_are_appended_unless_type_declared() -> None:
    extra = [PluginConfig(type="response-header-handler"), PluginConfig(type="queue-scorer")]
    _, pset = build(
        {"plugins": [{"type": "queue-scorer", "name": "q"}, {"type": "max-score-picker"}]},
        extra=extra,
    )
    assert list(pset.plugins) == ["q", "max-score-picker", "response-header-handler"]
    assert len(pset.response_received) == 1
    # The appended non-scheduling plugin does not land in the default profile.
    assert pset.resolved_profiles[0].scorers == [("q", 1.0)]


# -- errors -------------------------------------------------------------------------------


def test_unknown_plugin_type() -> None:
    msg = build_error({"plugins": [{"type": "no-such-plugin", "name": "mine"}]})
    assert "'mine'" in msg
    assert "unknown plugin type 'no-such-plugin'" in msg
    assert "queue-scorer" in msg  # lists the known types


def test_duplicate_plugin_name() -> None:
    msg = build_error(
        {"plugins": [{"type": "queue-scorer", "name": "x"}, {"type": "random-picker", "name": "x"}]}
    )
    assert msg == "duplicate plugin name 'x'"


def test_duplicate_plugin_name_by_default_type_name() -> None:
    msg = build_error({"plugins": [{"type": "queue-scorer"}, {"type": "queue-scorer"}]})
    assert "duplicate plugin name 'queue-scorer'" in msg


def test_plugin_ref_to_undeclared_plugin() -> None:
    msg = build_error(
        {
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "ghost"}]}],
        }
    )
    assert "scheduling profile 'p'" in msg
    assert "pluginRef 'ghost' names no declared plugin" in msg


@pytest.mark.parametrize(
    ("plugin_type", "point"),
    [("response-header-handler", "ResponseReceived"), ("single-profile-handler", "ProfileHandler")],
)
def test_non_scheduling_plugin_in_profile(plugin_type: str, point: str) -> None:
    msg = build_error(
        {
            "plugins": [{"type": plugin_type}, {"type": "queue-scorer"}],
            "schedulingProfiles": [
                {
                    "name": "p",
                    "plugins": [{"pluginRef": "queue-scorer"}, {"pluginRef": plugin_type}],
                }
            ],
        }
    )
    assert f"pluginRef '{plugin_type}'" in msg
    assert f"plugin type '{plugin_type}' is not a filter, scorer or picker" in msg
    assert f"it is: {point}" in msg


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("abc", "valid integer"), (0, "greater than or equal to 1"), (-2, "greater than or equal")],
)
def test_bad_parameter_type(value: object, fragment: str) -> None:
    msg = build_error(
        {
            "plugins": [
                {
                    "type": "max-score-picker",
                    "name": "mp",
                    "parameters": {"maxNumOfEndpoints": value},
                }
            ]
        }
    )
    assert msg.startswith("plugin 'mp' (type 'max-score-picker'): parameters.maxNumOfEndpoints: ")
    assert fragment in msg


def test_parameters_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"plugins\.0\.parameters"):
        parse_config({"plugins": [{"type": "queue-scorer", "parameters": [1, 2]}]}, "x")


def test_by_label_without_valid_values() -> None:
    msg = build_error({"plugins": [{"type": "by-label", "parameters": {"label": "tier"}}]})
    assert msg.startswith("plugin 'by-label' (type 'by-label'): parameters: ")
    assert "validValues is required unless allowsNoLabel is true" in msg
    assert "parameters.parameters" not in msg


def test_by_label_without_label() -> None:
    msg = build_error({"plugins": [{"type": "by-label", "parameters": {"validValues": ["a"]}}]})
    assert "parameters.label: Field required" in msg


def test_two_profile_handlers_of_one_type() -> None:
    msg = build_error(
        {
            "plugins": [
                {"type": "single-profile-handler", "name": "h1"},
                {"type": "single-profile-handler", "name": "h2"},
                {"type": "queue-scorer"},
            ]
        }
    )
    assert msg == "only one profile handler may be declared, found: 'h1', 'h2'"


class OtherHandler(BasePlugin[NoParams]):
    type = "other-profile-handler"

    def validate_profiles(self, profiles: Mapping[str, SchedulerProfileView]) -> None:
        """Works with any profiles."""

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        return [n for n in profiles if n not in results][:1]

    def process_results(
        self,
        state: CycleState,
        request: InferenceRequest,
        results: dict[str, ProfileResult | None],
    ) -> SchedulingResult:
        return SchedulingResult(results, next(iter(results)))


def fresh_registry() -> Registry:
    reg = Registry()
    reg.register("single-profile-handler")(SingleProfileHandler)
    reg.register("max-score-picker", PickerParams)(MaxScorePicker)
    reg.register("queue-scorer")(QueueScorer)
    return reg


def test_two_profile_handlers_of_different_types() -> None:
    reg = fresh_registry()
    reg.register("other-profile-handler")(OtherHandler)
    msg = build_error(
        {
            "plugins": [
                {"type": "single-profile-handler"},
                {"type": "queue-scorer"},
                {"type": "other-profile-handler"},
            ]
        },
        reg,
    )
    assert "only one profile handler" in msg
    assert "'single-profile-handler', 'other-profile-handler'" in msg


def test_custom_handler_runs_two_profiles() -> None:
    reg = fresh_registry()
    reg.register("other-profile-handler")(OtherHandler)
    _, pset = build(
        {
            "plugins": [{"type": "other-profile-handler"}, {"type": "queue-scorer"}],
            "schedulingProfiles": [
                {"name": "p1", "plugins": [{"pluginRef": "queue-scorer"}]},
                {"name": "p2", "plugins": []},
            ],
        },
        reg,
    )
    assert pset.handler_name == "other-profile-handler"
    assert [p.name for p in pset.resolved_profiles] == ["p1", "p2"]
    assert all(p.picker_defaulted for p in pset.resolved_profiles)
    a = Endpoint("a", "http://a:1", "a", 1)
    result = pset.scheduler.schedule(CycleState(), req(), [a])
    assert sorted(result.profile_results) == ["p1", "p2"]


def test_two_profiles_without_handler() -> None:
    msg = build_error(
        {
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [
                {"name": "a", "plugins": [{"pluginRef": "queue-scorer"}]},
                {"name": "b", "plugins": [{"pluginRef": "queue-scorer"}]},
            ],
        }
    )
    assert "2 scheduling profiles are declared but no profile handler" in msg


def test_single_profile_handler_rejects_two_profiles() -> None:
    msg = build_error(
        {
            "plugins": [{"type": "single-profile-handler"}, {"type": "queue-scorer"}],
            "schedulingProfiles": [
                {"name": "a", "plugins": [{"pluginRef": "queue-scorer"}]},
                {"name": "b", "plugins": [{"pluginRef": "queue-scorer"}]},
            ],
        }
    )
    assert msg == (
        "profile handler 'single-profile-handler': needs exactly one scheduling profile, found 2"
    )


def test_duplicate_profile_name() -> None:
    msg = build_error(
        {
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [{"name": "a"}, {"name": "a"}],
        }
    )
    assert msg == "duplicate scheduling profile name 'a'"


def test_two_pickers_in_one_profile() -> None:
    msg = build_error(
        {
            "plugins": [{"type": "max-score-picker"}, {"type": "random-picker", "name": "rnd"}],
            "schedulingProfiles": [
                {
                    "name": "p",
                    "plugins": [{"pluginRef": "max-score-picker"}, {"pluginRef": "rnd"}],
                }
            ],
        }
    )
    assert msg == "scheduling profile 'p' has two pickers: 'max-score-picker' and 'rnd'"


def test_two_pickers_in_the_default_profile() -> None:
    msg = build_error({"plugins": [{"type": "max-score-picker"}, {"type": "random-picker"}]})
    assert "scheduling profile 'default' has two pickers" in msg


def test_negative_weight() -> None:
    msg = build_error(
        {
            "plugins": [{"type": "queue-scorer"}],
            "schedulingProfiles": [
                {"name": "p", "plugins": [{"pluginRef": "queue-scorer", "weight": -1}]}
            ],
        }
    )
    assert "pluginRef 'queue-scorer': weight must be >= 0, got -1.0" in msg


def test_weight_on_a_non_scorer_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="heimdall_proxy.config.gateway"):
        _, pset = build(
            {
                "plugins": [{"type": "queue-scorer"}, {"type": "random-picker"}],
                "schedulingProfiles": [
                    {
                        "name": "p",
                        "plugins": [
                            {"pluginRef": "queue-scorer"},
                            {"pluginRef": "random-picker", "weight": 3},
                        ],
                    }
                ],
            }
        )
    assert pset.resolved_profiles[0].picker == "random-picker"
    assert any("'random-picker': weight ignored" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("endpoints", "fragment"),
    [
        (
            [{"name": "a", "url": "http://h:1"}, {"name": "a", "url": "http://h:2"}],
            "duplicate endpoint name 'a'",
        ),
        ([{"name": "a", "url": "ftp://h:1"}], "endpoints[0]: url: Value error, url must be"),
        ([{"name": "a", "url": "h:8000"}], "endpoints[0]: url"),
        ([{"name": "a", "url": "http://h:99999"}], "bad port in url 'http://h:99999'"),
        ([{"name": "a", "url": "http://:80"}], "endpoints[0]: url"),
        ([{"name": "ok", "url": "http://h:1"}, {"url": "http://h:2"}], "endpoints[1]: name"),
    ],
)
def test_bad_endpoints(endpoints: list[dict[str, Any]], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"endpoints": endpoints}, "e.yaml")
    assert str(info.value).startswith("e.yaml: ")
    assert fragment in str(info.value)


def test_endpoint_config_fields() -> None:
    cfg = parse_config(
        {
            "endpoints": [
                {
                    "name": "a",
                    "url": "http://10.1.2.3:8001/",
                    "labels": {"mif.moreh.io/role": "decode", "n": 3, "flag": True},
                    "kvEvents": "tcp://10.1.2.3:5557",
                    "models": ["m1"],
                },
                {"name": "b", "url": "https://secure.example"},
                {"name": "c", "url": "http://plain.example", "labels": None},
            ]
        }
    )
    a, b, c = cfg.endpoints
    assert a.url == "http://10.1.2.3:8001"  # trailing slash dropped
    assert (a.host, a.port) == ("10.1.2.3", 8001)
    assert a.labels == {"mif.moreh.io/role": "decode", "n": "3", "flag": "True"}
    assert a.kv_events == "tcp://10.1.2.3:5557"
    assert a.models == ["m1"]
    assert (b.host, b.port) == ("secure.example", 443)
    assert (c.port, c.labels, c.models) == (80, {}, None)


# -- feature gates ------------------------------------------------------------------------


class GatedScorer(BasePlugin[NoParams]):
    type = "gated-scorer"

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[Endpoint]
    ) -> Mapping[str, float]:
        return {e.name: 1.0 for e in endpoints}


def gated_registry() -> Registry:
    reg = fresh_registry()
    reg.register("gated-scorer", feature_gate="experimentalGate")(GatedScorer)
    return reg


def test_gated_plugin_without_gate_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="heimdall_proxy.config.gateway"):
        _, pset = build(
            {"plugins": [{"type": "gated-scorer", "name": "g"}, {"type": "queue-scorer"}]},
            gated_registry(),
        )
    assert pset.skipped == {"g": "experimentalGate"}
    assert list(pset.plugins) == ["queue-scorer"]
    assert pset.resolved_profiles[0].scorers == [("queue-scorer", 1.0)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'g'" in m and "'experimentalGate'" in m and "skipping" in m for m in warnings)


def test_referencing_a_skipped_plugin_names_the_gate() -> None:
    msg = build_error(
        {
            "plugins": [{"type": "gated-scorer", "name": "g"}, {"type": "queue-scorer"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "g"}]}],
        },
        gated_registry(),
    )
    assert "pluginRef 'g' is skipped because feature gate 'experimentalGate' is not enabled" in msg


def test_gated_plugin_with_gate_is_built() -> None:
    _, pset = build(
        {
            "featureGates": ["experimentalGate"],
            "plugins": [{"type": "gated-scorer", "name": "g"}],
            "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "g"}]}],
        },
        gated_registry(),
    )
    assert pset.skipped == {}
    assert isinstance(pset.plugins["g"], GatedScorer)
    assert pset.resolved_profiles[0].scorers == [("g", 1.0)]


def test_skipped_name_still_counts_for_duplicates() -> None:
    msg = build_error(
        {"plugins": [{"type": "gated-scorer", "name": "g"}, {"type": "queue-scorer", "name": "g"}]},
        gated_registry(),
    )
    assert msg == "duplicate plugin name 'g'"


# -- parameters and references ------------------------------------------------------------


def test_unknown_parameters_are_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="heimdall_proxy.config.gateway"):
        _, pset = build(
            {
                "plugins": [
                    {
                        "type": "max-score-picker",
                        "name": "mp",
                        "parameters": {"maxNumOfEndpoints": 2, "zeta": 1, "alpha": "x"},
                    }
                ]
            }
        )
    picker = pset.plugins["mp"]
    assert isinstance(picker, MaxScorePicker)
    assert picker.params.max_num_of_endpoints == 2
    messages = [r.getMessage() for r in caplog.records]
    assert (
        "plugin 'mp' (type 'max-score-picker'): ignoring unknown parameters alpha, zeta" in messages
    )


class RefParams(PluginParams):
    target: str


class Referrer(BasePlugin[RefParams]):
    """Looks up another plugin at construction, as disagg-profile-handler does."""

    type = "referrer"

    def __init__(self, name: str, params: RefParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self.target = handle.plugin(params.target)


class Exploding(BasePlugin[NoParams]):
    type = "exploding"

    def __init__(self, name: str, params: NoParams, handle: PluginHandle) -> None:
        raise ValueError("cannot work like this")


def ref_registry() -> Registry:
    reg = fresh_registry()
    reg.register("referrer", RefParams)(Referrer)
    reg.register("exploding")(Exploding)
    return reg


def test_plugin_references_resolve_to_earlier_plugins() -> None:
    _, pset = build(
        {
            "plugins": [
                {"type": "queue-scorer", "name": "q"},
                {"type": "referrer", "parameters": {"target": "q"}},
            ]
        },
        ref_registry(),
    )
    ref = pset.plugins["referrer"]
    assert isinstance(ref, Referrer)
    assert ref.target is pset.plugins["q"]


def test_a_reference_to_a_later_plugin_resolves_as_llm_d_does() -> None:
    _, pset = build(
        {
            "plugins": [
                {"type": "referrer", "name": "r2", "parameters": {"target": "r1"}},
                {"type": "referrer", "name": "r1", "parameters": {"target": "q"}},
                {"type": "queue-scorer", "name": "q"},
            ]
        },
        ref_registry(),
    )
    assert list(pset.plugins)[:3] == ["q", "r1", "r2"]  # each after the one it names
    assert pset.plugins["r2"].target is pset.plugins["r1"]  # type: ignore[attr-defined]


def test_a_reference_to_no_plugin_or_a_circle_is_a_config_error() -> None:
    msg = build_error(
        {"plugins": [{"type": "referrer", "parameters": {"target": "q"}}]}, ref_registry()
    )
    assert msg == "plugin 'referrer' (type 'referrer'): plugin 'q' is not declared"
    msg = build_error(
        {
            "plugins": [
                {"type": "referrer", "name": "a", "parameters": {"target": "b"}},
                {"type": "referrer", "name": "b", "parameters": {"target": "a"}},
            ]
        },
        ref_registry(),
    )
    assert msg == "plugin 'a' (type 'referrer'): plugin 'b' is not declared"


def test_factory_value_error_becomes_config_error() -> None:
    msg = build_error({"plugins": [{"type": "exploding", "name": "boom"}]}, ref_registry())
    assert msg == "plugin 'boom' (type 'exploding'): cannot work like this"


def test_registry_rejects_double_registration() -> None:
    reg = Registry()
    reg.register("x", aliases=("y",))(QueueScorer)
    assert "x" in reg
    assert "y" in reg
    assert reg.types() == ["x", "y"]
    with pytest.raises(ValueError, match="'y' registered twice"):
        reg.register("y")(QueueScorer)


# -- load_config --------------------------------------------------------------------------


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        "config:\n"
        "  plugins:\n"
        "    - type: queue-scorer\n"
        "endpoints:\n"
        "  - name: a\n"
        "    url: http://127.0.0.1:8001\n",
        encoding="utf-8",
    )
    cfg = load_config(path)
    assert cfg.source == str(path)
    assert [p.type for p in cfg.epp.plugins] == ["queue-scorer"]
    assert cfg.endpoints[0].port == 8001


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "cannot read config" in str(info.value)


def test_load_config_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("plugins: [\n  - type: x\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: invalid YAML")


def test_load_config_validation_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "eps.yaml"
    path.write_text("endpoints:\n  - name: a\n    url: nope\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"eps\.yaml: endpoints\[0\]: url"):
        load_config(path)


def test_load_config_empty_file_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    cfg = load_config(path)
    pset = build_plugins(cfg.epp, BUILTIN, PluginHandle(EndpointPool([])))
    assert [getattr(p, "type", None) for p in pset.plugins.values()] == [
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "max-score-picker",
    ]
    assert cfg.endpoints == []


# ---- the data layer's section: llm-d's `dataLayer`, and `data`, its older name -------------


def test_data_layer_section_read_under_either_name() -> None:
    from heimdall_proxy.config.gateway import parse_config

    wiring = {"sources": [{"pluginRef": "models", "extractors": [{"pluginRef": "extract"}]}]}
    plugins = [
        {"type": "models-data-source", "name": "models"},
        {"type": "models-data-extractor", "name": "extract"},
    ]
    for key in ("dataLayer", "data"):
        epp = parse_config({"plugins": plugins, key: wiring}, "<test>").epp
        assert epp.data_layer is not None and epp.data_layer.sources[0].plugin_ref == "models"
    with pytest.raises(ConfigError, match="dataLayer and data are the same section"):
        parse_config({"plugins": plugins, "data": wiring, "dataLayer": wiring}, "<test>")
