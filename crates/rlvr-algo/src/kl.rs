//! KL-to-reference estimators (DESIGN.md section 4 "KL and regularisers").
//!
//! Convention, per token, with log-ratio x = ℓ_ref − ℓ evaluated on the sampled token
//! (Schulman, "Approximating KL divergence", <http://joschu.net/blog/kl-approx.html>):
//!
//! ```text
//! k1 = −x              unbiased for KL(π_θ‖π_ref) on-policy; zero expected gradient as a loss term
//! k2 = x²/2            its gradient is the gradient of KL(π_θ‖π_ref)
//! k3 = exp(x) − x − 1  GRPO / DeepSeekMath (arXiv 2402.03300 Eq. 4), TRL: on-policy, its expected
//!                      gradient is that of KL(π_ref‖π_θ)
//! ```
//!
//! Samples drawn by a stale behaviour policy are not samples of π_θ: with `kl_ratio_weighted` the term is
//! multiplied by the detached ratio ρ̄ = π_θ/π_old (DeepSeek-V3.2's corrected k3 estimator).

use candle_core::Tensor;

use crate::config::KlEstimator;
use crate::error::Result;

/// The per-token KL estimate, same shape as `x` (x = ℓ_ref − ℓ, already clamped by the caller).
/// Gradients flow through `x`.
///
/// # Errors
/// Candle errors only.
pub fn kl_estimate(x: &Tensor, estimator: KlEstimator) -> Result<Tensor> {
    Ok(match estimator {
        KlEstimator::K1 => x.neg()?,
        KlEstimator::K2 => (x.sqr()? * 0.5)?,
        KlEstimator::K3 => ((x.exp()? - x)? - 1.0)?,
    })
}

/// [`kl_estimate`] on host floats, for tests and reporting.
pub fn kl_estimate_f64(x: f64, estimator: KlEstimator) -> f64 {
    match estimator {
        KlEstimator::K1 => -x,
        KlEstimator::K2 => 0.5 * x * x,
        KlEstimator::K3 => x.exp() - x - 1.0,
    }
}
