"""Run a Python program with cProfile switched on and off by signals, for counting calls.

`python -m bench.probes.callcount OUT_PREFIX -m module ARGS...` runs the module as
`python -m module ARGS...` would.
SIGUSR1 starts a fresh profile; SIGUSR2 stops it and writes it to `OUT_PREFIX.<n>.prof`
(n = 1, 2, ... in order), then renames it into place, so a reader that sees the file sees
all of it. bench/probes/instructions.py (`--calls`) uses it to count the Python-level and builtin
calls a server makes over a window of requests: a count, not a time, so it does not depend
on how loaded the machine is. The profiler makes the program slower; the counts it reports
are those of the program without it.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from types import FrameType


class _Switch:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.profile: cProfile.Profile | None = None
        self.dumps = 0

    def start(self, signum: int, frame: FrameType | None) -> None:
        if self.profile is not None:
            self.profile.disable()
        self.profile = cProfile.Profile()
        self.profile.enable()

    def stop(self, signum: int, frame: FrameType | None) -> None:
        profile, self.profile = self.profile, None
        if profile is None:
            return
        profile.disable()
        self.dumps += 1
        path = f"{self.prefix}.{self.dumps}.prof"
        profile.dump_stats(path + ".tmp")
        os.replace(path + ".tmp", path)


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    switch = _Switch(sys.argv[1])
    signal.signal(signal.SIGUSR1, switch.start)
    signal.signal(signal.SIGUSR2, switch.stop)
    module, rest = sys.argv[3], sys.argv[4:]
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
