#!/usr/bin/env python3
"""Build LoRA adapters with PEFT on rlvr-model's tiny parity checkpoints, plus reference log-probs.

Run from the repository root (torch, transformers and peft installed):

    /work/venv-vllm/bin/python scripts/make_lora_fixtures.py [NAME ...]

(only the named base fixtures when names are given).

For each base fixture of scripts/make_model_fixtures.py (qwen2 with biases and a tied head, qwen3
with q/k norms, llama with grouped KV heads and llama3 rope scaling, Phi-3 with its fused
`qkv_proj` and `gate_up_proj`, Gemma 2 and Gemma 3 text), it attaches a LoRA adapter
with `peft.get_peft_model` (its own rank, alpha and target modules, so the scale alpha/r and the
target selection are exercised), sets every lora_B to non-zero values (PEFT initialises B to 0,
which would make the test blind to B), and writes with PEFT's `save_pretrained`:

    crates/rlvr-model/tests/fixtures/lora/<name>/adapter_config.json
    crates/rlvr-model/tests/fixtures/lora/<name>/adapter_model.safetensors
    crates/rlvr-model/tests/fixtures/lora/<name>/expected.json

`base_model_name_or_path` is rewritten to the relative path of the base fixture (`../../<name>`),
which rlvr resolves against the adapter directory. expected.json holds the next-token log-probs of
the PeftModel in float32 (eager attention), at two temperatures, for fixed token rows; for the
fixtures marked `grads`, also `grads`: the float32 gradient of the summed temperature-1 log-probs
of the first case with respect to every lora_A and lora_B (under the file's names), and that
loss. Seeded: running it twice gives the same files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "crates" / "rlvr-model" / "tests" / "fixtures"
OUT = FIX / "lora"

# (base fixture, rank, alpha, target modules, token row length, gradients)
ADAPTERS = [
    ("qwen2_bias_tied", 2, 4, ["q_proj", "v_proj", "down_proj"], 12, False),
    ("qwen3", 2, 3, ["q_proj", "k_proj", "o_proj", "up_proj"], 12, False),
    ("llama_gqa_untied_rope3", 3, 5, ["v_proj", "gate_proj", "o_proj"], 12, False),
    # Phi-3's fused modules, as a PEFT user targets them; rows of 20 tokens pass LongRoPE's
    # switch at 16 positions (the long factors).
    ("phi3_longrope_partial", 2, 5, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], 20, True),
    ("gemma2_softcap", 2, 3, ["q_proj", "v_proj", "gate_proj", "down_proj"], 12, True),
    ("gemma3_local_global", 3, 4, ["k_proj", "o_proj", "up_proj"], 12, True),
    # The multimodal Gemma 3 wrapper (Gemma3ForConditionalGeneration, built here as
    # tests/fixtures/gemma3_wrapper_tiny: gemma3_local_global's text config with a one-layer
    # SigLIP tower): PEFT names its language model's modules
    # `base_model.model.model.language_model.layers.N…`, and a target list also matches the
    # vision tower's q_proj/v_proj (their adapters are in the file too).
    ("gemma3_wrapper_tiny", 2, 8, ["q_proj", "v_proj", "down_proj"], 12, True),
]
WRAPPER = "gemma3_wrapper_tiny"
TEMPERATURES = [1.0, 0.7]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[1:])
    for k, (name, r, alpha, targets, length, want_grads) in enumerate(ADAPTERS):
        if only and name not in only:
            continue
        torch.manual_seed(1000 + k)
        if name == WRAPPER:
            make_gemma3_wrapper()
            base = transformers.Gemma3ForConditionalGeneration.from_pretrained(
                FIX / name, dtype=torch.float32, attn_implementation="eager"
            )
        else:
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
                    # The wrapper's random weights are small (std 0.02): a larger B moves it.
                    p.normal_(0.0, 1.0 if name == WRAPPER else 0.2)
        model.eval()
        out = OUT / name
        model.save_pretrained(out)
        (out / "README.md").unlink(missing_ok=True)
        acfg = json.loads((out / "adapter_config.json").read_text())
        acfg["base_model_name_or_path"] = f"../../{name}"
        (out / "adapter_config.json").write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n")
        vocab = base.config.get_text_config().vocab_size
        gen = torch.Generator().manual_seed(2000 + k)
        ids = torch.randint(1, vocab, (2, length), generator=gen)
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
        if want_grads:
            expected["grads"] = lora_grads(model, ids)
        (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"{name}: r={r} alpha={alpha} {targets}; {size} bytes; adapter moves logits by {delta:.3f}")


def make_gemma3_wrapper() -> None:
    """Writes tests/fixtures/gemma3_wrapper_tiny: a random Gemma3ForConditionalGeneration whose
    text config is gemma3_local_global's, with a one-layer SigLIP vision tower (seeded)."""
    torch.manual_seed(77)
    text = json.loads((FIX / "gemma3_local_global" / "config.json").read_text())
    for k in ("architectures", "model_type", "transformers_version", "dtype"):
        text.pop(k, None)
    # Tied, as Gemma3Config's top level is (rlvr reads the text config's tying).
    text["tie_word_embeddings"] = True
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=28, patch_size=14,
    )
    cfg = transformers.Gemma3Config(
        text_config=transformers.Gemma3TextConfig(**text), vision_config=vision.to_dict(),
        mm_tokens_per_image=4, image_token_index=5, boi_token_index=6, eoi_token_index=7,
    )
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0.0, 0.1)
    model.save_pretrained(FIX / WRAPPER)


def lora_grads(model, ids: torch.Tensor) -> dict:
    """The float32 gradient of L = Σ temperature-1 log-probs of `ids`' next tokens with respect to
    every LoRA factor, by the names `save_pretrained` writes (`.default` dropped)."""
    model.zero_grad()
    logits = model(input_ids=ids).logits.to(torch.float32)
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1))
    loss = lp.sum()
    loss.backward()
    weights, shapes = {}, {}
    for n, p in model.named_parameters():
        # The wrapper's vision-tower adapters get no gradient from text (None): left out.
        if "lora_" not in n or p.grad is None:
            continue
        key = n.replace(".default", "")
        weights[key] = p.grad.detach().flatten().tolist()
        shapes[key] = list(p.shape)
    model.zero_grad()
    return {"loss": loss.item(), "weights": weights, "shapes": shapes}


if __name__ == "__main__":
    main()
