"""sglanghttp-parser: SGLang's native `/generate`, with a pre-tokenized prompt (`input_ids`;
one prompt, as llm-d's parser takes). The ids key the prefix index directly. SGLang reports
usage in `meta_info` (`prompt_tokens`, `completion_tokens`, `cached_tokens`): in the body,
or in a stream's event that carries the finish reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import DICT_OR_MAPPING, InferenceRequest, Usage
from heimdall_proxy.plugins.requesthandling.parsers.vllmhttp import generate_request, token_ids
from heimdall_proxy.requesthandling.parse import invalid, json_object
from heimdall_proxy.requesthandling.usage import counts_under

SGLANGHTTP_PARSER_TYPE = "sglanghttp-parser"


def _meta_usage(doc: Any) -> Usage | None:
    meta = doc.get("meta_info") if isinstance(doc, DICT_OR_MAPPING) else None
    return counts_under(meta, "prompt_tokens", "completion_tokens", "cached_tokens")


@register(SGLANGHTTP_PARSER_TYPE, NoParams)
class SGLangHttpParser(BasePlugin[NoParams]):
    type = SGLANGHTTP_PARSER_TYPE
    claims = ("generate",)
    route_prefix = "/"

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
        data = json_object(body)
        ids = token_ids(data.get("input_ids"), "input_ids")
        salt = data.get("extra_key")
        if salt is not None and not isinstance(salt, str):
            raise invalid("extra_key", "extra_key: a string is required")
        # SGLang's native route names no model: every pod is a candidate
        return generate_request(path, body, data, headers, ids, "", self)

    def body_usage(self, body: bytes) -> Usage | None:
        try:
            return _meta_usage(orjson.loads(body))
        except orjson.JSONDecodeError:
            return None

    def chunk_usage(self, chunk: bytes) -> Usage | None:
        if b'"finish_reason"' not in chunk:
            return None
        for line in chunk.split(b"\n"):
            data = line[5:].strip() if line.startswith(b"data:") else b""
            if not data or data == b"[DONE]":
                continue
            try:
                doc = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            meta = doc.get("meta_info") if isinstance(doc, dict) else None
            if isinstance(meta, dict) and meta.get("finish_reason") is not None:
                return _meta_usage(doc)
        return None
