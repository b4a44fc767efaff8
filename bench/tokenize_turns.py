"""Tokenizing agent conversations turn by turn: the whole prompt every turn (before) against
the incremental encoder (tokenization/incremental.py, after), per turn, in CPU time.

Agent-like traffic: `--conversations` conversations, served round-robin, each opening on a
system prompt with tool definitions (shared by all conversations, as one agent's are) and a
task, about `--start` tokens, then growing by turns of an assistant tool call, a tool
result (file contents, command output) and a short user message until it passes `--end`
tokens. Every request is rendered with the chat template once (timed apart), then encoded
both ways by the same LocalTokenizer; the ids must be equal (the bench stops otherwise),
so each run is also a differential test at 100k tokens.

The tokenizer is a real vocabulary built offline (bench/harness/vocab.py: Mistral's Tekken,
130k byte-level BPE, needs the dev extra's mistral-common), with a ChatML or Llama 3
template, or `--tokenizer DIR` for any model directory holding tokenizer.json and
tokenizer_config.json.

CPU is `time.process_time()` of the whole process around each call (the tokenizer's own
threads included); encodings run one at a time, each after emptying the BPE model's word
cache (so the second way does not reuse the first one's work: both pay for every word).

    python -m bench.tokenize_turns                       # 4 conversations, 10k -> 100k tokens
    python -m bench.tokenize_turns --template llama3 --markdown
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import cli, vocab
from bench.harness.machine import cpu_model, git_head
from heimdall_proxy.tokenization.incremental import IncrementalEncoder
from heimdall_proxy.tokenization.local import LocalTokenizer

TEMPLATES = {"chatml": vocab.CHATML, "llama3": vocab.LLAMA3, "mistral-v3": vocab.MISTRAL_V3}

_WORDS = [
    "the",
    "request",
    "router",
    "gateway",
    "pod",
    "server",
    "model",
    "token",
    "block",
    "cache",
    "prefix",
    "queue",
    "batch",
    "stream",
    "chunk",
    "answer",
    "question",
    "user",
    "assistant",
    "system",
    "message",
    "prompt",
    "reply",
    "time",
    "fast",
    "slow",
    "small",
    "large",
    "first",
    "last",
    "next",
    "other",
    "same",
    "new",
    "old",
    "good",
    "pick",
    "score",
    "route",
    "serve",
    "load",
    "run",
    "wait",
    "file",
    "line",
    "error",
    "test",
    "build",
    "config",
    "value",
    "return",
    "import",
    "class",
    "def",
    "self",
    "if",
    "else",
    "for",
    "while",
    "in",
    "not",
    "None",
    "True",
    "False",
    "async",
    "await",
    "print",
    "len",
    "range",
    "dict",
    "list",
    "str",
    "int",
    "float",
]


def _prose(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens of code-and-prose text (words, punctuation, indentation)."""
    out: list[str] = []
    n = 0
    while n < tokens:
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14)))
        if rng.random() < 0.3:
            line = "    " * rng.randint(1, 3) + line.replace(" ", "_", 2) + "()"
        elif rng.random() < 0.2:
            line = f"{line}: {rng.randint(0, 99999)} ({rng.random():.4f})"
        out.append(line)
        n += len(line) // 4 + 1
    return "\n".join(out)


def conversation(rng: random.Random, system: str, tools: list[Any], start: int, end: int,
                 turn_tokens: int, tokens_of: Any) -> list[list[dict[str, Any]]]:  # fmt: skip
    """The message lists of one conversation's successive requests."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": _prose(rng, start // 2)},
    ]
    requests = [list(messages)]
    while tokens_of(messages) < end:
        args = {"path": f"src/{rng.choice(_WORDS)}.py", "line": rng.randint(1, 900)}
        call = {"id": f"call_{len(messages)}", "type": "function",
                "function": {"name": "read_file", "arguments": args}}  # fmt: skip
        messages.append({"role": "assistant", "content": _prose(rng, 40), "tool_calls": [call]})
        messages.append({"role": "tool", "content": _prose(rng, turn_tokens)})
        messages.append({"role": "user", "content": _prose(rng, 30)})
        requests.append(list(messages))
    return requests


def _cpu_ms(fn: Any, *args: Any, model: Any = None) -> tuple[Any, float]:
    """`fn(*args)` and its CPU ms; `model`'s BPE word cache emptied first, so neither way of
    encoding profits from the words the other one just encoded."""
    clear = getattr(model, "_clear_cache", None)
    if clear is not None:
        clear()
    t = time.process_time()
    out = fn(*args)
    return out, (time.process_time() - t) * 1000


def run(args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        if args.tokenizer:
            path = Path(args.tokenizer) / "tokenizer.json"
        else:
            path = vocab.write_model(Path(tmp), vocab.tekken_json(), TEMPLATES[args.template])
        tok = LocalTokenizer(path)
    enc = tok.conversations
    tools = [
        {"type": "function", "function": {"name": name, "description": _prose(random.Random(i), 60),
                                          "parameters": {"path": "string", "line": "integer"}}}
        for i, name in enumerate(("read_file", "write_file", "run", "search", "list_dir"))
    ]  # fmt: skip
    rng = random.Random(args.seed)
    system = _prose(rng, args.start // 2)

    def tokens_of(messages: list[dict[str, Any]]) -> int:
        # about 4.4 characters per token of this text on Tekken (measured)
        return int(sum(len(str(m.get("content"))) for m in messages) / 4.4)

    convs = [
        conversation(rng, system, tools, args.start, args.end, args.turn_tokens, tokens_of)
        for _ in range(args.conversations)
    ]
    rows: list[dict[str, Any]] = []
    for turn in range(max(len(c) for c in convs)):
        for n, c in enumerate(convs):
            if turn >= len(c):
                continue
            text, render_ms = _cpu_ms(lambda m=c[turn]: tok.render_chat(m, tools=tools))
            full, full_ms = _cpu_ms(tok.encode, text, False, model=tok.tokenizer.model)
            hits = enc.stats.hits
            reused = enc.stats.reused_tokens
            incr, incr_ms = _cpu_ms(enc.encode, text, model=tok.tokenizer.model)
            if incr != full:
                raise SystemExit(f"conversation {n} turn {turn}: incremental ids differ")
            hit, reencoded = enc.stats.hits > hits, len(full) - (enc.stats.reused_tokens - reused)
            # the same prompt again (a retry): what a turn costs beyond its new text
            again, again_ms = _cpu_ms(enc.encode, text, model=tok.tokenizer.model)
            assert again == full
            rows.append(
                {
                    "again_ms": again_ms,
                    "conversation": n,
                    "turn": turn,
                    "chars": len(text),
                    "tokens": len(full),
                    "render_ms": render_ms,
                    "full_ms": full_ms,
                    "incremental_ms": incr_ms,
                    "hit": hit,
                    "reencoded_tokens": reencoded,
                    "cache_bytes": enc.stats.bytes,
                    "cache_entries": enc.stats.entries,
                }
            )
    # a cold cache: each conversation's last prompt, encoded in parts with nothing cached
    cold = []
    for c in convs:
        text = tok.render_chat(c[-1], tools=tools)
        full, full_ms = _cpu_ms(tok.encode, text, False, model=tok.tokenizer.model)
        fresh = IncrementalEncoder(
            tok.tokenizer, lambda t: tok.tokenizer.encode_batch_fast(t, add_special_tokens=False)
        )
        parts, parts_ms = _cpu_ms(fresh.encode, text, model=tok.tokenizer.model)
        assert parts == full
        cold.append({"tokens": len(full), "full_ms": full_ms, "parts_ms": parts_ms})
    return {"rows": rows, "cold": cold, "stats": enc.stats, "max_bytes": enc.max_bytes}


def _bucket(tokens: int) -> int:
    return max(10, min(100, round(tokens / 10_000) * 10))


def markdown(result: dict[str, Any], args: Any) -> str:
    rows = result["rows"]
    first = [r for r in rows if r["turn"] == 0]
    later = [r for r in rows if r["turn"] > 0]
    out = [
        f"{args.conversations} conversations, {args.start // 1000}k -> {args.end // 1000}k "
        f"tokens, turns of ~{args.turn_tokens} tokens, template `{args.template}` on Tekken "
        f"(130k byte-level BPE); {len(rows)} requests, all with equal ids both ways. "
        f"{cpu_model('?')}, commit `{(git_head() or '?')[:7]}`.",
        "",
        "| context | requests | render ms | before: full encode ms | after: incremental ms "
        "| tokens re-encoded | speed-up | same prompt again ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def line(label: str, group: list[dict[str, Any]]) -> str:
        def med(k: str) -> float:
            return statistics.median(r[k] for r in group)

        return (
            f"| {label} | {len(group)} | {med('render_ms'):.1f} | {med('full_ms'):.1f} | "
            f"{med('incremental_ms'):.2f} | {med('reencoded_tokens'):.0f} | "
            f"{med('full_ms') / max(med('incremental_ms'), 1e-3):.0f}x | {med('again_ms'):.2f} |"
        )

    if first:
        out.append(line(f"first turn, ~{_bucket(first[0]['tokens'])}k", first))
    for b in sorted({_bucket(r["tokens"]) for r in later}):
        group = [r for r in later if _bucket(r["tokens"]) == b]
        out.append(line(f"~{b}k tokens", group))
    cold = result["cold"]
    if cold:
        full_ms = statistics.median(c["full_ms"] for c in cold)
        parts_ms = statistics.median(c["parts_ms"] for c in cold)
        out.append(
            f"| cold cache, ~{_bucket(cold[0]['tokens'])}k (a miss: encoded in parts) | "
            f"{len(cold)} | | {full_ms:.1f} | {parts_ms:.1f} | all | "
            f"{full_ms / max(parts_ms, 1e-3):.1f}x | |"
        )
    stats = result["stats"]
    top = max(rows, key=lambda r: r["cache_bytes"])
    out += [
        "",
        f"Medians of CPU ms per request. Cache at the end: {stats.entries} entries, "
        f"{stats.bytes / 2**20:.1f} MiB (peak {top['cache_bytes'] / 2**20:.1f} MiB; bound "
        f"{result['max_bytes'] / 2**20:.0f} MiB); hits {stats.hits}, misses {stats.misses}.",
    ]
    return "\n".join(out)


def main() -> None:
    p = cli.parser(__doc__)
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--start", type=int, default=10_000, help="first turn's tokens")
    p.add_argument("--end", type=int, default=100_000, help="last turn's tokens (at least)")
    p.add_argument("--turn-tokens", type=int, default=4_000, help="tool result per turn")
    p.add_argument("--template", choices=sorted(TEMPLATES), default="chatml")
    p.add_argument("--tokenizer", help="a model directory instead of the built-in vocabulary")
    cli.add_seed(p)
    cli.add_output(p)
    args = p.parse_args()
    result = run(args)
    text = markdown(result, args)
    print(text)
    cli.write_markdown(args.markdown, text, printed=True)
    cli.write_json(args.json, result["rows"])


if __name__ == "__main__":
    main()
