"""The options the benchmarks share, spelt and meaning the same everywhere.

- `--out-dir DIR`: per-run files (results JSON per target, generated configs, logs), default
  `bench/out/<bench>/` (gitignored).
- `--json PATH`: the run's figures as JSON.
- `--markdown [PATH]`: the run's tables as markdown, printed, or written to PATH.
- `--seed N`: the workload's seed; `--quick`: the smaller workloads; `--no-progress`: no tqdm.
- `--pods N`, `--gateway-args "..."`, `--redis URL`: the fleet's size, extra flags for
  `heimdall-proxy serve`, the Redis the shared-state runs use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.harness.machine import BENCH_DIR

#: `--markdown` with no PATH: print the tables.
PRINT = "-"

#: A parser or one of its argument groups: both take the same add_argument calls.
Parser = argparse._ActionsContainer


def parser(doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """A parser whose description is the first paragraph of a module's docstring `doc`, and
    whose usage line names the module as it is run (`python -m bench.matrix`)."""
    first = (doc or "").strip().split("\n\n")[0]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and "prog" not in kwargs:
        kwargs["prog"] = f"python -m {spec.name}"
    return argparse.ArgumentParser(description=first or None, **kwargs)


def add_output(
    parser: Parser,
    *,
    out_dir: str | None = None,
    json: bool = True,
    markdown: bool = True,
) -> None:
    """`--out-dir` (default bench/out/`out_dir`), `--json PATH`, `--markdown [PATH]`."""
    if out_dir is not None:
        parser.add_argument(
            "--out-dir",
            type=Path,
            default=BENCH_DIR / "out" / out_dir,
            help="per-run files and logs (default: %(default)s)",
        )
    if json:
        parser.add_argument("--json", type=Path, metavar="PATH", help="write the figures here")
    if markdown:
        parser.add_argument(
            "--markdown",
            nargs="?",
            const=PRINT,
            metavar="PATH",
            help="the markdown tables: printed, or written to PATH",
        )


def add_seed(parser: Parser, default: int = 42, help: str = "") -> None:
    parser.add_argument(
        "--seed", type=int, default=default, help=help or f"workload seed (default {default})"
    )


def add_quick(parser: Parser, help: str = "smaller workloads") -> None:
    parser.add_argument("--quick", action="store_true", help=help)


def add_progress(parser: Parser) -> None:
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_pods(parser: Parser, default: Any = 4, help: str = "") -> None:
    parser.add_argument(
        "--pods",
        type=type(default) if default is not None else int,
        default=default,
        help=help or "simulated pods (default: %(default)s)",
    )


def add_gateway_args(parser: Parser) -> None:
    parser.add_argument("--gateway-args", default="", help="extra flags for `heimdall-proxy serve`")


def add_redis(parser: Parser, flag: str = "--redis") -> None:
    parser.add_argument(flag, default="redis://127.0.0.1:6379/0", help="default: %(default)s")


def write_markdown(
    dest: str | Path | None, text: str, *, append: bool = False, printed: bool = False
) -> None:
    """`--markdown`'s output: nothing (None), printed (PRINT; not again when the caller
    `printed` it already), or into the file `dest` (replaced, or appended to with `append`)."""
    if dest is None:
        return
    if str(dest) == PRINT:
        if not printed:
            print(text)
        return
    path = Path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    print(f"wrote {path}", file=sys.stderr)


def write_json(dest: Path | None, doc: Any, indent: int = 2) -> None:
    """`--json`'s output: nothing (None) or `doc` in the file `dest`."""
    if dest is None:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(doc, indent=indent) + "\n", encoding="utf-8")
    print(f"wrote {dest}", file=sys.stderr)
