#!/usr/bin/env python3
"""PyTorch side of the rollout benchmark (crates/rlvr-rollout/BENCH.md); run both sides with
bench/rollout.sh.

    /tmp/venv/bin/python bench/rollout_torch.py [--threads 2] [--runs 3] [--top-p 0.9]

A KV-cache decode loop written directly over transformers' Qwen2ForCausalLM (vocab 32000, hidden 256,
intermediate 704, 4 layers, 8 heads / 2 KV heads, tied, f32, random init std 0.02), eager PyTorch in
inference mode: prefill P prompts of 32 random tokens once, repeat each prompt's cache and last logits to its
K rows (DynamicCache.batch_repeat_interleave, the same group sharing rlvr does), then 128 steps of: sample with
temperature / top-k / top-p (transformers' warper order; top-p by a full sort, as its TopPLogitsWarper does),
record log_softmax(logits / T) at the sampled token, feed the token. EOS disabled. Scenarios: 8 prompts x 1
and 2 prompts x 4. One warm-up run per scenario, then --runs timed runs; prints one JSON line per scenario:
    {"impl": "pytorch", "prompts", "group_size", "new_tokens", "tok_per_s" (median), "tok_per_s_best", "s_all", ...}
tok/s counts generated tokens (prompts x K x 128) over the wall time of the whole call (prefill included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' past_key_values rename
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    cfg = Qwen2Config(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        initializer_range=0.02,
    )
    model = Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa").to(torch.float32).eval()

    def choose(logits: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = logits / args.temperature
        logp_full = torch.log_softmax(scaled, dim=-1)
        x = scaled
        if args.top_k > 0:
            kth = torch.topk(x, args.top_k, dim=-1).values[:, -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        if args.top_p < 1.0:
            s, idx = torch.sort(x, descending=False, dim=-1)
            cum = s.softmax(dim=-1).cumsum(dim=-1)
            remove = cum <= (1 - args.top_p)
            remove[:, -1] = False
            x = x.masked_fill(remove.scatter(1, idx, remove), float("-inf"))
        tok = torch.multinomial(x.softmax(dim=-1), 1, generator=gen).squeeze(1)
        return tok, logp_full.gather(1, tok[:, None]).squeeze(1)

    @torch.inference_mode()
    def run(prompts: torch.Tensor, k: int, gen: torch.Generator) -> int:
        cache = DynamicCache()
        out = model(input_ids=prompts, past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1, :]
        if k > 1:
            cache.batch_repeat_interleave(k)
            logits = logits.repeat_interleave(k, dim=0)
        pos = torch.full((logits.shape[0], 1), prompts.shape[1], dtype=torch.long)
        toks, lps = [], []
        for step in range(args.new_tokens):
            tok, lp = choose(logits, gen)
            toks.append(tok)
            lps.append(lp)
            if step + 1 == args.new_tokens:
                break
            out = model(input_ids=tok[:, None], position_ids=pos, past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :]
            pos = pos + 1
        return len(toks) * logits.shape[0]

    for n_prompts, k in [(8, 1), (2, 4)]:
        g = torch.Generator().manual_seed(args.seed + 1)
        prompts = torch.randint(0, cfg.vocab_size, (n_prompts, args.prompt_len), generator=g)
        gen = torch.Generator().manual_seed(args.seed + 2)
        run(prompts, k, gen)  # warm-up
        times, tokens = [], 0
        for _ in range(args.runs):
            t0 = time.perf_counter()
            tokens = run(prompts, k, gen)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(
            json.dumps(
                {
                    "impl": "pytorch",
                    "prompts": n_prompts,
                    "group_size": k,
                    "new_tokens": args.new_tokens,
                    "tok_per_s": tokens / med,
                    "tok_per_s_best": tokens / min(times),
                    "s_all": times,
                    "threads": args.threads,
                    "temperature": args.temperature,
                    "top_p": args.top_p,
                    "top_k": args.top_k,
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
