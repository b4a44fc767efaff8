"""models-data-source and model-server-protocol-models: the data-layer pair that learns which
models each pod serves from its OpenAI-compatible model list."""

from __future__ import annotations

import logging
from typing import Literal

import aiohttp
import orjson

from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.handle import PluginHandle
from heimdall_proxy.framework.params import NoParams, PluginParams, RequestPath
from heimdall_proxy.framework.plugins import MODEL_LIST_DATA
from heimdall_proxy.framework.registry import register
from heimdall_proxy.framework.types import Endpoint, parse_model_list, publish_models

log = logging.getLogger(__name__)

MODELS_DATA_SOURCE_TYPE = "models-data-source"
MODEL_SERVER_PROTOCOL_MODELS_TYPE = "model-server-protocol-models"
#: llm-d's current name of the extractor (model-server-protocol-models is its older one).
MODELS_DATA_EXTRACTOR_TYPE = "models-data-extractor"
#: The gate these plugins once needed; llm-d has since made its data layer unconditional,
#: and so is it here (the gate is still accepted, and means nothing).
DATA_LAYER_GATE = "dataLayer"

#: What models-data-source collects and the extractor reads: the decoded JSON of an OpenAI
#: `/v1/models` answer.
OPENAI_MODEL_LIST = MODEL_LIST_DATA


class ModelsDataSourceParams(PluginParams):
    #: Unset: the endpoint URL's own scheme, which is "http" (the reference's default) for
    #: every plain endpoint; set it to force one.
    scheme: Literal["http", "https"] | None = None
    path: RequestPath = "/v1/models"
    insecure_skip_verify: bool = True


@register(MODELS_DATA_SOURCE_TYPE, ModelsDataSourceParams)
class ModelsDataSource(BasePlugin[ModelsDataSourceParams]):
    """Data source: GETs `{scheme}://{pod host:port}{path}` from each pod on the data layer's
    model-list interval (`--models-interval`) and hands the decoded JSON to its extractors.
    With https and `insecureSkipVerify` (the default) the pod's certificate is not checked.
    A non-200 answer or a body that is not JSON is a failed collection: the pod keeps the
    models published last."""

    type = MODELS_DATA_SOURCE_TYPE
    output_type = OPENAI_MODEL_LIST

    def __init__(self, name: str, params: ModelsDataSourceParams, handle: PluginHandle) -> None:
        super().__init__(name, params, handle)
        self._path = params.path
        self._scheme = params.scheme
        self._verify_tls = not params.insecure_skip_verify

    def url(self, endpoint: Endpoint) -> str:
        scheme, _, rest = endpoint.url.partition("://")
        return f"{self._scheme or scheme}://{rest}{self._path}"

    async def collect(self, endpoint: Endpoint, session: aiohttp.ClientSession) -> object:
        url = self.url(endpoint)
        async with session.get(url, ssl=self._verify_tls) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status} from {url}")
            return orjson.loads(await resp.read())


@register(MODEL_SERVER_PROTOCOL_MODELS_TYPE, NoParams, aliases=(MODELS_DATA_EXTRACTOR_TYPE,))
class ModelServerProtocolModels(BasePlugin[NoParams]):
    """Data extractor (llm-d now names it models-data-extractor): reads an OpenAI model
    list (`{"data": [{"id": ...}, ...]}`, LoRA adapters included as vLLM lists them) and
    publishes it as the pod's `models` and
    `model_cards`, which drive the candidate selection by model and `GET /v1/models`."""

    type = MODEL_SERVER_PROTOCOL_MODELS_TYPE
    input_type = OPENAI_MODEL_LIST

    def extract(self, endpoint: Endpoint, data: object) -> None:
        cards = parse_model_list(data)
        if publish_models(endpoint, cards):
            log.info(
                "endpoint serves models: %s",
                ", ".join(sorted(cards)),
                extra={"endpoint": endpoint.name},
            )
