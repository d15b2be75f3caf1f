#!/usr/bin/env python3
"""Check that transformers loads a model directory written by rlvr (`rlvr init`, a checkpoint) and
compare per-token log-probs with `rlvr logprobs`.

    /tmp/venv/bin/python scripts/check_hf_load.py DIR
    /tmp/venv/bin/python scripts/check_hf_load.py DIR --prompt "2+2=" --completion " 4" --expect rlvr_out.json
    rlvr logprobs --model DIR --prompt P --completion C [--chat] [--temperature T] > out.json
    /tmp/venv/bin/python scripts/check_hf_load.py DIR --prompt P --completion C [--chat] [--temperature T] \\
        --expect out.json

What it checks (exit status 1 on any failure, after printing every problem):
- config.json, tokenizer.json, tokenizer_config.json, generation_config.json are present; config.json style
  (transformers-4: rope_theta/rope_scaling/torch_dtype at the top level) is reported;
- AutoConfig, AutoModelForCausalLM, AutoTokenizer and GenerationConfig load it, with no missing, unexpected
  or shape-mismatched tensor (a tied lm_head.weight absent from the file is fine);
- AutoTokenizer's ids equal those of the raw tokenizers.Tokenizer on the same text;
- the forward gives finite log-probs; prints them;
- with --expect FILE.json (`{"tokens": [...], "logprobs": [...]}` from `rlvr logprobs`): its tokens equal the
  ones encoded here (when --prompt/--completion are given), and its log-probs equal transformers' within --tol
  (default 1e-4). `logprobs` may cover every next-token position (len(tokens) - 1 values) or only the
  completion; either way it is aligned to the end of the sequence. With --expect and no --prompt, the
  expected tokens are scored as they are.

Encoding follows `rlvr logprobs` (DESIGN.md section 10): a plain prompt is encoded with the tokenizer's
post-processor (BOS for Llama); a --chat prompt is rendered by the chat template as one user message with
add_generation_prompt=True and encoded without special tokens; the completion is encoded alone without
special tokens and appended. Log-probs are log_softmax(logits / temperature) at the next token.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

REQUIRED = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--prompt", default=None, help='default "The answer is" when neither --prompt nor --expect')
    ap.add_argument("--completion", default=None, help='default " 42." when --prompt is defaulted')
    ap.add_argument("--chat", action="store_true", help="render the prompt with the chat template")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtype", choices=["f32", "f64"], default="f32", help="compute dtype (default f32)")
    ap.add_argument("--expect", type=Path, default=None, help="rlvr logprobs output to compare against")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()

    problems: list[str] = []
    d: Path = args.dir
    for f in REQUIRED:
        if not (d / f).is_file():
            problems.append(f"missing {d / f}")
    has_weights = (d / "model.safetensors").is_file() or (d / "model.safetensors.index.json").is_file()
    if not has_weights:
        problems.append(f"missing {d}/model.safetensors (or model.safetensors.index.json)")
    if problems:
        return fail(problems)

    raw_cfg = json.loads((d / "config.json").read_text())
    style = "v5" if ("rope_parameters" in raw_cfg or "dtype" in raw_cfg) else "v4"
    if style != "v4":
        problems.append("config.json is transformers-5 style (rope_parameters/dtype); rlvr init should write v4")
    if "rope_theta" not in raw_cfg and "rope_parameters" not in raw_cfg:
        print("note: config.json has no rope_theta (transformers uses its default)", file=sys.stderr)
    tok_cfg = json.loads((d / "tokenizer_config.json").read_text())
    if not tok_cfg.get("chat_template") and not (d / "chat_template.jinja").is_file():
        print("note: no chat_template in tokenizer_config.json", file=sys.stderr)

    cfg = AutoConfig.from_pretrained(d)
    dtype = torch.float64 if args.dtype == "f64" else torch.float32
    model, info = AutoModelForCausalLM.from_pretrained(
        d, dtype=dtype, attn_implementation="eager", output_loading_info=True
    )
    model.eval()
    missing = [k for k in info.get("missing_keys", []) if not (k == "lm_head.weight" and cfg.tie_word_embeddings)]
    for key in ("unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(key):
            problems.append(f"{key}: {info[key]}")
    if missing:
        problems.append(f"missing_keys: {missing}")
    gen = GenerationConfig.from_pretrained(d)
    tok = AutoTokenizer.from_pretrained(d)

    from tokenizers import Tokenizer

    raw_tok = Tokenizer.from_file(str(d / "tokenizer.json"))

    # Tokens to score.
    prompt, completion = args.prompt, args.completion
    if prompt is None and args.expect is None:
        prompt, completion = "The answer is", " 42." if completion is None else completion
    expected = json.loads(args.expect.read_text()) if args.expect else None
    if prompt is not None:
        if args.chat:
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            p_ids = tok(text, add_special_tokens=False)["input_ids"]
            raw_p = raw_tok.encode(text, add_special_tokens=False).ids
        else:
            p_ids = tok(prompt, add_special_tokens=True)["input_ids"]
            raw_p = raw_tok.encode(prompt, add_special_tokens=True).ids
        c_ids = tok(completion or "", add_special_tokens=False)["input_ids"]
        raw_c = raw_tok.encode(completion or "", add_special_tokens=False).ids
        if p_ids != raw_p or c_ids != raw_c:
            problems.append(
                f"AutoTokenizer ({type(tok).__name__}) and tokenizers.Tokenizer disagree: "
                f"{p_ids + c_ids} vs {raw_p + raw_c}"
            )
        tokens = p_ids + c_ids
        n_completion = len(c_ids)
        # `rlvr logprobs` prints the completion's ids (one log-prob each); accept the whole
        # sequence too.
        if expected is not None and list(expected["tokens"]) not in (tokens, c_ids):
            problems.append(f"tokens differ: rlvr {expected['tokens']} vs transformers {c_ids}")
    else:
        tokens = list(expected["tokens"])
        n_completion = None
    if len(tokens) < 2:
        problems.append(f"need at least 2 tokens, got {tokens}")
        return fail(problems)
    if max(tokens) >= cfg.vocab_size:
        problems.append(f"token id {max(tokens)} >= vocab_size {cfg.vocab_size}")
        return fail(problems)

    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0]
    lp_all = torch.log_softmax(logits[:-1].double() / args.temperature, dim=-1)
    lps = lp_all.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    if not all(math.isfinite(x) for x in lps):
        problems.append("non-finite log-probs")
    shown = lps[-n_completion:] if n_completion else lps

    max_diff = None
    if expected is not None:
        exp_lp = [float(x) for x in expected["logprobs"]]
        if len(exp_lp) > len(lps):
            problems.append(f"expected has {len(exp_lp)} log-probs for {len(tokens)} tokens")
        elif exp_lp:
            ours = lps[len(lps) - len(exp_lp):]
            max_diff = max(abs(a - b) for a, b in zip(ours, exp_lp))
            if not max_diff <= args.tol:
                problems.append(f"log-probs differ: max abs {max_diff:.3e} > tol {args.tol:g}")
                for i, (a, b) in enumerate(zip(ours, exp_lp)):
                    if abs(a - b) > args.tol:
                        problems.append(f"  position {len(lps) - len(exp_lp) + i}: transformers {a:.6f} rlvr {b:.6f}")
        if n_completion is not None and len(exp_lp) not in (n_completion, len(lps)):
            problems.append(
                f"expected has {len(exp_lp)} log-probs; completion has {n_completion} tokens, sequence {len(lps)}"
            )

    report = {
        "dir": str(d),
        "model_type": cfg.model_type,
        "config_style": style,
        "tokenizer_class": type(tok).__name__,
        "eos_token_id": gen.eos_token_id,
        "tokens": tokens,
        "logprobs": shown,
        "logprobs_all": lps,
        "temperature": args.temperature,
        "dtype": args.dtype,
        "max_abs_diff": max_diff,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    if problems:
        print(json.dumps(report))
        return fail(problems)
    print("OK")
    print(json.dumps(report))
    return 0


def fail(problems: list[str]) -> int:
    print("FAIL", file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
