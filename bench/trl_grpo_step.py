"""TRL GRPOTrainer side of bench/rl_step.sh: RL steps on CPU, timed per step.

One RL step = sample B x K completions with transformers' `generate` (TRL's non-vLLM path), score
them, one forward + backward + AdamW update. Settings mirror the rlvr side: beta 0 (no reference
model), num_iterations 1, one optimizer step per generation (per_device_train_batch_size = B x K,
gradient_accumulation_steps 1), min_new_tokens = max_completion_length (EOS never ends a
completion), temperature 1, top-p 1, top-k off, f32, torch.set_num_threads(THREADS).

Timing: `step_s` from Trainer callbacks (on_step_begin .. on_step_end); `sample_s` is the time
inside `_generate_single_turn` (the `generate` call); `train_s = step_s - sample_s` (scoring,
advantages, the loss forward/backward and the optimizer step). Prints one JSON line per step and
writes the prompt token ids TRL used to --prompt-ids-out, so the caller can check that both sides
trained on identical ids.

Usage: python bench/trl_grpo_step.py --model DIR --prompts FILE.jsonl --steps N [--threads 2]
"""

import argparse
import json
import os
import sys
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="checkpoint directory written by `rlvr init`")
    ap.add_argument("--prompts", required=True, help="JSONL with a `question` field per line")
    ap.add_argument("--steps", type=int, default=4, help="RL steps in all, the first a warm-up")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-ids-out", default=None)
    ap.add_argument("--out-dir", default="/tmp/trl_grpo_bench")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(args.prompts, encoding="utf-8").read().split("\n") if line]
    prompts = [r["question"] for r in rows]
    b, k = len(prompts), args.group_size
    ds = datasets.Dataset.from_list([{"prompt": p} for p in prompts])

    def reward(completions, **_):
        # GSM8K-style: 1 when the completion has a "#### <number>" line (random weights: always 0).
        return [1.0 if "####" in c else 0.0 for c in completions]

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    cfg = GRPOConfig(
        output_dir=args.out_dir,
        use_cpu=True,
        per_device_train_batch_size=b * k,
        gradient_accumulation_steps=1,
        num_generations=k,
        max_completion_length=args.new_tokens,
        generation_kwargs={"min_new_tokens": args.new_tokens},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        learning_rate=1e-6,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )

    times = {"sample": 0.0, "t0": 0.0}
    seen_prompt_ids: list[list[int]] = []
    lengths = {"prompt": 0, "completion": 0}

    class Trainer(GRPOTrainer):
        def _tokenize_prompts(self, prompts):
            out = super()._tokenize_prompts(prompts)
            ids = out[0]
            seen_prompt_ids.extend([list(map(int, p)) for p in ids])
            lengths["prompt"] = sum(len(p) for p in ids) * 1  # B x K prompt rows (already repeated)
            return out

        def _generate_single_turn(self, prompt_ids, *a, **kw):
            t = time.perf_counter()
            out = super()._generate_single_turn(prompt_ids, *a, **kw)
            times["sample"] += time.perf_counter() - t
            lengths["completion"] = sum(len(c) for c in out[0])
            return out

    results = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *_a, **_k):
            times["sample"] = 0.0
            times["t0"] = time.perf_counter()

        def on_step_end(self, _args, state, *_a, **_k):
            step_s = time.perf_counter() - times["t0"]
            sample_s = times["sample"]
            r = {
                "impl": "trl",
                "step": state.global_step,
                "step_s": step_s,
                "sample_s": sample_s,
                "train_s": step_s - sample_s,
                "completion_tokens": lengths["completion"],
                "prompt_tokens": lengths["prompt"],
            }
            results.append(r)
            print(json.dumps(r), flush=True)

    trainer = Trainer(
        model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[Timer()]
    )
    trainer.train()
    if args.prompt_ids_out:
        uniq = sorted({tuple(p) for p in seen_prompt_ids})
        with open(args.prompt_ids_out, "w") as f:
            json.dump([list(p) for p in uniq], f)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    print(json.dumps({"impl": "trl", "versions": versions, "threads": torch.get_num_threads()}), flush=True)
    if len(results) < args.steps:
        sys.exit(f"TRL ran {len(results)} of {args.steps} steps")


if __name__ == "__main__":
    main()
