"""Token counts and time per output token of a relayed answer, for the GIE metric set.

Non-streamed answers carry `usage` in their body: chat and completions as
`prompt_tokens` / `completion_tokens`, the Responses API as `input_tokens` /
`output_tokens`. Streams carry it in their last event when asked
(`stream_options.include_usage`): the gateway asks for it when the client did not, and keeps
that event from the client. A stream without usage all the same has its output counted in
SSE events (vLLM sends one token per event unless it batches)."""

from __future__ import annotations

from typing import Any

import orjson

from heimdall_proxy.framework.types import DICT_OR_MAPPING, Usage


def usage_counts(usage: Any) -> Usage:
    """(prompt tokens, output tokens, cached prompt tokens) of a `usage` object, None where
    absent. The Responses API's names are looked up only when the chat/completions name is
    absent (not when it is null), so a usage with both reads as the chat/completions one."""
    if not isinstance(usage, DICT_OR_MAPPING):
        return NO_USAGE
    prompt = usage.get("prompt_tokens", _ABSENT)
    if prompt is _ABSENT:
        prompt = usage.get("input_tokens")
    output = usage.get("completion_tokens", _ABSENT)
    if output is _ABSENT:
        output = usage.get("output_tokens")
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = (
        details.get("cached_tokens")
        if details is not None and isinstance(details, DICT_OR_MAPPING)
        else None
    )
    return Usage(
        prompt if isinstance(prompt, int) else None,
        output if isinstance(output, int) else None,
        cached if isinstance(cached, int) else None,
    )


NO_USAGE = Usage(None, None)


def counts_under(doc: Any, prompt: str, output: str, cached: str) -> Usage | None:
    """The integer counts a usage mapping holds under an API's own three names (Anthropic's
    `input_tokens`..., SGLang's `meta_info`); None when it is no mapping or holds neither
    the prompt's count nor the output's."""
    if not isinstance(doc, DICT_OR_MAPPING):
        return None
    values = [doc.get(k) for k in (prompt, output, cached)]
    counts = Usage(*(v if isinstance(v, int) else None for v in values))
    return None if counts.prompt is None and counts.output is None else counts


_ABSENT: Any = object()
_BLANK = b" \t\r\n"


def body_usage(body: bytes) -> Usage:
    """Usage of a non-streamed JSON answer (or of one SSE event's JSON).

    Read from the document's tail alone, without parsing the whole answer (whose choices may
    be many kB of text): pods put `usage` last or nearly so, and `{` + body[at:] is valid JSON
    exactly when the `"usage"` at `at` is a key of the top-level object (one nested deeper
    leaves closing brackets over; one inside a string is escaped, so not preceded by `{` or
    `,`). Anything else (no top-level usage, `"usage": null` with a Responses API event's
    usage in `response`, a broken tail) is parsed whole by `_whole_body_usage`. One function
    rather than two: this runs on every answer, and the extra call and tuple test were a
    tenth of its cost."""
    at = body.rfind(b'"usage"')
    if at < 0:
        return NO_USAGE
    i = at - 1
    while i >= 0 and body[i] in _BLANK:
        i -= 1
    if i >= 0 and body[i] in b"{,":
        try:
            usage = orjson.loads(b"{" + body[at:])["usage"]
        except orjson.JSONDecodeError:
            usage = None
        if usage is not None:
            return usage_counts(usage)
    return _whole_body_usage(body)


def _whole_body_usage(body: bytes) -> Usage:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return NO_USAGE
    if not isinstance(doc, dict):
        return NO_USAGE
    usage = doc.get("usage")
    if usage is None and isinstance(doc.get("response"), dict):  # a Responses API event
        usage = doc["response"].get("usage")
    return usage_counts(usage)


USAGE_ASKED_KEY = "heimdall/usage-asked"


def ask_for_usage(request: Any) -> bool:
    """Have a streamed chat or completions request ask the pod for its usage
    (`stream_options.include_usage`) when the client did not, so token counts and TPOT are
    measured on every stream. Returns True when it changed the request: the usage event is
    then the gateway's, and `strip_usage_events` keeps it from the client. A client's
    `continuous_usage_stats` is turned off with it: vLLM honours it only with
    `include_usage`, so alone it gets the client no usage, and the gateway keeps it so."""
    if request.api not in ("chat", "completions") or not request.stream:
        return False
    options = request.data.get("stream_options")
    if isinstance(options, DICT_OR_MAPPING) and options.get("include_usage"):
        return False
    merged = (
        {**options, "include_usage": True}
        if isinstance(options, DICT_OR_MAPPING)
        else {"include_usage": True}
    )
    if merged.get("continuous_usage_stats"):
        merged["continuous_usage_stats"] = False
    request.set_data({**request.data, "stream_options": merged})
    return True


def strip_usage_events(chunk: bytes) -> bytes:
    """`chunk` without its usage-only events (`"choices": []` and a usage), which the client
    did not ask for. An event split across chunks is left as it is."""
    if b'"usage"' not in chunk:
        return chunk
    events = chunk.split(b"\n\n")
    kept = []
    for event in events:
        body = event.strip()
        if body.startswith(b"data:") and b'"usage"' in body:
            try:
                doc = orjson.loads(body[5:].strip())
            except orjson.JSONDecodeError:
                kept.append(event)
                continue
            if isinstance(doc, dict) and doc.get("choices") == [] and doc.get("usage"):
                continue
        kept.append(event)
    return b"\n\n".join(kept)


def sse_events(chunk: bytes) -> int:
    """Data events in a chunk of an SSE stream, the final `data: [DONE]` not counted."""
    n = chunk.count(b"data:")
    if n and b"[DONE]" in chunk:
        n -= chunk.count(b"data: [DONE]")
    return n


def stream_usage(chunk: bytes) -> Usage | None:
    """The last `usage` a chunk of an SSE stream carries, None when it carries none. Only
    chunks that mention `"usage"` are parsed."""
    if b'"usage"' not in chunk:
        return None
    found = None
    for line in chunk.split(b"\n"):
        if line.startswith(b"data:") and b'"usage"' in line:
            usage = body_usage(line[5:].strip())
            if usage.output is not None:
                found = usage
    return found
