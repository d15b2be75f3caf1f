#!/usr/bin/env python3
"""Later-turn request time and exactness of vLLM's prefix caching for multi-turn episodes (issue 45).

    scripts/bench_prefix_cache.py make MODEL_DIR       a random Qwen2 checkpoint (hidden 512, 4 layers, vocab 256)
    scripts/bench_prefix_cache.py run URL_OFF URL_ON   episodes on both servers, interleaved turn by turn

Run with the vLLM venv's python (it needs torch, transformers and safetensors for `make`; `run` uses the
standard library only). `run` plays EPISODES episodes of TURNS turns the way rlvr's vLLM backend sends them
(crates/rlvr-vllm/src/client.rs, `sample_turns`): every turn is one /v1/completions request whose prompt is the
episode's whole context as token ids (prompt, then each turn's completion and a fixed bridge of BRIDGE ids),
n = 1, a fixed seed per (episode, turn), processed log-probs. Each request goes to URL_OFF (a server started
with PREFIX_CACHING=0) and then to URL_ON (PREFIX_CACHING=1) with a `cache_salt` naming the run and version,
as rollout.cache_salt = "version" sends it. It prints, per turn, the median request time on each server, then
whether the two servers sampled the same ids and the largest |log-prob difference|, and the prefix-cache hits
(vllm:prefix_cache_hits, tokens) the ON server reports on its /metrics. A second pass on the ON server with the
same seeds and a new salt (a new version) must sample the same ids again (no block of the first pass may
serve it); a third pass with the first salt shows the hits a repeated prompt gets; last, one group
request (n = 8 samples of one prompt, as rlvr's turn 1 sends it) shows whether its samples share the prompt.

Environment: EPISODES (4), TURNS (4), PROMPT (384 ids), NEW (16 tokens per turn), BRIDGE (96 ids), SALT
(rlvr-bench: give each run on one server its own, or it starts from the blocks of the last).
"""

import json
import os
import random
import statistics
import sys
import time
import urllib.request


def make(out):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    os.makedirs(out, exist_ok=True)
    vocab = 256
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=True, torch_dtype="float32", eos_token_id=vocab - 1,
    )
    torch.manual_seed(7)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.08)  # peaked enough next-token distributions for log-probs to vary
    model.save_pretrained(out, safe_serialization=True)
    # A word-level tokenizer with one token per id ("t0" ... "t255"), so any sampled id detokenizes.
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab - 1, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "unk_token": "t0",
                  "vocab": {**{f"t{i}": i for i in range(vocab - 1)}, "<|endoftext|>": vocab - 1}},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "model_max_length": 4096}, f)
    print(out)


def post(url, body):
    """(seconds, the first choice) of one completion request."""
    seconds, choices = post_all(url, body)
    return seconds, choices[0]


def post_all(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.load(r)
    return time.perf_counter() - t, answer["choices"]


def hits(url):
    """vllm:prefix_cache_hits and _queries (tokens, summed over engines) from /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out = {"hits": 0.0, "queries": 0.0}
    for line in text.splitlines():
        for key, name in (("hits", "vllm:prefix_cache_hits"), ("queries", "vllm:prefix_cache_queries")):
            if line.startswith(name + "_total") or line.startswith(name + "{"):
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def body(context, seed, salt):
    b = {"model": "rlvr-policy", "prompt": context, "n": 1, "max_tokens": NEW, "temperature": 1.0,
         "top_p": 1.0, "seed": seed, "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
         "stop_token_ids": [], "skip_special_tokens": False}
    if salt is not None:
        b["cache_salt"] = salt
    return b


def episodes(url, salt, times, other=None, other_times=None):
    """Plays the episodes on `url` (and, turn by turn, on `other` without a salt); returns
    {(episode, turn): (ids, logprobs)} for each server."""
    rng = random.Random(1)
    ctx = {e: [rng.randrange(255) for _ in range(PROMPT)] for e in range(EPISODES)}
    bridges = {(e, t): [rng.randrange(255) for _ in range(BRIDGE)]
               for e in range(EPISODES) for t in range(TURNS)}
    ctx_other = {e: list(c) for e, c in ctx.items()}
    got, got_other = {}, {}
    for t in range(1, TURNS + 1):
        for e in range(EPISODES):
            seed = 1000 * e + t
            if other is not None:
                dt, ch = post(other, body(ctx_other[e], seed, None))
                other_times.setdefault(t, []).append(dt)
                got_other[(e, t)] = (ch["token_ids"], ch["logprobs"]["token_logprobs"])
                ctx_other[e] += ch["token_ids"] + bridges[(e, t - 1)]
            dt, ch = post(url, body(ctx[e], seed, salt))
            times.setdefault(t, []).append(dt)
            got[(e, t)] = (ch["token_ids"], ch["logprobs"]["token_logprobs"])
            ctx[e] += ch["token_ids"] + bridges[(e, t - 1)]
    return got, got_other


def compare(a, b):
    same = all(a[k][0] == b[k][0] for k in a)
    worst = max(abs(x - y) for k in a for x, y in zip(a[k][1], b[k][1]))
    return same, worst


def run(url_off, url_on):
    t_on, t_off = {}, {}
    h0 = hits(url_on)
    on, off = episodes(url_on, SALT + "-v1", t_on, url_off, t_off)
    h1 = hits(url_on)
    print(f"episodes {EPISODES}, turns {TURNS}, prompt {PROMPT} ids, {NEW} new tokens per turn, "
          f"bridge {BRIDGE} ids")
    print("turn  context_ids  off_median_s  on_median_s")
    for t in sorted(t_on):
        n = PROMPT + (t - 1) * (NEW + BRIDGE)
        print(f"{t:4}  {n:11}  {statistics.median(t_off[t]):12.3f}  {statistics.median(t_on[t]):11.3f}")
    later_off = sum(sum(v) for t, v in t_off.items() if t > 1)
    later_on = sum(sum(v) for t, v in t_on.items() if t > 1)
    print(f"later turns (2..{TURNS}), total: off {later_off:.3f} s, on {later_on:.3f} s, "
          f"ratio {later_off / later_on:.2f}")
    same, worst = compare(on, off)
    print(f"on vs off: same ids {same}, max |log-prob difference| {worst:.3g}")
    print(f"ON server prefix cache, this pass: hits {h1['hits'] - h0['hits']:.0f} of "
          f"{h1['queries'] - h0['queries']:.0f} queried tokens")
    # Same seeds, a new salt: no block of the first pass may be used; ids must repeat.
    again, _ = episodes(url_on, SALT + "-v2", {})
    h2 = hits(url_on)
    same2, worst2 = compare(again, on)
    print(f"second pass, new salt: same ids {same2}, max |log-prob difference| {worst2:.3g}, "
          f"hits {h2['hits'] - h1['hits']:.0f} of {h2['queries'] - h1['queries']:.0f}")
    third, _ = episodes(url_on, SALT + "-v1", {})
    h3 = hits(url_on)
    same3, worst3 = compare(third, on)
    print(f"third pass, first salt again: same ids {same3}, max |log-prob difference| {worst3:.3g}, "
          f"hits {h3['hits'] - h2['hits']:.0f} of {h3['queries'] - h2['queries']:.0f}")
    # A group: one request with n = 8 samples of one new prompt (rlvr's turn 1), under a new salt.
    prompt = [random.Random(2).randrange(255) for _ in range(PROMPT)]
    group = dict(body(prompt, 5, SALT + "-group"), n=8)
    dt, _ = post_all(url_on, group)
    h4 = hits(url_on)
    print(f"a group of 8 samples of one {PROMPT}-id prompt: {dt:.3f} s, "
          f"hits {h4['hits'] - h3['hits']:.0f} of {h4['queries'] - h3['queries']:.0f}")


EPISODES = int(os.environ.get("EPISODES", 4))
TURNS = int(os.environ.get("TURNS", 4))
PROMPT = int(os.environ.get("PROMPT", 384))
NEW = int(os.environ.get("NEW", 16))
BRIDGE = int(os.environ.get("BRIDGE", 96))
SALT = os.environ.get("SALT", "rlvr-bench")

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
