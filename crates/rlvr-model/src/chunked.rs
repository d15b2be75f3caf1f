//! Chunked lm_head + log-softmax + gather + entropy in plain candle tensor ops, with a
//! hand-written backward: runs on every device candle runs on (CPU, CUDA, Metal) and never holds
//! the `[N, V]` logits, only one `[N, C]` vocabulary chunk of them at a time.
//!
//! The forward streams over vocabulary chunks `W[c0..c0+C]` of the head weight, keeping per row
//! the running max `M`, `S = Σ exp(s − M)` and `D = Σ exp(s − M)·(s − M)` (the online log-sum-exp
//! of Milakov & Gimelshein 2018, as in the CPU kernel `rlvr_kernels::LmHeadLogprobOp`), and the target's
//! scaled logit `s_y`. Then `log p_y = s_y − (M + ln S)` and `H = ln S − D/S`.
//!
//! The backward recomputes each chunk's logits and forms the gradient w.r.t. them,
//! `∂/∂s_j = g_ℓ·(δ_jy − p_j) − g_H·p_j·(log p_j + H)`, then accumulates `∂h += ∂z·W_c` and
//! writes `∂W_c = ∂zᵀ·h` (with `∂z = ∂s / T`). Peak memory beyond the inputs and the gradients
//! themselves: a few `[N, C]` tensors. Values and gradients equal [`crate::Model::logprobs_unfused`]
//! (tested in f32 and f64). Source: the same formulas as `rlvr_kernels::LmHeadLogprobOp` (CPU, f32 only),
//! which stays the CPU f32 path; this op is the path everywhere else.
//!
//! Autograd: the forward is computed on detached tensors; a [`CustomOp3`] node `(h, W, out)`
//! whose forward returns `out` unchanged (a copy on any backend) attaches the backward.

use std::cell::Cell;
use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp3, Layout, MetalStorage, Shape, Tensor};

use crate::error::{ModelError, Result};
use crate::ops::upcast;

/// Elements of one `[N, C]` chunk of logits (8 Mi: 32 MiB in f32); the chunk width is
/// `C = CHUNK_ELEMS / N`, at least 1 and at most V.
pub const CHUNK_ELEMS: usize = 8 << 20;

/// Elements of one chunk on a GPU (32 Mi: 128 MiB in f32). A chunk costs a dozen kernel launches
/// forward and as many backward whatever its width: on an H200 (BENCHMARKS.md, "GPU: first light")
/// a 16 × 512-token step of the Qwen2.5-0.5B shape took 1.037 s with the CPU's 8 Mi (149 chunks)
/// and 0.953 s with 64 Mi (19 chunks), about 0.65 ms per chunk; 32 Mi (37 chunks, ≈ 0.965 s by that
/// rate) keeps most of the gain at half the memory of 64 Mi: a few `[N, C]` f32 tensors, about
/// 768 MiB, so one 1024-token row of the 0.5B shape still trains on a 24 GB card.
pub const CHUNK_ELEMS_GPU: usize = 32 << 20;

/// The environment variable that overrides the chunk size in elements on every device (for
/// measurements such as `bench/gpu_check.sh`'s; unset in normal use).
pub const CHUNK_ELEMS_VAR: &str = "RLVR_HEAD_CHUNK_ELEMS";

/// Logits per chunk on `device`: [`CHUNK_ELEMS`] on the CPU, [`CHUNK_ELEMS_GPU`] elsewhere, or
/// [`CHUNK_ELEMS_VAR`]'s value (a positive integer) when it is set.
/// The variable is read once per process (the head runs once per micro-batch).
pub fn chunk_elems(device: &candle_core::Device) -> usize {
    static FROM_ENV: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let from_env = FROM_ENV.get_or_init(|| {
        std::env::var(CHUNK_ELEMS_VAR)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
    });
    if let Some(n) = *from_env {
        return n;
    }
    if device.is_cpu() {
        CHUNK_ELEMS
    } else {
        CHUNK_ELEMS_GPU
    }
}

/// The vocabulary chunk width for `n` rows over a `v`-entry vocabulary with `elems` logits per chunk.
pub fn chunk_width(n: usize, v: usize, elems: usize) -> usize {
    (elems / n.max(1)).clamp(1, v.max(1))
}

thread_local! {
    static FORCE_ON_CPU: Cell<bool> = const { Cell::new(false) };
}

/// Makes [`crate::Model`]'s log-prob head take this chunked path on the CPU in f32 too (instead of
/// the fused CPU kernel), on the calling thread only: for tests and memory measurements.
pub fn force_on_cpu(on: bool) {
    FORCE_ON_CPU.with(|f| f.set(on));
}

/// Whether [`force_on_cpu`] is on for the calling thread.
pub fn forced_on_cpu() -> bool {
    FORCE_ON_CPU.with(|f| f.get())
}

/// Per-token log-probs and entropies of the head `W` `[V, H]` (the embedding when tied) over
/// hidden states `h` `[N, H]` at `targets` (`N` ids, each `< V`), temperature `temperature`:
/// `log_softmax(h·Wᵀ / T)[y]` `[N]` and, when `with_entropy`, the entropy of `softmax(h·Wᵀ / T)`
/// in nats `[N]`. Both in [`upcast`] of the compute dtype (f32; f64 for f64), as the unfused path:
/// each chunk's logits are computed in the dtype of `h`/`W` and then cast up.
///
/// `chunk`: vocabulary entries per chunk (e.g. [`chunk_width`]`(N, V, CHUNK_ELEMS)`).
/// `grad`: attach the hand-written backward (gradients flow to `h` and `W`).
///
/// # Errors
/// Shape mismatches, a target outside the vocabulary, tensor errors.
pub fn chunked_logprobs(
    h: &Tensor,
    w: &Tensor,
    targets: &[u32],
    temperature: f64,
    with_entropy: bool,
    chunk: usize,
    grad: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let op = (temperature, with_entropy, chunk);
    chunked_logprobs_head(h, w, targets, op, grad, true)
}

/// [`chunked_logprobs`] with the head weight's gradient optional: `weight_grad = false` (a frozen
/// lm_head, LoRA) gives the same values and `∂h` and computes no `∂W`. `op` is (temperature,
/// with_entropy, chunk).
///
/// # Errors
/// As [`chunked_logprobs`].
pub fn chunked_logprobs_head(
    h: &Tensor,
    w: &Tensor,
    targets: &[u32],
    (temperature, with_entropy, chunk): (f64, bool, usize),
    grad: bool,
    weight_grad: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let out = chunked_head_out(
        h,
        w,
        targets,
        (temperature, with_entropy, chunk),
        None,
        grad,
        weight_grad,
    )?;
    let lp = out.narrow(1, 0, 1)?.squeeze(1)?;
    let ent = if with_entropy {
        Some(out.narrow(1, 1, 1)?.squeeze(1)?)
    } else {
        None
    };
    Ok((lp, ent))
}

/// [`chunked_logprobs_head`]'s `[N, 2]` output (log p_y, H or 0) before it is split, with
/// Gemma 2's final-logit `softcap` when given: each chunk's logits `z` become
/// `cap · tanh(z / cap)` (in the upcast dtype) before the temperature, and the backward
/// multiplies their gradient by `1 − tanh²(z / cap)`.
///
/// # Errors
/// As [`chunked_logprobs`].
pub(crate) fn chunked_head_out(
    h: &Tensor,
    w: &Tensor,
    targets: &[u32],
    (temperature, with_entropy, chunk): (f64, bool, usize),
    softcap: Option<f64>,
    grad: bool,
    weight_grad: bool,
) -> Result<Tensor> {
    let (n, hd) = h.dims2()?;
    let (v, hd2) = w.dims2()?;
    if hd != hd2 || targets.len() != n || chunk == 0 {
        return Err(ModelError::Invalid(format!(
            "chunked_logprobs: hidden [{n}, {hd}], weight [{v}, {hd2}], {} targets, chunk {chunk}",
            targets.len()
        )));
    }
    if let Some(&y) = targets.iter().find(|&&y| y as usize >= v) {
        return Err(ModelError::Invalid(format!(
            "chunked_logprobs: target {y} outside the vocabulary ({v})"
        )));
    }
    let op = ChunkedHead {
        targets: Arc::new(targets.to_vec()),
        inv_t: 1.0 / temperature,
        entropy: with_entropy,
        chunk,
        softcap,
        lse: None,
        weight_grad,
    };
    let (out, lse) = op.forward(&h.detach(), &w.detach())?;
    Ok(if grad {
        let op = ChunkedHead {
            lse: Some(lse),
            ..op
        };
        h.apply_op3(w, &out, op)?
    } else {
        out
    })
}

/// The chunked head as a graph node; see the module docs.
#[derive(Clone)]
struct ChunkedHead {
    targets: Arc<Vec<u32>>,
    inv_t: f64,
    entropy: bool,
    chunk: usize,
    /// Final-logit softcapping (`cap · tanh(z / cap)`), Gemma 2's.
    softcap: Option<f64>,
    /// Per-row log-sum-exp of the scaled logits `[N, 1]` (upcast dtype), from the forward.
    lse: Option<Tensor>,
    /// Compute `∂W` in the backward (false: a frozen head).
    weight_grad: bool,
}

impl ChunkedHead {
    /// Scaled logits of vocabulary rows `c0..c0+cs`: `[N, cs]` in the upcast dtype (softcapped
    /// first when [`ChunkedHead::softcap`]), and with a softcap the derivative of the cap,
    /// `1 − tanh²(z / cap)` `[N, cs]`, when `derivative`.
    fn logits_with(
        &self,
        h: &Tensor,
        w: &Tensor,
        c0: usize,
        cs: usize,
        derivative: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let wc = w.narrow(0, c0, cs)?;
        let z = h.matmul(&wc.t()?)?.to_dtype(upcast(h.dtype()))?;
        match self.softcap {
            None => Ok(((z * self.inv_t)?, None)),
            Some(cap) => {
                let th = (z / cap)?.tanh()?;
                let d = match derivative {
                    true => Some(th.sqr()?.affine(-1.0, 1.0)?),
                    false => None,
                };
                Ok(((th * (cap * self.inv_t))?, d))
            }
        }
    }

    /// [`ChunkedHead::logits_with`] without the derivative.
    fn logits(&self, h: &Tensor, w: &Tensor, c0: usize, cs: usize) -> Result<Tensor> {
        Ok(self.logits_with(h, w, c0, cs, false)?.0)
    }

    /// Per-row target index within chunk `c0..c0+cs` (`[N, 1]` u32, `cs` when outside it).
    fn local_targets(&self, c0: usize, cs: usize, dev: &candle_core::Device) -> Result<Tensor> {
        let local: Vec<u32> = self
            .targets
            .iter()
            .map(|&y| {
                let y = y as usize;
                if (c0..c0 + cs).contains(&y) {
                    (y - c0) as u32
                } else {
                    cs as u32
                }
            })
            .collect();
        Ok(Tensor::from_vec(local, (self.targets.len(), 1), dev)?)
    }

    /// The forward on detached inputs: `[N, 2]` (log p_y, H or 0) and the log-sum-exp `[N, 1]`.
    fn forward(&self, h: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
        let (n, _) = h.dims2()?;
        let v = w.dim(0)?;
        let acc = upcast(h.dtype());
        let dev = h.device();
        // Running (M, S, D, s_y), each [N, 1].
        let mut run: Option<(Tensor, Tensor, Tensor, Tensor)> = None;
        for c0 in (0..v).step_by(self.chunk) {
            let cs = self.chunk.min(v - c0);
            let s = self.logits(h, w, c0, cs)?;
            let m = s.max_keepdim(1)?;
            let d = s.broadcast_sub(&m)?;
            let e = d.exp()?;
            let se = e.sum_keepdim(1)?;
            let sd = if self.entropy {
                (&e * &d)?.sum_keepdim(1)?
            } else {
                se.zeros_like()?
            };
            // s_y: the target's logit when it lies in this chunk, else 0.
            let local = self.local_targets(c0, cs, dev)?;
            let inside = local.lt(cs as u32)?.to_dtype(acc)?;
            let sy = (s.gather(&local.minimum(cs as u32 - 1)?, 1)? * inside)?;
            run = Some(match run {
                None => (m, se, sd, sy),
                Some((mm, ss, dd, yy)) => {
                    let m2 = mm.maximum(&m)?;
                    let (sa, sb) = ((&mm - &m2)?, (&m - &m2)?);
                    let (a, b) = (sa.exp()?, sb.exp()?);
                    // D' = Σ e^{s−M'}(s−M') = a·(D + S·(M − M')) + b·(d + s·(m − M')).
                    let dd = ((&a * (dd + (&ss * &sa)?)?)? + (&b * (sd + (&se * &sb)?)?)?)?;
                    let ss = ((ss * a)? + (se * b)?)?;
                    (m2, ss, dd, (yy + sy)?)
                }
            });
        }
        let (m, s, d, sy) = run.ok_or_else(|| ModelError::Invalid("empty vocabulary".into()))?;
        let ln_s = s.log()?;
        let lse = (m + &ln_s)?;
        let lp = (sy - &lse)?;
        let ent = if self.entropy {
            (ln_s - (d / s)?)?
        } else {
            lp.zeros_like()?
        };
        let out = Tensor::cat(&[&lp, &ent], 1)?.contiguous()?;
        debug_assert_eq!(out.dims(), &[n, 2]);
        Ok((out, lse))
    }

    /// Gradients w.r.t. `h` `[N, H]` and `W` `[V, H]` (their dtypes; `W`'s only when
    /// `weight_grad`) for upstream `g` `[N, 2]`.
    fn backward(
        &self,
        h: &Tensor,
        w: &Tensor,
        res: &Tensor,
        g: &Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (n, hd) = h.dims2()?;
        let v = w.dim(0)?;
        let acc = upcast(h.dtype());
        let dev = h.device();
        let lse = self
            .lse
            .as_ref()
            .ok_or_else(|| ModelError::Invalid("chunked head: backward without forward".into()))?;
        let g = g.to_dtype(acc)?;
        let gl = g.narrow(1, 0, 1)?.contiguous()?;
        let (gh, ent) = if self.entropy {
            (
                Some(g.narrow(1, 1, 1)?.contiguous()?),
                res.narrow(1, 1, 1)?.to_dtype(acc)?.contiguous()?,
            )
        } else {
            (None, lse.zeros_like()?)
        };
        let mut dh = Tensor::zeros((n, hd), acc, dev)?;
        let mut dw = Vec::with_capacity(v.div_ceil(self.chunk));
        for c0 in (0..v).step_by(self.chunk) {
            let cs = self.chunk.min(v - c0);
            let (s, dcap) = self.logits_with(h, w, c0, cs, true)?;
            let lp = s.broadcast_sub(lse)?; // log p_j
            let p = lp.exp()?;
            let mut ds = p.broadcast_mul(&gl)?.neg()?;
            if let Some(gh) = &gh {
                let t = (p * lp.broadcast_add(&ent)?)?.broadcast_mul(gh)?;
                ds = (ds - t)?;
            }
            // + g_ℓ at the target column (rows whose target lies in this chunk).
            let local = self.local_targets(c0, cs, dev)?;
            let cols = Tensor::arange(0u32, cs as u32, dev)?.unsqueeze(0)?;
            let onehot = cols.broadcast_eq(&local)?.to_dtype(acc)?;
            ds = (ds + onehot.broadcast_mul(&gl)?)?;
            let ds = match dcap {
                Some(d) => (ds * d)?,
                None => ds,
            };
            let dz = (ds * self.inv_t)?.to_dtype(h.dtype())?;
            let wc = w.narrow(0, c0, cs)?;
            dh = (dh + dz.matmul(&wc)?.to_dtype(acc)?)?;
            if self.weight_grad {
                dw.push(dz.t()?.matmul(h)?.to_dtype(w.dtype())?);
            }
        }
        let dw = if self.weight_grad {
            Some(Tensor::cat(&dw, 0)?)
        } else {
            None
        };
        Ok((dh.to_dtype(h.dtype())?, dw))
    }
}

fn passthrough_check(l3: &Layout) -> candle_core::Result<()> {
    if l3.contiguous_offsets().map(|(a, _)| a) != Some(0) {
        candle_core::bail!("chunked head: the forward output must be contiguous at offset 0");
    }
    Ok(())
}

impl CustomOp3 for ChunkedHead {
    fn name(&self) -> &'static str {
        "chunked-lm-head-logprob-entropy"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        passthrough_check(l3)?;
        Ok((s3.try_clone(l3)?, l3.shape().clone()))
    }

    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        _: &CudaStorage,
        _: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        passthrough_check(l3)?;
        Ok((s3.try_clone(l3)?, l3.shape().clone()))
    }

    fn metal_fwd(
        &self,
        _: &MetalStorage,
        _: &Layout,
        _: &MetalStorage,
        _: &Layout,
        s3: &MetalStorage,
        l3: &Layout,
    ) -> candle_core::Result<(MetalStorage, Shape)> {
        passthrough_check(l3)?;
        Ok((s3.try_clone(l3)?, l3.shape().clone()))
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        _out: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // Detached: the gradients must not carry a graph that keeps every chunk alive.
        let (dh, dw) = self
            .backward(&h.detach(), &w.detach(), &res.detach(), &grad_res.detach())
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((Some(dh), dw, None))
    }
}
