#!/usr/bin/env python3
"""Build LoRA adapters with PEFT on rlvr-model's tiny parity checkpoints, plus reference log-probs.

Run from the repository root (torch, transformers and peft installed):

    /work/venv-vllm/bin/python scripts/make_lora_fixtures.py

For each base fixture of scripts/make_model_fixtures.py (qwen2 with biases and a tied head, qwen3
with q/k norms, llama with grouped KV heads and llama3 rope scaling), it attaches a LoRA adapter
with `peft.get_peft_model` (its own rank, alpha and target modules, so the scale alpha/r and the
target selection are exercised), sets every lora_B to non-zero values (PEFT initialises B to 0,
which would make the test blind to B), and writes with PEFT's `save_pretrained`:

    crates/rlvr-model/tests/fixtures/lora/<name>/adapter_config.json
    crates/rlvr-model/tests/fixtures/lora/<name>/adapter_model.safetensors
    crates/rlvr-model/tests/fixtures/lora/<name>/expected.json

`base_model_name_or_path` is rewritten to the relative path of the base fixture (`../../<name>`),
which rlvr resolves against the adapter directory. expected.json holds the next-token log-probs of
the PeftModel in float32 (eager attention), at two temperatures, for fixed token rows. Seeded:
running it twice gives the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "crates" / "rlvr-model" / "tests" / "fixtures"
OUT = FIX / "lora"

# (base fixture, rank, alpha, target modules)
ADAPTERS = [
    ("qwen2_bias_tied", 2, 4, ["q_proj", "v_proj", "down_proj"]),
    ("qwen3", 2, 3, ["q_proj", "k_proj", "o_proj", "up_proj"]),
    ("llama_gqa_untied_rope3", 3, 5, ["v_proj", "gate_proj", "o_proj"]),
]
TEMPERATURES = [1.0, 0.7]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for k, (name, r, alpha, targets) in enumerate(ADAPTERS):
        torch.manual_seed(1000 + k)
        base = AutoModelForCausalLM.from_pretrained(
            FIX / name, dtype=torch.float32, attn_implementation="eager"
        )
        cfg = LoraConfig(
            r=r,
            lora_alpha=alpha,
            target_modules=targets,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, cfg)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 0.2)
        model.eval()
        out = OUT / name
        model.save_pretrained(out)
        (out / "README.md").unlink(missing_ok=True)
        acfg = json.loads((out / "adapter_config.json").read_text())
        acfg["base_model_name_or_path"] = f"../../{name}"
        (out / "adapter_config.json").write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n")
        vocab = base.config.vocab_size
        gen = torch.Generator().manual_seed(2000 + k)
        ids = torch.randint(1, vocab, (2, 12), generator=gen)
        cases = []
        with torch.no_grad():
            logits = model(input_ids=ids).logits.to(torch.float32)
            for t in TEMPERATURES:
                lp = torch.log_softmax(logits[:, :-1] / t, dim=-1)
                lp = lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
                cases.append(
                    {"temperature": t, "input_ids": ids.tolist(), "logprobs": lp.tolist()}
                )
            base_logits = model.get_base_model()
            with model.disable_adapter():
                plain = model(input_ids=ids).logits.to(torch.float32)
        delta = (logits - plain).abs().max().item()
        assert delta > 1e-2, f"{name}: the adapter barely changes the logits ({delta})"
        expected = {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "base": name,
            "r": r,
            "lora_alpha": alpha,
            "target_modules": targets,
            "dtype": "float32",
            "max_logit_change_from_adapter": delta,
            "cases": cases,
        }
        del base_logits
        (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"{name}: r={r} alpha={alpha} {targets}; {size} bytes; adapter moves logits by {delta:.3f}")


if __name__ == "__main__":
    main()
