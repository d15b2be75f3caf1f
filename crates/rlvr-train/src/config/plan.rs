//! `rlvr plan` (DESIGN.md section 12): the memory a run config needs, from the model's
//! `config.json` (no weights are read) and the prompt length (`data.max_prompt_len`; `rlvr plan`
//! without it reads the train split's longest prompt first, [`with_data_prompt_len`]), and the
//! largest micro-batch and rollout batch that fit a given memory.
//!
//! The estimate counts what this code base holds, by component:
//!
//! - **weights** `P·b` (b = 2 for bf16, 4 for f32); **master weights** `P·4` for bf16 (the optimizer's
//!   f32 copy, `rlvr_model::optim`); **gradients** `P·4` (the f32 sum over micro-batches) plus `P·b`
//!   (one micro-batch's gradients while they are added); **AdamW moments** `2·P·4`. What the
//!   trainer holds: candle's backward returns every weight's gradient at once (the graph's own
//!   gradients are freed as it goes), and the sum (`rlvr_model::optim::GradAccumulator`) keeps the
//!   first micro-batch's gradients as they are (f32: no copy), then adds each later one into itself,
//!   the micro-batch's gradients freed after its add. So from the second micro-batch of an update
//!   on, the f32 sum and a whole backward's gradients are alive together (`P·4 + P·b`, at the end
//!   of each backward, beside that micro-batch's activations); an update of one micro-batch in f32
//!   holds only its own gradients, which are the sum (`P·4`); in a 16-bit dtype its f32 copy is
//!   made while the backward's gradients are alive (`P·4 + P·b` again). At the end of every
//!   backward candle adds the embedding lookup's gradient into the embedding's (the tied head's,
//!   or zeros) as a new tensor beside the old one, when every other gradient is alive: one more
//!   `V·H·b` (full fine-tuning; LoRA's frozen embedding gets none).
//!   Data parallel with ZeRO-2 (`distributed.zero = 2`), each micro-batch's gradients are reduced
//!   to their owners and the f32 sum is this rank's share only (`P_r·4`, the most-loaded owner's
//!   elements): one backward's gradients `P·b` (and the embedding's re-sum) stay, plus the share
//!   from the second micro-batch on (the share's reduce-scatter output is the reduction buffer).
//! - the **explorer's weights**: sampling from a dataset (not an experiences file) loads a second
//!   copy of the policy (`P·b`) whatever `sync.offset`; with `sync.offset ≥ 1` the explorer runs on
//!   its own thread and one more copy is in flight at each weight sync.
//! - the **reference model** `P·b` when the algorithm has a KL term.
//! - **activations** per micro-batch row of `T` tokens: every tensor the training forward keeps for
//!   the backward, counted op by op from `rlvr_model::model` (rms-norms computed in f32, q/k/v,
//!   rotary, the `[heads, T, T]` attention scores and softmax in f32, o-projection, SiLU MLP), plus
//!   one layer of backward working set; with activation checkpointing only each layer's input is
//!   kept and one layer is recomputed at a time. With the prompt shared (`train.share_prompt`)
//!   each completion row also keeps, per layer, its gathered copy of the prompt's keys and values
//!   and that copy joined to its own ([`Shape::shared_kv_bytes_per_row_layer`]).
//! - the **logits buffer**: on the CPU in f32 the fused head keeps the `[N, V]` logits up to
//!   512 MiB (`rlvr_model::STASH_MAX_BYTES`); elsewhere the chunked head holds a few
//!   `[N, C]` chunks (`rlvr_model::chunked::CHUNK_ELEMS` logits each on the CPU, `CHUNK_ELEMS_GPU` on a GPU).
//! - the native sampler's **KV cache**: `rollout.max_batch_rows × T × layers × 2 × kv_heads ×
//!   head_dim × b`, and beside it, while a wave's prompts are prefilled, the **prefill scores**:
//!   eager attention materialises `[P, heads, L, L]` scores (f32), probabilities (f32) and their
//!   cast (b) for the wave's P = ⌈rows / K⌉ prompts of L tokens (with `[env]` and more than one
//!   turn: every row's whole context, as a later turn without a turn-cache entry prefills it); the
//!   fused attention, which runs the prefill too, none.
//! - **LoRA** (`model.lora_rank` ≥ 1): the base weights `P·b` are frozen (no masters, gradients or
//!   moments); the adapters' `A` (P_a parameters in f32) get the f32 gradient sum, one
//!   micro-batch's gradients and two moments; the explorer copies the adapters only (it shares
//!   the base), the KL reference is the shared base (nothing extra); each adapted projection adds
//!   its `x·Aᵀ`, `·Bᵀ`, scale and f32 sum to the activations; the head computes no `∂W`.
//! - a constant **process overhead** (runtime, tokenizer, allocator; [`CPU_OVERHEAD`]); on a GPU the
//!   CUDA context ([`GPU_OVERHEAD`]).

use std::io::Write;

use anyhow::{bail, Context};
use rlvr_model::{ComputeDtype, DeviceSpec, FusedOp, LoraConfig, LoraTarget, ModelConfig};
use serde::Serialize;

use super::RawConfig;

/// Constant process overhead on the CPU (bytes). Checked on a 108 M-parameter step (BENCHMARKS.md,
/// "Memory"): the measured peak RSS less the other components was 61 MiB (f32) and 100 MiB (bf16),
/// so with this constant the estimate is 13% and 9% above the measured peak.
pub const CPU_OVERHEAD: u64 = 300 << 20;
/// Constant overhead on a GPU (bytes): the CUDA context and allocator slack.
pub const GPU_OVERHEAD: u64 = 1 << 30;
/// The largest figure a plan computes, in bytes (2⁵⁶, 64 PiB): a plan past it is refused, so that
/// sums of a dozen such figures stay inside `u64`.
pub const MAX_PLAN_BYTES: u64 = 1 << 56;
/// The most data-parallel ranks a plan is made for (`--world-size`).
pub const MAX_WORLD: u64 = 1 << 20;
/// Prompt tokens assumed when the config sets no `data.max_prompt_len` and the train split's
/// prompts cannot be read ([`PromptSource::Assumed`]).
pub const DEFAULT_PROMPT_TOKENS: usize = 256;

/// Where a plan's prompt length comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum PromptSource {
    /// `data.max_prompt_len`: longer prompts are dropped, so no row's prompt is longer.
    Config,
    /// The train split's longest prompt, rendered and tokenized as the run does
    /// ([`super::prompt_scan`]).
    Dataset(super::prompt_scan::LongestPrompt),
    /// [`DEFAULT_PROMPT_TOKENS`], assumed: `why` says why no prompt was read.
    Assumed {
        /// Why the train split was not read (a plan of the config alone, an offline run, no
        /// tokenizer, an unreadable file).
        why: String,
    },
}

/// `raw` with `data.max_prompt_len` set to the prompt length a plan should count, and where that
/// length comes from: the config's `data.max_prompt_len` when set; else the train split's longest
/// prompt ([`super::prompt_scan::longest_train_prompt`]: the data and the tokenizer of
/// `model.path`, no weights); else, when that cannot be read, [`DEFAULT_PROMPT_TOKENS`] with the
/// reason. Setting `data.max_prompt_len` to the longest prompt drops none, so the returned config
/// plans the same run.
pub fn with_data_prompt_len(raw: &RawConfig) -> (RawConfig, PromptSource) {
    let mut planned = raw.clone();
    if raw.data.max_prompt_len.is_some() {
        return (planned, PromptSource::Config);
    }
    match super::prompt_scan::longest_train_prompt(raw) {
        Ok(longest) => {
            planned.data.max_prompt_len = Some((longest.tokens as usize).max(1));
            (planned, PromptSource::Dataset(longest))
        }
        Err(e) => (
            planned,
            PromptSource::Assumed {
                why: format!("{e:#}"),
            },
        ),
    }
}

/// The model's shape, from config.json.
#[derive(Debug, Clone, Serialize)]
pub struct Shape {
    /// Trainable parameters (as `Model::named_vars` lists them; a tied head counted once).
    pub params: u64,
    /// Vocabulary entries (`vocab_size`).
    pub vocab: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Decoder layers.
    pub layers: u64,
    /// Attention (query) heads.
    pub heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Per-head width.
    pub head_dim: u64,
    /// MLP width.
    pub intermediate: u64,
    /// Whether the lm_head is the embedding.
    pub tied: bool,
    qkv_bias: bool,
    o_bias: bool,
    mlp_bias: bool,
    qk_norm: bool,
    /// What `all-linear` LoRA targets mean (phi3: the fused `qkv_proj` and `gate_up_proj`).
    arch: rlvr_model::Arch,
}

impl Shape {
    /// The shape and parameter count of `c` (as `Model::named_vars` lists them).
    pub fn of(c: &ModelConfig) -> Self {
        let (h, q, kv, i) = (
            c.hidden_size as u64,
            (c.num_attention_heads * c.head_dim) as u64,
            (c.num_key_value_heads * c.head_dim) as u64,
            c.intermediate_size as u64,
        );
        let qk_norm = c.arch == rlvr_model::Arch::Qwen3;
        let mut layer = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * i;
        if c.qkv_bias {
            layer += q + 2 * kv;
        }
        if c.o_bias {
            layer += h;
        }
        if c.mlp_bias {
            layer += 2 * i + h;
        }
        if qk_norm {
            layer += 2 * c.head_dim as u64;
        }
        let v = c.vocab_size as u64;
        let embed = v * h * if c.tie_word_embeddings { 1 } else { 2 };
        Self {
            params: embed + c.num_hidden_layers as u64 * layer + h,
            vocab: v,
            hidden: h,
            layers: c.num_hidden_layers as u64,
            heads: c.num_attention_heads as u64,
            kv_heads: c.num_key_value_heads as u64,
            head_dim: c.head_dim as u64,
            intermediate: i,
            tied: c.tie_word_embeddings,
            qkv_bias: c.qkv_bias,
            o_bias: c.o_bias,
            mlp_bias: c.mlp_bias,
            qk_norm,
            arch: c.arch,
        }
    }

    /// Elements of each parameter tensor (full fine-tuning; `Model::named_vars`' tensors, in no
    /// particular order): what ZeRO-1 assigns to owners. They sum to [`Shape::params`].
    pub fn param_sizes(&self) -> Vec<u64> {
        let (h, q, kv, i) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        );
        let mut layer = vec![h, h, h * q, h * kv, h * kv, q * h, h * i, h * i, i * h];
        if self.qkv_bias {
            layer.extend([q, kv, kv]);
        }
        if self.o_bias {
            layer.push(h);
        }
        if self.mlp_bias {
            layer.extend([i, i, h]);
        }
        if self.qk_norm {
            layer.extend([self.head_dim, self.head_dim]);
        }
        let mut out = vec![self.vocab * h, h];
        if !self.tied {
            out.push(self.vocab * h);
        }
        for _ in 0..self.layers {
            out.extend_from_slice(&layer);
        }
        out
    }

    /// The (in, out) widths of projection `t`.
    fn dims(&self, t: LoraTarget) -> (u64, u64) {
        let (h, q, kv, i) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        );
        match t {
            LoraTarget::Q => (h, q),
            LoraTarget::K | LoraTarget::V => (h, kv),
            LoraTarget::O => (q, h),
            LoraTarget::Gate | LoraTarget::Up => (h, i),
            LoraTarget::Down => (i, h),
            LoraTarget::Qkv => (h, q + 2 * kv),
            LoraTarget::GateUp => (h, 2 * i),
            // Expanded by `Shape::lora_targets` before this is asked.
            LoraTarget::AllLinear => (0, 0),
        }
    }

    /// `lora`'s targets with `all-linear` as this architecture's projections.
    fn lora_targets(&self, lora: &LoraConfig) -> Vec<LoraTarget> {
        match lora.targets.contains(&LoraTarget::AllLinear) {
            true => LoraTarget::all_linear(self.arch).to_vec(),
            false => lora.targets.clone(),
        }
    }

    /// LoRA adapter parameters: `r·(in + out)` per adapted projection and layer (as
    /// `Model::named_vars` lists them with adapters attached).
    pub fn adapter_params(&self, lora: &LoraConfig) -> u64 {
        let r = lora.rank as u64;
        let per_layer: u64 = (self.lora_targets(lora).iter())
            .map(|&t| {
                let (i, o) = self.dims(t);
                r * (i + o)
            })
            .sum();
        self.layers * per_layer
    }

    /// Bytes the adapters add per token and layer to what the backward keeps (compute dtype of
    /// `b` bytes, adapters in f32): the input cast to f32 (below f32), `x·Aᵀ`, `·Bᵀ`, the scaled
    /// update, the base output in f32, their sum, and the sum cast back.
    pub fn adapter_bytes_per_token(&self, lora: &LoraConfig, b: u64) -> u64 {
        let a = b.max(4);
        let r = lora.rank as u64;
        (self.lora_targets(lora).iter())
            .map(|&t| {
                let (i, o) = self.dims(t);
                (if b < 4 { i * a } else { 0 }) + r * a + o * (4 * a + b)
            })
            .sum()
    }

    /// Bytes one eager-attention layer of the shared-prefix forward (`train.share_prompt`,
    /// `rlvr_model`'s `attend_shared`) keeps per completion row beyond
    /// [`Shape::layer_bytes_per_token`]'s per position, compute dtype of `b` bytes, for a prompt
    /// of `prompt` tokens and a completion of `completion`: the row's gathered copy of its
    /// prompt's keys and values (`[kv_heads, prompt, head_dim]` each, `index_select`), and the
    /// keys and values the row attends to, that copy joined to its own (`cat`: `[kv_heads,
    /// prompt + completion, head_dim]` each). Before 2026-12-07 (later) the plan counted the
    /// first only.
    pub fn shared_kv_bytes_per_row_layer(&self, b: u64, prompt: u64, completion: u64) -> u64 {
        (2 * prompt + completion) * 2 * self.kv_heads * self.head_dim * b
    }

    /// Bytes one layer keeps for the backward per token of a `t`-token row, compute dtype of
    /// `b` bytes (reductions in f32, or f64 when b = 8), with eager attention (the `[heads, T, T]`
    /// scores kept): [`Shape::layer_bytes_per_token_with`] at [`AttentionPath::Eager`].
    pub fn layer_bytes_per_token(&self, b: u64, t: u64) -> u64 {
        self.layer_bytes_per_token_with(b, t, AttentionPath::Eager)
    }

    /// Bytes one layer keeps for the backward per token of a `t`-token row, compute dtype of
    /// `b` bytes, with attention computed by `attention`: eager attention keeps the scores and
    /// their softmax (`heads × T` values per token, several copies); the fused kernels
    /// (`kernels.attention`) keep only their output and the log-sum-exp per head (f32).
    pub fn layer_bytes_per_token_with(&self, b: u64, t: u64, attention: AttentionPath) -> u64 {
        let a = b.max(4);
        let (h, q, kv, i, nh) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
            self.heads,
        );
        let up = |n: u64| if b == a { 0 } else { n };
        // rms-norm: x², x/rms (f32), times w; below f32 also x in f32 and x/rms back in b.
        let norm = |n: u64| 3 * n * a + up(2 * n * b);
        let mut bytes = 2 * norm(h);
        // q, k, v projections (+ bias adds).
        bytes += (q + 2 * kv) * b * if self.qkv_bias { 2 } else { 1 };
        if self.qk_norm {
            bytes += norm(q) + norm(kv);
        }
        // Rotary on q and k (x·cos, −x₂, cat, ·sin, sum) and the [heads, T, d] copies of q, k, v;
        // each of the two rotations also keeps its cos and sin rows as leaf copies and their
        // gradients (`rlvr_model::ops::constant_operand`: 8 · head_dim values a token).
        bytes += (11 * q + 13 * kv) * b / 2 + 8 * self.head_dim * b;
        bytes += match attention {
            // Scores, scaled, (to f32), + mask, − max, exp, / sum, (back to b): per query
            // token; the mask's row (T keys) and the row maxima (one per head) as leaf copies,
            // with their gradients (`rlvr_model::ops::constant_operand`); then p·v and its
            // [T, heads·d] copy.
            AttentionPath::Eager => {
                nh * t * (2 * b + 4 * a + up(a + b)) + 2 * t * a + 2 * nh * a + 2 * q * b
            }
            // The kernel's output [T, heads, d] (read as [T, heads·d] without a copy) and its
            // log-sum-exp per head in f32, kept for the backward.
            AttentionPath::Fused => q * b + nh * 4,
        };
        // o-projection, residual.
        bytes += 2 * h * b;
        // gate, silu, up, gate·up, down, residual.
        bytes += 4 * i * b + 2 * h * b;
        bytes
    }
}

/// How a plan counts attention's activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionPath {
    /// The candle composition: the `[heads, T, T]` scores and softmax are kept.
    Eager,
    /// The fused kernels (`kernels.attention` on a GPU): no score tensor exists.
    Fused,
}

/// Everything `rlvr plan` reports, in bytes.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// `model.path`.
    pub model: String,
    /// The model's shape.
    pub shape: Shape,
    /// `model.dtype`.
    pub dtype: String,
    /// `model.device`.
    pub device: String,
    /// Prompt tokens per row (`data.max_prompt_len`, or [`DEFAULT_PROMPT_TOKENS`]; `rlvr plan`
    /// sets the train split's longest prompt first, [`with_data_prompt_len`]).
    pub prompt_tokens: u64,
    /// Where [`Plan::prompt_tokens`] comes from.
    pub prompt_source: PromptSource,
    /// Completion tokens per row: `rollout.max_new_tokens`, or with `[env]` a whole episode's
    /// turns and bridges (`env.max_episode_tokens`; unset, `env.max_turns` ×
    /// `rollout.max_new_tokens` + (`env.max_turns` − 1) × `env.max_observation_tokens`).
    pub completion_tokens: u64,
    /// `env.max_turns` of a multi-turn run (`None`: single-turn).
    pub max_turns: Option<u64>,
    /// LoRA rank (`model.lora_rank`; 0 = full fine-tuning).
    pub lora_rank: u64,
    /// Trainable LoRA adapter parameters (0 without LoRA).
    pub adapter_params: u64,
    /// Policy weights in the compute dtype (with LoRA: the frozen base plus the f32 adapters).
    pub weights: u64,
    /// The optimizer's f32 master weights (16-bit dtypes only).
    pub master_weights: u64,
    /// The f32 gradient sum plus one micro-batch's gradients in the compute dtype and the
    /// embedding's gradient summed anew at the end of its backward (`V·H·b`, full fine-tuning);
    /// when an update is one micro-batch, the larger of its backward's end and its f32 copy
    /// (f32: its gradients are the sum).
    pub gradients: u64,
    /// Micro-batches per optimizer update on this rank at most (this rank's rows of one update:
    /// ⌈groups per update / ranks⌉ groups of K rows, over the micro-batch rows).
    pub micro_batches_per_update: u64,
    /// AdamW's two f32 moments (this rank's share under ZeRO-1).
    pub adamw_moments: u64,
    /// Data-parallel ranks the plan is for (`--world-size`); every figure is per rank.
    pub world_size: u64,
    /// ZeRO stage (`--zero`, else `distributed.zero`): 1 shards the masters and moments, 2 the
    /// f32 gradient sum too.
    pub zero: u8,
    /// Trained parameters whose optimizer state (and under ZeRO-2 gradient sum) this rank keeps:
    /// all of them, or under ZeRO-1 and 2 the most-loaded rank's share (owners by whole parameters, as `rlvr_dist::zero::assign_owners`).
    pub optimizer_params_per_rank: u64,
    /// World size > 1: the reduction's transient f32 (one all-reduce bucket of at most 256 MiB;
    /// ZeRO-1 and 2: one reduce-scatter bucket of at most 64 MiB plus this rank's reduced share).
    pub reduction_buffer: u64,
    /// The explorer's copies of the weights (sampling from a dataset; one more with `sync.offset ≥ 1`).
    pub explorer_weights: u64,
    /// The reference model's weights (KL on).
    pub reference_model: u64,
    /// How attention's activations are counted: `fused` when `kernels.attention` would run the
    /// fused kernels on the GPU planned for (`rlvr_model::KernelSwitches::runs_on_gpu`), else
    /// `eager`. A CPU plan is always eager.
    pub attention: AttentionPath,
    /// Activations kept for the backward per micro-batch row of prompt + completion tokens
    /// (the unshared forward: every row computes its prompt).
    pub activations_per_row: u64,
    /// The same with activation checkpointing (each layer's input kept, one layer recomputed).
    pub activations_per_row_checkpointed: u64,
    /// The log-prob head's logits memory (fused CPU stash, or the chunked head's chunks).
    pub logits_buffer: u64,
    /// The native sampler's KV cache for `kv_cache_rows` rows.
    pub kv_cache: u64,
    /// `rollout.max_batch_rows`.
    pub kv_cache_rows: u64,
    /// The prefill's attention scores at `kv_cache_rows` rows (module docs; 0 with fused
    /// attention): transient, counted in the sampling peak beside the KV cache.
    pub prefill_scores: u64,
    /// Constant process overhead ([`CPU_OVERHEAD`] or [`GPU_OVERHEAD`]).
    pub overhead: u64,
    /// Rows per micro-batch in the config (from `train.micro_batch_tokens` when set).
    pub micro_batch_rows: u64,
    /// `train.share_prompt`: a micro-batch computes each group's prompt once.
    pub share_prompt: bool,
    /// `rollout.group_size` K (completions sharing one prompt).
    pub group_size: u64,
    /// Decoder positions of one micro-batch of `micro_batch_rows` rows: ⌈rows / K⌉ prompts plus
    /// rows × completion tokens when the prompt is shared, rows × (prompt + completion) otherwise.
    pub micro_batch_positions: u64,
    /// Activations kept for the backward by that micro-batch, with this config's
    /// `train.gradient_checkpointing` (shared: per position as [`Plan::activations_per_row`]'s,
    /// plus each completion row's gathered copy of its prompt's keys and values and that copy
    /// joined to its own per layer, [`Shape::shared_kv_bytes_per_row_layer`]).
    pub activations_per_micro_batch: u64,
    /// Peak of a training step at that micro-batch (with the KV cache when the explorer runs
    /// concurrently, `sync.offset ≥ 1`).
    pub train_peak: u64,
    /// Peak while sampling (inline explorer: no activations or gradients alive).
    pub rollout_peak: u64,
    /// The memory to fit, when given.
    pub memory: Option<u64>,
    /// Whether both peaks fit that memory.
    pub fits: Option<bool>,
    /// Largest micro-batch rows that fit (without checkpointing).
    pub max_micro_batch_rows: Option<u64>,
    /// Decoder positions of that largest micro-batch (the `train.micro_batch_tokens` to set).
    pub max_micro_batch_tokens: Option<u64>,
    /// Largest micro-batch rows with activation checkpointing.
    pub max_micro_batch_rows_checkpointed: Option<u64>,
    /// Largest `rollout.max_batch_rows` whose KV cache fits.
    pub max_rollout_rows: Option<u64>,
}

/// Parses a memory size: a number with an optional unit B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB
/// (all powers of 1024).
///
/// # Errors
/// No number, an unknown unit.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num
        .parse()
        .with_context(|| format!("memory size {s:?}: expected e.g. 80GB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => bail!("memory size {s:?}: unknown unit {u:?}"),
    };
    Ok((x * mult as f64) as u64)
}

/// The plan of a raw config (its model's config.json is read; nothing else).
///
/// # Errors
/// A missing or malformed config.json, an unknown dtype.
pub fn plan(raw: &RawConfig, needs_reference: bool, memory: Option<u64>) -> anyhow::Result<Plan> {
    plan_ranks(raw, needs_reference, memory, 1, raw.distributed.zero)
}

/// [`plan`] per rank of a data-parallel run of `world` ranks with ZeRO stage `zero` (0, 1 or 2).
/// `model.device`/`model.dtype = "auto"` are planned as a GPU run (`cuda`, bf16) whatever this
/// machine has ([`super::ModelSection::assume_gpu`]):
/// each rank holds the weights, its explorer's copy, the gradient and the activations of its
/// micro-batches as one process does; ZeRO-1 divides the masters and moments by whole
/// parameters (the most-loaded rank's share is reported), ZeRO-2 the f32 gradient sum too; a
/// world above 1 adds the reduction's f32 gradient buffer.
///
/// # Errors
/// As [`plan`]; a world size of 0 or a ZeRO stage above 2.
pub fn plan_ranks(
    raw: &RawConfig,
    needs_reference: bool,
    memory: Option<u64>,
    world: u64,
    zero: u8,
) -> anyhow::Result<Plan> {
    anyhow::ensure!(world >= 1, "--world-size must be at least 1");
    anyhow::ensure!(zero <= 2, "--zero {zero}: expected 0, 1 or 2");
    anyhow::ensure!(
        world <= MAX_WORLD,
        "--world-size {world}: at most {MAX_WORLD} ranks can be planned"
    );
    let mut gpu = raw.clone();
    gpu.model.assume_gpu();
    let raw = &gpu;
    let cfg_path = raw.model.path.join("config.json");
    let mc = ModelConfig::from_file(&cfg_path).with_context(|| {
        match crate::store::hub::missing_model_hint(&raw.model.path) {
            Some(hint) => format!("model.path {hint}"),
            None => format!(
                "model.path {} has no readable config.json (rlvr plan reads the model's shape \
                 from it, no weights needed; configs/shapes/ holds Qwen2.5's): pass --set \
                 model.path=DIR",
                raw.model.path.display()
            ),
        }
    })?;
    let shape = Shape::of(&mc);
    let b: u64 = match raw.model.dtype {
        ComputeDtype::Bf16 | ComputeDtype::F16 | ComputeDtype::Auto => 2,
        ComputeDtype::F32 => 4,
        ComputeDtype::F64 => 8,
    };
    let cpu = raw.model.device == DeviceSpec::Cpu;
    let dtype = match raw.model.dtype {
        ComputeDtype::Bf16 | ComputeDtype::Auto => candle_core::DType::BF16,
        ComputeDtype::F16 => candle_core::DType::F16,
        ComputeDtype::F32 => candle_core::DType::F32,
        ComputeDtype::F64 => candle_core::DType::F64,
    };
    let attention = match !cpu && (raw.kernels).runs_on_gpu(FusedOp::Attention, &mc, dtype) {
        true => AttentionPath::Fused,
        false => AttentionPath::Eager,
    };
    let p = shape.params;
    let prompt = raw.data.max_prompt_len.unwrap_or(DEFAULT_PROMPT_TOKENS) as u64;
    // A multi-turn episode is one row: its turns and bridges together, at most
    // env.max_episode_tokens (by default max_turns × max_new_tokens plus the bridges), and its
    // last turn's context (prompt + episode) is what the sampler's cache holds.
    let completion = match raw.env.is_on() {
        true => raw.env.episode_tokens(raw.rollout.max_new_tokens) as u64,
        false => raw.rollout.max_new_tokens as u64,
    };
    let max_turns = raw.env.is_on().then_some(u64::from(raw.env.max_turns));
    let t = prompt + completion;
    let online = raw.data.experiences.is_none();
    let threaded = online && raw.sync.offset >= 1;
    let lora = raw.model.lora();
    let adapter_params = lora.as_ref().map_or(0, |l| shape.adapter_params(l));
    // Trainable parameters and their bytes: the adapters in f32 with LoRA, else every weight.
    let (trained, tb) = match lora {
        Some(_) => (adapter_params, 4),
        None => (p, b),
    };
    let weights = p * b
        + if lora.is_some() {
            adapter_params * 4
        } else {
            0
        };
    // ZeRO-1 and 2: this rank's share of the optimizer state (the most-loaded owner's).
    let owned = if zero >= 1 && world > 1 {
        match lora {
            Some(_) => trained.div_ceil(world),
            None => {
                let sizes: Vec<usize> = shape.param_sizes().iter().map(|&n| n as usize).collect();
                let owners = rlvr_dist::zero::assign_owners(&sizes, world as usize);
                rlvr_dist::zero::owned_elements(&sizes, &owners, world as usize)
                    .into_iter()
                    .max()
                    .unwrap_or(0) as u64
            }
        }
    } else {
        trained
    };
    let master_weights = if tb == 2 { owned * 4 } else { 0 };
    let adamw_moments = 2 * owned * 4;
    // The reduction's transient f32: one all-reduce bucket (ZeRO-0), or one reduce-scatter bucket
    // plus this rank's reduced share (ZeRO-1).
    let reduction_buffer = match (world > 1, zero) {
        (false, _) => 0,
        (true, 0) => (trained * 4).min((rlvr_dist::reduce::DEFAULT_BUCKET_MB as u64) << 20),
        (true, _) => {
            owned * 4 + (trained * 4).min((rlvr_dist::zero::DEFAULT_BUCKET_MB as u64) << 20)
        }
    };
    // The explorer copies what trains (LoRA: the adapters; it shares the frozen base).
    let copy = trained * tb;
    let explorer_weights = (if online { copy } else { 0 }) + (if threaded { copy } else { 0 });
    // LoRA's KL reference is the shared base with the adapters off (no copy).
    let shared_ref = lora.is_some() && raw.model.reference.is_none();
    let reference_model = if needs_reference && !shared_ref {
        p * b
    } else {
        0
    };
    let layer = shape.layer_bytes_per_token_with(b, t, attention)
        + lora
            .as_ref()
            .map_or(0, |l| shape.adapter_bytes_per_token(l, b));
    // Embedding output and final norm, plus one layer of backward working set.
    let outside = shape.hidden * (b + 4 * b.max(4));
    let per_position = layer * (shape.layers + 1) + outside;
    let per_position_checkpointed = shape.hidden * b * shape.layers + 2 * layer + outside;
    // Every figure below is a u64 count of bytes. Each size is bounded (config.json's by
    // rlvr_model::config::MAX_SIZES, the run's by its keys' ranges), but their products need not
    // be: the largest products are estimated in f64 first and a plan past MAX_PLAN_BYTES is
    // refused by name, so that nothing below wraps or overflows.
    let (tf, ppf) = (
        t as f64,
        per_position as f64 + per_position_checkpointed as f64,
    );
    let rows_bound = raw
        .train
        .micro_batch_tokens
        .map_or(raw.train.micro_batch_size as f64, |tok| tok as f64)
        .max(1.0);
    let kv_per_row_f = tf * (shape.layers * 2 * shape.kv_heads * shape.head_dim * b) as f64;
    let products = [
        ("the activations of one row", tf * ppf),
        (
            "the activations of one micro-batch",
            rows_bound
                * (tf * ppf
                    + shape.shared_kv_bytes_per_row_layer(b, prompt, completion) as f64
                        * (shape.layers + 1) as f64),
        ),
        (
            "the sampler's KV cache",
            (raw.rollout.max_batch_rows as f64).max(1.0) * kv_per_row_f,
        ),
        (
            "the prefill's attention scores",
            (raw.rollout.max_batch_rows as f64).max(1.0)
                * shape.heads as f64
                * tf
                * tf
                * (8 + b) as f64,
        ),
        (
            "the log-prob head's logits",
            rows_bound * completion as f64 * shape.vocab as f64 * 8.0,
        ),
        (
            "the weights and optimizer state",
            shape.params as f64 * 32.0,
        ),
    ];
    for (what, bytes) in products {
        anyhow::ensure!(
            bytes <= MAX_PLAN_BYTES as f64,
            "{what} would take {bytes:.3e} bytes (more than {} PiB): this config.json's shape \
             ({} layers, hidden {}, vocabulary {}) with rows of {t} tokens cannot be planned; \
             check config.json and the run's sizes",
            MAX_PLAN_BYTES >> 50,
            shape.layers,
            shape.hidden,
            shape.vocab
        );
    }
    // The largest rows `largest` may try below without a product passing the bound.
    let rows_cap = ((MAX_PLAN_BYTES as f64) / (tf * ppf + kv_per_row_f).max(1.0)) as u64;
    let activations_per_row = t * per_position;
    let activations_per_row_checkpointed = t * per_position_checkpointed;
    // A micro-batch holds whole groups (parts of K rows at most share one prompt): with the prompt
    // shared, ⌈rows / K⌉ prompts and rows completions run through the decoder, and each completion
    // row attends to a gathered copy of its prompt's keys and values in every layer kept.
    let share = raw.train.share_prompt;
    let k = (raw.rollout.group_size as u64).max(1);
    let positions = move |rows: u64| match share {
        true => rows.div_ceil(k) * prompt + rows * completion,
        false => rows * t,
    };
    // The fused kernels read the prompt's keys and values where they are (no gathered copy).
    let kv_gather = match attention {
        AttentionPath::Eager => shape.shared_kv_bytes_per_row_layer(b, prompt, completion),
        AttentionPath::Fused => 0,
    };
    let n_layers = shape.layers;
    let kept_with = move |rows: u64, checkpointed: bool| {
        let (per, layers_kept) = match checkpointed {
            true => (per_position_checkpointed, 2),
            false => (per_position, n_layers + 1),
        };
        positions(rows) * per
            + if share {
                rows * kv_gather * layers_kept
            } else {
                0
            }
    };
    // What a training micro-batch keeps with this config's `train.gradient_checkpointing`.
    let ck = raw.train.gradient_checkpointing;
    let kept = move |rows: u64| kept_with(rows, ck);
    let rows = match raw.train.micro_batch_tokens {
        Some(tok) => largest(|r| positions(r) <= tok as u64).max(1),
        None => raw.train.micro_batch_size as u64,
    };
    // This rank's rows of one update: whole groups, split over the mini-batches and the ranks.
    let groups =
        (raw.data.prompts_per_step as u64).div_ceil((raw.train.mini_batches as u64).max(1));
    let update_rows = groups.div_ceil(world) * k;
    let micro_batches_per_update = update_rows.div_ceil(rows.max(1)).max(1);
    // The f32 sum, and a later micro-batch's gradients beside it, the embedding's re-summed
    // copy at the end of each backward (module docs); one micro-batch: the end of its backward, or
    // the f32 copy made beside its gradients (none in f32: its gradients are the sum).
    let embedding_resum = match lora {
        Some(_) => 0,
        None => shape.vocab * shape.hidden * tb,
    };
    // ZeRO-2: one backward's gradients whole, the f32 sum this rank's share only (none to add
    // to while the first micro-batch is reduced: its reduced share, counted in the reduction
    // buffer, becomes the sum).
    let gradients = match (micro_batches_per_update, zero >= 2 && world > 1) {
        (1, false) => {
            (trained * tb + embedding_resum).max(trained * 4 + (tb != 4) as u64 * trained * tb)
        }
        (_, false) => trained * 4 + trained * tb + embedding_resum,
        (1, true) => trained * tb + embedding_resum,
        (_, true) => owned * 4 + trained * tb + embedding_resum,
    };
    let scored = rows * completion;
    let logits_buffer = if cpu && b == 4 {
        (scored * shape.vocab * 4).min(rlvr_model::STASH_MAX_BYTES as u64)
    } else {
        // A few [N, C] chunk tensors in f32, and the head's gradient chunks before their concat
        // (none for LoRA's frozen head).
        let head_grad = if lora.is_some() {
            0
        } else {
            shape.vocab * shape.hidden * b
        };
        let chunk = if cpu {
            rlvr_model::chunked::CHUNK_ELEMS
        } else {
            rlvr_model::chunked::CHUNK_ELEMS_GPU
        };
        6 * chunk as u64 * b.max(4) + head_grad
    };
    let kv_per_row = t * shape.layers * 2 * shape.kv_heads * shape.head_dim * b;
    let kv_cache_rows = raw.rollout.max_batch_rows as u64;
    let kv_cache = kv_cache_rows * kv_per_row;
    // A wave's prefill: ⌈rows / K⌉ prompts of `prompt` tokens, or with [env] every row's context
    // (prompt + episode) when a later turn is prefilled whole.
    let env = max_turns.is_some_and(|n| n > 1);
    let prefill_scores_at = move |rows: u64| match attention {
        AttentionPath::Fused => 0,
        AttentionPath::Eager => {
            let (p_n, l) = match env {
                true => (rows, t),
                false => (rows.div_ceil(k), prompt),
            };
            // Saturating: `largest` below tries row counts past any memory.
            (p_n.saturating_mul(shape.heads))
                .saturating_mul(l.saturating_mul(l))
                .saturating_mul(8 + b)
        }
    };
    let prefill_scores = prefill_scores_at(kv_cache_rows);
    let overhead = if cpu { CPU_OVERHEAD } else { GPU_OVERHEAD };
    let resident = weights + master_weights + adamw_moments + explorer_weights + reference_model;
    let train_fixed = resident
        + gradients
        + reduction_buffer
        + logits_buffer
        + overhead
        + threaded as u64 * kv_cache;
    let activations_per_micro_batch = kept(rows);
    let train_peak = train_fixed + activations_per_micro_batch;
    let rollout_peak = resident
        + kv_cache
        + prefill_scores
        + overhead
        + if threaded {
            gradients + logits_buffer + activations_per_micro_batch
        } else {
            0
        };
    let (mut fits, mut max_rows, mut max_tokens, mut max_rows_ck, mut max_roll) =
        (None, None, None, None, None);
    if let Some(m) = memory {
        fits = Some(train_peak.max(rollout_peak) <= m);
        let free = m.saturating_sub(train_fixed);
        let r = largest(|r| r <= rows_cap && kept_with(r, false) <= free);
        max_rows = Some(r);
        max_tokens = Some(positions(r));
        max_rows_ck = Some(largest(|r| r <= rows_cap && kept_with(r, true) <= free));
        let roll_fixed = resident
            + overhead
            + if threaded {
                gradients + logits_buffer + activations_per_micro_batch
            } else {
                0
            };
        let room = m.saturating_sub(roll_fixed);
        max_roll = Some(largest(|r| {
            r.checked_mul(kv_per_row)
                .and_then(|kv| kv.checked_add(prefill_scores_at(r)))
                .is_some_and(|need| need <= room)
        }));
    }
    Ok(Plan {
        model: raw.model.path.display().to_string(),
        shape,
        dtype: raw.model.dtype.to_string(),
        device: raw.model.device.to_string(),
        prompt_tokens: prompt,
        prompt_source: match raw.data.max_prompt_len {
            Some(_) => PromptSource::Config,
            None => PromptSource::Assumed {
                why: "data.max_prompt_len is unset and no prompt was read (a plan of the config \
                      alone)"
                    .into(),
            },
        },
        completion_tokens: completion,
        max_turns,
        lora_rank: raw.model.lora_rank as u64,
        adapter_params,
        weights,
        master_weights,
        gradients,
        micro_batches_per_update,
        adamw_moments,
        world_size: world,
        zero,
        optimizer_params_per_rank: owned,
        reduction_buffer,
        explorer_weights,
        reference_model,
        attention,
        activations_per_row,
        activations_per_row_checkpointed,
        logits_buffer,
        kv_cache,
        kv_cache_rows,
        prefill_scores,
        overhead,
        micro_batch_rows: rows,
        share_prompt: share,
        group_size: k,
        micro_batch_positions: positions(rows),
        activations_per_micro_batch,
        train_peak,
        rollout_peak,
        memory,
        fits,
        max_micro_batch_rows: max_rows,
        max_micro_batch_tokens: max_tokens,
        max_micro_batch_rows_checkpointed: max_rows_ck,
        max_rollout_rows: max_roll,
    })
}

/// The bytes `rlvr plan`'s accounting gives one training step of `rows` rows of `seq` tokens,
/// every position scored, on a GPU (`gpu`) or the CPU, in `dtype`, with attention counted as
/// `attention`: the weights, the f32 master weights (16-bit dtypes), one backward's gradients in
/// the compute dtype, AdamW's two f32 moments, the activations ([`Shape::layer_bytes_per_token_with`]
/// for every layer plus one of backward working set, the embedding and the final norm), the
/// log-prob head's logits (the CPU's f32 stash, else a few chunks and the head's gradient) and
/// the process overhead. What `rlvr bench train` runs (no explorer, reference, KV cache or f32
/// gradient sum), so that its measured peak can be set beside the plan's estimate.
pub fn step_bytes(
    mc: &ModelConfig,
    dtype: candle_core::DType,
    gpu: bool,
    rows: u64,
    seq: u64,
    attention: AttentionPath,
) -> u64 {
    let shape = Shape::of(mc);
    let b = dtype.size_in_bytes() as u64;
    let p = shape.params;
    let masters = if b == 2 { 4 * p } else { 0 };
    let layer = shape.layer_bytes_per_token_with(b, seq, attention);
    let outside = shape.hidden * (b + 4 * b.max(4));
    let activations = rows * seq * (layer * (shape.layers + 1) + outside);
    let scored = rows * (seq - 1).max(1);
    let logits = if !gpu && b == 4 {
        (scored * shape.vocab * 4).min(rlvr_model::STASH_MAX_BYTES as u64)
    } else {
        let chunk = match gpu {
            true => rlvr_model::chunked::CHUNK_ELEMS_GPU,
            false => rlvr_model::chunked::CHUNK_ELEMS,
        };
        6 * chunk as u64 * b.max(4) + shape.vocab * shape.hidden * b
    };
    let overhead = if gpu { GPU_OVERHEAD } else { CPU_OVERHEAD };
    p * b + masters + p * b + 8 * p + activations + logits + overhead
}

/// One change [`suggestions`] tries: its `--set` text and what it does to the config.
type Change<'a> = (&'a str, &'a dyn Fn(&mut RawConfig));

/// When a plan does not fit `memory`: the changes, alone or together, that make it fit (each as
/// the `--set` keys to use), tried in this order: ZeRO-1 then ZeRO-2 (world size > 1; ZeRO-2
/// only where ZeRO-1 does not fit, and only above the plan's stage), activation checkpointing,
/// with ZeRO-1 or 2, one row per micro-batch with checkpointing, LoRA rank 16 (with ZeRO and
/// checkpointing as the plan has them), LoRA with checkpointing. Empty when it fits or nothing
/// listed fits.
///
/// # Errors
/// As [`plan_ranks`].
pub fn suggestions(
    raw: &RawConfig,
    needs_reference: bool,
    memory: u64,
    world: u64,
    zero: u8,
) -> anyhow::Result<Vec<String>> {
    let fits = |sets: &[Change], z: u8| -> anyhow::Result<bool> {
        let mut r = raw.clone();
        for (_, f) in sets {
            f(&mut r);
        }
        Ok(plan_ranks(&r, needs_reference, Some(memory), world, z)?.fits == Some(true))
    };
    if fits(&[], zero)? {
        return Ok(Vec::new());
    }
    let ck: Change = ("train.gradient_checkpointing=true", &|r: &mut RawConfig| {
        r.train.gradient_checkpointing = true
    });
    let mb1: Change = ("train.micro_batch_size=1", &|r: &mut RawConfig| {
        r.train.micro_batch_size = 1;
        r.train.micro_batch_tokens = None;
    });
    let lora: Change = ("model.lora_rank=16", &|r: &mut RawConfig| {
        r.model.lora_rank = 16
    });
    let mut tries: Vec<(Vec<Change>, u8)> = Vec::new();
    // The higher stages to try (world size > 1): ZeRO-1 then ZeRO-2.
    let higher: Vec<u8> = match world > 1 {
        true => ((zero + 1)..=2).collect(),
        false => Vec::new(),
    };
    tries.extend(higher.iter().map(|&z| (vec![], z)));
    if !raw.train.gradient_checkpointing {
        tries.push((vec![ck], zero));
        tries.extend(higher.iter().map(|&z| (vec![ck], z)));
    }
    let z = if world > 1 { zero.max(1) } else { zero };
    tries.push((vec![ck, mb1], z));
    if raw.model.lora_rank == 0 {
        tries.push((vec![lora], z));
        tries.push((vec![lora, ck], z));
    }
    let mut out = Vec::new();
    // The sets that fit at a lower stage: a higher one is not listed for them.
    let mut fitted: Vec<Vec<&str>> = Vec::new();
    for (sets, z) in tries {
        let keys: Vec<&str> = sets.iter().map(|(k, _)| *k).collect();
        if z == 2 && zero < 2 && fitted.contains(&keys) {
            continue;
        }
        if fits(&sets, z)? {
            fitted.push(keys);
            let mut keys: Vec<String> = sets.iter().map(|(k, _)| k.to_string()).collect();
            if z != zero {
                keys.insert(0, format!("distributed.zero={z}"));
            }
            out.push(keys.join(" "));
        }
    }
    Ok(out)
}

/// The largest `r` below 2²⁴ with `ok(r)`, for `ok` true up to some point and false after it.
fn largest(ok: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (0u64, 1u64 << 24);
    if !ok(0) {
        return 0;
    }
    // Invariant: ok(lo), !ok(hi) (or hi past the range).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

fn gib(x: u64) -> String {
    format!("{:.2} GiB", x as f64 / (1u64 << 30) as f64)
}

fn mib(x: u64) -> String {
    format!("{:.1} MiB", x as f64 / (1u64 << 20) as f64)
}

/// What `rlvr plan`'s table says of where the prompt length comes from.
pub fn prompt_source_text(source: &PromptSource) -> String {
    match source {
        PromptSource::Config => "data.max_prompt_len (longer prompts are dropped)".into(),
        PromptSource::Dataset(l) if l.exact => format!(
            "the longest of the {} train prompts ({}), rendered and tokenized as the run does \
             (data.max_prompt_len unset)",
            l.prompts, l.source
        ),
        PromptSource::Dataset(l) => format!(
            "the longest ({}) of the {} longest in bytes of the {} train prompts, rendered and \
             tokenized as the run does: sampled, a prompt with more tokens may exist; set \
             data.max_prompt_len to bound it",
            l.source, l.tokenized, l.prompts
        ),
        PromptSource::Assumed { why } => format!(
            "{DEFAULT_PROMPT_TOKENS} assumed: data.max_prompt_len is unset and the train prompts \
             could not be read ({why})"
        ),
    }
}

/// Writes the plan as a table.
///
/// # Errors
/// I/O errors.
pub fn write_table(p: &Plan, out: &mut dyn Write) -> std::io::Result<()> {
    let s = &p.shape;
    writeln!(
        out,
        "model {}: {:.1} M parameters ({} layers, hidden {}, {} heads / {} kv heads, vocab {}{})",
        p.model,
        s.params as f64 / 1e6,
        s.layers,
        s.hidden,
        s.heads,
        s.kv_heads,
        s.vocab,
        if s.tied { ", tied" } else { "" }
    )?;
    writeln!(
        out,
        "dtype {} on {}; rows of {} prompt + {} completion tokens{}",
        p.dtype,
        p.device,
        p.prompt_tokens,
        p.completion_tokens,
        match p.max_turns {
            Some(n) => format!(" (episodes of up to {n} turns: turns and bridges together)"),
            None => String::new(),
        }
    )?;
    writeln!(
        out,
        "prompt tokens: {}",
        prompt_source_text(&p.prompt_source)
    )?;
    if p.world_size > 1 {
        writeln!(
            out,
            "per rank of {} data-parallel ranks{}",
            p.world_size,
            if p.zero >= 1 {
                format!(
                    ", ZeRO-{}: optimizer state{} of {:.1} M parameters on the most-loaded rank",
                    p.zero,
                    if p.zero >= 2 { " and gradient sum" } else { "" },
                    p.optimizer_params_per_rank as f64 / 1e6
                )
            } else {
                ", ZeRO-0: every rank holds the whole optimizer state".to_string()
            }
        )?;
    }
    if p.lora_rank > 0 {
        writeln!(
            out,
            "LoRA rank {}: {:.2} M adapter parameters train (f32); the base is frozen",
            p.lora_rank,
            p.adapter_params as f64 / 1e6
        )?;
    }
    let rows: [(&str, String); 15] = [
        ("weights", gib(p.weights)),
        ("master weights (f32)", gib(p.master_weights)),
        (
            "gradients",
            format!(
                "{} ({})",
                gib(p.gradients),
                match p.micro_batches_per_update {
                    1 => "one micro-batch per update".to_string(),
                    n if p.zero >= 2 && p.world_size > 1 => format!(
                        "{n} micro-batches per update: this rank's share of the f32 sum and one \
                         backward's"
                    ),
                    n => format!("{n} micro-batches per update: the f32 sum and one backward's"),
                }
            ),
        ),
        ("reduction buffer (f32)", gib(p.reduction_buffer)),
        ("AdamW moments (f32)", gib(p.adamw_moments)),
        ("explorer weights", gib(p.explorer_weights)),
        ("reference model (KL)", gib(p.reference_model)),
        (
            "activations per row",
            format!(
                "{} ({})",
                mib(p.activations_per_row),
                match p.attention {
                    AttentionPath::Eager => "eager attention: [heads, T, T] scores kept",
                    AttentionPath::Fused => "fused attention: no score tensors",
                }
            ),
        ),
        (
            "  with checkpointing",
            mib(p.activations_per_row_checkpointed),
        ),
        (
            "activations/micro-batch",
            format!(
                "{} ({} positions: {})",
                mib(p.activations_per_micro_batch),
                p.micro_batch_positions,
                if p.share_prompt {
                    format!("each prompt once per {} rows", p.group_size)
                } else {
                    "every row's prompt".to_string()
                }
            ),
        ),
        ("logits buffer", mib(p.logits_buffer)),
        (
            "KV cache",
            format!("{} ({} rows)", gib(p.kv_cache), p.kv_cache_rows),
        ),
        (
            "prefill scores",
            match p.attention {
                AttentionPath::Fused => "none (fused attention)".to_string(),
                AttentionPath::Eager => gib(p.prefill_scores),
            },
        ),
        ("process overhead", gib(p.overhead)),
        (
            "training step peak",
            format!(
                "{} ({} rows per micro-batch)",
                gib(p.train_peak),
                p.micro_batch_rows
            ),
        ),
    ];
    for (k, v) in rows {
        writeln!(out, "  {k:<24} {v}")?;
    }
    writeln!(out, "  {:<24} {}", "sampling peak", gib(p.rollout_peak))?;
    if let (Some(m), Some(f)) = (p.memory, p.fits) {
        writeln!(
            out,
            "in {}: this config {}; largest micro-batch {} rows ({} positions), {} rows with \
             checkpointing; largest rollout batch {} rows",
            gib(m),
            if f { "fits" } else { "does NOT fit" },
            p.max_micro_batch_rows.unwrap_or(0),
            p.max_micro_batch_tokens.unwrap_or(0),
            p.max_micro_batch_rows_checkpointed.unwrap_or(0),
            p.max_rollout_rows.unwrap_or(0)
        )?;
    }
    Ok(())
}
