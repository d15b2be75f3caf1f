//! The fused log-prob head on CUDA (feature `cuda`, `kernels.logprob_head`): per vocabulary
//! chunk, the logits from cuBLAS (candle's matmul) and the chunk kernels of [`super::head`] for
//! the rest; the backward recomputes each chunk, turns it into `∂L/∂z` in place and takes `∂h`,
//! `∂W` by GEMMs. The per-row state `[N, 4]` is kept from the forward for the backward; no
//! `[N, V]` buffer beyond one chunk exists.
//!
//! Autograd as [`crate::chunked`]: the forward runs on detached tensors; a [`CustomOp3`] node
//! `(h, W, out)` whose forward returns `out` unchanged attaches the backward.
//!
//! Not yet run on a GPU: the launch plans are those the CPU recorder writes and
//! `kernels/replay.py` replays; the GPU check is `bench/gpu_check.sh`.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Shape, Tensor};
use rlvr_kernels::triton::cuda as tc;
use rlvr_kernels::triton::families::{self, logprob_head::LogprobChunk};
use rlvr_kernels::triton::{DeviceBuffer, Manifest};

use super::cuda_adamw::{stream_of, tri, with_mut};
use super::head::{cap_arg, variant};
use crate::error::{ModelError, Result};

/// Launches variant `name` (its aligned twin when the chunk and addresses qualify) over `s`.
fn launch(t: &Tensor, name: &str, s: &LogprobChunk, bufs: &[(&str, DeviceBuffer)]) -> Result<()> {
    let stream = stream_of(t)?;
    let m = Manifest::committed().map_err(tri)?;
    let target = tc::device_target(&stream, m).map_err(tri)?;
    let plan = families::pick(m, name, target, Some(bufs), |e| {
        families::logprob_head::plan(e, s)
    })
    .map_err(tri)?;
    tc::launch(&stream, m, &plan, bufs).map_err(tri)
}

/// The fused head: `[N, 2]` (log p_y, H; H meaningless without `entropy`) f32 for hidden states
/// `h` `[N, H]` and head weight `w` `[V, H]` (f32 or bf16, on CUDA) at `targets` (checked `< V`),
/// temperature `temperature`, chunks of `chunk` entries, final-logit `softcap` (Gemma 2; the
/// `_softcap` variants); `grad` attaches the backward (`∂W` only with `weight_grad`). `None` for
/// a dtype the kernels do not cover.
///
/// Errors: tensor errors, a failed launch.
pub(crate) fn apply(
    h: &Tensor,
    w: &Tensor,
    targets: &[u32],
    (temperature, entropy, chunk): (f64, bool, usize),
    softcap: Option<f64>,
    grad: bool,
    weight_grad: bool,
) -> Result<Option<Tensor>> {
    let (n, hd) = h.dims2()?;
    let (v, hd2) = w.dims2()?;
    if variant("fwd", h.dtype(), false).is_none() || w.dtype() != h.dtype() || hd != hd2 || n == 0 {
        return Ok(None);
    }
    if v > i32::MAX as usize || chunk == 0 {
        return Ok(None);
    }
    let tg: Vec<i32> = targets.iter().map(|&y| y as i32).collect();
    let op = HeadOp {
        targets: Tensor::from_vec(tg, n, h.device())?,
        inv_t: (1.0 / temperature) as f32,
        entropy,
        softcap,
        chunk,
        weight_grad,
        state: Arc::new(std::sync::Mutex::new(None)),
    };
    let (hd_, wd_) = (h.detach().contiguous()?, w.detach().contiguous()?);
    let out = op.forward(&hd_, &wd_)?;
    Ok(Some(if grad { h.apply_op3(w, &out, op)? } else { out }))
}

#[derive(Clone)]
struct HeadOp {
    /// `[N]` i32 vocabulary ids on the device.
    targets: Tensor,
    inv_t: f32,
    entropy: bool,
    /// Gemma 2's final-logit softcap, applied by the `_softcap` variants.
    softcap: Option<f64>,
    chunk: usize,
    weight_grad: bool,
    /// The forward's merged state `[N, 4]` f32, for the backward.
    state: Arc<std::sync::Mutex<Option<Tensor>>>,
}

impl HeadOp {
    fn shape(&self, n: usize, c0: usize, cs: usize) -> LogprobChunk {
        LogprobChunk {
            rows: n,
            n_cols: cs,
            stride_z: cs,
            col0: c0,
            first: c0 == 0,
            inv_t: self.inv_t,
            cap: cap_arg(self.softcap),
        }
    }

    /// The chunk's logits `[N, cs]` in the model dtype, contiguous (a fresh tensor).
    fn logits(h: &Tensor, w: &Tensor, c0: usize, cs: usize) -> Result<Tensor> {
        Ok(h.matmul(&w.narrow(0, c0, cs)?.t()?)?.contiguous()?)
    }

    fn forward(&self, h: &Tensor, w: &Tensor) -> Result<Tensor> {
        let (n, v) = (h.dim(0)?, w.dim(0)?);
        let dt = h.dtype();
        let fwd = variant("fwd", dt, self.softcap.is_some())
            .ok_or_else(|| ModelError::Invalid(format!("{dt:?}")))?;
        let state = Tensor::zeros((n, 4), DType::F32, h.device())?;
        for c0 in (0..v).step_by(self.chunk) {
            let cs = self.chunk.min(v - c0);
            let z = Self::logits(h, w, c0, cs)?;
            let s = self.shape(n, c0, cs);
            with_mut(&[&state], &[&z, &self.targets], &|b| {
                launch(
                    h,
                    &fwd,
                    &s,
                    &[("state", b[0]), ("z", b[1]), ("targets", b[2])],
                )
            })?;
        }
        let out = Tensor::zeros((n, 2), DType::F32, h.device())?;
        let s = self.shape(n, 0, self.chunk.min(v));
        with_mut(&[&out], &[&state], &|b| {
            launch(h, "logprob_finish", &s, &[("out", b[0]), ("state", b[1])])
        })?;
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
        Ok(out)
    }

    fn backward(
        &self,
        h: &Tensor,
        w: &Tensor,
        res: &Tensor,
        g: &Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (n, hd) = h.dims2()?;
        let v = w.dim(0)?;
        let dt = h.dtype();
        let bwd = variant("bwd", dt, self.softcap.is_some())
            .ok_or_else(|| ModelError::Invalid(format!("{dt:?}")))?;
        let state = (self.state.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .ok_or_else(|| ModelError::Invalid("fused head: backward without forward".into()))?;
        let g = g.to_dtype(DType::F32)?;
        // Without entropy the head passes g_H = 0 (the kernel then never reads H).
        let g = if self.entropy {
            g.contiguous()?
        } else {
            Tensor::cat(&[&g.narrow(1, 0, 1)?, &g.narrow(1, 1, 1)?.zeros_like()?], 1)?
        };
        let res = res.to_dtype(DType::F32)?.contiguous()?;
        let mut dh = Tensor::zeros((n, hd), DType::F32, h.device())?;
        let mut dw = Vec::new();
        for c0 in (0..v).step_by(self.chunk) {
            let cs = self.chunk.min(v - c0);
            let z = Self::logits(h, w, c0, cs)?;
            let s = self.shape(n, c0, cs);
            with_mut(&[&z], &[&self.targets, &state, &res, &g], &|b| {
                launch(
                    h,
                    &bwd,
                    &s,
                    &[
                        ("z", b[0]),
                        ("targets", b[1]),
                        ("state", b[2]),
                        ("out", b[3]),
                        ("grad", b[4]),
                    ],
                )
            })?;
            // z now holds ∂L/∂z of the chunk, in the model dtype.
            let wc = w.narrow(0, c0, cs)?;
            dh = (dh + z.matmul(&wc)?.to_dtype(DType::F32)?)?;
            if self.weight_grad {
                dw.push(z.t()?.matmul(h)?.to_dtype(w.dtype())?);
            }
        }
        let dw = if self.weight_grad {
            Some(Tensor::cat(&dw, 0)?)
        } else {
            None
        };
        Ok((dh.to_dtype(dt)?, dw))
    }
}

impl CustomOp3 for HeadOp {
    fn name(&self) -> &'static str {
        "rlvr-fused-logprob-head"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the fused head is CUDA only (the CPU runs its own head)")
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
        let (dh, dw) = self
            .backward(
                &h.detach().contiguous()?,
                &w.detach().contiguous()?,
                &res.detach(),
                &grad_res.detach(),
            )
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((Some(dh), dw, None))
    }
}
