//! The decoder's private blocks, in candle's model-file order: the weight loader, then linear,
//! RMSNorm, rotary embedding, attention, MLP and decoder layer, each with `new(config, weights)`
//! and `forward`. Weight paths are built with [`Vb::pp`] and equal the checkpoint names, so the
//! constructors are the model's one weight list.
//!
//! Every block runs in one of three modes, given by [`Pass`]: training (the autograd graph is
//! built through the weights), scoring (no graph), and cached inference (no graph; on the CPU in
//! f32 the few-row matmuls of a decode step take the skinny kernel, `rlvr_kernels::skinny`).

use std::cell::RefCell;
use std::sync::{Arc, RwLock};

use candle_core::{DType, Device, Tensor, Var};
pub(crate) use rlvr_kernels::triton::families::attention::Layout as FusedLayout;

use crate::config::{Arch, ModelConfig, RopeScaling};
use crate::error::Result;
use crate::kernels::{AttnKind, Fused, FusedRope};
use crate::kv::KvStore;
use crate::lora::Adapter;
use crate::ops::{rms_norm, rms_norm_plus_one, rope, softmax, upcast};
use crate::param::{Param, Pass};

/// The source of a model's weights: `(checkpoint name, shape) → Var`.
pub(crate) type Loader<'a> = dyn FnMut(&str, &[usize]) -> Result<Var> + 'a;

/// A weight loader positioned at a name prefix (candle's `VarBuilder::pp`).
pub(crate) struct Vb<'a, 'b> {
    prefix: String,
    load: &'a RefCell<&'b mut Loader<'b>>,
}

impl<'a, 'b> Vb<'a, 'b> {
    pub fn root(load: &'a RefCell<&'b mut Loader<'b>>) -> Self {
        Self {
            prefix: String::new(),
            load,
        }
    }

    /// The loader at `prefix.name`.
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        Self {
            prefix,
            load: self.load,
        }
    }

    /// Loads weight `prefix.name` of `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Param> {
        let full = self.pp(name).prefix;
        let mut load = self.load.borrow_mut();
        let var = (*load)(&full, shape)?;
        Ok(Param::new(full, var))
    }

    /// Loads `prefix.name` when `present`.
    pub fn get_if(&self, present: bool, name: &str, shape: &[usize]) -> Result<Option<Param>> {
        present.then(|| self.get(name, shape)).transpose()
    }
}

/// `x · wᵀ + b` over the last dimension: x `[.., in]`, w `[out, in]` → `[.., out]`, plus a LoRA
/// adapter's `(α/r)·B·(A·x)` when one is attached ([`crate::lora`]).
#[derive(Clone)]
pub(crate) struct Linear {
    pub weight: Param,
    pub bias: Option<Param>,
    pub lora: Option<crate::lora::Adapter>,
}

impl Linear {
    /// Loads `weight` `[out, in]` and, when `bias`, `bias` `[out]` under `vb`.
    pub fn new(vb: Vb, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let weight = vb.get("weight", &[out, inp])?;
        let bias = vb.get_if(bias, "bias", &[out])?;
        Ok(Self {
            weight,
            bias,
            lora: None,
        })
    }

    /// A linear layer over an existing weight (the lm_head tied to the embedding).
    pub fn tied(weight: Param) -> Self {
        Self {
            weight,
            bias: None,
            lora: None,
        }
    }

    pub fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let w = self.weight.get(pass.base);
        let dims = x.dims();
        let inner = *dims.last().expect("linear input has a last dimension");
        let rows: usize = dims[..dims.len() - 1].iter().product();
        let x2 = x.reshape((rows, inner))?;
        // Decode fast path: few rows, f32 on the CPU (an implementation detail of this layer).
        let skinny = if pass.fast && !pass.grad && rows <= rlvr_kernels::skinny::MAX_ROWS {
            rlvr_kernels::skinny_matmul(&x2, w)
        } else {
            None
        };
        let y = match skinny {
            Some(y) => y?,
            None => x2.matmul(&w.t()?)?,
        };
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b.get(pass.base))?,
            None => y,
        };
        let y = match &self.lora {
            Some(a) => a.forward(&x2, &y, pass)?,
            None => y,
        };
        let mut out = dims.to_vec();
        *out.last_mut().expect("non-empty dims") = w.dim(0)?;
        Ok(y.reshape(out)?)
    }

    /// The params, weight then bias.
    fn params<'s>(&'s self, out: &mut Vec<&'s Param>) {
        out.push(&self.weight);
        out.extend(self.bias.as_ref());
    }
}

/// RMSNorm over the last dimension, in f32 (transformers' `Qwen2RMSNorm`), or Gemma's scaling
/// by `1 + weight` ([`rms_norm_plus_one`], `Gemma2RMSNorm`) when `plus_one`.
#[derive(Clone)]
pub(crate) struct RmsNorm {
    pub weight: Param,
    eps: f64,
    /// Gemma's norm: `(1 + weight)` in f32, cast after the product.
    plus_one: bool,
    /// Through the fused kernels (`kernels.rms_norm`, [`crate::kernels::rms_norm`]; never for
    /// Gemma's norm: `kernels::uncovered`).
    pub fused: bool,
}

impl RmsNorm {
    pub fn new(vb: Vb, size: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: vb.get("weight", &[size])?,
            eps,
            plus_one: false,
            fused: false,
        })
    }

    /// The norm of a model of `cfg`: Gemma's `1 + weight` form for the Gemma architectures.
    pub fn of(cfg: &ModelConfig, vb: Vb, size: usize) -> Result<Self> {
        let mut n = Self::new(vb, size, cfg.rms_norm_eps)?;
        n.plus_one = cfg.arch.is_gemma();
        Ok(n)
    }

    pub fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let w = self.weight.get(pass.base);
        if self.plus_one {
            return rms_norm_plus_one(x, w, self.eps);
        }
        if self.fused {
            return crate::kernels::rms_norm(x, w, self.eps);
        }
        rms_norm(x, w, self.eps)
    }

    /// The residual add before the norm: `h = residual + x` and this norm of `h`, as `(h, y)`
    /// (fused into one kernel when [`RmsNorm::fused`], [`crate::kernels::rms_norm_add`]).
    pub fn forward_add(
        &self,
        residual: &Tensor,
        x: &Tensor,
        pass: Pass,
    ) -> Result<(Tensor, Tensor)> {
        let w = self.weight.get(pass.base);
        if self.fused && !self.plus_one {
            return crate::kernels::rms_norm_add(residual, x, w, self.eps);
        }
        let h = (residual + x)?;
        let y = self.forward(&h, pass)?;
        Ok((h, y))
    }
}

/// cos/sin tables of positions `0..n`, `[n, head_dim]` in the compute dtype, and in f32 (the
/// fused rotary kernels' tables).
struct RopeTable {
    n: usize,
    cos: Tensor,
    sin: Tensor,
    cos32: Tensor,
    sin32: Tensor,
}

/// A rotary table grown on demand, shared by the clones of a [`Rotary`].
type TableSlot = Arc<RwLock<Option<Arc<RopeTable>>>>;

/// A forward's rotary embedding: cos and sin `[B, T, 1, hd]` of its positions (compute dtype)
/// and, when fused rotary is on, what the kernels take instead.
#[derive(Clone)]
pub(crate) struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
    pub fused: Option<FusedRope>,
    /// Gemma 3's sliding layers' own cos and sin `[B, T, 1, hd]` (their base
    /// `rope_local_base_freq`, no scaling); `None` when every layer rotates with `cos`/`sin`.
    pub local: Option<(Tensor, Tensor)>,
    /// LoRA dropout's token keys of this forward (training forwards with dropout only): each
    /// layer hands them to its adapters before it runs.
    pub dropout: Option<Arc<crate::lora::DropoutKeys>>,
}

/// Rotary position embedding (`x·cos + rotate_half(x)·sin`, transformers' `apply_rotary_pos_emb`)
/// with tables computed in f32 (`position · inv_freq`, then cos/sin times the rope type's
/// attention factor (YaRN's; 1 otherwise), then cast to the compute dtype), grown on demand and
/// shared by clones. With dynamic NTK scaling, a forward reaching past `max_position_embeddings`
/// gets a table of its own ([`ModelConfig::rope_inv_freq_for`] of its largest position); with
/// LongRoPE, a forward reaching past `original_max_position_embeddings` reads the long-factor
/// table (grown on demand and shared too), any other the short-factor one. The tables are
/// `rotary_dim` wide ([`ModelConfig::rotary_dim`]: partial rotary).
#[derive(Clone)]
pub(crate) struct Rotary {
    inv_freq: Arc<Vec<f32>>,
    /// YaRN's attention factor on cos and sin (1 otherwise).
    scale: f32,
    /// The configuration, for dynamic NTK scaling's per-forward tables.
    config: Arc<ModelConfig>,
    table: TableSlot,
    /// LongRoPE's long-factor frequencies and table (`None` for every other rope type).
    long: Option<(Arc<Vec<f32>>, TableSlot)>,
    dtype: DType,
    device: Device,
}

impl Rotary {
    pub fn new(cfg: &ModelConfig, dtype: DType, device: &Device) -> Self {
        let inv_freq = cfg.rope_inv_freq().iter().map(|&x| x as f32).collect();
        let long = matches!(cfg.rope_scaling, Some(RopeScaling::LongRope { .. })).then(|| {
            let f = (cfg.rope_inv_freq_for(usize::MAX).iter())
                .map(|&x| x as f32)
                .collect();
            (Arc::new(f), Arc::new(RwLock::new(None)))
        });
        Self {
            inv_freq: Arc::new(inv_freq),
            long,
            scale: cfg.rope_attention_factor() as f32,
            config: Arc::new(cfg.clone()),
            table: Arc::new(RwLock::new(None)),
            dtype,
            device: device.clone(),
        }
    }

    /// The cos/sin table of positions `0..n` for inverse frequencies `inv_freq`.
    fn build(&self, inv_freq: &[f32], n: usize) -> Result<RopeTable> {
        let half = inv_freq.len();
        let (mut cos, mut sin) = (
            Vec::with_capacity(n * 2 * half),
            Vec::with_capacity(n * 2 * half),
        );
        for p in 0..n {
            for _ in 0..2 {
                for &f in inv_freq {
                    let a = p as f32 * f;
                    cos.push(a.cos() * self.scale);
                    sin.push(a.sin() * self.scale);
                }
            }
        }
        let (cos32, sin32) = (
            Tensor::from_vec(cos, (n, 2 * half), &self.device)?,
            Tensor::from_vec(sin, (n, 2 * half), &self.device)?,
        );
        Ok(RopeTable {
            n,
            cos: cos32.to_dtype(self.dtype)?,
            sin: sin32.to_dtype(self.dtype)?,
            cos32,
            sin32,
        })
    }

    /// A table covering positions `0..n` (at least).
    fn table(&self, n: usize) -> Result<Arc<RopeTable>> {
        if self.config.rope_is_dynamic_at(n) {
            // Dynamic NTK past max_position_embeddings: this forward's own frequencies.
            let inv: Vec<f32> = (self.config.rope_inv_freq_for(n).iter())
                .map(|&x| x as f32)
                .collect();
            return Ok(Arc::new(self.build(&inv, n)?));
        }
        // LongRoPE: the long factors' table for a forward past the original context.
        let (inv_freq, slot) = match &self.long {
            Some((inv, slot)) if self.config.rope_is_long_at(n) => (inv, slot),
            _ => (&self.inv_freq, &self.table),
        };
        if let Some(t) = &*slot.read().unwrap_or_else(|e| e.into_inner()) {
            if t.n >= n {
                return Ok(t.clone());
            }
        }
        let n = n.next_power_of_two().max(256);
        // Dynamic NTK: rows past max_position_embeddings would belong to another table.
        let n = match self.config.rope_scaling {
            Some(crate::config::RopeScaling::Dynamic { .. }) => {
                n.min(self.config.max_position_embeddings)
            }
            _ => n,
        };
        let t = Arc::new(self.build(inv_freq, n)?);
        *slot.write().unwrap_or_else(|e| e.into_inner()) = Some(t.clone());
        Ok(t)
    }

    /// The tables cos and sin `[n, head_dim]` of positions `0..n` (compute dtype).
    pub fn tables(&self, n: usize) -> Result<(Tensor, Tensor)> {
        let t = self.table(n)?;
        Ok((t.cos.narrow(0, 0, n)?, t.sin.narrow(0, 0, n)?))
    }

    /// The fused rotary kernels' inputs for `positions` (`B·T`, row-major): [`FusedRope`].
    pub fn fused(&self, positions: &[u32]) -> Result<FusedRope> {
        let max = positions.iter().copied().max().unwrap_or(0) as usize;
        let table = self.table(max + 1)?;
        let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        Ok(FusedRope {
            pos: Tensor::from_slice(&pos, pos.len(), &self.device)?,
            pos_host: Arc::new(pos),
            cos: table.cos32.clone(),
            sin: table.sin32.clone(),
        })
    }

    /// cos and sin `[B, T, 1, rotary_dim]` of `positions` (`B·T`, row-major). With LongRoPE each
    /// row reads the table of its own largest position (short factors up to
    /// `original_max_position_embeddings`, long past it): the values a forward of that sequence
    /// alone gives in transformers, whatever else shares the batch.
    pub fn forward(&self, positions: &[u32], b: usize, t: usize) -> Result<(Tensor, Tensor)> {
        let hd = 2 * self.inv_freq.len();
        if self.long.is_some() && t > 0 {
            let long: Vec<bool> = (positions.chunks(t))
                .map(|row| {
                    let max = row.iter().copied().max().unwrap_or(0) as usize;
                    self.config.rope_is_long_at(max + 1)
                })
                .collect();
            if long.iter().any(|&l| l) && !long.iter().all(|&l| l) {
                // Mixed rows: index the short table, then the long one after it.
                let max = |want: bool| {
                    (positions.chunks(t).zip(&long))
                        .filter(|(_, &l)| l == want)
                        .flat_map(|(row, _)| row.iter().copied())
                        .max()
                        .unwrap_or(0) as usize
                };
                let (short, long_t) = (self.table(max(false) + 1)?, self.table(max(true) + 1)?);
                let n = short.n as u32;
                let idx: Vec<u32> = (positions.chunks(t).zip(&long))
                    .flat_map(|(row, &l)| row.iter().map(move |&p| if l { p + n } else { p }))
                    .collect();
                let idx = Tensor::from_vec(idx, positions.len(), &self.device)?;
                let cos = Tensor::cat(&[&short.cos, &long_t.cos], 0)?;
                let sin = Tensor::cat(&[&short.sin, &long_t.sin], 0)?;
                let cos = cos.index_select(&idx, 0)?.reshape((b, t, 1, hd))?;
                let sin = sin.index_select(&idx, 0)?.reshape((b, t, 1, hd))?;
                return Ok((cos, sin));
            }
        }
        let max = positions.iter().copied().max().unwrap_or(0) as usize;
        let table = self.table(max + 1)?;
        let idx = Tensor::from_slice(positions, positions.len(), &self.device)?;
        let cos = table.cos.index_select(&idx, 0)?.reshape((b, t, 1, hd))?;
        let sin = table.sin.index_select(&idx, 0)?.reshape((b, t, 1, hd))?;
        Ok((cos, sin))
    }
}

/// A large negative logit bias for masked attention positions. Finite (not −∞) so that a query
/// row with no visible key (a left-padding position) gives a uniform softmax instead of NaN; such
/// rows are padding and never scored.
pub const MASK_BIAS: f32 = -1e30;

/// An additive attention bias (`[.., S]`, 0 visible, [`MASK_BIAS`] hidden, any float dtype)
/// through a sliding window of `size` tokens: each query keeps only the `size` last of the keys
/// it sees, itself included, and the others are hidden. A query's visible keys are its row's
/// earlier tokens in position order, one per position (causal padding masks, the shared-prefix
/// layout, a cache's kept columns), so this is transformers' `q − k < size` on positions
/// whatever the padding or layout. `None` when it hides nothing (S ≤ `size`, or no query sees
/// more than `size` keys).
///
/// Errors: tensor errors.
pub(crate) fn window_bias(bias: &Tensor, size: usize) -> Result<Option<Tensor>> {
    let s = bias.dim(bias.rank() - 1)?;
    if s <= size {
        return Ok(None);
    }
    let mut host = bias.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let mut changed = false;
    for row in host.chunks_mut(s) {
        let mut seen = 0usize;
        for x in row.iter_mut().rev() {
            if *x > MASK_BIAS * 0.5 {
                seen += 1;
                if seen > size {
                    *x = MASK_BIAS;
                    changed = true;
                }
            }
        }
    }
    if !changed {
        return Ok(None);
    }
    let t = Tensor::from_vec(host, bias.shape(), bias.device())?;
    Ok(Some(t.to_dtype(bias.dtype())?))
}

/// Which keys each query of a forward attends to.
#[derive(Clone)]
pub(crate) enum AttnMask {
    /// Every row of `[B, T]` attends within itself (and to its cached past): the additive bias
    /// `[B, 1, 1, T or 1, S]` in the reduction dtype (0 visible, [`MASK_BIAS`] not),
    /// and, when fused attention is on and the bias is a causal padding mask without a cache, the
    /// kernels' layout of the same rows over the flat `B·T` axis, and the same bias through the
    /// model's sliding window ([`window_bias`]) when it hides a key (the sliding layers' mask).
    Dense(Tensor, Option<Arc<FusedLayout>>, Option<Tensor>),
    /// The shared-prefix layout of [`crate::shared_prefix`]: one flat `[1, N]` forward holding
    /// each group's prompt once and every completion row.
    Shared(Arc<SharedLayout>),
}

/// Geometry and masks of a shared-prefix forward: G prompts padded to P positions, then R
/// completion rows padded to C positions, flattened to N = G·P + R·C positions.
pub(crate) struct SharedLayout {
    /// G: prompts (groups or parts of groups).
    pub groups: usize,
    /// P: positions per prompt (the longest prompt; shorter ones right-padded).
    pub prompt_len: usize,
    /// R: completion rows.
    pub rows: usize,
    /// C: positions per completion row (may be 0: then no completion part).
    pub comp_len: usize,
    /// `[R]` u32: the prompt (0..G) each completion row continues.
    pub row_group: Tensor,
    /// `[G, 1, 1, P, P]` (reduction dtype): causal within each prompt, its padding hidden.
    pub prompt_bias: Tensor,
    /// `[R, 1, 1, C, P + C]` (reduction dtype): the row's prompt keys (its padding hidden), then
    /// its own keys causally (its padding hidden); `None` when C = 0.
    pub comp_bias: Option<Tensor>,
    /// `prompt_bias` and `comp_bias` through the model's sliding window ([`window_bias`]), for
    /// the sliding layers; `None` where the window hides nothing.
    pub prompt_bias_window: Option<Tensor>,
    /// See [`SharedLayout::prompt_bias_window`].
    pub comp_bias_window: Option<Tensor>,
    /// The fused attention kernels' layout of the same positions (each prompt once, each
    /// completion row seeing its prompt's keys as a prefix), when fused attention is on.
    pub fused: Option<Arc<FusedLayout>>,
}

impl SharedLayout {
    /// N = G·P + R·C: positions of the flat forward.
    pub fn positions(&self) -> usize {
        self.groups * self.prompt_len + self.rows * self.comp_len
    }
}

/// Multi-head attention with grouped KV heads (no repetition), optional q/k RMSNorm (Qwen3,
/// Gemma 3), Gemma's scale and softcapping.
#[derive(Clone)]
pub(crate) struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// Phi-3's LoRA adapter on the checkpoint's fused `qkv_proj` (B's rows: q's, k's, v's), which
    /// rlvr holds as the three projections above ([`crate::lora::Adapter::forward_parts`]).
    pub qkv_lora: Option<crate::lora::Adapter>,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    /// The sliding window when this layer attends through one (its mask is then the window's:
    /// [`AttnMask::Dense`]'s third field, [`SharedLayout::prompt_bias_window`]).
    window: Option<usize>,
    /// The scores' scale: `head_dim^-½`, Gemma's `query_pre_attn_scalar^-½`.
    scale: f64,
    /// Gemma 2's attention softcapping: scores become `cap · tanh(scores / cap)` before the mask.
    softcap: Option<f64>,
    /// Which fused kernels this layer's attention takes ([`crate::Model::set_kernels`]).
    pub fused: Fused,
}

impl Attention {
    /// The attention of decoder layer `layer`.
    pub fn new(cfg: &ModelConfig, layer: usize, vb: Vb) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
        let qk_norm = matches!(cfg.arch, Arch::Qwen3 | Arch::Gemma3);
        // Loaded in this order (random init draws weights in load order).
        let q_proj = Linear::new(vb.pp("q_proj"), q, h, cfg.qkv_bias)?;
        let k_proj = Linear::new(vb.pp("k_proj"), kv, h, cfg.qkv_bias)?;
        let v_proj = Linear::new(vb.pp("v_proj"), kv, h, cfg.qkv_bias)?;
        let o_proj = Linear::new(vb.pp("o_proj"), h, q, cfg.o_bias)?;
        let norm = |name: &str| -> Result<Option<RmsNorm>> {
            qk_norm
                .then(|| RmsNorm::of(cfg, vb.pp(name), hd))
                .transpose()
        };
        Ok(Self {
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            qkv_lora: None,
            n_heads: cfg.num_attention_heads,
            n_kv: cfg.num_key_value_heads,
            head_dim: hd,
            window: (cfg.sliding_window.as_ref())
                .filter(|w| w.layers.get(layer).copied().unwrap_or(false))
                .map(|w| w.size),
            scale: match &cfg.gemma {
                Some(g) => 1.0 / g.query_pre_attn_scalar.sqrt(),
                None => 1.0 / (hd as f64).sqrt(),
            },
            softcap: cfg.gemma.as_ref().and_then(|g| g.attn_logit_softcapping),
            fused: Fused::default(),
        })
    }

    /// x `[B, T, H]`; `rope_cs` the positions' rotary embedding ([`Rope`]); `mask` which keys each query sees
    /// ([`AttnMask`]); `cache` the store and this layer's index (dense masks only).
    pub fn forward(
        &self,
        x: &Tensor,
        rope_cs: &Rope,
        mask: &AttnMask,
        cache: Option<(&mut (dyn KvStore + '_), usize)>,
        pass: Pass,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (self.n_heads, self.n_kv, self.head_dim);
        // A sliding layer attends through the window's mask (and the fused kernels through
        // their `window` argument, below).
        let windowed;
        let mask = match (self.window, mask) {
            (Some(_), AttnMask::Dense(_, l, Some(w))) => {
                windowed = AttnMask::Dense(w.clone(), l.clone(), None);
                &windowed
            }
            _ => mask,
        };
        let shared_window = self.window.is_some();
        let (q, k, v) = self.project_qkv(x, pass)?;
        let q = q.reshape((b, t, nh, hd))?;
        let k = k.reshape((b, t, nkv, hd))?;
        let v = v.reshape((b, t, nkv, hd))?;
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => (qn.forward(&q, pass)?, kn.forward(&k, pass)?),
            _ => (q, k),
        };
        // Gemma 3's sliding layers rotate with their own (local) table.
        let (cos, sin) = match (&rope_cs.local, self.window) {
            (Some((c, s)), Some(_)) => (c, s),
            _ => (&rope_cs.cos, &rope_cs.sin),
        };
        // The decode kernels' launch recorder (CPU, `kernels.decode = "on"`, tests): the step's
        // tensors before the rotary embedding.
        let decode_rec = (self.fused.decode && t == 1 && cache.is_some())
            .then(crate::kernels::recording)
            .unwrap_or(false)
            .then(|| (q.clone(), k.clone(), v.clone()));
        let (q, k) = match &rope_cs.fused {
            Some(f) if self.fused.rotary => crate::kernels::rotary(&q, &k, cos, sin, f)?,
            _ => (rope(&q, cos, sin)?, rope(&k, cos, sin)?),
        };
        // With a cache, the fused path takes a prefill into an empty one, or new positions after
        // `past` cached ones when `Model::forward_masked` built their layout (its flat axis:
        // the `B·T` new positions, then the `B·past` cached ones as key-only rows); the keys and
        // values are stored below.
        let past = cache.as_ref().map_or(0, |(s, _)| s.len());
        let fused = match mask {
            _ if !self.fused.attention => None,
            AttnMask::Dense(_, Some(l), _) if past == 0 => Some((AttnKind::Dense, l.clone())),
            AttnMask::Dense(_, Some(l), _) if l.n_tokens == b * (t + past) => {
                Some((AttnKind::Kept, l.clone()))
            }
            AttnMask::Dense(..) => None,
            AttnMask::Shared(l) if past == 0 => l.fused.clone().map(|f| (AttnKind::Shared, f)),
            AttnMask::Shared(_) => None,
        };
        // A sliding layer's kernels get its window (the layout is the model's, for every layer).
        let fused = fused.map(|(kind, l)| match self.window {
            Some(w) => (
                kind,
                Arc::new(FusedLayout {
                    window: w,
                    ..(*l).clone()
                }),
            ),
            None => (kind, l),
        });
        if let Some((kind, layout)) = fused {
            let n = b * t;
            let flat = |x: &Tensor, heads: usize| -> Result<Tensor> {
                Ok(x.reshape((n, heads, hd))?.contiguous()?)
            };
            // The candle composition over the same tensors: the CPU's result (and the records'
            // expectation under the launch recorder).
            let composition = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
                let (q, k, v) = (
                    q.reshape((b, t, nh, hd))?,
                    k.reshape((b, t, nkv, hd))?,
                    v.reshape((b, t, nkv, hd))?,
                );
                let o = match mask {
                    AttnMask::Dense(bias, ..) => {
                        let q = q.transpose(1, 2)?.contiguous()?;
                        let k = k.transpose(1, 2)?.contiguous()?;
                        let v = v.transpose(1, 2)?.contiguous()?;
                        self.attend(&q, &k, &v, bias)?
                    }
                    AttnMask::Shared(l) => self.attend_shared(&q, &k, &v, l, shared_window)?,
                };
                Ok(o.reshape((n, nh, hd))?)
            };
            let bhtd = |x: &Tensor| -> Result<Tensor> { Ok(x.transpose(1, 2)?.contiguous()?) };
            if kind == AttnKind::Kept {
                let Some((store, layer)) = cache else {
                    return Err(crate::ModelError::Invalid(
                        "attention after cached positions without the cache".into(),
                    ));
                };
                let (k_all, v_all) = store.append(layer, &bhtd(&k)?, &bhtd(&v)?)?;
                // The key axis: the new positions, then each row's cached ones.
                let keys = |new: &Tensor, all: &Tensor| -> Result<Tensor> {
                    let cached = (all.narrow(2, 0, past)?.transpose(1, 2)?.contiguous()?)
                        .reshape((b * past, nkv, hd))?;
                    Ok(Tensor::cat(&[&flat(new, nkv)?, &cached], 0)?)
                };
                let (kf, vf) = (keys(&k, &k_all)?, keys(&v, &v_all)?);
                let AttnMask::Dense(bias, ..) = mask else {
                    unreachable!("a kept layout comes with a dense mask")
                };
                let q_bhtd = bhtd(&q)?;
                // What the candle path below computes: the CPU's result (bit for bit) and the
                // records' expectation.
                let composition = |_: &Tensor, _: &Tensor, _: &Tensor| -> Result<Tensor> {
                    let o = self.attend(&q_bhtd, &k_all, &v_all, bias)?;
                    Ok(o.reshape((n, nh, hd))?)
                };
                let o = crate::kernels::attention(
                    kind,
                    layout,
                    &flat(&q, nh)?,
                    &kf,
                    &vf,
                    &composition,
                )?;
                return self.o_proj.forward(&o.reshape((b, t, nh * hd))?, pass);
            }
            if let Some((store, layer)) = cache {
                // A prefill into an empty cache: the new positions are all it attends to.
                store.append(layer, &bhtd(&k)?, &bhtd(&v)?)?;
            }
            let o = crate::kernels::attention(
                kind,
                layout,
                &flat(&q, nh)?,
                &flat(&k, nkv)?,
                &flat(&v, nkv)?,
                &composition,
            )?;
            return self.o_proj.forward(&o.reshape((b, t, nh * hd))?, pass);
        }
        let o = match mask {
            AttnMask::Dense(bias, ..) => {
                let q = q.transpose(1, 2)?.contiguous()?; // [B, nh, T, hd]
                let k = k.transpose(1, 2)?.contiguous()?; // [B, nkv, T, hd]
                let v = v.transpose(1, 2)?.contiguous()?;
                let (k, v) = match cache {
                    Some((store, layer)) => store.append(layer, &k, &v)?,
                    None => (k, v),
                };
                let o = self.attend(&q, &k, &v, bias)?;
                if let Some((q0, k0, v0)) = &decode_rec {
                    crate::kernels::record_decode(&crate::kernels::DecodeStep {
                        q: q0,
                        k: k0,
                        v: v0,
                        cos,
                        sin,
                        q_rot: &q,
                        k_all: &k,
                        v_all: &v,
                        bias,
                        o: &o,
                    })?;
                }
                o
            }
            AttnMask::Shared(l) => {
                if cache.is_some() || b != 1 || t != l.positions() {
                    return Err(crate::ModelError::Invalid(format!(
                        "shared-prefix attention over [{b}, {t}] positions (expected [1, {}], no cache)",
                        l.positions()
                    )));
                }
                self.attend_shared(&q, &k, &v, l, shared_window)?
            }
        };
        self.o_proj.forward(&o, pass)
    }

    /// `softmax(q·kᵀ/√d + bias)·v` for q `[B, nh, T, hd]`, k and v `[B, nkv, S, hd]` and `bias`
    /// `[B, 1, 1, T or 1, S]` (reduction dtype), giving `[B, T, nh·hd]`. Grouped-query attention
    /// without repeating K/V: the `rep` query heads of one KV head are stacked along the row axis.
    /// Gemma: the scale is `query_pre_attn_scalar^-½`, and Gemma 2 caps the scaled scores to
    /// `cap · tanh(scores / cap)` in the compute dtype before the bias (transformers'
    /// `eager_attention_forward` with `softcap`).
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let (b, nh, t, hd) = q.dims4()?;
        let nkv = self.n_kv;
        let rep = nh / nkv;
        let s = k.dim(2)?;
        let qg = q.reshape((b, nkv, rep * t, hd))?;
        let scores = (qg.matmul(&k.t()?)? * self.scale)?; // [B, nkv, rep·T, S]
        let scores = match self.softcap {
            Some(cap) => ((scores / cap)?.tanh()? * cap)?,
            None => scores,
        };
        let scores = scores
            .to_dtype(upcast(q.dtype()))?
            .reshape((b, nkv, rep, t, s))?;
        // The mask as a variable while training: `crate::ops::constant_operand`.
        let scores = scores.broadcast_add(&crate::ops::constant_operand(&scores, bias)?)?;
        let p = softmax(&scores)?
            .to_dtype(q.dtype())?
            .reshape((b, nkv, rep * t, s))?;
        let o = p.matmul(v)?; // [B, nkv, rep·T, hd]
        Ok(o.reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))?)
    }

    /// Shared-prefix attention ([`SharedLayout`]): q, k, v `[1, N, heads, hd]` after the rotary
    /// embedding, N = G·P prompt positions then R·C completion positions. The prompts attend
    /// causally within themselves; each completion row attends to its group's prompt keys/values
    /// (gathered per row, so their gradients sum over the rows in the backward) and causally to
    /// its own; through the layout's window masks when `windowed` (a sliding layer). Returns
    /// `[1, N, nh·hd]`.
    fn attend_shared(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        l: &SharedLayout,
        windowed: bool,
    ) -> Result<Tensor> {
        let prompt_bias = match (&l.prompt_bias_window, windowed) {
            (Some(w), true) => w,
            _ => &l.prompt_bias,
        };
        let comp_bias = match (&l.comp_bias_window, windowed) {
            (Some(w), true) => Some(w),
            _ => l.comp_bias.as_ref(),
        };
        let (nh, nkv, hd) = (self.n_heads, self.n_kv, self.head_dim);
        let (g, p, r, c) = (l.groups, l.prompt_len, l.rows, l.comp_len);
        let split =
            |x: &Tensor, heads: usize, at: usize, rows: usize, len: usize| -> Result<Tensor> {
                Ok(x.narrow(1, at, rows * len)?
                    .reshape((rows, len, heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()?)
            };
        let (qp, kp, vp) = (
            split(q, nh, 0, g, p)?,
            split(k, nkv, 0, g, p)?,
            split(v, nkv, 0, g, p)?,
        );
        let op = self
            .attend(&qp, &kp, &vp, prompt_bias)?
            .reshape((g * p, nh * hd))?;
        let o = match comp_bias {
            Some(bias) if c > 0 => {
                let at = g * p;
                let qc = split(q, nh, at, r, c)?;
                let kc = split(k, nkv, at, r, c)?;
                let vc = split(v, nkv, at, r, c)?;
                let kc = Tensor::cat(&[&kp.index_select(&l.row_group, 0)?, &kc], 2)?;
                let vc = Tensor::cat(&[&vp.index_select(&l.row_group, 0)?, &vc], 2)?;
                let oc = self
                    .attend(&qc, &kc, &vc, bias)?
                    .reshape((r * c, nh * hd))?;
                Tensor::cat(&[&op, &oc], 0)?
            }
            _ => op,
        };
        Ok(o.unsqueeze(0)?)
    }

    /// q, k and v `[.., out]` of x `[.., hidden]`, with the fused `qkv_proj` adapter's update
    /// when Phi-3's is attached (each projection's own adapter is its [`Linear`]'s).
    fn project_qkv(&self, x: &Tensor, pass: Pass) -> Result<(Tensor, Tensor, Tensor)> {
        let q = self.q_proj.forward(x, pass)?;
        let k = self.k_proj.forward(x, pass)?;
        let v = self.v_proj.forward(x, pass)?;
        let Some(a) = &self.qkv_lora else {
            return Ok((q, k, v));
        };
        let mut p = fused_lora(a, x, &[q, k, v], pass)?.into_iter();
        let mut next = || p.next().expect("three parts");
        Ok((next(), next(), next()))
    }

    fn params<'s>(&'s self, out: &mut Vec<&'s Param>) {
        for l in [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj] {
            l.params(out);
        }
        out.extend(self.q_norm.as_ref().map(|n| &n.weight));
        out.extend(self.k_norm.as_ref().map(|n| &n.weight));
    }
}

/// `parts` `[.., out_i]` (the base outputs of the projections a fused module's rows hold, of
/// x `[.., in]`) plus the fused module's adapter update, split the same way
/// ([`crate::lora::Adapter::forward_parts`]).
fn fused_lora(
    a: &crate::lora::Adapter,
    x: &Tensor,
    parts: &[Tensor],
    pass: Pass,
) -> Result<Vec<Tensor>> {
    let dims = x.dims();
    let inner = *dims.last().expect("an input with a last dimension");
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let flat = parts
        .iter()
        .map(|p| Ok(p.reshape((rows, p.dim(candle_core::D::Minus1)?))?))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = flat.iter().collect();
    a.forward_parts(&x.reshape((rows, inner))?, &refs, pass)?
        .into_iter()
        .zip(parts)
        .map(|(y, p)| Ok(y.reshape(p.dims())?))
        .collect()
}

/// The SiLU-gated MLP: `down(silu(gate(x)) · up(x))`, or Gemma's GeGLU `down(gelu(gate(x)) ·
/// up(x))` with GELU's tanh approximation (`gelu_pytorch_tanh`; Shazeer 2020, "GLU Variants
/// Improve Transformer", arXiv 2002.05202).
#[derive(Clone)]
pub(crate) struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
    /// Phi-3's LoRA adapter on the checkpoint's fused `gate_up_proj` (B's rows: gate's, then
    /// up's), which rlvr holds as the two projections above.
    pub gate_up_lora: Option<crate::lora::Adapter>,
    /// GeGLU (Gemma) instead of SwiGLU.
    gelu: bool,
    /// The gating through the fused kernels (`kernels.swiglu`, [`crate::kernels::swiglu`]).
    pub fused: bool,
}

impl Mlp {
    pub fn new(cfg: &ModelConfig, vb: Vb) -> Result<Self> {
        let (h, i, bias) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Ok(Self {
            gate_proj: Linear::new(vb.pp("gate_proj"), i, h, bias)?,
            up_proj: Linear::new(vb.pp("up_proj"), i, h, bias)?,
            down_proj: Linear::new(vb.pp("down_proj"), h, i, bias)?,
            gate_up_lora: None,
            gelu: cfg.arch.is_gemma(),
            fused: false,
        })
    }

    pub fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let g = self.gate_proj.forward(x, pass)?;
        let u = self.up_proj.forward(x, pass)?;
        let (g, u) = match &self.gate_up_lora {
            Some(a) => {
                let mut p = fused_lora(a, x, &[g, u], pass)?.into_iter();
                (p.next().expect("gate"), p.next().expect("up"))
            }
            None => (g, u),
        };
        if self.gelu {
            // candle's `gelu` is the tanh approximation (`gelu_erf` the exact one).
            return self.down_proj.forward(&(g.gelu()? * u)?, pass);
        }
        if self.fused {
            return self
                .down_proj
                .forward(&crate::kernels::swiglu(&g, &u)?, pass);
        }
        self.down_proj.forward(&(g.silu()? * u)?, pass)
    }

    fn params<'s>(&'s self, out: &mut Vec<&'s Param>) {
        for l in [&self.gate_proj, &self.up_proj, &self.down_proj] {
            l.params(out);
        }
    }
}

/// One pre-norm decoder layer: `x + attn(norm(x))`, then `x + mlp(norm(x))`; Gemma's
/// sandwich: `x + post_attention_norm(attn(input_norm(x)))`, then
/// `x + post_feedforward_norm(mlp(pre_feedforward_norm(x)))`.
#[derive(Clone)]
pub(crate) struct DecoderLayer {
    input_norm: RmsNorm,
    pub attn: Attention,
    /// `post_attention_layernorm`: the norm before the MLP, or Gemma's norm of the attention's
    /// output.
    post_norm: RmsNorm,
    pub mlp: Mlp,
    /// Gemma's `pre_feedforward_layernorm` and `post_feedforward_layernorm`.
    ff_norms: Option<(RmsNorm, RmsNorm)>,
}

impl DecoderLayer {
    /// Decoder layer `layer` (its index: whether it attends through the sliding window).
    pub fn new(cfg: &ModelConfig, layer: usize, vb: Vb) -> Result<Self> {
        let h = cfg.hidden_size;
        let input_norm = RmsNorm::of(cfg, vb.pp("input_layernorm"), h)?;
        let attn = Attention::new(cfg, layer, vb.pp("self_attn"))?;
        let post_norm = RmsNorm::of(cfg, vb.pp("post_attention_layernorm"), h)?;
        let pre_ff = (cfg.arch.is_gemma())
            .then(|| RmsNorm::of(cfg, vb.pp("pre_feedforward_layernorm"), h))
            .transpose()?;
        let mlp = Mlp::new(cfg, vb.pp("mlp"))?;
        let ff_norms = match pre_ff {
            Some(pre) => Some((
                pre,
                RmsNorm::of(cfg, vb.pp("post_feedforward_layernorm"), h)?,
            )),
            None => None,
        };
        Ok(Self {
            input_norm,
            attn,
            post_norm,
            mlp,
            ff_norms,
        })
    }

    pub fn forward(
        &self,
        x: &Tensor,
        rope_cs: &Rope,
        mask: &AttnMask,
        cache: Option<(&mut (dyn KvStore + '_), usize)>,
        pass: Pass,
    ) -> Result<Tensor> {
        if pass.dropout {
            for (_, _, a) in self.adapter_slots() {
                a.iter().for_each(|a| a.set_keys(rope_cs.dropout.clone()));
            }
        }
        let h = self.input_norm.forward(x, pass)?;
        let a = self.attn.forward(&h, rope_cs, mask, cache, pass)?;
        if let Some((pre, post)) = &self.ff_norms {
            let x = (x + self.post_norm.forward(&a, pass)?)?;
            let m = self.mlp.forward(&pre.forward(&x, pass)?, pass)?;
            return Ok((&x + post.forward(&m, pass)?)?);
        }
        // The residual add and the post-attention norm: one kernel when fused.
        let (x, h) = self.post_norm.forward_add(x, &a, pass)?;
        Ok((&x + self.mlp.forward(&h, pass)?)?)
    }

    /// Sets which fused kernels the layer's blocks take ([`crate::Model::set_kernels`]).
    pub fn set_fused(&mut self, fused: Fused) {
        self.attn.fused = fused;
        for n in [&mut self.input_norm, &mut self.post_norm] {
            n.fused = fused.rms_norm;
        }
        if let Some((pre, post)) = &mut self.ff_norms {
            pre.fused = fused.rms_norm;
            post.fused = fused.rms_norm;
        }
        for n in [&mut self.attn.q_norm, &mut self.attn.k_norm]
            .into_iter()
            .flatten()
        {
            n.fused = fused.rms_norm;
        }
        self.mlp.fused = fused.swiglu;
    }

    /// The layer's LoRA adapter slots, in checkpoint order, each with its module's name under
    /// the layer (PEFT's: `self_attn.q_proj` …), its `(out, in)` widths and its adapter: the
    /// seven projections' own, and Phi-3's fused `self_attn.qkv_proj` (after v) and
    /// `mlp.gate_up_proj` (after up), whose rows are the split projections'
    /// ([`DecoderLayer::slot_weights`]).
    pub fn adapter_slots(&self) -> [(&'static str, (usize, usize), &Option<Adapter>); 9] {
        let (a, m) = (&self.attn, &self.mlp);
        let w = |l: &Linear| (l.weight.var.dims()[0], l.weight.var.dims()[1]);
        let h = w(&a.q_proj).1;
        let qkv = w(&a.q_proj).0 + w(&a.k_proj).0 + w(&a.v_proj).0;
        let gate_up = w(&m.gate_proj).0 + w(&m.up_proj).0;
        [
            ("self_attn.q_proj", w(&a.q_proj), &a.q_proj.lora),
            ("self_attn.k_proj", w(&a.k_proj), &a.k_proj.lora),
            ("self_attn.v_proj", w(&a.v_proj), &a.v_proj.lora),
            ("self_attn.qkv_proj", (qkv, h), &a.qkv_lora),
            ("self_attn.o_proj", w(&a.o_proj), &a.o_proj.lora),
            ("mlp.gate_proj", w(&m.gate_proj), &m.gate_proj.lora),
            ("mlp.up_proj", w(&m.up_proj), &m.up_proj.lora),
            ("mlp.gate_up_proj", (gate_up, h), &m.gate_up_lora),
            ("mlp.down_proj", w(&m.down_proj), &m.down_proj.lora),
        ]
    }

    /// [`DecoderLayer::adapter_slots`], mutable (no widths).
    pub fn adapter_slots_mut(&mut self) -> [(&'static str, &mut Option<Adapter>); 9] {
        let (a, m) = (&mut self.attn, &mut self.mlp);
        [
            ("self_attn.q_proj", &mut a.q_proj.lora),
            ("self_attn.k_proj", &mut a.k_proj.lora),
            ("self_attn.v_proj", &mut a.v_proj.lora),
            ("self_attn.qkv_proj", &mut a.qkv_lora),
            ("self_attn.o_proj", &mut a.o_proj.lora),
            ("mlp.gate_proj", &mut m.gate_proj.lora),
            ("mlp.up_proj", &mut m.up_proj.lora),
            ("mlp.gate_up_proj", &mut m.gate_up_lora),
            ("mlp.down_proj", &mut m.down_proj.lora),
        ]
    }

    /// The weights whose rows an adapter slot's update adds to, in B's row order: the
    /// projection's own, or q/k/v for `self_attn.qkv_proj` and gate/up for `mlp.gate_up_proj`.
    /// Empty for an unknown name.
    pub fn slot_weights(&self, path: &str) -> Vec<&Param> {
        let (a, m) = (&self.attn, &self.mlp);
        let lins: Vec<&Linear> = match path {
            "self_attn.q_proj" => vec![&a.q_proj],
            "self_attn.k_proj" => vec![&a.k_proj],
            "self_attn.v_proj" => vec![&a.v_proj],
            "self_attn.qkv_proj" => vec![&a.q_proj, &a.k_proj, &a.v_proj],
            "self_attn.o_proj" => vec![&a.o_proj],
            "mlp.gate_proj" => vec![&m.gate_proj],
            "mlp.up_proj" => vec![&m.up_proj],
            "mlp.gate_up_proj" => vec![&m.gate_proj, &m.up_proj],
            "mlp.down_proj" => vec![&m.down_proj],
            _ => vec![],
        };
        lins.into_iter().map(|l| &l.weight).collect()
    }

    /// The layer's params in checkpoint order.
    pub fn params<'s>(&'s self, out: &mut Vec<&'s Param>) {
        out.push(&self.input_norm.weight);
        self.attn.params(out);
        out.push(&self.post_norm.weight);
        if let Some((pre, _)) = &self.ff_norms {
            out.push(&pre.weight);
        }
        self.mlp.params(out);
        if let Some((_, post)) = &self.ff_norms {
            out.push(&post.weight);
        }
    }
}
