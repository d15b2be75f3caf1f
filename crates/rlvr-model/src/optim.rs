//! AdamW with decoupled weight decay and f32 moments (Loshchilov & Hutter 2019, as
//! `torch.optim.AdamW`), over the model's [`Var`]s. Moments stay in f32 whatever the parameter
//! dtype (candle-nn's AdamW keeps them in the parameter dtype: DESIGN.md section 7).
//!
//! Mixed precision as torch AMP / DeepSpeed / Megatron do it: a 16-bit parameter (bf16) gets an
//! f32 **master weight**; each step updates the master in f32 and writes the master rounded to
//! the parameter dtype (round to nearest even) back into the [`Var`]. Updates smaller than half a
//! bf16 ulp (an lr-1e-6 step on a weight of magnitude ≥ 2⁻¹² ≈ 2.4e-4) thus accumulate in the
//! master instead of vanishing. f32 and f64 parameters are updated directly (no master).

use candle_core::{backprop::GradStore, DType, Tensor, Var};
use rlvr_kernels::adamw::{AddAssign, MomentUpdate, ParamUpdate};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// AdamW hyper-parameters (torch defaults except the learning rate).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            lr: 1e-6,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// Whether a parameter of dtype `dt` is trained through an f32 master weight (the 16-bit float
/// dtypes).
pub fn needs_master(dt: DType) -> bool {
    matches!(dt, DType::BF16 | DType::F16)
}

/// AdamW state: the parameters, their f32 master weights (16-bit parameters only), their
/// first/second moments (f32), and the step count.
pub struct AdamW {
    pub config: AdamWConfig,
    params: Vec<Var>,
    /// Per parameter: its f32 master weight when [`needs_master`] of its dtype, else `None`.
    masters: Vec<Option<Tensor>>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Number of updates applied.
    pub step: u64,
    /// Sharded (ZeRO-1): the parameters whose state this optimizer keeps and updates; the others'
    /// moments are empty placeholders and they have no master. `None`: every parameter.
    owned: Option<Vec<bool>>,
    /// `kernels.adamw` resolved on ([`AdamW::set_fused`]).
    fused: bool,
}

/// The scalars of one AdamW update (learning rate, weight-decay factor, bias corrections).
#[derive(Debug, Clone, Copy)]
pub struct UpdateScalars {
    /// β₁, β₂ and ε of [`AdamWConfig`].
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// The learning rate of this step.
    pub lr: f64,
    /// `1 − lr·λ` (decoupled weight decay).
    pub decay: f64,
    /// `1 − β₁ᵗ` and `1 − β₂ᵗ` at this step t.
    pub bc1: f64,
    pub bc2: f64,
}

/// The f32 inner loop of AdamW on one parameter: updates the moments `m`, `v` (f32) with the
/// gradient `g` (f32) and returns the new parameter, or `None` when `theta` (f32) was updated in
/// place (CPU: three in-place passes, no allocation). `theta`, `m`, `v` and `g` share one shape.
///
/// θ ← θ·(1 − lr·λ) − lr · m̂ / (√v̂ + ε), with m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ)
/// (`torch.optim.AdamW`). A `theta` of another dtype is computed in f32 and returned in f32.
///
/// # Errors
/// Shape mismatches, tensor errors.
pub fn adamw_update_f32(
    theta: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    g: &Tensor,
    s: &UpdateScalars,
) -> Result<Option<Tensor>> {
    let fused = theta.device().is_cpu()
        && [theta.dtype(), g.dtype(), m.dtype(), v.dtype()]
            .iter()
            .all(|&d| d == DType::F32);
    if fused {
        let g = g.contiguous()?;
        m.inplace_op2(
            &g,
            &MomentUpdate {
                beta: s.beta1 as f32,
                square: false,
            },
        )?;
        v.inplace_op2(
            &g,
            &MomentUpdate {
                beta: s.beta2 as f32,
                square: true,
            },
        )?;
        theta.inplace_op3(
            m,
            v,
            &ParamUpdate {
                decay: s.decay as f32,
                lr: s.lr as f32,
                inv_bc1: (1.0 / s.bc1) as f32,
                inv_bc2: (1.0 / s.bc2) as f32,
                eps: s.eps as f32,
            },
        )?;
        return Ok(None);
    }
    let g = g.to_dtype(DType::F32)?;
    let nm = ((&*m * s.beta1)? + (&g * (1.0 - s.beta1))?)?;
    let nv = ((&*v * s.beta2)? + (g.sqr()? * (1.0 - s.beta2))?)?;
    let denom = ((&nv / s.bc2)?.sqrt()? + s.eps)?;
    let upd = ((&nm / s.bc1)? / denom)?;
    let th = theta.to_dtype(DType::F32)?;
    let th = ((th * s.decay)? - (upd * s.lr)?)?;
    *m = nm;
    *v = nv;
    Ok(Some(th))
}

impl AdamW {
    /// Optimises `params` (e.g. `model.named_vars()` values). 16-bit parameters get an f32
    /// master weight copied from their current value.
    ///
    /// # Errors
    /// Tensor errors (allocation, dtype conversion).
    pub fn new(params: Vec<Var>, config: AdamWConfig) -> Result<Self> {
        let mut m = Vec::with_capacity(params.len());
        let mut v = Vec::with_capacity(params.len());
        let mut masters = Vec::with_capacity(params.len());
        for p in &params {
            let z = Tensor::zeros(p.dims(), DType::F32, p.device())?;
            m.push(z.clone());
            v.push(z.copy()?);
            masters.push(if needs_master(p.dtype()) {
                Some(p.as_tensor().detach().to_dtype(DType::F32)?.copy()?)
            } else {
                None
            });
        }
        Ok(Self {
            config,
            params,
            masters,
            m,
            v,
            step: 0,
            owned: None,
            fused: false,
        })
    }

    /// Takes the fused kernels (`kernels.adamw`, [`crate::Model::fused_adamw`] gives the
    /// resolved switch): on CUDA each parameter tensor is updated by one launch (its f32 master
    /// or itself, both moments, and the bf16 copy: `rlvr_kernels`' `adamw_*`, equal to the CPU
    /// passes bit for bit by design) and [`grad_sumsq`] uses the partial-sum kernels; a
    /// parameter the kernels do not cover (f16/f64) keeps the candle update. On the CPU the
    /// passes are unchanged; under the launch recorder ([`crate::kernels::record_launches`]) the
    /// launches are recorded with the CPU's results as the expected outputs.
    pub fn set_fused(&mut self, on: bool) {
        self.fused = on;
    }

    /// Whether [`AdamW::set_fused`] is on.
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// Shards this optimizer (ZeRO stage 1, arXiv 1910.02054): it keeps moments and masters for
    /// the parameters `owned` marks, and frees the others' (their [`AdamW::moments`] entries
    /// become empty placeholders, their masters `None`). [`AdamW::step`] must then be given
    /// gradients for owned parameters only; the caller brings the others' new values.
    ///
    /// # Errors
    /// A mask whose length differs from the number of parameters.
    pub fn shard(&mut self, owned: &[bool]) -> Result<()> {
        if owned.len() != self.params.len() {
            return Err(crate::ModelError::Invalid(format!(
                "an ownership mask of {} entries for {} parameters",
                owned.len(),
                self.params.len()
            )));
        }
        self.owned = Some(owned.to_vec());
        self.drop_unowned()
    }

    /// The ownership mask of a sharded optimizer ([`AdamW::shard`]); `None` when unsharded.
    pub fn owned(&self) -> Option<&[bool]> {
        self.owned.as_deref()
    }

    fn drop_unowned(&mut self) -> Result<()> {
        let Some(owned) = &self.owned else {
            return Ok(());
        };
        for (i, &own) in owned.iter().enumerate() {
            if !own {
                let empty = Tensor::zeros(0, DType::F32, self.params[i].device())?;
                self.m[i] = empty.clone();
                self.v[i] = empty;
                self.masters[i] = None;
            }
        }
        Ok(())
    }

    /// One update with learning rate `lr` (the schedule's value for this step), from the gradients
    /// in `grads`; parameters without a gradient are left unchanged (their moments and masters
    /// too). A parameter with a master weight: the master is updated by [`adamw_update_f32`]
    /// and the parameter set to the master rounded to its dtype.
    ///
    /// # Errors
    /// Tensor errors.
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<()> {
        self.step_scaled(grads, lr, 1.0)
    }

    /// [`AdamW::step`] with every gradient multiplied by `grad_scale` first (global-norm
    /// clipping's factor; 1: none): `g · grad_scale` as candle's scalar multiply of the f32
    /// gradient (the CPU), or the kernels' `grad_scale` argument (CUDA, fused), without a scaled
    /// copy.
    ///
    /// # Errors
    /// Tensor errors, a failed launch.
    pub fn step_scaled(&mut self, grads: &GradStore, lr: f64, grad_scale: f64) -> Result<()> {
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let s = UpdateScalars {
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            lr,
            decay: 1.0 - lr * c.weight_decay,
            bc1: 1.0 - c.beta1.powi(t),
            bc2: 1.0 - c.beta2.powi(t),
        };
        let k = rlvr_kernels::triton::families::adamw::AdamwScalars::new(
            lr,
            c.beta1,
            c.beta2,
            c.eps,
            c.weight_decay,
            t,
            grad_scale as f32,
        );
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = grads.get(p.as_tensor()) else {
                continue;
            };
            #[cfg(feature = "cuda")]
            if self.fused && p.device().is_cuda() {
                let (theta, copy) = match &self.masters[i] {
                    Some(w) => (w, Some(p.as_tensor())),
                    None => (p.as_tensor(), None),
                };
                let g32;
                let g = if g.dtype() == DType::BF16 && copy.is_none() {
                    g32 = g.to_dtype(DType::F32)?;
                    &g32
                } else {
                    g
                };
                if crate::kernels::cuda_adamw::step(theta, g, &self.m[i], &self.v[i], copy, k)? {
                    continue;
                }
                crate::kernels::log_once(format!(
                    "kernels.adamw = on: a {:?} parameter with a {:?} gradient is not covered; \
                     the candle update runs",
                    p.dtype(),
                    g.dtype()
                ));
            }
            // Under the launch recorder (CPU, switch on): the launch's inputs before the update.
            let tap = if self.fused && crate::kernels::recording() {
                let theta = self.masters[i].as_ref().unwrap_or(p.as_tensor());
                let master = self.masters[i].is_some();
                crate::kernels::adamw::StepTap::before(master, theta, g, &self.m[i], &self.v[i], k)?
            } else {
                None
            };
            let g = g.to_dtype(DType::F32)?;
            let g = if grad_scale != 1.0 {
                (g * grad_scale)?
            } else {
                g
            };
            match &mut self.masters[i] {
                Some(w) => {
                    if let Some(new) = adamw_update_f32(w, &mut self.m[i], &mut self.v[i], &g, &s)?
                    {
                        *w = new;
                    }
                    p.set(&w.to_dtype(p.dtype())?)?;
                }
                None => {
                    let theta = p.as_tensor();
                    if let Some(new) =
                        adamw_update_f32(theta, &mut self.m[i], &mut self.v[i], &g, &s)?
                    {
                        p.set(&new.to_dtype(p.dtype())?)?;
                    }
                }
            }
            if let Some(tap) = tap {
                let (theta, copy) = match &self.masters[i] {
                    Some(w) => (w, Some(p.as_tensor())),
                    None => (p.as_tensor(), None),
                };
                tap.after(theta, &self.m[i], &self.v[i], copy)?;
            }
        }
        Ok(())
    }

    /// The moments `(m, v)` per parameter, in parameter order (for checkpoints). On CPU in f32
    /// they are updated in place by [`AdamW::step`]: copy them to keep a snapshot across steps.
    /// Sharded ([`AdamW::shard`]), the entries of parameters this optimizer does not own are
    /// empty.
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }

    /// Restores moments and step count saved by [`AdamW::moments`].
    ///
    /// # Errors
    /// A count differing from the number of parameters.
    pub fn set_moments(&mut self, m: Vec<Tensor>, v: Vec<Tensor>, step: u64) -> Result<()> {
        if m.len() != self.params.len() || v.len() != self.params.len() {
            return Err(crate::ModelError::Invalid(format!(
                "optimizer state has {} moments for {} parameters",
                m.len(),
                self.params.len()
            )));
        }
        self.m = m;
        self.v = v;
        self.step = step;
        self.drop_unowned()
    }

    /// The f32 master weight per parameter (`None` for f32/f64 parameters), in parameter order
    /// (for checkpoints; updated in place on the CPU like the moments).
    pub fn masters(&self) -> &[Option<Tensor>] {
        &self.masters
    }

    /// Restores master weights saved by [`AdamW::masters`] (converted to f32) and sets each
    /// parameter to its master rounded to the parameter dtype. An entry `None` for a parameter
    /// that needs a master keeps the one made from the parameter's current value (a checkpoint
    /// written without masters).
    ///
    /// # Errors
    /// A count or shape differing from the parameters', tensor errors.
    pub fn set_masters(&mut self, masters: Vec<Option<Tensor>>) -> Result<()> {
        if masters.len() != self.params.len() {
            return Err(crate::ModelError::Invalid(format!(
                "optimizer state has {} master weights for {} parameters",
                masters.len(),
                self.params.len()
            )));
        }
        for (i, w) in masters.into_iter().enumerate() {
            let p = &self.params[i];
            let Some(w) = w else { continue };
            if !needs_master(p.dtype()) {
                continue;
            }
            if w.shape() != p.shape() {
                return Err(crate::ModelError::Invalid(format!(
                    "master weight {i} has shape {:?}, its parameter {:?}",
                    w.dims(),
                    p.dims()
                )));
            }
            let w = w.to_dtype(DType::F32)?.to_device(p.device())?.copy()?;
            p.set(&w.to_dtype(p.dtype())?)?;
            self.masters[i] = Some(w);
        }
        self.drop_unowned()
    }
}

/// ‖g‖² = Σ_k Σ_i g_ki² over `grads` (in order), the gradient norm's square: with `fused`
/// (`kernels.adamw`) on CUDA, the partial-sum kernels (one launch per tensor into consecutive
/// slots, then the f64 total in a fixed order: the same bits on every run); otherwise per
/// tensor candle's sum of squares in f32, added in f64 in order (under the launch recorder, with
/// `fused`, the kernels' launches are recorded from these gradients).
///
/// # Errors
/// Tensor errors, a failed launch.
pub fn grad_sumsq(grads: &[&Tensor], fused: bool) -> Result<f64> {
    #[cfg(feature = "cuda")]
    if fused && grads.first().is_some_and(|g| g.device().is_cuda()) {
        if let Some(sq) = crate::kernels::cuda_adamw::sumsq(grads)? {
            return Ok(sq);
        }
    }
    let mut sq = 0.0f64;
    for s in grads {
        // In f32 (a no-op for the f32 sums the trainer gives): a bf16 sum of squares stalls.
        sq += s
            .to_dtype(DType::F32)?
            .sqr()?
            .sum_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
    }
    if fused {
        crate::kernels::adamw::record_sumsq(grads, sq)?;
    }
    Ok(sq)
}

/// A gradient sum over micro-batches, `Σ_m g_m`, kept per parameter.
///
/// The first gradient is held as given (no copy); the second makes a fresh sum tensor that this
/// accumulator owns, and later ones are added into it in place (CPU, f32, contiguous; elsewhere a
/// new tensor per add). An RL step of four micro-batches thus allocates one sum per parameter
/// instead of three (155 MB each for a Qwen2.5-vocabulary embedding).
#[derive(Default)]
pub struct GradAccumulator {
    sum: Option<Tensor>,
    owned: bool,
}

impl GradAccumulator {
    /// Adds `g` (any float dtype; summed in f32).
    ///
    /// # Errors
    /// Shape mismatch with the sum so far, tensor errors.
    pub fn add(&mut self, g: &Tensor) -> Result<()> {
        let g = g.to_dtype(DType::F32)?;
        self.sum = Some(match self.sum.take() {
            None => {
                self.owned = false;
                g
            }
            Some(sum) if self.owned && sum.device().is_cpu() && sum.is_contiguous() => {
                sum.inplace_op2(&g.contiguous()?, &AddAssign)?;
                sum
            }
            Some(sum) => {
                self.owned = true;
                (sum + g)?
            }
        });
        Ok(())
    }

    /// The sum, if any gradient was added.
    pub fn take(self) -> Option<Tensor> {
        self.sum
    }

    /// The sum so far, if any.
    pub fn get(&self) -> Option<&Tensor> {
        self.sum.as_ref()
    }
}

#[cfg(test)]
mod grad_accumulator_tests {
    use super::GradAccumulator;
    use candle_core::{Device, Tensor};

    /// Four adds give the plain sum; the first and second gradients given are never written
    /// (the in-place adds go to the accumulator's own sum).
    #[test]
    fn sums_without_touching_the_given_gradients() {
        let d = Device::Cpu;
        let gs: Vec<Tensor> = (0..4)
            .map(|i| Tensor::new(&[[1f32 + i as f32, -2.0], [0.5, 3.0 * i as f32]], &d).unwrap())
            .collect();
        let before: Vec<Vec<Vec<f32>>> = gs.iter().map(|g| g.to_vec2().unwrap()).collect();
        let mut acc = GradAccumulator::default();
        for g in &gs {
            acc.add(g).unwrap();
        }
        let got: Vec<Vec<f32>> = acc.take().unwrap().to_vec2().unwrap();
        assert_eq!(got, vec![vec![10.0, -8.0], vec![2.0, 18.0]]);
        for (g, b) in gs.iter().zip(before) {
            assert_eq!(g.to_vec2::<f32>().unwrap(), b);
        }
    }
}
