//! The papers' claims, judged from the data (DESIGN.md section 12): verdicts.json and
//! verdicts.md.
//!
//! Every claim compares final held-out accuracies (the last evaluation): per arm the mean over
//! seeds and its standard error ([`Estimate`]: std/√n over n ≥ 2 seeds, the binomial SE of the
//! evaluation with one seed). A difference d = mean_a − mean_b has SE s = √(se_a² + se_b²). With
//! the margin m (3 points by default), each comparison is one of:
//! - **non-inferiority** "a is not worse than b by more than m" (d > −m): supported when
//!   d − 2s > −m, not supported when d + 2s < −m;
//! - **superiority** "a is better than b by more than m" (d > m): supported when d − 2s > m, not
//!   supported when d + 2s < m;
//! - **equivalence** "a and b are within m" (|d| < m): supported when −m < d − 2s and d + 2s < m,
//!   not supported when d − 2s > m or d + 2s < −m;
//!
//! and inconclusive otherwise. A comparison is supported only when each side has at least two
//! distinct seeds ([`MIN_SEEDS`]): with one seed the SE is the evaluation's binomial one, which
//! ignores the seed-to-seed spread, so a "supported" there would be read as more than it is; such a
//! comparison is inconclusive instead (not supported stays as judged). Likewise when every seed of
//! both sides ended at 0% (or every one at 100%) held-out accuracy ([`Comparison::pinned`]): the
//! spread is then zero, d = 0 ± 0 passes non-inferiority and equivalence, yet the arms were never
//! told apart (a warm start that solves nothing, e.g. `quickstart_args = ["--fast"]`'s smoke-run
//! SFT, leaves every run at 0); unpaired and paired, such a "supported" is inconclusive. A claim made of several comparisons is supported when all are, not
//! supported when any is not, inconclusive otherwise (also when an arm it needs is missing).
//!
//! Paired by seed, beside it: the arms of one seed share that seed's warm start, whose accuracy
//! varies from seed to seed by more than the arms differ, and the unpaired SE above carries that
//! variance twice. Each comparison therefore also judges the per-seed differences
//! d_i = a_i − b_i over the seeds both arms have (n ≥ 2): mean d̄, SE = sd(d)/√n, the same rules
//! with the two standard errors replaced by Student's t quantile at n − 1 degrees of freedom
//! ([`t_quantile_975`]: 4.30 SE at three seeds, 2.26 at ten, → 1.96), since sd(d) is itself
//! estimated from n values and the normal approximation behind "2 SE" is anti-conservative at
//! small n (a one-sided test at the margin errs 9.2% of the time at n = 3 instead of 2.3%)
//! ([`Paired`], [`Verdict::paired_status`]). The unpaired verdict is the rule the lab was
//! specified with and stays the headline; the paired one is the sharper test of the same claim.
//!
//! The claims (arms found by preset and sync interval):
//! - **A1** off-policy GRPO (`grpo`/`off_policy_grpo` at intervals 4 and 16, and at interval 1 with
//!   the smallest sync offset > 0 when the sweep has such an arm) is not worse than on-policy GRPO
//!   (interval 1, offset 0) by more than m (arXiv 2505.22257);
//! - **B1** REINFORCE at the harshest interval of the sweep is worse than REINFORCE at interval 1 by
//!   more than m (arXiv 2509.24203);
//! - **B2** REC-OneSide-NoIS and REC-OneSide-IS at interval 16 are within m of each other;
//! - **B3** OPMD and AsymRE at the harshest interval end at or above the warm-start accuracy of the
//!   same seeds (non-inferiority with margin m: no collapse);
//! - **B4a** RED-Weight (`red_weight`) at interval 16 is better than REINFORCE at interval 16 by more
//!   than m;
//! - **B4b** RED-Drop at interval 16 is better than REINFORCE at interval 16 by more than m, as
//!   released (`red_drop`: exactly the surplus negatives dropped, the mean recomputed on the kept
//!   rows) and as first written (`red_drop_bernoulli`: each negative dropped with probability
//!   1 − pos/neg, the mean not recomputed); one comparison each, both needed.
//!
//! B4 is this project's reading of arXiv 2509.24203 (the paper shows RED-Drop and RED-Weight
//! curves under staleness; "better than REINFORCE by m" is not a quoted result), split in two
//! because the two methods differ in mechanism: RED-Drop as released scales REINFORCE's expected
//! gradient by K/(2(K − k)) on groups with k < K/2 correct, while RED-Weight's A·exp(A) gives the
//! positives about e times the negatives' weight (docs/lab/ablations tests both readings).
//!
//! A sweep may add claims of its own (`[[claim]]`, [`crate::sweep::ClaimSpec`]): comparisons
//! between named arms (or an arm and its warm start) under the same tests and rules ([`claims`]).

use serde::{Deserialize, Serialize};

use crate::summary::{ArmStats, Estimate};
pub use crate::sweep::Test;
use crate::sweep::{ClaimSpec, WARM_START};

/// Fewest distinct seeds each side of a comparison needs for "supported".
pub const MIN_SEEDS: usize = 2;

/// Distinct seeds among `(seed, value)` pairs.
fn distinct_seeds(s: &[(u64, f64)]) -> usize {
    let mut seeds: Vec<u64> = s.iter().map(|x| x.0).collect();
    seeds.sort_unstable();
    seeds.dedup();
    seeds.len()
}

/// Margin m of the claims, as a fraction (3 points).
pub const MARGIN: f64 = 0.03;

/// A claim's (or comparison's) status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// The data show the claim beyond the margin and two standard errors.
    #[serde(rename = "supported")]
    Supported,
    /// The data show the opposite beyond the margin and two standard errors.
    #[serde(rename = "not supported")]
    NotSupported,
    /// Neither.
    #[serde(rename = "inconclusive")]
    Inconclusive,
}

impl Status {
    /// The name written in verdicts.json/md.
    pub fn name(self) -> &'static str {
        match self {
            Status::Supported => "supported",
            Status::NotSupported => "not supported",
            Status::Inconclusive => "inconclusive",
        }
    }
}

/// One comparison a − b, numbers as fractions.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Comparison {
    /// Arm a.
    pub a: String,
    /// Arm b (or "warm start of ARM").
    pub b: String,
    /// The form of the test.
    pub test: Test,
    /// a's estimate.
    pub est_a: Estimate,
    /// b's estimate.
    pub est_b: Estimate,
    /// d = mean_a − mean_b.
    pub diff: f64,
    /// SE of d.
    pub se: f64,
    /// Outcome.
    pub status: Status,
    /// The same comparison paired by seed (`None` with fewer than two shared seeds).
    #[serde(default)]
    pub paired: Option<Paired>,
    /// A side had fewer than [`MIN_SEEDS`] distinct seeds: a "supported" was made inconclusive.
    #[serde(default)]
    pub few_seeds: bool,
    /// Every seed of both sides ended at 0% held-out accuracy, or every one at 100%: nothing told
    /// the arms apart, so a "supported" (unpaired and paired) was made inconclusive.
    #[serde(default)]
    pub pinned: bool,
}

/// A comparison paired by seed: d_i = a_i − b_i over the seeds both sides have.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Paired {
    /// Shared seeds.
    pub n: usize,
    /// Mean of the per-seed differences.
    pub diff: f64,
    /// Its standard error, sd(d)/√n.
    pub se: f64,
    /// The standard errors the rule spans: Student's t quantile [`t_quantile_975`] at n − 1
    /// degrees of freedom (2.0, the normal rule, in files written before 2026-12-07).
    #[serde(default = "two")]
    pub k: f64,
    /// Outcome under the unpaired comparison's rule with `k` standard errors instead of two.
    pub status: Status,
}

fn two() -> f64 {
    2.0
}

/// Student's t distribution's 0.975 quantile at `df` degrees of freedom (df ≥ 1): the half-width,
/// in standard errors, of a two-sided 95% interval (each one-sided test at 2.5%), computed to
/// ~1e-12 by bisection on the closed-form CDF for integer df (Abramowitz & Stegun 26.7.3-4:
/// with θ = atan(t/√ν), P(|T| ≤ t) = (2/π)(θ + sinθ cosθ Σ) for odd ν, sinθ Σ' for even ν, Σ and
/// Σ' finite series in cos²θ). 12.706 at df 1, 4.303 at 2, 2.228 at 10, 1.984 at 100.
///
/// # Panics
/// If `df` is 0.
pub fn t_quantile_975(df: usize) -> f64 {
    assert!(df >= 1, "Student's t needs at least one degree of freedom");
    let two_sided = |t: f64| -> f64 {
        let th = (t / (df as f64).sqrt()).atan();
        let (s, c2) = (th.sin(), th.cos() * th.cos());
        let (mut term, mut sum) = (1.0, 1.0);
        if df % 2 == 1 {
            // Σ = 1 + (2/3)c² + (2·4)/(3·5)c⁴ + … up to c^(ν−3).
            let mut k = 2;
            while k < df.saturating_sub(1) {
                term *= c2 * k as f64 / (k + 1) as f64;
                sum += term;
                k += 2;
            }
            let extra = if df == 1 { 0.0 } else { s * th.cos() * sum };
            2.0 / std::f64::consts::PI * (th + extra)
        } else {
            // Σ' = 1 + (1/2)c² + (1·3)/(2·4)c⁴ + … up to c^(ν−2).
            let mut k = 1;
            while k < df - 1 {
                term *= c2 * k as f64 / (k + 1) as f64;
                sum += term;
                k += 2;
            }
            s * sum
        }
    };
    let (mut lo, mut hi) = (0.0_f64, 1e3_f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if two_sided(mid) < 0.95 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// `test` on the per-seed differences of `a` and `b` (`(seed, value)` lists); `None` with fewer
/// than two shared seeds.
pub fn paired(a: &[(u64, f64)], b: &[(u64, f64)], test: Test, m: f64) -> Option<Paired> {
    let d: Vec<f64> = a
        .iter()
        .filter_map(|(s, x)| b.iter().find(|(t, _)| t == s).map(|(_, y)| x - y))
        .collect();
    let n = d.len();
    if n < 2 {
        return None;
    }
    let mean = d.iter().sum::<f64>() / n as f64;
    let var = d.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
    let se = (var / n as f64).sqrt();
    let k = t_quantile_975(n - 1);
    Some(Paired {
        n,
        diff: mean,
        se,
        k,
        status: judge_k(test, mean, se, m, k),
    })
}

/// One claim's verdict.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    /// A1, B1, B2, B3, B4a, B4b, or the name of a sweep's own `[[claim]]`.
    pub claim: String,
    /// What the claim says.
    pub statement: String,
    /// The verdict.
    pub status: Status,
    /// The numbers behind it.
    pub comparisons: Vec<Comparison>,
    /// Why it is inconclusive without numbers (a missing arm), else empty.
    pub note: String,
    /// The verdict from the comparisons paired by seed (same combination rule); `None` when a
    /// comparison has no paired form (fewer than two shared seeds) or an arm is missing.
    #[serde(default)]
    pub paired_status: Option<Status>,
}

/// Judges d with SE s against margin m for `test` (two standard errors: the lab's specified rule).
pub fn judge(test: Test, d: f64, s: f64, m: f64) -> Status {
    judge_k(test, d, s, m, 2.0)
}

/// [`judge`] with the interval d ± k·s.
pub fn judge_k(test: Test, d: f64, s: f64, m: f64, k: f64) -> Status {
    let (lo, hi) = (d - k * s, d + k * s);
    match test {
        Test::NonInferior if lo > -m => Status::Supported,
        Test::NonInferior if hi < -m => Status::NotSupported,
        Test::Superior if lo > m => Status::Supported,
        Test::Superior if hi < m => Status::NotSupported,
        Test::Equivalent if lo > -m && hi < m => Status::Supported,
        Test::Equivalent if lo > m || hi < -m => Status::NotSupported,
        _ => Status::Inconclusive,
    }
}

/// One side of a comparison: its name, its estimate and its per-seed values.
type Side<'a> = (&'a str, Estimate, &'a [(u64, f64)]);

fn compare((a, ea, sa): Side, (b, eb, sb): Side, test: Test, m: f64) -> Comparison {
    let diff = ea.mean - eb.mean;
    let se = (ea.se * ea.se + eb.se * eb.se).sqrt();
    let few_seeds = distinct_seeds(sa) < MIN_SEEDS || distinct_seeds(sb) < MIN_SEEDS;
    let all = |x: f64| sa.iter().chain(sb).all(|(_, v)| *v == x);
    let pinned = all(0.0) || all(1.0);
    let status = match judge(test, diff, se, m) {
        Status::Supported if few_seeds || pinned => Status::Inconclusive,
        s => s,
    };
    let paired = paired(sa, sb, test, m).map(|p| match p.status {
        Status::Supported if pinned => Paired {
            status: Status::Inconclusive,
            ..p
        },
        _ => p,
    });
    Comparison {
        a: a.into(),
        b: b.into(),
        test,
        est_a: ea,
        est_b: eb,
        diff,
        se,
        status,
        paired,
        few_seeds,
        pinned,
    }
}

/// The combination rule of a claim over its comparisons' statuses.
fn combined(statuses: &[Status], complete: bool) -> Status {
    if statuses.contains(&Status::NotSupported) {
        Status::NotSupported
    } else if complete && !statuses.is_empty() && statuses.iter().all(|s| *s == Status::Supported) {
        Status::Supported
    } else {
        Status::Inconclusive
    }
}

/// The arm of `presets` at `interval` (offset 0 preferred), with a final accuracy.
fn find<'a>(arms: &'a [ArmStats], presets: &[&str], interval: u64) -> Option<&'a ArmStats> {
    let mut c: Vec<&ArmStats> = arms
        .iter()
        .filter(|a| presets.contains(&a.preset.as_str()) && a.interval == interval)
        .filter(|a| a.final_accuracy.is_some())
        .collect();
    c.sort_by_key(|a| a.offset);
    c.first().copied()
}

/// The arm of `presets` at interval 1 with the smallest offset > 0, with a final accuracy.
fn offset_arm<'a>(arms: &'a [ArmStats], presets: &[&str]) -> Option<&'a ArmStats> {
    arms.iter()
        .filter(|a| presets.contains(&a.preset.as_str()) && a.interval == 1 && a.offset > 0)
        .filter(|a| a.final_accuracy.is_some())
        .min_by_key(|a| a.offset)
}

/// The largest interval (> 1) at which an arm of `preset` has a final accuracy.
fn harshest(arms: &[ArmStats], preset: &str) -> Option<u64> {
    arms.iter()
        .filter(|a| a.preset == preset && a.interval > 1 && a.final_accuracy.is_some())
        .map(|a| a.interval)
        .max()
}

fn combine(
    claim: &str,
    statement: String,
    comps: Vec<Comparison>,
    missing: Vec<String>,
) -> Verdict {
    let statuses: Vec<Status> = comps.iter().map(|c| c.status).collect();
    let status = combined(&statuses, missing.is_empty());
    let paired: Option<Vec<Status>> = comps.iter().map(|c| c.paired.map(|p| p.status)).collect();
    let paired_status = paired
        .filter(|p| missing.is_empty() && !p.is_empty())
        .map(|p| combined(&p, true));
    let mut notes = Vec::new();
    if !missing.is_empty() {
        notes.push(format!("missing from the data: {}", missing.join(", ")));
    }
    let few: Vec<String> = comps
        .iter()
        .filter(|c| c.few_seeds)
        .map(|c| format!("{} vs {}", c.a, c.b))
        .collect();
    if !few.is_empty() {
        notes.push(format!(
            "fewer than {MIN_SEEDS} distinct seeds per arm in {}: at best inconclusive (run more seeds)",
            few.join(", ")
        ));
    }
    let pinned: Vec<String> = comps
        .iter()
        .filter(|c| c.pinned)
        .map(|c| format!("{} vs {}", c.a, c.b))
        .collect();
    if !pinned.is_empty() {
        notes.push(format!(
            "every run of {} ended at the same held-out accuracy, 0% or 100%: nothing told the \
             arms apart, so at best inconclusive (check the warm start's accuracy in summary.md)",
            pinned.join(", ")
        ));
    }
    let note = notes.join("; ");
    Verdict {
        claim: claim.into(),
        statement,
        status,
        comparisons: comps,
        note,
        paired_status,
    }
}

const GRPO: &[&str] = &["grpo", "off_policy_grpo"];

/// The six verdicts (A1, B1, B2, B3, B4a, B4b) from per-arm statistics, with margin `m` (a fraction).
// One block per claim (A1, B1-B3, then B4a and B4b in one loop), each reading as docs/lab/README.md "Reading the verdicts" states it,
// side by side so the five rules can be checked against that text.
pub fn verdicts(arms: &[ArmStats], m: f64) -> Vec<Verdict> {
    fn side(a: &ArmStats) -> Side<'_> {
        let fin = a.final_accuracy.expect("find() keeps arms with one");
        (&a.arm, fin, &a.final_by_seed)
    }
    let pts = 100.0 * m;
    let mut out = Vec::new();

    // A1.
    let (mut comps, mut missing) = (Vec::new(), Vec::new());
    match find(arms, GRPO, 1) {
        Some(on) => {
            for v in [4, 16] {
                match find(arms, GRPO, v) {
                    Some(off) => comps.push(compare(side(off), side(on), Test::NonInferior, m)),
                    None => missing.push(format!("GRPO at interval {v}")),
                }
            }
            // The sync-offset arm (interval 1, offset o > 0: every batch o steps stale), when the
            // sweep has one; its absence is not missing data.
            if let Some(off) = offset_arm(arms, GRPO) {
                comps.push(compare(side(off), side(on), Test::NonInferior, m));
            }
        }
        None => missing.push("GRPO at interval 1".into()),
    }
    out.push(combine(
        "A1",
        format!("off-policy GRPO (intervals 4 and 16, and interval 1 at a sync offset when the sweep has one) is not worse than on-policy GRPO (interval 1) by more than {pts:.0} points"),
        comps,
        missing,
    ));

    // B1.
    let (mut comps, mut missing) = (Vec::new(), Vec::new());
    match (find(arms, &["reinforce"], 1), harshest(arms, "reinforce")) {
        (Some(on), Some(v)) => {
            let off = find(arms, &["reinforce"], v).expect("harshest has one");
            comps.push(compare(side(on), side(off), Test::Superior, m));
        }
        (on, v) => {
            if on.is_none() {
                missing.push("REINFORCE at interval 1".into());
            }
            if v.is_none() {
                missing.push("REINFORCE at an interval > 1".into());
            }
        }
    }
    out.push(combine(
        "B1",
        format!("REINFORCE at the harshest interval is worse than REINFORCE at interval 1 by more than {pts:.0} points"),
        comps,
        missing,
    ));

    // B2.
    let (mut comps, mut missing) = (Vec::new(), Vec::new());
    match (
        find(arms, &["rec_oneside_nois"], 16),
        find(arms, &["rec_oneside_is"], 16),
    ) {
        (Some(a), Some(b)) => comps.push(compare(side(a), side(b), Test::Equivalent, m)),
        (a, b) => {
            for (x, n) in [
                (a.is_none(), "REC-OneSide-NoIS"),
                (b.is_none(), "REC-OneSide-IS"),
            ] {
                if x {
                    missing.push(format!("{n} at interval 16"));
                }
            }
        }
    }
    out.push(combine(
        "B2",
        format!("REC-OneSide-NoIS and REC-OneSide-IS at interval 16 are within {pts:.0} points of each other"),
        comps,
        missing,
    ));

    // B3.
    let (mut comps, mut missing) = (Vec::new(), Vec::new());
    for p in ["opmd", "asymre"] {
        match harshest(arms, p).and_then(|v| find(arms, &[p], v)) {
            Some(a) => match a.warm_accuracy {
                Some(w) => comps.push(compare(
                    side(a),
                    (&format!("warm start of {}", a.arm), w, &a.warm_by_seed),
                    Test::NonInferior,
                    m,
                )),
                None => missing.push(format!("the warm-start accuracy of {}", a.arm)),
            },
            None => missing.push(format!("{p} at an interval > 1")),
        }
    }
    out.push(combine(
        "B3",
        format!("OPMD and AsymRE at the harshest interval end at or above the warm-start accuracy (no collapse; margin {pts:.0} points)"),
        comps,
        missing,
    ));

    // B4a and B4b.
    let base = find(arms, &["reinforce"], 16);
    for (claim, presets, statement) in [
        (
            "B4a",
            &["red_weight"][..],
            format!("RED-Weight at interval 16 is better than REINFORCE at interval 16 by more than {pts:.0} points"),
        ),
        (
            "B4b",
            &["red_drop", "red_drop_bernoulli"][..],
            format!("RED-Drop at interval 16, as released (red_drop) and as first written (red_drop_bernoulli), is better than REINFORCE at interval 16 by more than {pts:.0} points"),
        ),
    ] {
        let (mut comps, mut missing) = (Vec::new(), Vec::new());
        match base {
            Some(base) => {
                for p in presets {
                    match find(arms, &[p], 16) {
                        Some(a) => comps.push(compare(side(a), side(base), Test::Superior, m)),
                        None => missing.push(format!("{p} at interval 16")),
                    }
                }
            }
            None => missing.push("REINFORCE at interval 16".into()),
        }
        out.push(combine(claim, statement, comps, missing));
    }
    out
}

/// What a lab judges from its arms: the papers' claims ([`verdicts`]) unless the sweep turned
/// them off (`[lab].paper_claims = false`), then the sweep's own `[[claim]]`s ([`claims`]), at
/// margin [`MARGIN`]. `rlvr lab`, `--redraw` and `--regimes` all judge through this one function.
pub fn all_verdicts(arms: &[ArmStats], paper_claims: bool, own: &[ClaimSpec]) -> Vec<Verdict> {
    let mut vs = if paper_claims {
        verdicts(arms, MARGIN)
    } else {
        Vec::new()
    };
    vs.extend(claims(arms, own, MARGIN));
    vs
}

/// The verdicts of a sweep's own claims (`[[claim]]`, [`ClaimSpec`]), with margin `m`: each
/// comparison by arm name (b = [`WARM_START`]: arm a's own warm start), combined as the papers'
/// claims are. An arm without a final accuracy (absent under `--fast`/`--only`, or not run yet)
/// makes its claim inconclusive with the arm named.
pub fn claims(arms: &[ArmStats], specs: &[ClaimSpec], m: f64) -> Vec<Verdict> {
    let by_name = |n: &str| {
        arms.iter()
            .find(|a| a.arm == n)
            .filter(|a| a.final_accuracy.is_some())
    };
    specs
        .iter()
        .map(|c| {
            let (mut comps, mut missing) = (Vec::new(), Vec::new());
            for k in &c.compare {
                let Some(a) = by_name(&k.a) else {
                    missing.push(format!("arm {}", k.a));
                    continue;
                };
                let fin = a.final_accuracy.expect("by_name keeps arms with one");
                let sa: Side = (&a.arm, fin, &a.final_by_seed);
                if k.b == WARM_START {
                    match a.warm_accuracy {
                        Some(w) => comps.push(compare(
                            sa,
                            (&format!("warm start of {}", a.arm), w, &a.warm_by_seed),
                            k.test,
                            m,
                        )),
                        None => missing.push(format!("the warm-start accuracy of {}", a.arm)),
                    }
                    continue;
                }
                match by_name(&k.b) {
                    Some(b) => {
                        let fb = b.final_accuracy.expect("by_name keeps arms with one");
                        comps.push(compare(sa, (&b.arm, fb, &b.final_by_seed), k.test, m));
                    }
                    None => missing.push(format!("arm {}", k.b)),
                }
            }
            combine(&c.name, c.statement.clone(), comps, missing)
        })
        .collect()
}

fn est(e: &Estimate) -> String {
    format!("{:.1} ± {:.1} (n={})", 100.0 * e.mean, 100.0 * e.se, e.n)
}

/// verdicts.md: one row per claim with its numbers (percent; ± is the standard error).
pub fn markdown(vs: &[Verdict], m: f64) -> String {
    let mut s = format!(
        "# Verdicts\n\nFinal held-out accuracy in percent, mean ± standard error over seeds (one seed: \
         the binomial SE of the evaluation). d = a − b ± its SE. Margin m = {:.0} points; a claim is \
         supported when the data show it beyond m and two standard errors, not supported when they \
         show the opposite beyond them, inconclusive otherwise. Paired by seed: the same test on the \
         per-seed differences (the arms of a seed share its warm start, so the warm start's \
         seed-to-seed variance drops out), mean ± sd/√n over the shared seeds, with Student's t \
         quantile at n − 1 degrees of freedom (k SE: 4.30 at three seeds) instead of two SE.\n\n\
         | claim | status | paired by seed | comparison (a vs b) | a | b | d | test | paired d | paired |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        100.0 * m
    );
    for v in vs {
        if v.comparisons.is_empty() {
            s.push_str(&format!(
                "| {} | **{}** | | {} | | | | | | |\n",
                v.claim,
                v.status.name(),
                v.note
            ));
        }
        for (i, c) in v.comparisons.iter().enumerate() {
            let (claim, status, pstatus) = if i == 0 {
                (
                    v.claim.as_str(),
                    format!("**{}**", v.status.name()),
                    v.paired_status
                        .map_or("–".into(), |p| format!("**{}**", p.name())),
                )
            } else {
                ("", String::new(), String::new())
            };
            let (pd, ps) = match c.paired {
                Some(p) => (
                    format!(
                        "{:+.1} ± {:.1} (n={}, k={:.2})",
                        100.0 * p.diff,
                        100.0 * p.se,
                        p.n,
                        p.k
                    ),
                    p.status.name(),
                ),
                None => ("–".into(), "–"),
            };
            s.push_str(&format!(
                "| {claim} | {status} | {pstatus} | {} vs {} | {} | {} | {:+.1} ± {:.1} | {}: {} | {pd} | {ps} |\n",
                c.a,
                c.b,
                est(&c.est_a),
                est(&c.est_b),
                100.0 * c.diff,
                100.0 * c.se,
                c.test.name(),
                c.status.name()
            ));
        }
    }
    s.push_str("\nClaims:\n");
    for v in vs {
        s.push_str(&format!("- **{}** {}.", v.claim, v.statement));
        if !v.note.is_empty() {
            s.push_str(&format!(" ({})", v.note));
        }
        s.push('\n');
    }
    s
}
