"""`heimdall-proxy plugin-reference [--out FILE]`: the reference of every built-in plugin
(docstring, extension points, parameters), generated from the code; docs/plugins.md is its
output, and a test keeps the two equal."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plugin-reference", help="write the built-in plugins' reference (markdown) from the code"
    )
    p.add_argument(
        "--out", metavar="FILE", help="write it to FILE (docs/plugins.md) instead of stdout"
    )


def run(args: argparse.Namespace) -> int:
    from heimdall_proxy.plugins.builtins import load_builtin_plugins, origin
    from heimdall_proxy.plugins.reference import plugin_reference

    text = plugin_reference(load_builtin_plugins(), origin)
    if args.out is None:
        sys.stdout.write(text)
    else:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0
