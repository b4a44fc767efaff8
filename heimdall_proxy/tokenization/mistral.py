"""`tokenizerMode: mistral`: prompt ids as vLLM computes them for Mistral models.

vLLM's mistral mode does not render a Jinja chat template: it hands the OpenAI messages to
Mistral's own library, `mistral-common`, which encodes the conversation straight to token ids
(`ChatCompletionRequest.from_openai`, then `encode_chat_completion`), and encodes a
completion prompt with the beginning-of-sequence token unless `add_special_tokens` is false.
This module does the same with the same library (the `mistral` extra), from the model's
`tekken.json`, or its newest `tokenizer.model.v*` (SentencePiece) when it has no tekken file;
on the Hub, only those files of the repository are fetched (`download_mistral_tokenizer`).
Like vLLM, a chat request that brings its own `chat_template` or `chat_template_kwargs` is
refused (ValueError: the pod refuses it too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heimdall_proxy.tokenization.local import OpenAIRequestTokenizer
from heimdall_proxy.tokenization.resolve import HFCacheSearch, model_spec

#: The tokenizer file of a Mistral model in the tekken format (preferred, as vLLM does).
TEKKEN_FILE = "tekken.json"
_SENTENCEPIECE = re.compile(r"tokenizer\.model\.v(\d+)(m\d+)?$")


def mistral_file(path: Path) -> Path | None:
    """`path` itself when it is a file; else the directory's tekken.json, or its newest
    tokenizer.model.v* file; None when there is none."""
    if path.is_file():
        return path
    if not path.is_dir():
        return None
    tekken = path / TEKKEN_FILE
    if tekken.is_file():
        return tekken
    versions = []
    for p in path.iterdir():
        m = _SENTENCEPIECE.match(p.name)
        if m and p.is_file():
            versions.append((int(m.group(1)), p.name, p))
    return max(versions)[2] if versions else None


def download_mistral_tokenizer(model: str, hf: HFCacheSearch) -> Path:
    """The Mistral tokenizer file of `hf.repo or model` from the Hugging Face Hub, or its
    cache when offline: the repository's tekken.json and tokenizer.model.v* files only, then
    `mistral_file` picks. Raises FileNotFoundError / the hub client's errors."""
    from huggingface_hub import snapshot_download

    folder = snapshot_download(
        hf.repo or model,
        revision=hf.revision,
        cache_dir=hf.cache_dir,
        token=hf.token,
        allow_patterns=[TEKKEN_FILE, "tokenizer.model.v*"],
    )
    found = mistral_file(Path(folder))
    if found is None:
        raise FileNotFoundError(f"{hf.repo or model} has no tekken.json or tokenizer.model.v*")
    return found


def load_mistral_models(specs: list[str]) -> dict[str, MistralRequestTokenizer]:
    """`[NAME=]MODEL` specs (`tokenizer-server --mistral-model`) -> tokenizers; MODEL is a
    directory or a tokenizer file. Raises FileNotFoundError, ImportError."""
    out: dict[str, MistralRequestTokenizer] = {}
    for name, model in map(model_spec, specs):
        found = mistral_file(Path(model).expanduser())
        if found is None:
            raise FileNotFoundError(f"{model}: no tekken.json or tokenizer.model.v* there")
        out[name] = MistralRequestTokenizer(found)
    return out


def _library() -> Any:
    """mistral-common's entry points, or ImportError naming the extra to install."""
    try:
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        from mistral_common.protocol.instruct.validator import ValidationMode
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    except ImportError as exc:
        raise ImportError(
            "tokenizerMode mistral needs the mistral-common library: "
            "pip install 'heimdall-proxy[mistral]'"
        ) from exc
    return ChatCompletionRequest, ValidationMode, MistralTokenizer


class MistralRequestTokenizer(OpenAIRequestTokenizer):
    """Tokenizes OpenAI request bodies as vLLM's mistral tokenizer mode does (see the module
    docstring). Thread-safe for concurrent reads, as LocalTokenizer."""

    def __init__(self, tokenizer_file: str | Path) -> None:
        chat_request, mode, tokenizer = _library()
        self.path = Path(tokenizer_file)
        self._chat_request = chat_request
        # vLLM loads it in test mode: no validation beyond what the model needs
        self._tokenizer = tokenizer.from_file(self.path, mode=mode.test)
        self._raw = self._tokenizer.instruct_tokenizer.tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._raw.encode(text, bos=add_special_tokens, eos=False))

    def tokenize_chat(self, data: Mapping[str, Any], messages: Any) -> list[int]:
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise ValueError("messages must be a list of objects")
        if data.get("chat_template") is not None or data.get("chat_template_kwargs") is not None:
            raise ValueError("chat_template is not supported for Mistral tokenizers")
        tools = data.get("tools")
        request = self._chat_request.from_openai(
            [dict(m) for m in messages],
            tools=tools if isinstance(tools, list) and tools else None,
            continue_final_message=data.get("continue_final_message") is True,
        )
        return list(self._tokenizer.encode_chat_completion(request).tokens)
