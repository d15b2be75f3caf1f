//! One-pass AdamW and the gradient norm's partial sums (`kernels.adamw`, issue 44): what the
//! CUDA path ([`super::cuda_adamw`]) and the CPU launch recorder share, the variant choice and
//! the launch shapes, and the recorder's taps.
//!
//! On CUDA with the switch on, `optim::AdamW` launches one `adamw_*` kernel per
//! parameter tensor (master, both moments and the bf16 copy in one pass) and
//! `optim::grad_sumsq` one `grad_sumsq_*` per gradient tensor into consecutive slots of
//! one partials buffer, then `grad_sumsq_total` (the f64 total, in a fixed order). On the CPU,
//! under [`super::record_launches`], the same launches are recorded from the real tensors of an
//! optimizer step, with the CPU passes' results (`rlvr_kernels::adamw`, which the kernels equal
//! bit for bit by design) as the expected outputs.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};
use rlvr_kernels::triton::families::adamw::{self, Adamw, AdamwScalars};
use rlvr_kernels::triton::{self, HostBuffer, Tolerance};

use super::{host_f32, twin_of, wants, write_record};
use crate::error::{ModelError, Result};

/// The AdamW variant for an f32 `theta` (the parameter itself, or the master of a bf16
/// parameter: `master`) and a gradient of `grad`: `None` for what the kernels do not cover (an
/// f16/f64 parameter, a gradient neither f32 nor bf16, a bf16 gradient without a master).
pub(crate) fn step_variant(master: bool, grad: DType) -> Option<&'static str> {
    match (master, grad) {
        (false, DType::F32) => Some("adamw_f32"),
        (true, DType::F32) => Some("adamw_master_bf16"),
        (true, DType::BF16) => Some("adamw_master_bf16_gbf16"),
        _ => None,
    }
}

/// The sum-of-squares variant for a gradient of `dtype` (f32 or bf16).
pub(crate) fn sumsq_variant(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("grad_sumsq_f32"),
        DType::BF16 => Some("grad_sumsq_bf16"),
        _ => None,
    }
}

/// The partials slot of each gradient of `lens` elements (consecutive, in order) and the total
/// number of partials, under the compiled `grad_sumsq_f32` (the bf16 variant has the same span).
///
/// Errors: the manifest lacks the kernel.
pub(crate) fn partial_slots(lens: &[usize]) -> Result<(Vec<usize>, usize)> {
    let m = triton::Manifest::committed().map_err(plan_err)?;
    let e = m
        .entry("grad_sumsq_f32", triton::Target::Sm90a)
        .map_err(plan_err)?;
    let mut at = 0;
    let mut slots = Vec::with_capacity(lens.len());
    for &n in lens {
        slots.push(at);
        at += adamw::partials_for(e, n).map_err(plan_err)?;
    }
    Ok((slots, at))
}

fn plan_err(e: triton::TritonError) -> ModelError {
    ModelError::Invalid(e.to_string())
}

/// Bit-level agreement (the kernels are bit-identical to the CPU passes by design; the replay's
/// bound must be positive, so a few f32 ulps).
const EXACT: Tolerance = Tolerance {
    atol: 1e-30,
    rtol: 4e-7,
};

/// The state of one parameter's update before it runs, taken under the recorder when the
/// record of its variant is still to be written ([`StepTap::before`]).
pub(crate) struct StepTap {
    name: &'static str,
    n: usize,
    theta: Vec<f32>,
    grad: HostBuffer,
    m: Vec<f32>,
    v: Vec<f32>,
    scalars: AdamwScalars,
}

impl StepTap {
    /// Under the recorder, on the CPU: the inputs of the launch that would update `theta` (f32;
    /// the master when `master`) with `grad` (f32 or bf16, unscaled) and the moments `m`, `v`,
    /// if its variant's record is still to be written. `None` otherwise.
    pub(crate) fn before(
        master: bool,
        theta: &Tensor,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
        scalars: AdamwScalars,
    ) -> Result<Option<StepTap>> {
        let Some(name) = step_variant(master, grad.dtype()) else {
            return Ok(None);
        };
        if !theta.device().is_cpu() || !(wants(&label(name)) || wants_twin(name)) {
            return Ok(None);
        }
        let n = theta.elem_count();
        let g = host_f32(grad)?;
        let grad = match grad.dtype() {
            DType::BF16 => HostBuffer::bf16(&[n], &g),
            _ => HostBuffer::f32(&[n], &g),
        };
        Ok(Some(StepTap {
            name,
            n,
            theta: host_f32(theta)?,
            grad,
            m: host_f32(m)?,
            v: host_f32(v)?,
            scalars,
        }))
    }

    /// Writes the record from the CPU update's results: `theta`, `m`, `v` after the step and,
    /// with a master, the parameter `copy` (bf16) it wrote. The aligned twin's too when the
    /// length allows it (the CUDA path's first choice).
    pub(crate) fn after(
        self,
        theta: &Tensor,
        m: &Tensor,
        v: &Tensor,
        copy: Option<&Tensor>,
    ) -> Result<()> {
        let n = self.n;
        let f = |x: &[f32]| HostBuffer::f32(&[n], x);
        let mut bufs = BTreeMap::from([
            ("param".to_string(), f(&self.theta)),
            ("grad".to_string(), self.grad.clone()),
            ("exp_avg".to_string(), f(&self.m)),
            ("exp_avg_sq".to_string(), f(&self.v)),
        ]);
        let mut want = BTreeMap::from([
            ("param".to_string(), (f(&host_f32(theta)?), EXACT)),
            ("exp_avg".to_string(), (f(&host_f32(m)?), EXACT)),
            ("exp_avg_sq".to_string(), (f(&host_f32(v)?), EXACT)),
        ]);
        if let Some(c) = copy {
            bufs.insert("copy".into(), HostBuffer::zeros(triton::DType::Bf16, &[n]));
            want.insert(
                "copy".into(),
                (HostBuffer::bf16(&[n], &host_f32(c)?), EXACT),
            );
        }
        let shape = Adamw::Step {
            n,
            scalars: self.scalars,
        };
        let build = |e: &triton::KernelEntry| {
            Ok((adamw::plan(e, &shape).map_err(plan_err)?, BTreeMap::new()))
        };
        write_record(
            &label(self.name),
            self.name,
            build,
            bufs.clone(),
            want.clone(),
        )?;
        if let Some(twin) = twin_of(self.name).filter(|_| n.is_multiple_of(16)) {
            write_record(&label(&twin), &twin, build, bufs, want)?;
        }
        Ok(())
    }
}

fn label(name: &str) -> String {
    format!("model_{name}")
}

fn wants_twin(name: &str) -> bool {
    twin_of(name).is_some_and(|t| wants(&label(&t)))
}

/// Under the recorder (CPU): the gradient norm's launches over `grads` (in order, f32 or bf16),
/// as `optim::grad_sumsq` makes them on CUDA: per dtype, the `grad_sumsq_*` launch of
/// the first gradient at a non-zero slot (the first gradient when there is one only), the
/// partials expected from float64 sums of the real gradient; then `grad_sumsq_total` over all
/// the step's partials. `total` is the CPU's ‖g‖² (candle's sums, what the optimizer used): the
/// recorded total must agree with it within f32 rounding, checked here.
///
/// Errors: a gradient of another dtype; the total disagreeing with `total`; writing.
pub(crate) fn record_sumsq(grads: &[&Tensor], total: f64) -> Result<()> {
    if grads.is_empty() || !super::recording() {
        return Ok(());
    }
    let lens: Vec<usize> = grads.iter().map(|g| g.elem_count()).collect();
    let (slots, n_partials) = partial_slots(&lens)?;
    let m = triton::Manifest::committed().map_err(plan_err)?;
    let span = {
        let e = m
            .entry("grad_sumsq_f32", triton::Target::Sm90a)
            .map_err(plan_err)?;
        (e.constexpr_int("BLOCK").map_err(plan_err)?
            * e.constexpr_int("ITERS").map_err(plan_err)?) as usize
    };
    // Every partial, in float64 from the gradients' values, then rounded to f32 as stored.
    let mut partials = vec![0f64; n_partials];
    let mut hosts = Vec::with_capacity(grads.len());
    for (g, &slot) in grads.iter().zip(&slots) {
        let h = host_f32(g)?;
        for (i, x) in h.iter().enumerate() {
            partials[slot + i / span] += (*x as f64) * (*x as f64);
        }
        hosts.push(h);
    }
    let p32: Vec<f32> = partials.iter().map(|x| *x as f32).collect();
    for dtype in [DType::F32, DType::BF16] {
        let Some(name) = sumsq_variant(dtype) else {
            continue;
        };
        let pick = (0..grads.len())
            .filter(|&i| grads[i].dtype() == dtype)
            .find(|&i| slots[i] > 0 || grads.len() == 1);
        let Some(i) = pick else { continue };
        let n = lens[i];
        let grad = match dtype {
            DType::BF16 => HostBuffer::bf16(&[n], &hosts[i]),
            _ => HostBuffer::f32(&[n], &hosts[i]),
        };
        // Only this tensor's slots are written: the others keep the buffer's zeros.
        let mut want = vec![0f32; n_partials];
        let end = slots[i] + n.div_ceil(span);
        want[slots[i]..end].copy_from_slice(&p32[slots[i]..end]);
        let shape = Adamw::SumSq {
            n,
            partials_offset: slots[i],
        };
        let bufs = BTreeMap::from([
            ("grad".to_string(), grad),
            (
                "partials".to_string(),
                HostBuffer::zeros(triton::DType::Fp32, &[n_partials]),
            ),
        ]);
        let tol = Tolerance {
            atol: 1e-6,
            rtol: 2e-6,
        };
        let expect = BTreeMap::from([(
            "partials".to_string(),
            (HostBuffer::f32(&[n_partials], &want), tol),
        )]);
        let build = |e: &triton::KernelEntry| {
            Ok((adamw::plan(e, &shape).map_err(plan_err)?, BTreeMap::new()))
        };
        write_record(&label(name), name, build, bufs.clone(), expect.clone())?;
        if let Some(twin) = twin_of(name).filter(|_| n.is_multiple_of(16)) {
            write_record(&label(&twin), &twin, build, bufs, expect)?;
        }
    }
    // The total: f64 over the f32 partials, in index order.
    let sum: f64 = p32.iter().map(|x| *x as f64).sum();
    if (sum - total).abs() > 1e-5 * total.abs().max(1e-30) {
        return Err(ModelError::Invalid(format!(
            "gradient norm: the partial sums give ‖g‖² = {sum}, the CPU {total}"
        )));
    }
    let shape = Adamw::Total { n_partials };
    write_record(
        &label("grad_sumsq_total"),
        "grad_sumsq_total",
        |e| Ok((adamw::plan(e, &shape).map_err(plan_err)?, BTreeMap::new())),
        BTreeMap::from([
            ("partials".to_string(), HostBuffer::f32(&[n_partials], &p32)),
            (
                "out".to_string(),
                HostBuffer::zeros(triton::DType::Fp64, &[1]),
            ),
        ]),
        BTreeMap::from([(
            "out".to_string(),
            (
                HostBuffer {
                    dtype: triton::DType::Fp64,
                    shape: vec![1],
                    bytes: sum.to_le_bytes().to_vec(),
                },
                Tolerance {
                    atol: 1e-12,
                    rtol: 1e-12,
                },
            ),
        )]),
    )
}
