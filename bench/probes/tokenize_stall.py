"""/health latency while a very long prompt goes through the tokenizer path (issue 32 item 1).

Starts one simulated pod and a gateway (subprocesses) whose config runs the `tokenizer`
prepare-data plugin on a local tokenizer built here (a byte-level BPE trained on seeded
words, with a chat template: nothing is downloaded), sends one chat request whose message is
`--prompt-mb` MB of words, and asks `/health` every `--interval` seconds from the moment it
is sent until it is answered. Reports /health p50 / p99 / max over that window, how many
answers came, and the long request's own time and status (the pod refuses a prompt beyond its
context, as vLLM does: 400). A gateway whose event loop is held by the tokenizer answers no
/health at all until it is done.

Variants: `after` (this tree, default maxPromptChars: the prompt is not tokenized),
`after-tokenized` (this tree, maxPromptChars raised over the prompt: tokenized on the worker
thread), and with `--baseline DIR`, `before` (DIR's gateway code,
`PYTHONPATH=DIR python -P -m heimdall_proxy`).

    python -m bench.probes.tokenize_stall --prompt-mb 25 --baseline /tmp/heimdall-before
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bench.harness import cli
from bench.harness.machine import cpu_model, git_dirty, git_head
from bench.harness.procs import free_port, wait_http
from bench.harness.stats import percentile

PY = sys.executable
#: The corpus' words, and the prompt's.
_TEXT = (
    "the a one two some every request router gateway pod server model token block cache "
    "prefix queue batch stream chunk answer question user assistant system message prompt "
    "reply time fast slow small large first last next other same new old good is are was "
    "send read write pick score route serve load run wait hello world please thanks"
)
WORDS = _TEXT.split(" ")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def make_tokenizer(directory: Path) -> Path:
    """A byte-level BPE (as GPT-style models use) trained on seeded sentences of WORDS, plus
    a tokenizer_config.json with its special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rnd = random.Random(0)
    corpus = [" ".join(rnd.choice(WORDS) for _ in range(40)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def long_prompt(chars: int) -> str:
    rnd = random.Random(32)
    words: list[str] = []
    n = 0
    while n < chars:
        word = rnd.choice(WORDS)
        words.append(word)
        n += len(word) + 1
    return " ".join(words)


async def run(
    name: str, args: argparse.Namespace, tmp: Path, model: Path, body: bytes, **variant: Any
) -> dict[str, Any]:
    """One gateway, one long request; `variant`: code (a tree to run instead of this one),
    max_prompt_chars (the plugin's parameter; None: its default)."""
    code: str | None = variant.get("code")
    pod_port, gw_port = free_port(), free_port()
    params: dict[str, Any] = {"modelName": str(model)}
    if variant.get("max_prompt_chars"):
        params["maxPromptChars"] = variant["max_prompt_chars"]
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "featureGates": ["prepareDataPlugins"],
                "plugins": [
                    {"type": "tokenizer", "parameters": params},
                    {"type": "queue-scorer"},
                ],
                "endpoints": [{"name": "pod-0", "url": f"http://127.0.0.1:{pod_port}"}],
            }
        )
    )
    pod = await asyncio.create_subprocess_exec(
        PY, "-m", "heimdall_proxy", "sim", "--host", "127.0.0.1", "--port", str(pod_port),
        "--name", "pod-0", stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": code} if code else None
    python = [PY, "-P"] if code else [PY]
    log = tmp / f"{name}.log"
    with log.open("wb") as sink:
        gw = await asyncio.create_subprocess_exec(
            *python, "-m", "heimdall_proxy", "serve", "--config", str(cfg),
            "--host", "127.0.0.1", "--port", str(gw_port), "--log-format", "text",
            stderr=sink, env=env,
        )  # fmt: skip
    base = f"http://127.0.0.1:{gw_port}"
    try:
        await wait_http(f"http://127.0.0.1:{pod_port}/health")
        await wait_http(base + "/ready")
        timeout = aiohttp.ClientTimeout(total=600)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            aiohttp.ClientSession(timeout=timeout) as probe,
        ):
            latencies: list[float] = []
            t0 = time.perf_counter()
            big = asyncio.create_task(
                http.post(
                    base + "/v1/chat/completions",
                    data=io.BytesIO(body),
                    headers={"Content-Type": "application/json"},
                )
            )
            while not big.done():
                t = time.perf_counter()
                async with probe.get(base + "/health") as r:
                    await r.read()
                latencies.append(time.perf_counter() - t)
                await asyncio.sleep(args.interval)
            resp = await big
            await resp.read()
            elapsed = time.perf_counter() - t0
            status = resp.status
            resp.release()
    finally:
        for proc in (gw, pod):
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
    return {
        "variant": name,
        "status": status,
        "request_s": elapsed,
        "answers": len(latencies),
        "p50_ms": (percentile(latencies, 50) or 0.0) * 1000,
        "p99_ms": (percentile(latencies, 99) or 0.0) * 1000,
        "max_ms": max(latencies) * 1000,
        "load": os.getloadavg()[0],
    }


async def main() -> None:
    p = cli.parser(__doc__)
    p.add_argument("--prompt-mb", type=float, default=25.0, help="the prompt's size, in MB")
    p.add_argument("--interval", type=float, default=0.01, help="seconds between /health")
    p.add_argument("--baseline", help="also run this tree's gateway code (the 'before' row)")
    p.add_argument("--variants", default="before,after,after-tokenized")
    args = p.parse_args()
    chars = int(args.prompt_mb * 1_000_000)
    prompt = long_prompt(chars)
    doc = {"model": "sim-model", "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]}
    body = orjson.dumps(doc)
    wanted = args.variants.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = make_tokenizer(tmp / "bpe")
        if "before" in wanted and args.baseline:
            rows.append(await run("before", args, tmp, model, body, code=args.baseline))
        if "after" in wanted:
            rows.append(await run("after", args, tmp, model, body))
        if "after-tokenized" in wanted:
            rows.append(
                await run("after-tokenized", args, tmp, model, body, max_prompt_chars=2 * chars)
            )
    head = git_head() or "?"
    print(
        f"Machine: {cpu_model('?')}, nproc={os.cpu_count()}, Python {sys.version.split()[0]}; "
        f"git {head}{' (dirty)' if git_dirty('heimdall_proxy', 'bench') else ''}; "
        f"body {len(body) / 1e6:.1f} MB"
    )
    print()
    print(
        "| variant | long request: status, s | /health answers while it ran | "
        "p50 ms | p99 ms | max ms | load avg |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['status']}, {r['request_s']:.2f} | {r['answers']} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.0f} | {r['load']:.1f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
