//! `rlvr lab --regimes NAME=DIR ...`: one report over several lab directories that ran the same
//! claims in different regimes (the default sweep and `configs/lab_low_drift.toml`, DESIGN.md
//! section 12): per claim, its verdict in each regime and whether the verdict depends on the
//! regime; per arm, the measured drift and the accuracy in each regime.
//!
//! Each directory is read from its lab_data.json alone (as `--redraw` does), so the report can be
//! remade from docs/lab without the run directories. Writes OUT/regimes.md and OUT/regimes.json.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::data::LabData;
use crate::summary::{arm_stats, pct, ArmStats, Estimate};
use crate::verdict::{self, Status, Verdict};

/// One regime: its name and its lab's arms and verdicts.
#[derive(Debug, Clone, Serialize)]
pub struct Regime {
    /// The name given on the command line (`NAME=DIR`; the directory's name without one).
    pub name: String,
    /// The lab directory.
    pub dir: String,
    /// Per-arm statistics.
    pub arms: Vec<ArmStats>,
    /// The verdicts, as that lab judged them.
    pub verdicts: Vec<Verdict>,
}

/// Parses `NAME=DIR` (or `DIR`, named by its last component).
///
/// # Errors
/// An empty name or directory.
pub fn parse_arg(s: &str) -> anyhow::Result<(String, PathBuf)> {
    let (name, dir) = match s.split_once('=') {
        Some((n, d)) => (n.to_string(), PathBuf::from(d)),
        None => {
            let d = PathBuf::from(s);
            let n = d
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| s.to_string());
            (n, d)
        }
    };
    anyhow::ensure!(
        !name.is_empty() && !dir.as_os_str().is_empty(),
        "--regimes {s:?}: expected NAME=DIR (a lab directory with a lab_data.json)"
    );
    Ok((name, dir))
}

/// Reads one regime's lab_data.json and judges it as the lab did.
///
/// # Errors
/// As [`LabData::read`].
pub fn read(name: &str, dir: &Path) -> anyhow::Result<Regime> {
    let d = LabData::read(dir)?;
    let arms = arm_stats(&d.summaries());
    let verdicts = verdict::all_verdicts(&arms, d.paper_claims, &d.claims);
    Ok(Regime {
        name: name.to_string(),
        dir: dir.display().to_string(),
        arms,
        verdicts,
    })
}

/// Whether a claim's verdict depends on the regime: the headline (unpaired) statuses over the
/// regimes that judged it differ, or the paired ones do. A regime that judged the claim from
/// fewer than [`verdict::MIN_SEEDS`] seeds in an arm (a `--fast` lab) is left out of both
/// comparisons: its status is capped by the seed count, not set by the regime.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ClaimAcross {
    /// The claim.
    pub claim: String,
    /// Its statement (from the first regime that has it).
    pub statement: String,
    /// (unpaired, paired) status per regime, in the regimes' order; `None` where a regime does not
    /// judge the claim.
    pub statuses: Vec<Option<(Status, Option<Status>)>>,
    /// Per regime, in the same order: it judged the claim from fewer than
    /// [`verdict::MIN_SEEDS`] seeds in some arm (left out of `depends` and `paired_depends`).
    pub few_seeds: Vec<bool>,
    /// The unpaired statuses differ between regimes.
    pub depends: bool,
    /// The paired statuses differ between regimes (where each has one).
    pub paired_depends: bool,
}

/// The claims of all regimes, in first-appearance order, side by side.
pub fn across(regimes: &[Regime]) -> Vec<ClaimAcross> {
    let mut names: Vec<(&str, &str)> = Vec::new();
    for r in regimes {
        for v in &r.verdicts {
            if !names.iter().any(|(n, _)| *n == v.claim) {
                names.push((&v.claim, &v.statement));
            }
        }
    }
    names
        .into_iter()
        .map(|(claim, statement)| {
            let found: Vec<Option<&Verdict>> = regimes
                .iter()
                .map(|r| r.verdicts.iter().find(|v| v.claim == claim))
                .collect();
            let statuses: Vec<Option<(Status, Option<Status>)>> = found
                .iter()
                .map(|v| v.map(|v| (v.status, v.paired_status)))
                .collect();
            let few_seeds: Vec<bool> = found
                .iter()
                .map(|v| v.is_some_and(|v| v.comparisons.iter().any(|c| c.few_seeds)))
                .collect();
            let judged = || {
                statuses
                    .iter()
                    .zip(&few_seeds)
                    .filter(|(_, few)| !**few)
                    .filter_map(|(s, _)| *s)
            };
            let un: Vec<Status> = judged().map(|s| s.0).collect();
            let pa: Vec<Status> = judged().filter_map(|s| s.1).collect();
            ClaimAcross {
                claim: claim.to_string(),
                statement: statement.to_string(),
                depends: un.windows(2).any(|w| w[0] != w[1]),
                paired_depends: pa.windows(2).any(|w| w[0] != w[1]),
                statuses,
                few_seeds,
            }
        })
        .collect()
}

fn kl(e: Option<Estimate>) -> String {
    match e {
        Some(e) => format!("{:.2e}", e.mean),
        None => "–".into(),
    }
}

/// The regimes' drift ratio for one arm: drift in the first regime over drift in `r`.
fn ratio(first: Option<Estimate>, other: Option<Estimate>) -> Option<f64> {
    let (a, b) = (first?.mean, other?.mean);
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

/// regimes.md.
pub fn markdown(regimes: &[Regime]) -> String {
    let names: Vec<&str> = regimes.iter().map(|r| r.name.as_str()).collect();
    let mut s = String::from("# The claims across regimes\n\n");
    s.push_str(&format!(
        "Each regime is one lab directory ({}), judged as its own `verdicts.md` says (margin {:.0} \
         points; the status, then the status paired by seed in parentheses). \"Depends on the \
         regime\" compares the headline statuses; \"paired differs\" the paired ones; a regime \
         that judged a claim from fewer than {} seeds in an arm (marked \"few seeds\") is left out \
         of both, as its status is capped by the seed count.\n\n",
        regimes
            .iter()
            .map(|r| format!("{}: `{}`", r.name, r.dir))
            .collect::<Vec<_>>()
            .join(", "),
        100.0 * verdict::MARGIN,
        verdict::MIN_SEEDS
    ));
    s.push_str("| claim |");
    for n in &names {
        s.push_str(&format!(" {n} |"));
    }
    s.push_str(" depends on the regime |\n|---|");
    for _ in &names {
        s.push_str("---|");
    }
    s.push_str("---|\n");
    for c in across(regimes) {
        s.push_str(&format!("| {} |", c.claim));
        for (st, few) in c.statuses.iter().zip(&c.few_seeds) {
            match st {
                Some((u, p)) => s.push_str(&format!(
                    " {} ({}){} |",
                    u.name(),
                    p.map_or("–", |p| p.name()),
                    if *few { ", few seeds" } else { "" }
                )),
                None => s.push_str(" not judged |"),
            }
        }
        let dep = match (c.depends, c.paired_depends) {
            (true, _) => "**yes**",
            (false, true) => "no (paired differs)",
            (false, false) => "no",
        };
        s.push_str(&format!(" {dep} |\n"));
    }
    s.push_str("\nClaims:\n");
    for c in across(regimes) {
        s.push_str(&format!("- **{}** {}.\n", c.claim, c.statement));
    }

    // Per arm: drift and accuracy in each regime (the arms of the first regime, by name).
    s.push_str(
        "\n## Drift and accuracy per arm\n\nDrift: KL(behaviour ‖ current) per token at the last step \
         of each sync window (`kl_behaviour`, nats), mean over the windows and the seeds. Final and \
         warm-start held-out accuracy in percent, mean ± std over seeds.",
    );
    if regimes.len() > 1 {
        s.push_str(&format!(
            " Ratio: the drift in {} over the drift in each other regime.",
            names[0]
        ));
    }
    s.push_str("\n\n| arm | interval | offset |");
    for n in &names {
        s.push_str(&format!(" drift {n} |"));
    }
    for n in names.iter().skip(1) {
        s.push_str(&format!(" ratio {}/{n} |", names[0]));
    }
    for n in &names {
        s.push_str(&format!(" warm {n} | final {n} |"));
    }
    s.push_str("\n|---|---|---|");
    let cols = names.len() + names.len().saturating_sub(1) + 2 * names.len();
    for _ in 0..cols {
        s.push_str("---|");
    }
    s.push('\n');
    let mut seen: Vec<&str> = Vec::new();
    for a in regimes.iter().flat_map(|r| &r.arms) {
        if seen.contains(&a.arm.as_str()) {
            continue;
        }
        seen.push(&a.arm);
        let per: Vec<Option<&ArmStats>> = regimes
            .iter()
            .map(|r| r.arms.iter().find(|x| x.arm == a.arm))
            .collect();
        s.push_str(&format!("| {} | {} | {} |", a.arm, a.interval, a.offset));
        for p in &per {
            s.push_str(&format!(" {} |", kl(p.and_then(|x| x.drift))));
        }
        for p in per.iter().skip(1) {
            let r = ratio(per[0].and_then(|x| x.drift), p.and_then(|x| x.drift));
            s.push_str(&format!(
                " {} |",
                r.map_or("–".into(), |r| format!("{r:.1}×"))
            ));
        }
        for p in &per {
            s.push_str(&format!(
                " {} | {} |",
                pct(&p.and_then(|x| x.warm_accuracy)),
                pct(&p.and_then(|x| x.final_accuracy))
            ));
        }
        s.push('\n');
    }
    s
}

/// Writes OUT/regimes.md and OUT/regimes.json for the `NAME=DIR` arguments; returns the claims
/// side by side.
///
/// # Errors
/// A directory without a readable lab_data.json, I/O.
pub fn write(args: &[String], out: &Path) -> anyhow::Result<Vec<ClaimAcross>> {
    let mut regimes = Vec::new();
    for a in args {
        let (name, dir) = parse_arg(a)?;
        anyhow::ensure!(
            !regimes.iter().any(|r: &Regime| r.name == name),
            "--regimes names `{name}` twice"
        );
        regimes.push(read(&name, &dir).with_context(|| format!("regime {name}"))?);
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let claims = across(&regimes);
    let j = serde_json::json!({"margin": verdict::MARGIN, "regimes": regimes, "claims": claims});
    let p = out.join("regimes.json");
    std::fs::write(&p, serde_json::to_string_pretty(&j)? + "\n")
        .with_context(|| format!("writing {}", p.display()))?;
    let p = out.join("regimes.md");
    std::fs::write(&p, markdown(&regimes)).with_context(|| format!("writing {}", p.display()))?;
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regime(name: &str, statuses: &[(&str, Status, Option<Status>)], drift: f64) -> Regime {
        let verdicts = statuses
            .iter()
            .map(|(c, s, p)| Verdict {
                claim: c.to_string(),
                statement: format!("claim {c}"),
                status: *s,
                comparisons: Vec::new(),
                note: String::new(),
                paired_status: *p,
            })
            .collect();
        let est = |m: f64| Estimate {
            mean: m,
            std: 0.0,
            se: 0.0,
            n: 3,
        };
        let arms = vec![ArmStats {
            arm: "grpo_v16".into(),
            label: "GRPO".into(),
            preset: "off_policy_grpo".into(),
            interval: 16,
            offset: 0,
            final_accuracy: Some(est(0.3)),
            best_accuracy: None,
            auc: None,
            warm_accuracy: Some(est(0.1)),
            wall_s: 1.0,
            clip_frac: None,
            clip_frac_mean: None,
            ratio_min: None,
            ratio_max: None,
            ratio_min_run: None,
            ratio_max_run: None,
            final_by_seed: Vec::new(),
            warm_by_seed: Vec::new(),
            drift: Some(est(drift)),
        }];
        Regime {
            name: name.into(),
            dir: format!("/x/{name}"),
            arms,
            verdicts,
        }
    }

    #[test]
    fn a_claim_depends_on_the_regime_when_its_statuses_differ() {
        use Status::*;
        let a = regime(
            "A",
            &[
                ("A1", Supported, Some(Supported)),
                ("B1", Inconclusive, Some(Supported)),
            ],
            0.0143,
        );
        let b = regime(
            "B",
            &[
                ("A1", Supported, Some(Supported)),
                ("B1", Inconclusive, Some(Inconclusive)),
                ("M1", NotSupported, None),
            ],
            0.0025,
        );
        let c = across(&[a.clone(), b.clone()]);
        let row = |n: &str| c.iter().find(|x| x.claim == n).unwrap().clone();
        assert!(!row("A1").depends && !row("A1").paired_depends);
        assert!(!row("B1").depends && row("B1").paired_depends);
        // Judged in one regime only: nothing to differ from.
        assert_eq!(row("M1").statuses[0], None);
        assert!(!row("M1").depends);
        let md = markdown(&[a, b]);
        assert!(
            md.contains("| A1 | supported (supported) | supported (supported) | no |"),
            "{md}"
        );
        assert!(md.contains("| B1 | inconclusive (supported) | inconclusive (inconclusive) | no (paired differs) |"), "{md}");
        assert!(
            md.contains("| M1 | not judged | not supported (–) | no |"),
            "{md}"
        );
        // 0.0143 / 0.0025 = 5.72.
        assert!(md.contains("| grpo_v16 | 16 | 0 | 1.43e-2 | 2.50e-3 | 5.7× | 10.0 ± 0.0 | 30.0 ± 0.0 | 10.0 ± 0.0 | 30.0 ± 0.0 |"), "{md}");
        let d = regime("C", &[("A1", NotSupported, None)], 0.01);
        let c = across(&[regime("A", &[("A1", Supported, None)], 0.01), d]);
        assert!(c[0].depends);
    }

    /// A one-seed lab (`--fast`) has every "supported" capped at inconclusive: set beside a
    /// three-seed lab, that difference is the seed count's, not the regime's.
    #[test]
    fn a_regime_with_too_few_seeds_does_not_make_a_claim_depend_on_it() {
        use Status::*;
        let three = regime("A", &[("B1", Supported, Some(Supported))], 0.01);
        let mut one = regime("fast", &[("B1", Inconclusive, None)], 0.01);
        let est = Estimate {
            mean: 0.3,
            std: 0.0,
            se: 0.02,
            n: 1,
        };
        let cmp = |few_seeds: bool| verdict::Comparison {
            a: "reinforce_v1".into(),
            b: "reinforce_v16".into(),
            test: verdict::Test::Superior,
            est_a: est,
            est_b: est,
            diff: 0.17,
            se: 0.023,
            status: Inconclusive,
            paired: None,
            few_seeds,
            pinned: false,
        };
        one.verdicts[0].comparisons = vec![cmp(true)];
        let c = across(&[three.clone(), one.clone()]);
        assert_eq!(c[0].few_seeds, [false, true]);
        assert!(!c[0].depends && !c[0].paired_depends);
        let md = markdown(&[three.clone(), one.clone()]);
        assert!(
            md.contains("| B1 | supported (supported) | inconclusive (–), few seeds | no |"),
            "{md}"
        );
        // The same statuses from enough seeds do differ.
        one.verdicts[0].comparisons = vec![cmp(false)];
        assert!(across(&[three, one])[0].depends);
    }

    #[test]
    fn regime_arguments_are_name_equals_dir() {
        assert_eq!(
            parse_arg("low=docs/lab/low").unwrap(),
            ("low".into(), PathBuf::from("docs/lab/low"))
        );
        assert_eq!(parse_arg("runs/lab-a").unwrap().0, "lab-a");
        assert!(parse_arg("=x").is_err());
    }
}
