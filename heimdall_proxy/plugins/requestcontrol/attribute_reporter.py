"""request-attribute-reporter (llm-d's): a number computed from each answer's usage with a
CEL expression (a request's cost, say), reported per request."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from typing import Any

from google.protobuf import struct_pb2
from prometheus_client.core import Metric
from pydantic import Field, field_validator

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import PluginParams
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import RequestContext
from heimdall_proxy.observability.loop import CounterFamily

log = logging.getLogger(__name__)

REQUEST_ATTRIBUTE_REPORTER_TYPE = "request-attribute-reporter"
DEFAULT_NAMESPACE = "envoy.lb"
#: The CEL runtime (Google's, the C++ one llm-d's Go runtime follows), an optional extra.
CEL_MODULE = "cel_expr_python.cel"


class AttributeKey(PluginParams):
    namespace: str = ""
    name: str = ""


class Attribute(PluginParams):
    key: AttributeKey = Field(default_factory=AttributeKey)
    expression: str = ""
    condition: str = ""


class ReporterParams(PluginParams):
    attributes: list[Attribute] = Field(default_factory=list)

    @field_validator("attributes")
    @classmethod
    def _one(cls, value: list[Attribute]) -> list[Attribute]:
        if len(value) != 1:
            raise ValueError("attributes must contain exactly one entry")
        if not value[0].key.name:
            raise ValueError("attributes[0].key.name cannot be empty")
        if not value[0].expression.strip():
            raise ValueError("attributes[0].expression cannot be empty")
        return value


def _cel() -> Any:
    try:
        return importlib.import_module(CEL_MODULE)
    except ImportError as exc:
        raise ValueError(
            "request-attribute-reporter evaluates CEL expressions with the cel-expr-python "
            "package: install it (pip install 'heimdall-proxy[cel]')"
        ) from exc


@register(REQUEST_ATTRIBUTE_REPORTER_TYPE, ReporterParams, imports=(CEL_MODULE,))
class RequestAttributeReporter(BasePlugin[ReporterParams]):
    """When an answer is complete, evaluates its CEL `expression` over the answer's `usage`
    (`usage.prompt_tokens`, `usage.completion_tokens`, `usage.total_tokens`, each 0 when the
    pod did not say, and `usage.prompt_tokens_details.cached_tokens` when it did), if its
    `condition` (optional CEL, must be true) holds. A result that is a number is truncated to
    an integer; 0 is not reported; an evaluation error or a non-number is logged and not
    reported. Both expressions are compiled at load, so a syntax error refuses the config.

    llm-d hands the value to the proxy in front of it as ext_proc dynamic metadata
    (`key.namespace`, default `envoy.lb`, field `key.name`). Here the gateway is the proxy:
    the value is added to the counter `heimdall_request_attribute_total` {namespace, name,
    model_name, target_model_name} (a request cost's running total per model, e.g. for
    billing or usage quotas), and logged at debug level with the request id."""

    type = REQUEST_ATTRIBUTE_REPORTER_TYPE

    def __init__(self, name: str, params: ReporterParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        cel = _cel()
        attr = params.attributes[0]
        self.namespace = attr.key.namespace or DEFAULT_NAMESPACE
        self.attribute = attr.key.name
        env = cel.NewEnv(variables={"usage": cel.Type("google.protobuf.Struct")})
        self._expression = _compile(env, attr.expression, "expression")
        self._condition = _compile(env, attr.condition, "condition") if attr.condition else None
        self.reported = CounterFamily(
            "heimdall_request_attribute",
            "Sum of the values request-attribute-reporter computed from the answers' usage.",
            ("namespace", "name", "model_name", "target_model_name"),
        )

    def value(self, usage: dict[str, Any]) -> int | None:
        """The integer to report for an answer's `usage`, None when nothing is reported."""
        data = struct_pb2.Struct()
        data.update(usage)
        if self._condition is not None:
            ok = self._eval(self._condition, data, "condition")
            if ok is not True:
                return None
        result = self._eval(self._expression, data, "expression")
        if isinstance(result, bool) or not isinstance(result, int | float):
            if result is not None:
                log.warning("%s: expression gave %r, not a number", self.name, result)
            return None
        return int(result) or None

    def _eval(self, expr: Any, data: struct_pb2.Struct, what: str) -> object:
        value = expr.eval(data={"usage": data})
        if value.type().name() == "ERROR":
            log.warning("%s: evaluating the %s failed: %s", self.name, what, value.value())
            return None
        result: object = value.value()
        return result

    async def response_complete(self, ctx: RequestContext) -> None:
        if ctx.error is not None or not (ctx.status or 0) < 300:
            return
        usage = answer_usage(ctx)
        value = self.value(usage)
        if value is None:
            return
        request = ctx.request
        self.reported.labels(
            self.namespace, self.attribute, request.model, request.target_model
        ).inc(value)
        log.debug(
            "request %s: %s/%s = %d",
            request.request_id,
            self.namespace,
            self.attribute,
            value,
        )

    def collect_metrics(self) -> Iterator[Metric]:
        yield self.reported.collect()


def answer_usage(ctx: RequestContext) -> dict[str, Any]:
    """The answer's usage as llm-d's Usage object marshals: the three counts always (0 when
    unknown), the prompt's cached tokens when the pod said."""
    prompt, output = ctx.prompt_tokens or 0, ctx.output_tokens or 0
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
    }
    if ctx.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": ctx.cached_tokens}
    return usage


def _compile(env: Any, text: str, what: str) -> Any:
    try:
        return env.compile(text)
    except RuntimeError as exc:
        raise ValueError(f"failed to compile {what}: {exc}") from exc
