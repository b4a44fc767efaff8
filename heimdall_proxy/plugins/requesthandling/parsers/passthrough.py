"""passthrough-parser: any request, not interpreted. It claims no path, so it is the fallback
for paths no other parser claims, and llm-d's default list ends with it: such requests are
forwarded and scheduled without payload signals (no prompt, so no prefix or token-count
routing) instead of refused. Its answers are not read.

One difference from llm-d: a JSON object body's top-level `model` string, when there is one,
still picks the pods that serve that model (a pool may serve several; the body is otherwise
untouched and forwarded as it came)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import InferenceRequest, Usage

PASSTHROUGH_PARSER_TYPE = "passthrough-parser"


@register(PASSTHROUGH_PARSER_TYPE, NoParams)
class PassthroughParser(BasePlugin[NoParams]):
    type = PASSTHROUGH_PARSER_TYPE
    claims: tuple[str, ...] = ()
    route_prefix = "/"

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
        model = ""
        if body[:1] == b"{":
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("model"), str):
                model = doc["model"]
        return InferenceRequest(
            api="passthrough", path=path, model=model, body=body, data={}, headers=headers
        )

    def body_usage(self, body: bytes) -> Usage | None:
        return None

    def chunk_usage(self, chunk: bytes) -> Usage | None:
        return None
