//! The inference forward of the sampler: the same decoder as [`rlvr_model::Model`], without
//! autograd, over a preallocated KV cache written in place.
//!
//! Numerics mirror `Model::forward_hidden` op for op (RMSNorm in f32, rotary embedding
//! `x·cos + rotate_half(x)·sin` with tables computed in f32, attention scores scaled after the
//! matmul and biased in f32, grouped KV heads without repetition, SiLU-gated MLP), so logits equal
//! `Model::forward_cached`'s to float rounding (tested in `tests/engine.rs`). What differs is the
//! bookkeeping:
//!
//! - the cache of each layer is one `[B, n_kv_heads, S_max, head_dim]` tensor allocated once per
//!   wave; new keys/values are written into columns with `slice_set` (no `Tensor::cat`), and the
//!   attention reads the first `len` columns as a strided view;
//! - the attention bias of a decode step is a view of one `[B, S_max]` f32 row per sequence
//!   (0 visible, −1e30 padding) built once per wave, not a host-built `[B, 1, T, S]` tensor;
//! - rotary cos/sin come from tables built once per wave, gathered by position on the device;
//! - rows can be dropped ([`KvBuffer::keep_rows`]) when their completions finish;
//! - on the CPU in f32, the projections and the lm_head of a decode step (≤ 16 rows) run on an
//!   AVX2/FMA skinny-matmul kernel (`cpu_kernels`) instead of candle's GEMM: the same products,
//!   summed in another order, so logits agree with the reference to ~1e-6.

use crate::cpu_kernels::PackedHead;
use candle_core::{DType, Device, Tensor, D};
use rlvr_model::{Model, ModelConfig};

use crate::error::Result;

/// Masked attention bias, the value `rlvr_model` uses: finite, so that a padding query row (which
/// sees no key) gives a uniform softmax instead of NaN.
pub(crate) const MASK_BIAS: f32 = -1e30;

/// Weights of one layer, detached from autograd (they share storage with the model's `Var`s).
struct LayerWeights {
    input_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    q_bias: Option<Tensor>,
    k_bias: Option<Tensor>,
    v_bias: Option<Tensor>,
    o_bias: Option<Tensor>,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_norm: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    gate_bias: Option<Tensor>,
    up_bias: Option<Tensor>,
    down_bias: Option<Tensor>,
}

/// The decoder's weights prepared for inference.
///
/// Built from a [`Model`] by sharing storage with its `Var`s: an in-place update of the model
/// (`Var::set`, an optimizer step) is seen by the next forward. Use [`DecodeWeights::snapshot`]
/// for a private copy (an explorer sampling while the trainer updates).
pub struct DecodeWeights {
    config: ModelConfig,
    embed: Tensor,
    layers: Vec<LayerWeights>,
    norm: Tensor,
    /// `[vocab, hidden]`; the embedding when tied.
    lm_head: Tensor,
    /// `[head_dim / 2]` rotary inverse frequencies, f32 (as the model's table).
    inv_freq: Vec<f32>,
    device: Device,
    dtype: DType,
}

/// Rotary tables for positions `0..n`: `cos`, `sin` of shape `[n, head_dim]` in the compute
/// dtype, each half repeated (transformers' `cat(freqs, freqs)`).
pub(crate) struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

/// Preallocated per-layer key/value cache of B rows and `capacity` columns, plus the per-row
/// attention bias over columns.
pub struct KvBuffer {
    /// Per layer `(k, v)`, each `[B, n_kv_heads, capacity, head_dim]`, rotary already applied.
    layers: Vec<(Tensor, Tensor)>,
    /// `[B, capacity]` f32: 0 where the column holds a real token, −1e30 for padding.
    bias: Tensor,
    /// Columns written so far.
    len: usize,
    capacity: usize,
}

impl KvBuffer {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.bias.dims()[0]
    }

    /// Columns written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no column was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps (and reorders, or repeats) the rows listed in `rows` (indices into the current
    /// rows): used to drop finished completions and to copy a prompt's prefill to its K rows.
    ///
    /// Errors: an index is out of range.
    pub fn keep_rows(&mut self, rows: &[u32]) -> Result<()> {
        let dev = self.bias.device().clone();
        let idx = Tensor::from_slice(rows, rows.len(), &dev)?;
        for (k, v) in self.layers.iter_mut() {
            *k = k.index_select(&idx, 0)?;
            *v = v.index_select(&idx, 0)?;
        }
        self.bias = self.bias.index_select(&idx, 0)?;
        Ok(())
    }
}

fn detach(t: &candle_core::Var) -> Tensor {
    t.as_tensor().detach()
}

fn detach_opt(t: &Option<candle_core::Var>) -> Option<Tensor> {
    t.as_ref().map(detach)
}

/// `x · wᵀ + b` for x `[N, in]`, w `[out, in]`.
fn linear2(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let y = match crate::cpu_kernels::skinny_matmul(x, w) {
        Some(y) => y?,
        None => x.matmul(&w.t()?)?,
    };
    Ok(match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

/// RMSNorm over the last dimension in f32, then cast back and scaled (as `rlvr_model::ops`).
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let dt = x.dtype();
    let xf = x.to_dtype(DType::F32)?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let y = xf.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(y.to_dtype(dt)?.broadcast_mul(w)?)
}

/// Softmax over the last dimension (max-subtracted), as `rlvr_model::ops::softmax`.
fn softmax(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// `x·cos + rotate_half(x)·sin` for x `[N, H, hd]`, cos/sin `[N, 1, hd]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rot.broadcast_mul(sin)?)?)
}

impl DecodeWeights {
    /// Shares the weights of `model` (no copy).
    pub fn from_model(model: &Model) -> Self {
        let layers = model
            .layers
            .iter()
            .map(|l| LayerWeights {
                input_norm: detach(&l.input_norm),
                q: detach(&l.q_proj),
                k: detach(&l.k_proj),
                v: detach(&l.v_proj),
                o: detach(&l.o_proj),
                q_bias: detach_opt(&l.q_bias),
                k_bias: detach_opt(&l.k_bias),
                v_bias: detach_opt(&l.v_bias),
                o_bias: detach_opt(&l.o_bias),
                q_norm: detach_opt(&l.q_norm),
                k_norm: detach_opt(&l.k_norm),
                post_norm: detach(&l.post_norm),
                gate: detach(&l.gate_proj),
                up: detach(&l.up_proj),
                down: detach(&l.down_proj),
                gate_bias: detach_opt(&l.gate_bias),
                up_bias: detach_opt(&l.up_bias),
                down_bias: detach_opt(&l.down_bias),
            })
            .collect();
        let embed = detach(&model.embed);
        let lm_head = model
            .lm_head
            .as_ref()
            .map(detach)
            .unwrap_or_else(|| embed.clone());
        Self {
            inv_freq: model
                .config
                .rope_inv_freq()
                .iter()
                .map(|&x| x as f32)
                .collect(),
            config: model.config.clone(),
            embed,
            layers,
            norm: detach(&model.norm),
            lm_head,
            device: model.device().clone(),
            dtype: model.dtype(),
        }
    }

    /// A private copy of the weights of `model` (later updates of the model are not seen).
    ///
    /// Errors: out of memory on the device.
    pub fn snapshot(model: &Model) -> Result<Self> {
        let mut w = Self::from_model(model);
        let c = |t: &mut Tensor| -> Result<()> {
            *t = t.copy()?;
            Ok(())
        };
        let co = |t: &mut Option<Tensor>| -> Result<()> {
            if let Some(t) = t {
                *t = t.copy()?;
            }
            Ok(())
        };
        let tied = model.lm_head.is_none();
        c(&mut w.embed)?;
        c(&mut w.norm)?;
        if tied {
            w.lm_head = w.embed.clone();
        } else {
            c(&mut w.lm_head)?;
        }
        for l in w.layers.iter_mut() {
            for t in [
                &mut l.input_norm,
                &mut l.q,
                &mut l.k,
                &mut l.v,
                &mut l.o,
                &mut l.post_norm,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ] {
                c(t)?;
            }
            for t in [
                &mut l.q_bias,
                &mut l.k_bias,
                &mut l.v_bias,
                &mut l.o_bias,
                &mut l.q_norm,
                &mut l.k_norm,
                &mut l.gate_bias,
                &mut l.up_bias,
                &mut l.down_bias,
            ] {
                co(t)?;
            }
        }
        Ok(w)
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device of the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Rotary tables for positions `0..n`, computed in f32 exactly as the model does
    /// (`position · inv_freq`, then cos/sin, then cast to the compute dtype).
    /// The lm_head packed for this call's decode steps (see [`PackedHead`]); `None` where the
    /// CPU lacks AVX-512, or off the CPU / f32. Pack again after the weights change.
    pub(crate) fn packed_head(&self) -> Result<Option<PackedHead>> {
        Ok(PackedHead::new(&self.lm_head)?)
    }

    pub(crate) fn rope_tables(&self, n: usize) -> Result<RopeTables> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(n * 2 * half);
        let mut sin = Vec::with_capacity(n * 2 * half);
        for p in 0..n {
            for _ in 0..2 {
                for &f in &self.inv_freq {
                    let a = p as f32 * f;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        let mk = |v: Vec<f32>| -> Result<Tensor> {
            Ok(Tensor::from_vec(v, (n, 2 * half), &self.device)?.to_dtype(self.dtype)?)
        };
        Ok(RopeTables {
            cos: mk(cos)?,
            sin: mk(sin)?,
        })
    }

    /// Allocates a zeroed cache of `rows` × `capacity` columns whose bias row is `bias`
    /// (`[rows][capacity]`, 0 or [`MASK_BIAS`]).
    pub(crate) fn alloc_cache(
        &self,
        bias: Vec<f32>,
        rows: usize,
        capacity: usize,
    ) -> Result<KvBuffer> {
        let c = &self.config;
        let shape = (rows, c.num_key_value_heads, capacity, c.head_dim);
        let layers = (0..c.num_hidden_layers)
            .map(|_| {
                Ok((
                    Tensor::zeros(shape, self.dtype, &self.device)?,
                    Tensor::zeros(shape, self.dtype, &self.device)?,
                ))
            })
            .collect::<Result<_>>()?;
        let bias = Tensor::from_vec(bias, (rows, capacity), &self.device)?;
        Ok(KvBuffer {
            layers,
            bias,
            len: 0,
            capacity,
        })
    }

    /// Runs `t` new positions of every row against `cache`, writes their keys/values into columns
    /// `cache.len()..cache.len() + t`, and returns the logits `[B, vocab]` (f32) of the last new
    /// position.
    ///
    /// - `ids`: `[B, t]` u32 token ids.
    /// - `positions`: `[B · t]` u32 rotary positions (row-major), each `< rope.len`.
    /// - `bias`: the attention bias `[B, 1, t, len + t]` when `t > 1` (prefill, causal + padding);
    ///   `None` for a decode step (`t = 1`), which uses the cache's bias rows.
    ///
    /// Errors: the cache is full, or a shape disagrees.
    pub(crate) fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        bias: Option<&Tensor>,
        rope_t: &RopeTables,
        cache: &mut KvBuffer,
        head: Option<&PackedHead>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, t) = ids.dims2()?;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let rep = nh / nkv;
        let past = cache.len;
        let s = past + t;
        if s > cache.capacity {
            return Err(candle_core::Error::Msg(format!(
                "KV cache full: {s} columns needed, capacity {}",
                cache.capacity
            ))
            .into());
        }
        let n = b * t;
        let cos = rope_t.cos.index_select(positions, 0)?.reshape((n, 1, hd))?;
        let sin = rope_t.sin.index_select(positions, 0)?.reshape((n, 1, hd))?;
        let bias = match bias {
            Some(bias) => bias.unsqueeze(2)?, // [B, 1, 1, t, s]
            None => cache.bias.narrow(1, 0, s)?.reshape((b, 1, 1, 1, s))?,
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = self.embed.index_select(&ids.flatten_all()?, 0)?; // [n, h]
        for (li, l) in self.layers.iter().enumerate() {
            let hn = rms_norm(&x, &l.input_norm, c.rms_norm_eps)?;
            let q = linear2(&hn, &l.q, l.q_bias.as_ref())?.reshape((n, nh, hd))?;
            let k = linear2(&hn, &l.k, l.k_bias.as_ref())?.reshape((n, nkv, hd))?;
            let v = linear2(&hn, &l.v, l.v_bias.as_ref())?.reshape((n, nkv, hd))?;
            let (q, k) = match (&l.q_norm, &l.k_norm) {
                (Some(qn), Some(kn)) => (
                    rms_norm(&q, qn, c.rms_norm_eps)?,
                    rms_norm(&k, kn, c.rms_norm_eps)?,
                ),
                _ => (q, k),
            };
            let q = rope(&q, &cos, &sin)?;
            let k = rope(&k, &cos, &sin)?;
            // [B, heads, t, hd]
            let q = q.reshape((b, t, nh, hd))?.transpose(1, 2)?.contiguous()?;
            let k = k.reshape((b, t, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let v = v.reshape((b, t, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let (ck, cv) = &cache.layers[li];
            ck.slice_set(&k, 2, past)?;
            cv.slice_set(&v, 2, past)?;
            let k = ck.narrow(2, 0, s)?;
            let v = cv.narrow(2, 0, s)?;
            let qg = q.reshape((b, nkv, rep * t, hd))?;
            let scores = (qg.matmul(&k.t()?)? * scale)?; // [B, nkv, rep·t, s]
            let scores = scores
                .to_dtype(DType::F32)?
                .reshape((b, nkv, rep, t, s))?
                .broadcast_add(&bias)?;
            let p = softmax(&scores)?
                .to_dtype(self.dtype)?
                .reshape((b, nkv, rep * t, s))?;
            let o = p.matmul(&v)?; // [B, nkv, rep·t, hd]
            let o = o
                .reshape((b, nh, t, hd))?
                .transpose(1, 2)?
                .reshape((n, nh * hd))?;
            let o = linear2(&o, &l.o, l.o_bias.as_ref())?;
            x = (x + o)?;
            let hn = rms_norm(&x, &l.post_norm, c.rms_norm_eps)?;
            let g = linear2(&hn, &l.gate, l.gate_bias.as_ref())?.silu()?;
            let u = linear2(&hn, &l.up, l.up_bias.as_ref())?;
            let m = linear2(&(g * u)?, &l.down, l.down_bias.as_ref())?;
            x = (x + m)?;
        }
        cache.len = s;
        let last = if t == 1 {
            x
        } else {
            x.reshape((b, t, c.hidden_size))?
                .narrow(1, t - 1, 1)?
                .squeeze(1)?
        };
        let h = rms_norm(&last, &self.norm, c.rms_norm_eps)?;
        match head {
            Some(p) if h.dtype() == DType::F32 && h.device().is_cpu() => Ok(p.matmul(&h)?),
            _ => Ok(linear2(&h, &self.lm_head, None)?.to_dtype(DType::F32)?),
        }
    }
}
