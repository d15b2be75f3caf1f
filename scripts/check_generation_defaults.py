#!/usr/bin/env python3
"""Check that a model directory written by rlvr (a checkpoint) keeps its base model's `generate()`
defaults and config fields, as transformers reads them (issue 48, item 6).

    VENV/bin/python scripts/check_generation_defaults.py BASE_DIR CHECKPOINT_DIR

Loads both directories with AutoModelForCausalLM (on the CPU) and compares
- `model.generation_config.to_dict()`: what a plain `model.generate()` uses (do_sample, temperature,
  top_p, max_length, eos/pad/bos ids, ...). transformers fills this from generation_config.json
  when the directory has one, else from config.json (GenerationConfig.from_model_config), so both
  paths are covered;
- `model.config.to_dict()` except the fields that name the directory or the weights' dtype
  (`_name_or_path`, `torch_dtype`, `dtype`): pad_token_id, unk_token_id and every other field of
  the base must survive.
Prints every difference and exits 1 when there is one; prints `generation defaults equal` and the
compared generation config otherwise.
"""

from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM

IGNORED_CONFIG = {"_name_or_path", "torch_dtype", "dtype"}


def load(path: str):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    base, ckpt = load(sys.argv[1]), load(sys.argv[2])
    problems = []
    gb, gc = base.generation_config.to_dict(), ckpt.generation_config.to_dict()
    for k in sorted(set(gb) | set(gc)):
        if gb.get(k) != gc.get(k):
            problems.append(f"generation_config.{k}: base {gb.get(k)!r}, checkpoint {gc.get(k)!r}")
    cb, cc = base.config.to_dict(), ckpt.config.to_dict()
    for k in sorted((set(cb) | set(cc)) - IGNORED_CONFIG):
        if cb.get(k) != cc.get(k):
            problems.append(f"config.{k}: base {cb.get(k)!r}, checkpoint {cc.get(k)!r}")
    for p in problems:
        print(p)
    if problems:
        return 1
    print("generation defaults equal: " + json.dumps(gb, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
