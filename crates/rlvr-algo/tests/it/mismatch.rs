//! Mismatch diagnostics and IS correction weights against reference values worked out by hand
//! (log ρ = ℓ_trainer − ℓ_sampler = [0.2, −0.5, 0]; verl's rollout_corr_helper semantics).

use rlvr_algo::{
    correction_weights, mismatch_stats, IsCorrection, IsLevel, MismatchRow, MismatchSums,
};

const TRAINER: [f32; 3] = [-1.0, -2.0, -0.5];
const SAMPLER: [f32; 3] = [-1.2, -1.5, -0.5];

fn close(a: &[f32], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((*x as f64 - y).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}

#[test]
fn diagnostics_use_the_staleness_zero_rows_only() {
    let stale_s = [-9.0f32; 2];
    let stale_t = [-1.0f32; 2];
    let rows = [
        MismatchRow {
            sampler: &SAMPLER,
            trainer: &TRAINER,
            staleness: 0,
        },
        MismatchRow {
            sampler: &stale_s,
            trainer: &stale_t,
            staleness: 1,
        },
    ];
    let s = mismatch_stats(&rows).unwrap();
    assert_eq!(s.tokens, 3);
    // mean |Δ| = (0.2 + 0.5 + 0) / 3; k3 = mean(e^r − r − 1) = (0.0214028 + 0.1065307 + 0) / 3.
    assert!((s.mean_abs_diff - 0.233_333_33).abs() < 1e-6, "{s:?}");
    assert!((s.k3_kl - 0.042_644_47).abs() < 1e-6, "{s:?}");
    assert!(mismatch_stats(&rows[1..]).is_none());
    // Identical log-probs: no mismatch at all.
    let same = [MismatchRow {
        sampler: &TRAINER,
        trainer: &TRAINER,
        staleness: 0,
    }];
    assert_eq!(mismatch_stats(&same).unwrap().k3_kl, 0.0);
}

/// The trainer's per-step diagnostics add tokens micro-batch by micro-batch through
/// `MismatchSums`: the same reference values, however the tokens are split.
#[test]
fn mismatch_sums_accumulate_across_micro_batches() {
    let mut sums = MismatchSums::default();
    assert!(sums.stats().is_none());
    sums.add(TRAINER[0], SAMPLER[0]);
    sums.add(TRAINER[1], SAMPLER[1]);
    let mut second = sums;
    second.add(TRAINER[2], SAMPLER[2]);
    let s = second.stats().unwrap();
    assert_eq!(s.tokens, 3);
    assert!((s.mean_abs_diff - 0.233_333_33).abs() < 1e-6, "{s:?}");
    assert!((s.k3_kl - 0.042_644_47).abs() < 1e-6, "{s:?}");
}

#[test]
fn truncated_is_weights() {
    let token = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Truncate {
            level: IsLevel::Token,
            cap: 1.1,
        },
    );
    close(&token, &[1.1, 0.606_530_66, 1.0]);
    let token = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Truncate {
            level: IsLevel::Token,
            cap: 2.0,
        },
    );
    close(&token, &[1.221_402_76, 0.606_530_66, 1.0]);
    // Sequence: exp(0.2 − 0.5 + 0) = 0.7408182 on every token; a cap below it truncates.
    let seq = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Truncate {
            level: IsLevel::Sequence,
            cap: 2.0,
        },
    );
    close(&seq, &[0.740_818_22; 3]);
    let seq = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Truncate {
            level: IsLevel::Sequence,
            cap: 0.5,
        },
    );
    close(&seq, &[0.5; 3]);
}

#[test]
fn masked_is_weights() {
    let token = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Mask {
            level: IsLevel::Token,
            lo: 0.8,
            hi: 1.25,
        },
    );
    close(&token, &[1.0, 0.0, 1.0]);
    let token = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Mask {
            level: IsLevel::Token,
            lo: 0.5,
            hi: 1.2,
        },
    );
    close(&token, &[0.0, 1.0, 1.0]);
    let seq = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Mask {
            level: IsLevel::Sequence,
            lo: 0.5,
            hi: 2.0,
        },
    );
    close(&seq, &[1.0; 3]);
    let seq = correction_weights(
        &TRAINER,
        &SAMPLER,
        IsCorrection::Mask {
            level: IsLevel::Sequence,
            lo: 0.8,
            hi: 1.25,
        },
    );
    close(&seq, &[0.0; 3]);
}

#[test]
fn extreme_ratios_are_clamped_before_exponentiating() {
    let w = correction_weights(
        &[0.0],
        &[-100.0],
        IsCorrection::Truncate {
            level: IsLevel::Token,
            cap: f64::MAX,
        },
    );
    assert!(
        w[0].is_finite() && (w[0] as f64 / 20f64.exp() - 1.0).abs() < 1e-6,
        "{w:?}"
    );
}
