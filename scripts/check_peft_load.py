#!/usr/bin/env python3
"""Check that PEFT loads a LoRA checkpoint written by rlvr and that it, and `rlvr merge`'s output loaded
with transformers, agree with `rlvr logprobs` on the same checkpoint.

    rlvr logprobs --model CKPT --prompt P --completion C > rlvr.json
    rlvr merge --checkpoint CKPT --out MERGED
    /work/venv-vllm/bin/python scripts/check_peft_load.py CKPT --merged MERGED --prompt P --completion C \\
        --expect rlvr.json [--tol 1e-4]

CKPT is an rlvr checkpoint with `adapter/adapter_config.json` and `adapter/adapter_model.safetensors` (the base
is the adapter's `base_model_name_or_path`) and tokenizer files. What it checks (exit status 1 on a failure):
- `peft.PeftModel.from_pretrained(base, CKPT/adapter)` loads every adapter tensor (none missing or unexpected)
  and its lora_B are not all zero (a trained adapter);
- its log-probs of the completion equal `rlvr logprobs`' within --tol (float32, eager attention);
- `AutoModelForCausalLM.from_pretrained(MERGED)` gives the same within --tol; so does peft's own
  `merge_and_unload()`.
Encoding as `rlvr logprobs` (plain prompt with the tokenizer's post-processor, completion without special
tokens). Prints one JSON line with the largest differences.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import peft
import torch
import transformers
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer


def completion_logprobs(model, tokens: list[int], n: int, temperature: float) -> list[float]:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0]
    lp = torch.log_softmax(logits[:-1].double() / temperature, dim=-1)
    lp = lp.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    return lp[len(lp) - n :]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--merged", type=Path, required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--completion", required=True)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--expect", type=Path, required=True, help="`rlvr logprobs` output on CKPT")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    problems: list[str] = []

    adapter = args.ckpt / "adapter"
    acfg = json.loads((adapter / "adapter_config.json").read_text())
    base_dir = Path(acfg["base_model_name_or_path"])
    if not base_dir.is_absolute():
        base_dir = args.ckpt / base_dir
    tok = AutoTokenizer.from_pretrained(args.ckpt)
    p_ids = tok(args.prompt, add_special_tokens=True)["input_ids"]
    c_ids = tok(args.completion, add_special_tokens=False)["input_ids"]
    tokens = p_ids + c_ids
    expected = json.loads(args.expect.read_text())
    if list(expected["tokens"]) not in (tokens, c_ids):
        problems.append(f"tokens differ: rlvr {expected['tokens']} vs {c_ids}")
    rlvr_lp = [float(x) for x in expected["logprobs"]][-len(c_ids) :]

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, adapter)
    model.eval()
    with safe_open(adapter / "adapter_model.safetensors", "pt") as f:
        stored = set(f.keys())
        b_abs = max(f.get_tensor(k).abs().max().item() for k in stored if "lora_B" in k)
    loaded = {n.replace(".default", "") for n, _ in model.named_parameters() if "lora_" in n}
    if stored != loaded:
        problems.append(f"PEFT's adapter tensors differ from the file: {sorted(stored ^ loaded)[:6]}")
    if b_abs == 0.0:
        problems.append("every lora_B is zero: the adapter is untrained")
    peft_lp = completion_logprobs(model, tokens, len(c_ids), args.temperature)
    peft_merged = model.merge_and_unload()
    peft_merged_lp = completion_logprobs(peft_merged, tokens, len(c_ids), args.temperature)
    merged = AutoModelForCausalLM.from_pretrained(args.merged, dtype=torch.float32, attn_implementation="eager")
    merged_lp = completion_logprobs(merged, tokens, len(c_ids), args.temperature)

    def diff(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b))

    report = {
        "ckpt": str(args.ckpt),
        "base": str(base_dir),
        "r": acfg["r"],
        "lora_alpha": acfg["lora_alpha"],
        "target_modules": acfg["target_modules"],
        "max_abs_lora_B": b_abs,
        "completion_tokens": len(c_ids),
        "peft_vs_rlvr": diff(peft_lp, rlvr_lp),
        "rlvr_merge_in_transformers_vs_rlvr": diff(merged_lp, rlvr_lp),
        "peft_merge_and_unload_vs_rlvr": diff(peft_merged_lp, rlvr_lp),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    for k in ("peft_vs_rlvr", "rlvr_merge_in_transformers_vs_rlvr", "peft_merge_and_unload_vs_rlvr"):
        if not report[k] <= args.tol:
            problems.append(f"{k} = {report[k]:.3e} > tol {args.tol:g}")
    print(json.dumps(report))
    if problems:
        print("FAIL", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
