"""Turn a client body into an InferenceRequest: parsed once with orjson, the fields the
gateway reads validated with pydantic (lax, as vLLM's own models are), everything else left
for the model server to judge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from heimdall_proxy.framework.errors import RequestError
from heimdall_proxy.framework.types import ApiKind, InferenceRequest


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr = Field(min_length=1)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    n: int | None = None


# Lists are validated as lists only: checking every element through pydantic cost ~1 us per
# chat message and more per token of a token-id prompt, on every request. The elements the
# gateway reads are checked below; the rest is the model server's to judge.


class CompletionsBody(_Body):
    prompt: str | list[Any] | None = None


class ChatBody(_Body):
    messages: list[Any]
    max_completion_tokens: int | None = None


class ResponsesBody(_Body):
    input: str | list[Any] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    store: bool | None = None


class OtherBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None


#: The same fields as the models above, checked by exact type: a body that passes needs no
#: pydantic run (which cost ~40% of parse_body). Anything else (a missing field, a value
#: pydantic would coerce such as "true" or 5.0, a bool where an int goes) is left to pydantic,
#: which decides and words the error, so the outcome is the same either way.
_NESTR, _STR, _BOOL, _INT, _DICT, _LIST, _STR_OR_LIST = range(7)
_COMMON = (("stream", _BOOL), ("stream_options", _DICT), ("max_tokens", _INT), ("n", _INT))
_PLAIN: dict[ApiKind, tuple[tuple[str, ...], tuple[tuple[str, int], ...]]] = {
    "completions": (("model",), (("model", _NESTR), *_COMMON, ("prompt", _STR_OR_LIST))),
    "chat": (
        ("model", "messages"),
        (("model", _NESTR), *_COMMON, ("messages", _LIST), ("max_completion_tokens", _INT)),
    ),
    "responses": (
        ("model",),
        (
            ("model", _NESTR),
            *_COMMON,
            ("input", _STR_OR_LIST),
            ("instructions", _STR),
            ("previous_response_id", _STR),
            ("max_output_tokens", _INT),
            ("store", _BOOL),
        ),
    ),
    "other": ((), (("model", _STR),)),
}


#: Each kind as the exact types a value of it may have (`type(v) is int` refuses a bool, as
#: the chained tests did); a `_NESTR` must also not be "".
_TYPES: dict[int, tuple[type, ...]] = {
    _NESTR: (str,),
    _STR: (str,),
    _BOOL: (bool,),
    _INT: (int,),
    _DICT: (dict,),
    _LIST: (list,),
    _STR_OR_LIST: (str, list),
}
#: `_PLAIN` with each field's kind as its types and whether it must be non-empty: one
#: membership test per field instead of a chain of comparisons (parse runs per request).
_CHECKS: dict[ApiKind, tuple[tuple[str, ...], tuple[tuple[str, tuple[type, ...], bool], ...]]] = {
    api: (required, tuple((name, _TYPES[kind], kind == _NESTR) for name, kind in fields))
    for api, (required, fields) in _PLAIN.items()
}


def _plainly_valid(api: ApiKind, data: dict[str, Any]) -> bool:
    """Whether `data` passes its model with every checked value of exactly the right type."""
    required, fields = _CHECKS[api]
    get = data.get
    for name in required:
        if get(name) is None:
            return False
    for name, types, nonempty in fields:
        value = get(name)
        if value is not None and (type(value) not in types or (nonempty and value == "")):
            return False
    return True


_MODELS: dict[ApiKind, type[BaseModel]] = {
    "completions": CompletionsBody,
    "chat": ChatBody,
    "responses": ResponsesBody,
    "other": OtherBody,
}


def _validation_error(exc: ValidationError) -> RequestError:
    errors = exc.errors()
    err = errors[0]
    # A field path with list indexes, without pydantic's union-member tags ("str", "list[int]").
    path = [str(err["loc"][0])] if err["loc"] else []
    path += [str(p) for p in err["loc"][1:] if isinstance(p, int)]
    param = ".".join(path) or None
    if err["type"] == "missing":
        message = f"'{param}' is a required property"
    elif len(errors) > 1 and all(e["loc"][:1] == err["loc"][:1] for e in errors):
        message = f"Invalid type for '{param}'"  # every member of a union rejected it
    else:
        message = f"Invalid value for '{param}': {err['msg']}"
    return RequestError(400, message, param=param, code="invalid_value")


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; RequestError(400) saying what is wrong with it otherwise."""
    if not body:
        raise RequestError(
            400, "The request body is empty; expected a JSON object.", code="invalid_json"
        )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "UTF-8" in str(exc):
            raise RequestError(
                400, "The request body is not valid UTF-8.", code="invalid_encoding"
            ) from exc
        raise RequestError(
            400, f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc
    if not isinstance(data, dict):
        raise RequestError(400, "The request body must be a JSON object.", code="invalid_json")
    return data


def invalid(param: str, message: str) -> RequestError:
    """A 400 naming the field at fault."""
    return RequestError(400, message, param=param, code="invalid_value")


def parse_body(
    api: ApiKind, path: str, body: bytes, headers: Mapping[str, str]
) -> InferenceRequest:
    """An OpenAI request of kind `api`. Raises RequestError(400) for a body the gateway
    cannot route."""
    data = json_object(body)
    if not _plainly_valid(api, data):
        try:
            _MODELS[api].model_validate(data)
        except ValidationError as exc:
            raise _validation_error(exc) from exc
    if api == "chat":
        for i, message in enumerate(data["messages"]):
            if not isinstance(message, dict):
                raise RequestError(
                    400,
                    f"Invalid value for 'messages.{i}': a message must be an object",
                    param=f"messages.{i}",
                    code="invalid_value",
                )
    model = data.get("model")
    stream = data.get("stream")
    return InferenceRequest(
        api=api,
        path=path,
        model=model if isinstance(model, str) else "",
        body=body,
        data=data,
        headers=headers,
        stream=stream is True or (isinstance(stream, str) and stream.lower() == "true"),
    )
