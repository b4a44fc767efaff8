"""What the benchmark scripts record about the machine and the checkout they ran on."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "bench"


def cpu_model(default: str) -> str:
    """The CPU's model name from /proc/cpuinfo, `default` where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip()


def git_head() -> str | None:
    """The checkout's short commit, None outside a git checkout."""
    return _git("rev-parse", "--short", "HEAD") or None


def git_dirty(*paths: str) -> bool:
    """Whether the checkout has uncommitted changes (under `paths`, when given)."""
    return bool(_git("status", "--porcelain", "--", *paths))


def machine_info() -> dict[str, str]:
    cpu = cpu_model(platform.processor() or "unknown")
    commit = git_head() or "unknown"
    if commit != "unknown" and git_dirty("heimdall_proxy"):
        commit += " + uncommitted changes under heimdall_proxy/"
    try:
        router_version = version("vllm-router")
    except PackageNotFoundError:
        router_version = "not installed"
    return {
        "arch": platform.machine(),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "commit": commit,
        "vllm_router": router_version,
    }
