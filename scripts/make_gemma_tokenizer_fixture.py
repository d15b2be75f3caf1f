#!/usr/bin/env python3
"""Build a small tokenizer shaped like Gemma's (no hub access: trained here on a few sentences) and
transformers' reference encodings, for rlvr-model's test `gemma::a_gemma_shaped_tokenizer_...`.

    /work/venv-a/bin/python scripts/make_gemma_tokenizer_fixture.py

Gemma's tokenizer.json is a SentencePiece model exported as BPE: spaces become "▁" in a normalizer
(no pre-tokenizer), `byte_fallback` spells a character outside the vocabulary as its UTF-8 bytes
`<0x..>`, the decoder undoes both (Replace, ByteFallback, Fuse), and a template post-processor adds
`<bos>`. The special tokens are `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3 and the turn markers
`<start_of_turn>` / `<end_of_turn>`. This fixture has that shape with a 400-entry vocabulary and the
Gemma 2-style chat template of scripts/make_chat_template_fixtures.py. Writes
crates/rlvr-model/tests/fixtures/gemma_tokenizer/{tokenizer.json, tokenizer_config.json,
expected.json}: the ids transformers' `AutoTokenizer` gives for each text (with and without special
tokens), its decoding, and `apply_chat_template(..., tokenize=True)`'s ids for a conversation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import transformers
from tokenizers import Tokenizer, decoders, normalizers, processors
from tokenizers.models import BPE
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates" / "rlvr-model" / "tests" / "fixtures" / "gemma_tokenizer"
sys.path.insert(0, str(REPO / "scripts"))
from make_chat_template_fixtures import GEMMA2_STYLE  # noqa: E402

CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May?",
    "Compute the answer step by step, then write the final answer after ####.",
    "The quick brown fox jumps over the lazy dog.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
]
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
TEXTS = [
    "How many clips did Natalia sell?",
    "  leading spaces and  double  spaces ",
    "Résumé: 日本語 ✓ — emoji 🙂 and a tab\there",
    "48 + 24 = 72\n#### 72",
    "",
]


def train() -> Tokenizer:
    """BPE merges learnt from CORPUS on "▁"-joined words, then rebuilt with Gemma's shape."""
    from tokenizers import pre_tokenizers, trainers

    t = Tokenizer(BPE(unk_token="<unk>"))
    t.normalizer = normalizers.Replace(" ", "▁")
    t.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tr = trainers.BpeTrainer(vocab_size=400 - len(SPECIALS) - 256, special_tokens=[], show_progress=False)
    t.train_from_iterator(CORPUS, tr)
    learnt = json.loads(t.to_str())["model"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for tok in sorted(learnt["vocab"], key=learnt["vocab"].get):
        vocab.setdefault(tok, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    g = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    g.normalizer = normalizers.Replace(" ", "▁")
    g.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    g.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 2)]
    )
    g.add_special_tokens(SPECIALS)
    return g


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    g = train()
    g.save(str(OUT / "tokenizer.json"))
    cfg = {
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": GEMMA2_STYLE,
        "tokenizer_class": "GemmaTokenizer",
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False) + "\n")
    tok = AutoTokenizer.from_pretrained(OUT)
    cases = []
    for text in TEXTS:
        with_special = tok(text).input_ids
        plain = tok(text, add_special_tokens=False).input_ids
        assert with_special[0] == 2 and with_special[1:] == plain, (text, with_special, plain)
        assert g.encode(text, add_special_tokens=False).ids == plain
        decoded = tok.decode(plain)
        cases.append({"text": text, "ids": with_special, "ids_plain": plain, "decoded": decoded})
    # Byte fallback is exercised: a character outside the vocabulary becomes <0x..> tokens.
    fallback = cases[2]["ids_plain"]
    assert any(6 <= i < 6 + 256 for i in fallback), fallback
    messages = [
        {"role": "user", "content": "How many clips did Natalia sell?"},
        {"role": "assistant", "content": "72"},
        {"role": "user", "content": "Résumé ✓"},
    ]
    chat = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    chat = chat["input_ids"] if isinstance(chat, dict) or hasattr(chat, "keys") else chat
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = {
        "transformers": transformers.__version__,
        "cases": cases,
        "chat": {"messages": messages, "text": text, "ids": list(chat)},
        "vocab_size": g.get_vocab_size(),
    }
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    print(f"vocab {g.get_vocab_size()}, chat ids {len(chat)}, fallback ids {fallback}")


if __name__ == "__main__":
    main()
