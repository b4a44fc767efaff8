"""Mooncake's FAST'25 request traces: reading them, finding whole conversations, and the
documented sample committed under bench/traces/ (see the README there).

A trace line is one request: `timestamp` (ms), `input_length` and `output_length` (tokens)
and `hash_ids`, one id per 512-token block of the prompt, equal ids meaning equal prefixes.
The traces carry no conversation id, so conversations are read off the hash ids: a request
continues an earlier one when its prompt starts with every full block of the earlier one's
prompt (all its hash ids but possibly the last, partial one) and with at least two blocks,
so that sharing the one system-prompt block every conversation trace request starts with
does not join conversations. A conversation is a connected group under that relation.

Sampling keeps whole conversations: those whose every request fits the simulated pods'
context (input + output <= MAX_TOKENS) are shuffled with a fixed seed and taken in that
order until the sample holds at least the requested number of requests. Each sampled line
keeps its original fields and gets `conversation`, the conversation's rank in that order,
so a smaller workload can take the first N conversations of the sample.

    python -m bench.harness.traces sample FULL.jsonl bench/traces/NAME.jsonl.gz
    python -m bench.harness.traces describe bench/traces/NAME.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRACES_DIR = Path(__file__).resolve().parent.parent / "traces"
#: Tokens per hash id in Mooncake's traces.
BLOCK_TOKENS = 512
#: The simulator's default max_model_len (32,768) less a margin.
MAX_TOKENS = 32_000
SAMPLE_SEED = 36
SAMPLE_REQUESTS = 400

#: The committed samples, by trace name.
SAMPLES = {
    "conversation": TRACES_DIR / "mooncake-conversation.jsonl.gz",
    "synthetic": TRACES_DIR / "mooncake-synthetic.jsonl.gz",
}


@dataclass(frozen=True, slots=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    conversation: int = -1

    def to_json(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
            "conversation": self.conversation,
        }


def _open(path: Path) -> Any:
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open()


def load(path: Path) -> list[TraceRequest]:
    """A trace file's requests in file order (.jsonl or .jsonl.gz)."""
    out = []
    with _open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out.append(
                    TraceRequest(
                        float(d["timestamp"]),
                        int(d["input_length"]),
                        int(d["output_length"]),
                        tuple(int(h) for h in d["hash_ids"]),
                        int(d.get("conversation", -1)),
                    )
                )
    return out


def conversations(reqs: Sequence[TraceRequest]) -> list[list[int]]:
    """Indices of `reqs` grouped into conversations (module docstring), each in file order,
    the groups ordered by their first request."""
    parent = list(range(len(reqs)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    last_with_prefix: dict[tuple[int, ...], int] = {}
    for i, r in enumerate(reqs):
        h = r.hash_ids
        for k in range(len(h), 1, -1):
            j = last_with_prefix.get(h[:k])
            if j is not None:
                if k >= max(2, len(reqs[j].hash_ids) - 1):
                    parent[find(i)] = find(j)
                break
        for k in range(1, len(h) + 1):
            last_with_prefix[h[:k]] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(reqs)):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def sample(
    reqs: Sequence[TraceRequest],
    min_requests: int = SAMPLE_REQUESTS,
    seed: int = SAMPLE_SEED,
    max_tokens: int = MAX_TOKENS,
) -> list[TraceRequest]:
    """Whole conversations, drawn in a seeded random order until `min_requests` are held;
    each request tagged with its conversation's rank in the draw; in timestamp order."""
    groups = [
        g
        for g in conversations(reqs)
        if all(reqs[i].input_length + reqs[i].output_length <= max_tokens for i in g)
    ]
    random.Random(seed).shuffle(groups)
    out: list[TraceRequest] = []
    for rank, g in enumerate(groups):
        if len(out) >= min_requests:
            break
        for i in g:
            r = reqs[i]
            out.append(TraceRequest(r.timestamp_ms, r.input_length, r.output_length,
                                    r.hash_ids, rank))  # fmt: skip
    out.sort(key=lambda r: (r.timestamp_ms, r.conversation))
    return out


def first_conversations(reqs: Iterable[TraceRequest], n: int) -> list[TraceRequest]:
    """The requests of a sample's first `n` conversations (all when n <= 0)."""
    return [r for r in reqs if n <= 0 or r.conversation < n]


def write(path: Path, reqs: Iterable[TraceRequest]) -> None:
    text = "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in reqs)
    if path.suffix == ".gz":
        # no name, mtime 0: the same sample gives the same bytes
        with path.open("wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
            f.write(text.encode())
    else:
        path.write_text(text, encoding="utf-8")


def describe(reqs: Sequence[TraceRequest]) -> str:
    if not reqs:
        return "0 requests"
    span = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000
    convs = len({r.conversation for r in reqs})
    mean_in = sum(r.input_length for r in reqs) / len(reqs)
    mean_out = sum(r.output_length for r in reqs) / len(reqs)
    return (
        f"{len(reqs)} requests in {convs} conversations over {span:.0f} s; mean input "
        f"{mean_in:.0f} tokens, mean output {mean_out:.0f}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="sample whole conversations of a full trace")
    s.add_argument("trace", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--requests", type=int, default=SAMPLE_REQUESTS)
    s.add_argument("--seed", type=int, default=SAMPLE_SEED)
    d = sub.add_parser("describe", help="summarise a trace file")
    d.add_argument("trace", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "sample":
        picked = sample(load(args.trace), args.requests, args.seed)
        write(args.out, picked)
        print(f"{args.out}: {describe(picked)}")
    else:
        print(describe(load(args.trace)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
