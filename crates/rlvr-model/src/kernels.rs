//! The fused GPU kernels' switches (`[kernels]`, issue 44) and the model's fused-op code paths.
//!
//! [`KernelSwitches`] holds one [`Switch`] per fused op; [`crate::Model::set_kernels`] resolves it
//! against the model's device, dtype and shapes into the per-layer [`Fused`] flags:
//! - `"auto"` (the default): on for CUDA only when the op's kernel family is listed in
//!   [`rlvr_kernels::triton::GPU_VERIFIED`] (the kernels that passed `bench/gpu_check.sh` on a real
//!   GPU; BENCHMARKS.md names the run). That list is empty today, so every fused op is opt-in.
//! - `"on"`: on for CUDA. On a CPU device the CPU path is unchanged (the log says so once); a shape
//!   or dtype the kernels do not cover (head dim not 64/128, hidden size over 8192, not f32/bf16)
//!   falls back to the candle composition, also said once in the log.
//! - `"off"`: the candle composition.
//!
//! The model-level launch recorder ([`record_launches`], tests): on the CPU, with an op `"on"`,
//! the fused code path runs up to building each launch plan from the real tensors of the forward
//! and backward, writes it with the op's real inputs and, as expected outputs, the candle
//! composition's results (the forward output and the gradients candle computes), then continues
//! with the composition. `kernels/replay.py` replays the records under Triton's interpreter.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Tensor};
use rlvr_kernels::triton::families::attention::{self, Layout as AttnLayout, Seq};
use rlvr_kernels::triton::families::rmsnorm;
use rlvr_kernels::triton::{self, HostBuffer, Manifest, Recorder, Target, Tolerance};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// One fused op's switch: `"auto"`, `"on"` or `"off"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    /// On for CUDA once the kernel passed the GPU check (`rlvr_kernels::triton::GPU_VERIFIED`).
    #[default]
    Auto,
    /// On for CUDA (opt-in); a no-op on the CPU.
    On,
    /// The candle composition.
    Off,
}

impl std::fmt::Display for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Switch::Auto => "auto",
            Switch::On => "on",
            Switch::Off => "off",
        })
    }
}

/// `[kernels]`: one switch per fused GPU kernel (Triton, compiled ahead of time; issue 44), for
/// A/B runs and to fall back. Each is `"auto"`, `"on"` or `"off"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelSwitches {
    /// Fused causal GQA attention (FlashAttention-2 forward and backward over the exact lengths, shared prompts computed once; no `[heads, T, T]` scores; also the sampler's prompt prefill, which writes the keys and values into its cache): `auto`, `on` or `off`. `auto` is on for CUDA only once the kernel has passed the GPU check (`bench/gpu_check.sh`; none has yet, so it is opt-in today); `on` is a no-op on the CPU; sliding-window layers (Mistral, `use_sliding_window`, Gemma 3's local layers) launch with their window, blocks outside it skipped; head dims other than 64 and 128, dtypes other than f32/bf16 and Gemma 2 (attention softcapping) use the candle composition. Default `auto`.
    pub attention: Switch,
    /// Fused RMSNorm with the residual add (forward and backward, the weight gradient summed in a fixed order): `auto`, `on` or `off`, as `kernels.attention`; hidden sizes over 8192 use the candle composition. Default `auto`. With `on` on CUDA every norm of the model runs the kernels (the post-attention norm fused with the residual add before it), LoRA and activation checkpointing included.
    pub rms_norm: Switch,
    /// Fused rotary embedding of q and k: `auto`, `on` or `off`, as `kernels.attention` (head dims 64 and 128). Default `auto`. With `on` on CUDA every layer rotates q and k in one kernel, reading f32 tables at each token's position.
    pub rotary: Switch,
    /// Fused SwiGLU gating `silu(gate) · up`: `auto`, `on` or `off`, as `kernels.attention`. Default `auto`. With `on` on CUDA every MLP's gating and its backward run the kernels.
    pub swiglu: Switch,
    /// The log-prob head's chunk kernels (each vocabulary chunk of logits from cuBLAS, then the online log-sum-exp, target log-prob and entropy, and the gradient in place; no `[tokens, vocab]` buffer beyond one chunk): `auto`, `on` or `off`, as `kernels.attention` (f32 and bf16). Default `auto`. Not yet run on a GPU: `on` is the opt-in for the GPU check.
    pub logprob_head: Switch,
    /// One-pass AdamW (one launch per parameter tensor updating the f32 master, both moments and the bf16 copy, bit-identical to the CPU's update by design; the gradient norm from partial sums added in a fixed order): `auto`, `on` or `off`, as `kernels.attention` (f32 parameters and bf16 ones with f32 masters; others keep the candle update). Default `auto`. Not yet run on a GPU: `on` is the opt-in for the GPU check.
    pub adamw: Switch,
    /// The native sampler's fused decode step (issue 50): rotary with the write of the new key/value into the preallocated cache, split-KV decode attention combined by log-sum-exp in a fixed order (FlashDecoding), and the residual add with RMSNorm and SwiGLU of the training kernels: `auto`, `on` or `off`, as `kernels.attention` (head dims 64 and 128, up to 16 query heads per kv head, no sliding window; Qwen3's q/k norms as two more RMSNorm launches, LoRA adapters as two more cuBLAS products per adapted projection). Default `auto`. Not yet run on a GPU: `on` is the opt-in for the GPU check (`bench/gpu_check.sh`); the CPU keeps the candle step.
    pub decode: Switch,
    /// CUDA-graph replay of the sampler's fused decode step, captured once per batch-size bucket after one eager step and replayed for the bucket's other steps (a wave's batch halves to a new bucket as its rows finish) (needs `kernels.decode`): `auto`, `on` or `off`, as `kernels.attention`; `off` runs every step eagerly. Default `auto`. Not yet run on a GPU: `on` is the opt-in for the GPU check.
    pub cuda_graphs: Switch,
}

/// The fused ops, in the order of [`KernelSwitches`]' keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FusedOp {
    /// `kernels.attention`.
    Attention,
    /// `kernels.rms_norm`.
    RmsNorm,
    /// `kernels.rotary`.
    Rotary,
    /// `kernels.swiglu`.
    Swiglu,
    /// `kernels.logprob_head`.
    LogprobHead,
    /// `kernels.adamw`.
    Adamw,
    /// `kernels.decode`.
    Decode,
    /// `kernels.cuda_graphs`.
    CudaGraphs,
}

impl FusedOp {
    /// Every fused op.
    pub const ALL: [FusedOp; 8] = [
        FusedOp::Attention,
        FusedOp::RmsNorm,
        FusedOp::Rotary,
        FusedOp::Swiglu,
        FusedOp::LogprobHead,
        FusedOp::Adamw,
        FusedOp::Decode,
        FusedOp::CudaGraphs,
    ];

    /// The key under `[kernels]` (and the name `rlvr bench train --fused` takes).
    pub fn key(self) -> &'static str {
        match self {
            FusedOp::Attention => "attention",
            FusedOp::RmsNorm => "rms_norm",
            FusedOp::Rotary => "rotary",
            FusedOp::Swiglu => "swiglu",
            FusedOp::LogprobHead => "logprob_head",
            FusedOp::Adamw => "adamw",
            FusedOp::Decode => "decode",
            FusedOp::CudaGraphs => "cuda_graphs",
        }
    }

    /// The kernel family in the manifest (and in [`triton::GPU_VERIFIED`]; `cuda_graphs` is
    /// listed there under its key once the graphs passed the GPU check).
    pub fn family(self) -> &'static str {
        match self {
            FusedOp::RmsNorm => "rmsnorm",
            other => other.key(),
        }
    }

    /// Whether the model uses this op's kernels yet (the others' switches are accepted and
    /// logged, and change nothing).
    pub fn wired(self) -> bool {
        matches!(
            self,
            FusedOp::Attention
                | FusedOp::RmsNorm
                | FusedOp::Rotary
                | FusedOp::Swiglu
                | FusedOp::LogprobHead
                | FusedOp::Adamw
                | FusedOp::Decode
                | FusedOp::CudaGraphs
        )
    }
}

impl KernelSwitches {
    /// Every switch set to `s`.
    pub fn all(s: Switch) -> Self {
        let mut k = Self::default();
        for op in FusedOp::ALL {
            k.set(op, s);
        }
        k
    }

    /// The switch of `op`.
    pub fn get(&self, op: FusedOp) -> Switch {
        match op {
            FusedOp::Attention => self.attention,
            FusedOp::RmsNorm => self.rms_norm,
            FusedOp::Rotary => self.rotary,
            FusedOp::Swiglu => self.swiglu,
            FusedOp::LogprobHead => self.logprob_head,
            FusedOp::Adamw => self.adamw,
            FusedOp::Decode => self.decode,
            FusedOp::CudaGraphs => self.cuda_graphs,
        }
    }

    /// Sets the switch of `op`.
    pub fn set(&mut self, op: FusedOp, s: Switch) {
        *match op {
            FusedOp::Attention => &mut self.attention,
            FusedOp::RmsNorm => &mut self.rms_norm,
            FusedOp::Rotary => &mut self.rotary,
            FusedOp::Swiglu => &mut self.swiglu,
            FusedOp::LogprobHead => &mut self.logprob_head,
            FusedOp::Adamw => &mut self.adamw,
            FusedOp::Decode => &mut self.decode,
            FusedOp::CudaGraphs => &mut self.cuda_graphs,
        } = s;
    }

    /// The switches `rlvr bench train --fused LIST` means: `all` (every op on), `none` (every op
    /// off), or a comma-separated list of keys (`attention,rms_norm`: those on, the rest off).
    ///
    /// Errors: an unknown op name (the message lists the known ones).
    pub fn from_fused_list(list: &str) -> Result<Self> {
        match list.trim() {
            "all" => return Ok(Self::all(Switch::On)),
            "none" | "" => return Ok(Self::all(Switch::Off)),
            _ => {}
        }
        let mut k = Self::all(Switch::Off);
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let Some(op) = FusedOp::ALL.iter().find(|o| o.key() == name) else {
                let known: Vec<_> = FusedOp::ALL.iter().map(|o| o.key()).collect();
                return Err(ModelError::Invalid(format!(
                    "--fused {name}: not a fused op (all, none, or a comma-separated list of {})",
                    known.join(", ")
                )));
            };
            k.set(*op, Switch::On);
        }
        Ok(k)
    }

    /// `attention=on rms_norm=auto …`: the switches on one line, for logs and reports.
    pub fn summary(&self) -> String {
        (FusedOp::ALL.iter())
            .map(|o| format!("{}={}", o.key(), self.get(*o)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Whether `op` runs its fused kernels on `device` for a model of `cfg` in `dtype`: the
    /// switch resolved (module docs). A shape or dtype the kernels do not cover gives `false`
    /// (with a line in the log, once); so does `"on"` on the CPU (also logged once).
    pub fn resolve(&self, op: FusedOp, cfg: &ModelConfig, dtype: DType, device: &Device) -> bool {
        let key = op.key();
        let on = match self.get(op) {
            Switch::Off => return false,
            Switch::On => true,
            Switch::Auto => triton::GPU_VERIFIED.contains(&op.family()),
        };
        if !on {
            return false;
        }
        if !device.is_cuda() {
            if self.get(op) == Switch::On {
                log_once(format!(
                    "kernels.{key} = on: the fused kernels are CUDA only; the CPU runs the candle \
                     composition"
                ));
            }
            return false;
        }
        if !op.wired() {
            log_once(format!(
                "kernels.{key} = on: not wired into the model yet; the candle composition runs"
            ));
            return false;
        }
        if let Some(why) = uncovered(op, cfg, dtype) {
            log_once(format!(
                "kernels.{key} = on: {why}; falling back to the candle composition"
            ));
            return false;
        }
        if let Some(why) = no_target(device) {
            log_once(format!(
                "kernels.{key} = on: {why}; falling back to the candle composition"
            ));
            return false;
        }
        true
    }

    /// Whether `op` would run its fused kernels on a GPU for a model of `cfg` in `dtype`: the
    /// switch is `"on"` (or `"auto"` with the family in [`triton::GPU_VERIFIED`]), the op is
    /// wired into the model, and the kernels cover the shape and dtype. What
    /// [`KernelSwitches::resolve`] decides on a CUDA device, without a device and without logging
    /// (for `rlvr plan`, which plans a GPU run on any machine).
    pub fn runs_on_gpu(&self, op: FusedOp, cfg: &ModelConfig, dtype: DType) -> bool {
        let on = match self.get(op) {
            Switch::Off => false,
            Switch::On => true,
            Switch::Auto => triton::GPU_VERIFIED.contains(&op.family()),
        };
        on && op.wired() && uncovered(op, cfg, dtype).is_none()
    }
}

/// Why the committed kernels cannot run on `device` (a GPU whose compute capability selects no
/// shipped target, e.g. one newer than the targets; or the manifest unreadable), if they cannot.
#[cfg(feature = "cuda")]
fn no_target(device: &Device) -> Option<String> {
    let Device::Cuda(c) = device else {
        return None;
    };
    let m = match triton::Manifest::committed() {
        Ok(m) => m,
        Err(e) => return Some(format!("the kernels' manifest: {e}")),
    };
    rlvr_kernels::triton::cuda::device_target(&c.cuda_stream(), m)
        .err()
        .map(|e| e.to_string())
}

#[cfg(not(feature = "cuda"))]
fn no_target(_: &Device) -> Option<String> {
    None
}

/// Why the kernels of `op` do not cover a model of `cfg` in `dtype`, if they do not.
fn uncovered(op: FusedOp, cfg: &ModelConfig, dtype: DType) -> Option<String> {
    if !matches!(dtype, DType::F32 | DType::BF16) {
        return Some(format!(
            "the kernels are f32 and bf16, the model is {dtype:?}"
        ));
    }
    let hd = cfg.head_dim;
    // Gemma: the kernels implement none of its differences from the Llama layout.
    if let Some(why) = gemma_uncovered(op, cfg) {
        return Some(why);
    }
    if let Some(why) = rope_uncovered(op, cfg) {
        return Some(why);
    }
    // The training attention kernels take a sliding window (their `window` argument); the
    // decode kernels still see every cached key: a sliding-window model decodes through the
    // candle composition (its window mask).
    if let (Some(w), FusedOp::Decode | FusedOp::CudaGraphs) = (&cfg.sliding_window, op) {
        return Some(format!(
            "the model attends through a sliding window of {} tokens, which the decode kernels \
             do not apply",
            w.size
        ));
    }
    match op {
        FusedOp::Attention | FusedOp::Rotary if hd != 64 && hd != 128 => {
            Some(format!("head dim {hd} (the kernels have 64 and 128)"))
        }
        FusedOp::RmsNorm if cfg.hidden_size > 8192 => Some(format!(
            "hidden size {} (the kernels go to 8192)",
            cfg.hidden_size
        )),
        FusedOp::Decode | FusedOp::CudaGraphs => {
            let (hq, hk) = (cfg.num_attention_heads, cfg.num_key_value_heads.max(1));
            let group = rlvr_kernels::triton::families::decode::GROUP_BLOCK;
            if hd != 64 && hd != 128 {
                Some(format!(
                    "head dim {hd} (the decode kernels have 64 and 128)"
                ))
            } else if !hq.is_multiple_of(hk) || hq / hk > group {
                Some(format!(
                    "{hq} query heads over {hk} kv heads (the decode attention takes up to \
                     {group} per kv head)"
                ))
            } else if cfg.hidden_size > 8192 {
                Some(format!(
                    "hidden size {} (the RMSNorm kernels go to 8192)",
                    cfg.hidden_size
                ))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Why the rotary side of the kernels of `op` does not cover a model of `cfg`: partial rotary
/// (the rotary and decode kernels rotate every dimension of a head) and LongRoPE (the rotary
/// kernel and the decode program read one table for all the rows of a forward, LongRoPE picks
/// the short or long factors per row). `None` for the other ops, and for full-width rotary
/// without LongRoPE.
fn rope_uncovered(op: FusedOp, cfg: &ModelConfig) -> Option<String> {
    let rotary = matches!(op, FusedOp::Rotary | FusedOp::Decode | FusedOp::CudaGraphs);
    if rotary && cfg.rotary_dim() < cfg.head_dim {
        return Some(format!(
            "the model rotates {} of each head's {} dimensions (partial_rotary_factor {}), the \
             rotary kernels rotate all of them",
            cfg.rotary_dim(),
            cfg.head_dim,
            cfg.partial_rotary_factor
        ));
    }
    if rotary
        && matches!(
            cfg.rope_scaling,
            Some(crate::config::RopeScaling::LongRope { .. })
        )
    {
        return Some(
            "LongRoPE picks its short or long factors per sequence (past \
             original_max_position_embeddings), the rotary and decode kernels read one table for \
             every row"
                .into(),
        );
    }
    None
}

/// Why the kernels of `op` do not cover a Gemma model of `cfg` (`None` for other models and
/// for AdamW, which sees parameters only): the norms' `1 + weight` (RMSNorm, decode), GeGLU
/// (SwiGLU kernels), Gemma 2's score softcapping (attention, decode), the attention scale
/// `query_pre_attn_scalar^-½` (decode: the training kernels take it as `softmax_scale`), Gemma
/// 3's second rotary table for its local layers (rotary, decode).
/// The final-logit softcapping is covered: the log-prob head's `_softcap` variants apply it.
fn gemma_uncovered(op: FusedOp, cfg: &ModelConfig) -> Option<String> {
    let g = cfg.gemma.as_ref()?;
    let name = cfg.arch.model_type();
    let why = match op {
        FusedOp::Adamw | FusedOp::LogprobHead => return None,
        FusedOp::RmsNorm => {
            format!("{name}'s RMSNorm scales by 1 + weight, which the RMSNorm kernels do not")
        }
        FusedOp::Swiglu => {
            format!("{name}'s MLP is GeGLU (tanh GELU), the kernels are SwiGLU")
        }
        FusedOp::Rotary if g.rope_local_base_freq.is_some() => format!(
            "{name}'s local layers rotate with their own base (rope_local_base_freq), which the \
             rotary kernels' one table does not hold"
        ),
        FusedOp::Rotary => return None,
        // The training attention kernels take the scale (`softmax_scale`) and the window, not
        // the score softcapping; the decode step also runs the (1 + weight) norms.
        FusedOp::Attention => match g.attn_logit_softcapping {
            Some(cap) => format!(
                "{name} caps its attention scores (attn_logit_softcapping {cap}), which the fused \
                 attention kernels do not apply"
            ),
            None => return None,
        },
        FusedOp::Decode | FusedOp::CudaGraphs => format!(
            "{name} scales attention scores by query_pre_attn_scalar^-1/2{} and normalises by \
             1 + weight, which the decode kernels do not apply",
            match g.attn_logit_softcapping {
                Some(cap) => format!(" and caps them (attn_logit_softcapping {cap})"),
                None => String::new(),
            }
        ),
    };
    Some(why)
}

/// Prints `msg` to stderr once per process (the switches' messages; also the sampler's).
pub fn log_once(msg: String) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(msg.clone()) {
        eprintln!("rlvr: {msg}");
    }
}

/// The `[kernels]` rows of the config reference (`| key | meaning |`), from the doc comments of
/// [`KernelSwitches`]' fields.
pub fn reference_rows() -> String {
    let src = include_str!("kernels.rs");
    let start = (src.find("pub struct KernelSwitches {")).expect("KernelSwitches is defined here");
    let mut out = String::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in src[start..].lines().skip(1) {
        let l = line.trim();
        if l == "}" {
            break;
        }
        if let Some(d) = l.strip_prefix("///") {
            doc.push(d.trim());
        } else if let Some((field, _)) = l.strip_prefix("pub ").and_then(|r| r.split_once(':')) {
            out.push_str(&format!(
                "| `kernels.{}` | {} |\n",
                field.trim(),
                doc.join(" ").replace('|', "\\|")
            ));
            doc.clear();
        } else if !l.starts_with("#[") {
            doc.clear();
        }
    }
    out
}

/// The resolved flags the layers read: which ops take their fused path. Without CUDA, an op
/// whose switch is `"on"` is flagged too (`cpu_record`), so that the launch recorder
/// ([`record_launches`]) can follow the fused path's plan building on the CPU; without a
/// recorder the CPU runs the composition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Fused {
    /// Attention through the fused kernels.
    pub attention: bool,
    /// The decode step's kernels (`kernels.decode`): on the CPU, only flagged for the launch
    /// recorder ([`record_decode`]); on CUDA the sampler runs its fused step
    /// (`rlvr_rollout::fused`), and the layers are not involved.
    pub decode: bool,
    /// RMSNorm (with the residual add where the layer has one) through the fused kernels.
    pub rms_norm: bool,
    /// The MLP's gating `silu(gate) · up` through the fused kernels.
    pub swiglu: bool,
    /// The rotary embedding of q and k through the fused kernels.
    pub rotary: bool,
    /// One-pass AdamW and the gradient norm's partial sums (`kernels.adamw`): on CUDA the
    /// optimizer launches the kernels (`optim::AdamW::set_fused`); on the CPU, only
    /// flagged for the launch recorder ([`adamw`]).
    pub adamw: bool,
    /// The log-prob head's chunk kernels (`kernels.logprob_head`): on CUDA the head runs them;
    /// on the CPU, only flagged for the launch recorder ([`head::tap`]).
    pub logprob_head: bool,
}

impl Fused {
    /// The flags of `s` for a model of `cfg` in `dtype` on `device`.
    pub fn of(s: &KernelSwitches, cfg: &ModelConfig, dtype: DType, device: &Device) -> Self {
        let cpu_on = |op: FusedOp| {
            !device.is_cuda() && s.get(op) == Switch::On && uncovered(op, cfg, dtype).is_none()
        };
        let attention = s.resolve(FusedOp::Attention, cfg, dtype, device);
        let decode = s.resolve(FusedOp::Decode, cfg, dtype, device);
        let rms_norm = s.resolve(FusedOp::RmsNorm, cfg, dtype, device);
        let swiglu = s.resolve(FusedOp::Swiglu, cfg, dtype, device);
        let rotary = s.resolve(FusedOp::Rotary, cfg, dtype, device);
        let adamw = s.resolve(FusedOp::Adamw, cfg, dtype, device);
        Fused {
            attention: attention || cpu_on(FusedOp::Attention),
            decode: decode || cpu_on(FusedOp::Decode),
            rms_norm: rms_norm || cpu_on(FusedOp::RmsNorm),
            swiglu: swiglu || cpu_on(FusedOp::Swiglu),
            rotary: rotary || cpu_on(FusedOp::Rotary),
            adamw: adamw || cpu_on(FusedOp::Adamw),
            logprob_head: s.resolve(FusedOp::LogprobHead, cfg, dtype, device)
                || cpu_on(FusedOp::LogprobHead),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The launch recorder at the model level.

struct ModelRecorder {
    rec: Recorder,
    manifest: &'static Manifest,
    /// Labels written: each (layout, kernel) is recorded once per recorder, the first time.
    written: BTreeSet<String>,
}

thread_local! {
    static RECORDER: RefCell<Option<ModelRecorder>> = const { RefCell::new(None) };
}

/// Records written by the model on this thread while it lives ([`record_launches`]); dropping it
/// stops recording.
pub struct RecordGuard(());

impl Drop for RecordGuard {
    fn drop(&mut self) {
        RECORDER.with(|r| r.borrow_mut().take());
    }
}

/// Makes the fused ops switched `"on"` record their launches on this thread (CPU only): each
/// launch plan built from the real tensors of the forward and backward, with those tensors as
/// inputs and the candle composition's results as the expected outputs, written under `dir` as
/// `rlvr_kernels::triton::record` describes (one record per layout and kernel, the first seen).
/// The computation itself is the composition's, unchanged.
///
/// Errors: the directory cannot be created, the committed manifest does not load.
pub fn record_launches(dir: impl Into<std::path::PathBuf>) -> Result<RecordGuard> {
    let rec = Recorder::new(dir).map_err(|e| ModelError::Invalid(e.to_string()))?;
    let manifest = Manifest::committed().map_err(|e| ModelError::Invalid(e.to_string()))?;
    RECORDER.with(|r| {
        *r.borrow_mut() = Some(ModelRecorder {
            rec,
            manifest,
            written: BTreeSet::new(),
        })
    });
    Ok(RecordGuard(()))
}

pub(crate) fn recording() -> bool {
    RECORDER.with(|r| r.borrow().is_some())
}

/// Whether the thread's recorder (if any) has not written `label` yet: the record's inputs are
/// worth gathering.
pub(crate) fn wants(label: &str) -> bool {
    RECORDER.with(|r| {
        r.borrow()
            .as_ref()
            .is_some_and(|r| !r.written.contains(label))
    })
}

/// The compiled kernel `name`'s aligned twin (`_a16`) when the committed manifest has one,
/// for records of the launch the CUDA path tries first.
pub(crate) fn twin_of(name: &str) -> Option<String> {
    let twin = rlvr_kernels::triton::families::aligned_name(name);
    let m = Manifest::committed().ok()?;
    m.entry(&twin, Target::Sm90a).ok().map(|_| twin)
}

/// Writes one record through the thread's recorder (if any, and the label is new).
fn write_record(
    label: &str,
    name: &str,
    build: impl FnOnce(&triton::KernelEntry) -> Result<(triton::LaunchPlan, BTreeMap<String, Vec<i32>>)>,
    mut buffers: BTreeMap<String, HostBuffer>,
    expected: BTreeMap<String, (HostBuffer, Tolerance)>,
) -> Result<()> {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        let Some(mr) = r.as_mut() else {
            return Ok(());
        };
        if mr.written.contains(label) {
            return Ok(());
        }
        let err = |e: triton::TritonError| ModelError::Invalid(format!("{label}: {e}"));
        let entry = mr.manifest.entry(name, Target::Sm90a).map_err(err)?;
        let (plan, desc) = build(entry)?;
        for (n, v) in desc {
            buffers.insert(n, HostBuffer::i32(&[v.len()], &v));
        }
        mr.rec
            .record(label, entry, &plan, &buffers, &expected)
            .map_err(err)?;
        mr.written.insert(label.to_string());
        Ok(())
    })
}

/// [`write_record`] for a family without descriptors whose launch takes the variant's aligned
/// twin when its plan builder accepts the shapes ([`triton::families::pick`], as the CUDA path
/// does): the record holds the plan the GPU launches.
fn write_picked(
    label: &str,
    name: &str,
    build: impl Fn(&triton::KernelEntry) -> triton::Result<triton::LaunchPlan>,
    buffers: BTreeMap<String, HostBuffer>,
    expected: BTreeMap<String, (HostBuffer, Tolerance)>,
) -> Result<()> {
    let picked = RECORDER.with(|r| {
        let r = r.borrow();
        let mr = r.as_ref()?;
        (!mr.written.contains(label))
            .then(|| triton::families::pick(mr.manifest, name, Target::Sm90a, None, &build))
    });
    let plan = match picked {
        None => return Ok(()),
        Some(p) => p.map_err(|e| ModelError::Invalid(format!("{label}: {e}")))?,
    };
    let picked_name = plan.name.clone();
    write_record(
        label,
        &picked_name,
        move |_| Ok((plan, BTreeMap::new())),
        buffers,
        expected,
    )
}

// ---------------------------------------------------------------------------------------------
// RMSNorm (with the residual add) and SwiGLU.

/// At most this many programs run a fused RMSNorm backward: `rows_per_prog` is
/// `cdiv(rows, RMSNORM_BWD_PROGRAMS)` (what `rlvr kernels record`'s benchmark records take too).
pub const RMSNORM_BWD_PROGRAMS: usize = 512;

/// The fused RMSNorm's launch shapes for `rows` rows of `cols` elements: `rows_per_prog` (which
/// rows each backward program sums into its `dw` partial, hence the order of the weight
/// gradient's sum) depends on the shape alone, so reruns are bit-identical.
pub(crate) fn rmsnorm_shape(rows: usize, cols: usize, eps: f64) -> rmsnorm::RmsNorm {
    rmsnorm::RmsNorm {
        rows,
        cols,
        eps: eps as f32,
        rows_per_prog: rows.div_ceil(RMSNORM_BWD_PROGRAMS).max(1),
    }
}

/// Whether the fused RMSNorm kernels take `x` `[.., cols]` with weight `w` `[cols]`: f32 or
/// bf16, the weight of the same dtype, at least one row, rows of at most 8192 elements.
pub(crate) fn rmsnorm_covers(x: &Tensor, w: &Tensor) -> bool {
    let cols = x.dims().last().copied().unwrap_or(0);
    matches!(x.dtype(), DType::F32 | DType::BF16)
        && w.dtype() == x.dtype()
        && w.dims() == [cols]
        && cols > 0
        && cols <= rmsnorm::BLOCKS[rmsnorm::BLOCKS.len() - 1]
        && x.elem_count() > 0
}

/// RMSNorm of `x` `[.., cols]` with weight `w` `[cols]` (`crate::ops::rms_norm`'s
/// `w · x / sqrt(mean(x²) + eps)`), for a layer whose `kernels.rms_norm` resolved on: on CUDA
/// the fused kernels (`rmsnorm_fwd`, and in the backward `rmsnorm_bwd` then `rmsnorm_dw`, which
/// sums the per-program partials in a fixed order); on the CPU the candle composition, bit for
/// bit, which under [`record_launches`] also records those launches. A dtype or width the
/// kernels do not cover takes the composition (logged once).
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        if rmsnorm_covers(x, w) {
            return cuda_rmsnorm::apply(x, w, eps);
        }
        log_uncovered_norm(x, w);
    }
    let y = crate::ops::rms_norm(x, w, eps)?;
    record_layers::rms_norm(x, w, eps, y)
}

/// The residual add fused with the RMSNorm that follows it: `h = residual + x` (the new
/// residual stream) and `y = rms_norm(h, w, eps)`, both `[.., cols]`, as [`rms_norm`] (on CUDA
/// `rmsnorm_add_fwd`; its backward `rmsnorm_add_bwd` takes the gradients of both `h` and `y`).
/// The CPU computes `residual + x` then the composition, as the unfused layer.
pub(crate) fn rms_norm_add(
    residual: &Tensor,
    x: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        if rmsnorm_covers(x, w) && residual.dims() == x.dims() && residual.dtype() == x.dtype() {
            return cuda_rmsnorm::apply_add(residual, x, w, eps);
        }
        log_uncovered_norm(x, w);
    }
    record_layers::rms_norm_add(residual, x, w, eps)
}

#[cfg(feature = "cuda")]
fn log_uncovered_norm(x: &Tensor, w: &Tensor) {
    log_once(format!(
        "kernels.rms_norm = on: rows {:?} of {:?} with a {:?} weight are not covered by the \
         kernels; falling back to the candle composition",
        x.dims(),
        x.dtype(),
        w.dtype()
    ));
}

/// SwiGLU's gating `silu(g) · u` of the MLP's gate and up projections `[.., cols]` (same shape
/// and dtype), for a layer whose `kernels.swiglu` resolved on: on CUDA `swiglu_fwd` (backward
/// `swiglu_bwd`, both gradients in one pass); on the CPU the candle composition, bit for bit,
/// which under [`record_launches`] also records those launches. Other dtypes take the
/// composition (logged once).
pub(crate) fn swiglu(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if g.device().is_cuda() {
        if matches!(g.dtype(), DType::F32 | DType::BF16)
            && u.dtype() == g.dtype()
            && u.dims() == g.dims()
            && g.elem_count() > 0
        {
            return cuda_swiglu::apply(g, u);
        }
        log_once(format!(
            "kernels.swiglu = on: {:?} gate {:?} is not covered by the kernels; falling back \
             to the candle composition",
            g.dtype(),
            g.dims()
        ));
    }
    let a = (g.silu()? * u)?;
    record_layers::swiglu(g, u, a)
}

/// The fused rotary kernels' inputs for a forward: each token's position and the f32 tables.
#[derive(Clone)]
pub(crate) struct FusedRope {
    /// The position of each of the `B·T` tokens, i32 `[B·T]` (on the model's device).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub pos: Tensor,
    /// Host copy of `pos` (the launch recorder's).
    pub pos_host: Arc<Vec<i32>>,
    /// cos and sin of positions `0..n` (n above every position), f32 `[n, hd]`.
    pub cos: Tensor,
    pub sin: Tensor,
}

/// The rotary embedding of q `[B, T, nh, hd]` and k `[B, T, nkv, hd]` (`x·cos + rotate_half(x)·sin`
/// with cos/sin `[B, T, 1, hd]` of the tokens' positions), for a layer whose `kernels.rotary`
/// resolved on: on CUDA `rotary_fwd` over q and k at once, reading the f32 tables at each
/// token's position (`f`; backward `rotary_bwd`, the transposed rotation); on the CPU the candle
/// composition, bit for bit, which under [`record_launches`] also records those launches.
/// A dtype or head dim the kernels do not cover takes the composition (logged once).
pub(crate) fn rotary(
    q: &Tensor,
    k: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    f: &FusedRope,
) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        let hd = q.dims().last().copied().unwrap_or(0);
        if matches!(q.dtype(), DType::F32 | DType::BF16)
            && k.dtype() == q.dtype()
            && (hd == 64 || hd == 128)
            && q.elem_count() > 0
        {
            return cuda_rotary::apply(q, k, f);
        }
        log_once(format!(
            "kernels.rotary = on: {:?} q {:?} is not covered by the kernels; falling back to \
             the candle composition",
            q.dtype(),
            q.dims()
        ));
    }
    record_layers::rotary(q, k, cos, sin, f)
}

// ---------------------------------------------------------------------------------------------
// Attention.

/// Which layout a fused attention call is over (for record labels and messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttnKind {
    /// Rows of `[B, T]`, each attending causally within its real tokens.
    Dense,
    /// The shared-prefix layout.
    Shared,
    /// Rows of `[B, T]` new positions after a KV cache's past: each row's queries see its past
    /// keys (key-only rows after the `B·T` new ones, [`kept_seqs`]) then its own keys causally.
    /// Forward only (the sampler's prefill of a multi-turn episode's later turn).
    Kept,
}

impl AttnKind {
    fn name(self) -> &'static str {
        match self {
            AttnKind::Dense => "dense",
            AttnKind::Shared => "shared",
            AttnKind::Kept => "kept",
        }
    }
}

/// The sequences of a dense forward over `[B, T]` without a cache, from its additive bias
/// `[B, T, T]` (row-major, f32 on the host): row b's real tokens (the keys its diagonal shows)
/// must be contiguous, and every real query must see exactly the real keys up to itself (the
/// causal padding mask of `Model::attention_bias`). `None` for any other bias: then the
/// composition runs.
pub(crate) fn dense_seqs(bias: &[f32], b: usize, t: usize) -> Option<Vec<Seq>> {
    let mut seqs = Vec::with_capacity(b);
    for row in 0..b {
        let m = &bias[row * t * t..(row + 1) * t * t];
        let real: Vec<bool> = (0..t).map(|j| m[j * t + j] == 0.0).collect();
        let first = real.iter().position(|x| *x)?;
        let len = real[first..].iter().take_while(|x| **x).count();
        if real[first + len..].iter().any(|x| *x) {
            return None;
        }
        for i in first..first + len {
            for j in 0..t {
                let visible = j >= first && j <= i;
                if (m[i * t + j] == 0.0) != visible {
                    return None;
                }
            }
        }
        seqs.push(Seq {
            start: row * t + first,
            len,
            prefix_start: 0,
            prefix_len: 0,
        });
    }
    Some(seqs)
}

/// The sequences of a dense forward over `[B, T]` from its key mask (1 = token), when each row's
/// tokens are contiguous (left or right padding): what [`dense_seqs`] finds in the causal padding
/// bias built from that mask, without reading the bias. `None` otherwise.
pub(crate) fn mask_seqs(mask: &[Vec<u32>], t: usize) -> Option<Vec<Seq>> {
    let mut seqs = Vec::with_capacity(mask.len());
    for (row, m) in mask.iter().enumerate() {
        if m.len() != t {
            return None;
        }
        let first = m.iter().position(|x| *x == 1)?;
        let len = m[first..].iter().take_while(|x| **x == 1).count();
        if m[first + len..].iter().any(|x| *x != 0) || m[..first].iter().any(|x| *x != 0) {
            return None;
        }
        seqs.push(Seq {
            start: row * t + first,
            len,
            prefix_start: 0,
            prefix_len: 0,
        });
    }
    Some(seqs)
}

/// The sequences of a forward of `[B, T]` new positions after `past` cached ones, from its key
/// mask `[B][past + T]` (1 = a key the row's queries see): row b's new tokens (mask columns
/// `past..`) must be contiguous, and its visible past columns one contiguous block (or none),
/// which every one of its queries sees. The flat key axis is the `B·T` new positions, then the
/// cache's `B·past` positions row by row (key-only rows, `Seq`'s prefix), `B·(T + past)` in all.
/// `None` for any other mask: then the composition runs.
pub(crate) fn kept_seqs(mask: &[Vec<u32>], past: usize, t: usize) -> Option<Vec<Seq>> {
    let b = mask.len();
    let block = |m: &[u32]| -> Option<(usize, usize)> {
        let Some(first) = m.iter().position(|x| *x == 1) else {
            return m.iter().all(|x| *x == 0).then_some((0, 0));
        };
        let len = m[first..].iter().take_while(|x| **x == 1).count();
        m[first + len..]
            .iter()
            .all(|x| *x == 0)
            .then_some((first, len))
    };
    let mut seqs = Vec::with_capacity(b);
    for (row, m) in mask.iter().enumerate() {
        if m.len() != past + t {
            return None;
        }
        let (first, len) = block(&m[past..])?;
        let (p0, plen) = block(&m[..past])?;
        if len == 0 {
            return None;
        }
        seqs.push(Seq {
            start: row * t + first,
            len,
            prefix_start: b * t + row * past + p0,
            prefix_len: plen,
        });
    }
    Some(seqs)
}

/// The sequences of a shared-prefix forward: G prompts of `prompt_lens` (padded to P), then R
/// completion rows of `comp_lens` positions (padded to C), row r continuing prompt
/// `row_groups[r]`. Completion rows without a position have no sequence.
pub(crate) fn shared_seqs(
    prompt_len: usize,
    comp_len: usize,
    prompt_lens: &[usize],
    comp_lens: &[usize],
    row_groups: &[usize],
) -> Vec<Seq> {
    let g = prompt_lens.len();
    let mut seqs: Vec<Seq> = (prompt_lens.iter().enumerate())
        .map(|(gi, &len)| Seq {
            start: gi * prompt_len,
            len,
            prefix_start: 0,
            prefix_len: 0,
        })
        .collect();
    for (r, (&len, &gi)) in comp_lens.iter().zip(row_groups).enumerate() {
        if len > 0 {
            seqs.push(Seq {
                start: g * prompt_len + r * comp_len,
                len,
                prefix_start: gi * prompt_len,
                prefix_len: prompt_lens[gi],
            });
        }
    }
    seqs
}

/// Attention through the fused kernels where they run: q `[Nq, nh, hd]`, k and v `[N, nkv, hd]`
/// (after the rotary embedding, contiguous, N the flat token axis of `layout`; Nq = N, or fewer
/// rows when the rows after Nq are key-only, [`AttnKind::Kept`]) give `[Nq, nh, hd]`.
/// `composition` is the candle composition of the same (its result `[Nq, nh, hd]`): what runs
/// on the CPU, and, under [`record_launches`], what the records expect.
pub(crate) fn attention(
    kind: AttnKind,
    layout: Arc<AttnLayout>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    composition: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        return cuda_attention::apply(layout, q, k, v);
    }
    let o = composition(q, k, v)?;
    if !recording() || !matches!(q.dtype(), DType::F32) {
        return Ok(o);
    }
    record_attention_fwd(kind, &layout, q, k, v, &o)?;
    if kind == AttnKind::Kept {
        return Ok(o); // forward only
    }
    // The backward's records are written when the gradient of `o` arrives.
    let rec = AttnRecord {
        kind,
        layout,
        q: q.detach(),
        k: k.detach(),
        v: v.detach(),
    };
    let o_kept = o.detach();
    tap(o, move |d_o| rec.record_bwd(&o_kept, d_o))
}

/// What a [`Tap`] calls with the gradient it receives.
type OnGrad = dyn Fn(&Tensor) -> Result<()> + Send + Sync;

/// The launch recorder's identity op on a contiguous tensor: its backward hands the incoming
/// gradient to a callback (which writes the backward kernels' records), then passes it on
/// unchanged, so the gradients are the composition's bit for bit.
struct Tap {
    on_grad: Box<OnGrad>,
}

impl candle_core::CustomOp1 for Tap {
    fn name(&self) -> &'static str {
        "rlvr-record-tap"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::CpuStorage as C;
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("rlvr-record-tap: a contiguous tensor only")
        };
        let t = match s {
            C::F32(v) => C::F32(v[a..b].to_vec()),
            C::BF16(v) => C::BF16(v[a..b].to_vec()),
            C::F16(v) => C::F16(v[a..b].to_vec()),
            C::F64(v) => C::F64(v[a..b].to_vec()),
            _ => candle_core::bail!("rlvr-record-tap: f32, bf16, f16 or f64 tensors only"),
        };
        Ok((t, l.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        (self.on_grad)(grad_res).map_err(candle_core::Error::wrap)?;
        Ok(Some(grad_res.clone()))
    }
}

/// `t` through a [`Tap`] calling `on_grad` with its gradient (when `t` carries a graph; else `t`).
pub(crate) fn tap(
    t: Tensor,
    on_grad: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
) -> Result<Tensor> {
    if !t.track_op() {
        return Ok(t);
    }
    let t = t.contiguous()?;
    Ok(t.apply_op1(Tap {
        on_grad: Box::new(on_grad),
    })?)
}

fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}

/// The gradient of `v` in `grads` on the host in f32 (flat), zeros when the composition gave it
/// none: what a backward record expects.
fn grad_host(grads: &candle_core::backprop::GradStore, v: &candle_core::Var) -> Result<Vec<f32>> {
    match grads.get(v.as_tensor()) {
        Some(g) => host_f32(g),
        None => Ok(vec![0.0; v.elem_count()]),
    }
}

/// `(lse [nh·N], queries)`: the log-sum-exp of every query row of `l` per head, in f64 from the
/// f32 inputs, and each query's visible keys (through `l.window` when set).
fn lse_of(l: &AttnLayout, q: &[f32], k: &[f32]) -> Vec<f64> {
    let (n, hq, hk, d) = (l.n_tokens, l.q_heads, l.kv_heads, l.head_dim);
    let rep = hq / hk;
    let mut lse = vec![0.0f64; hq * n];
    for s in &l.seqs {
        for i in 0..s.len {
            let t = s.start + i;
            // Key j of [prefix, own] is at position j; query i at prefix_len + i.
            let qpos = s.prefix_len + i;
            let keys = (s.prefix_start..s.prefix_start + s.prefix_len).chain(s.start..=t);
            let keys: Vec<usize> = (keys.enumerate())
                .filter(|(j, _)| l.window == 0 || qpos - j < l.window)
                .map(|(_, r)| r)
                .collect();
            for h in 0..hq {
                let qi = (t * hq + h) * d;
                let sc: Vec<f64> = (keys.iter())
                    .map(|j| {
                        let ki = (j * hk + h / rep) * d;
                        let dot: f64 = (0..d).map(|x| q[qi + x] as f64 * k[ki + x] as f64).sum();
                        dot * l.softmax_scale as f64
                    })
                    .collect();
                let m = sc.iter().fold(f64::NEG_INFINITY, |a, b| a.max(*b));
                let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                lse[h * n + t] = m + z.ln();
            }
        }
    }
    lse
}

/// The records' label part for a sliding layer (`_w{window}`), empty without a window.
fn window_tag(l: &AttnLayout) -> String {
    match l.window {
        0 => String::new(),
        w => format!("_w{w}"),
    }
}

/// Zeros the rows of `v` (`[N, heads·hd]` flat) outside every sequence: what the kernels leave
/// untouched in a zeroed output.
fn outside_zeroed(l: &AttnLayout, v: &[f32], row: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for s in &l.seqs {
        let r = s.start * row..(s.start + s.len) * row;
        out[r.clone()].copy_from_slice(&v[r]);
    }
    out
}

fn variant(kernel: &str, d: usize) -> String {
    format!("attn_{kernel}_f32_d{d}")
}

fn record_attention_fwd(
    kind: AttnKind,
    l: &Arc<AttnLayout>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
) -> Result<()> {
    let (n, hq, hk, d) = (l.n_tokens, l.q_heads, l.kv_heads, l.head_dim);
    let (qh, kh, vh, oh) = (host_f32(q)?, host_f32(k)?, host_f32(v)?, host_f32(o)?);
    // Rows outside every sequence keep the zeros the kernel never overwrites.
    let lse: Vec<f32> = lse_of(l, &qh, &kh).iter().map(|x| *x as f32).collect();
    // q and o hold the query rows (all N, or the rows before the key-only ones).
    let (sq, sk) = ([q.dim(0)?, hq, d], [n, hk, d]);
    let buffers = BTreeMap::from([
        ("q".to_string(), HostBuffer::f32(&sq, &qh)),
        ("k".to_string(), HostBuffer::f32(&sk, &kh)),
        ("v".to_string(), HostBuffer::f32(&sk, &vh)),
        ("o".to_string(), HostBuffer::zeros(triton::DType::Fp32, &sq)),
        (
            "lse".to_string(),
            HostBuffer::zeros(triton::DType::Fp32, &[hq * n]),
        ),
    ]);
    let expected = BTreeMap::from([
        (
            "o".to_string(),
            (
                HostBuffer::f32(&sq, &outside_zeroed(l, &oh, hq * d)),
                Tolerance::F32,
            ),
        ),
        (
            "lse".to_string(),
            (HostBuffer::f32(&[hq * n], &lse), Tolerance::F32),
        ),
    ]);
    let name = variant("fwd", d);
    let label = format!("model_attn_{}{}_{name}", kind.name(), window_tag(l));
    write_record(
        &label,
        &name,
        |e| attention::plan(e, l).map_err(|e| ModelError::Invalid(e.to_string())),
        buffers,
        expected,
    )
}

/// What attention's backward records need, kept by the [`tap`] on its output: the real gradient
/// of the output (dO) arrives there, and the three backward kernels are recorded with the
/// gradients the candle composition gives for that dO.
struct AttnRecord {
    kind: AttnKind,
    layout: Arc<AttnLayout>,
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

impl AttnRecord {
    fn record_bwd(&self, o: &Tensor, d_o: &Tensor) -> Result<()> {
        let l = &self.layout;
        let (n, hq, hk, d) = (l.n_tokens, l.q_heads, l.kv_heads, l.head_dim);
        // The composition's gradients for this dO, from its own graph over fresh leaves.
        let (q, k, v) = (
            candle_core::Var::from_tensor(&self.q)?,
            candle_core::Var::from_tensor(&self.k)?,
            candle_core::Var::from_tensor(&self.v)?,
        );
        let o2 = composition_of(l, q.as_tensor(), k.as_tensor(), v.as_tensor())?;
        let loss = (o2 * d_o.detach())?.sum_all()?;
        let grads = loss.backward()?;
        let grad = |x: &candle_core::Var| grad_host(&grads, x);
        let (dq, dk, dv) = (grad(&q)?, grad(&k)?, grad(&v)?);
        let (qh, kh, vh) = (host_f32(&self.q)?, host_f32(&self.k)?, host_f32(&self.v)?);
        let oh = outside_zeroed(l, &host_f32(o)?, hq * d);
        let doh = outside_zeroed(l, &host_f32(d_o)?, hq * d);
        let lse: Vec<f32> = lse_of(l, &qh, &kh).iter().map(|x| *x as f32).collect();
        let delta: Vec<f32> = (0..hq * n)
            .map(|i| {
                let (h, t) = (i / n, i % n);
                let at = (t * hq + h) * d;
                (0..d)
                    .map(|x| oh[at + x] as f64 * doh[at + x] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let (sq, sk) = ([n, hq, d], [n, hk, d]);
        let f = |s: &[usize], v: &[f32]| HostBuffer::f32(s, v);
        let z = |s: &[usize]| HostBuffer::zeros(triton::DType::Fp32, s);
        let kind = self.kind.name();
        let plan = |e: &triton::KernelEntry| {
            attention::plan(e, l).map_err(|e| ModelError::Invalid(e.to_string()))
        };
        let name = variant("bwd_pre", d);
        write_record(
            &format!("model_attn_{kind}{}_{name}", window_tag(l)),
            &name,
            plan,
            BTreeMap::from([
                ("o".to_string(), f(&sq, &oh)),
                ("do".to_string(), f(&sq, &doh)),
                ("delta".to_string(), z(&[hq * n])),
            ]),
            BTreeMap::from([("delta".to_string(), (f(&[hq * n], &delta), Tolerance::F32))]),
        )?;
        let inputs = BTreeMap::from([
            ("q".to_string(), f(&sq, &qh)),
            ("k".to_string(), f(&sk, &kh)),
            ("v".to_string(), f(&sk, &vh)),
            ("do".to_string(), f(&sq, &doh)),
            ("lse".to_string(), f(&[hq * n], &lse)),
            ("delta".to_string(), f(&[hq * n], &delta)),
        ]);
        // Gradients: the kernels write only rows inside sequences (key rows of a prompt's
        // padding are never visible, so candle's gradient there is 0 as well).
        let tol = Tolerance {
            atol: 2e-5,
            rtol: 1e-4,
        };
        let name = variant("bwd_dkdv", d);
        let mut b = inputs.clone();
        b.insert("dk".into(), z(&sk));
        b.insert("dv".into(), z(&sk));
        write_record(
            &format!("model_attn_{kind}{}_{name}", window_tag(l)),
            &name,
            plan,
            b,
            BTreeMap::from([
                (
                    "dk".to_string(),
                    (f(&sk, &outside_zeroed(l, &dk, hk * d)), tol),
                ),
                (
                    "dv".to_string(),
                    (f(&sk, &outside_zeroed(l, &dv, hk * d)), tol),
                ),
            ]),
        )?;
        let name = variant("bwd_dq", d);
        let mut b = inputs;
        b.insert("dq".into(), z(&sq));
        write_record(
            &format!("model_attn_{kind}{}_{name}", window_tag(l)),
            &name,
            plan,
            b,
            BTreeMap::from([(
                "dq".to_string(),
                (f(&sq, &outside_zeroed(l, &dq, hq * d)), tol),
            )]),
        )
    }
}

/// A plain candle composition of attention over `l` (per sequence, dense softmax in f32): the
/// oracle of the backward records. q `[N, nh, hd]`, k/v `[N, nkv, hd]` → `[N, nh, hd]`, rows
/// outside every sequence 0.
fn composition_of(l: &AttnLayout, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (n, hq, hk, d) = (l.n_tokens, l.q_heads, l.kv_heads, l.head_dim);
    let rep = hq / hk;
    let mut parts: Vec<(usize, Tensor)> = Vec::new();
    for s in &l.seqs {
        let qs = q.narrow(0, s.start, s.len)?; // [L, nh, d]
        let own_k = k.narrow(0, s.start, s.len)?;
        let own_v = v.narrow(0, s.start, s.len)?;
        let (ks, vs) = if s.prefix_len > 0 {
            (
                Tensor::cat(&[&k.narrow(0, s.prefix_start, s.prefix_len)?, &own_k], 0)?,
                Tensor::cat(&[&v.narrow(0, s.prefix_start, s.prefix_len)?, &own_v], 0)?,
            )
        } else {
            (own_k, own_v)
        };
        let sk = ks.dim(0)?;
        // [nkv, rep·L, d] queries against [nkv, S, d] keys.
        let qg = (qs.reshape((s.len, hk, rep, d))?.permute((1, 2, 0, 3))?)
            .reshape((hk, rep * s.len, d))?
            .contiguous()?;
        let kt = ks.permute((1, 2, 0))?.contiguous()?; // [nkv, d, S]
        let vg = vs.permute((1, 0, 2))?.contiguous()?; // [nkv, S, d]
        let scores = (qg.matmul(&kt)? * l.softmax_scale as f64)?;
        let mut mask = vec![0f32; s.len * sk];
        for i in 0..s.len {
            for j in 0..sk {
                // Key j at position j, query i at prefix_len + i: causal, and in the window.
                let qpos = s.prefix_len + i;
                if j > qpos || (l.window > 0 && qpos - j >= l.window) {
                    mask[i * sk + j] = f32::NEG_INFINITY;
                }
            }
        }
        let mask = Tensor::from_vec(mask, (1, 1, s.len, sk), q.device())?;
        let scores = scores.reshape((hk, rep, s.len, sk))?.broadcast_add(&mask)?;
        let p = candle_core::Tensor::exp(&scores.broadcast_sub(&scores.max_keepdim(3)?)?)?;
        let p = p
            .broadcast_div(&p.sum_keepdim(3)?)?
            .reshape((hk, rep * s.len, sk))?;
        let o = p.matmul(&vg)?.reshape((hk, rep, s.len, d))?;
        let o = o.permute((2, 0, 1, 3))?.reshape((s.len, hq, d))?;
        parts.push((s.start, o));
    }
    parts.sort_by_key(|(s, _)| *s);
    let mut pieces = Vec::new();
    let mut at = 0;
    for (start, o) in parts {
        if start > at {
            pieces.push(Tensor::zeros((start - at, hq, d), q.dtype(), q.device())?);
        }
        at = start + o.dim(0)?;
        pieces.push(o);
    }
    if at < n {
        pieces.push(Tensor::zeros((n - at, hq, d), q.dtype(), q.device())?);
    }
    Ok(Tensor::cat(&pieces, 0)?)
}

// ---------------------------------------------------------------------------------------------
// The decode step (issue 50).

/// The tensors of one cached decode step of one layer (one new position per row), as the
/// attention of `layers.rs` has them; all f32 on the CPU.
pub(crate) struct DecodeStep<'a> {
    /// The new query and key before the rotary embedding `[B, 1, nh | nkv, hd]`, and value.
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    /// The rows' rotary tables `[B, 1, 1, hd]` (row b at its position).
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    /// The rotated query `[B, nh, 1, hd]` (the composition's).
    pub q_rot: &'a Tensor,
    /// The store's keys and values after the append `[B, nkv, S, hd]` (S = the length, the new
    /// column last).
    pub k_all: &'a Tensor,
    pub v_all: &'a Tensor,
    /// The attention bias `[B, 1, 1, S]`.
    pub bias: &'a Tensor,
    /// The composition's attention output `[B, 1, nh·hd]`.
    pub o: &'a Tensor,
}

/// Extra cache columns past the step's length in the decode records: the kernels must neither
/// read (attention: they hold 1e4, which would swamp the result) nor write (rope/cache write:
/// they must stay 0) them.
const DECODE_SLACK: usize = 5;

/// Under the launch recorder (CPU, f32, `kernels.decode = "on"`): the decode kernels' launches
/// for this step, built by `rlvr_kernels::triton::families::decode` from the step's real tensors
/// (left padding masked by the real bias rows, the rows' real positions through their rotary
/// rows), with the composition's results as the expected outputs: `decode_rope_kv` (the rotated
/// query, the new key/value written into column S − 1 of a cache with capacity S + 5),
/// `decode_attn` (the per-split partials, from float64 on the same inputs) and
/// `decode_attn_combine` (the composition's attention output). One record per kernel per
/// recorder.
pub(crate) fn record_decode(st: &DecodeStep) -> Result<()> {
    use rlvr_kernels::triton::families::decode::{self, Decode, SplitRule};
    if !recording() || st.q.dtype() != DType::F32 {
        return Ok(());
    }
    let (b, _, nh, hd) = st.q.dims4()?;
    let (_, nkv, s, _) = st.k_all.dims4()?;
    let cap = s + DECODE_SLACK;
    let shape = Decode {
        rows: b,
        q_heads: nh,
        kv_heads: nkv,
        head_dim: hd,
        capacity: cap,
        fused_qkv: false,
        softmax_scale: 1.0 / (hd as f32).sqrt(),
    };
    let plan_err = |e: triton::TritonError| ModelError::Invalid(e.to_string());
    // Caches [B, nkv, cap, hd]: the step's S columns, then the slack filled with `fill`.
    let widen = |all: &[f32], fill: f32| -> Vec<f32> {
        let mut out = vec![fill; b * nkv * cap * hd];
        for r in 0..b * nkv {
            out[r * cap * hd..(r * cap + s) * hd]
                .copy_from_slice(&all[r * s * hd..(r + 1) * s * hd]);
        }
        out
    };
    let (k_all, v_all) = (host_f32(st.k_all)?, host_f32(st.v_all)?);
    let csh = [b, nkv, cap, hd];
    // rope + cache write: the caches before the step (column S − 1 zero, as the slack).
    let mut k_before = widen(&k_all, 0.0);
    let mut v_before = widen(&v_all, 0.0);
    for r in 0..b * nkv {
        let at = (r * cap + s - 1) * hd;
        k_before[at..at + hd].fill(0.0);
        v_before[at..at + hd].fill(0.0);
    }
    let f = |sh: &[usize], v: &[f32]| HostBuffer::f32(sh, v);
    let pos: Vec<i32> = (0..b as i32).collect(); // row b reads table row b: its own position
    let cols = vec![(s - 1) as i32; b];
    let lens = vec![s as i32; b];
    let name = decode::variant("rope_kv", triton::DType::Fp32, hd);
    let label = format!("model_{name}");
    write_record(
        &label,
        &name,
        |e| Ok((decode::plan(e, &shape).map_err(plan_err)?, BTreeMap::new())),
        BTreeMap::from([
            ("q".to_string(), f(&[b, nh, hd], &host_f32(st.q)?)),
            ("k".to_string(), f(&[b, nkv, hd], &host_f32(st.k)?)),
            ("v".to_string(), f(&[b, nkv, hd], &host_f32(st.v)?)),
            (
                "q_out".to_string(),
                HostBuffer::zeros(triton::DType::Fp32, &[b, nh, hd]),
            ),
            ("k_cache".to_string(), f(&csh, &k_before)),
            ("v_cache".to_string(), f(&csh, &v_before)),
            ("cos".to_string(), f(&[b, hd], &host_f32(st.cos)?)),
            ("sin".to_string(), f(&[b, hd], &host_f32(st.sin)?)),
            ("pos".to_string(), HostBuffer::i32(&[b], &pos)),
            ("cols".to_string(), HostBuffer::i32(&[b], &cols)),
        ]),
        BTreeMap::from([
            (
                "q_out".to_string(),
                (f(&[b, nh, hd], &host_f32(st.q_rot)?), Tolerance::F32),
            ),
            (
                "k_cache".to_string(),
                (f(&csh, &widen(&k_all, 0.0)), Tolerance::F32),
            ),
            (
                "v_cache".to_string(),
                (f(&csh, &widen(&v_all, 0.0)), Tolerance::F32),
            ),
        ]),
    )?;
    // Attention: the partials of each split, in float64 from the f32 inputs.
    let q_rot = host_f32(st.q_rot)?;
    let bias_rows = host_f32(st.bias)?; // [B, S]
    let mut bias = vec![0f32; b * cap];
    for r in 0..b {
        bias[r * cap..r * cap + s].copy_from_slice(&bias_rows[r * s..(r + 1) * s]);
    }
    let name = decode::variant("attn", triton::DType::Fp32, hd);
    let combine = decode::variant("attn_combine", triton::DType::Fp32, hd);
    let Some((rule, ns)) = RECORDER.with(|r| {
        let r = r.borrow();
        let e = r.as_ref()?.manifest.entry(&name, Target::Sm90a).ok()?;
        Some((SplitRule::of(e).ok()?, shape.n_splits(e).ok()?))
    }) else {
        return Err(ModelError::Invalid(format!(
            "{name}: not in the committed manifest"
        )));
    };
    let rep = nh / nkv;
    let scale = shape.softmax_scale as f64;
    let (mut o_part, mut lse_part) = (vec![0f32; b * nh * ns * hd], vec![0f32; b * nh * ns]);
    let span = rule.split_len(s);
    for r in 0..b {
        for h in 0..nh {
            let qi = (r * nh + h) * hd;
            let kv = |j: usize| ((r * nkv + h / rep) * s + j) * hd;
            let sc: Vec<f64> = (0..s)
                .map(|j| {
                    let dot: f64 = (0..hd)
                        .map(|x| q_rot[qi + x] as f64 * k_all[kv(j) + x] as f64)
                        .sum();
                    dot * scale + bias_rows[r * s + j] as f64
                })
                .collect();
            for sp in 0..rule.splits(s) {
                let (lo, hi) = (sp * span, ((sp + 1) * span).min(s));
                let m = sc[lo..hi].iter().fold(f64::NEG_INFINITY, |a, x| a.max(*x));
                let z: f64 = sc[lo..hi].iter().map(|x| (x - m).exp()).sum();
                let row = (r * nh + h) * ns + sp;
                for x in 0..hd {
                    let acc: f64 = (lo..hi)
                        .map(|j| (sc[j] - m).exp() * v_all[kv(j) + x] as f64)
                        .sum();
                    o_part[row * hd + x] = (acc / z) as f32;
                }
                lse_part[row] = ((m + z.ln()) * std::f64::consts::LOG2_E) as f32;
            }
        }
    }
    let (psh, lsh) = ([b, nh, ns, hd], [b, nh, ns]);
    write_record(
        &format!("model_{name}"),
        &name,
        |e| Ok((decode::plan(e, &shape).map_err(plan_err)?, BTreeMap::new())),
        BTreeMap::from([
            ("q_out".to_string(), f(&[b, nh, hd], &q_rot)),
            ("k_cache".to_string(), f(&csh, &widen(&k_all, 1e4))),
            ("v_cache".to_string(), f(&csh, &widen(&v_all, 1e4))),
            ("bias".to_string(), f(&[b, cap], &bias)),
            ("lens".to_string(), HostBuffer::i32(&[b], &lens)),
            (
                "o_part".to_string(),
                HostBuffer::zeros(triton::DType::Fp32, &psh),
            ),
            (
                "lse_part".to_string(),
                HostBuffer::zeros(triton::DType::Fp32, &lsh),
            ),
        ]),
        BTreeMap::from([
            ("o_part".to_string(), (f(&psh, &o_part), Tolerance::F32)),
            ("lse_part".to_string(), (f(&lsh, &lse_part), Tolerance::F32)),
        ]),
    )?;
    write_record(
        &format!("model_{combine}"),
        &combine,
        |e| Ok((decode::plan(e, &shape).map_err(plan_err)?, BTreeMap::new())),
        BTreeMap::from([
            ("o_part".to_string(), f(&psh, &o_part)),
            ("lse_part".to_string(), f(&lsh, &lse_part)),
            ("lens".to_string(), HostBuffer::i32(&[b], &lens)),
            (
                "o".to_string(),
                HostBuffer::zeros(triton::DType::Fp32, &[b, nh, hd]),
            ),
        ]),
        BTreeMap::from([(
            "o".to_string(),
            (f(&[b, nh, hd], &host_f32(st.o)?), Tolerance::F32),
        )]),
    )
}

pub(crate) mod adamw;
pub(crate) mod head;

#[cfg(feature = "cuda")]
mod cuda_attention;
#[cfg(feature = "cuda")]
mod cuda_launch;
#[cfg(feature = "cuda")]
mod cuda_rmsnorm;
#[cfg(feature = "cuda")]
mod cuda_rotary;
#[cfg(feature = "cuda")]
mod cuda_swiglu;
mod record_layers;

#[cfg(feature = "cuda")]
pub(crate) mod cuda_adamw;

#[cfg(feature = "cuda")]
mod cuda_head;

/// The fused head on CUDA ([`head`]'s module docs): `[N, 2]` (log p_y, H), or `None` where the
/// kernels do not cover the call (then the caller runs [`crate::chunked`]); `softcap`: Gemma 2's
/// final-logit cap (the `_softcap` variants).
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cuda_head(
    h: &Tensor,
    w: &Tensor,
    targets: &[u32],
    op: (f64, bool, usize),
    softcap: Option<f64>,
    grad: bool,
    weight_grad: bool,
) -> Result<Option<Tensor>> {
    cuda_head::apply(h, w, targets, op, softcap, grad, weight_grad)
}

#[cfg(test)]
mod tests;
