//! LoRA adapters (Hu et al. 2021, arXiv 2106.09685) on the decoder's linear layers, with PEFT's
//! math, initialisation, file format and names, so PEFT and vLLM load what rlvr writes and rlvr
//! loads what PEFT writes.
//!
//! A targeted projection `y = W·x + b` becomes `y = W·x + b + (α/r)·B·(A·dropout(x))` with A
//! `[r, in]` and B `[out, r]` (peft `tuners/lora/layer.py`, `LoraLayer.update_layer` and
//! `Linear.forward`: `result + lora_B(lora_A(dropout(x))) * scaling`, `scaling = lora_alpha / r`).
//! A is initialised Kaiming-uniform with a = √5 (`nn.init.kaiming_uniform_(…, a=math.sqrt(5))`,
//! i.e. U(−1/√in, 1/√in)) and B with zeros, so a fresh adapter leaves the model unchanged. The
//! adapters are f32 (f64 in an f64 model) whatever the base dtype: the input is cast to the
//! adapter dtype, the sum `y + Δ` is taken there and cast back to the base dtype, as peft's
//! `_cast_input_dtype` and `result.to(torch_result_dtype)` do.
//!
//! With adapters attached the model's trainable weights ([`crate::Model::named_vars`]) are the
//! adapters alone; the base weights, the embedding and the lm_head are frozen (no autograd graph
//! through them, no ∂W in the fused head). [`crate::Model::without_adapters`] is the base model
//! sharing the same storage (the KL reference); [`crate::Model::try_clone`] copies only the
//! adapters (the explorer).
//!
//! Files (PEFT's `save_pretrained` layout): `adapter_config.json` (`peft_type` "LORA",
//! `task_type` "CAUSAL_LM", `r`, `lora_alpha`, `target_modules`, `bias` "none",
//! `base_model_name_or_path`, …) and `adapter_model.safetensors` with tensors
//! `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` `[r, in]` and
//! `….lora_B.weight` `[out, r]`. rlvr's checkpoints put them under `adapter/`; the file side is
//! in [`files`]; the functions that take a model are `model`'s (`model/lora.rs`).

mod files;

pub use files::{find_adapter, read_adapter_config};

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::param::{Param, Pass};

/// A decoder projection LoRA may target; names as PEFT's `target_modules` (`q_proj` …), with the
/// short forms `q`, `k`, `v`, `o`, `gate`, `up`, `down` accepted too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    /// All seven, in checkpoint order (the default target list).
    pub const ALL: [LoraTarget; 7] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];

    /// PEFT's module name: `q_proj`, …, `down_proj`.
    pub fn module(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
        }
    }
}

impl FromStr for LoraTarget {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let short = s.strip_suffix("_proj").unwrap_or(s);
        Ok(match short {
            "q" => Self::Q,
            "k" => Self::K,
            "v" => Self::V,
            "o" => Self::O,
            "gate" => Self::Gate,
            "up" => Self::Up,
            "down" => Self::Down,
            _ => {
                return Err(format!(
                    "unknown LoRA target `{s}`; valid: q, k, v, o, gate, up, down (or q_proj, …, down_proj)"
                ))
            }
        })
    }
}

impl TryFrom<String> for LoraTarget {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl From<LoraTarget> for String {
    fn from(t: LoraTarget) -> String {
        t.module().strip_suffix("_proj").unwrap_or("").to_string()
    }
}

/// LoRA settings (the `model.lora_*` config keys).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// r: the adapters' rank (≥ 1).
    pub rank: usize,
    /// α: the update is scaled by α / r.
    pub alpha: f64,
    /// The projections that get an adapter (non-empty, no repeats).
    pub targets: Vec<LoraTarget>,
    /// Dropout probability on the adapter input during training forwards, in [0, 1).
    pub dropout: f64,
}

impl LoraConfig {
    /// The scale α / r of the adapter update.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// Rank 0, a non-finite or non-positive α, no targets or a repeated one, dropout outside [0, 1).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Invalid(m));
        if self.rank == 0 {
            return bad("LoRA rank must be at least 1".into());
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return bad(format!("LoRA alpha must be positive, got {}", self.alpha));
        }
        if self.targets.is_empty() {
            return bad("LoRA needs at least one target module".into());
        }
        for (i, t) in self.targets.iter().enumerate() {
            if self.targets[..i].contains(t) {
                return bad(format!("LoRA target `{}` is listed twice", t.module()));
            }
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!(
                "LoRA dropout must be in [0, 1), got {}",
                self.dropout
            ));
        }
        Ok(())
    }
}

/// One projection's adapter: A `[r, in]`, B `[out, r]`, the scale α/r and the dropout.
#[derive(Clone)]
pub(crate) struct Adapter {
    pub a: Param,
    pub b: Param,
    scale: f64,
    dropout: f64,
    /// Dropout masks drawn so far (shared by clones) and the seed of their stream.
    draws: Arc<AtomicU64>,
    seed: u64,
}

impl Adapter {
    /// An adapter of A and B with `cfg`'s scale α/r and dropout, its dropout masks drawn from
    /// `seed`'s stream (none drawn yet).
    pub(crate) fn new(a: Param, b: Param, cfg: &LoraConfig, seed: u64) -> Self {
        Self {
            a,
            b,
            scale: cfg.scale(),
            dropout: cfg.dropout,
            draws: Arc::new(AtomicU64::new(0)),
            seed,
        }
    }

    /// A copy with A and B in new storage and a mask stream of its own at the same position
    /// (a clone shares both).
    ///
    /// # Errors
    /// Tensor errors.
    pub(crate) fn try_copy(&self) -> Result<Self> {
        let mut a = self.clone();
        for p in [&mut a.a, &mut a.b] {
            let copy = Var::from_tensor(&p.var.as_tensor().copy()?)?;
            *p = Param::new(p.name.clone(), copy);
        }
        a.draws = Arc::new(AtomicU64::new(a.draws.load(Ordering::Relaxed)));
        Ok(a)
    }

    /// The update (α/r)·B·A `[out, in]`, in the adapter dtype.
    ///
    /// # Errors
    /// Tensor errors.
    pub(crate) fn delta(&self) -> Result<Tensor> {
        Ok((self.b.var.as_tensor().matmul(self.a.var.as_tensor())? * self.scale)?)
    }

    /// `y + (α/r)·((dropout(x)·Aᵀ)·Bᵀ)` for x `[rows, in]` and y `[rows, out]`, computed in the
    /// adapter dtype and returned in y's dtype (peft's order: A, then B, then the scale).
    pub fn forward(&self, x: &Tensor, y: &Tensor, pass: Pass) -> Result<Tensor> {
        let dt = self.a.var.dtype();
        let mut xa = x.to_dtype(dt)?;
        if pass.dropout && self.dropout > 0.0 {
            xa = (xa * self.dropout_mask(x.dims(), x.device())?)?;
        }
        let (a, b) = (self.a.get(pass.grad), self.b.get(pass.grad));
        let delta = (xa.matmul(&a.t()?)?.matmul(&b.t()?)? * self.scale)?;
        Ok((y.to_dtype(dt)? + delta)?.to_dtype(y.dtype())?)
    }

    /// Dropout masks this adapter has drawn (the position in its seeded stream).
    pub(crate) fn draws(&self) -> u64 {
        self.draws.load(Ordering::Relaxed)
    }

    /// Moves the adapter's mask stream to position `n` (resume; a checkpointed layer's recompute).
    pub(crate) fn set_draws(&self, n: u64) {
        self.draws.store(n, Ordering::Relaxed)
    }

    /// An inverted-dropout mask (0 or 1/(1−p)) of `shape`, from the adapter's seeded stream.
    fn dropout_mask(&self, shape: &[usize], device: &Device) -> Result<Tensor> {
        let k = self.draws.fetch_add(1, Ordering::Relaxed);
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed ^ k.wrapping_mul(0x9E37_79B9));
        let keep = 1.0 / (1.0 - self.dropout);
        let n: usize = shape.iter().product();
        let m: Vec<f32> = (0..n)
            .map(|_| {
                if rng.random::<f64>() < self.dropout {
                    0.0
                } else {
                    keep as f32
                }
            })
            .collect();
        Ok(Tensor::from_vec(m, shape, device)?.to_dtype(self.a.var.dtype())?)
    }
}
