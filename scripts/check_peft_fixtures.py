#!/usr/bin/env python3
"""Check that PEFT loads the adapters rlvr writes for the LoRA parity fixtures (Phi-3's fused
modules, Gemma 2, Gemma 3 text, the Gemma 3 multimodal wrapper) and gives the fixtures' log-probs.

    RLVR_LORA_KEEP=/tmp/kept cargo test -p rlvr-model --test it -- lora_parity::
    /work/venv-a/bin/python scripts/check_peft_fixtures.py /tmp/kept [--tol 2e-5]

For each `/tmp/kept/NAME` (an `adapter_config.json` and `adapter_model.safetensors` written by
rlvr's `Model::save` of the PEFT fixture `crates/rlvr-model/tests/fixtures/lora/NAME` loaded in
rlvr), it loads the base fixture in transformers (float32, eager attention; the wrapper as
`Gemma3ForConditionalGeneration`), attaches rlvr's adapter with `PeftModel.from_pretrained`, and
checks (exit status 1 on a failure): every tensor of the file is loaded and PEFT made no adapter
the file lacks (rlvr's `target_modules` selects exactly what it wrote: for the wrapper, the
language model's modules and not the vision tower's), and the log-probs of the fixture's cases
equal expected.json's (PEFT on PEFT's own adapter) within --tol; so does `merge_and_unload()`.
Prints one JSON line per fixture.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "crates" / "rlvr-model" / "tests" / "fixtures"


def logprobs(model, case: dict) -> torch.Tensor:
    ids = torch.tensor(case["input_ids"])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.to(torch.float32)
    lp = torch.log_softmax(logits[:, :-1] / case["temperature"], dim=-1)
    return lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kept", type=Path)
    # peft's own merge_and_unload of the Phi-3 fixture is 1.5e-5 off its unmerged log-probs.
    ap.add_argument("--tol", type=float, default=2e-5)
    args = ap.parse_args()
    problems: list[str] = []
    dirs = sorted(d for d in args.kept.iterdir() if (d / "adapter_config.json").is_file())
    if not dirs:
        problems.append(f"no adapters under {args.kept}")
    for d in dirs:
        name = d.name
        exp = json.loads((FIX / "lora" / name / "expected.json").read_text())
        kw = dict(dtype=torch.float32, attn_implementation="eager")
        if name == "gemma3_wrapper_tiny":
            base = transformers.Gemma3ForConditionalGeneration.from_pretrained(FIX / name, **kw)
        else:
            base = AutoModelForCausalLM.from_pretrained(FIX / name, **kw)
        model = PeftModel.from_pretrained(base, d).eval()
        with safe_open(d / "adapter_model.safetensors", "pt") as f:
            stored = set(f.keys())
        made = {n.replace(".default", "") for n, _ in model.named_parameters() if "lora_" in n}
        if stored != made:
            problems.append(f"{name}: PEFT's adapters differ from the file: {sorted(stored ^ made)[:4]}")
        worst = 0.0
        for case in exp["cases"]:
            got = logprobs(model, case)
            worst = max(worst, (got.double() - torch.tensor(case["logprobs"]).double()).abs().max().item())
        merged = model.merge_and_unload()
        worst_merged = max(
            (logprobs(merged, c).double() - torch.tensor(c["logprobs"]).double()).abs().max().item()
            for c in exp["cases"]
        )
        cfg = json.loads((d / "adapter_config.json").read_text())
        print(json.dumps({"fixture": name, "target_modules": cfg["target_modules"], "tensors": len(stored),
                          "peft_on_rlvr_adapter_vs_expected": worst, "merge_and_unload_vs_expected": worst_merged}))
        for k, v in (("peft", worst), ("merge_and_unload", worst_merged)):
            if not v <= args.tol:
                problems.append(f"{name}: {k} differs by {v:.3e} > {args.tol:g}")
    if problems:
        print("FAIL", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
