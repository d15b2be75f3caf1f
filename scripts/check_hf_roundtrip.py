#!/usr/bin/env python3
"""Check that transformers reads back a model directory rlvr saved (config.json + safetensors, no
tokenizer needed) as the same model: no missing, unexpected or mismatched tensor, and the same
per-token log-probs as rlvr within --tol.

    python scripts/check_hf_roundtrip.py DIR EXPECT.json [--tol 1e-4]

EXPECT.json is `{"tokens": [...], "logprobs": [...]}`: one unpadded row and rlvr's log-probs of
tokens[1:] (temperature 1). Run by the ignored test `gemma::transformers_reads_saved_gemma_checkpoints`
(crates/rlvr-model/tests/it/gemma.rs) with `RLVR_HF_PYTHON` naming a Python with torch and
transformers. Prints the architecture, the largest difference and "round trip ok".
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("expect")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    model, info = AutoModelForCausalLM.from_pretrained(
        a.dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    problems = [f"{k}: {v}" for k, v in info.items() if v and k != "error_msgs"] + list(info.get("error_msgs") or [])
    exp = json.load(open(a.expect))
    ids = torch.tensor([exp["tokens"]])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.double()
    lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    want = torch.tensor(exp["logprobs"], dtype=torch.float64)
    diff = float((lp - want).abs().max())
    print(f"{type(model).__name__}: max |transformers - rlvr| = {diff:.3e}")
    if diff > a.tol:
        problems.append(f"log-probs differ by {diff} > {a.tol}")
    for p in problems:
        print("PROBLEM:", p)
    if problems:
        return 1
    print("round trip ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
