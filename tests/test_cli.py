"""The command line: check-config, config errors before binding, and the demo as a newcomer
runs it."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import openai
import pytest

from heimdall_proxy.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "config").glob("*.yaml"))


def test_there_are_example_configs() -> None:
    assert len(CONFIGS) >= 3


ONE_POD = "\nendpoints:\n- name: a\n  url: http://127.0.0.1:9\n"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_example_configs_load(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = path.read_text()
    if "\nendpoints:" not in text and "\ndiscovery:" not in text:
        # a template (the demo's, say): refused until it names pods, then valid
        assert main(["check-config", str(path)]) == 1
        assert "no endpoints and no discovery" in capsys.readouterr().err
        path = tmp_path / path.name
        path.write_text(text + ONE_POD)
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("config OK")
    assert "scheduling profiles:" in out


@pytest.mark.parametrize("text", ["", "endpoints: []\n", "plugins:\n- type: queue-scorer\n"])
def test_a_config_without_pods_is_an_error_never_simulated_pods(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "empty.yaml"
    cfg.write_text(text)
    assert main(["check-config", str(cfg)]) == 1
    assert "no endpoints and no discovery" in capsys.readouterr().err
    assert main(["--config", str(cfg), "--port", "1"]) == 1  # before any pod or port
    assert "no endpoints and no discovery" in capsys.readouterr().err


def test_unknown_keys_are_warned_about_with_the_likely_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(
        "plugins:\n- type: queue-scorer\n  weight: 2\n"
        "schedulingProfile:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n"
        "  - pluginRef: max-score-picker\n    wieght: 2\n" + ONE_POD
    )
    assert main(["check-config", str(cfg)]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert any("'schedulingProfile'" in m and "'schedulingProfiles'" in m for m in warned)
    assert any("plugin 'queue-scorer'" in m and "weight" in m and "pluginRef" in m for m in warned)
    cfg.write_text(
        "schedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n"
        "    wieght: 2\nplugins:\n- type: queue-scorer\n" + ONE_POD
    )
    assert main(["check-config", str(cfg)]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert any("'wieght'" in m and "'weight'" in m for m in warned)


def test_check_config_prints_resolved_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "plugins:\n- type: queue-scorer\n- type: by-label\n  parameters: {label: tier, validValues: [a]}\n"
        "schedulingProfiles:\n- name: only\n  plugins:\n  - pluginRef: by-label\n"
        "  - pluginRef: queue-scorer\n    weight: 3\n" + ONE_POD
    )
    assert main(["check-config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "profile handler: single-profile-handler (default)" in out
    assert "filters: by-label" in out
    assert "scorers: queue-scorer (weight 3)" in out
    assert "picker:  max-score-picker (default)" in out


BAD = {
    "unknown type": (
        "plugins:\n- type: warp-drive-scorer\n",
        "unknown plugin type 'warp-drive-scorer'",
    ),
    "duplicate name": (
        "plugins:\n- type: queue-scorer\n- type: queue-scorer\n",
        "duplicate plugin name 'queue-scorer'",
    ),
    "undeclared ref": (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: nope\n",
        "pluginRef 'nope' names no declared plugin",
    ),
    "bad param": (
        "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: many}\n",
        "parameters.maxNumOfEndpoints",
    ),
    "bad yaml": ("plugins: [\n", "invalid YAML"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_config_exits_1_naming_the_problem(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, expected = BAD[case]
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text + ("" if "[\n" in text else ONE_POD))
    assert main(["check-config", str(cfg)]) == 1
    assert expected in capsys.readouterr().err
    # serve validates the same way, before binding a port
    assert main(["--config", str(cfg), "--port", "1"]) == 1
    assert expected in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_demo_answers_the_openai_sdk() -> None:
    """The README's first command: simulated pods in-process plus the gateway."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "heimdall_proxy",
        "demo",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--pods",
        "2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        banner = []
        while b"curl" not in (line := await asyncio.wait_for(proc.stdout.readline(), 30)):
            assert line, "demo exited before listening"
            banner.append(line)
        assert f"http://127.0.0.1:{port}/v1".encode() in b"".join(banner)
        assert b"/chat/completions" in line and b"sim-model" in line
        sdk = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        out = await sdk.chat.completions.create(
            model="sim-model", messages=[{"role": "user", "content": "hello"}], max_tokens=3
        )
        await sdk.close()
        assert out.choices[0].message.content == "the gateway routes"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0


def test_the_demo_runs_the_recommended_config() -> None:
    from heimdall_proxy.cli.args import embedded_config_text

    assert (ROOT / "config" / "recommended.yaml").read_text() == embedded_config_text()


def test_the_open_files_limit_is_raised_to_the_hard_limit() -> None:
    # a real child process started with a low soft limit, as many hosts set it (1,024)
    import resource
    import subprocess

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("the hard limit leaves nothing to raise")
    code = (
        "import resource; from heimdall_proxy.cli.args import raise_open_files_limit; "
        "raise_open_files_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    got_soft, got_hard = map(int, out.stdout.split())
    assert got_hard == hard
    assert got_soft == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
