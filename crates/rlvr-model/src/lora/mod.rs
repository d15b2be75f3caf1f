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

pub(crate) use files::is_vision_tensor;
pub use files::{find_adapter, read_adapter_config};

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::config::Arch;
use crate::error::{ModelError, Result};
use crate::param::{Param, Pass};

/// A decoder projection LoRA may target; names as PEFT's `target_modules` (`q_proj` …), with the
/// short forms `q`, `k`, `v`, `o`, `gate`, `up`, `down` accepted too. Phi-3 checkpoints fuse q/k/v
/// into `qkv_proj` and gate/up into `gate_up_proj`, which are then the modules PEFT (and rlvr)
/// adapt ([`LoraTarget::Qkv`], [`LoraTarget::GateUp`]); `all-linear` ([`LoraTarget::AllLinear`],
/// PEFT's shorthand) stands for every decoder projection of the checkpoint's architecture
/// ([`LoraConfig::for_arch`]).
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
    /// Phi-3's fused `qkv_proj` `[(h + 2·kv)·head_dim, hidden]`: one adapter whose B rows are
    /// q's, then k's, then v's.
    Qkv,
    /// Phi-3's fused `gate_up_proj` `[2·intermediate, hidden]`: one adapter whose B rows are
    /// gate's, then up's.
    GateUp,
    /// Every decoder projection of the architecture (PEFT's `"all-linear"`, which leaves out
    /// the output layer): the seven, or Phi-3's four modules.
    AllLinear,
}

impl LoraTarget {
    /// All seven split projections, in checkpoint order (`all-linear` of every architecture but
    /// phi3).
    pub const ALL: [LoraTarget; 7] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];

    /// Phi-3's four modules (`all-linear` there), in checkpoint order.
    pub const PHI3: [LoraTarget; 4] = [Self::Qkv, Self::O, Self::GateUp, Self::Down];

    /// PEFT's module name: `q_proj`, …, `down_proj`, `qkv_proj`, `gate_up_proj`, or
    /// `all-linear`.
    pub fn module(self) -> &'static str {
        match self {
            Self::Q => "q_proj",
            Self::K => "k_proj",
            Self::V => "v_proj",
            Self::O => "o_proj",
            Self::Gate => "gate_proj",
            Self::Up => "up_proj",
            Self::Down => "down_proj",
            Self::Qkv => "qkv_proj",
            Self::GateUp => "gate_up_proj",
            Self::AllLinear => "all-linear",
        }
    }

    /// The fused module whose rows hold this split projection in a Phi-3 checkpoint (q, k, v:
    /// [`LoraTarget::Qkv`]; gate, up: [`LoraTarget::GateUp`]); `None` for the others.
    pub fn fused_in(self) -> Option<LoraTarget> {
        match self {
            Self::Q | Self::K | Self::V => Some(Self::Qkv),
            Self::Gate | Self::Up => Some(Self::GateUp),
            _ => None,
        }
    }

    /// The targets of `all-linear` for `arch`: [`LoraTarget::PHI3`] for phi3, else
    /// [`LoraTarget::ALL`].
    pub fn all_linear(arch: Arch) -> &'static [LoraTarget] {
        match arch {
            Arch::Phi3 => &Self::PHI3,
            _ => &Self::ALL,
        }
    }
}

/// The accepted spellings, for error messages.
const VALID_TARGETS: &str = "q, k, v, o, gate, up, down (or q_proj, …, down_proj), phi3's \
                             qkv_proj and gate_up_proj, or all-linear";

impl FromStr for LoraTarget {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "all-linear" {
            return Ok(Self::AllLinear);
        }
        let short = s.strip_suffix("_proj").unwrap_or(s);
        Ok(match short {
            "q" => Self::Q,
            "k" => Self::K,
            "v" => Self::V,
            "o" => Self::O,
            "gate" => Self::Gate,
            "up" => Self::Up,
            "down" => Self::Down,
            "qkv" => Self::Qkv,
            "gate_up" => Self::GateUp,
            _ => return Err(format!("unknown LoRA target `{s}`; valid: {VALID_TARGETS}")),
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
        let m = t.module();
        m.strip_suffix("_proj").unwrap_or(m).to_string()
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

    /// The settings with `all-linear` expanded to `arch`'s projections
    /// ([`LoraTarget::all_linear`]) and every target checked against the modules `arch`'s
    /// checkpoints have: phi3 has `qkv_proj` and `gate_up_proj` where the others have the
    /// q/k/v and gate/up projections (a PEFT `target_modules` of `q_proj` matches no phi3
    /// module). Idempotent.
    ///
    /// # Errors
    /// [`LoraConfig::validate`]'s; `all-linear` beside other targets; a target `arch` has no
    /// module of (named, with the valid names for `arch`).
    pub fn for_arch(&self, arch: Arch) -> Result<LoraConfig> {
        self.validate()?;
        let bad = |m: String| Err(ModelError::Invalid(m));
        let mut out = self.clone();
        if self.targets.contains(&LoraTarget::AllLinear) {
            if self.targets.len() > 1 {
                return bad(format!(
                    "LoRA targets {:?}: all-linear stands alone (it is every projection)",
                    self.targets.iter().map(|t| t.module()).collect::<Vec<_>>()
                ));
            }
            out.targets = LoraTarget::all_linear(arch).to_vec();
            return Ok(out);
        }
        let valid = LoraTarget::all_linear(arch);
        for t in &self.targets {
            if valid.contains(t) {
                continue;
            }
            let names: Vec<&str> = valid.iter().map(|v| v.module()).collect();
            let names = names.join(", ");
            return match t.fused_in() {
                Some(f) => bad(format!(
                    "LoRA target `{}` is not a module of {} checkpoints, which fuse q, k and v \
                     into `qkv_proj` and gate and up into `gate_up_proj` (PEFT adapts the fused \
                     module, here `{}`); valid for {}: {names}, or all-linear",
                    t.module(),
                    arch.model_type(),
                    f.module(),
                    arch.model_type()
                )),
                None => bad(format!(
                    "LoRA target `{}` is a fused module of phi3 checkpoints only; valid for {}: \
                     {names} (or their short forms), or all-linear",
                    t.module(),
                    arch.model_type()
                )),
            };
        }
        Ok(out)
    }
}

/// What LoRA dropout's masks are keyed by in one training forward: the round (the trainer's
/// optimizer updates so far, [`crate::Model::set_lora_dropout_round`]) and one key per input
/// token, in the forward's flat row order (`[B·T]` or the shared layout's `[N]`).
///
/// A token's key chains the ids of its sequence up to and including it ([`chain_key`]), so it
/// names the token by its context alone: the same token gets the same key, hence the same mask,
/// whatever the micro-batch, the padding, the rank that trains it (data parallel) or whether its
/// prompt is computed once per group (the shared prompt) or once per row. Mask element (token
/// t, input feature j) of an adapter is a hash of (the adapter's salt, the round, t's key, j)
/// ([`dropout_keep`]). Rows with the same context (a group's prompt; two identical completions)
/// draw the same masks: each row's mask is still an inverted-dropout mask of probability p, so
/// the gradient stays unbiased, only correlated across such rows.
#[derive(Debug)]
pub(crate) struct DropoutKeys {
    pub round: u64,
    pub tokens: Vec<u64>,
}

/// SplitMix64's finaliser (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number
/// generators"): a bijective 64-bit mixer.
pub(crate) fn splitmix64(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of a sequence's first token before any id ([`chain_key`]).
pub(crate) const CHAIN_START: u64 = 0x6A09_E667_F3BC_C908;

/// The key of the token `id` after a token keyed `prev` ([`CHAIN_START`] for the first).
pub(crate) fn chain_key(prev: u64, id: u32) -> u64 {
    splitmix64(prev.rotate_left(17) ^ splitmix64(u64::from(id) + 1))
}

/// Token keys of `[B, T]` rows (`ids` row-major) whose real tokens are `mask`'s ones (all when
/// `None`): each real token chains the real ids before it in its row; padding gets 0.
pub(crate) fn row_keys(ids: &[u32], mask: Option<&[Vec<u32>]>, b: usize, t: usize) -> Vec<u64> {
    let mut keys = vec![0u64; b * t];
    for r in 0..b {
        let mut k = CHAIN_START;
        for j in 0..t {
            if mask.is_none_or(|m| m[r][j] == 1) {
                k = chain_key(k, ids[r * t + j]);
                keys[r * t + j] = k;
            }
        }
    }
    keys
}

/// Whether LoRA dropout keeps input feature `j` of the token keyed `token` (probability 1 − p),
/// for the adapter salted `salt` in `round`: a hash below `drop_below` = ⌊p·2⁵³⌋ drops.
fn dropout_keep(salt: u64, round: u64, token: u64, j: usize, drop_below: u64) -> bool {
    let row = splitmix64(salt ^ splitmix64(round) ^ token);
    splitmix64(row ^ (j as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)) >> 11 >= drop_below
}

/// One projection's adapter: A `[r, in]`, B `[out, r]`, the scale α/r and the dropout.
#[derive(Clone)]
pub(crate) struct Adapter {
    pub a: Param,
    pub b: Param,
    scale: f64,
    dropout: f64,
    /// The dropout round (shared by clones; [`crate::Model::set_lora_dropout_round`]).
    round: Arc<AtomicU64>,
    /// This adapter's dropout salt: the run's seed and the adapter's name.
    salt: u64,
    /// The current training forward's token keys, set by the layer from its [`crate::layers::Rope`]
    /// before it runs (so a checkpointed layer's recompute uses the first pass's).
    keys: Arc<Mutex<Option<Arc<DropoutKeys>>>>,
}

impl Adapter {
    /// An adapter of A and B with `cfg`'s scale α/r and dropout, its masks salted by `seed` and
    /// A's name (round 0).
    pub(crate) fn new(a: Param, b: Param, cfg: &LoraConfig, seed: u64) -> Self {
        // FNV-1a over the name: each projection of each layer draws its own masks, as peft's
        // one `nn.Dropout` per adapted module does.
        let name = a.name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, c| {
            (h ^ u64::from(c)).wrapping_mul(0x0100_0000_01B3)
        });
        Self {
            a,
            b,
            scale: cfg.scale(),
            dropout: cfg.dropout,
            round: Arc::new(AtomicU64::new(0)),
            salt: splitmix64(seed) ^ name,
            keys: Arc::new(Mutex::new(None)),
        }
    }

    /// A copy with A and B in new storage and a round and keys of its own (a clone shares
    /// them).
    ///
    /// # Errors
    /// Tensor errors.
    pub(crate) fn try_copy(&self) -> Result<Self> {
        let mut a = self.clone();
        for p in [&mut a.a, &mut a.b] {
            let copy = Var::from_tensor(&p.var.as_tensor().copy()?)?;
            *p = Param::new(p.name.clone(), copy);
        }
        a.round = Arc::new(AtomicU64::new(a.round.load(Ordering::Relaxed)));
        a.keys = Arc::new(Mutex::new(None));
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
        let delta = self.update(x, pass)?;
        Ok((y.to_dtype(delta.dtype())? + delta)?.to_dtype(y.dtype())?)
    }

    /// [`Adapter::forward`] of a fused module whose base output rlvr holds as parts: for x
    /// `[rows, in]` and the parts' base outputs `ys[i]` `[rows, out_i]` (Σ out_i = B's rows, in
    /// B's row order), `ys[i] + ((α/r)·(dropout(x)·Aᵀ)·Bᵀ)[:, part i's columns]`, each in the
    /// adapter dtype and cast back to its y's dtype. This is peft's one adapter on Phi-3's
    /// `qkv_proj` (parts q, k, v) or `gate_up_proj` (gate, up): one dropout mask and one `x·Aᵀ`
    /// for all parts, so A's gradient sums the parts' and B's rows are the parts' own.
    ///
    /// # Errors
    /// The parts' widths do not sum to B's rows; tensor errors.
    pub fn forward_parts(&self, x: &Tensor, ys: &[&Tensor], pass: Pass) -> Result<Vec<Tensor>> {
        let delta = self.update(x, pass)?;
        let out = delta.dim(1)?;
        let widths = ys
            .iter()
            .map(|y| y.dim(1))
            .collect::<candle_core::Result<Vec<_>>>()?;
        if widths.iter().sum::<usize>() != out {
            return Err(ModelError::Invalid(format!(
                "LoRA {}: parts of widths {widths:?} for B's {out} rows",
                self.a.name
            )));
        }
        let mut at = 0;
        ys.iter()
            .zip(widths)
            .map(|(y, w)| {
                let d = delta.narrow(1, at, w)?;
                at += w;
                Ok((y.to_dtype(d.dtype())? + d)?.to_dtype(y.dtype())?)
            })
            .collect()
    }

    /// The update `(α/r)·((dropout(x)·Aᵀ)·Bᵀ)` `[rows, out]` of x `[rows, in]`, in the adapter
    /// dtype.
    fn update(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let dt = self.a.var.dtype();
        let mut xa = x.to_dtype(dt)?;
        if pass.dropout && self.dropout > 0.0 {
            xa = (xa * self.dropout_mask(x.dims(), x.device())?)?;
        }
        let (a, b) = (self.a.get(pass.grad), self.b.get(pass.grad));
        Ok((xa.matmul(&a.t()?)?.matmul(&b.t()?)? * self.scale)?)
    }

    /// The dropout round ([`crate::Model::lora_dropout_round`]).
    pub(crate) fn round(&self) -> u64 {
        self.round.load(Ordering::Relaxed)
    }

    /// Sets the dropout round (resume; the trainer's next update).
    pub(crate) fn set_round(&self, n: u64) {
        self.round.store(n, Ordering::Relaxed)
    }

    /// Sets the token keys the next training forwards' masks use (the layer does, from its
    /// rotary embedding's [`crate::layers::Rope::dropout`]).
    pub(crate) fn set_keys(&self, keys: Option<Arc<DropoutKeys>>) {
        *self.keys.lock().unwrap_or_else(|e| e.into_inner()) = keys;
    }

    /// An inverted-dropout mask (0 or 1/(1−p)) of `shape` `[.., in]`, element (token t, feature j)
    /// kept by [`dropout_keep`] with the current keys.
    ///
    /// Errors: no keys set, or not one key per token row of `shape`.
    fn dropout_mask(&self, shape: &[usize], device: &Device) -> Result<Tensor> {
        let keys =
            (self.keys.lock().unwrap_or_else(|e| e.into_inner()).clone()).ok_or_else(|| {
                ModelError::Invalid("LoRA dropout: a training forward without token keys".into())
            })?;
        let cols = shape.last().copied().unwrap_or(1);
        let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
        if keys.tokens.len() != rows {
            return Err(ModelError::Invalid(format!(
                "LoRA dropout: {} token keys for {rows} rows of {shape:?}",
                keys.tokens.len()
            )));
        }
        let keep = (1.0 / (1.0 - self.dropout)) as f32;
        let drop_below = (self.dropout * (1u64 << 53) as f64) as u64;
        let mut m = vec![0f32; rows * cols];
        // Each element is a function of its keys alone: rows in parallel give the same bits.
        use rayon::prelude::*;
        (m.par_chunks_mut(cols).zip(&keys.tokens[..])).for_each(|(row, &token)| {
            for (j, x) in row.iter_mut().enumerate() {
                if dropout_keep(self.salt, keys.round, token, j, drop_below) {
                    *x = keep;
                }
            }
        });
        Ok(Tensor::from_vec(m, shape, device)?.to_dtype(self.a.var.dtype())?)
    }
}
