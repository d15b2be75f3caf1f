//! The verdict logic on synthetic summaries: for each claim (A1, B1–B3, B4a, B4b) a supported, a
//! not-supported and an inconclusive case; plus the standard errors and the area under the curve.

use rlvr_lab::summary::{arm_stats, mean_area, Estimate, RunSummary};
use rlvr_lab::verdict::{judge, t_quantile_975, verdicts, Status, Test, Verdict, MARGIN};

/// A finished run of `arm` (`preset` at `interval`) with final accuracy `acc` and warm start `warm`.
fn run(arm: &str, preset: &str, interval: u64, seed: u64, acc: f64, warm: f64) -> RunSummary {
    RunSummary {
        arm: arm.into(),
        label: preset.into(),
        preset: preset.into(),
        interval,
        offset: 0,
        seed,
        run_dir: format!("/nonexistent/{arm}/seed-{seed}"),
        done: true,
        steps: 300,
        final_accuracy: Some(acc),
        final_step: Some(300),
        best_accuracy: Some(acc.max(warm)),
        auc: Some(0.5 * (acc + warm)),
        warm_accuracy: Some(warm),
        eval_n: Some(500),
        wall_s: 60.0,
        clip_frac: Some(0.0),
        clip_frac_mean: None,
        ratio_min: Some(1.0),
        ratio_max: Some(1.0),
        ratio_min_run: None,
        ratio_max_run: None,
        entropy: Some(0.5),
        drift: None,
    }
}

/// Three seeds at `acc` − 0.005, `acc`, `acc` + 0.005 (std 0.005, SE 0.0029), or one seed at `acc`.
fn arm(out: &mut Vec<RunSummary>, name: &str, preset: &str, v: u64, acc: f64, seeds: usize) {
    let d = [0.0, -0.005, 0.005];
    for (s, delta) in d.iter().enumerate().take(seeds) {
        out.push(run(name, preset, v, s as u64, acc + delta, 0.20));
    }
}

fn verdict_of(runs: &[RunSummary], claim: &str) -> Verdict {
    verdicts(&arm_stats(runs), MARGIN)
        .into_iter()
        .find(|v| v.claim == claim)
        .unwrap()
}

fn status(runs: &[RunSummary], claim: &str) -> Status {
    verdict_of(runs, claim).status
}

#[test]
fn a1_off_policy_grpo_not_worse() {
    let mk = |v4: f64, v16: f64, seeds: usize| {
        let mut r = Vec::new();
        arm(&mut r, "grpo_v1", "grpo", 1, 0.30, seeds);
        arm(&mut r, "grpo_v4", "off_policy_grpo", 4, v4, seeds);
        arm(&mut r, "grpo_v16", "off_policy_grpo", 16, v16, seeds);
        r
    };
    assert_eq!(status(&mk(0.31, 0.30, 3), "A1"), Status::Supported);
    // Interval 16 ten points worse: the opposite, beyond m and 2 SE.
    assert_eq!(status(&mk(0.31, 0.20, 3), "A1"), Status::NotSupported);
    // One seed: SE = √(2·0.3·0.7/500) ≈ 2.9 points, so −2 points is neither.
    assert_eq!(status(&mk(0.28, 0.28, 1), "A1"), Status::Inconclusive);
    let v = verdict_of(&mk(0.28, 0.28, 1), "A1");
    assert_eq!(v.comparisons.len(), 2);
    let c = &v.comparisons[0];
    assert_eq!((c.a.as_str(), c.b.as_str()), ("grpo_v4", "grpo_v1"));
    assert!((c.diff + 0.02).abs() < 1e-12);
    let se = ((0.28 * 0.72 + 0.3 * 0.7) / 500.0_f64).sqrt();
    assert!((c.se - se).abs() < 1e-12, "{} vs {se}", c.se);
}

#[test]
fn b1_reinforce_degrades_at_the_harshest_interval() {
    let mk = |v64: f64, seeds: usize| {
        let mut r = Vec::new();
        arm(&mut r, "reinforce_v1", "reinforce", 1, 0.30, seeds);
        // Interval 16 is fine; the claim uses the harshest interval (64).
        arm(&mut r, "reinforce_v16", "reinforce", 16, 0.30, seeds);
        arm(&mut r, "reinforce_v64", "reinforce", 64, v64, seeds);
        r
    };
    assert_eq!(status(&mk(0.05, 3), "B1"), Status::Supported);
    assert_eq!(
        verdict_of(&mk(0.05, 3), "B1").comparisons[0].b,
        "reinforce_v64"
    );
    assert_eq!(status(&mk(0.30, 3), "B1"), Status::NotSupported);
    assert_eq!(status(&mk(0.26, 1), "B1"), Status::Inconclusive);
}

#[test]
fn b2_rec_oneside_is_and_nois_agree() {
    let mk = |is: f64, seeds: usize| {
        let mut r = Vec::new();
        arm(&mut r, "nois", "rec_oneside_nois", 16, 0.30, seeds);
        arm(&mut r, "is", "rec_oneside_is", 16, is, seeds);
        r
    };
    assert_eq!(status(&mk(0.305, 3), "B2"), Status::Supported);
    assert_eq!(status(&mk(0.15, 3), "B2"), Status::NotSupported);
    // One seed: equal means, but 2 SE (5.8 points) exceed the margin.
    assert_eq!(status(&mk(0.30, 1), "B2"), Status::Inconclusive);
}

#[test]
fn b3_opmd_and_asymre_do_not_collapse() {
    // Warm start 20% in every run.
    let mk = |opmd: f64, asymre: f64, seeds: usize| {
        let mut r = Vec::new();
        arm(&mut r, "opmd_v16", "opmd", 16, 0.05, seeds);
        arm(&mut r, "opmd_v64", "opmd", 64, opmd, seeds);
        arm(&mut r, "asymre_v64", "asymre", 64, asymre, seeds);
        r
    };
    // opmd at 16 collapsed, but the claim is about the harshest interval.
    assert_eq!(status(&mk(0.30, 0.28, 3), "B3"), Status::Supported);
    assert_eq!(status(&mk(0.02, 0.28, 3), "B3"), Status::NotSupported);
    assert_eq!(status(&mk(0.18, 0.25, 1), "B3"), Status::Inconclusive);
    let v = verdict_of(&mk(0.30, 0.28, 3), "B3");
    assert_eq!(v.comparisons[0].a, "opmd_v64");
    assert!((v.comparisons[0].est_b.mean - 0.20).abs() < 1e-12);
}

#[test]
fn b4a_red_weight_and_b4b_red_drop_each_judged_against_reinforce() {
    let mk = |drop: f64, weight: f64, seeds: usize| {
        let mut r = Vec::new();
        arm(&mut r, "reinforce_v16", "reinforce", 16, 0.05, seeds);
        arm(&mut r, "red_drop_v16", "red_drop", 16, drop, seeds);
        arm(
            &mut r,
            "red_drop_bernoulli_v16",
            "red_drop_bernoulli",
            16,
            drop + 0.01,
            seeds,
        );
        arm(&mut r, "red_weight_v16", "red_weight", 16, weight, seeds);
        r
    };
    // Both beat REINFORCE by far more than m + 2 SE.
    assert_eq!(status(&mk(0.30, 0.30, 3), "B4a"), Status::Supported);
    assert_eq!(status(&mk(0.30, 0.30, 3), "B4b"), Status::Supported);
    // The default sweep's pattern: RED-Drop collapses with REINFORCE, RED-Weight does not; the two
    // claims now say so separately instead of one B4 "not supported".
    let r = mk(0.04, 0.36, 3);
    assert_eq!(status(&r, "B4a"), Status::Supported);
    assert_eq!(status(&r, "B4b"), Status::NotSupported);
    let b = verdict_of(&r, "B4b");
    let pairs: Vec<(&str, &str)> = b
        .comparisons
        .iter()
        .map(|c| (c.a.as_str(), c.b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("red_drop_v16", "reinforce_v16"),
            ("red_drop_bernoulli_v16", "reinforce_v16")
        ]
    );
    let a = verdict_of(&r, "B4a");
    assert_eq!(a.comparisons.len(), 1);
    assert_eq!(a.comparisons[0].a, "red_weight_v16");
    assert!((a.comparisons[0].diff - 0.31).abs() < 1e-12);
    // One seed: +4 and +5 points with SE ≈ √(.09·.91/500 + .05·.95/500) ≈ 1.6 points: lower bounds
    // under m, upper bounds over it.
    assert_eq!(status(&mk(0.09, 0.09, 1), "B4a"), Status::Inconclusive);
    assert_eq!(status(&mk(0.09, 0.09, 1), "B4b"), Status::Inconclusive);
}

#[test]
fn a_missing_arm_makes_a_claim_inconclusive_and_named() {
    let mut r = Vec::new();
    arm(&mut r, "reinforce_v16", "reinforce", 16, 0.05, 3);
    arm(&mut r, "red_drop_v16", "red_drop", 16, 0.30, 3);
    // B4b: the first-written RED-Drop is missing.
    let v = verdict_of(&r, "B4b");
    assert_eq!(v.status, Status::Inconclusive);
    assert!(v.note.contains("red_drop_bernoulli"), "{}", v.note);
    assert_eq!(v.comparisons.len(), 1);
    assert_eq!(v.comparisons[0].status, Status::Supported);
    let v = verdict_of(&r, "B4a");
    assert!(v.note.contains("red_weight at interval 16"), "{}", v.note);
    for c in ["A1", "B1", "B2", "B3", "B4a"] {
        assert_eq!(status(&r, c), Status::Inconclusive, "{c}");
    }
    // One not-supported comparison decides even with an arm missing.
    let mut r = Vec::new();
    arm(&mut r, "reinforce_v16", "reinforce", 16, 0.30, 3);
    arm(&mut r, "red_drop_v16", "red_drop", 16, 0.30, 3);
    assert_eq!(status(&r, "B4b"), Status::NotSupported);
}

#[test]
fn a1_takes_the_sync_offset_arm_when_the_sweep_has_one() {
    let mut r = Vec::new();
    arm(&mut r, "grpo_v1", "grpo", 1, 0.30, 3);
    arm(&mut r, "grpo_v4", "off_policy_grpo", 4, 0.30, 3);
    arm(&mut r, "grpo_v16", "off_policy_grpo", 16, 0.30, 3);
    assert_eq!(verdict_of(&r, "A1").comparisons.len(), 2);
    // Offset 1 at interval 1, twenty points worse: A1 not supported, and the on-policy side is
    // still the offset-0 arm.
    let mut o = Vec::new();
    arm(&mut o, "grpo_v1_o1", "off_policy_grpo", 1, 0.10, 3);
    for x in &mut o {
        x.offset = 1;
    }
    r.extend(o);
    let v = verdict_of(&r, "A1");
    assert_eq!(v.comparisons.len(), 3);
    assert_eq!(v.comparisons[2].a, "grpo_v1_o1");
    assert_eq!(v.comparisons[2].b, "grpo_v1");
    assert_eq!(v.comparisons[2].status, Status::NotSupported);
    assert_eq!(v.status, Status::NotSupported);
}

#[test]
fn a_sweeps_own_claims_are_judged_by_arm_name() {
    use rlvr_lab::sweep::{ClaimSpec, CompareSpec};
    use rlvr_lab::verdict::claims;
    let mut r = Vec::new();
    arm(&mut r, "a", "reinforce", 16, 0.30, 3);
    arm(&mut r, "b", "reinforce", 16, 0.10, 3);
    arm(&mut r, "c", "reinforce", 16, 0.305, 3);
    let spec = |name: &str, cmp: &[(&str, Test, &str)]| ClaimSpec {
        name: name.into(),
        statement: format!("claim {name}"),
        compare: cmp
            .iter()
            .map(|(a, t, b)| CompareSpec {
                a: a.to_string(),
                test: *t,
                b: b.to_string(),
            })
            .collect(),
    };
    let specs = [
        spec("M1", &[("a", Test::Superior, "b")]),
        spec(
            "M2",
            &[("a", Test::Equivalent, "c"), ("b", Test::Superior, "a")],
        ),
        // b's warm start is 0.20 (see `run`): 0.10 is ten points below it.
        spec("M3", &[("b", Test::NonInferior, "warm_start")]),
        spec("M4", &[("a", Test::Superior, "nowhere")]),
    ];
    let vs = claims(&arm_stats(&r), &specs, MARGIN);
    let st: Vec<(&str, Status)> = vs.iter().map(|v| (v.claim.as_str(), v.status)).collect();
    assert_eq!(
        st,
        [
            ("M1", Status::Supported),
            ("M2", Status::NotSupported),
            ("M3", Status::NotSupported),
            ("M4", Status::Inconclusive)
        ]
    );
    assert_eq!(vs[1].comparisons[0].status, Status::Supported);
    assert_eq!(vs[2].comparisons[0].b, "warm start of b");
    assert!(vs[3].note.contains("arm nowhere"), "{}", vs[3].note);
    assert!((vs[0].comparisons[0].diff - 0.20).abs() < 1e-12);
    // verdicts.md names each test as the sweep file writes it, and round-trips through it.
    let md = rlvr_lab::verdict::markdown(&vs, MARGIN);
    assert!(md.contains("| superior: supported |"), "{md}");
    assert!(md.contains("| equivalent: supported |"), "{md}");
    assert!(md.contains("| non_inferior: not supported |"), "{md}");
    assert!(!md.contains("NonInferior"), "{md}");
    for t in [Test::NonInferior, Test::Superior, Test::Equivalent] {
        let v: Test = serde_json::from_value(serde_json::json!(t.name())).unwrap();
        assert_eq!(v, t);
    }
}

#[test]
fn claims_naming_unknown_arms_or_tests_are_refused() {
    use rlvr_lab::sweep::Sweep;
    let base = "[lab]\nseeds = [0]\nsteps = 2\n[[arm]]\nname = \"a\"\npreset = \"grpo\"\n\
                [[arm]]\nname = \"b\"\npreset = \"reinforce\"\n";
    let ok = format!(
        "{base}[[claim]]\nname = \"M1\"\nstatement = \"s\"\n\
         compare = [{{ a = \"a\", test = \"superior\", b = \"b\" }}, {{ a = \"b\", test = \"non_inferior\", b = \"warm_start\" }}]\n"
    );
    let s = Sweep::parse(&ok).unwrap();
    assert_eq!(s.claims.len(), 1);
    assert_eq!(s.claims[0].compare[1].test, Test::NonInferior);
    // --only may leave a claim's arm out: not an error (the claim is then inconclusive).
    assert!(s.clone().select(false, &["a".into()]).is_ok());
    let err = |t: String| format!("{:#}", Sweep::parse(&t).unwrap_err());
    let e = err(ok.replace("b = \"b\"", "b = \"zz\""));
    assert!(
        e.contains("[[claim]] `M1`: compare[0].b names `zz`, which is no [[arm]] (arms: a, b; or `warm_start`)"),
        "{e}"
    );
    let e = err(ok.replace("a = \"a\"", "a = \"warm_start\""));
    assert!(e.contains("compare[0].a names `warm_start`"), "{e}");
    let e = err(ok.replace("\"superior\"", "\"better\""));
    assert!(e.contains("better") && e.contains("superior"), "{e}");
    let e = err(ok.replace("b = \"b\"", "b = \"a\""));
    assert!(e.contains("compares `a` with itself"), "{e}");
    let e = err(format!("{ok}{}", &ok[ok.find("[[claim]]").unwrap()..]));
    assert!(e.contains("[[claim]] `M1` appears twice"), "{e}");
    let e = err(base.replace("steps = 2", "steps = 2\npaper_claims = false"));
    assert!(e.contains("paper_claims = false and no [[claim]]"), "{e}");
}

#[test]
fn window_drift_reads_kl_at_the_last_step_of_each_window() {
    use rlvr_lab::summary::{window_drift, window_end};
    // v = 4, o = 0: steps 4, 8; v = 4, o = 1: steps 5, 9 (staleness 1..4, the stalest at 5, 9).
    let ends: Vec<u64> = (1..=10).filter(|&t| window_end(t, 4, 0)).collect();
    assert_eq!(ends, [4, 8]);
    let ends: Vec<u64> = (1..=10).filter(|&t| window_end(t, 4, 1)).collect();
    assert_eq!(ends, [5, 9]);
    let ends: Vec<u64> = (1..=3).filter(|&t| window_end(t, 1, 1)).collect();
    assert_eq!(ends, [2, 3]);
    let lines: Vec<rlvr_rundir::jsonl::Line> = (0..=9)
        .map(|t| {
            let kl = if t == 0 {
                serde_json::Value::Null
            } else {
                serde_json::json!(t as f64 / 100.0)
            };
            let line = serde_json::json!({"step": t, "kl_behaviour": kl});
            line.as_object().unwrap().clone()
        })
        .collect();
    // (0.04 + 0.08) / 2 and (0.05 + 0.09) / 2.
    assert!((window_drift(&lines, 4, 0).unwrap() - 0.06).abs() < 1e-12);
    assert!((window_drift(&lines, 4, 1).unwrap() - 0.07).abs() < 1e-12);
    assert_eq!(window_drift(&lines[..3], 4, 0), None);
    // Per arm: mean ± std over seeds.
    let mut r = Vec::new();
    arm(&mut r, "x", "reinforce", 4, 0.3, 3);
    for (i, x) in r.iter_mut().enumerate() {
        x.drift = Some([0.01, 0.02, 0.03][i]);
    }
    let d = arm_stats(&r)[0].drift.unwrap();
    assert!((d.mean - 0.02).abs() < 1e-12 && (d.std - 0.01).abs() < 1e-12 && d.n == 3);
}

#[test]
fn judge_bounds() {
    let m = 0.03;
    // Just inside the margin is inconclusive.
    assert_eq!(judge(Test::Superior, 0.0499, 0.01, m), Status::Inconclusive);
    assert_eq!(judge(Test::Superior, 0.0501, 0.01, m), Status::Supported);
    assert_eq!(judge(Test::Superior, 0.0099, 0.01, m), Status::NotSupported);
    assert_eq!(
        judge(Test::NonInferior, -0.0099, 0.01, m),
        Status::Supported
    );
    assert_eq!(
        judge(Test::NonInferior, -0.0501, 0.01, m),
        Status::NotSupported
    );
    assert_eq!(judge(Test::Equivalent, 0.0, 0.0149, m), Status::Supported);
    assert_eq!(
        judge(Test::Equivalent, 0.0, 0.0151, m),
        Status::Inconclusive
    );
    assert_eq!(
        judge(Test::Equivalent, -0.0501, 0.01, m),
        Status::NotSupported
    );
}

#[test]
fn standard_errors_and_area() {
    // One seed: binomial SE of a 500-problem evaluation.
    let e = Estimate::of([Some(0.5)], 500).unwrap();
    assert!((e.se - (0.25f64 / 500.0).sqrt()).abs() < 1e-15);
    assert!((100.0 * e.se - 2.236).abs() < 1e-3);
    // Three seeds: std / √3 (sample std).
    let e = Estimate::of([Some(0.2), Some(0.3), Some(0.4)], 500).unwrap();
    assert!((e.mean - 0.3).abs() < 1e-12 && (e.std - 0.1).abs() < 1e-12);
    assert!((e.se - 0.1 / 3f64.sqrt()).abs() < 1e-12);
    // Trapezoid over uneven steps, divided by the span: (0.1+0.3)/2·10 + (0.3+0.3)/2·30 = 11 over 40.
    let a = mean_area(&[(0.0, 0.1), (10.0, 0.3), (40.0, 0.3)]).unwrap();
    assert!((a - 11.0 / 40.0).abs() < 1e-12);
    assert_eq!(mean_area(&[(5.0, 0.4)]), Some(0.4));
    assert_eq!(mean_area(&[]), None);
}

/// Final accuracies of on-policy GRPO per seed (0, 1, 2): a spread like a real sweep's warm starts.
const SEED_BASE: [f64; 3] = [0.37, 0.51, 0.45];

/// A1's three arms over seeds 0-2: on-policy GRPO at [`SEED_BASE`], intervals 4 and 16 at
/// `SEED_BASE + v4` and `SEED_BASE + v16` per seed, each seed's warm start 0.25 below its base.
fn grpo_a1_arms(v4: [f64; 3], v16: [f64; 3]) -> Vec<RunSummary> {
    let mut r = Vec::new();
    for s in 0..3 {
        let (b, warm) = (SEED_BASE[s], SEED_BASE[s] - 0.25);
        r.push(run("grpo_v1", "grpo", 1, s as u64, b, warm));
        r.push(run(
            "grpo_v4",
            "off_policy_grpo",
            4,
            s as u64,
            b + v4[s],
            warm,
        ));
        r.push(run(
            "grpo_v16",
            "off_policy_grpo",
            16,
            s as u64,
            b + v16[s],
            warm,
        ));
    }
    r
}

/// Paired by seed: with the warm start's seed-to-seed spread in every arm (as in a real sweep),
/// the unpaired SE hides a difference that every seed shows; the paired test sees it, both ways.
#[test]
fn paired_by_seed_sees_what_the_warm_start_spread_hides() {
    let base = SEED_BASE;
    let mk = grpo_a1_arms;
    // Off-policy within a point of on-policy on every seed.
    let v = verdict_of(&mk([0.02, 0.03, 0.025], [0.0, 0.01, -0.005]), "A1");
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    assert_eq!(v.paired_status, Some(Status::Supported), "{v:?}");
    let p = v.comparisons[0].paired.unwrap();
    assert_eq!(p.n, 3);
    assert!((p.diff - 0.025).abs() < 1e-12, "{p:?}");
    // sd of (0.02, 0.03, 0.025) = 0.005, SE = 0.005/√3.
    assert!((p.se - 0.005 / 3f64.sqrt()).abs() < 1e-12, "{p:?}");
    // Interval 16 six to seven points worse on every seed: the unpaired test cannot tell, the
    // paired one shows the opposite of the claim.
    let v = verdict_of(&mk([0.02, 0.03, 0.025], [-0.06, -0.07, -0.065]), "A1");
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    assert_eq!(v.paired_status, Some(Status::NotSupported), "{v:?}");
    // B3's warm-start comparison pairs each seed's final accuracy with its own warm start.
    let mut r = Vec::new();
    for s in 0..3u64 {
        r.push(run(
            "opmd_v64",
            "opmd",
            64,
            s,
            base[s as usize],
            base[s as usize] - 0.1,
        ));
        r.push(run(
            "asymre_v64",
            "asymre",
            64,
            s,
            base[s as usize],
            base[s as usize] - 0.1,
        ));
    }
    let v = verdict_of(&r, "B3");
    let p = v.comparisons[0].paired.unwrap();
    assert!((p.diff - 0.1).abs() < 1e-12 && p.se < 1e-12, "{p:?}");
    assert_eq!(v.paired_status, Some(Status::Supported));
    // One seed: no paired form.
    let mut r = Vec::new();
    arm(&mut r, "grpo_v1", "grpo", 1, 0.30, 1);
    arm(&mut r, "grpo_v4", "off_policy_grpo", 4, 0.31, 1);
    arm(&mut r, "grpo_v16", "off_policy_grpo", 16, 0.30, 1);
    let v = verdict_of(&r, "A1");
    assert!(v.comparisons.iter().all(|c| c.paired.is_none()));
    assert_eq!(v.paired_status, None);
}

/// Student's t 0.975 quantile against mpmath (30 digits: `findroot` of
/// `1 - betainc(n/2, 1/2, 0, n/(n+x²), regularized=True)/2 - 0.975`), odd and even df, small and large.
#[test]
fn student_t_quantile_matches_mpmath() {
    for (df, want) in [
        (1, 12.706204736174705),
        (2, 4.302652729749464),
        (3, 3.1824463052837096),
        (4, 2.7764451051977944),
        (9, 2.2621571627982055),
        (10, 2.228138851986275),
        (29, 2.0452296421327043),
        (30, 2.042272456301238),
        (31, 2.0395134463964085),
        (100, 1.9839715185235523),
        (1000, 1.9623390808264085),
    ] {
        let got = t_quantile_975(df);
        assert!((got - want).abs() < 1e-9, "df {df}: {got} vs {want}");
    }
}

/// The paired test spans Student's t quantile, not two SE: with three seeds a difference whose
/// 2-SE interval clears the margin but whose 4.30-SE one does not is inconclusive.
#[test]
fn paired_by_seed_uses_students_t_at_three_seeds() {
    let r = grpo_a1_arms([0.02, 0.03, 0.025], [-0.01, 0.0, 0.02]);
    let v = verdict_of(&r, "A1");
    let p = v.comparisons[1].paired.unwrap();
    assert!(v.comparisons[1].a.contains("16"), "{v:?}");
    // d̄ = 1/300, sd = 0.015275, SE = 0.008819: 2 SE reach −0.0143 (clears −0.03), 4.30 SE −0.0346.
    assert!((p.diff - 1.0 / 300.0).abs() < 1e-12, "{p:?}");
    assert!((p.k - 4.302652729749464).abs() < 1e-9, "{p:?}");
    assert_eq!(
        judge(Test::NonInferior, p.diff, p.se, MARGIN),
        Status::Supported
    );
    assert_eq!(p.status, Status::Inconclusive, "{p:?}");
    assert_eq!(v.comparisons[0].paired.unwrap().status, Status::Supported);
    assert_eq!(v.paired_status, Some(Status::Inconclusive), "{v:?}");
}

#[test]
fn one_distinct_seed_per_arm_is_never_supported() {
    // One seed: interval 4 and 16 thirty points better than interval 1. The binomial SE (about
    // 3 points) would make A1 "supported"; one seed cannot support a claim.
    let mut one = Vec::new();
    arm(&mut one, "grpo_v1", "grpo", 1, 0.30, 1);
    arm(&mut one, "grpo_v4", "off_policy_grpo", 4, 0.60, 1);
    arm(&mut one, "grpo_v16", "off_policy_grpo", 16, 0.60, 1);
    let v = verdict_of(&one, "A1");
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    assert!(v.comparisons.iter().all(|c| c.few_seeds), "{v:?}");
    assert!(
        v.note
            .contains("fewer than 2 distinct seeds per arm in grpo_v4 vs grpo_v1"),
        "{}",
        v.note
    );
    // The same seed twice per arm (std 0, so SE 0 over "two seeds") is still one seed.
    let mut twice = one.clone();
    twice.extend(one.iter().cloned());
    let v = verdict_of(&twice, "A1");
    assert_eq!(v.status, Status::Inconclusive, "{v:?}");
    // Not supported is still judged with one seed (thirty points worse).
    let mut worse = Vec::new();
    arm(&mut worse, "grpo_v1", "grpo", 1, 0.60, 1);
    arm(&mut worse, "grpo_v4", "off_policy_grpo", 4, 0.30, 1);
    arm(&mut worse, "grpo_v16", "off_policy_grpo", 16, 0.30, 1);
    assert_eq!(status(&worse, "A1"), Status::NotSupported);
    // Two distinct seeds per arm: supported.
    let mut two = Vec::new();
    arm(&mut two, "grpo_v1", "grpo", 1, 0.30, 2);
    arm(&mut two, "grpo_v4", "off_policy_grpo", 4, 0.60, 2);
    arm(&mut two, "grpo_v16", "off_policy_grpo", 16, 0.60, 2);
    let v = verdict_of(&two, "A1");
    assert_eq!(v.status, Status::Supported, "{v:?}");
    assert!(v.note.is_empty(), "{}", v.note);
}

/// Every run of the compared arms at 0% held-out accuracy (a warm start that solves nothing, e.g.
/// `quickstart_args = ["--fast"]`): d = 0 ± 0 used to make A1 "supported", unpaired and paired,
/// although nothing told the arms apart. Now inconclusive, with a note; all at 100% likewise.
/// One arm off the floor is judged as before.
#[test]
fn arms_that_all_end_at_zero_accuracy_support_nothing() {
    let at = |v1: f64, v4: f64, v16: f64| {
        let mut r = Vec::new();
        for s in 0..3u64 {
            r.push(run("grpo_v1", "grpo", 1, s, v1, 0.0));
            r.push(run("grpo_v4", "off_policy_grpo", 4, s, v4, 0.0));
            r.push(run("grpo_v16", "off_policy_grpo", 16, s, v16, 0.0));
        }
        verdict_of(&r, "A1")
    };
    for x in [0.0, 1.0] {
        let v = at(x, x, x);
        assert_eq!(v.status, Status::Inconclusive, "{v:?}");
        assert_eq!(v.paired_status, Some(Status::Inconclusive), "{v:?}");
        assert!(v.comparisons.iter().all(|c| c.pinned), "{v:?}");
        assert!(
            v.note.contains("every run of grpo_v4 vs grpo_v1, grpo_v16 vs grpo_v1 ended at the same held-out accuracy"),
            "{}",
            v.note
        );
    }
    // The same zero spread one point apart is a measured difference: judged as before.
    let v = at(0.01, 0.0, 0.0);
    assert_eq!(v.status, Status::Supported, "{v:?}");
    assert!(v.comparisons.iter().all(|c| !c.pinned), "{v:?}");
}

#[test]
fn a_seed_listed_twice_is_refused_naming_the_sweep_file_and_arm() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("dup.toml");
    std::fs::write(
        &path,
        "[lab]\nseeds = [0, 1, 0]\nsteps = 2\n[[arm]]\nname = \"grpo_v1\"\npreset = \"grpo\"\n",
    )
    .unwrap();
    let args = rlvr_lab::LabArgs {
        sweep: Some(path.clone()),
        dry_run: true,
        ..Default::default()
    };
    let e = format!("{:#}", rlvr_lab::run(&args, &mut Vec::new()).unwrap_err());
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("[lab].seeds lists seed 0 twice")
            && e.contains("arm `grpo_v1`"),
        "{e}"
    );
    // [fast].seeds too.
    let fast = "[lab]\nseeds = [0]\nsteps = 2\n[fast]\nseeds = [3, 3]\nsteps = 1\narms = [\"a\"]\n\
                [[arm]]\nname = \"a\"\npreset = \"grpo\"\n";
    let e = format!("{:#}", rlvr_lab::sweep::Sweep::parse(fast).unwrap_err());
    assert!(e.contains("[fast].seeds lists seed 3 twice"), "{e}");
}
