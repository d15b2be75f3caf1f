//! Bounds on verifier settings that several verifiers share, so that each of them (and the
//! combination that validates them, [`crate::combine`]) reads them from here: a timeout in seconds
//! (external programs, the judge, the reward model, and rlvr-train's rollout requests), and the
//! requests in flight and retries of a verifier that asks a server ([`crate::judge`],
//! [`crate::reward_model`]). A leaf: it names no other module of the crate but the error type.

use crate::RewardError;
use std::time::Duration;

/// The longest `timeout_s` a verifier accepts, in seconds (10⁶ s, about 11.6 days): a longer
/// one is a typo or a wish for "never", and far beyond it the deadline `now + timeout` overflows.
pub const MAX_TIMEOUT_S: f64 = 1e6;

/// Most requests in flight of a judge or a reward model (a bound on what a config can allocate).
pub(crate) const MOST_IN_FLIGHT: usize = 256;

/// The most `retries` a judge or a reward model accepts per request (100): with the back-off
/// (0.1 s doubled, at most 25.6 s) that is already about 40 minutes of waiting for one request; more is a
/// wish for "forever" that would hang a run on a dead server.
pub const MOST_RETRIES: u32 = 100;

/// `x` as written in an error: plainly when short, in scientific notation when its plain form
/// would run long (1e300 is 301 digits plainly).
pub(crate) fn show(x: f64) -> String {
    let plain = x.to_string();
    if plain.len() <= 16 {
        plain
    } else {
        format!("{x:e}")
    }
}

/// `secs` as a [`Duration`] when it is a finite number of seconds in (0, [`MAX_TIMEOUT_S`]].
///
/// # Errors
/// [`RewardError::Config`] naming `key`, the value and the range.
pub fn timeout_duration(key: &str, secs: f64) -> Result<Duration, RewardError> {
    let out_of_range = || {
        RewardError::Config(format!(
            "{key} = {} is out of range: expected a number of seconds in (0, {MAX_TIMEOUT_S:e}]",
            show(secs)
        ))
    };
    if !(secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_S) {
        return Err(out_of_range());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| out_of_range())
}
