//! Fused rotary embedding on CUDA (feature `cuda`): a candle custom op over q `[N, nh, hd]` and
//! k `[N, nkv, hd]` whose `cuda_fwd` launches `rotary_fwd_*` (one program per token rotates all
//! its q heads, then its k heads, reading the f32 tables at the token's position) into one
//! output holding the rotated q then the rotated k, and whose `bwd` launches `rotary_bwd_*`
//! (the transposed rotation) on the two incoming gradients, through `rlvr_kernels::triton::cuda`
//! on candle's stream.
//!
//! Not yet run on a GPU: the launch plans are the ones the model-level recorder replays under
//! Triton's interpreter (`crate::kernels::record_launches`); the GPU check is
//! `bench/gpu_check.sh`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, Layout, Shape, Tensor};
use rlvr_kernels::triton::families::rotary::{self, Rotary};

use super::cuda_launch::{check, kernel_dtype, launch, tensor, with_cuda, zeros, Out};
use super::FusedRope;
use crate::error::Result;

/// The rotary embedding of q `[B, T, nh, hd]` and k `[B, T, nkv, hd]` (f32 or bf16, head dim 64
/// or 128, on CUDA) at the positions and tables of `f`: the rotated `(q, k)`, same shapes, with
/// the fused backward.
pub(crate) fn apply(q: &Tensor, k: &Tensor, f: &FusedRope) -> Result<(Tensor, Tensor)> {
    let (b, t, nh, hd) = q.dims4()?;
    let nkv = k.dim(2)?;
    let n = b * t;
    let s = Rotary {
        tokens: n,
        q_heads: nh,
        kv_heads: nkv,
        head_dim: hd,
    };
    let op = RotaryOp {
        s,
        pos: f.pos.clone(),
        cos: f.cos.clone(),
        sin: f.sin.clone(),
    };
    let q2 = q.contiguous()?.reshape((n, nh, hd))?;
    let k2 = k.contiguous()?.reshape((n, nkv, hd))?;
    let out = q2.apply_op2(&k2, op)?;
    let (nq, nk) = (n * nh * hd, n * nkv * hd);
    Ok((
        out.narrow(0, 0, nq)?.reshape(q.dims())?,
        out.narrow(0, nq, nk)?.reshape(k.dims())?,
    ))
}

struct RotaryOp {
    s: Rotary,
    /// Each token's position `[N]` i32, and the f32 tables `[n, hd]`.
    pos: Tensor,
    cos: Tensor,
    sin: Tensor,
}

impl RotaryOp {
    /// One launch of `kernel` (`"fwd"` or `"bwd"`) over `x` (q or dq) and `y` (k or dk).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        kernel: &str,
        names: [&str; 4],
        x: (&CudaStorage, &Layout),
        y: (&CudaStorage, &Layout),
        outputs: &mut [Out<'_>],
    ) -> candle_core::Result<()> {
        check(x.1, names[0])?;
        check(y.1, names[1])?;
        let s = &self.s;
        let dtype = x.0.dtype();
        let name = rotary::variant(kernel, kernel_dtype(dtype, "rotary")?, s.head_dim);
        with_cuda(&[&self.cos, &self.sin, &self.pos], |c| {
            launch(
                &x.0.device,
                &name,
                |e| rotary::plan(e, s),
                &[
                    (names[0], x.0, x.1),
                    (names[1], y.0, y.1),
                    ("cos", c[0].0, c[0].1),
                    ("sin", c[1].0, c[1].1),
                    ("pos", c[2].0, c[2].1),
                ],
                outputs,
            )
        })
    }
}

impl CustomOp2 for RotaryOp {
    fn name(&self) -> &'static str {
        "rlvr-fused-rotary"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("fused rotary is CUDA only (the CPU runs the candle composition)")
    }

    /// Output: the rotated q (`N·nh·hd` elements) then the rotated k, flat.
    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let s = &self.s;
        let (nq, nk) = (
            s.tokens * s.q_heads * s.head_dim,
            s.tokens * s.kv_heads * s.head_dim,
        );
        let mut out = zeros(&q.device, q.dtype(), nq + nk)?;
        let views = [("k_out", nq)];
        self.run(
            "fwd",
            ["q", "k", "q_out", "k_out"],
            (q, lq),
            (k, lk),
            &mut [Out {
                name: "q_out",
                storage: &mut out,
                views: &views,
            }],
        )?;
        Ok((out, Shape::from(nq + nk)))
    }

    fn bwd(
        &self,
        q: &Tensor,
        _k: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let s = &self.s;
        let (nq, nk) = (
            s.tokens * s.q_heads * s.head_dim,
            s.tokens * s.kv_heads * s.head_dim,
        );
        let grad = grad.to_dtype(q.dtype())?;
        let dq = grad.narrow(0, 0, nq)?.contiguous()?;
        let dk = grad.narrow(0, nq, nk)?.contiguous()?;
        with_cuda(&[&dq, &dk], |c| {
            let dev = &c[0].0.device;
            let mut dq_out = zeros(dev, q.dtype(), nq)?;
            let mut dk_out = zeros(dev, q.dtype(), nk)?;
            self.run(
                "bwd",
                ["dq", "dk", "dq_out", "dk_out"],
                c[0],
                c[1],
                &mut [
                    Out {
                        name: "dq_out",
                        storage: &mut dq_out,
                        views: &[],
                    },
                    Out {
                        name: "dk_out",
                        storage: &mut dk_out,
                        views: &[],
                    },
                ],
            )?;
            let (hq, hk, d) = (s.q_heads, s.kv_heads, s.head_dim);
            Ok((
                Some(tensor(dq_out, (s.tokens, hq, d))),
                Some(tensor(dk_out, (s.tokens, hk, d))),
            ))
        })
    }
}
