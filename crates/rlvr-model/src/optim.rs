//! AdamW with decoupled weight decay and f32 moments (Loshchilov & Hutter 2019, as
//! `torch.optim.AdamW`), over the model's [`Var`]s. Moments stay in f32 whatever the parameter
//! dtype (candle-nn's AdamW keeps them in the parameter dtype: DESIGN.md section 7).

use candle_core::{backprop::GradStore, DType, Tensor, Var};
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

    /// The moments `(m, v)` per parameter, in parameter order (for checkpoints).
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
