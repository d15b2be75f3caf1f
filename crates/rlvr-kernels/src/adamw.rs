//! The in-place inner loops of AdamW (Loshchilov & Hutter 2019, as `torch.optim.AdamW`) and of
//! gradient accumulation, as candle in-place ops on contiguous f32 CPU tensors: one parallel pass
//! each, no allocation. The optimizer itself (`rlvr_model::optim::AdamW`) chooses them.
//!
//! Each element is updated on its own, so the result does not depend on the thread count.

use candle_core::{CpuStorage, Layout};
use rayon::prelude::*;

use crate::storage::{contiguous_f32, contiguous_f32_mut};

/// Elements per parallel task in the update passes.
const UPDATE_CHUNK: usize = 1 << 15;

/// `f(x[i], g[i])` for every i, in parallel chunks of [`UPDATE_CHUNK`] (each element on its own,
/// so the result does not depend on the thread count). `x` and `g` have the same length.
fn update_each(x: &mut [f32], g: &[f32], f: impl Fn(&mut f32, f32) + Sync) {
    x.par_chunks_mut(UPDATE_CHUNK)
        .zip(g.par_chunks(UPDATE_CHUNK))
        .for_each(|(x, g)| x.iter_mut().zip(g).for_each(|(x, &g)| f(x, g)));
}

/// In place: `dst += src` (f32, contiguous, same length), e.g. a gradient sum over micro-batches.
pub struct AddAssign;

impl candle_core::InplaceOp2 for AddAssign {
    fn name(&self) -> &'static str {
        "add-assign"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        let x = contiguous_f32_mut(dst, dl, "add-assign", "sum")?;
        let g = contiguous_f32(src, sl, "add-assign", "gradient")?;
        if x.len() != g.len() {
            candle_core::bail!("gradient sum of {} elements += {}", x.len(), g.len());
        }
        update_each(x, g, |x, g| *x += g);
        Ok(())
    }
}

/// In place on a moment: `x ← β·x + (1 − β)·g` (or `g²` when `square`: the second moment).
pub struct MomentUpdate {
    /// β₁ for the first moment, β₂ for the second.
    pub beta: f32,
    /// Average `g²` instead of `g`.
    pub square: bool,
}

impl candle_core::InplaceOp2 for MomentUpdate {
    fn name(&self) -> &'static str {
        "adamw-moment"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        let x = contiguous_f32_mut(dst, dl, "AdamW", "moment")?;
        let g = contiguous_f32(src, sl, "AdamW", "gradient")?;
        if x.len() != g.len() {
            candle_core::bail!("AdamW: moment of {} for a gradient of {}", x.len(), g.len());
        }
        let (b, a) = (self.beta, 1.0 - self.beta);
        if self.square {
            update_each(x, g, |x, g| *x = b * *x + a * (g * g));
        } else {
            update_each(x, g, |x, g| *x = b * *x + a * g);
        }
        Ok(())
    }
}

/// In place on a parameter: `θ ← θ·decay − lr · (m·inv_bc1) / (√(v·inv_bc2) + ε)`, with
/// `decay = 1 − lr·λ` and `inv_bcᵢ = 1 / (1 − βᵢᵗ)` (the bias corrections).
#[derive(Clone, Copy)]
pub struct ParamUpdate {
    /// 1 − lr·λ (decoupled weight decay).
    pub decay: f32,
    /// The learning rate.
    pub lr: f32,
    /// 1 / (1 − β₁ᵗ).
    pub inv_bc1: f32,
    /// 1 / (1 − β₂ᵗ).
    pub inv_bc2: f32,
    /// ε.
    pub eps: f32,
}

impl candle_core::InplaceOp3 for ParamUpdate {
    fn name(&self) -> &'static str {
        "adamw-param"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<()> {
        let p = contiguous_f32_mut(dst, dl, "AdamW", "parameter")?;
        let m = contiguous_f32(s1, l1, "AdamW", "first moment")?;
        let v = contiguous_f32(s2, l2, "AdamW", "second moment")?;
        if p.len() != m.len() || p.len() != v.len() {
            candle_core::bail!("AdamW: parameter and moments differ in size");
        }
        let ParamUpdate {
            decay,
            lr,
            inv_bc1,
            inv_bc2,
            eps,
        } = *self;
        p.par_chunks_mut(UPDATE_CHUNK)
            .zip(m.par_chunks(UPDATE_CHUNK).zip(v.par_chunks(UPDATE_CHUNK)))
            .for_each(|(p, (m, v))| {
                for ((p, &m), &v) in p.iter_mut().zip(m).zip(v) {
                    *p = *p * decay - lr * (m * inv_bc1) / ((v * inv_bc2).sqrt() + eps);
                }
            });
        Ok(())
    }
}
