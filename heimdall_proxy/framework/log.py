"""klog-style verbosity on top of stdlib logging: `-v N` enables V(0)..V(N).

V(n) maps to the stdlib level INFO - n, so V(0) is INFO and `-v 4` shows V(4) lines such as
"Running scorer" (as Heimdall does at -v=4)."""

from __future__ import annotations

import logging


def V(n: int) -> int:
    return logging.INFO - n


V4 = V(4)
V5 = V(5)
