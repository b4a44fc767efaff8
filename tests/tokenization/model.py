"""A tiny local model directory for tokenizer tests: a word-level tokenizer.json trained with
`tokenizers` (no hub access needed) and a tokenizer_config.json with a chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
_TEXT = (
    "the a an one two some many every request router gateway pod server model token block "
    "cache prefix queue batch stream chunk answer question user assistant system message "
    "prompt reply time fast slow small large first last next other same new old good is are "
    "was be has have do can will send read write pick score route serve load run wait hello "
    "world please thanks yes no weather city paris tool call get_weather args location"
)
WORDS = _TEXT.split()
CORPUS = [
    " ".join(WORDS),
    *(f"{w} {i}" for i, w in enumerate(WORDS)),
    " ".join(map(str, range(200))),
]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|> {{ message['content'] }} {{ eos_token }} "
    "{% endfor %}"
    "{% if tools %}<|tool|> {{ tools | length }} {% endif %}"
    "{% if greeting is defined %}{{ greeting }} {% endif %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIALS))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)]
    )
    return tok


def make_model_dir(
    path: Path, chat_template: Any = CHAT_TEMPLATE, config: dict[str, Any] | None = None
) -> Path:
    """Write tokenizer.json (+ tokenizer_config.json) into `path`; returns `path`."""
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save(str(path / "tokenizer.json"))
    cfg: dict[str, Any] = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": False},
        "unk_token": "<unk>",
    }
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    cfg.update(config or {})
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return path
