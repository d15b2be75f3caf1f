//! The off-policy corrections of issue 30 against values worked out by hand: IcePop, the
//! geometric-mean truncation and mask, k3 sequence rejection (all on ρ = exp(ℓ_trainer −
//! ℓ_sampler)), OPSM (inside the loss, on ℓ_old − ℓ), the ratio histogram, RED-Drop as first written
//! in Trinity-RFT, the statistics' cross-process sums, and the combinations `resolve` refuses.

use candle_core::{DType, Device, Tensor, Var};
use rlvr_algo::{
    compute_advantages, correct, ratio_bucket, ratio_bucket_label, Algorithm, AlgorithmConfig,
    CorrectionCounts, IsCorrection, IsLevel, LossInputs, LossStats, MismatchCorrection,
    MismatchSums, PolicyLoss, RedDropRule, RATIO_BUCKETS,
};

// log ρ = ℓ_trainer − ℓ_sampler = [0.2, −0.5, 0]; ρ = [1.2214028, 0.6065307, 1].
const TRAINER: [f32; 3] = [-1.0, -2.0, -0.5];
const SAMPLER: [f32; 3] = [-1.2, -1.5, -0.5];

/// Checks `c`'s weights, masked and truncated counts against hand values.
fn check(c: IsCorrection, weights: &[f64], masked: usize, truncated: usize) {
    let out = correct(&TRAINER, &SAMPLER, c);
    assert_eq!(out.weights.len(), weights.len(), "{c:?}");
    for (x, y) in out.weights.iter().zip(weights) {
        assert!(
            (*x as f64 - y).abs() < 1e-6,
            "{c:?}: {:?} vs {weights:?}",
            out.weights
        );
    }
    assert_eq!((out.masked, out.truncated), (masked, truncated), "{c:?}");
}

#[test]
fn icepop_keeps_the_ratio_inside_its_bounds_and_drops_the_rest() {
    // [0.5, 1.1]: 1.2214 > 1.1 dropped, 0.6065 kept as its ratio, 1 kept.
    check(
        IsCorrection::IcePop { lo: 0.5, hi: 1.1 },
        &[0.0, 0.606_530_66, 1.0],
        1,
        0,
    );
    // The authors' α = 0.5 would keep 0.6065; α = 0.7 drops it.
    check(
        IsCorrection::IcePop { lo: 0.7, hi: 5.0 },
        &[1.221_402_8, 0.0, 1.0],
        1,
        0,
    );
    // Through the config value: icepop with lo 0.5 and C 5 keeps all three, weighted.
    let c = MismatchCorrection::Icepop.with_bounds(5.0, Some(0.5), 0.01);
    assert_eq!(c, Some(IsCorrection::IcePop { lo: 0.5, hi: 5.0 }));
    check(c.unwrap(), &[1.221_402_8, 0.606_530_66, 1.0], 0, 0);
}

#[test]
fn geometric_mean_truncation_and_mask() {
    // g = exp((0.2 − 0.5 + 0)/3) = exp(−0.1) = 0.9048374 on every token.
    let g = 0.904_837_4;
    let geo = |cap| IsCorrection::Truncate {
        level: IsLevel::Geometric,
        cap,
    };
    check(geo(2.0), &[g; 3], 0, 0);
    check(geo(0.9), &[0.9; 3], 0, 3);
    let mask = |lo, hi| IsCorrection::Mask {
        level: IsLevel::Geometric,
        lo,
        hi,
    };
    check(mask(0.95, 1.05), &[0.0; 3], 3, 0);
    check(mask(0.9, 1.1), &[1.0; 3], 0, 0);
    // The product ratio of the same row is exp(−0.3) = 0.7408: a sequence mask of [0.9, 1.1]
    // drops what the geometric one keeps.
    check(
        IsCorrection::Mask {
            level: IsLevel::Sequence,
            lo: 0.9,
            hi: 1.1,
        },
        &[0.0; 3],
        3,
        0,
    );
    // Config values: lower bound unset = 1/C.
    assert_eq!(
        MismatchCorrection::GeometricMask.with_bounds(1.25, None, 0.01),
        Some(mask(0.8, 1.25))
    );
    assert_eq!(
        MismatchCorrection::GeometricTruncate.with_bounds(3.0, None, 0.01),
        Some(geo(3.0))
    );
}

#[test]
fn k3_rejection_drops_rows_above_the_threshold() {
    // k3 per token = ρ − 1 − log ρ: 1.2214028 − 1.2 = 0.0214028, 0.6065307 − 0.5 = 0.1065307, 0;
    // mean 0.0426445.
    let mean_k3 = (0.021_402_76 + 0.106_530_66 + 0.0) / 3.0;
    assert!((mean_k3 - 0.042_644_47f64).abs() < 1e-8);
    check(IsCorrection::K3Mask { threshold: 0.05 }, &[1.0; 3], 0, 0);
    check(IsCorrection::K3Mask { threshold: 0.04 }, &[0.0; 3], 3, 0);
    assert_eq!(
        MismatchCorrection::SequenceK3Mask.with_bounds(2.0, None, 0.04),
        Some(IsCorrection::K3Mask { threshold: 0.04 })
    );
    // An empty row: nothing to weigh, nothing counted.
    let out = correct(&[], &[], IsCorrection::K3Mask { threshold: 0.0 });
    assert!(out.weights.is_empty() && out.masked == 0);
}

#[test]
fn correction_counts_give_token_and_row_shares() {
    let mut c = CorrectionCounts::default();
    assert_eq!(c.fractions(), [None; 4]);
    c.add_row(3, 3, 0); // a dropped row
    c.add_row(4, 1, 2); // one token masked, two truncated
    c.add_row(0, 0, 0); // empty: not counted
    c.add_row(5, 0, 0);
    let f = c.fractions();
    assert_eq!(
        f,
        [
            Some(4.0 / 12.0),
            Some(2.0 / 3.0),
            Some(2.0 / 12.0),
            Some(1.0 / 3.0)
        ]
    );
}

/// One micro-batch through `policy_loss` with REINFORCE (−A·ℓ), token mean over every token.
fn reinforce(
    opsm: Option<f64>,
    logp: &[f64],
    old: &[f64],
    mask: &[f64],
    adv: &[f64],
) -> (f64, Vec<f64>, LossStats) {
    let mut c = AlgorithmConfig::empty("none");
    c.loss = Some(PolicyLoss::Reinforce);
    c.opsm_delta = opsm;
    let a = c.resolve().unwrap();
    let dev = Device::Cpu;
    let b = adv.len();
    let t = logp.len() / b;
    let lp = Var::from_tensor(&Tensor::from_vec(logp.to_vec(), (b, t), &dev).unwrap()).unwrap();
    let o = Tensor::from_vec(old.to_vec(), (b, t), &dev).unwrap();
    let m = Tensor::from_vec(mask.to_vec(), (b, t), &dev).unwrap();
    let av = Tensor::new(adv, &dev).unwrap();
    let n: f64 = mask.iter().sum();
    let w = vec![1.0 / n; b];
    let (loss, st) = rlvr_algo::policy_loss(
        &a,
        &LossInputs {
            logp: lp.as_tensor(),
            logp_behaviour: &o,
            logp_ref: None,
            entropy: None,
            mask: &m,
            advantages: &av,
            row_weights: &w,
            is_weights: None,
        },
    )
    .unwrap();
    let g = loss.backward().unwrap();
    let grad = g
        .get(&lp)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    (loss.to_scalar::<f64>().unwrap(), grad, st)
}

#[test]
fn opsm_leaves_out_negative_rows_that_drifted_past_delta() {
    // Row 0: A = −1, mean(ℓ_old − ℓ) = 0.5 > δ = 0.3: its PG term is removed.
    // Row 1: A = +1, same drift: kept (A ≥ 0).
    // Row 2: A = −1, one token, ℓ_old − ℓ = −0.1 ≤ δ: kept (its padding holds anything).
    let logp = [-1.0, -1.0, -1.0, -1.0, -1.0, 7.0];
    let old = [-0.5, -0.5, -0.5, -0.5, -1.1, 9.0];
    let mask = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
    let adv = [-1.0, 1.0, -1.0];
    // Without OPSM: (−A·ℓ summed) / 5 = (−2 + 2 − 1)/5 = −0.2; with: (0 + 2 − 1)/5 = 0.2.
    let (off, _, st_off) = reinforce(None, &logp, &old, &mask, &adv);
    assert!((off + 0.2).abs() < 1e-12, "{off}");
    assert_eq!(st_off.opsm, CorrectionCounts::default());
    let (on, grad, st) = reinforce(Some(0.3), &logp, &old, &mask, &adv);
    assert!((on - 0.2).abs() < 1e-12, "{on}");
    // ∂/∂ℓ = −A/5 on kept tokens, 0 on row 0 and on padding.
    let want = [0.0, 0.0, -0.2, -0.2, 0.2, 0.0];
    for (g, w) in grad.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{grad:?}");
    }
    let f = st.opsm.fractions();
    assert_eq!(f[0], Some(2.0 / 5.0));
    assert_eq!(f[1], Some(1.0 / 3.0));
    // δ above the drift: nothing masked, the plain loss.
    let (same, _, st) = reinforce(Some(0.6), &logp, &old, &mask, &adv);
    assert!((same + 0.2).abs() < 1e-12);
    assert_eq!(st.opsm.masked_rows, 0.0);
    assert_eq!(st.opsm.rows, 3.0);
}

#[test]
fn ratio_histogram_counts_trained_tokens_by_log_ratio() {
    // log ρ = ℓ − ℓ_old per token: −12 (bucket 0), −0.5 (bucket 2), 0 (bucket 6), 5e-4 (bucket 7),
    // 0.05 (bucket 9), 3 (bucket 11), 25 clamped to 20 (bucket 12); one padding token.
    let x = [-12.0, -0.5, 0.0, 5e-4, 0.05, 3.0, 25.0, 0.0];
    let old = [-1.0; 8];
    let logp: Vec<f64> = x.iter().map(|d| -1.0 + d).collect();
    let mask = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
    let (_, _, st) = reinforce(None, &logp, &old, &mask, &[1.0, -1.0]);
    let mut want = [0.0; RATIO_BUCKETS];
    for k in [0, 2, 6, 7, 9, 11, 12] {
        want[k] += 1.0;
    }
    assert_eq!(st.ratio_hist, want);
    // The bucket rule itself, edges included (an edge belongs to the bucket above it).
    assert_eq!(ratio_bucket(-10.0), 1);
    assert_eq!(ratio_bucket(-1e-4), 6);
    assert_eq!(ratio_bucket(1e-4), 7);
    assert_eq!(ratio_bucket(10.0), 12);
    assert_eq!(ratio_bucket(f64::NAN), 0);
    assert_eq!(ratio_bucket_label(6), "|log ρ| < 1e-4");
    assert_eq!(ratio_bucket_label(0), "log ρ < -10");
    assert_eq!(ratio_bucket_label(12), "log ρ ≥ 10");
    assert_eq!(ratio_bucket_label(3), "[-0.1, -0.01)");
}

#[test]
fn statistics_survive_the_cross_process_sum() {
    // Two "ranks": the sum of their to_sums() rebuilt equals their merge.
    let logp = [-1.0, -1.3, -0.2, -2.0];
    let old = [-1.1, -1.0, -0.2, -2.5];
    let (_, _, mut a) = reinforce(Some(0.1), &logp, &old, &[1.0; 4], &[-1.0, 1.0]);
    a.mismatch.add_row(2, 1, 0);
    let (_, _, b) = reinforce(Some(0.1), &[-3.0, -0.1], &[-2.0, -0.1], &[1.0; 2], &[-1.0]);
    let mut merged = a.clone();
    merged.merge(&b);
    let sums: Vec<f64> = a
        .to_sums()
        .iter()
        .zip(b.to_sums())
        .map(|(x, y)| x + y)
        .collect();
    let (ea, eb) = (a.extrema(), b.extrema());
    let back = LossStats::from_sums(&sums, [ea[0].max(eb[0]), ea[1].max(eb[1])]);
    assert_eq!(back, merged);
    assert_eq!(LossStats::from_sums(&a.to_sums(), a.extrema()), a);
    // The mismatch sums too (the histogram rides along).
    let mut d = MismatchSums::default();
    d.add(-1.0, -1.2);
    d.add(-2.0, -1.5);
    assert_eq!(MismatchSums::from_parts(&d.to_parts()), d);
    let mut h = [0.0; RATIO_BUCKETS];
    h[ratio_bucket(0.2)] += 1.0; // [0.1, 1)
    h[ratio_bucket(-0.5)] += 1.0; // [-1, -0.1)
    assert_eq!(d.hist(), h);
    assert_eq!((h[10], h[2]), (1.0, 1.0));
}

fn red_drop(rule: RedDropRule) -> Algorithm {
    let mut c = AlgorithmConfig::empty("red_drop");
    c.red_drop_rule = Some(rule);
    c.resolve().unwrap()
}

#[test]
fn red_drop_as_first_written_keeps_the_group_mean() {
    // A group of 8 with 2 correct: mean 0.25, pos = 2, neg = 6, each negative dropped with
    // probability 1 − 2/6 = 2/3. Kept rows keep A = r − 0.25 (no std, mean of all 8 rows).
    let rewards: Vec<Option<f64>> = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        .iter()
        .map(|&r| Some(r))
        .collect();
    let groups = ["g"; 8];
    let alg = red_drop(RedDropRule::Bernoulli);
    let mut total = 0;
    let seeds = 3000u64;
    for seed in 0..seeds {
        let a = compute_advantages(&rewards, &groups, &alg, seed).unwrap();
        for (i, &r) in rewards.iter().enumerate() {
            let v = a.values[i];
            if r == Some(1.0) {
                assert_eq!(v, 0.75);
            } else {
                assert!(v == 0.0 || v == -0.25, "{v}");
            }
            // The red_drop preset keeps dropped rows in the normaliser (Trinity's batch).
            assert!(a.in_normaliser[i]);
        }
        let dropped = a.values.iter().filter(|&&v| v == 0.0).count();
        assert_eq!(dropped, a.stats.dropped);
        assert_eq!(a.stats.dropped_frac(), Some(dropped as f64 / 8.0));
        total += dropped;
    }
    // E[dropped] = 6 · 2/3 = 4 per group; the mean of 3000 draws is within 0.1 (σ/√n ≈ 0.021).
    let mean = total as f64 / seeds as f64;
    assert!((mean - 4.0).abs() < 0.1, "{mean}");
    // Balanced or positive-heavy groups: nothing dropped, either rule.
    let even = [Some(1.0), Some(0.0), Some(1.0), Some(0.0)];
    for rule in [RedDropRule::Bernoulli, RedDropRule::Surplus] {
        let a = compute_advantages(&even, &["h"; 4], &red_drop(rule), 7).unwrap();
        assert_eq!(a.stats.dropped, 0);
        assert_eq!(a.values, vec![0.5, -0.5, 0.5, -0.5]);
    }
    // As released: exactly the surplus 4 dropped, mean recomputed on the kept 4 (0.5).
    let a = compute_advantages(&rewards, &groups, &red_drop(RedDropRule::Surplus), 1).unwrap();
    assert_eq!(a.stats.dropped, 4);
    assert_eq!(a.values.iter().filter(|&&v| v == 0.5).count(), 2);
    assert_eq!(a.values.iter().filter(|&&v| v == -0.5).count(), 2);
}

#[test]
fn presets_match_the_peers_recipes() {
    let g = crate::common::flat(&AlgorithmConfig::empty("grpo_verl").resolve().unwrap());
    assert_eq!(g.loss, PolicyLoss::Ppo);
    assert_eq!(
        (g.clip_low, g.clip_high, g.dual_clip),
        (0.2, 0.2, Some(3.0))
    );
    assert_eq!(g.aggregation, rlvr_algo::Aggregation::TokenMean);
    assert!(!g.exclude_zero_std);
    assert_eq!(g.std_norm, rlvr_algo::StdNorm::Sample);
    assert_eq!(g.std_eps, 1e-6);
    let r = crate::common::flat(
        &AlgorithmConfig::empty("red_drop_bernoulli")
            .resolve()
            .unwrap(),
    );
    assert!(r.red_drop && r.red_drop_in_normaliser);
    assert_eq!(r.red_drop_rule, RedDropRule::Bernoulli);
    assert_eq!(r.std_norm, rlvr_algo::StdNorm::None);
    // `rlvr algorithms` names the code each preset follows.
    let mut out = Vec::new();
    rlvr_algo::print_algorithms(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        text.matches("  follows: ").count(),
        rlvr_algo::presets().len()
    );
    assert!(text.contains("8a0e9e81") && text.contains("compute_grpo_outcome_advantage"));
}

/// `resolve`'s error for `f`'s config, which must name `key`.
fn refused(key: &str, f: impl FnOnce(&mut AlgorithmConfig)) -> String {
    let mut c = AlgorithmConfig::empty("grpo");
    f(&mut c);
    let e = c.resolve().expect_err("refused").to_string();
    assert!(e.contains(key), "{e}");
    e
}

#[test]
fn combinations_that_make_no_sense_are_refused() {
    use MismatchCorrection as M;
    // A lower bound where the correction has none.
    for m in [
        M::None,
        M::TokenTruncate,
        M::GeometricTruncate,
        M::SequenceK3Mask,
    ] {
        refused("mismatch_low", |c| {
            c.mismatch_correction = Some(m);
            c.mismatch_low = Some(0.5);
        });
    }
    // Bounds out of order, or out of range.
    refused("mismatch_low", |c| {
        c.mismatch_correction = Some(M::Icepop);
        c.mismatch_low = Some(3.0);
        c.mismatch_cap = Some(2.0);
    });
    refused("mismatch_cap", |c| {
        c.mismatch_correction = Some(M::GeometricMask);
        c.mismatch_cap = Some(0.5);
    });
    refused("mismatch_k3_threshold", |c| {
        c.mismatch_correction = Some(M::SequenceK3Mask);
        c.mismatch_k3_threshold = Some(-0.1);
    });
    refused("opsm_delta", |c| c.opsm_delta = Some(f64::NAN));
    // IcePop is per token: GSPO's sequence ratio refuses it like the other token corrections.
    let e = refused("mismatch_correction", |c| {
        c.preset = "gspo".into();
        c.mismatch_correction = Some(M::Icepop);
    });
    assert!(e.contains("geometric"), "{e}");
    // A RED-Drop rule without RED-Drop.
    refused("red_drop_rule", |c| {
        c.red_drop_rule = Some(RedDropRule::Bernoulli)
    });
    // What is allowed: IcePop with the authors' bounds, a lower bound below 1 with C = 1.001,
    // sequence corrections under GSPO.
    let mut c = AlgorithmConfig::empty("grpo");
    c.mismatch_correction = Some(M::Icepop);
    c.mismatch_low = Some(0.5);
    c.mismatch_cap = Some(5.0);
    let a = c.resolve().unwrap();
    let back: AlgorithmConfig = toml::from_str(&toml::to_string(&a.to_config()).unwrap()).unwrap();
    assert_eq!(back.resolve().unwrap(), a);
    let mut c = AlgorithmConfig::empty("gspo");
    c.mismatch_correction = Some(M::GeometricMask);
    c.mismatch_low = Some(0.999);
    c.mismatch_cap = Some(1.001);
    c.opsm_delta = Some(0.1);
    assert!(c.resolve().is_ok());
    assert_eq!(MismatchCorrection::ALL.len(), 9);
    let _ = (DType::F64,);
}

/// The cross-process vector keeps its layout (scalar sums, histogram, mismatch, OPSM), each field
/// where it was, so ranks agree whatever the field list's spelling.
#[test]
fn the_cross_process_vector_has_its_layout() {
    let mut s = LossStats {
        loss: 1.0,
        tokens_total: 2.0,
        tokens: 3.0,
        clipped_low: 4.0,
        clipped_high: 5.0,
        pos_tokens: 6.0,
        clipped_pos: 7.0,
        neg_tokens: 8.0,
        clipped_neg: 9.0,
        ratio_sum: 10.0,
        ratio_sq_sum: 11.0,
        kl_behaviour_sum: 12.0,
        kl_ref_sum: 13.0,
        kl_ref_tokens: 14.0,
        entropy_sum: 15.0,
        entropy_tokens: 16.0,
        pg_loss: 17.0,
        reg_loss: 18.0,
        dual_clipped: 19.0,
        dual_clip_tokens: 20.0,
        ..LossStats::default()
    };
    s.ratio_hist = std::array::from_fn(|k| 21.0 + k as f64);
    s.mismatch.add_row(5, 2, 1);
    s.opsm.add_row(7, 3, 0);
    let v = s.to_sums();
    let want_scalars: Vec<f64> = (1..=20).map(f64::from).collect();
    assert_eq!(&v[..20], &want_scalars[..]);
    assert_eq!(&v[20..20 + RATIO_BUCKETS], &s.ratio_hist[..]);
    let at = 20 + RATIO_BUCKETS;
    assert_eq!(&v[at..at + 6], &[5.0, 2.0, 1.0, 1.0, 1.0, 1.0]);
    assert_eq!(&v[at + 6..], &[7.0, 3.0, 0.0, 1.0, 1.0, 0.0]);
    assert_eq!(LossStats::from_sums(&v, s.extrema()), s);
}
