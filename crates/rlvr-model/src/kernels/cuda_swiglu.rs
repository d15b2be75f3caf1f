//! Fused SwiGLU gating on CUDA (feature `cuda`): a candle custom op over the gate and up
//! projections `[rows, cols]` whose `cuda_fwd` launches `swiglu_fwd_*` (`silu(g) · u`) and
//! whose `bwd` launches `swiglu_bwd_*` (both input gradients in one pass) through
//! `rlvr_kernels::triton::cuda` on candle's stream.
//!
//! Not yet run on a GPU: the launch plans are the ones the model-level recorder replays under
//! Triton's interpreter (`crate::kernels::record_launches`); the GPU check is
//! `bench/gpu_check.sh`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, Layout, Shape, Tensor};
use rlvr_kernels::triton::families::swiglu::{self, Swiglu};

use super::cuda_launch::{check, kernel_dtype, launch, tensor, with_cuda, zeros, Out};
use crate::error::Result;

/// `silu(g) · u` of `g` and `u` `[.., cols]` (same shape, f32 or bf16, on CUDA), with the fused
/// backward.
pub(crate) fn apply(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    let cols = g.dims().last().copied().unwrap_or(1).max(1);
    let rows = g.elem_count() / cols;
    let flat = |t: &Tensor| -> Result<Tensor> { Ok(t.contiguous()?.reshape((rows, cols))?) };
    let a = flat(g)?.apply_op2(&flat(u)?, SwigluOp(Swiglu { rows, cols }))?;
    Ok(a.reshape(g.dims())?)
}

struct SwigluOp(Swiglu);

impl CustomOp2 for SwigluOp {
    fn name(&self) -> &'static str {
        "rlvr-fused-swiglu"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("fused SwiGLU is CUDA only (the CPU runs the candle composition)")
    }

    fn cuda_fwd(
        &self,
        g: &CudaStorage,
        lg: &Layout,
        u: &CudaStorage,
        lu: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        check(lg, "g")?;
        check(lu, "u")?;
        let s = &self.0;
        let dtype = g.dtype();
        let mut a = zeros(&g.device, dtype, s.rows * s.cols)?;
        launch(
            &g.device,
            &swiglu::variant("fwd", kernel_dtype(dtype, "SwiGLU")?),
            |e| swiglu::plan(e, s),
            &[("g", g, lg), ("u", u, lu)],
            &mut [Out {
                name: "a",
                storage: &mut a,
                views: &[],
            }],
        )?;
        Ok((a, Shape::from((s.rows, s.cols))))
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _a: &Tensor,
        da: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let s = &self.0;
        let dtype = g.dtype();
        let da = da.to_dtype(dtype)?.contiguous()?;
        with_cuda(&[g, u, &da], |c| {
            let dev = &c[0].0.device;
            let mut dg = zeros(dev, dtype, s.rows * s.cols)?;
            let mut du = zeros(dev, dtype, s.rows * s.cols)?;
            launch(
                dev,
                &swiglu::variant("bwd", kernel_dtype(dtype, "SwiGLU")?),
                |e| swiglu::plan(e, s),
                &[
                    ("g", c[0].0, c[0].1),
                    ("u", c[1].0, c[1].1),
                    ("da", c[2].0, c[2].1),
                ],
                &mut [
                    Out {
                        name: "dg",
                        storage: &mut dg,
                        views: &[],
                    },
                    Out {
                        name: "du",
                        storage: &mut du,
                        views: &[],
                    },
                ],
            )?;
            let sh = (s.rows, s.cols);
            Ok((Some(tensor(dg, sh)), Some(tensor(du, sh))))
        })
    }
}
