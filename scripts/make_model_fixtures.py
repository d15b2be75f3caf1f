#!/usr/bin/env python3
"""Build tiny HuggingFace checkpoints plus reference log-probs for rlvr-model's parity tests.

Run from the repository root:

    /tmp/venv/bin/python scripts/make_model_fixtures.py

It writes crates/rlvr-model/tests/fixtures/<name>/ (a model directory saved by transformers'
`save_pretrained`, a `config.v4.json` next to it (the config in the other style; see below) and
`expected.json`). Everything is seeded: running it twice gives the same files.

Reference values
----------------
The stored log-probs, entropies and logits are computed in float64 from the weights as saved
(bf16 weights are upcast exactly). transformers' own modules keep RMSNorm, the attention softmax and
the rotary tables in float32 even after `model.double()`, so for the reference those three pieces
are swapped for float64 versions of the same formulas (`_f64_patches`). The script asserts that
this float64 reference agrees with plain transformers (double and float32, eager attention) and
records the largest differences in expected.json (`hf_checks`).

Long-context fixtures
---------------------
`qwen2_yarn_window` (YaRN rope, a sliding window on some layers), `mistral_window` (a window on every
layer) and `llama_dynamic_rope` (dynamic NTK rope, with a case past max_position_embeddings) also
store `greedy`: the tokens of transformers' greedy `generate` with its KV cache after a prompt taken
from the long case (float64 reference, asserted equal to plain float32 transformers'), and the argmax
chain of full forwards without a cache (equal to the cached tokens except for dynamic rope, whose
cached keys keep the table of the step that wrote them). The float64 rotary patch applies YaRN's
attention factor and, for dynamic rope, the table of each forward's largest position.
`phi3_longrope_partial` (Phi-3: fused qkv_proj and gate_up_proj, partial rotary 0.75, LongRoPE
switching at 16 positions, a window of 24) stores the same: its float64 patch picks the short or
long factors by each forward's largest position and multiplies by LongRoPE's attention factor,
and its greedy tokens equal the full forwards' (Phi3ForCausalLM's generate drops its cache at the
switch).

Config styles
-------------
transformers >= 5 writes `rope_parameters` (with `rope_theta` inside) and `dtype`; transformers 4
wrote `rope_theta` / `rope_scaling` / `torch_dtype` at the top level. Whichever style the installed
transformers writes is config.json; the other is written by hand next to it (config.v4.json or
config.v5.json). The script asserts that both load in transformers to the same model (identical
logits).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import tempfile
import types
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Phi3Config,
    Phi3ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
from transformers.models.phi3 import modeling_phi3
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "crates" / "rlvr-model" / "tests" / "fixtures"
PAD_ID = 0
INIT_STD = 0.2
BIAS_STD = 0.3
# A left-padded row must give the same log-probs as the same row alone, unpadded.
PAD_CONSISTENCY_TOL = 1e-6
# The float64 reference against plain transformers.
HF_DOUBLE_TOL = 1e-5
HF_F32_TOL = 5e-5


# ----------------------------------------------------------------------------------------------
# Fixture definitions
# ----------------------------------------------------------------------------------------------

def fixture_specs():
    return [
        dict(
            name="qwen2_bias_tied",
            seed=1001,
            cls=Qwen2ForCausalLM,
            config=Qwen2Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=160,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=128,
                rms_norm_eps=1e-6,
                rope_theta=10000.0,
                tie_word_embeddings=True,
                bos_token_id=1,
                eos_token_id=2,
            ),
            save_dtype=torch.float32,
            shard=None,
            notes="Qwen2: q/k/v biases (random, nonzero), no o_proj bias, tied lm_head (no lm_head.weight "
            "tensor in the file), 4 heads / 2 KV heads, head_dim 16, rope_theta 10000, weights f32.",
        ),
        dict(
            name="llama_gqa_untied_rope3",
            seed=1002,
            cls=LlamaForCausalLM,
            config=LlamaConfig(
                vocab_size=512,
                hidden_size=96,
                intermediate_size=192,
                num_hidden_layers=2,
                num_attention_heads=6,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=512,
                rms_norm_eps=1e-5,
                rope_theta=500000.0,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                tie_word_embeddings=False,
                attention_bias=False,
                mlp_bias=False,
                bos_token_id=1,
                eos_token_id=2,
            ),
            save_dtype=torch.float32,
            shard="250KB",
            notes="Llama: untied lm_head, 6 heads / 2 KV heads (3:1 GQA), head_dim 16, rope_theta 500000 with "
            "llama3 rope scaling (factor 8, low 1, high 4, original_max_position_embeddings 64: of the 8 "
            "frequencies, index 0 is kept, index 1 is smoothed, 2..7 are divided by 8), rms_norm_eps 1e-5, "
            "saved sharded with model.safetensors.index.json, weights f32.",
        ),
        dict(
            name="qwen3",
            seed=1003,
            cls=Qwen3ForCausalLM,
            config=Qwen3Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                max_position_embeddings=128,
                rms_norm_eps=1e-6,
                rope_theta=1000000.0,
                tie_word_embeddings=True,
                attention_bias=False,
                bos_token_id=1,
                eos_token_id=2,
            ),
            save_dtype=torch.bfloat16,
            shard=None,
            notes="Qwen3: per-head q_norm/k_norm (RMSNorm over head_dim, before rope), no q/k/v bias, explicit "
            "head_dim 32 with hidden 64 and 4 heads (q_proj is [128, 64], o_proj is [64, 128]), tied, "
            "rope_theta 1e6. Weights STORED in bf16; the reference is computed from those bf16 values "
            "upcast (exactly) to float64.",
        ),
        dict(
            name="qwen2_yarn_window",
            seed=1004,
            cls=Qwen2ForCausalLM,
            config=Qwen2Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=128,
                rms_norm_eps=1e-6,
                rope_theta=10000.0,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                use_sliding_window=True,
                sliding_window=6,
                max_window_layers=1,
                tie_word_embeddings=True,
                bos_token_id=1,
                eos_token_id=2,
            ),
            save_dtype=torch.float32,
            shard=None,
            greedy=dict(prompt_len=5, new_tokens=24),
            notes="Qwen2 (Qwen2.5 long-context style): YaRN rope (factor 4 over original_max_position_embeddings "
            "32, beta_fast/beta_slow/attention_factor at their defaults: attention factor 0.1 ln 4 + 1) and a "
            "sliding window of 6 tokens on layers 1 and 2 (max_window_layers 1; layer 0 attends fully), so rows "
            "of 7 tokens and more see the window. 3 layers, 4 heads / 2 KV heads, weights f32. `greedy`: 24 "
            "greedy tokens after a 5-token prompt from transformers' generate with its KV cache.",
        ),
        dict(
            name="mistral_window",
            seed=1005,
            cls=MistralForCausalLM,
            config=MistralConfig(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=1,
                max_position_embeddings=256,
                rms_norm_eps=1e-5,
                rope_theta=10000.0,
                sliding_window=5,
                tie_word_embeddings=False,
                bos_token_id=1,
                eos_token_id=2,
            ),
            save_dtype=torch.float32,
            shard=None,
            greedy=dict(prompt_len=4, new_tokens=20),
            notes="Mistral: the Llama layout without biases, sliding window 5 on every layer, 4 heads / 1 KV "
            "head, head_dim from hidden/heads (16), untied lm_head, weights f32. `greedy`: 20 greedy tokens "
            "after a 4-token prompt from transformers' generate with its KV cache.",
        ),
        dict(
            name="llama_dynamic_rope",
            seed=1006,
            cls=LlamaForCausalLM,
            config=LlamaConfig(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=32,
                rms_norm_eps=1e-5,
                rope_theta=10000.0,
                rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                tie_word_embeddings=False,
                bos_token_id=1,
                eos_token_id=2,
            ),
            save_dtype=torch.float32,
            shard=None,
            greedy=dict(prompt_len=20, new_tokens=20),
            notes="Llama with dynamic NTK rope (factor 2) and max_position_embeddings 32: the 40-token case "
            "(positions to 39) runs with the base grown for 40 positions; the short cases with the plain "
            "base. `greedy`: 20 greedy tokens after a 20-token prompt from transformers' generate with its "
            "KV cache: the steps past position 31 rotate their queries and keys with the grown base of "
            "their own length, the cached keys keep theirs.",
        ),
    ]


def gemma_specs():
    return [
        dict(
            name="gemma2_softcap",
            seed=1007,
            cls=Gemma2ForCausalLM,
            config=Gemma2Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                query_pre_attn_scalar=24,
                attn_logit_softcapping=2.5,
                final_logit_softcapping=3.0,
                sliding_window=5,
                max_position_embeddings=256,
                rms_norm_eps=1e-6,
                rope_theta=10000.0,
                tie_word_embeddings=False,
                pad_token_id=0,
                bos_token_id=2,
                eos_token_id=1,
            ),
            save_dtype=torch.float32,
            shard=None,
            greedy=dict(prompt_len=4, new_tokens=20),
            grads=True,
            notes="Gemma 2: RMSNorm scaling by (1 + weight) (weights stored as offsets in [-0.5, 0.5)), four "
            "norms per layer, GeGLU MLP (gelu_pytorch_tanh), embeddings times sqrt(64) = 8, attention scale "
            "query_pre_attn_scalar^-1/2 = 24^-1/2 (head_dim 16), attention softcapping 2.5 and final-logit "
            "softcapping 3.0 (both well inside tanh's bend at these activations), sliding window 5 on layers "
            "0 and 2 (Gemma2Config's alternation; layer 1 global), 4 heads / 2 KV heads, untied lm_head (a tied one makes random models repeat their last token under greedy decoding), weights f32. "
            "`greedy`: 20 greedy tokens after a 4-token prompt from transformers' generate with its KV cache. "
            "`grads`: the float64 gradient of the summed log-probs of case 0 w.r.t. a few weights.",
        ),
        dict(
            name="gemma3_local_global",
            seed=1008,
            cls=Gemma3ForCausalLM,
            config=Gemma3TextConfig(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=32,
                query_pre_attn_scalar=20,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
                max_position_embeddings=512,
                rms_norm_eps=1e-6,
                tie_word_embeddings=False,
                pad_token_id=0,
                bos_token_id=2,
                eos_token_id=1,
            ),
            save_dtype=torch.float32,
            shard=None,
            greedy=dict(prompt_len=5, new_tokens=20),
            grads=True,
            notes="Gemma 3 text: Gemma 2's layout with per-head q_norm/k_norm ((1 + weight), before rope), no "
            "softcapping, query_pre_attn_scalar 20 (head_dim 32, hidden 64: q_proj is [128, 64]), layers "
            "sliding/full/sliding with window 4; the local layers rotate with base 10000 and no scaling, the "
            "global layer with base 1e6 and linear scaling factor 8. 4 heads / 1 KV head, untied lm_head, weights f32. "
            "`greedy` and `grads` as gemma2_softcap.",
        ),
    ]


def phi3_specs():
    return [
        dict(
            name="phi3_longrope_partial",
            seed=1009,
            cls=Phi3ForCausalLM,
            config=Phi3Config(
                vocab_size=512,
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=3,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                original_max_position_embeddings=16,
                partial_rotary_factor=0.75,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0, 1.1, 1.3, 1.7, 2.2, 3.0],
                    "long_factor": [1.0, 1.5, 2.5, 4.0, 7.0, 12.0],
                },
                sliding_window=24,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                pad_token_id=0,
                bos_token_id=2,
                eos_token_id=1,
            ),
            save_dtype=torch.float32,
            shard=None,
            greedy=dict(prompt_len=10, new_tokens=20),
            grads=True,
            notes="Phi-3 (model_type phi3): fused qkv_proj [64 + 2*32, 64] and gate_up_proj [2*96, 64], head_dim 16 "
            "with partial_rotary_factor 0.75 (the first 12 dimensions of each head rotate, the last 4 pass), "
            "LongRoPE with original_max_position_embeddings 16 and max_position_embeddings 64 (factor 4: cos/sin "
            "times sqrt(1 + ln 4 / ln 16)): the short cases (to 11 tokens) rotate with short_factor, the 40-token "
            "case with long_factor; sliding window 24 on every layer, 4 heads / 2 KV heads, untied lm_head, "
            "weights f32. `greedy`: 20 greedy tokens after a 10-token prompt from transformers' generate with its "
            "KV cache, which crosses 16 tokens (Phi3ForCausalLM drops its cache there and recomputes with the long "
            "factors, so the tokens equal the argmax chain of full forwards). `grads`: the float64 gradient of the "
            "summed log-probs of case 0 w.r.t. a few weights (of qkv_proj and gate_up_proj their first two rows: "
            "rows of q_proj and gate_proj).",
        ),
    ]


def cases_for(seed: int, vocab: int):
    """Token batches. Row 0 is always full length, so last_logits_row0 is a real position."""
    g = torch.Generator().manual_seed(seed + 7)

    def toks(n):
        return torch.randint(1, vocab, (n,), generator=g).tolist()

    rows_left = [toks(11), toks(7), toks(4)]
    rows_right = [toks(9), toks(5), toks(8)]
    single = [toks(40)]
    return [
        dict(name="left_b3_t1.0", padding_side="left", temperature=1.0, rows=rows_left),
        dict(name="left_b3_t0.7", padding_side="left", temperature=0.7, rows=rows_left),
        dict(name="right_b3_t1.0", padding_side="right", temperature=1.0, rows=rows_right),
        dict(name="single_len40_t1.3", padding_side="none", temperature=1.3, rows=single),
    ]


# ----------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------

def random_init(model: nn.Module, seed: int):
    """std-0.2 normal weights, random nonzero biases, RMSNorm scales uniform in [0.5, 1.5) (Gemma's
    norms scale by 1 + weight: their weights are uniform in [-0.5, 0.5))."""
    g = torch.Generator().manual_seed(seed)
    offset = -0.5 if model.config.model_type.startswith("gemma") else 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            if name.endswith("norm.weight"):
                p.copy_(offset + torch.rand(p.shape, generator=g, dtype=torch.float64))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * BIAS_STD)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * INIT_STD)


# ----------------------------------------------------------------------------------------------
# float64 versions of the pieces transformers keeps in float32
# ----------------------------------------------------------------------------------------------

def rope_params_of(config, layer_type=None) -> dict:
    """The rope parameters of a layer type: Gemma 3 keeps one dict per type (the global ones by
    default), the other models one for every layer."""
    rp = dict(config.rope_parameters)
    if "full_attention" in rp or "sliding_attention" in rp:
        rp = dict(rp[layer_type or "full_attention"])
    return rp


def inv_freq_f64(config, seq_len=None, layer_type=None) -> torch.Tensor:
    """RoPE inverse frequencies in float64 (default, linear, llama3, yarn and dynamic rope types).

    `seq_len`: the largest position + 1 of the forward (dynamic NTK grows the base past
    max_position_embeddings). The YaRN formulas are those of Peng et al. 2023 (arXiv 2309.00071)
    as transformers' `_compute_yarn_parameters` applies them. `layer_type`: Gemma 3's
    "sliding_attention" or "full_attention" (the default).
    """
    rp = rope_params_of(config, layer_type)
    base = float(rp["rope_theta"])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    # Partial rotary: only the first int(head_dim * partial_rotary_factor) dimensions rotate.
    dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    rtype = rp.get("rope_type", "default")
    if rtype == "dynamic" and seq_len is not None and seq_len > config.max_position_embeddings:
        factor = float(rp["factor"])
        grow = factor * seq_len / config.max_position_embeddings - (factor - 1)
        base = base * grow ** (dim / (dim - 2))
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rtype in ("default", "dynamic"):
        return inv
    if rtype == "longrope":
        # LongRoPE (arXiv 2402.13753): per-pair divisors, the long ones for a forward reaching past
        # original_max_position_embeddings.
        long = seq_len is not None and seq_len > rp["original_max_position_embeddings"]
        ext = torch.tensor(rp["long_factor" if long else "short_factor"], dtype=torch.float64)
        return inv / ext
    if rtype == "linear":
        return inv / float(rp["factor"])
    if rtype == "yarn":
        factor = float(rp["factor"])
        old = float(rp["original_max_position_embeddings"])
        beta_fast = rp.get("beta_fast") or 32
        beta_slow = rp.get("beta_slow") or 1

        def dim_of(turns):
            return dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = dim_of(beta_fast), dim_of(beta_slow)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        return (inv / factor) * ramp + inv * (1 - ramp)
    if rtype != "llama3":
        raise ValueError(f"rope_type {rtype} not handled")
    factor = rp["factor"]
    lo = rp["low_freq_factor"]
    hi = rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    low_wl = old / lo
    high_wl = old / hi
    wl = 2 * math.pi / inv
    out = torch.where(wl > low_wl, inv / factor, inv)
    smooth = (old / wl - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wl < high_wl) & ~(wl > low_wl)
    return torch.where(medium, smoothed, out)


def attention_factor_f64(config) -> float:
    """The cos/sin multiplier: YaRN's attention factor (0.1 ln(factor) + 1 by default), else 1."""
    rp = rope_params_of(config)
    if rp.get("rope_type") == "longrope":
        if rp.get("attention_factor") is not None:
            return float(rp["attention_factor"])
        old = rp["original_max_position_embeddings"]
        factor = rp.get("factor") or config.max_position_embeddings / old
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))
    if rp.get("rope_type") != "yarn":
        return 1.0
    if rp.get("attention_factor") is not None:
        return float(rp["attention_factor"])
    factor = float(rp["factor"])

    def m(scale, mul=1.0):
        return 1.0 if scale <= 1 else 0.1 * mul * math.log(scale) + 1.0

    ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
    if ms and msa:
        return m(factor, ms) / m(factor, msa)
    return m(factor)


def _rmsnorm_f64(self, x):
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


def _gemma_rmsnorm_f64(self, x):
    var = x.pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(var + self.eps)) * (1.0 + self.weight)


def _gemma3_rotary_f64(self, x, position_ids, layer_type):
    freqs = position_ids[..., None].to(torch.float64) * self._inv_freq64[layer_type]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotary_f64(self, x, position_ids):
    # Dynamic NTK: the frequencies of this forward's largest position (a freshly loaded
    # transformers model's, and its generate's with a growing cache).
    inv = inv_freq_f64(self.config, int(position_ids.max()) + 1) if self._dynamic else self._inv_freq64
    freqs = position_ids[..., None].to(torch.float64) * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


_EAGER_CALLS = [0]


def _eager_f64(module, query, key, value, attention_mask, scaling, dropout=0.0, softcap=None, **kwargs):
    _EAGER_CALLS[0] += 1
    n_rep = module.num_key_value_groups
    key = modeling_llama.repeat_kv(key, n_rep)
    value = modeling_llama.repeat_kv(value, n_rep)
    w = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        w = torch.tanh(w / softcap) * softcap
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.softmax(w, dim=-1)
    out = torch.matmul(w, value).transpose(1, 2).contiguous()
    return out, w


class _f64_patches:
    """Context manager: RMSNorm, rotary tables and eager softmax computed in the input dtype (f64)."""

    MODULES = (
        modeling_llama,
        modeling_qwen2,
        modeling_qwen3,
        modeling_mistral,
        modeling_gemma2,
        modeling_gemma3,
        modeling_phi3,
    )

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.saved = [(m, m.eager_attention_forward) for m in self.MODULES]
        for m in self.MODULES:
            m.eager_attention_forward = _eager_f64
        self.patched = []
        inv = inv_freq_f64(self.model.config)
        n_norm = n_rot = 0
        for mod in self.model.modules():
            cname = type(mod).__name__
            if cname.endswith("RMSNorm"):
                gemma = cname.startswith("Gemma")
                mod.forward = types.MethodType(_gemma_rmsnorm_f64 if gemma else _rmsnorm_f64, mod)
                self.patched.append(mod)
                n_norm += 1
            elif cname == "Gemma3RotaryEmbedding":
                mod._inv_freq64 = {}
                for lt in mod.layer_types:
                    want = inv_freq_f64(self.model.config, layer_type=lt)
                    got = getattr(mod, f"{lt}_original_inv_freq").double()
                    assert torch.allclose(got, want, rtol=1e-6, atol=0), (lt, got, want)
                    assert getattr(mod, f"{lt}_attention_scaling") == 1.0
                    mod._inv_freq64[lt] = want
                mod._dynamic = False
                mod.forward = types.MethodType(_gemma3_rotary_f64, mod)
                self.patched.append(mod)
                n_rot += 1
            elif cname.endswith("RotaryEmbedding"):
                # transformers' own table (float32 arithmetic) must agree with ours (the table at
                # load: dynamic rope grows `inv_freq` in place after a long forward).
                assert torch.allclose(mod.original_inv_freq.double(), inv, rtol=1e-6, atol=0), (
                    mod.original_inv_freq,
                    inv,
                )
                assert abs(mod.attention_scaling - attention_factor_f64(self.model.config)) < 1e-6, (
                    mod.attention_scaling
                )
                mod._inv_freq64 = inv
                # Dynamic NTK and LongRoPE: the table depends on the forward's largest position.
                rtype = dict(self.model.config.rope_parameters).get("rope_type")
                mod._dynamic = rtype in ("dynamic", "longrope")
                mod.forward = types.MethodType(_rotary_f64, mod)
                self.patched.append(mod)
                n_rot += 1
        assert n_norm >= 3 and n_rot == 1, (n_norm, n_rot)
        _EAGER_CALLS[0] = 0
        return self

    def __exit__(self, *exc):
        for m, f in self.saved:
            m.eager_attention_forward = f
        for mod in self.patched:
            del mod.forward  # back to the class method
            if hasattr(mod, "_inv_freq64"):
                del mod._inv_freq64
                del mod._dynamic
        return False


# ----------------------------------------------------------------------------------------------
# Batches and per-token values
# ----------------------------------------------------------------------------------------------

def make_batch(rows, side):
    T = max(len(r) for r in rows)
    ids, mask, pos = [], [], []
    for r in rows:
        n = len(r)
        if side in ("left", "none"):
            ids.append([PAD_ID] * (T - n) + r)
            mask.append([0] * (T - n) + [1] * n)
        elif side == "right":
            ids.append(r + [PAD_ID] * (T - n))
            mask.append([1] * n + [0] * (T - n))
        else:
            raise ValueError(side)
    ids_t = torch.tensor(ids, dtype=torch.long)
    mask_t = torch.tensor(mask, dtype=torch.long)
    if side == "right":
        pos_t = torch.arange(T, dtype=torch.long).unsqueeze(0).expand(len(rows), T).clone()
    else:
        pos_t = (mask_t.cumsum(-1) - 1).clamp(min=0)
    return ids_t, mask_t, pos_t


@torch.no_grad()
def forward_logits(model, ids, mask, pos):
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    return out.logits.double()


def token_values(logits, ids, mask, temperature):
    """logprobs[b,t] of ids[b,t+1] and entropy at t, both from softmax(logits[b,t]/T); None where masked."""
    lp_all = torch.log_softmax(logits[:, :-1, :] / temperature, dim=-1)
    lp = lp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(lp_all.exp() * lp_all).sum(-1)
    valid = (mask[:, 1:] == 1) & (mask[:, :-1] == 1)
    return lp, ent, valid


def to_nullable(x, valid):
    return [[(float(v) if ok else None) for v, ok in zip(xr, vr)] for xr, vr in zip(x.tolist(), valid.tolist())]


def max_diff_valid(a, b, valid):
    d = (a - b).abs()[valid]
    return float(d.max()) if d.numel() else 0.0


# ----------------------------------------------------------------------------------------------
# Config styles
# ----------------------------------------------------------------------------------------------

def detect_style(cfg: dict) -> str:
    if "rope_parameters" in cfg or "dtype" in cfg:
        return "v5"
    return "v4"


def to_v4(cfg: dict) -> dict:
    """transformers-5 style -> transformers-4 style (rope_theta/rope_scaling/torch_dtype at top level)."""
    out = {}
    for k, v in cfg.items():
        if k == "rope_parameters" and "full_attention" in v:
            # Gemma 3: the global layers' rope at the top level, the local base beside it.
            rp = dict(v["full_attention"])
            out["rope_theta"] = rp.pop("rope_theta")
            rtype = rp.get("rope_type", "default")
            out["rope_scaling"] = None if rtype == "default" else rp
            out["rope_local_base_freq"] = v["sliding_attention"]["rope_theta"]
        elif k == "rope_parameters":
            rp = dict(v)
            out["rope_theta"] = rp.pop("rope_theta")
            # transformers 4 kept these beside rope_scaling (Phi-3 and Phi-4-mini's config.json).
            for top in ("partial_rotary_factor", "original_max_position_embeddings"):
                if top in rp:
                    out[top] = rp.pop(top)
            rtype = rp.get("rope_type", "default")
            out["rope_scaling"] = None if rtype == "default" else rp
        elif k == "dtype":
            out["torch_dtype"] = v
        else:
            out[k] = v
    out["transformers_version"] = "4.57.1"
    return out


def to_v5(cfg: dict) -> dict:
    out = {}
    for k, v in cfg.items():
        if k in ("rope_theta", "rope_scaling"):
            continue
        if k == "torch_dtype":
            out["dtype"] = v
        else:
            out[k] = v
    rp = {"rope_theta": cfg["rope_theta"]}
    rs = cfg.get("rope_scaling")
    if rs:
        rs = dict(rs)
        if "type" in rs and "rope_type" not in rs:
            rs["rope_type"] = rs.pop("type")
        rp.update(rs)
    else:
        rp["rope_type"] = "default"
    out["rope_parameters"] = rp
    out["transformers_version"] = "5.0.0"
    return out


def check_other_style(d: Path, other_name: str, ref_logits, ids, mask, pos):
    """Load config.<other>.json with the same weights in transformers; logits must be identical."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for f in d.iterdir():
            if f.name.endswith(".safetensors") or f.name.endswith(".index.json"):
                shutil.copy(f, tmp / f.name)
        shutil.copy(d / other_name, tmp / "config.json")
        m = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float64, attn_implementation="eager")
        m.eval()
        a = AutoConfig.from_pretrained(d)
        b = AutoConfig.from_pretrained(tmp)
        for key in ("rope_parameters", "head_dim", "tie_word_embeddings", "num_key_value_heads", "hidden_size"):
            assert getattr(a, key, None) == getattr(b, key, None), (key, getattr(a, key, None), getattr(b, key, None))
        assert str(a.dtype) == str(b.dtype), (a.dtype, b.dtype)
        with _f64_patches(m):
            lg = forward_logits(m, ids, mask, pos)
        diff = float((lg - ref_logits).abs().max())
        assert diff == 0.0, f"{other_name}: logits differ by {diff}"


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def build_fixture(spec, out_root: Path) -> dict:
    name = spec["name"]
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)

    torch.manual_seed(spec["seed"])
    cfg = copy.deepcopy(spec["config"])
    model = spec["cls"](cfg)
    random_init(model, spec["seed"])
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    else:
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    model = model.to(spec["save_dtype"])
    save_kw = {}
    if spec["shard"]:
        save_kw["max_shard_size"] = spec["shard"]
    model.save_pretrained(d, safe_serialization=True, **save_kw)
    # transformers also writes generation_config.json; keep it (rlvr reads EOS ids from it).

    files = sorted(f.name for f in d.iterdir())
    st_files = [f for f in files if f.endswith(".safetensors")]
    if spec["shard"]:
        assert "model.safetensors.index.json" in files, files
        assert len(st_files) >= 2, files
    else:
        assert st_files == ["model.safetensors"], files

    # Stored tensors: names, dtypes, shapes.
    tensors = {}
    for f in st_files:
        with safe_open(d / f, framework="pt") as sf:
            for k in sf.keys():
                t = sf.get_tensor(k)
                tensors[k] = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "file": f}
    want_dtype = str(spec["save_dtype"]).replace("torch.", "")
    assert all(v["dtype"] == want_dtype for v in tensors.values()), tensors
    assert ("lm_head.weight" in tensors) == (not cfg.tie_word_embeddings), sorted(tensors)
    if name.startswith("qwen2"):
        assert "model.layers.0.self_attn.q_proj.bias" in tensors
        assert "model.layers.0.self_attn.o_proj.bias" not in tensors
    if name == "qwen3":
        assert tensors["model.layers.0.self_attn.q_norm.weight"]["shape"] == [32]
        assert tensors["model.layers.0.self_attn.q_proj.weight"]["shape"] == [128, 64]
        assert tensors["model.layers.0.self_attn.o_proj.weight"]["shape"] == [64, 128]
        assert "model.layers.0.self_attn.q_proj.bias" not in tensors

    # Config style written by this transformers; write the other style next to it.
    cfg_json = json.loads((d / "config.json").read_text())
    style = detect_style(cfg_json)
    if style == "v5":
        other_name, other = "config.v4.json", to_v4(cfg_json)
    else:
        other_name, other = "config.v5.json", to_v5(cfg_json)
    (d / other_name).write_text(json.dumps(other, indent=2, sort_keys=True) + "\n")

    # Reference model: reloaded from disk (so the stored weights are what is tested), float64.
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager")
    ref.eval()
    assert ref.config._attn_implementation == "eager"
    with torch.no_grad():
        sd_mem = {k: v.double() for k, v in model.state_dict().items()}
        for k, v in ref.state_dict().items():
            assert torch.equal(v, sd_mem[k]), k
    # Plain transformers in float32 (weights as stored, upcast to f32; exact for bf16).
    hf32 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    hf32.eval()

    cases_out = []
    hf_checks = {}
    for case in cases_for(spec["seed"], cfg.vocab_size):
        ids, mask, pos = make_batch(case["rows"], case["padding_side"])
        temp = case["temperature"]
        with _f64_patches(ref):
            logits = forward_logits(ref, ids, mask, pos)
            assert _EAGER_CALLS[0] == cfg.num_hidden_layers, _EAGER_CALLS
        lp, ent, valid = token_values(logits, ids, mask, temp)
        assert torch.isfinite(lp[valid]).all() and torch.isfinite(ent[valid]).all()

        # 1. Each padded row equals the same row run alone, unpadded.
        pad_diff = 0.0
        for b, row in enumerate(case["rows"]):
            i1, m1, p1 = make_batch([row], "none")
            with _f64_patches(ref):
                lg1 = forward_logits(ref, i1, m1, p1)
            lp1, ent1, _ = token_values(lg1, i1, m1, temp)
            n = len(row)
            if case["padding_side"] == "right":
                sl = slice(0, n - 1)
            else:
                sl = slice(ids.shape[1] - n, ids.shape[1] - 1)
            assert valid[b, sl].all() and int(valid[b].sum()) == n - 1
            dl = float((lp[b, sl] - lp1[0]).abs().max()) if n > 1 else 0.0
            de = float((ent[b, sl] - ent1[0]).abs().max()) if n > 1 else 0.0
            pad_diff = max(pad_diff, dl, de)
        assert pad_diff < PAD_CONSISTENCY_TOL, (name, case["name"], pad_diff)

        # 2. The float64 reference agrees with plain transformers (double, and float32).
        #    Plain transformers in float64 turns fully masked query rows (the left padding) into NaN:
        #    its eager softmax runs in float32, where the float64 mask value becomes -inf, and the NaN
        #    reaches the real rows through 0 * NaN in the value product. Compare only when finite.
        lg_hf64 = forward_logits(ref, ids, mask, pos)
        hf64_nan = not bool(torch.isfinite(lg_hf64).all())
        d64 = None
        if hf64_nan:
            # Right padding too under a window narrower than the padding: the last padded queries
            # then see no key at all.
            narrow = (getattr(cfg, "sliding_window", None) or 10**9) < ids.shape[1] - min(map(len, case["rows"])) + 1
            assert case["padding_side"] == "left" or narrow, (name, case["name"])
        else:
            lp64, ent64, _ = token_values(lg_hf64, ids, mask, temp)
            d64 = max(max_diff_valid(lp, lp64, valid), max_diff_valid(ent, ent64, valid))
            assert d64 < HF_DOUBLE_TOL, (name, case["name"], d64)
        lg_hf32 = forward_logits(hf32, ids, mask, pos)
        lp32, ent32, _ = token_values(lg_hf32, ids, mask, temp)
        d32 = max(max_diff_valid(lp, lp32, valid), max_diff_valid(ent, ent32, valid))
        assert d32 < HF_F32_TOL, (name, case["name"], d32)

        # 3. Without explicit position_ids transformers uses arange positions (it does not derive them
        #    from the mask). Under left padding that shifts every real token of a row by the same
        #    offset, which RoPE attention (relative) cancels up to rounding: record the difference.
        no_pos = None
        if case["padding_side"] == "left":
            with _f64_patches(ref), torch.no_grad():
                out = ref(input_ids=ids, attention_mask=mask, use_cache=False).logits.double()
            lpn, _, _ = token_values(out, ids, mask, temp)
            no_pos = max_diff_valid(lp, lpn, valid)

        hf_checks[case["name"]] = {
            "pad_vs_unpadded_max_abs": pad_diff,
            "vs_hf_eager_f64_max_abs": d64,
            "hf_eager_f64_gives_nan": hf64_nan,
            "vs_hf_eager_f32_max_abs": d32,
            "hf_without_position_ids_max_abs": no_pos,
        }
        cases_out.append(
            {
                "name": case["name"],
                "padding_side": case["padding_side"],
                "temperature": temp,
                "input_ids": ids.tolist(),
                "attention_mask": mask.tolist(),
                "position_ids": pos.tolist(),
                "logprobs": to_nullable(lp, valid),
                "entropy": to_nullable(ent, valid),
                "last_logits_row0": [float(v) for v in logits[0, -1].tolist()],
            }
        )

    check_other_style(d, other_name, forward_logits_ref_cache(ref, cases_out), *batch_of(cases_out[0]))

    greedy = None
    if spec.get("greedy"):
        greedy = greedy_reference(spec, ref, hf32, cases_out)
    grads = grads_reference(ref, hf32, cases_out[0]) if spec.get("grads") else None

    inv = inv_freq_f64(ref.config)
    expected = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "fixture": name,
        "notes": spec["notes"],
        "config_style": style,
        "other_config": other_name,
        "weights_dtype": want_dtype,
        "reference_dtype": "float64",
        "pad_id": PAD_ID,
        "rope_inv_freq": [float(v) for v in inv.tolist()],
        "tensors": tensors,
        "hf_checks": hf_checks,
        "cases": cases_out,
    }
    if greedy is not None:
        expected["greedy"] = greedy
    if grads is not None:
        expected["grads"] = grads
    if "sliding_attention" in dict(ref.config.rope_parameters):
        local = inv_freq_f64(ref.config, layer_type="sliding_attention")
        expected["rope_inv_freq_local"] = [float(v) for v in local.tolist()]
    (d / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    return {"name": name, "style": style, "files": files + [other_name, "expected.json"], "checks": hf_checks}


def greedy_reference(spec, ref, hf32, cases_out) -> dict:
    """Greedy tokens of transformers' generate with its KV cache (float64 reference), after the first
    `prompt_len` tokens of the single long row; asserted equal to plain float32 transformers' and, for
    models whose rotary table does not depend on the length, to the argmax chain of full forwards."""
    g = spec["greedy"]
    prompt = [row for c in cases_out if c["name"].startswith("single") for row in c["input_ids"]][0][: g["prompt_len"]]
    n = g["new_tokens"]
    ids = torch.tensor([prompt])
    kw = dict(
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=0,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=PAD_ID,
        use_cache=True,
    )
    with _f64_patches(ref), torch.no_grad():
        out = ref.generate(ids, **kw)
    tokens = out[0, len(prompt):].tolist()
    assert len(tokens) == n, (spec["name"], tokens)
    with torch.no_grad():
        out32 = hf32.generate(ids, **kw)
    assert out32[0, len(prompt):].tolist() == tokens, (spec["name"], out32, tokens)
    # The argmax chain of full forwards (no cache), one position at a time.
    seq = list(prompt)
    for _ in range(n):
        t = torch.tensor([seq])
        with _f64_patches(ref):
            lg = forward_logits(ref, t, torch.ones_like(t), torch.arange(len(seq))[None])
        seq.append(int(lg[0, -1].argmax()))
    full = seq[len(prompt):]
    # LongRoPE: Phi3ForCausalLM's generate drops its cache when the sequence first passes
    # original_max_position_embeddings, so the full forwards agree; dynamic NTK keeps the cache.
    dynamic = dict(ref.config.rope_parameters).get("rope_type") == "dynamic"
    if not dynamic:
        assert full == tokens, (spec["name"], full, tokens)
    return {
        "prompt": prompt,
        "tokens": tokens,
        "full_forward_argmax": full,
        "window": getattr(ref.config, "sliding_window", None),
    }


# The weights whose gradients `grads` stores: an embedding row block would be most of the file, so
# the norms (every kind), one attention and one MLP projection, and Gemma 3's q/k norms.
GRAD_WEIGHTS = (
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.0.pre_feedforward_layernorm.weight",
    "model.layers.0.post_feedforward_layernorm.weight",
    "model.layers.1.self_attn.q_proj.weight",
    "model.layers.2.self_attn.k_proj.weight",
    "model.layers.1.mlp.gate_proj.weight",
    "model.layers.2.mlp.down_proj.weight",
    "model.layers.1.self_attn.q_norm.weight",
    "model.layers.1.self_attn.qkv_proj.weight",
    "model.layers.2.mlp.gate_up_proj.weight",
    "model.layers.1.self_attn.k_norm.weight",
    "model.norm.weight",
)


def grads_reference(ref, hf32, case) -> dict:
    """The gradient of L = sum of the valid log-probs of `case` (at its temperature) w.r.t. the
    GRAD_WEIGHTS the model has (of a matrix, its first two rows), in float64 (the reference) and, as a check, in plain float32
    transformers (asserted within 1e-4 relative to the largest entry)."""
    ids, mask, pos = batch_of(case)
    temp = case["temperature"]

    def run(model, patched):
        params = dict(model.named_parameters())
        names = [n for n in GRAD_WEIGHTS if n in params]
        model.zero_grad()
        if patched:
            with _f64_patches(model):
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        else:
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        lp, _, valid = token_values(out.double(), ids, mask, temp)
        loss = lp[valid].sum()
        loss.backward()
        return float(loss.detach()), {n: params[n].grad.double().clone() for n in names}

    loss64, g64 = run(ref, True)
    _, g32 = run(hf32, False)
    for n, g in g64.items():
        scale = float(g.abs().max())
        d = float((g32[n] - g).abs().max())
        assert scale > 0 and d <= 1e-4 * max(scale, 1.0), (n, d, scale)
    ref.zero_grad()
    hf32.zero_grad()
    # Norms whole; of a matrix its first two rows (every input column), which keeps the file small.
    head = {n: (g if g.dim() == 1 else g[:2]) for n, g in g64.items()}
    return {
        "case": case["name"],
        "loss": loss64,
        "weights": {n: g.flatten().tolist() for n, g in head.items()},
        "shapes": {n: list(g.shape) for n, g in head.items()},
    }


def batch_of(case):
    return (
        torch.tensor(case["input_ids"]),
        torch.tensor(case["attention_mask"]),
        torch.tensor(case["position_ids"]),
    )


def forward_logits_ref_cache(ref, cases_out):
    ids, mask, pos = batch_of(cases_out[0])
    with _f64_patches(ref):
        return forward_logits(ref, ids, mask, pos)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT), help="fixtures root (default: %(default)s)")
    ap.add_argument("--only", action="append", help="build only this fixture (repeatable)")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    for spec in fixture_specs() + gemma_specs() + phi3_specs():
        if args.only and spec["name"] not in args.only:
            continue
        r = build_fixture(spec, out_root)
        worst = {
            k: max(float(c[k] or 0.0) for c in r["checks"].values()) for k in next(iter(r["checks"].values()))
        }
        print(f"{r['name']}: config style {r['style']}, files {r['files']}")
        print(f"  max abs diffs: {json.dumps(worst)}")
    total = sum(f.stat().st_size for f in out_root.rglob("*") if f.is_file())
    print(f"fixtures total {total / 1e6:.2f} MB under {out_root}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
