"""Build a tiny Llama with random weights and a locally trained BPE tokenizer, for vLLM on CPU.

Nothing is fetched from a hub: the tokenizer is trained with `tokenizers` on text made here
(seeded sentences plus the interpreter's own standard-library sources), the model is a
`LlamaForCausalLM` initialised from a fixed seed. The output only has to be a model vLLM loads
and serves quickly; what it says is noise.

Sizes follow the CPU backend's limits: head_dim = hidden / heads = 32 (its attention kernels
need at least 32), two layers so a forward pass costs next to nothing on a shared 2-core box.

Run from the checkout's root with the vLLM venv's Python (it has torch and transformers):

    .venv-vllm/bin/python -m bench.real_vllm.make_tiny_model bench/real_vllm/.model/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 2000
HIDDEN = 128
LAYERS = 2
HEADS = 4
MAX_POSITIONS = 2048
SEED = 0
BOS, EOS, PAD = "<s>", "</s>", "<pad>"

# Role-tagged turns; the trailing `<|assistant|>` line asks the model for the next turn. The
# content may be a string or OpenAI content parts (the Responses API and some clients send
# parts), so both are rendered.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['text', 'input_text', 'output_text'] %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORD_TEXT = (
    "the a an one two some many every request router gateway pod server model token block "
    "cache prefix queue batch stream chunk answer question user assistant system message "
    "prompt reply time fast slow small large first last next other same new old good "
    "is are was were be has have had do does did can will may must should would could "
    "send read write pick score route serve load run wait stop start keep drop hold take "
    "and or but if when while because so then than of in on at to from with by for about "
    "red green blue cat dog bird tree river city house road light night day week year "
    "hello world please thanks yes no maybe always never often here there now today"
)
_WORDS = _WORD_TEXT.split()


def corpus(seed: int) -> Iterator[str]:
    """Seeded English-like sentences, then standard-library sources for a wider vocabulary."""
    rng = random.Random(seed)
    for _ in range(20_000):
        words = rng.choices(_WORDS, k=rng.randint(4, 16))
        yield " ".join(words).capitalize() + rng.choice((".", "?", "!", ","))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py")):
        try:
            yield path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def build_tokenizer(vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # Byte-level: every input string maps to tokens, so no request can hit an unknown token.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(SEED), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="model directory to write")
    parser.add_argument("--force", action="store_true", help="rebuild even if it exists")
    args = parser.parse_args(argv)
    out: Path = args.out
    if (out / "config.json").exists() and (out / "tokenizer.json").exists() and not args.force:
        print(f"{out}: already built")
        return 0

    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    raw = build_tokenizer(VOCAB_SIZE)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
    )
    bos_id, eos_id, pad_id = (raw.token_to_id(t) for t in (BOS, EOS, PAD))

    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN * 2,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(
        out
    )
    # Some transformers releases write the chat template only to chat_template.jinja; vLLM reads
    # either, but keep it in tokenizer_config.json too so older readers find it.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    if "chat_template" not in tc:
        tc["chat_template"] = CHAT_TEMPLATE
        tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
    print(
        f"{out}: vocab {config.vocab_size}, hidden {HIDDEN}, layers {LAYERS}, heads {HEADS}, "
        f"{sum(p.numel() for p in model.parameters())} parameters"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
