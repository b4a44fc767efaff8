"""A deterministic stand-in tokenizer, chat template and multimodal placeholder expansion.

Text is split on whitespace; a word of the simulator's output vocabulary is one token, any
other word is cut into 4-character chunks. Each piece is hashed to an id, so identical text
always gives identical ids, and an assistant reply fed back in a later turn tokenizes to the
ids the pod generated (multi-turn chats hit the prefix cache as they do on vLLM). Chat
messages are wrapped in role and end-of-message tokens, so a shared system prompt gives a
shared prefix. The text of each message or part is read by sim.prompt, the simulator's own
reading of a prompt, written apart from the gateway's.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from heimdall_proxy.sim.prompt import ApiKind, anthropic_chat, content_text, prompt_text

#: The fixed output (no seed): word i of a reply is WORDS[i % len(WORDS)].
WORDS = ("the", "gateway", "routes", "tokens", "to", "a", "pod", "with", "room", "and")
#: Words a seeded pod draws its outputs from.
# fmt: off
VOCAB_WORDS = (
    *WORDS,
    "cache", "prefix", "block", "queue", "batch", "step", "model", "token", "prompt", "reply",
    "fast", "slow", "warm", "cold", "route", "score", "pick", "fill", "drain", "load", "shed",
    "wait", "run", "send", "read", "write", "keep", "drop", "hit", "miss", "node", "rack",
    "zone", "link", "path", "hop", "page", "lane", "gate", "port", "peer", "host", "edge", "core",
)
# fmt: on
_WORD_SET = frozenset(VOCAB_WORDS)

BOS = 1
END = 2
ROLE_IDS = {"system": 3, "developer": 4, "user": 5, "assistant": 6, "tool": 7}
_OTHER_ROLE = 8
_TEXT_BASE = 1_000
_TEXT_VOCAB = 120_000
_MM_BASE = _TEXT_BASE + _TEXT_VOCAB

MM_PART_TYPES = {
    "image_url": "image",
    "input_image": "image",
    "input_audio": "audio",
    "audio_url": "audio",
    "video_url": "video",
}


def _piece_id(piece: str) -> int:
    return _TEXT_BASE + xxhash.xxh32_intdigest(piece.encode("utf-8", "surrogatepass")) % (
        _TEXT_VOCAB
    )


@functools.lru_cache(maxsize=65_536)
def _word_ids(word: str) -> tuple[int, ...]:
    if word in _WORD_SET:
        return (_piece_id("\u2581" + word),)
    ids = [_piece_id("\u2581" + word[:4])]
    ids.extend(_piece_id(word[i : i + 4]) for i in range(4, len(word), 4))
    return tuple(ids)


def tokenize(text: str) -> list[int]:
    """Ids of a text; deterministic, about one id per 4 characters."""
    out: list[int] = []
    for word in text.split():
        out.extend(_word_ids(word))
    return out


def word_id(word: str) -> int:
    """The id of one generated word (a single token)."""
    return _word_ids(word)[0]


class OutputWords:
    """The words a request generates: fixed without a seed, else drawn from a generator
    seeded by the pod seed, the request seed and the prompt, so the same prompt gives the
    same reply whatever else the pod is doing."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int | None, request_seed: Any, prompt_ids: Sequence[int]) -> None:
        if seed is None:
            self._rng: random.Random | None = None
        else:
            key = repr((seed, request_seed, tuple(prompt_ids))).encode()
            digest = xxhash.xxh3_64_intdigest(key)
            self._rng = random.Random(digest)

    def word(self, index: int) -> str:
        if self._rng is None:
            return WORDS[index % len(WORDS)]
        return self._rng.choice(VOCAB_WORDS)


@dataclass(slots=True, frozen=True)
class MMItem:
    """One image / audio / video input: its content hash and its placeholder tokens."""

    kind: str
    mm_hash: str
    num_tokens: int


@dataclass(slots=True)
class Prompt:
    ids: list[int] = field(default_factory=list)
    mm: list[MMItem] = field(default_factory=list)


class PromptError(ValueError):
    """The body holds no prompt the pod can read (answered 400)."""


def _mm_source(kind_key: str, part: Mapping[str, Any]) -> str | None:
    value = part.get(kind_key)
    if kind_key == "input_image":
        value = part.get("image_url") or part.get("file_id")
    if isinstance(value, Mapping):
        value = value.get("url") or value.get("data")
    return value if isinstance(value, str) else None


def mm_hash(kind: str, source: str) -> str:
    return xxhash.xxh3_64_hexdigest(f"{kind}:{source}".encode())


class Tokenizer:
    """Turns a request body into prompt ids the way vLLM's renderer would."""

    def __init__(self, mm_tokens_per_item: int = 256) -> None:
        self.mm_tokens_per_item = mm_tokens_per_item

    def _mm_item(self, part_type: str, part: Mapping[str, Any]) -> MMItem | None:
        source = _mm_source(part_type, part)
        if source is None:
            return None
        kind = MM_PART_TYPES[part_type]
        n = self.mm_tokens_per_item * (4 if kind == "video" else 1)
        return MMItem(kind, mm_hash(kind, source), n)

    def _content(self, content: Any, prompt: Prompt) -> None:
        if isinstance(content, list):
            for part in content:
                part_type = part.get("type") if isinstance(part, Mapping) else None
                if isinstance(part_type, str) and part_type in MM_PART_TYPES:
                    item = self._mm_item(part_type, part)
                    if item is not None:
                        prompt.mm.append(item)
                        placeholder = _MM_BASE + int(item.mm_hash, 16) % 1_000_000
                        prompt.ids.extend([placeholder] * item.num_tokens)
                    continue
                text = content_text([part])
                prompt.ids.extend(tokenize(text))
        else:
            text = content_text(content)
            prompt.ids.extend(tokenize(text))

    def _message(self, role: Any, content: Any, prompt: Prompt) -> None:
        prompt.ids.append(ROLE_IDS.get(role, _OTHER_ROLE) if isinstance(role, str) else _OTHER_ROLE)
        self._content(content, prompt)
        prompt.ids.append(END)

    def chat(self, messages: Any, add_generation_prompt: bool = True) -> Prompt:
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list")
        prompt = Prompt(ids=[BOS])
        for msg in messages:
            if not isinstance(msg, Mapping):
                raise PromptError("each message must be an object")
            self._message(msg.get("role", "user"), msg.get("content"), prompt)
        if add_generation_prompt:
            prompt.ids.append(ROLE_IDS["assistant"])
        return prompt

    def responses(self, data: Mapping[str, Any]) -> Prompt:
        prompt = Prompt(ids=[BOS])
        instructions = data.get("instructions")
        if isinstance(instructions, str):
            self._message("system", instructions, prompt)
        inp = data.get("input")
        if isinstance(inp, str):
            self._message("user", inp, prompt)
        elif isinstance(inp, list):
            for item in inp:
                if not isinstance(item, Mapping):
                    continue
                if item.get("type") in ("input_text", *MM_PART_TYPES):
                    self._message("user", [item], prompt)
                elif "content" in item:
                    self._message(item.get("role", "user"), item.get("content"), prompt)
        else:
            raise PromptError("input must be a string or a list")
        prompt.ids.append(ROLE_IDS["assistant"])
        return prompt

    def completion(self, data: Mapping[str, Any]) -> Prompt:
        raw = data.get("prompt")
        if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            return Prompt(ids=[int(t) for t in raw])
        if (
            isinstance(raw, list)
            and raw
            and isinstance(raw[0], list)
            and all(isinstance(t, int) for t in raw[0])
        ):
            return Prompt(ids=[int(t) for t in raw[0]])
        if not isinstance(raw, (str, list)):
            raise PromptError("prompt must be a string, a list of strings or of token ids")
        return Prompt(ids=[BOS, *tokenize(prompt_text("completions", data))])

    def prompt(self, api: ApiKind, data: Mapping[str, Any]) -> Prompt:
        if api == "chat":
            return self.chat(data.get("messages"))
        if api == "messages":
            return self.chat(anthropic_chat(data))
        if api == "responses":
            return self.responses(data)
        return self.completion(data)


class SimRequestTokenizer:
    """The simulator's tokenization behind the tokenizer service's interface
    (`heimdall-proxy tokenizer-server --sim-model NAME`): a gateway whose tokenizer plugin or
    precise-prefix-cache-scorer uses that service computes the very prompt ids the simulated
    pods compute, and so the block keys of their KV events (benchmarks on the simulated
    fleet)."""

    def __init__(self, mm_tokens_per_item: int = 256) -> None:
        self._tokenizer = Tokenizer(mm_tokens_per_item)

    def tokenize_request(self, api: str, data: Mapping[str, Any]) -> list[int]:
        kind: ApiKind = api if api in ("chat", "responses") else "completions"  # type: ignore[assignment]
        return self._tokenizer.prompt(kind, data).ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = tokenize(text)
        return [BOS, *ids] if add_special_tokens else ids
