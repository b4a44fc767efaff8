"""vllmhttp-parser: vLLM's `/inference/v1/generate`, outside the OpenAI API surface, which
takes a pre-tokenized prompt (`token_ids`). The ids are the prompt's real tokens, so the
prefix index keys them directly, with no tokenizer. Its answers are OpenAI-shaped in usage,
read as openai-parser reads them. Only this path is claimed: list openai-parser beside it
to serve the OpenAI routes on the same gateway."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import AnswerParser, InferenceRequest, Usage
from heimdall_proxy.requesthandling.parse import invalid, json_object
from heimdall_proxy.requesthandling.usage import body_usage, stream_usage

VLLMHTTP_PARSER_TYPE = "vllmhttp-parser"
GENERATE = "inference/v1/generate"


def token_ids(value: Any, param: str) -> list[int]:
    """A non-empty list of non-negative ints (a pre-tokenized prompt); a 400 otherwise."""
    if not isinstance(value, list) or not value:
        raise invalid(param, f"{param}: a non-empty list of token ids is required")
    for tok in value:
        if type(tok) is not int or tok < 0:
            raise invalid(param, f"{param}: token ids must be non-negative integers")
    return value


def generate_request(
    path: str,
    body: bytes,
    data: dict[str, Any],
    headers: Mapping[str, str],
    ids: list[int],
    model: str,
    parser: AnswerParser,
) -> InferenceRequest:
    """A pre-tokenized generate request: its ids are the prompt's real tokens."""
    request = InferenceRequest(
        api="generate",
        path=path,
        model=model,
        body=body,
        data=data,
        headers=headers,
        stream=data.get("stream") is True,
        parser=parser,
    )
    request.token_ids = ids
    return request


@register(VLLMHTTP_PARSER_TYPE, NoParams)
class VllmHttpParser(BasePlugin[NoParams]):
    type = VLLMHTTP_PARSER_TYPE
    claims = (GENERATE,)
    route_prefix = "/"

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
        data = json_object(body)
        ids = token_ids(data.get("token_ids"), "token_ids")
        model = data.get("model")
        model = model if isinstance(model, str) else ""
        return generate_request(path, body, data, headers, ids, model, self)

    def body_usage(self, body: bytes) -> Usage | None:
        return body_usage(body)

    def chunk_usage(self, chunk: bytes) -> Usage | None:
        return stream_usage(chunk)
