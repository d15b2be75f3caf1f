"""PyTorch/transformers side of bench/gpu.sh: the same measurements as `rlvr bench`.

- sample: HF `generate` on `--batch` random prompts of `--prompt-len` ids, do_sample, T = 1, top-p 1,
  top-k off, min_new_tokens = max_new_tokens = `--new-tokens` (EOS never ends a completion), KV cache
  (transformers' default dynamic cache). tok/s = batch x new tokens / wall time of the call; also the
  mean time per generated position.
- train: `--rows` x `--seq-len` random tokens, log-softmax of the logits gathered at the next token,
  loss = -mean, backward, torch.optim.AdamW (lr 1e-5, fused where available). TFLOP/s = 6 x
  parameters (tied embedding once) x tok/s.

Same checkpoint as the rlvr side (written by `rlvr init`), same dtype. One JSON line per measurement.
Usage: python bench/gpu_torch.py --model DIR [--device cuda] [--dtype bf16] sample|train [options]
"""

import argparse
import json
import statistics
import time

import torch


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (CPU); 0 = default")
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--batch", type=int, action="append")
    s.add_argument("--prompt-len", type=int, default=128)
    s.add_argument("--new-tokens", type=int, default=256)
    s.add_argument("--runs", type=int, default=2)
    t = sub.add_parser("train")
    t.add_argument("--rows", type=int, default=16)
    t.add_argument("--seq-len", type=int, default=512)
    t.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()

    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers
    from transformers import AutoModelForCausalLM

    dev = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype).to(dev)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(a.seed)
    base = {"impl": "pytorch", "device": a.device, "dtype": a.dtype, "torch": torch.__version__,
            "transformers": transformers.__version__}

    if a.what == "sample":
        model.eval()
        for batch in a.batch or [64]:
            ids = torch.randint(0, vocab, (batch, a.prompt_len), generator=g).to(dev)
            mask = torch.ones_like(ids)
            kw = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                      max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, pad_token_id=0)
            with torch.no_grad():
                model.generate(ids, **kw)  # warm-up
                walls = []
                for _ in range(a.runs):
                    sync(dev)
                    t0 = time.perf_counter()
                    out = model.generate(ids, **kw)
                    sync(dev)
                    walls.append(time.perf_counter() - t0)
                    assert out.shape[1] == a.prompt_len + a.new_tokens, out.shape
            wall = statistics.median(walls)
            print(json.dumps({**base, "what": "sample", "batch": batch, "prompt_len": a.prompt_len,
                              "new_tokens": a.new_tokens, "wall_s": wall,
                              "tok_per_s": batch * a.new_tokens / wall,
                              "step_ms": {"total": wall / a.new_tokens * 1e3}}), flush=True)
    else:
        model.train()
        params = sum(p.numel() for p in model.parameters())  # tied weights are one Parameter
        try:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=dev.type == "cuda")
        except (RuntimeError, TypeError):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        ids = torch.randint(0, vocab, (a.rows, a.seq_len), generator=g).to(dev)
        steps, fwds, bwds, opts = [], [], [], []
        for i in range(a.steps + 2):
            sync(dev)
            t0 = time.perf_counter()
            logits = model(ids).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            loss = -lp.mean()
            sync(dev)
            t1 = time.perf_counter()
            loss.backward()
            sync(dev)
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(dev)
            if i >= 2:
                steps.append(time.perf_counter() - t0)
                fwds.append(t1 - t0)
                bwds.append(t2 - t1)
                opts.append(time.perf_counter() - t2)
        step = statistics.median(steps)
        tokens = a.rows * a.seq_len
        print(json.dumps({**base, "what": "train", "rows": a.rows, "seq_len": a.seq_len, "params": params,
                          "step_s": step, "forward_s": statistics.median(fwds), "backward_s": statistics.median(bwds),
                          "optimizer_s": statistics.median(opts), "tok_per_s": tokens / step,
                          "tflop_per_s": 6 * params * tokens / step / 1e12,
                          "max_allocated_mib": torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None}),
              flush=True)


if __name__ == "__main__":
    main()
