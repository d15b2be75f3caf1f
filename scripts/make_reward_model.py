#!/usr/bin/env python3
"""A small random reward model for the live reward-model test, with transformers' own scores.

    $VENV/bin/python scripts/make_reward_model.py OUT_DIR

Writes OUT_DIR: a Qwen2ForSequenceClassification with one label (the layout TRL's RewardTrainer
saves: the decoder plus a `score` head, no bias), saved by transformers, with the Qwen2.5 tokenizer
from data/tokenizers/qwen2.5 and its chat template, so a vLLM server started on it with
`--runner pooling` serves /pooling and /classify (scripts/vllm_server.sh, RUNNER=pooling). Head
size 32 (vLLM's CPU attention refuses 16); init std 0.15 so scores differ visibly between texts.

And OUT_DIR/expected.json: {"texts": [[TEXT, SCORE], ...], "chats": [[PROMPT, COMPLETION, SCORE],
...]} where SCORE is transformers' raw logit (float32, eager) for the text, or for the conversation
(user: PROMPT, assistant: COMPLETION) rendered by the chat template without a generation prompt,
as vLLM's pooling route renders `messages`. crates/rlvr-reward/tests/it/live_reward_model.rs compares
rlvr's reward-model verifier against these. Seeded: the same files every run.
"""

import json
import os
import shutil
import sys

import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = os.path.join(ROOT, "data", "tokenizers", "qwen2.5")

TEXTS = [
    "What is 2+2? 4",
    "What is 2+2? 5",
    "Natalia sold clips to 48 of her friends in April. The answer is 72.",
    "x",
]
CHATS = [
    ("What is 2+2?", "4"),
    ("What is 2+2?", "It is five."),
]


def main(out: str) -> None:
    torch.manual_seed(7)
    cfg = Qwen2Config(
        vocab_size=151665, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=128, max_position_embeddings=1024,
        num_labels=1, tie_word_embeddings=False, pad_token_id=151643, initializer_range=0.15,
        attn_implementation="eager",
    )
    model = Qwen2ForSequenceClassification(cfg).float().eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for f in ["tokenizer.json", "vocab.json", "merges.txt"]:
        shutil.copy(os.path.join(TOK, f), out)
    with open(os.path.join(TOK, "tokenizer_config.source.json")) as f:
        tcfg = json.load(f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=1)
    tok = AutoTokenizer.from_pretrained(out)

    def score(ids):
        with torch.no_grad():
            return float(model(torch.tensor([ids])).logits[0, 0])

    texts = [[t, score(tok(t)["input_ids"])] for t in TEXTS]
    chats = []
    for p, c in CHATS:
        msgs = [{"role": "user", "content": p}, {"role": "assistant", "content": c}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
        chats.append([p, c, score(tok(text, add_special_tokens=False)["input_ids"])])
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"texts": texts, "chats": chats}, f, indent=1)
    print(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_reward_model.py OUT_DIR")
    main(sys.argv[1])
