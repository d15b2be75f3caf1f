//! One-pass AdamW and the gradient norm's sums of squares on CUDA (feature `cuda`,
//! `kernels.adamw`): the launches [`super::adamw`] describes, on candle's stream through
//! `rlvr_kernels::triton::cuda`. The parameter, its master, the moments and the partials are
//! written in place: each tensor's storage is taken for writing by a candle in-place op, nested
//! so that all of one launch's buffers are held at once ([`with_mut`]).
//!
//! Not yet run on a GPU: the launch plans are those the CPU recorder writes and
//! `kernels/replay.py` replays; the GPU check is `bench/gpu_check.sh`.

use std::cell::RefCell;

use candle_core::{CpuStorage, CudaStorage, DType, Device, Layout, Storage, Tensor};
use rlvr_kernels::triton::cuda as tc;
use rlvr_kernels::triton::families::{self, adamw::Adamw};
use rlvr_kernels::triton::{DeviceBuffer, Manifest};

use super::adamw::{partial_slots, step_variant, sumsq_variant};
use crate::error::{ModelError, Result};

/// A candle in-place op that lends its storage's [`DeviceBuffer`] to `inner` while held.
struct Lend<'a> {
    inner: &'a dyn Fn(DeviceBuffer) -> candle_core::Result<()>,
}

impl candle_core::InplaceOp1 for Lend<'_> {
    fn name(&self) -> &'static str {
        "rlvr-fused-adamw-buffer"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("fused AdamW is CUDA only (the CPU runs its in-place passes)")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        if !l.is_contiguous() {
            candle_core::bail!("fused AdamW: a buffer is not contiguous");
        }
        let stream = s.device.cuda_stream();
        let (b, guard) = tc::candle_buffer_mut(s, l, &stream)?;
        let r = (self.inner)(b);
        drop(guard);
        r
    }
}

/// Runs `f` with the device buffers of `writes` (each held for writing) and `reads` (held for
/// reading), in that order. The tensors must be distinct storages.
pub(crate) fn with_mut(
    writes: &[&Tensor],
    reads: &[&Tensor],
    f: &dyn Fn(&[DeviceBuffer]) -> Result<()>,
) -> Result<()> {
    let held: RefCell<Vec<DeviceBuffer>> = RefCell::new(Vec::new());
    let err: RefCell<Option<ModelError>> = RefCell::new(None);
    fn level(
        i: usize,
        writes: &[&Tensor],
        reads: &[&Tensor],
        held: &RefCell<Vec<DeviceBuffer>>,
        err: &RefCell<Option<ModelError>>,
        f: &dyn Fn(&[DeviceBuffer]) -> Result<()>,
    ) -> candle_core::Result<()> {
        if i == writes.len() {
            let mut all = held.borrow().clone();
            let mut storages = Vec::new();
            for t in reads {
                storages.push(t.storage_and_layout());
            }
            let mut streams = Vec::new();
            for (s, _) in &storages {
                let Storage::Cuda(c) = &**s else {
                    candle_core::bail!("fused AdamW: a tensor is not on CUDA");
                };
                streams.push(c.device.cuda_stream());
            }
            // Declared after what they borrow: dropped first.
            let mut guards = Vec::new();
            for ((s, l), stream) in storages.iter().zip(&streams) {
                let Storage::Cuda(c) = &**s else {
                    unreachable!("checked above")
                };
                if !l.is_contiguous() {
                    candle_core::bail!("fused AdamW: a buffer is not contiguous");
                }
                let (b, g) = tc::candle_buffer(c, l, stream)?;
                all.push(b);
                guards.push(g);
            }
            if let Err(e) = f(&all) {
                *err.borrow_mut() = Some(e);
                candle_core::bail!("fused AdamW failed");
            }
            drop(guards);
            return Ok(());
        }
        let inner = |b: DeviceBuffer| {
            held.borrow_mut().push(b);
            let r = level(i + 1, writes, reads, held, err, f);
            held.borrow_mut().pop();
            r
        };
        writes[i].inplace_op1(&Lend { inner: &inner })
    }
    match level(0, writes, reads, &held, &err, f) {
        Ok(()) => Ok(()),
        Err(e) => Err(err.into_inner().unwrap_or(ModelError::Candle(e))),
    }
}

pub(crate) fn stream_of(
    t: &Tensor,
) -> Result<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>> {
    match t.device() {
        Device::Cuda(d) => Ok(d.cuda_stream()),
        _ => Err(ModelError::Invalid("fused AdamW: not a CUDA tensor".into())),
    }
}

/// Launches the plan of variant `name` (its aligned twin when every address and length
/// qualifies) with `bufs` by name.
fn launch(t: &Tensor, name: &str, shape: &Adamw, bufs: &[(&str, DeviceBuffer)]) -> Result<()> {
    let stream = stream_of(t)?;
    let m = Manifest::committed().map_err(tri)?;
    let target = tc::device_target(&stream, m).map_err(tri)?;
    let plan = families::pick(m, name, target, Some(bufs), |e| {
        families::adamw::plan(e, shape)
    })
    .map_err(tri)?;
    tc::launch(&stream, m, &plan, bufs).map_err(tri)
}

pub(crate) fn tri(e: rlvr_kernels::triton::TritonError) -> ModelError {
    ModelError::Invalid(e.to_string())
}

/// One AdamW step of `theta` (f32: the parameter, or the master of the bf16 parameter `copy`)
/// with the moments `m`, `v` (f32) from `grad` (f32, or bf16 with a master), all contiguous on
/// one CUDA device, in one launch. `Ok(false)` (nothing launched) for what the kernels do not
/// cover: then the caller runs the candle update.
///
/// Errors: the launch's.
pub(crate) fn step(
    theta: &Tensor,
    grad: &Tensor,
    m: &Tensor,
    v: &Tensor,
    copy: Option<&Tensor>,
    scalars: rlvr_kernels::triton::families::adamw::AdamwScalars,
) -> Result<bool> {
    let Some(name) = step_variant(copy.is_some(), grad.dtype()) else {
        return Ok(false);
    };
    let n = theta.elem_count();
    let ok = [Some(theta), Some(m), Some(v), Some(grad), copy]
        .into_iter()
        .flatten()
        .all(|t| t.is_contiguous() && t.elem_count() == n && t.device().is_cuda())
        && theta.dtype() == DType::F32
        && m.dtype() == DType::F32
        && v.dtype() == DType::F32
        && copy.is_none_or(|c| c.dtype() == DType::BF16);
    if !ok || n == 0 {
        return Ok(false);
    }
    let shape = Adamw::Step { n, scalars };
    let mut writes = vec![theta, m, v];
    writes.extend(copy);
    with_mut(&writes, &[grad], &|b| {
        let mut bufs = vec![("param", b[0]), ("exp_avg", b[1]), ("exp_avg_sq", b[2])];
        if copy.is_some() {
            bufs.push(("copy", b[3]));
        }
        bufs.push(("grad", b[b.len() - 1]));
        launch(theta, name, &shape, &bufs)
    })?;
    Ok(true)
}

/// ‖g‖² of `grads` (contiguous f32/bf16 on one CUDA device, in order): one `grad_sumsq_*`
/// launch per gradient into consecutive slots of one partials buffer, then `grad_sumsq_total`
/// adds them in f64 in a fixed order; one copy of the f64 result to the host. `None` when a
/// gradient is not covered (then the caller sums with candle).
///
/// Errors: the launches', the copy's.
pub(crate) fn sumsq(grads: &[&Tensor]) -> Result<Option<f64>> {
    let Some(first) = grads.first() else {
        return Ok(Some(0.0));
    };
    if grads.iter().any(|g| {
        !g.is_contiguous()
            || !g.device().same_device(first.device())
            || sumsq_variant(g.dtype()).is_none()
    }) {
        return Ok(None);
    }
    let lens: Vec<usize> = grads.iter().map(|g| g.elem_count()).collect();
    let (slots, n_partials) = partial_slots(&lens)?;
    let dev = first.device();
    let partials = Tensor::zeros(n_partials.max(1), DType::F32, dev)?;
    let out = Tensor::zeros(1, DType::F64, dev)?;
    for ((g, &slot), &n) in grads.iter().zip(&slots).zip(&lens) {
        if n == 0 {
            continue;
        }
        let name = sumsq_variant(g.dtype()).unwrap_or("grad_sumsq_f32");
        let shape = Adamw::SumSq {
            n,
            partials_offset: slot,
        };
        with_mut(&[&partials], &[g], &|b| {
            launch(first, name, &shape, &[("partials", b[0]), ("grad", b[1])])
        })?;
    }
    let shape = Adamw::Total { n_partials };
    with_mut(&[&out], &[&partials], &|b| {
        launch(
            first,
            "grad_sumsq_total",
            &shape,
            &[("out", b[0]), ("partials", b[1])],
        )
    })?;
    Ok(Some(out.to_vec1::<f64>()?[0]))
}
