"""bench/compare.py: targets, config rewriting, simulator flags, the RESULTS.md section, plots."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench import compare
from bench.harness import gateway, pods, runner, targets
from bench.harness.pods import FleetSpec, Pod
from bench.harness.targets import Target
from bench.harness.workloads import TimedRequest, Workload
from heimdall_proxy.config.gateway import parse_config

REPO = Path(__file__).resolve().parents[2]
PODS = [Pod("pod-0", 9001), Pod("pod-1", 9002, kv_events_port=9102), Pod("pod-2", 9003)]


def _load(name: str) -> dict:
    return yaml.safe_load((REPO / "config" / name).read_text())


def test_parse_target() -> None:
    assert targets.parse_target("round_robin") == Target("vllm-router", "round_robin")
    assert targets.parse_target("vllm-router:cache_aware") == Target("vllm-router", "cache_aware")
    gw = targets.parse_target("gateway:config/demo.yaml")
    assert gw == Target("gateway", "config/demo.yaml")
    assert targets.parse_target("config/x.yml").kind == "gateway"
    assert gw.label == "heimdall-proxy demo.yaml"
    assert gw.slug == "heimdall-proxy-demo"
    for bad in ("nope", "vllm-router:nope", "envoy:x"):
        with pytest.raises(ValueError, match="unknown"):
            targets.parse_target(bad)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.yaml")))
def test_config_rewrite_keeps_plugins_and_replaces_endpoints(name: str) -> None:
    doc = _load(name)
    before = yaml.safe_dump(doc)
    out = gateway.gateway_config(doc, PODS)
    assert yaml.safe_dump(doc) == before  # the input is not modified
    assert [e["url"] for e in out["endpoints"]] == [
        "http://127.0.0.1:9001",
        "http://127.0.0.1:9002",
        "http://127.0.0.1:9003",
    ]
    assert out["endpoints"][1]["kvEvents"] == "tcp://127.0.0.1:9102"
    assert "kvEvents" not in out["endpoints"][0]
    for key in set(doc) - {"endpoints"}:
        assert out[key] == doc[key], key
    cfg = parse_config(out, name)
    assert [e.name for e in cfg.endpoints] == ["pod-0", "pod-1", "pod-2"]
    original = parse_config(doc, name)
    assert cfg.epp == original.epp


def test_config_rewrite_cycles_labels_by_position() -> None:
    doc = _load("heimdall-values.yaml")  # EndpointPickerConfig under `config:`, two labelled pods
    out = gateway.gateway_config(doc, PODS)
    assert out["config"] == doc["config"]
    assert out["endpoints"][0]["labels"] == {"mif.moreh.io/role": "decode"}
    assert out["endpoints"][1]["labels"] == {"mif.moreh.io/role": "both"}
    assert out["endpoints"][2]["labels"] == {"mif.moreh.io/role": "decode"}  # cycled
    assert gateway.gateway_config({}, PODS[:1]) == {
        "endpoints": [{"name": "pod-0", "url": "http://127.0.0.1:9001"}]
    }


def test_sim_args_split_on_supported_flags() -> None:
    supported = {"--max-num-seqs", "--ttft"}
    kept, dropped = pods.split_sim_args(
        ["--max-num-seqs", "8", "--time-scale=0.5", "--lora-modules", "a", "b", "--ttft", "1s"],
        supported,
    )
    assert kept == ["--max-num-seqs", "8", "--ttft", "1s"]
    assert dropped == ["--time-scale=0.5", "--lora-modules", "a", "b"]


@pytest.mark.slow
def test_sim_flags_reads_the_installed_simulator() -> None:
    flags = pods.sim_flags()
    assert {"--port", "--name", "--model", "--max-num-seqs"} <= flags


def test_commands() -> None:
    spec = FleetSpec(2, "m", ["--max-num-seqs", "4"], 0.5, 7, "auto", {"--time-scale", "--seed"})
    argv = pods.sim_command(spec, PODS[1], 1)
    assert argv[argv.index("--port") + 1] == "9002"
    assert argv[argv.index("--time-scale") + 1] == "0.5"
    assert argv[argv.index("--seed") + 1] == "8"
    assert argv[argv.index("--kv-events-port") + 1] == "9102"
    assert argv[-2:] == ["--max-num-seqs", "4"]
    assert "--kv-events-replay-port" not in argv
    assert not spec.kv_events_for(Target("gateway", "x.yaml"))
    spec.supported |= {"--kv-events-port", "--kv-events-replay-port"}
    assert spec.kv_events_for(Target("gateway", "x.yaml"))
    assert not spec.kv_events_for(Target("vllm-router", "round_robin"))
    replay = pods.sim_command(spec, Pod("p", 1, 2, 3), 0)
    assert replay[replay.index("--kv-events-replay-port") + 1] == "3"
    old_sim = FleetSpec(2, "m", [], 0.5, 7, "off", set())
    assert "--time-scale" not in pods.sim_command(old_sim, PODS[0], 0)

    rr = targets.router_command(Target("vllm-router", "round_robin"), PODS[:2], 8000, None, [])
    assert rr[rr.index("--policy") + 1] == "round_robin"
    i = rr.index("--worker-urls")
    assert rr[i + 1 : i + 3] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    gw = targets.router_command(
        Target("gateway", "c.yaml"), PODS, 8000, Path("/tmp/x.yaml"), ["-v", "4"]
    )
    assert gw[gw.index("--config") + 1] == "/tmp/x.yaml"
    assert gw[gw.index("--port") + 1] == "8000"
    assert gw[-2:] == ["-v", "4"]


def _fake_run(label: str, wall: float) -> targets.TargetRun:
    reqs = [
        runner.RequestResult(
            "a",
            "short",
            "/v1/completions",
            0.0,
            ttft=0.1,
            e2e=1.0,
            pod="pod-0",
            completion_tokens=30,
        ),
        runner.RequestResult(
            "b",
            "heavy",
            "/v1/completions",
            0.0,
            ttft=0.2,
            e2e=2.0,
            pod="pod-1",
            completion_tokens=1050,
        ),
    ]
    series = runner.PodSeries("pod-0", "http://x")
    series.add(0.0, {"waiting": 0, "running": 1})
    series.add(0.5, {"waiting": 2, "running": 1})
    series.add(1.0, {"waiting": 0, "running": 0})
    summary = runner.summarize(reqs, wall, [series])
    result = runner.RunResult({"label": label}, summary, reqs, [series])
    return targets.TargetRun(targets.parse_target(label), result, 1.5, {})


def test_results_section_is_replaced_in_place(tmp_path: Path) -> None:
    runs = [_fake_run("round_robin", 10.0), _fake_run("gateway:config/demo.yaml", 8.0)]
    wl = Workload("wl-x", {}, [TimedRequest("a", 0.0, "/v1/completions", {}, "short")])
    spec = FleetSpec(4, "sim-model", ["--max-num-seqs", "8"], 0.25, 42, "auto", set())
    machine = {
        "arch": "x86_64",
        "nproc": "2",
        "cpu": "Some CPU",
        "python": "3.11.7",
        "os": "Linux",
        "commit": "abc1234",
        "vllm_router": "0.1.17",
    }
    section = compare.render_section(
        wl,
        runs,
        command="python -m bench.compare -w wl-x",
        machine=machine,
        spec=spec,
        dropped=["--time-scale", "0.25"],
        plot="plots/wl-x-queues.png",
        notes=compare.auto_notes(runs, spec),
    )
    assert "python -m bench.compare -w wl-x" in section
    assert "x86_64, 2 CPUs (Some CPU)" in section and "Python 3.11.7" in section
    assert "| vllm-router round_robin | 10.0 | 0.15 | " in section
    assert "| heimdall-proxy demo.yaml | 8.0 |" in section
    assert "![per-pod queue" in section and "plots/wl-x-queues.png" in section
    assert "no `--time-scale`" in section
    assert "| vllm-router round_robin | 1 / 0.0k | 1 / 1.1k |" in section
    assert "Prefix hit rate n/a" in section
    assert "KV events on" not in section  # the simulator in `spec` has no --kv-events-port

    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n## Overhead\n\nkept text\n")
    compare.write_section(results, "wl-x", section)
    compare.write_section(results, "other", section.replace("wl-x", "other"))
    compare.write_section(results, "wl-x", section.replace("10.0", "11.0"))
    text = results.read_text()
    assert text.startswith("# Results\n\n## Overhead\n\nkept text\n")
    assert text.count("<!-- routing:wl-x:begin -->") == 1
    assert text.count("<!-- routing:other:begin -->") == 1
    assert "| vllm-router round_robin | 11.0 |" in text
    assert text.index("routing:wl-x:begin") < text.index("routing:other:begin")


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench.harness.plots import plot_queues

    runs = [_fake_run("round_robin", 1.0), _fake_run("cache_aware", 1.2)]
    out = plot_queues([(r.target.label, r.result.to_json()) for r in runs], tmp_path / "q.png", "t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_summary() -> None:
    doc = {
        "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "queue-scorer", "weight": 2},
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    }
    assert gateway.profile_summary(doc) == "default: queue-scorer x2, max-score-picker"
    assert gateway.profile_summary({"config": doc, "gateway": {}}) == gateway.profile_summary(doc)
    assert gateway.profile_summary({"plugins": doc["plugins"]}) == (
        "default: queue-scorer, max-score-picker"
    )
    assert gateway.profile_summary({}) == "default: (Heimdall defaults)"
