//! The weights' fingerprint: a fixed sequence whose log-probs under the pushed weights are known
//! ([`RefreshCheck`]), and the comparison of every server's scores of it with those log-probs. A
//! refresh ([`crate::refresh`], [`crate::lora`], [`crate::rollout`]) ends with it, and the client
//! checks it again after every sampling call ([`crate::client`]), so that no step trains on
//! samples of weights other than the pushed ones. A leaf: it names only the crate's error.

use crate::error::{Result, VllmError};

/// A fixed sequence whose log-probs under the new weights are known: after a reload every server
/// must score `completion` after `prompt` (T = 1) within `tolerance` of `expected`.
#[derive(Debug, Clone, PartialEq)]
pub struct RefreshCheck {
    /// Prompt ids (non-empty).
    pub prompt: Vec<u32>,
    /// Completion ids (non-empty).
    pub completion: Vec<u32>,
    /// The trainer's log-probs of `completion` under the new weights at T = 1
    /// ([`crate::trainer_logprobs`]).
    pub expected: Vec<f32>,
    /// Largest accepted max |ℓ_server − ℓ_expected| (nats): ~1e-4 for f32 servers, ~0.05 for bf16.
    pub tolerance: f64,
}

/// The largest max |ℓ_server − ℓ_expected| of `scored` (one vector per server of `urls`).
///
/// # Errors
/// [`VllmError::Check`] naming the first server beyond `check.tolerance`, with a wrong count or
/// a non-finite value.
pub(crate) fn check_scores(
    urls: &[String],
    scored: &[Vec<f32>],
    check: &RefreshCheck,
) -> Result<f64> {
    let mut worst = 0.0f64;
    for (url, lps) in urls.iter().zip(scored) {
        let d = lps
            .iter()
            .zip(&check.expected)
            .map(|(a, b)| (a - b).abs() as f64)
            .fold(0.0, f64::max);
        let non_finite = lps.iter().any(|x| !x.is_finite());
        if lps.len() != check.expected.len() || non_finite || d > check.tolerance {
            return Err(VllmError::Check {
                    server: url.clone(),
                    msg: format!(
                        "after the refresh it scores the check sequence up to {d:.3e} nats away from the \
                         new weights (tolerance {:.1e}): it still serves other weights",
                        check.tolerance
                    ),
                });
        }
        worst = worst.max(d);
    }
    Ok(worst)
}
