#!/usr/bin/env python3
"""Fixtures that hold rlvr's TRL-named presets to TRL 1.16's own GRPOTrainer code (issue 47).

Runs TRL's GRPOTrainer (trl==1.16.0, pinned in bench/requirements.txt) in float64 on CPU on a tiny
random checkpoint (a 1-layer Qwen2 with the GPT-2 tokenizer of data/tokenizers/gpt2), and per case
records what TRL computes for one optimizer step:

- the advantages: TRL's `_generate_and_score_completions` itself (its reward scaling, its std + 1e-4,
  its zero-variance handling), with only the sampler replaced (`_generate` returns fixed completion
  ids) and a reward function that returns fixed rewards;
- the loss and its gradient: TRL's `_compute_loss` itself, per micro-batch as `training_step`
  slices the generation batch (`current_gradient_accumulation_steps` micro-batches, the losses
  summed as gradient accumulation does), with `_get_per_token_logps_and_entropies` returning a
  fixed leaf tensor of per-token log-probs and `old_per_token_logps` set to fixed behaviour
  log-probs (so ratios differ from 1). The gradient recorded is d(summed loss)/d(per-token
  log-prob): the checkpoint's parameter gradient is this vector pushed through the same model's
  backward, so equal log-prob gradients give equal parameter gradients.

Output: trl_grpo.json next to this file (committed; `cargo test -p rlvr-algo --test it -- trl::`
reads it, CI needs no Python). Run:

    python3 -m venv /tmp/trl && /tmp/trl/bin/pip install -r bench/requirements.txt
    /tmp/trl/bin/python crates/rlvr-algo/tests/reference/make_trl_fixtures.py
"""

import json
import math
import os
import sys
import tempfile
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
torch.set_default_dtype(torch.float64)
warnings.filterwarnings("ignore")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

assert trl.__version__ == "1.16.0", f"these fixtures are TRL 1.16.0's; found {trl.__version__}"

K = 4  # completions per prompt
T = 5  # max completion tokens

# Rewards of 3 prompts x K: a mixed group, a zero-variance group and a continuous group (dyadic
# values: TRL rounds rewards to float32, these are exact there).
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.25, 0.875, 0.0, 0.5]
# Completion lengths (tokens; the rest is padding), one per row.
LENGTHS = [5, 3, 1, 4, 2, 5, 5, 3, 4, 1, 5, 2]
N = len(REWARDS)


def tiny_model_and_tokenizer(tmp):
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ROOT, "data/tokenizers/gpt2/tokenizer.json"))
    tok.pad_token = "<|endoftext|>"
    tok.eos_token = "<|endoftext|>"
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.float64)
    return model, tok


def fixed_logps(seed):
    """Per-token log-probs and behaviour log-probs, [N, T], ratios spread over ~[0.3, 4]."""
    g = torch.Generator().manual_seed(seed)
    logp = -0.05 - 2.5 * torch.rand(N, T, generator=g)
    old = logp - (-1.2 + 2.6 * torch.rand(N, T, generator=g))
    return logp, old


def run_case(model, tok, case, tmp):
    args = dict(
        output_dir=os.path.join(tmp, case["name"]),
        num_generations=K,
        per_device_train_batch_size=N // case.get("micro_batches", 1),
        gradient_accumulation_steps=case.get("micro_batches", 1),
        max_completion_length=T,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        bf16=False,
        fp16=False,
        logging_steps=1,
        save_strategy="no",
    )
    args.update(case["trl"])
    cfg = GRPOConfig(**args)
    prompts = [f"question {i // K}" for i in range(N)]
    rewards = list(REWARDS)

    def reward_fn(prompts, completions, **kw):
        assert len(completions) == N
        return rewards

    ds = Dataset.from_list([{"prompt": f"question {i}"} for i in range(N // K)])
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=cfg, train_dataset=ds, processing_class=tok)
    trainer.model.train()

    # The sampler, replaced: fixed prompt and completion ids (no EOS: a full-length row is
    # truncated, as rlvr's RowInfo says).
    word = tok.encode(" a")[0]
    prompt_ids = [tok.encode(p) for p in prompts]
    completion_ids = [[word] * n for n in LENGTHS]
    completions = [tok.decode(c) for c in completion_ids]

    def fake_generate(_prompts):
        return prompt_ids, completion_ids, None, completions, None, {}, None, None

    trainer._generate = fake_generate
    inputs = [{"prompt": p} for p in prompts]
    out = trainer._generate_and_score_completions(inputs)
    advantages = out["advantages"].tolist()

    logp, old = fixed_logps(case.get("seed", 1))
    mask = out["completion_mask"].to(torch.float64)
    assert mask.shape == (N, T), mask.shape
    leaf = logp.clone().requires_grad_(True)
    out["old_per_token_logps"] = old.clone()
    mb = case.get("micro_batches", 1)
    trainer.current_gradient_accumulation_steps = mb
    rows = N // mb
    total = torch.zeros(())
    for m in range(mb):
        sl = slice(m * rows, (m + 1) * rows)
        part = {k: (v[sl] if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == N else v) for k, v in out.items()}
        lp = leaf[sl]

        def fake_logps(*a, _lp=lp, **k):
            return _lp, torch.zeros_like(_lp), None

        trainer._get_per_token_logps_and_entropies = fake_logps
        total = total + trainer._compute_loss(trainer.model, part)
    total.backward()
    return {
        "name": case["name"],
        "preset": case["preset"],
        "set": case.get("set", {}),
        "trl": case["trl"],
        "micro_batches": mb,
        "rewards": rewards,
        "groups": [i // K for i in range(N)],
        "advantages": advantages,
        "mask": mask.tolist(),
        "logp": logp.tolist(),
        "logp_old": old.tolist(),
        "max_new_tokens": T,
        "loss": float(total),
        "grad_logp": leaf.grad.tolist(),
    }


# Each case: TRL's GRPOConfig arguments, and the rlvr preset (plus `set`, rlvr keys) that must equal it.
CASES = [
    {"name": "defaults_dapo", "trl": {}, "preset": "grpo_trl"},
    {"name": "defaults_dapo_two_micro_batches", "trl": {}, "preset": "grpo_trl", "micro_batches": 2},
    {"name": "bnpo_one_micro_batch", "trl": {"loss_type": "bnpo"}, "preset": "bnpo"},
    {
        "name": "grpo_loss_type",
        "trl": {"loss_type": "grpo"},
        "preset": "grpo",
        "set": {"std_eps": 1e-4, "exclude_zero_std": False},
    },
    {
        "name": "grpo_preset_as_is",
        "trl": {"loss_type": "grpo"},
        "preset": "grpo",
        "differs": True,
    },
    {
        "name": "scale_rewards_batch",
        "trl": {"scale_rewards": "batch"},
        "preset": "grpo_trl",
        "set": {"std_level": "batch"},
    },
    {
        "name": "scale_rewards_none",
        "trl": {"scale_rewards": "none"},
        "preset": "grpo_trl",
        "set": {"std_norm": "none"},
    },
    {
        "name": "clip_higher",
        "trl": {"epsilon_high": 0.28},
        "preset": "grpo_trl",
        "set": {"clip_high": 0.28},
    },
    {
        "name": "dr_grpo",
        "trl": {"loss_type": "dr_grpo", "scale_rewards": "none"},
        "preset": "dr_grpo",
        "set": {"exclude_zero_std": False},
    },
    {
        "name": "cispo_epsilon_high_5",
        "trl": {"loss_type": "cispo", "epsilon_high": 5.0},
        "preset": "cispo",
        "set": {"clip_high": 4.0, "std_eps": 1e-4, "exclude_zero_std": False},
    },
    {
        "name": "cispo_epsilon_high_1_28",
        "trl": {"loss_type": "cispo", "epsilon_high": 1.28},
        "preset": "cispo",
        "set": {"std_eps": 1e-4, "exclude_zero_std": False},
    },
    {
        "name": "gspo_sequence",
        "trl": {
            "loss_type": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
        "preset": "gspo",
        "set": {"std_eps": 1e-4, "exclude_zero_std": False},
        "seed": 2,
    },
]


def main():
    print(f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}", file=sys.stderr)
    out = {
        "source": f"TRL {trl.__version__} GRPOTrainer (_generate_and_score_completions, _compute_loss), "
        f"transformers {transformers.__version__}, torch {torch.__version__}, float64, CPU; "
        "written by crates/rlvr-algo/tests/reference/make_trl_fixtures.py",
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = tiny_model_and_tokenizer(tmp)
        for case in CASES:
            rec = run_case(model, tok, case, tmp)
            rec["differs"] = case.get("differs", False)
            out["cases"].append(rec)
            print(case["name"], rec["loss"], file=sys.stderr)
    with open(os.path.join(HERE, "trl_grpo.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
