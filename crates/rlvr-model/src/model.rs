//! The decoder: Qwen2/Qwen2.5, Qwen3 and Llama as one pre-norm transformer, written with
//! differentiable candle-core ops only (candle-nn's fused rope/rms-norm/softmax have no backward:
//! DESIGN.md section 7), so every parameter receives its gradient.
//!
//! Numerics follow transformers' eager implementation: RMSNorm in f32, rotary embedding with
//! `rotate_half`, attention `softmax(q·kᵀ/√d + mask)·v` with grouped KV heads, SiLU-gated MLP.

use std::path::Path;

use candle_core::{DType, Device, Tensor, Var, D};
use rand::SeedableRng;
use rand_distr::Distribution;

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::ops::{linear, log_softmax, rms_norm, rotate_half, softmax, upcast};
use crate::weights::WeightFiles;

/// A large negative logit bias for masked attention positions. Finite (not −∞) so that a query
/// row with no visible key (a left-padding position) gives a uniform softmax instead of NaN; such
/// rows are padding and never scored.
const MASK_BIAS: f32 = -1e30;

/// Weights of one decoder layer.
pub struct Layer {
    pub input_norm: Var,
    pub q_proj: Var,
    pub k_proj: Var,
    pub v_proj: Var,
    pub o_proj: Var,
    pub q_bias: Option<Var>,
    pub k_bias: Option<Var>,
    pub v_bias: Option<Var>,
    pub o_bias: Option<Var>,
    /// Qwen3 per-head RMSNorm weights, `[head_dim]`.
    pub q_norm: Option<Var>,
    pub k_norm: Option<Var>,
    pub post_norm: Var,
    pub gate_proj: Var,
    pub up_proj: Var,
    pub down_proj: Var,
    pub gate_bias: Option<Var>,
    pub up_bias: Option<Var>,
    pub down_bias: Option<Var>,
}

/// A causal language model with trainable weights.
///
/// Weights are candle [`Var`]s in the compute dtype; the training forward builds the autograd
/// graph through them, the inference forward ([`Model::forward_cached`]) detaches them.
pub struct Model {
    pub config: ModelConfig,
    pub embed: Var,
    pub layers: Vec<Layer>,
    pub norm: Var,
    /// `None` when the head is tied to `embed`.
    pub lm_head: Option<Var>,
    inv_freq: Tensor,
    device: Device,
    dtype: DType,
}

/// Per-layer key/value cache for incremental decoding. Keys and values are stored after the
/// rotary embedding, `[B, n_kv_heads, S, head_dim]` per layer.
#[derive(Clone, Default)]
pub struct KvCache {
    pub layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: vec![None; n_layers],
        }
    }

    /// Number of cached positions (0 when empty).
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map(|(k, _)| k.dim(2).unwrap_or(0))
            .unwrap_or(0)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the batch rows `rows` (e.g. to drop finished sequences or to copy one prompt's
    /// cache to the K rows of its group).
    pub fn select_rows(&self, rows: &Tensor) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| match l {
                None => Ok(None),
                Some((k, v)) => Ok(Some((k.index_select(rows, 0)?, v.index_select(rows, 0)?))),
            })
            .collect::<Result<_>>()?;
        Ok(Self { layers })
    }
}

/// Output of [`Model::token_logprobs`].
pub struct LogProbs {
    /// `[B, T-1-start]`, f32 (f64 for an f64 model): log π(x_{t+1} | x_{≤t}) at temperature T for t = start..T-2, i.e.
    /// `log_softmax(logits_t / T)[x_{t+1}]`. Positions whose token or predicted token is padding
    /// hold finite garbage: mask them with the attention mask shifted by one.
    pub logprobs: Tensor,
    /// `[B, T-1-start]` entropy of softmax(logits_t / T), in nats, when asked for.
    pub entropy: Option<Tensor>,
}

/// Converts an attention mask `[B, T]` (1 = token, 0 = padding) to position ids: the number of
/// real tokens before each position (transformers' `cumsum(mask) - 1`, clamped at 0), which makes
/// the result independent of the padding side.
pub fn position_ids(mask: &[Vec<u32>]) -> Vec<Vec<u32>> {
    mask.iter()
        .map(|row| {
            let mut c = 0u32;
            row.iter()
                .map(|&m| {
                    c += m;
                    c.saturating_sub(1)
                })
                .collect()
        })
        .collect()
}

impl Model {
    /// Loads a HuggingFace model directory (config.json + safetensors weights) with weights in
    /// `dtype` (F32 or BF16) on `device`.
    ///
    /// Errors: missing config.json or weights, unknown `model_type`, a missing tensor or a shape
    /// mismatch; each names the file and the tensor.
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        if !cfg_path.exists() {
            return Err(ModelError::MissingFile {
                path: cfg_path,
                what: "model configuration".into(),
            });
        }
        let config = ModelConfig::from_file(&cfg_path)?;
        let files = WeightFiles::open(dir)?;
        let mut load = |name: &str, shape: &[usize]| -> Result<Var> {
            Ok(Var::from_tensor(&files.load(name, shape, dtype, device)?)?)
        };
        Self::build(config, dtype, device, &mut load)
    }

    fn build(
        config: ModelConfig,
        dtype: DType,
        device: &Device,
        load: &mut dyn FnMut(&str, &[usize]) -> Result<Var>,
    ) -> Result<Self> {
        let c = &config;
        let (h, q, kv, i) = (
            c.hidden_size,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
            c.intermediate_size,
        );
        let embed = load("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let p = format!("model.layers.{l}");
            let opt = |flag: bool,
                       load: &mut dyn FnMut(&str, &[usize]) -> Result<Var>,
                       name: String,
                       n: usize|
             -> Result<Option<Var>> {
                if flag {
                    Ok(Some(load(&name, &[n])?))
                } else {
                    Ok(None)
                }
            };
            let qk_norm = c.arch == Arch::Qwen3;
            layers.push(Layer {
                input_norm: load(&format!("{p}.input_layernorm.weight"), &[h])?,
                q_proj: load(&format!("{p}.self_attn.q_proj.weight"), &[q, h])?,
                k_proj: load(&format!("{p}.self_attn.k_proj.weight"), &[kv, h])?,
                v_proj: load(&format!("{p}.self_attn.v_proj.weight"), &[kv, h])?,
                o_proj: load(&format!("{p}.self_attn.o_proj.weight"), &[h, q])?,
                q_bias: opt(c.qkv_bias, load, format!("{p}.self_attn.q_proj.bias"), q)?,
                k_bias: opt(c.qkv_bias, load, format!("{p}.self_attn.k_proj.bias"), kv)?,
                v_bias: opt(c.qkv_bias, load, format!("{p}.self_attn.v_proj.bias"), kv)?,
                o_bias: opt(c.o_bias, load, format!("{p}.self_attn.o_proj.bias"), h)?,
                q_norm: opt(
                    qk_norm,
                    load,
                    format!("{p}.self_attn.q_norm.weight"),
                    c.head_dim,
                )?,
                k_norm: opt(
                    qk_norm,
                    load,
                    format!("{p}.self_attn.k_norm.weight"),
                    c.head_dim,
                )?,
                post_norm: load(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
                gate_proj: load(&format!("{p}.mlp.gate_proj.weight"), &[i, h])?,
                up_proj: load(&format!("{p}.mlp.up_proj.weight"), &[i, h])?,
                down_proj: load(&format!("{p}.mlp.down_proj.weight"), &[h, i])?,
                gate_bias: opt(c.mlp_bias, load, format!("{p}.mlp.gate_proj.bias"), i)?,
                up_bias: opt(c.mlp_bias, load, format!("{p}.mlp.up_proj.bias"), i)?,
                down_bias: opt(c.mlp_bias, load, format!("{p}.mlp.down_proj.bias"), h)?,
            });
        }
        let norm = load("model.norm.weight", &[h])?;
        // Some tied checkpoints still store lm_head.weight; tying wins, as in transformers.
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(load("lm_head.weight", &[c.vocab_size, h])?)
        };
        let inv_freq: Vec<f32> = c.rope_inv_freq().iter().map(|&x| x as f32).collect();
        let inv_freq = Tensor::from_vec(inv_freq, c.head_dim / 2, device)?;
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            lm_head,
            inv_freq,
            device: device.clone(),
            dtype,
        })
    }

    /// A randomly initialised model (weights ~ N(0, `init_std`), norms 1, biases 0), as
    /// transformers' `_init_weights` with `initializer_range = init_std`. Deterministic in `seed`.
    pub fn random(
        config: ModelConfig,
        init_std: f64,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let normal = rand_distr::Normal::new(0.0f32, init_std as f32)
            .map_err(|e| ModelError::Invalid(format!("init_std: {e}")))?;
        let mut load = |name: &str, shape: &[usize]| -> Result<Var> {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("norm.weight") {
                vec![1.0; n]
            } else if name.ends_with(".bias") {
                vec![0.0; n]
            } else {
                (0..n).map(|_| normal.sample(&mut rng)).collect()
            };
            let t = Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?;
            Ok(Var::from_tensor(&t)?)
        };
        Self::build(config, dtype, device, &mut load)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype of the weights.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Every trainable weight with its HuggingFace tensor name, in a fixed order. Tied models list
    /// the embedding once (as `model.embed_tokens.weight`).
    pub fn named_vars(&self) -> Vec<(String, &Var)> {
        let mut v: Vec<(String, &Var)> = vec![("model.embed_tokens.weight".into(), &self.embed)];
        for (l, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{l}");
            v.push((format!("{p}.input_layernorm.weight"), &layer.input_norm));
            v.push((format!("{p}.self_attn.q_proj.weight"), &layer.q_proj));
            if let Some(b) = &layer.q_bias {
                v.push((format!("{p}.self_attn.q_proj.bias"), b));
            }
            v.push((format!("{p}.self_attn.k_proj.weight"), &layer.k_proj));
            if let Some(b) = &layer.k_bias {
                v.push((format!("{p}.self_attn.k_proj.bias"), b));
            }
            v.push((format!("{p}.self_attn.v_proj.weight"), &layer.v_proj));
            if let Some(b) = &layer.v_bias {
                v.push((format!("{p}.self_attn.v_proj.bias"), b));
            }
            v.push((format!("{p}.self_attn.o_proj.weight"), &layer.o_proj));
            if let Some(b) = &layer.o_bias {
                v.push((format!("{p}.self_attn.o_proj.bias"), b));
            }
            if let Some(n) = &layer.q_norm {
                v.push((format!("{p}.self_attn.q_norm.weight"), n));
            }
            if let Some(n) = &layer.k_norm {
                v.push((format!("{p}.self_attn.k_norm.weight"), n));
            }
            v.push((
                format!("{p}.post_attention_layernorm.weight"),
                &layer.post_norm,
            ));
            v.push((format!("{p}.mlp.gate_proj.weight"), &layer.gate_proj));
            if let Some(b) = &layer.gate_bias {
                v.push((format!("{p}.mlp.gate_proj.bias"), b));
            }
            v.push((format!("{p}.mlp.up_proj.weight"), &layer.up_proj));
            if let Some(b) = &layer.up_bias {
                v.push((format!("{p}.mlp.up_proj.bias"), b));
            }
            v.push((format!("{p}.mlp.down_proj.weight"), &layer.down_proj));
            if let Some(b) = &layer.down_bias {
                v.push((format!("{p}.mlp.down_proj.bias"), b));
            }
        }
        v.push(("model.norm.weight".into(), &self.norm));
        if let Some(h) = &self.lm_head {
            v.push(("lm_head.weight".into(), h));
        }
        v
    }

    fn w(&self, v: &Var, grad: bool) -> Tensor {
        if grad {
            v.as_tensor().clone()
        } else {
            v.as_tensor().detach()
        }
    }

    fn wo(&self, v: &Option<Var>, grad: bool) -> Option<Tensor> {
        v.as_ref().map(|v| self.w(v, grad))
    }

    /// Runs the decoder stack and the final norm.
    ///
    /// - `ids`: `[B, T]` u32 token ids of the new positions.
    /// - `positions`: `[B, T]` rotary positions of those tokens.
    /// - `bias`: `[B, 1, T, S]` additive attention bias (0 visible, [`MASK_BIAS`] hidden) over the
    ///   S = cached + T key positions.
    /// - `cache`: when given, keys/values of earlier positions are read from it and the new ones
    ///   appended.
    /// - `grad`: build the autograd graph through the weights.
    ///
    /// Returns the final hidden states `[B, T, hidden]` in the compute dtype.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        positions: &[Vec<u32>],
        bias: &Tensor,
        mut cache: Option<&mut KvCache>,
        grad: bool,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, t) = ids.dims2()?;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let rep = nh / nkv;
        // Rotary tables [B, T, 1, hd] from positions.
        let pos: Vec<f32> = positions.iter().flatten().map(|&p| p as f32).collect();
        if pos.len() != b * t {
            return Err(ModelError::Invalid(format!(
                "positions hold {} entries for ids of shape [{b}, {t}]",
                pos.len()
            )));
        }
        let pos = Tensor::from_vec(pos, (b, t, 1), &self.device)?;
        let freqs = pos.broadcast_mul(&self.inv_freq.reshape((1, 1, hd / 2))?)?;
        let freqs = Tensor::cat(&[&freqs, &freqs], D::Minus1)?;
        let cos = freqs.cos()?.to_dtype(self.dtype)?.unsqueeze(2)?;
        let sin = freqs.sin()?.to_dtype(self.dtype)?.unsqueeze(2)?;
        let rope = |x: &Tensor| -> Result<Tensor> {
            Ok((x.broadcast_mul(&cos)? + rotate_half(x)?.broadcast_mul(&sin)?)?)
        };
        let acc = upcast(self.dtype);
        let bias = bias.to_dtype(acc)?.unsqueeze(2)?; // [B,1,1,T,S]
        let scale = 1.0 / (hd as f64).sqrt();

        let embed = self.w(&self.embed, grad);
        let mut x = embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, c.hidden_size))?;
        for (li, layer) in self.layers.iter().enumerate() {
            let residual = x.clone();
            let hn = rms_norm(&x, &self.w(&layer.input_norm, grad), c.rms_norm_eps)?;
            let qb = self.wo(&layer.q_bias, grad);
            let kb = self.wo(&layer.k_bias, grad);
            let vb = self.wo(&layer.v_bias, grad);
            let q =
                linear(&hn, &self.w(&layer.q_proj, grad), qb.as_ref())?.reshape((b, t, nh, hd))?;
            let k =
                linear(&hn, &self.w(&layer.k_proj, grad), kb.as_ref())?.reshape((b, t, nkv, hd))?;
            let v =
                linear(&hn, &self.w(&layer.v_proj, grad), vb.as_ref())?.reshape((b, t, nkv, hd))?;
            let (q, k) = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => (
                    rms_norm(&q, &self.w(qn, grad), c.rms_norm_eps)?,
                    rms_norm(&k, &self.w(kn, grad), c.rms_norm_eps)?,
                ),
                _ => (q, k),
            };
            let q = rope(&q)?.transpose(1, 2)?.contiguous()?; // [B, nh, T, hd]
            let k = rope(&k)?.transpose(1, 2)?.contiguous()?; // [B, nkv, T, hd]
            let v = v.transpose(1, 2)?.contiguous()?;
            let (k, v) = match cache.as_deref_mut() {
                Some(cache) => {
                    let slot = &mut cache.layers[li];
                    let (k, v) = match slot.take() {
                        None => (k, v),
                        Some((pk, pv)) => {
                            (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?)
                        }
                    };
                    *slot = Some((k.clone(), v.clone()));
                    (k, v)
                }
                None => (k, v),
            };
            let s = k.dim(2)?;
            // Grouped-query attention without repeating K/V: the `rep` query heads of one KV
            // head are stacked along the row axis.
            let qg = q.reshape((b, nkv, rep * t, hd))?;
            let scores = (qg.matmul(&k.t()?)? * scale)?; // [B, nkv, rep*T, S]
            let scores = scores
                .to_dtype(acc)?
                .reshape((b, nkv, rep, t, s))?
                .broadcast_add(&bias)?;
            let p = softmax(&scores)?
                .to_dtype(self.dtype)?
                .reshape((b, nkv, rep * t, s))?;
            let o = p.matmul(&v)?; // [B, nkv, rep*T, hd]
            let o = o
                .reshape((b, nh, t, hd))?
                .transpose(1, 2)?
                .reshape((b, t, nh * hd))?;
            let ob = self.wo(&layer.o_bias, grad);
            let o = linear(&o, &self.w(&layer.o_proj, grad), ob.as_ref())?;
            x = (residual + o)?;
            let residual = x.clone();
            let hn = rms_norm(&x, &self.w(&layer.post_norm, grad), c.rms_norm_eps)?;
            let gb = self.wo(&layer.gate_bias, grad);
            let ub = self.wo(&layer.up_bias, grad);
            let db = self.wo(&layer.down_bias, grad);
            let g = linear(&hn, &self.w(&layer.gate_proj, grad), gb.as_ref())?.silu()?;
            let u = linear(&hn, &self.w(&layer.up_proj, grad), ub.as_ref())?;
            let m = linear(&(g * u)?, &self.w(&layer.down_proj, grad), db.as_ref())?;
            x = (residual + m)?;
        }
        rms_norm(&x, &self.w(&self.norm, grad), c.rms_norm_eps)
    }

    /// Logits `[.., vocab]` (compute dtype) of final hidden states `[.., hidden]`.
    pub fn lm_head(&self, hidden: &Tensor, grad: bool) -> Result<Tensor> {
        let w = match &self.lm_head {
            Some(h) => self.w(h, grad),
            None => self.w(&self.embed, grad),
        };
        linear(hidden, &w, None)
    }

    /// Builds the additive attention bias `[B, 1, T, S]` for `T` new positions after `past`
    /// cached ones: key j is visible to query i when j ≤ past + i and `key_mask[b][j] == 1`.
    /// `key_mask` is `[B, S]` over all S = past + T positions.
    pub fn attention_bias(&self, key_mask: &[Vec<u32>], past: usize, t: usize) -> Result<Tensor> {
        let b = key_mask.len();
        let s = past + t;
        let mut data = vec![MASK_BIAS; b * t * s];
        for (bi, row) in key_mask.iter().enumerate() {
            if row.len() != s {
                return Err(ModelError::Invalid(format!(
                    "attention mask row {bi} has {} entries, expected {s}",
                    row.len()
                )));
            }
            for i in 0..t {
                let base = (bi * t + i) * s;
                for j in 0..=past + i {
                    if row[j] != 0 {
                        data[base + j] = 0.0;
                    }
                }
            }
        }
        Ok(Tensor::from_vec(data, (b, 1, t, s), &self.device)?)
    }

    /// Per-token log-probs of the next token for a padded batch — the training forward.
    ///
    /// - `ids`: `[B][T]` token ids, left or right padded (any pad id).
    /// - `mask`: `[B][T]`, 1 for real tokens, 0 for padding.
    /// - `start`: first position t whose next token is scored; positions before it get no
    ///   lm_head logits (pass the shortest prompt length − 1 to score completions only).
    /// - `temperature`: logits are divided by it before the log-softmax (DESIGN.md section 3).
    /// - `with_entropy`: also return per-token entropy.
    /// - `grad`: build the autograd graph (training); false for scoring only.
    ///
    /// Returns `[B, T-1-start]` tensors (f32; f64 for an f64 model); see [`LogProbs`].
    pub fn token_logprobs(
        &self,
        ids: &[Vec<u32>],
        mask: &[Vec<u32>],
        start: usize,
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        self.logprobs_impl(ids, mask, start, None, temperature, with_entropy, grad)
    }

    /// [`Model::token_logprobs`] at chosen positions only: row r's outputs are the log-probs (and
    /// entropies) at positions `start + at[r][j]` (j-th entry; each `< T − 1 − start`), packed to
    /// `[B, C]` with C = the longest `at[r]` and exact 0 after each row's last entry.
    ///
    /// Only those positions reach the lm_head: the trainer passes each row's completion positions,
    /// so neither the padding of shorter completions nor a longer prompt's own positions cost
    /// lm_head work (the head is most of a training step at a 151936-token vocabulary). Values and
    /// gradients at the listed positions equal [`Model::token_logprobs`]' (tested).
    ///
    /// # Errors
    /// As [`Model::token_logprobs`], and a position past the scored ones.
    #[allow(clippy::too_many_arguments)]
    pub fn token_logprobs_at(
        &self,
        ids: &[Vec<u32>],
        mask: &[Vec<u32>],
        start: usize,
        at: &[Vec<usize>],
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        if at.len() != ids.len() {
            return Err(ModelError::Invalid(format!(
                "token_logprobs_at: {} position lists for {} rows",
                at.len(),
                ids.len()
            )));
        }
        self.logprobs_impl(ids, mask, start, Some(at), temperature, with_entropy, grad)
    }

    #[allow(clippy::too_many_arguments)]
    fn logprobs_impl(
        &self,
        ids: &[Vec<u32>],
        mask: &[Vec<u32>],
        start: usize,
        at: Option<&[Vec<usize>]>,
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<LogProbs> {
        let b = ids.len();
        let t = ids.first().map(|r| r.len()).unwrap_or(0);
        if b == 0 || t < 2 || start + 1 >= t {
            return Err(ModelError::Invalid(format!(
                "token_logprobs needs B >= 1 and start + 1 < T (B {b}, T {t}, start {start})"
            )));
        }
        if ids.iter().any(|r| r.len() != t) || mask.len() != b || mask.iter().any(|r| r.len() != t)
        {
            return Err(ModelError::Invalid(
                "ids and mask must both be [B, T]".into(),
            ));
        }
        if temperature <= 0.0 || !temperature.is_finite() {
            return Err(ModelError::Invalid(format!(
                "temperature must be positive, got {temperature}"
            )));
        }
        let vocab = self.config.vocab_size as u32;
        if let Some(&bad) = ids.iter().flatten().find(|&&x| x >= vocab) {
            return Err(ModelError::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        let flat: Vec<u32> = ids.iter().flatten().copied().collect();
        let ids_t = Tensor::from_vec(flat, (b, t), &self.device)?;
        let pos = position_ids(mask);
        let bias = self.attention_bias(mask, 0, t)?;
        let hidden = self.forward_hidden(&ids_t, &pos, &bias, None, grad)?;
        let n = t - 1 - start;
        let h = hidden
            .narrow(1, start, n)?
            .reshape((b * n, self.config.hidden_size))?;
        let targets = ids_t.narrow(1, start + 1, n)?.contiguous()?.flatten_all()?;
        match at {
            None => {
                let (lp, ent) = self.head(&h, &targets, temperature, with_entropy, grad)?;
                Ok(LogProbs {
                    logprobs: lp.reshape((b, n))?,
                    entropy: ent.map(|e| e.reshape((b, n))).transpose()?,
                })
            }
            Some(at) => {
                // Only the listed positions reach the lm_head; the rest of [B, C] is 0.
                let c = at.iter().map(Vec::len).max().unwrap_or(0);
                let mut sel = Vec::new();
                let mut back = Vec::with_capacity(b * c);
                for (r, row) in at.iter().enumerate() {
                    for &p in row {
                        if p >= n {
                            return Err(ModelError::Invalid(format!(
                                "token_logprobs_at: position {p} of row {r} is past the {n} scored positions"
                            )));
                        }
                        back.push(sel.len() as u32);
                        sel.push((r * n + p) as u32);
                    }
                    back.extend(std::iter::repeat_n(u32::MAX, c - row.len()));
                }
                let k = sel.len();
                for x in back.iter_mut().filter(|x| **x == u32::MAX) {
                    *x = k as u32; // the zero row appended below
                }
                let sel = Tensor::from_vec(sel, k, &self.device)?;
                let back = Tensor::from_vec(back, b * c, &self.device)?;
                let (lp, ent) = if k == 0 {
                    (None, None)
                } else {
                    let (lp, ent) = self.head(
                        &h.index_select(&sel, 0)?,
                        &targets.index_select(&sel, 0)?,
                        temperature,
                        with_entropy,
                        grad,
                    )?;
                    (Some(lp), ent)
                };
                let place = |x: Option<Tensor>| -> Result<Tensor> {
                    let dt = upcast(self.dtype);
                    let zero = Tensor::zeros(1, dt, &self.device)?;
                    let x = match x {
                        Some(x) => Tensor::cat(&[&x.to_dtype(dt)?, &zero], 0)?,
                        None => zero,
                    };
                    Ok(x.index_select(&back, 0)?.reshape((b, c))?)
                };
                let entropy = if with_entropy {
                    Some(place(ent)?)
                } else {
                    None
                };
                Ok(LogProbs {
                    logprobs: place(lp)?,
                    entropy,
                })
            }
        }
    }

    /// The log-prob/entropy head on `h` `[N, H]` at `targets` `[N]`: `[N]` log-probs and, when
    /// asked, `[N]` entropies (fused on the CPU in f32, [`crate::chunked`] elsewhere).
    fn head(
        &self,
        h: &Tensor,
        targets: &Tensor,
        temperature: f64,
        with_entropy: bool,
        grad: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let n = h.dim(0)?;
        if self.device.is_cpu() && self.dtype == DType::F32 && !crate::chunked::forced_on_cpu() {
            // Fused lm_head + log-softmax + gather + entropy over vocabulary chunks: the
            // [N, V] logits never exist (crate::fused::LmHeadLogprobOp).
            let w = match &self.lm_head {
                Some(head) => self.w(head, grad),
                None => self.w(&self.embed, grad),
            };
            // Training keeps the logits for the backward when they fit in STASH_MAX_BYTES.
            let stash = if grad {
                let v = self.config.vocab_size;
                crate::fused::LogitStash::within(n, v, crate::fused::STASH_MAX_BYTES)
            } else {
                None
            };
            let op = crate::fused::LmHeadLogprobOp {
                targets: std::sync::Arc::new(targets.to_vec1()?),
                inv_t: (1.0 / temperature) as f32,
                entropy: with_entropy,
                stash,
            };
            let out = h.contiguous()?.apply_op2(&w, op)?;
            let lp = out.narrow(1, 0, 1)?.squeeze(1)?.contiguous()?;
            let ent = if with_entropy {
                Some(out.narrow(1, 1, 1)?.squeeze(1)?.contiguous()?)
            } else {
                None
            };
            Ok((lp, ent))
        } else {
            // Every other device/dtype: lm_head + log-softmax over vocabulary chunks, so the
            // [N, V] logits never exist either (crate::chunked; equal to logprobs_unfused).
            let w = match &self.lm_head {
                Some(head) => self.w(head, grad),
                None => self.w(&self.embed, grad),
            };
            let chunk =
                crate::chunked::chunk_width(n, self.config.vocab_size, crate::chunked::CHUNK_ELEMS);
            crate::chunked::chunked_logprobs(
                &h.contiguous()?,
                &w,
                &targets.to_vec1()?,
                temperature,
                with_entropy,
                chunk,
                grad,
            )
        }
    }

    /// Reference implementation of the log-prob/entropy head: `log_softmax(logits / T)` gathered
    /// at `targets` `[B, n]`, entropy `−Σ p·log p`. Used off-CPU and for f64; the fused CPU op is
    /// tested against it.
    pub fn logprobs_unfused(
        logits: &Tensor,
        targets: &Tensor,
        temperature: f64,
        with_entropy: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let logits = if temperature != 1.0 {
            (logits / temperature)?
        } else {
            logits.clone()
        };
        let logp = log_softmax(&logits)?; // [B, n, V]
        let lp = logp.gather(&targets.unsqueeze(2)?, 2)?.squeeze(2)?;
        let entropy = if with_entropy {
            Some((logp.exp()? * &logp)?.sum(D::Minus1)?.neg()?)
        } else {
            None
        };
        Ok((lp, entropy))
    }

    /// Inference forward for sampling: runs `ids` `[B, T]` (new positions) against `cache`,
    /// appending their keys/values, and returns logits `[B, vocab]` (f32) of the last new
    /// position only. `key_mask` is `[B][cached + T]`; `positions` `[B][T]`.
    pub fn forward_cached(
        &self,
        ids: &[Vec<u32>],
        positions: &[Vec<u32>],
        key_mask: &[Vec<u32>],
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let b = ids.len();
        let t = ids.first().map(|r| r.len()).unwrap_or(0);
        let flat: Vec<u32> = ids.iter().flatten().copied().collect();
        let ids_t = Tensor::from_vec(flat, (b, t), &self.device)?;
        let past = cache.len();
        let bias = self.attention_bias(key_mask, past, t)?;
        let hidden = self.forward_hidden(&ids_t, positions, &bias, Some(cache), false)?;
        let last = hidden.narrow(1, t - 1, 1)?.squeeze(1)?;
        Ok(self.lm_head(&last, false)?.to_dtype(DType::F32)?)
    }

    /// A deep copy: new [`Var`]s holding copies of every weight (for a frozen reference policy or
    /// an explorer that samples while the trainer updates).
    pub fn try_clone(&self) -> Result<Self> {
        let cp = |v: &Var| -> Result<Var> { Ok(Var::from_tensor(&v.as_tensor().copy()?)?) };
        let cpo = |v: &Option<Var>| -> Result<Option<Var>> { v.as_ref().map(cp).transpose() };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    input_norm: cp(&l.input_norm)?,
                    q_proj: cp(&l.q_proj)?,
                    k_proj: cp(&l.k_proj)?,
                    v_proj: cp(&l.v_proj)?,
                    o_proj: cp(&l.o_proj)?,
                    q_bias: cpo(&l.q_bias)?,
                    k_bias: cpo(&l.k_bias)?,
                    v_bias: cpo(&l.v_bias)?,
                    o_bias: cpo(&l.o_bias)?,
                    q_norm: cpo(&l.q_norm)?,
                    k_norm: cpo(&l.k_norm)?,
                    post_norm: cp(&l.post_norm)?,
                    gate_proj: cp(&l.gate_proj)?,
                    up_proj: cp(&l.up_proj)?,
                    down_proj: cp(&l.down_proj)?,
                    gate_bias: cpo(&l.gate_bias)?,
                    up_bias: cpo(&l.up_bias)?,
                    down_bias: cpo(&l.down_bias)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config: self.config.clone(),
            embed: cp(&self.embed)?,
            layers,
            norm: cp(&self.norm)?,
            lm_head: cpo(&self.lm_head)?,
            inv_freq: self.inv_freq.clone(),
            device: self.device.clone(),
            dtype: self.dtype,
        })
    }

    /// Writes config.json (transformers-4 style) and model.safetensors (weights in `dtype`)
    /// into `dir` atomically. Tokenizer files are not written here.
    pub fn save(&self, dir: &Path, dtype: DType) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::Io {
            path: dir.to_path_buf(),
            source: e,
        })?;
        let tensors: Vec<(String, Tensor)> = self
            .named_vars()
            .into_iter()
            .map(|(n, v)| Ok((n, v.as_tensor().detach().to_dtype(dtype)?)))
            .collect::<Result<_>>()?;
        let bytes = crate::weights::safetensors_bytes(&tensors)?;
        crate::weights::atomic_write(&dir.join("model.safetensors"), &bytes)?;
        let mut cfg = self.config.clone();
        cfg.stored_dtype = Some(
            match dtype {
                DType::BF16 => "bfloat16",
                DType::F16 => "float16",
                _ => "float32",
            }
            .into(),
        );
        let json = serde_json::to_vec_pretty(&cfg.to_json()).expect("config serialises");
        crate::weights::atomic_write(&dir.join("config.json"), &json)?;
        Ok(())
    }
}
