//! Advantage rules of DESIGN.md section 5: layout invariance, zero-variance exactness, K = 1, nulls, RED-Drop,
//! baselines, overlong shaping.

use crate::common::alg;
use proptest::prelude::*;
use rlvr_algo::{
    advantage_exp_weight, compute_advantages, overlong_penalty, shape_rewards, AlgorithmConfig,
    Baseline, StdLevel, StdNorm,
};

fn check_zero(values: &[f64]) {
    for v in values {
        assert_eq!(
            v.to_bits(),
            0.0f64.to_bits(),
            "expected exactly +0.0, got {v:e}"
        );
    }
}

#[test]
fn zero_variance_groups_are_exactly_zero_in_f32_rewards() {
    // Eight f32 0.1 rewards: naive (r − mean)/(std + 1e-6) can blow float residue up ~1e6×.
    let r = 0.1f32 as f64;
    let rewards = vec![Some(r); 8];
    let groups = vec!["g"; 8];
    for std_norm in [StdNorm::Sample, StdNorm::Population, StdNorm::None] {
        for level in [StdLevel::Group, StdLevel::Batch] {
            for baseline in [Baseline::Mean, Baseline::LeaveOneOut, Baseline::LogMeanExp] {
                let a = alg(|c| {
                    c.std_norm = Some(std_norm);
                    c.std_level = Some(level);
                    c.baseline = Some(baseline);
                });
                let adv = compute_advantages(&rewards, &groups, &a, 0).unwrap();
                check_zero(&adv.values);
                assert_eq!(adv.stats.zero_std_frac(), Some(1.0));
                assert!(adv.in_normaliser.iter().all(|k| !k), "excluded by default");
            }
        }
    }
    // Mixed batch: the zero-variance group stays exactly 0 next to a live group with batch std.
    let mut rewards = vec![Some(r); 8];
    rewards.extend([Some(1.0), Some(0.0)]);
    let mut groups = vec!["z"; 8];
    groups.extend(["p", "p"]);
    let a = alg(|c| c.std_level = Some(StdLevel::Batch));
    let adv = compute_advantages(&rewards, &groups, &a, 0).unwrap();
    check_zero(&adv.values[..8]);
    assert!(adv.values[8] > 0.0 && adv.values[9] < 0.0);
    assert_eq!(adv.stats.zero_std_frac(), Some(0.5));
}

#[test]
fn zero_variance_groups_can_stay_in_the_normaliser() {
    let a = alg(|c| c.exclude_zero_std = Some(false));
    let adv = compute_advantages(&[Some(1.0), Some(1.0)], &["g", "g"], &a, 0).unwrap();
    check_zero(&adv.values);
    assert_eq!(adv.in_normaliser, vec![true, true]);
}

#[test]
fn k1_groups_get_zero_advantage() {
    // Documented rule: a group with one scored reward has no baseline: A = 0 (TRL's choice, not verl's A = r).
    let a = alg(|_| {});
    let adv = compute_advantages(
        &[Some(0.7), Some(1.0), Some(0.0)],
        &["solo", "g", "g"],
        &a,
        0,
    )
    .unwrap();
    check_zero(&adv.values[..1]);
    assert_eq!(adv.stats.groups, 2);
    assert_eq!(adv.stats.zero_std_groups, 1);
    assert_eq!(adv.in_normaliser, vec![false, true, true]);
    // A group of two where one reward is null is a K = 1 group too.
    let adv = compute_advantages(&[Some(0.7), None], &["g", "g"], &a, 0).unwrap();
    check_zero(&adv.values);
    assert_eq!(adv.in_normaliser, vec![false, false]);
}

#[test]
fn null_rewards_are_excluded_from_statistics_and_normaliser() {
    let a = alg(|_| {});
    let with_null = compute_advantages(
        &[Some(1.0), None, Some(0.0), Some(0.0)],
        &[1, 1, 1, 1],
        &a,
        0,
    )
    .unwrap();
    let without =
        compute_advantages(&[Some(1.0), Some(0.0), Some(0.0)], &[1, 1, 1], &a, 0).unwrap();
    assert_eq!(with_null.values[0], without.values[0]);
    assert_eq!(with_null.values[2], without.values[1]);
    check_zero(&with_null.values[1..2]);
    assert_eq!(with_null.in_normaliser, vec![true, false, true, true]);
    assert_eq!(with_null.stats.null_rewards, 1);
}

#[test]
fn non_finite_rewards_are_rejected() {
    let a = alg(|_| {});
    let err = compute_advantages(&[Some(f64::NAN), Some(0.0)], &[1, 1], &a, 0).unwrap_err();
    assert!(err.to_string().contains("null"), "{err}");
    assert!(compute_advantages(&[Some(1.0)], &[1, 2], &a, 0).is_err());
}

#[test]
fn interleaved_layout_equals_contiguous() {
    // DESIGN.md section 5: groups laid out [p1, p2, p1, p2] must not be reduced as if contiguous.
    let a = alg(|_| {});
    let contiguous = compute_advantages(
        &[
            Some(1.0),
            Some(0.0),
            Some(0.0),
            Some(0.0),
            Some(1.0),
            Some(1.0),
        ],
        &["p1", "p1", "p1", "p2", "p2", "p2"],
        &a,
        0,
    )
    .unwrap();
    let interleaved = compute_advantages(
        &[
            Some(1.0),
            Some(0.0),
            Some(0.0),
            Some(1.0),
            Some(0.0),
            Some(1.0),
        ],
        &["p1", "p2", "p1", "p2", "p1", "p2"],
        &a,
        0,
    )
    .unwrap();
    let c = &contiguous.values;
    let i = &interleaved.values;
    assert_eq!([i[0], i[2], i[4]], [c[0], c[1], c[2]]);
    assert_eq!([i[1], i[3], i[5]], [c[3], c[4], c[5]]);
    assert!(
        (c[0] - 1.1547).abs() < 1e-4,
        "1 of 3: (1 − 1/3)/0.57735 = 1.1547, got {}",
        c[0]
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    /// Any permutation of the rows permutes the advantages the same way, for every baseline/std mode.
    #[test]
    fn advantages_are_layout_invariant(
        rewards in prop::collection::vec(prop::option::weighted(0.9, 0u8..4), 4..40),
        groups in prop::collection::vec(0u8..5, 40),
        perm_seed in any::<u64>(),
        mode in 0usize..6,
    ) {
        let n = rewards.len();
        let rewards: Vec<Option<f64>> = rewards.iter().map(|r| r.map(|r| r as f64 * 0.25)).collect();
        let groups: Vec<String> = groups[..n].iter().map(|g| format!("g{g}")).collect();
        let a = alg(|c| match mode {
            0 => {}
            1 => c.std_norm = Some(StdNorm::Population),
            2 => c.std_level = Some(StdLevel::Batch),
            3 => c.baseline = Some(Baseline::LeaveOneOut),
            4 => { c.baseline = Some(Baseline::LogMeanExp); c.std_norm = Some(StdNorm::None); }
            _ => { c.std_norm = Some(StdNorm::None); c.baseline_shift = Some(-0.1); }
        });
        // A seeded permutation.
        let mut perm: Vec<usize> = (0..n).collect();
        let mut s = perm_seed;
        for k in (1..n).rev() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            perm.swap(k, (s >> 33) as usize % (k + 1));
        }
        let base = compute_advantages(&rewards, &groups, &a, 0).unwrap();
        let pr: Vec<_> = perm.iter().map(|&i| rewards[i]).collect();
        let pg: Vec<_> = perm.iter().map(|&i| groups[i].clone()).collect();
        let permuted = compute_advantages(&pr, &pg, &a, 0).unwrap();
        for (k, &i) in perm.iter().enumerate() {
            prop_assert!((permuted.values[k] - base.values[i]).abs() <= 1e-12 * (1.0 + base.values[i].abs()));
            prop_assert_eq!(permuted.in_normaliser[k], base.in_normaliser[i]);
        }
        prop_assert_eq!(permuted.stats, base.stats);
    }
}

#[test]
fn rloo_matches_hand_values() {
    // r = [1, 0, 0, 0]: b_1 = 0, b_others = 1/3; A = K/(K−1)(r − mean) = [1, −1/3, −1/3, −1/3].
    let a = alg(|c| {
        c.baseline = Some(Baseline::LeaveOneOut);
        c.std_norm = Some(StdNorm::None);
    });
    let adv = compute_advantages(
        &[Some(1.0), Some(0.0), Some(0.0), Some(0.0)],
        &[0; 4],
        &a,
        0,
    )
    .unwrap();
    let want = [1.0, -1.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0];
    for (g, w) in adv.values.iter().zip(want) {
        assert!((g - w).abs() < 1e-15);
    }
}

#[test]
fn log_mean_exp_baseline_hand_value() {
    // r = [1, 0], T = 1: b = ln((e + 1)/2) = 0.620115.
    let a = alg(|c| {
        c.baseline = Some(Baseline::LogMeanExp);
        c.std_norm = Some(StdNorm::None);
    });
    let adv = compute_advantages(&[Some(1.0), Some(0.0)], &[0, 0], &a, 0).unwrap();
    let b = ((1f64.exp() + 1.0) / 2.0).ln();
    assert!((adv.values[0] - (1.0 - b)).abs() < 1e-15);
    assert!((adv.values[1] + b).abs() < 1e-15);
    assert!((b - 0.620115).abs() < 1e-6);
}

#[test]
fn red_drop_balances_negatives_and_recomputes_population_std() {
    // The rlvr variant (not the preset): population std on the kept rows, dropped rows out of the
    // normaliser.
    let mut c = AlgorithmConfig::empty("red_drop");
    c.std_norm = Some(StdNorm::Population);
    c.std_level = Some(StdLevel::Group);
    c.std_eps = Some(1e-6);
    c.red_drop_in_normaliser = Some(false);
    let a = c.resolve().unwrap();
    // 1 of 6 correct: 5 negatives, 1 other → 4 negatives dropped; kept [1, 0]: mean 0.5, pop std 0.5.
    let rewards = [
        Some(0.0),
        Some(1.0),
        Some(0.0),
        Some(0.0),
        Some(0.0),
        Some(0.0),
    ];
    let adv = compute_advantages(&rewards, &["q"; 6], &a, 42).unwrap();
    assert_eq!(adv.stats.dropped, 4);
    let kept: Vec<usize> = (0..6).filter(|&i| adv.in_normaliser[i]).collect();
    assert_eq!(kept.len(), 2);
    assert!(kept.contains(&1));
    let want = 0.5 / (0.5 + 1e-6);
    assert!((adv.values[1] - want).abs() < 1e-12);
    let neg = kept.iter().find(|&&i| i != 1).unwrap();
    assert!((adv.values[*neg] + want).abs() < 1e-12);
    for i in (0..6).filter(|i| !kept.contains(i)) {
        assert_eq!(adv.values[i], 0.0);
    }
    // Deterministic for a seed, and independent of other groups interleaved around it.
    let again = compute_advantages(&rewards, &["q"; 6], &a, 42).unwrap();
    assert_eq!(again, adv);
    let mut r2 = Vec::new();
    let mut g2 = Vec::new();
    for (i, r) in rewards.iter().enumerate() {
        r2.extend([*r, Some(i as f64)]);
        g2.extend(["q", "other"]);
    }
    let mixed = compute_advantages(&r2, &g2, &a, 42).unwrap();
    let q_rows: Vec<f64> = (0..6).map(|i| mixed.values[2 * i]).collect();
    assert_eq!(q_rows, adv.values);
    // Some seed drops a different set (the choice is random, not "the first ones").
    let differs = (0..20).any(|s| {
        compute_advantages(&rewards, &["q"; 6], &a, s)
            .unwrap()
            .in_normaliser
            != adv.in_normaliser
    });
    assert!(differs);
    // Balanced or positive-heavy groups lose nothing.
    let adv = compute_advantages(&[Some(1.0), Some(1.0), Some(0.0)], &[0; 3], &a, 1).unwrap();
    assert_eq!(adv.stats.dropped, 0);
}

/// The `red_drop` preset follows paper B's Trinity-RFT recipe (`std_normalize: false`, `drop:
/// "balance"`; `trinity/algorithm/advantage_fn/rec_advantage.py`): A = r − mean of the kept rows,
/// no std; dropped rows keep A = 0 and stay in the normaliser (Trinity's REC loss takes the token
/// mean over every row of the batch).
#[test]
fn red_drop_preset_follows_the_trinity_recipe() {
    let a = AlgorithmConfig::empty("red_drop").resolve().unwrap();
    assert_eq!(a.advantage.std, None);
    // 1 of 6 correct (reward 2): 4 of the 5 negatives dropped; kept [2, 0]: mean 1 → A = ±1.
    let rewards = [
        Some(0.0),
        Some(2.0),
        Some(0.0),
        Some(0.0),
        Some(0.0),
        Some(0.0),
    ];
    let adv = compute_advantages(&rewards, &["q"; 6], &a, 42).unwrap();
    assert_eq!(adv.stats.dropped, 4);
    assert_eq!(adv.in_normaliser, vec![true; 6]);
    assert_eq!(adv.values[1], 1.0);
    assert_eq!(adv.values.iter().filter(|&&v| v == -1.0).count(), 1);
    assert_eq!(adv.values.iter().filter(|&&v| v == 0.0).count(), 4);
    // 2 of 5 correct (0.25 vs 1): balanced after dropping one negative, kept mean (1+1+.25+.25)/4.
    let rewards = [Some(1.0), Some(0.25), Some(1.0), Some(0.25), Some(0.25)];
    let adv = compute_advantages(&rewards, &["q"; 5], &a, 7).unwrap();
    assert_eq!(adv.stats.dropped, 1);
    let mut got: Vec<f64> = adv.values.clone();
    got.sort_by(f64::total_cmp);
    assert_eq!(got, vec![-0.375, -0.375, 0.0, 0.375, 0.375]);
    // A null reward is never in the normaliser, dropped or not.
    let adv = compute_advantages(&[Some(1.0), None, Some(0.0), Some(0.0)], &[0; 4], &a, 1).unwrap();
    assert!(!adv.in_normaliser[1]);
}

#[test]
fn red_weight_function() {
    assert_eq!(advantage_exp_weight(0.0, 1.0), 0.0);
    assert!((advantage_exp_weight(1.0, 1.0) - 1f64.exp()).abs() < 1e-15);
    assert!((advantage_exp_weight(-1.0, 0.5) + (-2f64).exp()).abs() < 1e-15);
}

#[test]
fn dapo_soft_overlong_penalty() {
    // L_max = 100, L_cache = 20: free up to 80, linear to −1 at 100, −1 beyond.
    let a = AlgorithmConfig::empty("dapo").resolve().unwrap();
    assert_eq!(
        a.overlong,
        rlvr_algo::OverlongRule::Soft {
            buffer_frac: 0.2,
            penalty_factor: 1.0
        }
    );
    let p = |n| overlong_penalty(n, 100, &a);
    assert_eq!(p(50), 0.0);
    assert_eq!(p(80), 0.0);
    assert!((p(90) + 0.5).abs() < 1e-15);
    assert!((p(100) + 1.0).abs() < 1e-15);
    assert_eq!(p(130), -1.0);
    let mut rewards = vec![Some(1.0), None, Some(1.0)];
    shape_rewards(&mut rewards, &[10, 100, 95], 100, &a).unwrap();
    assert_eq!(rewards[0], Some(1.0));
    assert_eq!(rewards[1], None);
    assert!((rewards[2].unwrap() - 0.25).abs() < 1e-15);
    let plain = AlgorithmConfig::empty("grpo").resolve().unwrap();
    assert_eq!(overlong_penalty(100, 100, &plain), 0.0);
}
