//! Loss properties: exact micro-batching for every aggregation, paper equivalences, finite-difference
//! gradients, diagnostics by hand, numerical safety.

use crate::common::alg;
use candle_core::{Device, Tensor, Var};
use rlvr_algo::{
    compute_advantages, policy_loss, Aggregation, Algorithm, AlgorithmConfig, KeepMask,
    KlEstimator, LossInputs, LossStats, PolicyLoss, RecWeight, RegTerm, Regulariser, RowInfo,
    UpdateNormaliser,
};

/// A seeded batch: B rows × T tokens, varied lengths, ratios spread over ~[0.2, 4].
struct Batch {
    b: usize,
    t: usize,
    logp: Vec<f64>,
    old: Vec<f64>,
    reference: Vec<f64>,
    entropy: Vec<f64>,
    mask: Vec<f64>,
    adv: Vec<f64>,
    rows: Vec<RowInfo>,
}

fn rng(state: &mut u64) -> f64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 11) as f64) / ((1u64 << 53) as f64)
}

fn batch(b: usize, t: usize, seed: u64) -> Batch {
    let mut s = seed;
    let mut u = |lo: f64, hi: f64| lo + (hi - lo) * rng(&mut s);
    let mut out = Batch {
        b,
        t,
        logp: vec![],
        old: vec![],
        reference: vec![],
        entropy: vec![],
        mask: vec![],
        adv: vec![],
        rows: vec![],
    };
    for i in 0..b {
        let len = 1 + (u(0.0, t as f64) as usize).min(t - 1);
        for k in 0..t {
            let lp = u(-3.0, -0.05);
            out.logp.push(lp);
            out.old.push(lp - u(-1.6, 1.4));
            out.reference.push(lp - u(-0.5, 0.5));
            out.entropy.push(u(0.1, 2.0));
            out.mask.push(if k < len { 1.0 } else { 0.0 });
        }
        let a = u(-2.0, 2.0);
        out.adv.push(if a.abs() < 0.05 { 0.3 } else { a });
        out.rows.push(RowInfo {
            completion_tokens: len,
            truncated: i % 5 == 3,
            in_normaliser: i % 7 != 6,
        });
    }
    out
}

/// Gradient of Σ over micro-batches (rows grouped as `splits`) w.r.t. the full [B, T] ℓ, in f64.
fn grad_split(
    a: &Algorithm,
    bt: &Batch,
    splits: &[Vec<usize>],
    max_new: usize,
) -> (Vec<f64>, LossStats) {
    let norm = UpdateNormaliser::new(a, &bt.rows, max_new).unwrap();
    let dev = Device::Cpu;
    let logp = Var::from_vec(bt.logp.clone(), (bt.b, bt.t), &dev).unwrap();
    let full = |v: &[f64]| Tensor::from_vec(v.to_vec(), (bt.b, bt.t), &dev).unwrap();
    let (old, rf, ent, mask) = (
        full(&bt.old),
        full(&bt.reference),
        full(&bt.entropy),
        full(&bt.mask),
    );
    let adv = Tensor::new(bt.adv.as_slice(), &dev).unwrap();
    let mut grad = vec![0.0; bt.b * bt.t];
    let mut stats = LossStats::default();
    for rows in splits {
        let idx = Tensor::new(rows.iter().map(|&r| r as u32).collect::<Vec<_>>(), &dev).unwrap();
        let pick = |x: &Tensor| x.index_select(&idx, 0).unwrap();
        let w = norm.rows(rows);
        let (l_mb, o_mb, r_mb, e_mb, m_mb, a_mb) = (
            pick(logp.as_tensor()),
            pick(&old),
            pick(&rf),
            pick(&ent),
            pick(&mask),
            pick(&adv),
        );
        let (loss, st) = policy_loss(
            a,
            &LossInputs {
                logp: &l_mb,
                logp_behaviour: &o_mb,
                logp_ref: Some(&r_mb),
                entropy: Some(&e_mb),
                mask: &m_mb,
                advantages: &a_mb,
                row_weights: &w,
                is_weights: None,
            },
        )
        .unwrap();
        stats.merge(&st);
        let g = loss.backward().unwrap();
        if let Some(g) = g.get(logp.as_tensor()) {
            for (acc, v) in grad
                .iter_mut()
                .zip(g.flatten_all().unwrap().to_vec1::<f64>().unwrap())
            {
                *acc += v;
            }
        }
    }
    (grad, stats)
}

fn loss_variants() -> Vec<(&'static str, Algorithm)> {
    vec![
        ("ppo", alg(|c| c.loss = Some(PolicyLoss::Ppo))),
        (
            "ppo+kl+entropy+dual",
            alg(|c| {
                c.kl_coef = Some(0.1);
                c.entropy_coef = Some(0.01);
                c.dual_clip = Some(3.0);
                c.kl_ratio_weighted = Some(true);
            }),
        ),
        (
            "gspo",
            alg(|c| {
                c.loss = Some(PolicyLoss::Gspo);
                c.clip_low = Some(0.1);
                c.clip_high = Some(0.15);
            }),
        ),
        (
            "rec_gspo_seq_is",
            alg(|c| {
                c.loss = Some(PolicyLoss::Rec);
                c.keep_mask = Some(KeepMask::GspoOneSide);
                c.rec_weight = Some(RecWeight::SeqIs);
            }),
        ),
        (
            "opmd",
            alg(|c| {
                c.loss = Some(PolicyLoss::Reinforce);
                c.regulariser = Some(Regulariser::Opmd);
            }),
        ),
    ]
}

#[test]
fn micro_batches_give_the_full_batch_gradient_for_every_aggregation() {
    let bt = batch(8, 9, 11);
    let all: Vec<usize> = (0..8).collect();
    let splits: Vec<Vec<Vec<usize>>> = vec![
        vec![all.clone()],
        vec![(0..4).collect(), (4..8).collect()],
        vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]],
        vec![vec![7, 2, 5], vec![0], vec![6, 1, 3, 4]], // uneven, out of order
    ];
    for agg in [
        Aggregation::TokenMean,
        Aggregation::SeqMeanTokenMean,
        Aggregation::SeqMeanTokenSum,
        Aggregation::Constant,
    ] {
        for (name, mut a) in loss_variants() {
            a.aggregation = agg;
            for overlong in [rlvr_algo::OverlongRule::None, rlvr_algo::OverlongRule::Mask] {
                a.overlong = overlong;
                let (g1, s1) = grad_split(&a, &bt, &splits[0], 12);
                assert!(
                    g1.iter().any(|v| v.abs() > 1e-6),
                    "{name} {agg:?}: gradient is zero"
                );
                for sp in &splits[1..] {
                    let (g, s) = grad_split(&a, &bt, sp, 12);
                    let diff = g1
                        .iter()
                        .zip(&g)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max);
                    assert!(
                        diff < 1e-6,
                        "{name} {agg:?} {}: max diff {diff:e}",
                        sp.len()
                    );
                    assert!(
                        (s.loss - s1.loss).abs() < 1e-12,
                        "{name} {agg:?}: summed loss"
                    );
                    let (m, m1) = (s.finalise(None), s1.finalise(None));
                    assert_eq!(m.clip_frac, m1.clip_frac);
                    assert_eq!(m.ratio_max, m1.ratio_max);
                }
            }
        }
    }
}

#[test]
fn naive_per_micro_batch_mean_would_differ() {
    // The peer fault (TRL #3021 & co.): averaging per-micro-batch token means is not the batch token mean.
    let bt = batch(8, 9, 5);
    let mut a = alg(|_| {});
    a.aggregation = Aggregation::TokenMean;
    let (g_full, _) = grad_split(&a, &bt, &[(0..8).collect()], 12);
    let mut g_naive = vec![0.0; g_full.len()];
    for half in [(0..4).collect::<Vec<_>>(), (4..8).collect()] {
        let sub = Batch {
            rows: half.iter().map(|&i| bt.rows[i]).collect(),
            b: 4,
            t: bt.t,
            logp: half
                .iter()
                .flat_map(|&i| bt.logp[i * bt.t..(i + 1) * bt.t].to_vec())
                .collect(),
            old: half
                .iter()
                .flat_map(|&i| bt.old[i * bt.t..(i + 1) * bt.t].to_vec())
                .collect(),
            reference: half
                .iter()
                .flat_map(|&i| bt.reference[i * bt.t..(i + 1) * bt.t].to_vec())
                .collect(),
            entropy: half
                .iter()
                .flat_map(|&i| bt.entropy[i * bt.t..(i + 1) * bt.t].to_vec())
                .collect(),
            mask: half
                .iter()
                .flat_map(|&i| bt.mask[i * bt.t..(i + 1) * bt.t].to_vec())
                .collect(),
            adv: half.iter().map(|&i| bt.adv[i]).collect(),
        };
        let (g, _) = grad_split(&a, &sub, &[(0..4).collect()], 12);
        for (k, &i) in half.iter().enumerate() {
            for t in 0..bt.t {
                g_naive[i * bt.t + t] += 0.5 * g[k * bt.t + t];
            }
        }
    }
    let diff = g_full
        .iter()
        .zip(&g_naive)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(
        diff > 1e-4,
        "batch lengths differ, so the naive mean must differ (diff {diff:e})"
    );
}

#[test]
fn row_infos_from_mask() {
    let mask = Tensor::from_vec(vec![1f32, 1.0, 0.0, 1.0, 1.0, 1.0], (2, 3), &Device::Cpu).unwrap();
    let rows = RowInfo::from_mask(&mask, &[false, true], &[true, false]).unwrap();
    assert_eq!(
        rows,
        vec![
            RowInfo {
                completion_tokens: 2,
                truncated: false,
                in_normaliser: true
            },
            RowInfo {
                completion_tokens: 3,
                truncated: true,
                in_normaliser: false
            },
        ]
    );
    assert!(RowInfo::from_mask(&mask, &[false], &[true, true]).is_err());
}

#[test]
fn normaliser_weights_by_hand() {
    let rows = |n: &[usize]| {
        n.iter()
            .map(|&n| RowInfo {
                completion_tokens: n,
                truncated: n == 4,
                in_normaliser: n != 5,
            })
            .collect::<Vec<_>>()
    };
    let r = rows(&[2, 3, 5, 4]); // row 2 is out (advantages), row 3 truncated
    let w = |agg, overlong| {
        let mut a = alg(|_| {});
        a.aggregation = agg;
        a.overlong = overlong;
        UpdateNormaliser::new(&a, &r, 10).unwrap()
    };
    use rlvr_algo::OverlongRule::{Mask, None as Keep};
    assert_eq!(
        w(Aggregation::TokenMean, Keep).weights(),
        &[1.0 / 9.0, 1.0 / 9.0, 0.0, 1.0 / 9.0]
    );
    assert_eq!(
        w(Aggregation::TokenMean, Mask).weights(),
        &[0.2, 0.2, 0.0, 0.0]
    );
    assert_eq!(
        w(Aggregation::SeqMeanTokenMean, Keep).weights(),
        &[1.0 / 6.0, 1.0 / 9.0, 0.0, 1.0 / 12.0]
    );
    assert_eq!(
        w(Aggregation::SeqMeanTokenSum, Keep).weights(),
        &[1.0 / 3.0, 1.0 / 3.0, 0.0, 1.0 / 3.0]
    );
    assert_eq!(
        w(Aggregation::Constant, Keep).weights(),
        // constant: B·K = 4 rows (row 2 included) × max_new_tokens 10, fixed per update.
        &[1.0 / 40.0, 1.0 / 40.0, 0.0, 1.0 / 40.0]
    );
    assert_eq!(
        w(Aggregation::TokenMean, Mask).masked_frac(),
        Some(9.0 / 14.0)
    );
    assert_eq!(
        w(Aggregation::TokenMean, Keep).rows(&[3, 0]),
        vec![1.0 / 9.0, 1.0 / 9.0]
    );
    // Nothing left: all weights 0.
    let none = vec![RowInfo {
        completion_tokens: 3,
        truncated: false,
        in_normaliser: false,
    }];
    assert_eq!(
        UpdateNormaliser::new(&alg(|_| {}), &none, 8)
            .unwrap()
            .weights(),
        &[0.0]
    );
    let mut a = alg(|_| {});
    a.aggregation = Aggregation::Constant;
    assert!(UpdateNormaliser::new(&a, &none, 0).is_err());
}

#[test]
fn zero_variance_groups_do_not_change_the_gradient() {
    // DESIGN.md section 5 fault: zero-variance groups still counted in the token denominator.
    let a = AlgorithmConfig::empty("dapo").resolve().unwrap(); // token-mean
    let bt = batch(6, 5, 3);
    let rewards = [
        Some(1.0),
        Some(0.0),
        Some(0.0),
        Some(1.0),
        Some(1.0),
        Some(1.0),
    ];
    let groups = ["a", "a", "b", "b", "z", "z"]; // z: zero variance
    let adv = compute_advantages(&rewards, &groups, &a, 0).unwrap();
    let mut bt_all = batch(6, 5, 3);
    bt_all.adv = adv.values.clone();
    for (r, &keep) in bt_all.rows.iter_mut().zip(&adv.in_normaliser) {
        *r = RowInfo {
            in_normaliser: keep,
            truncated: false,
            ..*r
        };
    }
    let (g_all, _) = grad_split(&a, &bt_all, &[(0..6).collect()], 8);
    // The same four live rows alone.
    let mut bt4 = batch(6, 5, 3);
    bt4.b = 4;
    bt4.adv = adv.values[..4].to_vec();
    for v in [
        &mut bt4.logp,
        &mut bt4.old,
        &mut bt4.reference,
        &mut bt4.entropy,
        &mut bt4.mask,
    ] {
        v.truncate(4 * 5);
    }
    bt4.rows = bt_all.rows[..4].to_vec();
    let (g4, _) = grad_split(&a, &bt4, &[(0..4).collect()], 8);
    for k in 0..20 {
        assert!((g_all[k] - g4[k]).abs() < 1e-15);
    }
    assert!(g_all[20..].iter().all(|&v| v == 0.0));
    let _ = bt;
}

/// Loss and ℓ-gradient of the whole batch (one micro-batch) with given advantages.
fn full(a: &Algorithm, bt: &Batch) -> (f64, Vec<f64>) {
    let norm = UpdateNormaliser::new(a, &bt.rows, 12).unwrap();
    let dev = Device::Cpu;
    let logp = Var::from_vec(bt.logp.clone(), (bt.b, bt.t), &dev).unwrap();
    let f = |v: &[f64]| Tensor::from_vec(v.to_vec(), (bt.b, bt.t), &dev).unwrap();
    let (old, rf, ent, mask) = (f(&bt.old), f(&bt.reference), f(&bt.entropy), f(&bt.mask));
    let adv = Tensor::new(bt.adv.as_slice(), &dev).unwrap();
    let w = norm.weights().to_vec();
    let (loss, _) = policy_loss(
        a,
        &LossInputs {
            logp: logp.as_tensor(),
            logp_behaviour: &old,
            logp_ref: Some(&rf),
            entropy: Some(&ent),
            mask: &mask,
            advantages: &adv,
            row_weights: &w,
            is_weights: None,
        },
    )
    .unwrap();
    let g = loss.backward().unwrap();
    let grad = g
        .get(logp.as_tensor())
        .map(|g| g.flatten_all().unwrap().to_vec1::<f64>().unwrap())
        .unwrap_or_else(|| vec![0.0; bt.b * bt.t]);
    (loss.to_scalar::<f64>().unwrap(), grad)
}

#[test]
fn rec_oneside_is_has_the_ppo_gradient() {
    let ppo = AlgorithmConfig::empty("grpo").resolve().unwrap();
    let mut rec = AlgorithmConfig::empty("rec_oneside_is").resolve().unwrap();
    rec.aggregation = ppo.aggregation;
    for seed in 0..5 {
        let bt = batch(10, 8, seed);
        let (_, g_ppo) = full(&ppo, &bt);
        let (_, g_rec) = full(&rec, &bt);
        let max = g_ppo.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(max > 1e-3);
        for (a, b) in g_ppo.iter().zip(&g_rec) {
            assert!((a - b).abs() < 1e-14, "{a} vs {b}");
        }
    }
}

#[test]
fn asymre_equals_reinforce_with_the_baseline_lowered_by_tau() {
    let rewards: Vec<Option<f64>> = [1.0, 0.0, 0.0, 0.5, 1.0, 0.25, 1.0, 1.0].map(Some).to_vec();
    let groups = ["a", "b", "a", "b", "a", "b", "z", "z"];
    for exclude in [true, false] {
        let mut asym = AlgorithmConfig::empty("asymre");
        asym.exclude_zero_std = Some(exclude);
        let asym = asym.resolve().unwrap();
        let mut rf = AlgorithmConfig::empty("reinforce");
        let RegTerm::Asymre { tau } = asym.regulariser else {
            panic!("{:?}", asym.regulariser)
        };
        rf.baseline_shift = Some(-tau);
        rf.exclude_zero_std = Some(exclude);
        let rf = rf.resolve().unwrap();
        let adv_a = compute_advantages(&rewards, &groups, &asym, 0).unwrap();
        let adv_r = compute_advantages(&rewards, &groups, &rf, 0).unwrap();
        assert_eq!(adv_a.in_normaliser, adv_r.in_normaliser);
        let mut bt = batch(8, 6, 9);
        for (r, &k) in bt.rows.iter_mut().zip(&adv_a.in_normaliser) {
            *r = RowInfo {
                in_normaliser: k,
                truncated: false,
                ..*r
            };
        }
        bt.adv = adv_a.values.clone();
        let (la, ga) = full(&asym, &bt);
        bt.adv = adv_r.values.clone();
        let (lr, gr) = full(&rf, &bt);
        assert!((la - lr).abs() < 1e-14, "{la} vs {lr}");
        for (a, b) in ga.iter().zip(&gr) {
            assert!((a - b).abs() < 1e-14);
        }
    }
}

/// Central finite differences of the loss value w.r.t. ℓ, for variants without stop-gradients (those
/// with detached weights are checked against PyTorch's detach semantics in `reference.rs`).
#[test]
fn finite_difference_gradients() {
    let mut variants: Vec<(String, Algorithm)> = vec![];
    let mut add = |name: &str, f: &dyn Fn(&mut AlgorithmConfig)| {
        let mut c = AlgorithmConfig::empty("none");
        f(&mut c);
        variants.push((name.to_string(), c.resolve().unwrap()));
    };
    add("ppo", &|c| c.clip_high = Some(0.28));
    add("ppo_dual", &|c| c.dual_clip = Some(2.5));
    add("gspo", &|c| {
        c.loss = Some(PolicyLoss::Gspo);
        c.clip_low = Some(0.1);
        c.clip_high = Some(0.15);
    });
    add("gspo_dual", &|c| {
        c.loss = Some(PolicyLoss::Gspo);
        c.dual_clip = Some(1.3);
    });
    add("reinforce", &|c| c.loss = Some(PolicyLoss::Reinforce));
    add("opmd", &|c| {
        c.loss = Some(PolicyLoss::Reinforce);
        c.regulariser = Some(Regulariser::Opmd);
        c.tau = Some(0.3);
    });
    add("asymre", &|c| {
        c.loss = Some(PolicyLoss::Reinforce);
        c.regulariser = Some(Regulariser::Asymre);
    });
    for (k, km) in [
        ("none", KeepMask::None),
        ("one-side", KeepMask::OneSide),
        ("two-side", KeepMask::TwoSide),
        ("ring", KeepMask::Ring),
        ("gspo-one-side", KeepMask::GspoOneSide),
    ] {
        for (w, rw) in [
            ("none", RecWeight::None),
            ("advantage-exp", RecWeight::AdvantageExp),
        ] {
            add(&format!("rec_{k}_{w}"), &|c| {
                c.loss = Some(PolicyLoss::Rec);
                c.keep_mask = Some(km);
                c.rec_weight = Some(rw);
            });
        }
    }
    for (name, est) in [
        ("k1", KlEstimator::K1),
        ("k2", KlEstimator::K2),
        ("k3", KlEstimator::K3),
    ] {
        add(&format!("kl_{name}_entropy"), &|c| {
            c.kl_coef = Some(0.2);
            c.kl_estimator = Some(est);
            c.entropy_coef = Some(0.05);
        });
    }
    add("clamped", &|c| c.log_ratio_clamp = Some(0.7));
    for agg in [Aggregation::SeqMeanTokenMean, Aggregation::Constant] {
        add(&format!("ppo_{agg:?}"), &|c| c.aggregation = Some(agg));
    }
    let bt = batch(5, 6, 77);
    let h = 1e-6;
    for (name, a) in &variants {
        let (_, g) = full(a, &bt);
        for (k, &gk) in g.iter().enumerate() {
            let mut p = Batch {
                logp: bt.logp.clone(),
                ..batch(5, 6, 77)
            };
            p.logp[k] += h;
            let (lp, _) = full(a, &p);
            p.logp[k] -= 2.0 * h;
            let (lm, _) = full(a, &p);
            let fd = (lp - lm) / (2.0 * h);
            assert!(
                (fd - gk).abs() < 1e-6 * (1.0 + fd.abs()),
                "{name} [{k}]: fd {fd} vs autograd {gk}"
            );
        }
    }
}

fn tiny(a: &Algorithm, logp: &[f64], old: &[f64], adv: &[f64]) -> LossStats {
    let dev = Device::Cpu;
    let b = adv.len();
    let t = logp.len() / b;
    let lp = Tensor::from_vec(logp.to_vec(), (b, t), &dev).unwrap();
    let o = Tensor::from_vec(old.to_vec(), (b, t), &dev).unwrap();
    let m = Tensor::ones((b, t), candle_core::DType::F64, &dev).unwrap();
    let av = Tensor::new(adv, &dev).unwrap();
    let w = vec![1.0 / (b * t) as f64; b];
    let inputs = LossInputs {
        logp: &lp,
        logp_behaviour: &o,
        logp_ref: None,
        entropy: None,
        mask: &m,
        advantages: &av,
        row_weights: &w,
        is_weights: None,
    };
    policy_loss(a, &inputs).unwrap().1
}

#[test]
fn diagnostics_by_hand() {
    let a = alg(|_| {}); // PPO 0.2/0.2
    let l = |r: f64| r.ln();
    // Rows (one token each): A>0 ρ=1.5 (clipped high), A<0 ρ=0.5 (clipped low), A>0 ρ=0.9, A<0 ρ=1.1.
    let st = tiny(
        &a,
        &[l(1.5), l(0.5), l(0.9), l(1.1)],
        &[0.0; 4],
        &[1.0, -1.0, 2.0, -0.5],
    );
    let m = st.finalise(None);
    let close = |x: Option<f64>, y: f64| assert!((x.unwrap() - y).abs() < 1e-12, "{x:?} vs {y}");
    close(m.clip_frac, 0.5);
    close(m.clip_frac_low, 0.25);
    close(m.clip_frac_high, 0.25);
    close(m.clip_frac_adv_pos, 0.5);
    close(m.clip_frac_adv_neg, 0.5);
    close(m.ratio_mean, 1.0);
    close(m.ratio_min, 0.5);
    close(m.ratio_max, 1.5);
    let ratios = [1.5f64, 0.5, 0.9, 1.1];
    let klb = ratios.iter().map(|r| r - 1.0 - r.ln()).sum::<f64>() / 4.0;
    close(m.kl_behaviour, klb);
    let ess = 16.0 / (4.0 * ratios.iter().map(|r| r * r).sum::<f64>());
    close(m.ess, ess);
    close(m.masked_frac, 0.0);
    assert_eq!(m.kl_ref, None);
    assert_eq!(m.entropy, None);
    let names: Vec<&str> = m.pairs().iter().map(|p| p.0).collect();
    for n in [
        "clip_frac",
        "clip_frac/low",
        "clip_frac/high",
        "ratio/mean",
        "ratio/min",
        "ratio/max",
    ] {
        assert!(names.contains(&n));
    }
    for n in [
        "kl_behaviour",
        "kl_ref",
        "entropy",
        "ess",
        "zero_std_frac",
        "masked_frac",
    ] {
        assert!(names.contains(&n));
    }
}

#[test]
fn ratio_is_one_on_policy() {
    // DESIGN.md sections 3 and 5: at staleness 0 with ℓ = ℓ_old the ratio is exactly 1: nothing clipped, KL 0, ESS 1.
    let lp = [-0.3, -1.2, -2.0, -0.01, -5.0, -0.7];
    let a = alg(|_| {});
    let m = tiny(&a, &lp, &lp, &[1.0, -1.0, 0.5]).finalise(None);
    assert_eq!(m.ratio_min, Some(1.0));
    assert_eq!(m.ratio_max, Some(1.0));
    assert_eq!(m.clip_frac, Some(0.0));
    assert_eq!(m.kl_behaviour, Some(0.0));
    assert_eq!(m.ess, Some(1.0));
}

#[test]
fn padding_may_hold_anything() {
    let dev = Device::Cpu;
    let lp = Var::from_vec(vec![-0.5, f64::NEG_INFINITY, -1.0, f64::NAN], (2, 2), &dev).unwrap();
    let old = Tensor::from_vec(vec![-0.4, f64::NEG_INFINITY, -1.1, 3.0], (2, 2), &dev).unwrap();
    let mask = Tensor::from_vec(vec![1.0, 0.0, 1.0, 0.0], (2, 2), &dev).unwrap();
    let adv = Tensor::new(&[1.0, -1.0], &dev).unwrap();
    for preset in [
        "grpo",
        "gspo",
        "cispo",
        "rec_ring_is",
        "opmd",
        "asymre",
        "red_weight",
    ] {
        let mut a = AlgorithmConfig::empty(preset).resolve().unwrap();
        a.kl.coef = 0.1;
        let inputs = LossInputs {
            logp: lp.as_tensor(),
            logp_behaviour: &old,
            logp_ref: Some(&old),
            entropy: None,
            mask: &mask,
            advantages: &adv,
            row_weights: &[0.5, 0.5],
            is_weights: None,
        };
        let (loss, st) = policy_loss(&a, &inputs).unwrap();
        assert!(loss.to_scalar::<f64>().unwrap().is_finite(), "{preset}");
        let g = loss
            .backward()
            .unwrap()
            .get(lp.as_tensor())
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        assert!(g.iter().flatten().all(|v| v.is_finite()), "{preset}: {g:?}");
        assert_eq!((g[0][1], g[1][1]), (0.0, 0.0));
        assert!(st.ratio_max.is_finite());
    }
}

#[test]
fn shape_and_input_errors_name_the_problem() {
    let dev = Device::Cpu;
    let a = alg(|_| {});
    let x = Tensor::zeros((2, 3), candle_core::DType::F32, &dev).unwrap();
    let bad = Tensor::zeros((2, 4), candle_core::DType::F32, &dev).unwrap();
    let adv = Tensor::zeros(2, candle_core::DType::F32, &dev).unwrap();
    let mk = |old: &Tensor, w: &[f64]| {
        policy_loss(
            &a,
            &LossInputs {
                logp: &x,
                logp_behaviour: old,
                logp_ref: None,
                entropy: None,
                mask: &x,
                advantages: &adv,
                row_weights: w,
                is_weights: None,
            },
        )
        .map(|_| ())
        .unwrap_err()
        .to_string()
    };
    let e = mk(&bad, &[0.5, 0.5]);
    assert!(
        e.contains("logp_behaviour") && e.contains("[2, 4]") && e.contains("[2, 3]"),
        "{e}"
    );
    assert!(mk(&x, &[1.0]).contains("row_weights"));
    let mut k = a.clone();
    k.kl.coef = 0.1;
    let e = policy_loss(
        &k,
        &LossInputs {
            logp: &x,
            logp_behaviour: &x,
            logp_ref: None,
            entropy: None,
            mask: &x,
            advantages: &adv,
            row_weights: &[0.5, 0.5],
            is_weights: None,
        },
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(e.contains("logp_ref"), "{e}");
}

#[test]
fn f32_inputs_work() {
    let dev = Device::Cpu;
    let lp = Var::from_vec(vec![-0.5f32, -0.2, -1.0, -2.0], (2, 2), &dev).unwrap();
    let old = Tensor::from_vec(vec![-0.6f32, -0.2, -0.8, -2.5], (2, 2), &dev).unwrap();
    let mask = Tensor::from_vec(vec![1f32, 1.0, 1.0, 0.0], (2, 2), &dev).unwrap();
    let adv = Tensor::new(&[1.0f32, -1.0], &dev).unwrap();
    let a = AlgorithmConfig::default().resolve().unwrap();
    let (loss, _) = policy_loss(
        &a,
        &LossInputs {
            logp: lp.as_tensor(),
            logp_behaviour: &old,
            logp_ref: None,
            entropy: None,
            mask: &mask,
            advantages: &adv,
            row_weights: &[0.5, 1.0],
            is_weights: None,
        },
    )
    .unwrap();
    assert_eq!(loss.dtype(), candle_core::DType::F32);
    assert!(loss.backward().unwrap().get(lp.as_tensor()).is_some());
}

#[test]
fn bf16_inputs_are_computed_in_f32() {
    let dev = Device::Cpu;
    let dt = candle_core::DType::BF16;
    let lp = Var::from_tensor(
        &Tensor::new(&[[-0.5f32, -0.2], [-1.0, -2.0]], &dev)
            .unwrap()
            .to_dtype(dt)
            .unwrap(),
    )
    .unwrap();
    let old = Tensor::new(&[[-0.6f32, -0.2], [-0.8, -2.5]], &dev)
        .unwrap()
        .to_dtype(dt)
        .unwrap();
    let mask = Tensor::new(&[[1f32, 1.0], [1.0, 0.0]], &dev)
        .unwrap()
        .to_dtype(dt)
        .unwrap();
    let adv = Tensor::new(&[1.0f32, -1.0], &dev)
        .unwrap()
        .to_dtype(dt)
        .unwrap();
    let a = AlgorithmConfig::empty("gspo").resolve().unwrap();
    let (loss, st) = policy_loss(
        &a,
        &LossInputs {
            logp: lp.as_tensor(),
            logp_behaviour: &old,
            logp_ref: None,
            entropy: None,
            mask: &mask,
            advantages: &adv,
            row_weights: &[0.5, 0.5],
            is_weights: None,
        },
    )
    .unwrap();
    assert_eq!(loss.dtype(), candle_core::DType::F32);
    let g = loss.backward().unwrap();
    assert_eq!(g.get(lp.as_tensor()).unwrap().dtype(), dt);
    assert_eq!(st.tokens, 3.0);
}

/// Finite differences for the variants with stop-gradients (detached IS weights, CISPO's weight, the
/// ratio-weighted KL): moving ℓ_t and ℓ_old,t together by ±h keeps every detached ratio (and keep-mask)
/// fixed, so the difference quotient is exactly the surrogate gradient autograd must give.
#[test]
fn finite_difference_gradients_with_detached_weights() {
    let mut variants: Vec<(String, Algorithm)> = vec![];
    let mut add = |name: String, f: &dyn Fn(&mut AlgorithmConfig)| {
        let mut c = AlgorithmConfig::empty("none");
        f(&mut c);
        variants.push((name, c.resolve().unwrap()));
    };
    for km in [
        KeepMask::None,
        KeepMask::OneSide,
        KeepMask::TwoSide,
        KeepMask::Ring,
        KeepMask::GspoOneSide,
    ] {
        for rw in [RecWeight::Is, RecWeight::SeqIs] {
            for cap in [None, Some(1.2)] {
                add(format!("rec_{km:?}_{rw:?}_cap{cap:?}"), &|c| {
                    c.loss = Some(PolicyLoss::Rec);
                    c.keep_mask = Some(km);
                    c.rec_weight = Some(rw);
                    c.is_cap = cap;
                });
            }
        }
    }
    add("cispo".into(), &|c| c.loss = Some(PolicyLoss::Cispo));
    add("cispo_cap".into(), &|c| {
        c.loss = Some(PolicyLoss::Cispo);
        c.is_cap = Some(1.1);
    });
    for est in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
        add(format!("reinforce_kl_{est:?}_weighted"), &|c| {
            c.loss = Some(PolicyLoss::Reinforce);
            c.kl_coef = Some(0.3);
            c.kl_estimator = Some(est);
            c.kl_ratio_weighted = Some(true);
        });
    }
    let bt = batch(5, 6, 91);
    let h = 1e-6;
    for (name, a) in &variants {
        let (_, g) = full(a, &bt);
        assert!(g.iter().any(|v| v.abs() > 1e-4), "{name}: zero gradient");
        for (k, &gk) in g.iter().enumerate() {
            let mut p = batch(5, 6, 91);
            p.logp[k] += h;
            p.old[k] += h;
            let (lp, _) = full(a, &p);
            p.logp[k] -= 2.0 * h;
            p.old[k] -= 2.0 * h;
            let (lm, _) = full(a, &p);
            let fd = (lp - lm) / (2.0 * h);
            assert!(
                (fd - gk).abs() < 1e-6 * (1.0 + fd.abs()),
                "{name} [{k}]: fd {fd} vs autograd {gk}"
            );
        }
    }
}

/// CISPO's cap C = 1 + clip_high at 1.28 (the preset), 3 and 5 (TRL's recommended
/// `epsilon_high = 5`, issue 47): loss −(1/B)·Σ min(ρ, C)·A·ℓ and ℓ-gradient −min(ρ, C)·A/B, each
/// written out by hand for one-token rows with ℓ_old = 0 (so ρ = e^ℓ), and the capped fraction.
#[test]
fn cispo_caps_above_two_by_hand() {
    let ratios = [0.5f64, 1.2, 2.0, 4.0, 6.0];
    let adv = [1.0f64, -1.0, 2.0, -0.5, 1.5];
    let b = ratios.len() as f64;
    for (clip_high, cap) in [(0.28, 1.28), (2.0, 3.0), (4.0, 5.0)] {
        let mut c = AlgorithmConfig::empty("cispo");
        c.clip_high = Some(clip_high);
        let a = c.resolve().unwrap();
        let dev = Device::Cpu;
        let lp: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
        let logp = Var::from_vec(lp.clone(), (5, 1), &dev).unwrap();
        let old = Tensor::zeros((5, 1), candle_core::DType::F64, &dev).unwrap();
        let mask = Tensor::ones((5, 1), candle_core::DType::F64, &dev).unwrap();
        let av = Tensor::new(&adv[..], &dev).unwrap();
        let w = vec![1.0 / b; 5];
        let (loss, stats) = policy_loss(
            &a,
            &LossInputs {
                logp: logp.as_tensor(),
                logp_behaviour: &old,
                logp_ref: None,
                entropy: None,
                mask: &mask,
                advantages: &av,
                row_weights: &w,
                is_weights: None,
            },
        )
        .unwrap();
        // By hand: the capped weights at C = 1.28 are [0.5, 1.2, 1.28, 1.28, 1.28]; at C = 3
        // [0.5, 1.2, 2, 3, 3]; at C = 5 [0.5, 1.2, 2, 4, 5].
        let capped = |r: f64| if r > cap { cap } else { r };
        let want_loss = -(0..5)
            .map(|i| capped(ratios[i]) * adv[i] * lp[i])
            .sum::<f64>()
            / b;
        let got = loss.to_scalar::<f64>().unwrap();
        assert!(
            (got - want_loss).abs() < 1e-12,
            "C={cap}: {got} vs {want_loss}"
        );
        let g = loss.backward().unwrap();
        let grad = g
            .get(logp.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        for i in 0..5 {
            let want = -capped(ratios[i]) * adv[i] / b;
            assert!(
                (grad[i] - want).abs() < 1e-12,
                "C={cap} row {i}: {} vs {want}",
                grad[i]
            );
        }
        let n_capped = ratios.iter().filter(|&&r| r > cap).count() as f64;
        let m = stats.finalise(None);
        assert!(
            (m.clip_frac_high.unwrap() - n_capped / b).abs() < 1e-12,
            "C={cap}"
        );
    }
}

/// verl's dual-clip share (`actor/pg_clipfrac_lower`, rlvr's `clip_frac/dual`) and the PG term's
/// part of the loss (`pg_loss`), counted and summed by hand on six one-token rows (weights 1/6).
#[test]
fn dual_clip_share_and_pg_loss_by_hand() {
    let close = |x: Option<f64>, y: f64| assert!((x.unwrap() - y).abs() < 1e-12, "{x:?} vs {y}");
    // A < 0 at ρ = 4 and 3.5: above c = 3, the dual clip's bound −c·A acts (3 and 1.5). A < 0 at
    // ρ = 2: −ρA = 2, neither clip acts. A > 0 at ρ = 4: clipped high, −1.2·A = −1.2. A < 0 at
    // ρ = 0.5: clipped low, −0.8·A = 0.8. A > 0 at ρ = 1: −1.
    let ratios = [4.0f64, 3.5, 2.0, 4.0, 0.5, 1.0];
    let adv = [-1.0, -0.5, -1.0, 1.0, -1.0, 1.0];
    let lp: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    let dual = alg(|c| c.dual_clip = Some(3.0)); // PPO 0.2/0.2
    let m = tiny(&dual, &lp, &[0.0; 6], &adv).finalise(None);
    close(m.clip_frac_dual, 2.0 / 6.0);
    close(m.clip_frac_high, 3.0 / 6.0); // the dual-clipped tokens count as high too
    close(m.clip_frac_low, 1.0 / 6.0);
    close(Some(m.pg_loss), (3.0 + 1.5 + 2.0 - 1.2 + 0.8 - 1.0) / 6.0);
    assert_eq!(m.reg_loss, 0.0);
    assert_eq!(m.loss, m.pg_loss);
    let names: Vec<&str> = m.pairs().iter().map(|p| p.0).collect();
    assert_eq!(
        names[names.len() - 3..],
        ["pg_loss", "reg_loss", "clip_frac/dual"]
    );
    // Without a dual clip the share is undefined (null), and −ρA stands: 4 and 1.75.
    let m = tiny(&alg(|_| {}), &lp, &[0.0; 6], &adv).finalise(None);
    assert_eq!(m.clip_frac_dual, None);
    close(m.clip_frac_high, 1.0 / 6.0);
    close(Some(m.pg_loss), (4.0 + 1.75 + 2.0 - 1.2 + 0.8 - 1.0) / 6.0);
    // GSPO's dual clip acts on the sequence ratio: one row of two tokens at ρ = 4 (s = 4), A < 0.
    let gspo = alg(|c| {
        c.loss = Some(PolicyLoss::Gspo);
        c.dual_clip = Some(3.0);
    });
    let m = tiny(&gspo, &[4f64.ln(), 4f64.ln()], &[0.0; 2], &[-1.0]).finalise(None);
    close(m.clip_frac_dual, 1.0);
}

/// `pg_loss` + `reg_loss` = `loss`, with OPMD's τx², a k3 KL penalty and an entropy bonus all on:
/// `reg_loss` by hand, and `pg_loss` bit for bit the loss of the same PG term without them.
#[test]
fn pg_loss_and_reg_loss_add_up_to_the_loss() {
    let dev = Device::Cpu;
    let (b, t) = (2, 2);
    let logp = [-0.5, -1.0, -0.2, -2.0];
    let old = [-0.6, -0.7, -0.2, -2.5];
    let refp = [-0.4, -1.3, -0.1, -2.2];
    let ent = [0.9, 1.4, 0.3, 2.0];
    let adv = [0.7, -0.4];
    let w = [0.3, 0.2];
    let run = |a: &Algorithm| {
        let tensor = |v: &[f64]| Tensor::from_vec(v.to_vec(), (b, t), &dev).unwrap();
        let (lp, o, r, e) = (tensor(&logp), tensor(&old), tensor(&refp), tensor(&ent));
        let m = Tensor::ones((b, t), candle_core::DType::F64, &dev).unwrap();
        let av = Tensor::new(&adv[..], &dev).unwrap();
        let inputs = LossInputs {
            logp: &lp,
            logp_behaviour: &o,
            logp_ref: Some(&r),
            entropy: Some(&e),
            mask: &m,
            advantages: &av,
            row_weights: &w,
            is_weights: None,
        };
        let (loss, st) = policy_loss(a, &inputs).unwrap();
        (loss.to_scalar::<f64>().unwrap(), st.finalise(None))
    };
    let (tau, beta, c_h) = (0.1, 0.05, 0.01);
    let with = alg(|c| {
        c.regulariser = Some(Regulariser::Opmd);
        c.tau = Some(tau);
        c.kl_coef = Some(beta);
        c.kl_estimator = Some(KlEstimator::K3);
        c.entropy_coef = Some(c_h);
    });
    let (loss, m) = run(&with);
    assert_eq!(m.loss, loss);
    let mut want = 0.0;
    for (i, wi) in w.iter().enumerate() {
        for j in 0..t {
            let k = i * t + j;
            let x = logp[k] - old[k];
            let xr = refp[k] - logp[k];
            let k3 = xr.exp() - xr - 1.0;
            want += wi * (tau * x * x + beta * k3 - c_h * ent[k]);
        }
    }
    assert!(
        (m.reg_loss - want).abs() < 1e-12,
        "{} vs {want}",
        m.reg_loss
    );
    assert!(m.reg_loss.abs() > 1e-3);
    assert!((m.pg_loss + m.reg_loss - m.loss).abs() < 1e-12, "{m:?}");
    let (plain_loss, plain) = run(&alg(|_| {}));
    assert_eq!(m.pg_loss, plain_loss);
    assert_eq!(plain.pg_loss, plain_loss);
    assert_eq!(plain.reg_loss, 0.0);
}
