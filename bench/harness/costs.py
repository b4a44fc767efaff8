"""What the simulated pods charge for a request, by the simulator's own cost model
(heimdall_proxy/sim/options.py, applied per step by sim/engine.py): shared by the matrix's
lower bound, the oracle and the trace workloads' time scaling, so all three read one model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from heimdall_proxy.sim.options import SimOptions

#: Request slots of every pod in the matrix (`--max-num-seqs 2`).
SLOTS = 2


def service_time(prompt: int, cached: int, output: int, o: SimOptions) -> float:
    """Seconds one request takes alone on a default pod: chunked prefill of its uncached
    tokens, then one decode step per further output token."""
    todo = max(0, prompt - cached)
    steps = max(1, math.ceil(todo / o.max_num_batched_tokens))
    t = steps * o.step_base + todo * o.prefill_cost_per_token
    for i in range(max(0, output - 1)):
        t += o.step_base + o.decode_cost_per_seq + (prompt + i) * o.kv_read_cost_per_token
    return t


def pod_work(prompt: int, cached: int, output: int, o: SimOptions, slots: int = SLOTS) -> float:
    """Pod-seconds a request costs at best: its prefill tokens and per-sequence decode costs
    in full, its steps' fixed cost shared with the other sequences a step can carry."""
    todo = max(0, prompt - cached)
    steps = max(1, math.ceil(todo / o.max_num_batched_tokens)) + max(0, output - 1)
    t = todo * o.prefill_cost_per_token + steps * o.step_base / slots
    # the decode steps' attention reads: sum over i < output - 1 of (prompt + i) tokens
    n = max(0, output - 1)
    t += n * o.decode_cost_per_seq + (n * prompt + n * (n - 1) / 2) * o.kv_read_cost_per_token
    return t


def options_from_flags(flags: Sequence[str], base: SimOptions | None = None) -> SimOptions:
    """A pod's SimOptions after the numeric `--flag value` pairs of its command line (the
    cost model and KV sizes; other flags, e.g. LoRA modules, are left alone)."""
    o = dataclasses.replace(base) if base is not None else SimOptions()
    kinds = {f.name: f.type for f in dataclasses.fields(SimOptions)}
    i = 0
    while i < len(flags) - 1:
        name = flags[i].removeprefix("--").replace("-", "_")
        if flags[i].startswith("--") and kinds.get(name) in ("int", "float", int, float):
            kind = int if kinds[name] in ("int", int) else float
            setattr(o, name, kind(flags[i + 1]))
            i += 2
        else:
            i += 1
    return o
