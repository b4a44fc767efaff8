"""In-process tokenization with Hugging Face `tokenizers`, chat requests rendered with the
model's own chat template first, as vLLM renders them.

What vLLM does for each OpenAI route, and so what this module does:

- completions: `prompt` (a string, or already a list of token ids) is tokenized with special
  tokens added (BOS, per the tokenizer's post-processor). A batch (a list of prompts) is
  routed on its first prompt.
- chat: the messages are rendered with the chat template (`tokenizer_config.json`'s
  `chat_template`, or `chat_template.jinja` / `chat_template.json` beside the tokenizer) in a
  sandboxed Jinja environment configured as transformers configures it (trim_blocks,
  lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a non-ASCII `tojson`),
  with `add_generation_prompt` (default true), `continue_final_message`, `tools`,
  `documents`, `chat_template_kwargs` and the special tokens (`bos_token`, `eos_token`, ...);
  the text is then tokenized without adding special tokens (the template wrote them). List
  contents are joined text parts unless the template iterates over `message['content']`, in
  which case it gets the parts. Tool-call arguments given as JSON strings are parsed, as
  vLLM does for templates that index into them.
- responses: `instructions` becomes a system message and `input` the user / assistant
  messages, then as chat.
"""

from __future__ import annotations

import contextlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from heimdall_proxy.tokenization.incremental import DEFAULT_CACHE_BYTES, IncrementalEncoder

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

#: Template loops over a message's content parts (vLLM's "openai" content format).
_CONTENT_LOOP = re.compile(r"for\s+\w+\s+in\s+\w+(?:\[['\"]content['\"]\]|\.content)")


class ChatTemplateError(ValueError):
    """The model has no chat template, or rendering it failed (raise_exception, bad input)."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (transformers marks assistant spans with it);
    it changes nothing in the rendered text."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _pick_template(value: Any) -> str | None:
    """`chat_template` is a string, or a list of {name, template} (the "default" one)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {
            t.get("name"): t.get("template")
            for t in value
            if isinstance(t, Mapping) and isinstance(t.get("template"), str)
        }
        return named.get("default") or next(iter(named.values()), None)
    return None


class OpenAIRequestTokenizer(ABC):
    """The routes of an OpenAI request body, shared by every in-process tokenizer: chat and
    responses go to `tokenize_chat`, a completion's text prompt to `encode` (special tokens
    added unless the body says `add_special_tokens: false`), already tokenized prompts as
    they are."""

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of `text`."""

    @abstractmethod
    def tokenize_chat(self, data: Mapping[str, Any], messages: Any) -> list[int]:
        """The prompt ids of a conversation; ValueError for messages it cannot take."""

    def tokenize_request(self, api: str, data: Mapping[str, Any]) -> list[int]:
        """The prompt token ids vLLM would compute for an OpenAI request body."""
        if api == "chat":
            return self.tokenize_chat(data, data.get("messages"))
        if api == "responses":
            return self.tokenize_chat(data, responses_messages(data))
        prompt = completion_prompt(data)
        if isinstance(prompt, list):
            return prompt
        add_special = data.get("add_special_tokens", True)
        return self.encode(prompt, add_special_tokens=add_special is not False)


class LocalTokenizer(OpenAIRequestTokenizer):
    """A tokenizer.json plus, from the same directory, its tokenizer_config.json (special
    tokens, chat template) or chat_template.jinja. Thread-safe for encoding (the Rust
    tokenizer is), so one instance serves a pool of worker threads; encoding releases the
    GIL, so those threads do not hold up the event loop.

    Chat prompts go through `conversations` (tokenization/incremental.py): a conversation's
    next turn encodes only what follows its last turn, with the same ids; at most
    `conversation_cache_bytes` of recent prompts are kept (0: none)."""

    def __init__(
        self, tokenizer_file: str | Path, conversation_cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        path = Path(tokenizer_file)
        self.path = path
        self.tokenizer = Tokenizer.from_file(str(path))
        self._encode_batch = getattr(self.tokenizer, "encode_batch_fast", None) or (
            self.tokenizer.encode_batch
        )
        self.conversations = IncrementalEncoder(
            self.tokenizer,
            lambda texts: self._encode_batch(texts, add_special_tokens=False),
            max_bytes=conversation_cache_bytes,
        )
        directory = path.parent
        config: dict[str, Any] = {}
        cfg_file = directory / "tokenizer_config.json"
        if cfg_file.is_file():
            loaded = json.loads(cfg_file.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                config = loaded
        self.special_tokens: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            text = _token_text(config.get(name))
            if text is not None:
                self.special_tokens[name] = text
        extra = config.get("additional_special_tokens")
        self.additional_special_tokens = [
            t for t in (_token_text(v) for v in extra or []) if t is not None
        ]
        template = _pick_template(config.get("chat_template"))
        jinja_file = directory / "chat_template.jinja"
        json_file = directory / "chat_template.json"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        elif template is None and json_file.is_file():
            template = _pick_template(
                json.loads(json_file.read_text(encoding="utf-8")).get("chat_template")
            )
        self.chat_template = template
        self._compiled: jinja2.Template | None = None
        self._overrides: dict[str, jinja2.Template] = {}
        self._content_parts = bool(template and _CONTENT_LOOP.search(template))

    # ---- primitives ----------------------------------------------------------------------

    # `Tokenizer.encode` holds the GIL for the whole encoding (about a second per megabyte
    # of text), so a worker thread running it stalled every other thread, the event loop's
    # included; the batch calls release it while they work. `encode_batch_fast` (tokenizers
    # >= 0.20) also skips the character offsets, which halves the time.

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return ids

    def encode_with_offsets(
        self, text: str, add_special_tokens: bool = True
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's (start, end) character span in `text` (the sidecar
        protocol's Tokenize answers both)."""
        enc = self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        return list(enc.ids), [(int(a), int(b)) for a, b in enc.offsets]

    def _template(self, override: str | None) -> tuple[jinja2.Template, bool]:
        """The compiled template (the model's, or a request's own) and whether it iterates
        over content parts."""
        if override:
            compiled = self._overrides.get(override)
            if compiled is None:
                if len(self._overrides) >= 16:  # a few distinct request templates, not a leak
                    self._overrides.clear()
                compiled = _environment().from_string(override)
                self._overrides[override] = compiled
            return compiled, bool(_CONTENT_LOOP.search(override))
        if not self.chat_template:
            raise ChatTemplateError(
                f"{self.path.parent}: the model has no chat template (tokenizer_config.json "
                "chat_template, chat_template.jinja)"
            )
        if self._compiled is None:
            self._compiled = _environment().from_string(self.chat_template)
        return self._compiled, self._content_parts

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Any = None,
        documents: Any = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> str:
        """The prompt text vLLM would feed the model for these chat messages. `chat_template`:
        a request's own template instead of the model's. `chat_template_kwargs` win over
        `tools` and `documents`, as vLLM merges them."""
        compiled, content_parts = self._template(chat_template)
        if continue_final_message and add_generation_prompt:
            add_generation_prompt = False
        context: dict[str, Any] = {
            **self.special_tokens,
            "additional_special_tokens": self.additional_special_tokens,
            "tools": tools,
            "documents": documents,
            **dict(chat_template_kwargs or {}),
            "messages": [self._message(m, content_parts) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            text = compiled.render(**context)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        if continue_final_message and messages:
            # Cut the text after the last message's content, so the model continues it.
            last = self._message(messages[-1], content_parts).get("content")
            if isinstance(last, str) and last:
                cut = text.rfind(last.strip())
                if cut >= 0:
                    text = text[: cut + len(last.strip())]
        return text

    @staticmethod
    def _message(message: Mapping[str, Any], content_parts: bool) -> dict[str, Any]:
        out = dict(message)
        content = out.get("content")
        if isinstance(content, list):
            parts = [p if isinstance(p, Mapping) else {"type": "text", "text": p} for p in content]
            if content_parts:
                out["content"] = [dict(p) for p in parts]
            else:
                out["content"] = "\n".join(
                    str(p["text"]) for p in parts if isinstance(p.get("text"), str)
                )
        calls = out.get("tool_calls")
        if isinstance(calls, list):
            parsed = []
            for call in calls:
                call = dict(call) if isinstance(call, Mapping) else call
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                    fn = dict(fn)
                    with contextlib.suppress(ValueError):
                        fn["arguments"] = json.loads(fn["arguments"])
                    call["function"] = fn
                parsed.append(call)
            out["tool_calls"] = parsed
        return out

    # ---- OpenAI requests -----------------------------------------------------------------

    def tokenize_chat(self, data: Mapping[str, Any], messages: Any) -> list[int]:
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise ValueError("messages must be a list of objects")
        kwargs = data.get("chat_template_kwargs")
        template = data.get("chat_template")
        text = self.render_chat(
            messages,
            add_generation_prompt=data.get("add_generation_prompt", True) is not False,
            continue_final_message=data.get("continue_final_message") is True,
            tools=data.get("tools"),
            documents=data.get("documents"),
            chat_template_kwargs=kwargs if isinstance(kwargs, Mapping) else None,
            chat_template=template if isinstance(template, str) else None,
        )
        if data.get("add_special_tokens") is True:
            return self.encode(text, add_special_tokens=True)
        return self.conversations.encode(text)


def completion_prompt(data: Mapping[str, Any]) -> str | list[int]:
    """A completions request's prompt: its text, or its token ids when it is already
    tokenized. A batch (a list of prompts) is routed on its first prompt."""
    prompt = data.get("prompt", data.get("input"))
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):
            return [int(t) for t in prompt]
        prompt = first
    if isinstance(prompt, list):  # a batch of token-id lists: its first one
        return [int(t) for t in prompt]
    if not isinstance(prompt, str):
        raise ValueError("the request has no text prompt")
    return prompt


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        n = 0
        for part in content:
            if isinstance(part, str):
                n += len(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                n += len(part["text"])
        return n
    return 0


def prompt_chars(api: str, data: Mapping[str, Any]) -> int:
    """The characters of text an OpenAI request body gives its tokenizer (a completion's
    prompt, the first of a batch; message contents; a response's instructions and input),
    counted without copying it: what tokenizing the request will cost, chat template aside.
    0 when there is no text (a prompt of token ids, an odd body)."""
    if api == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list):
            return 0
        return sum(_content_chars(m.get("content")) for m in messages if isinstance(m, Mapping))
    if api == "responses":
        n = _content_chars(data.get("instructions"))
        inp = data.get("input")
        if isinstance(inp, list):
            for item in inp:
                if isinstance(item, Mapping):
                    n += _content_chars(item.get("content")) + _content_chars(item.get("text"))
            return n
        return n + _content_chars(inp)
    prompt = data.get("prompt", data.get("input"))
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    return len(prompt) if isinstance(prompt, str) else 0


def responses_messages(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a /v1/responses request stands for."""
    messages: list[dict[str, Any]] = []
    instructions = data.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    inp = data.get("input")
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for item in inp:
            if not isinstance(item, Mapping):
                continue
            role = item.get("role")
            if role is None and item.get("type") in ("input_text", "output_text"):
                role = "user"
                content: Any = item.get("text", "")
            else:
                content = item.get("content", "")
            if isinstance(content, list):
                content = [
                    {"type": "text", "text": p.get("text")}
                    for p in content
                    if isinstance(p, Mapping) and isinstance(p.get("text"), str)
                ]
            if isinstance(role, str):
                messages.append({"role": role, "content": content})
    return messages
