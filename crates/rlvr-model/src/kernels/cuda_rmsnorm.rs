//! Fused RMSNorm on CUDA (feature `cuda`): candle custom ops over rows `[rows, cols]` whose
//! `cuda_fwd` launches `rmsnorm_fwd_*` (or, with the residual add before the norm,
//! `rmsnorm_add_fwd_*`, writing the sum `h` and the normed `y` into one `[2, rows, cols]`
//! output) through `rlvr_kernels::triton::cuda` on candle's stream, keeping each row's
//! `1/rms` inside the op for the backward, and whose `bwd` launches `rmsnorm_bwd_*` /
//! `rmsnorm_add_bwd_*` (the input gradient, plus the gradient `h` received from its other uses,
//! and one partial weight gradient per program) then `rmsnorm_dw_*`, which sums the partials in
//! program order: no atomics, and `rows_per_prog` depends on the shape alone
//! ([`super::rmsnorm_shape`]), so reruns are bit-identical.
//!
//! Not yet run on a GPU: the launch plans are the ones the model-level recorder replays under
//! Triton's interpreter (`crate::kernels::record_launches`); the GPU check is
//! `bench/gpu_check.sh`.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor};
use rlvr_kernels::triton::families::rmsnorm::{self, RmsNorm};

use super::cuda_launch::{check, kernel_dtype, launch, tensor, with_cuda, zeros, Out};
use super::rmsnorm_shape;
use crate::error::Result;

/// `(rows, cols)` of `x` `[.., cols]`.
fn rows_cols(x: &Tensor) -> (usize, usize) {
    let cols = x.dims().last().copied().unwrap_or(1).max(1);
    (x.elem_count() / cols, cols)
}

/// RMSNorm of `x` `[.., cols]` (f32 or bf16, on CUDA) with `w` `[cols]` of the same dtype (what
/// [`super::rmsnorm_covers`] accepts): `[.., cols]`, with the fused backward.
pub(crate) fn apply(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let (rows, cols) = rows_cols(x);
    let x2 = x.contiguous()?.reshape((rows, cols))?;
    let op = NormOp {
        s: rmsnorm_shape(rows, cols, eps),
        rstd: Mutex::new(None),
    };
    let y = x2.apply_op2(&w.contiguous()?, op)?;
    Ok(y.reshape(x.dims())?)
}

/// `h = residual + x` and RMSNorm of `h` with `w`, fused (shapes and dtypes as [`apply`]):
/// `(h, y)`, both `[.., cols]`, with the fused backward.
pub(crate) fn apply_add(
    residual: &Tensor,
    x: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let (rows, cols) = rows_cols(x);
    let flat = |t: &Tensor| -> Result<Tensor> { Ok(t.contiguous()?.reshape((rows, cols))?) };
    let op = AddNormOp {
        s: rmsnorm_shape(rows, cols, eps),
        rstd: Mutex::new(None),
    };
    let out = flat(x)?.apply_op3(&flat(residual)?, &w.contiguous()?, op)?;
    Ok((
        out.get(0)?.reshape(x.dims())?,
        out.get(1)?.reshape(x.dims())?,
    ))
}

struct NormOp {
    s: RmsNorm,
    /// The forward's `1/rms` per row `[rows]` f32, for the backward.
    rstd: Mutex<Option<Tensor>>,
}

struct AddNormOp {
    s: RmsNorm,
    rstd: Mutex<Option<Tensor>>,
}

fn cpu_refused() -> candle_core::Result<(CpuStorage, Shape)> {
    candle_core::bail!("fused RMSNorm is CUDA only (the CPU runs the candle composition)")
}

fn rstd_of(m: &Mutex<Option<Tensor>>) -> candle_core::Result<Tensor> {
    (m.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .ok_or_else(|| candle_core::Error::Msg("fused RMSNorm: no forward rstd".into()))
}

/// The forward launch: `inputs` are x, w (and residual); `out` receives y (or h_out then y).
fn forward(
    s: &RmsNorm,
    inputs: &[(&str, &CudaStorage, &Layout)],
    add: bool,
    store: &Mutex<Option<Tensor>>,
) -> candle_core::Result<CudaStorage> {
    let (x, lx) = (inputs[0].1, inputs[0].2);
    for (n, _, l) in inputs {
        check(l, n)?;
    }
    if lx.shape().dims() != [s.rows, s.cols] {
        candle_core::bail!(
            "fused RMSNorm: x is {:?}, not [{}, {}]",
            lx.shape(),
            s.rows,
            s.cols
        );
    }
    let dev = &x.device;
    let dtype = x.dtype();
    let kd = kernel_dtype(dtype, "RMSNorm")?;
    let n = s.rows * s.cols;
    let mut out = zeros(dev, dtype, if add { 2 * n } else { n })?;
    let mut rstd = zeros(dev, DType::F32, s.rows)?;
    let kernel = if add { "add_fwd" } else { "fwd" };
    let views = [("y", n)];
    let first = Out {
        name: if add { "h_out" } else { "y" },
        storage: &mut out,
        views: if add { &views[..] } else { &[] },
    };
    launch(
        dev,
        &rmsnorm::variant(kernel, kd, s.cols)?,
        |e| rmsnorm::plan(e, s),
        inputs,
        &mut [
            first,
            Out {
                name: "rstd",
                storage: &mut rstd,
                views: &[],
            },
        ],
    )?;
    *store.lock().unwrap_or_else(|e| e.into_inner()) = Some(tensor(rstd, s.rows));
    Ok(out)
}

/// The backward: `dx` `[rows, cols]` (including `dres`, the gradient of the sum from its other
/// uses, for the add variant) and, when `want_dw`, `dw` `[cols]`.
fn backward(
    s: &RmsNorm,
    h: &Tensor,
    w: &Tensor,
    rstd: &Tensor,
    dres: Option<&Tensor>,
    dy: &Tensor,
    want_dw: bool,
) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let dtype = h.dtype();
    let kd = kernel_dtype(dtype, "RMSNorm")?;
    let (rows, cols) = (s.rows, s.cols);
    let parts = rows.div_ceil(s.rows_per_prog);
    let dy = dy.to_dtype(dtype)?.contiguous()?;
    let h = h.contiguous()?;
    let dres = dres.map(|d| d.to_dtype(dtype)?.contiguous()).transpose()?;
    let mut ts = vec![&dy, &h, w, rstd];
    ts.extend(dres.as_ref());
    with_cuda(&ts, |c| {
        let dev = &c[0].0.device;
        let names = ["dy", "h", "w", "rstd", "dres"];
        let ins: Vec<(&str, &CudaStorage, &Layout)> = (c.iter().zip(names))
            .map(|((s, l), n)| (n, *s, *l))
            .collect();
        let mut dx = zeros(dev, dtype, rows * cols)?;
        let mut dw_part = zeros(dev, DType::F32, parts * cols)?;
        let kernel = if dres.is_some() { "add_bwd" } else { "bwd" };
        launch(
            dev,
            &rmsnorm::variant(kernel, kd, cols)?,
            |e| rmsnorm::plan(e, s),
            &ins,
            &mut [
                Out {
                    name: "dx",
                    storage: &mut dx,
                    views: &[],
                },
                Out {
                    name: "dw_part",
                    storage: &mut dw_part,
                    views: &[],
                },
            ],
        )?;
        let dw = if want_dw {
            let mut dw = zeros(dev, dtype, cols)?;
            let pl = Layout::contiguous(parts * cols);
            launch(
                dev,
                &rmsnorm::variant("dw", kd, cols)?,
                |e| rmsnorm::plan(e, s),
                &[("dw_part", &dw_part, &pl)],
                &mut [Out {
                    name: "dw",
                    storage: &mut dw,
                    views: &[],
                }],
            )?;
            Some(tensor(dw, cols))
        } else {
            None
        };
        Ok((tensor(dx, (rows, cols)), dw))
    })
}

impl CustomOp2 for NormOp {
    fn name(&self) -> &'static str {
        "rlvr-fused-rmsnorm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_refused()
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        lx: &Layout,
        w: &CudaStorage,
        lw: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let y = forward(&self.s, &[("x", x, lx), ("w", w, lw)], false, &self.rstd)?;
        Ok((y, Shape::from((self.s.rows, self.s.cols))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let rstd = rstd_of(&self.rstd)?;
        let (dx, dw) = backward(&self.s, x, w, &rstd, None, dy, w.track_op())?;
        Ok((Some(dx), dw))
    }
}

impl CustomOp3 for AddNormOp {
    fn name(&self) -> &'static str {
        "rlvr-fused-add-rmsnorm"
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
        cpu_refused()
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        lx: &Layout,
        residual: &CudaStorage,
        lr: &Layout,
        w: &CudaStorage,
        lw: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let ins = [("x", x, lx), ("residual", residual, lr), ("w", w, lw)];
        let out = forward(&self.s, &ins, true, &self.rstd)?;
        Ok((out, Shape::from((2, self.s.rows, self.s.cols))))
    }

    /// The gradient of the stacked output `[2, rows, cols]`: the sum's (`dres`, from the
    /// residual stream) then the normed output's (`dy`); x and the residual both get `dx`.
    fn bwd(
        &self,
        _x: &Tensor,
        _residual: &Tensor,
        w: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let rstd = rstd_of(&self.rstd)?;
        let (dres, dy, h) = (grad.get(0)?, grad.get(1)?, out.get(0)?);
        let (dx, dw) = backward(&self.s, &h, w, &rstd, Some(&dres), &dy, w.track_op())?;
        Ok((Some(dx.clone()), Some(dx), dw))
    }
}
