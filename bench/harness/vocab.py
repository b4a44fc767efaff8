"""Real vocabularies as Hugging Face tokenizer.json files, built offline, with chat templates
written here in the formats real models use.

The Hub is out of reach in tests and CI, but mistral-common (a dev dependency) ships two
real vocabularies: Tekken (a 130k-token byte-level BPE with a pre-tokenizing regex, the
shape of Llama 3's and Qwen's tokenizers) and Mistral 7B v0.1's SentencePiece BPE (32k
pieces, Metaspace with a prefix space on the first piece only, byte fallback: the shape of
Llama 2's). They are turned into tokenizer.json here, the merges derived from the ranks and
scores (a token merges from any two tokens that concatenate to it, in the order of its
rank). Whether they tokenize exactly as Mistral's own code does does not matter to the
tests that use them: those compare two ways of running the same tokenizer."""

from __future__ import annotations

import base64
import json
from functools import cache
from pathlib import Path

import mistral_common
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

DATA = Path(mistral_common.__file__).parent / "data"
TEKKEN = DATA / "tekken_240911.json"
SPM_V1 = DATA / "tokenizer.model.v1"

#: Special tokens added to the Tekken vocabulary for the templates below (after its own).
CHAT_SPECIALS = [
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte (ByteLevel's alphabet)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = 0
    out: dict[int, str] = {}
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _merges(vocab: dict[str, int], pieces: list[str]) -> list[tuple[str, str]]:
    """Each piece merges from every split into two known pieces, ranked by the piece."""
    found: list[tuple[int, int, int, str, str]] = []
    for piece in pieces:
        rank = vocab[piece]
        for i in range(1, len(piece)):
            left, right = piece[:i], piece[i:]
            if left in vocab and right in vocab:
                found.append((rank, vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


@cache
def tekken_json(limit: int = 130_072) -> str:
    """Tekken as a byte-level BPE tokenizer.json (its first `limit` ranks)."""
    data = json.loads(TEKKEN.read_text())
    chars = _byte_chars()
    vocab: dict[str, int] = {}
    for item in data["vocab"][:limit]:
        raw = base64.b64decode(item["token_bytes"])
        vocab["".join(chars[b] for b in raw)] = item["rank"]
    pieces = sorted(vocab, key=vocab.__getitem__)
    bpe = models.BPE(vocab=vocab, merges=_merges(vocab, pieces), ignore_merges=True)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(data["config"]["pattern"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHAT_SPECIALS])
    return str(tok.to_str())


@cache
def spm_json() -> str:
    """Mistral 7B v0.1's SentencePiece BPE as a tokenizer.json."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(SPM_V1))
    vocab = {sp.id_to_piece(i): i for i in range(sp.vocab_size())}
    plain = [
        sp.id_to_piece(i)
        for i in range(sp.vocab_size())
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))
    ]
    # SentencePiece BPE ranks pieces by score; ids follow it
    bpe = models.BPE(
        vocab=vocab, merges=_merges(vocab, plain), unk_token="<unk>", byte_fallback=True
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()])
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")]
    )
    return str(tok.to_str())


@cache
def adversarial_json() -> str:
    """Tekken with what could break a cut: an NFKC normalizer (it turns fullwidth text into
    anchors' characters), added tokens that are prefixes of an anchor, matched after
    normalization, stripping their neighbours' whitespace, or matched as whole words only."""
    tok = Tokenizer.from_str(tekken_json(32_768))
    tok.normalizer = normalizers.NFKC()
    tok.add_tokens(
        [
            AddedToken("<|im", normalized=False),
            AddedToken("tool_call", normalized=True),
            AddedToken("router", single_word=True),
        ]
    )
    tok.add_special_tokens([AddedToken("<pad>", lstrip=True, rstrip=True, normalized=False)])
    return str(tok.to_str())


@cache
def spm_legacy_json() -> str:
    """The SentencePiece vocabulary as Llama 2's later tokenizer.json spells it: no
    pre-tokenizer, a normalizer that prepends "▁" to every piece and turns spaces into "▁"."""
    tok = Tokenizer.from_str(spm_json())
    tok.pre_tokenizer = None  # type: ignore[assignment]
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    return str(tok.to_str())


# ---- chat templates, in the formats of the model families ---------------------------------

#: ChatML with tools, tool calls and tool results (Qwen 2.5's format).
CHATML = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{%- else %}You are a helpful assistant.{% endif %}


# Tools

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each call, return a JSON object in <tool_call></tool_call> tags.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user'
      or (message.role == 'system' and not loop.first) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
{% if message.content or not loop.first %}
{% endif %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user
{% endif %}
<tool_response>
{{ message.content }}
</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

#: Llama 3's header format, content trimmed.
LLAMA3 = """\
{{- bos_token }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}
{%- if message.tool_calls %}
{%- for call in message.tool_calls %}
{%- set args = call.function.arguments | tojson %}
{{- '<|python_tag|>{"name": "' + call.function.name + '", "parameters": ' + args + '}' }}
{%- endfor %}
{%- else %}{{ message.content | trim }}{% endif %}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"""

#: Mistral v3 with Tekken: [INST] turns, tools before the last user turn.
MISTRAL_V3 = """\
{{- bos_token }}
{%- set users = messages | selectattr('role', 'equalto', 'user') | list %}
{%- for message in messages %}
{%- if message.role == 'user' %}
{%- if tools and message is sameas users[-1] %}
{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' }}
{%- endif %}
{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.role == 'assistant' %}
{%- if message.tool_calls %}
{{- '[TOOL_CALLS]' + (message.tool_calls | map(attribute='function') | list | tojson) + eos_token }}
{%- else %}{{ message.content }}{{ eos_token }}{% endif %}
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{{ message.content }}[/TOOL_RESULTS]
{%- elif message.role == 'system' %}{{ message.content }}\n\n
{%- endif %}
{%- endfor %}"""

#: Llama 2 / Mistral v1: [INST] is plain text, only <s> and </s> are special tokens.
LLAMA2 = """\
{%- for message in messages %}
{%- if message.role == 'user' %}{{ bos_token + '[INST] ' + message.content + ' [/INST]' }}
{%- elif message.role == 'assistant' %}{{ ' ' + (message.content or '') + eos_token }}
{%- else %}{{ bos_token + '[INST] <<SYS>>\\n' + (message.content or '') + '\\n<</SYS>> [/INST]' }}
{%- endif %}
{%- endfor %}"""


def write_model(directory: Path, tokenizer_json: str, template: str) -> Path:
    """A model directory (tokenizer.json, tokenizer_config.json); returns tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tokenizer_json)
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
    if "start_header" in template:
        config["bos_token"] = "<|begin_of_text|>"
        config["eos_token"] = "<|eot_id|>"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"
