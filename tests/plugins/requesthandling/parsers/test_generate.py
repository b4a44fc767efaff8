"""vllmhttp-parser and sglanghttp-parser: pre-tokenized prompts whose ids key the prefix
index directly (real tokens, not estimated), and the usage each engine reports."""

from __future__ import annotations

import orjson
import pytest

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.params import NoParams
from heimdall_proxy.framework.types import Usage
from heimdall_proxy.plugins.requesthandling.parsers.sglanghttp import SGLangHttpParser
from heimdall_proxy.plugins.requesthandling.parsers.vllmhttp import VllmHttpParser
from tests.plugins.helpers import ledger

VLLM = VllmHttpParser("vllmhttp-parser", NoParams(), ledger())
SGLANG = SGLangHttpParser("sglanghttp-parser", NoParams(), ledger())


def test_vllm_generate_carries_its_token_ids() -> None:
    body = {"model": "m", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}}
    req = VLLM.parse_request("/inference/v1/generate", orjson.dumps(body), {})
    assert req.api == "generate" and req.model == "m"
    assert req.token_ids == [1, 2, 3] and not req.token_ids_estimated
    assert VLLM.body_usage(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}') == (
        Usage(3, 4, None)
    )


def test_sglang_generate_carries_its_input_ids_and_meta_info_usage() -> None:
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}, "stream": True}
    req = SGLANG.parse_request("/generate", orjson.dumps(body), {})
    assert req.token_ids == [5, 6] and req.stream and req.model == ""
    meta = {"prompt_tokens": 2, "completion_tokens": 2, "cached_tokens": 1}
    assert SGLANG.body_usage(orjson.dumps({"text": "x", "meta_info": meta})) == Usage(2, 2, 1)
    running = b'data: {"text": "a", "meta_info": {"finish_reason": null}}\n\n'
    final = b"data: " + orjson.dumps({"meta_info": {**meta, "finish_reason": {"type": "length"}}})
    assert SGLANG.chunk_usage(running) is None
    assert SGLANG.chunk_usage(final + b"\n\ndata: [DONE]\n\n") == Usage(2, 2, 1)


@pytest.mark.parametrize(
    ("parser", "doc", "param"),
    [
        (VLLM, {"token_ids": []}, "token_ids"),
        (VLLM, {"token_ids": [1, "2"]}, "token_ids"),
        (SGLANG, {"input_ids": [-1]}, "input_ids"),
        (SGLANG, {"input_ids": [1], "extra_key": 3}, "extra_key"),
    ],
)
def test_bad_prompts_are_refused(parser: object, doc: dict[str, object], param: str) -> None:
    with pytest.raises(RequestError) as info:
        parser.parse_request("/generate", orjson.dumps(doc), {})  # type: ignore[attr-defined]
    assert info.value.param == param
