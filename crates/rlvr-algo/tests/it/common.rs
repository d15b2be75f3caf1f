//! Helpers shared by the algorithm tests.

use rlvr_algo::{Algorithm, AlgorithmConfig};

/// The resolved algorithm of preset `none` with the knobs `f` sets.
pub fn alg(f: impl FnOnce(&mut AlgorithmConfig)) -> Algorithm {
    let mut c = AlgorithmConfig::empty("none");
    f(&mut c);
    c.resolve().unwrap()
}

/// A resolved algorithm's knobs as one flat record (the old field-per-knob view), read through
/// the public surface: [`Algorithm::to_config`] over [`AlgorithmConfig::defaults`] (a knob the
/// chosen parts do not read, or another loss's option, reads as its default).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct Flat {
    pub preset: String,
    pub baseline: rlvr_algo::Baseline,
    pub std_norm: rlvr_algo::StdNorm,
    pub std_level: rlvr_algo::StdLevel,
    pub std_eps: f64,
    pub baseline_shift: f64,
    pub lme_temperature: f64,
    pub exclude_zero_std: bool,
    pub red_drop: bool,
    pub red_drop_in_normaliser: bool,
    pub red_drop_rule: rlvr_algo::RedDropRule,
    pub loss: rlvr_algo::PolicyLoss,
    pub clip_low: f64,
    pub clip_high: f64,
    pub clip_low_prime: f64,
    pub clip_high_prime: f64,
    pub dual_clip: Option<f64>,
    pub keep_mask: rlvr_algo::KeepMask,
    pub rec_weight: rlvr_algo::RecWeight,
    pub adv_temperature: f64,
    pub regulariser: rlvr_algo::Regulariser,
    pub tau: f64,
    pub is_cap: Option<f64>,
    pub log_ratio_clamp: f64,
    pub kl_coef: f64,
    pub kl_estimator: rlvr_algo::KlEstimator,
    pub kl_ratio_weighted: bool,
    pub entropy_coef: f64,
    pub aggregation: rlvr_algo::Aggregation,
    pub overlong: rlvr_algo::Overlong,
    pub overlong_buffer_frac: f64,
    pub overlong_penalty_factor: f64,
    pub dynamic_sampling: bool,
    pub opsm_delta: Option<f64>,
    pub mismatch_correction: rlvr_algo::MismatchCorrection,
    pub mismatch_cap: f64,
    pub mismatch_low: Option<f64>,
    pub mismatch_k3_threshold: f64,
}

/// `a` as a [`Flat`] record.
pub fn flat(a: &Algorithm) -> Flat {
    let mut v = serde_json::to_value(AlgorithmConfig::defaults()).unwrap();
    let set = serde_json::to_value(a.to_config()).unwrap();
    for (k, x) in set.as_object().unwrap() {
        v[k] = x.clone();
    }
    for k in ["dual_clip", "is_cap", "opsm_delta", "mismatch_low"] {
        if set.get(k).is_none() {
            v[k] = serde_json::Value::Null;
        }
    }
    serde_json::from_value(v).unwrap()
}
