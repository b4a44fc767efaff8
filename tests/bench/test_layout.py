"""bench/ as a package: every module imports (so a move inside heimdall_proxy that breaks one
fails here, not in the next benchmark run), none edits sys.path, and every benchmark and
probe runs as `python -m`."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import bench

BENCH = Path(bench.__file__).parent
#: Needs the vLLM venv (torch, transformers) or a running pod: not imported here.
SKIP = ("bench.real_vllm",)
#: The `bench` extra's packages: a module needing one is skipped where it is not installed.
OPTIONAL = frozenset({"tqdm", "matplotlib", "vllm_router"})


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages([str(BENCH)], prefix="bench."):
        if not info.name.startswith(SKIP):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_every_bench_module_imports(name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in OPTIONAL:
            raise
        pytest.skip(f"{exc.name} is not installed (pip install -e '.[bench]')")


def test_no_module_edits_sys_path() -> None:
    offenders = [
        str(path.relative_to(BENCH))
        for path in BENCH.rglob("*.py")
        if "sys.path" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_every_benchmark_and_probe_runs_as_a_module() -> None:
    entry_points = [*BENCH.glob("*.py"), *(BENCH / "probes").glob("*.py")]
    missing = [
        str(path.relative_to(BENCH))
        for path in entry_points
        if path.name != "__init__.py"
        and 'if __name__ == "__main__":' not in path.read_text(encoding="utf-8")
    ]
    assert missing == []
