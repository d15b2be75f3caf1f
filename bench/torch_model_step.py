#!/usr/bin/env python3
"""PyTorch side of the policy-model train-step benchmark (BENCHMARKS.md).

    /tmp/venv/bin/python bench/torch_model_step.py [--steps 5] [--threads 2] [--model DIR]

Work per step (the same as rlvr's side): a Qwen2-shaped decoder (vocab 32000, hidden 256, intermediate 704,
4 layers, 8 heads / 2 KV heads, tied embeddings, f32; random init std 0.02 unless --model), input 8 x 128
random tokens without padding; forward; log_softmax over the full vocabulary at all 127 next-token positions
and gather of the next token; loss = -mean(log-probs); backward; AdamW step (lr 1e-5). Two warm-up steps, then
--steps timed steps. Prints one JSON line:
    {"impl": "pytorch", "step_s_median", "step_s_all", "peak_rss_mb", "torch", "tokens": 1024, ...}
peak_rss_mb is the process's peak resident set (resource.getrusage ru_maxrss), including the Python
interpreter and the torch library (about 300-400 MB before any tensor is made; `base_rss_mb` reports it).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time


def rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="load this HF model directory instead of a random init")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument(
        "--attn", default="sdpa", choices=["sdpa", "eager"], help="transformers attention (default: its default, sdpa)"
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import transformers
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    base_rss = rss_mb()
    torch.manual_seed(args.seed)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation=args.attn)
    else:
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
        model = Qwen2ForCausalLM._from_config(cfg, attn_implementation=args.attn)
    model.to(device=args.device, dtype=torch.float32)
    model.train()  # attention_dropout is 0: train mode changes nothing but matches a trainer
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=g).to(args.device)
    mask = torch.ones_like(ids)
    pos = torch.arange(args.seq, device=args.device).unsqueeze(0).expand(args.batch, -1)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1, :], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -lp.mean()
        loss.backward()
        opt.step()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        step()
    times = [step() for _ in range(args.steps)]
    out = {
        "impl": "pytorch",
        "step_s_median": statistics.median(times),
        "step_s_all": times,
        "peak_rss_mb": rss_mb(),
        "base_rss_mb": base_rss,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokens": args.batch * args.seq,
        "logprob_positions": args.batch * (args.seq - 1),
        "threads": args.threads,
        "params": n_params,
        "model": args.model or "random qwen2 v32000 h256 i704 l4 h8/kv2 tied f32",
        "attn": model.config._attn_implementation,
        "device": args.device,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
