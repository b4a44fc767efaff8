"""openai-parser: the OpenAI API (completions, chat completions, responses, and the routes
read only for their model: embeddings, conversations, image generation, vLLM's render
routes). Its answers carry `usage` in the body, or in a stream's last event when asked
(the relay asks for it, requesthandling/usage.py)."""

from __future__ import annotations

from collections.abc import Mapping

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import ApiKind, InferenceRequest, Usage
from heimdall_proxy.requesthandling.parse import parse_body
from heimdall_proxy.requesthandling.parsers import longest_suffix
from heimdall_proxy.requesthandling.usage import body_usage, stream_usage

OPENAI_PARSER_TYPE = "openai-parser"

#: llm-d's claims, and what each is parsed as; the longest suffix wins, so
#: "chat/completions" is a chat request and not a completions one.
API_OF: dict[str, ApiKind] = {
    "chat/completions": "chat",
    "completions": "completions",
    "responses": "responses",
    "chat/completions/render": "chat",
    "completions/render": "completions",
    "embeddings": "other",
    "conversations": "other",
    "images/generations": "other",
}


#: The routes this gateway serves them at, looked up before any suffix is compared.
API_OF_ROUTE: dict[str, ApiKind] = {"/v1/" + suffix: api for suffix, api in API_OF.items()}


def api_of(path: str) -> ApiKind:
    """The API of an OpenAI path, by its longest known suffix."""
    api = API_OF_ROUTE.get(path)
    if api is not None:
        return api
    suffix = longest_suffix(path, API_OF)
    return API_OF[suffix] if suffix is not None else "completions"


@register(OPENAI_PARSER_TYPE, NoParams)
class OpenAIParser(BasePlugin[NoParams]):
    """Parses OpenAI requests into the fields routing reads (model, prompt, stream, output
    budget), validated as vLLM would; everything else is left to the pod."""

    type = OPENAI_PARSER_TYPE
    claims = tuple(API_OF)
    route_prefix = "/v1/"

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> InferenceRequest:
        request = parse_body(api_of(path), path, body, headers)
        request.parser = self
        return request

    def body_usage(self, body: bytes) -> Usage | None:
        return body_usage(body)

    def chunk_usage(self, chunk: bytes) -> Usage | None:
        return stream_usage(chunk)
