//! AdamW with decoupled weight decay and f32 moments (Loshchilov & Hutter 2019, as
//! `torch.optim.AdamW`), over the model's [`Var`]s. Moments stay in f32 whatever the parameter
//! dtype (candle-nn's AdamW keeps them in the parameter dtype: DESIGN.md section 7).

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

/// AdamW state: the parameters and their first/second moments (f32), and the step count.
pub struct AdamW {
    pub config: AdamWConfig,
    params: Vec<Var>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Number of updates applied.
    pub step: u64,
}

impl AdamW {
    /// Optimises `params` (e.g. `model.named_vars()` values).
    pub fn new(params: Vec<Var>, config: AdamWConfig) -> Result<Self> {
        let mut m = Vec::with_capacity(params.len());
        let mut v = Vec::with_capacity(params.len());
        for p in &params {
            m.push(p.as_tensor().zeros_like()?.to_dtype(DType::F32)?);
            v.push(p.as_tensor().zeros_like()?.to_dtype(DType::F32)?);
        }
        Ok(Self {
            config,
            params,
            m,
            v,
            step: 0,
        })
    }

    /// One update with learning rate `lr` (the schedule's value for this step), from the gradients
    /// in `grads`; parameters without a gradient are left unchanged (their moments too).
    ///
    /// θ ← θ·(1 − lr·λ) − lr · m̂ / (√v̂ + ε), with m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ).
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<()> {
        self.step += 1;
        let c = self.config;
        let t = self.step as i32;
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        for (i, p) in self.params.iter().enumerate() {
            let Some(g) = grads.get(p.as_tensor()) else {
                continue;
            };
            let fused = p.device().is_cpu()
                && [p.dtype(), g.dtype(), self.m[i].dtype(), self.v[i].dtype()]
                    .iter()
                    .all(|&d| d == DType::F32);
            if fused {
                // Three in-place passes, no allocation (CPU, f32).
                let g = g.contiguous()?;
                self.m[i].inplace_op2(
                    &g,
                    &MomentUpdate {
                        beta: c.beta1 as f32,
                        square: false,
                    },
                )?;
                self.v[i].inplace_op2(
                    &g,
                    &MomentUpdate {
                        beta: c.beta2 as f32,
                        square: true,
                    },
                )?;
                p.as_tensor().inplace_op3(
                    &self.m[i],
                    &self.v[i],
                    &ParamUpdate {
                        decay: (1.0 - lr * c.weight_decay) as f32,
                        lr: lr as f32,
                        inv_bc1: (1.0 / bc1) as f32,
                        inv_bc2: (1.0 / bc2) as f32,
                        eps: c.eps as f32,
                    },
                )?;
                continue;
            }
            let g = g.to_dtype(DType::F32)?;
            let m = ((&self.m[i] * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
            let v = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let denom = ((&v / bc2)?.sqrt()? + c.eps)?;
            let upd = ((&m / bc1)? / denom)?;
            let theta = p.as_tensor().to_dtype(DType::F32)?;
            let theta = ((theta * (1.0 - lr * c.weight_decay))? - (upd * lr)?)?;
            p.set(&theta.to_dtype(p.dtype())?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }

    /// The moments `(m, v)` per parameter, in parameter order (for checkpoints). On CPU in f32
    /// they are updated in place by [`AdamW::step`]: copy them to keep a snapshot across steps.
    pub fn moments(&self) -> (&[Tensor], &[Tensor]) {
        (&self.m, &self.v)
    }

    /// Restores moments and step count saved by [`AdamW::moments`].
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
        Ok(())
    }
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
