//! The verdict logic on synthetic summaries: for each claim (A1, B1–B4) a supported, a
//! not-supported and an inconclusive case; plus the standard errors and the area under the curve.

use rlvr_lab::summary::{arm_stats, mean_area, Estimate, RunSummary};
use rlvr_lab::verdict::{judge, verdicts, Status, Test, Verdict, MARGIN};

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
        ratio_min: Some(1.0),
        ratio_max: Some(1.0),
        entropy: Some(0.5),
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
fn b4_red_beats_reinforce_under_staleness() {
    let mk = |red: f64, seeds: usize| {
        let mut r = Vec::new();
        arm(&mut r, "reinforce_v16", "reinforce", 16, 0.05, seeds);
        arm(&mut r, "red_drop_v16", "red_drop", 16, red, seeds);
        arm(
            &mut r,
            "red_weight_v16",
            "red_weight",
            16,
            red + 0.01,
            seeds,
        );
        r
    };
    assert_eq!(status(&mk(0.30, 3), "B4"), Status::Supported);
    assert_eq!(status(&mk(0.04, 3), "B4"), Status::NotSupported);
    // One seed: +4 and +5 points with SE ≈ √(.09·.91/500 + .05·.95/500) ≈ 1.6 points: lower bounds
    // under m, upper bounds over it.
    assert_eq!(status(&mk(0.09, 1), "B4"), Status::Inconclusive);
}

#[test]
fn a_missing_arm_makes_a_claim_inconclusive_and_named() {
    let mut r = Vec::new();
    arm(&mut r, "reinforce_v16", "reinforce", 16, 0.05, 3);
    arm(&mut r, "red_drop_v16", "red_drop", 16, 0.30, 3);
    let v = verdict_of(&r, "B4");
    assert_eq!(v.status, Status::Inconclusive);
    assert!(v.note.contains("red_weight"), "{}", v.note);
    assert_eq!(v.comparisons.len(), 1);
    assert_eq!(v.comparisons[0].status, Status::Supported);
    for c in ["A1", "B1", "B2", "B3"] {
        assert_eq!(status(&r, c), Status::Inconclusive, "{c}");
    }
    // One not-supported comparison decides even with an arm missing.
    let mut r = Vec::new();
    arm(&mut r, "reinforce_v16", "reinforce", 16, 0.30, 3);
    arm(&mut r, "red_drop_v16", "red_drop", 16, 0.30, 3);
    assert_eq!(status(&r, "B4"), Status::NotSupported);
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

/// Paired by seed: with the warm start's seed-to-seed spread in every arm (as in a real sweep),
/// the unpaired SE hides a difference that every seed shows; the paired test sees it, both ways.
#[test]
fn paired_by_seed_sees_what_the_warm_start_spread_hides() {
    let base = [0.37, 0.51, 0.45];
    let mk = |v4: [f64; 3], v16: [f64; 3]| {
        let mut r = Vec::new();
        for s in 0..3 {
            let warm = base[s] - 0.25;
            r.push(run("grpo_v1", "grpo", 1, s as u64, base[s], warm));
            r.push(run(
                "grpo_v4",
                "off_policy_grpo",
                4,
                s as u64,
                base[s] + v4[s],
                warm,
            ));
            r.push(run(
                "grpo_v16",
                "off_policy_grpo",
                16,
                s as u64,
                base[s] + v16[s],
                warm,
            ));
        }
        r
    };
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
