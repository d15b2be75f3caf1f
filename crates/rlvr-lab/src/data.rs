//! `lab_data.json`: the small per-run data that the lab's summaries, verdicts and figures are made
//! from, kept beside them so that `rlvr lab --redraw DIR` remakes all of them without the run
//! directories (a few hundred KB for the default sweep's 54 runs, against ~1 GB of run
//! directories with their checkpoints).
//!
//! Per run: its [`RunSummary`] (arm, algorithm, interval, offset, seed, steps, final/best/warm
//! accuracy, AUC, wall time, the last step's diagnostics), the held-out accuracy at every evaluation
//! (exact), and the training series the figures draw ([`SERIES`]), rounded to
//! [`SIGNIFICANT`] significant digits. `rlvr lab` writes the file first and then draws everything
//! from it, so a redraw from the file alone gives the same figures and the same summary and
//! verdicts as the lab itself.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use rlvr_rundir::jsonl::{read_lines, series};
use rlvr_rundir::key::{Eval, Metric};

use crate::summary::RunSummary;
use crate::sweep::ClaimSpec;

/// The file's name in the lab directory.
pub const FILE: &str = "lab_data.json";

/// The version of the file's layout; a redraw refuses another.
pub const FORMAT: u32 = 1;

/// The metrics.jsonl keys of the training series kept (the diagnostics figures draw them).
/// `reward/mean` joined on 2026-12-07: a lab_data.json written before has no training-reward
/// series, and its diagnostics figures no training-reward row.
pub const SERIES: [Metric; 6] = [
    Metric::RewardMean,
    Metric::ClipFrac,
    Metric::RatioMin,
    Metric::RatioMax,
    Metric::Entropy,
    Metric::KlBehaviour,
];

/// Significant digits the training series keep (the figures draw them as 1-2 px lines).
pub const SIGNIFICANT: usize = 3;

/// A series over consecutive steps from `start`; `None` where a step has no value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Steps {
    /// First step.
    pub start: u64,
    /// One value per step from `start` (whole numbers written without `.0`).
    #[serde(serialize_with = "short_numbers")]
    pub values: Vec<Option<f64>>,
}

/// Writes whole numbers as integers (`0`, not `0.0`): the file is mostly such zeros and ones.
fn short_numbers<S: serde::Serializer>(v: &[Option<f64>], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for x in v {
        match x {
            Some(y) if y.fract() == 0.0 && y.abs() < 1e15 => seq.serialize_element(&(*y as i64))?,
            _ => seq.serialize_element(x)?,
        }
    }
    seq.end()
}

impl Steps {
    /// From (step, value) points in step order (non-finite values and repeated steps dropped).
    pub fn from_points(pts: &[(f64, f64)], digits: usize) -> Steps {
        let Some(first) = pts.first() else {
            return Steps::default();
        };
        let start = first.0 as u64;
        let mut values: Vec<Option<f64>> = Vec::new();
        for &(x, y) in pts {
            let i = (x as u64).saturating_sub(start) as usize;
            if i >= values.len() {
                values.resize(i + 1, None);
            }
            values[i] = y.is_finite().then(|| round(y, digits));
        }
        Steps { start, values }
    }

    /// The (step, value) points present.
    pub fn points(&self) -> Vec<(f64, f64)> {
        self.values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|y| ((self.start + i as u64) as f64, y)))
            .collect()
    }
}

/// `y` rounded to `digits` significant digits (through its decimal form, so the JSON is short).
pub fn round(y: f64, digits: usize) -> f64 {
    if y == 0.0 || !y.is_finite() {
        return y;
    }
    format!("{:.*e}", digits.saturating_sub(1), y)
        .parse()
        .unwrap_or(y)
}

/// One run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunData {
    /// The run's summary (summary.json's entry).
    pub summary: RunSummary,
    /// Held-out accuracy (fraction) at each evaluation: (step, accuracy), exact.
    pub accuracy: Vec<(u64, f64)>,
    /// The training series of [`SERIES`], by key.
    pub series: BTreeMap<String, Steps>,
}

impl RunData {
    /// The run's series of `key` as points: `eval/accuracy`, or a key of [`SERIES`] (empty if
    /// absent).
    pub fn points(&self, key: impl AsRef<str>) -> Vec<(f64, f64)> {
        let key = key.as_ref();
        if key == Eval::Accuracy.key() {
            return self.accuracy.iter().map(|&(s, a)| (s as f64, a)).collect();
        }
        self.series.get(key).map(Steps::points).unwrap_or_default()
    }
}

/// The whole file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LabData {
    /// [`FORMAT`].
    pub format: u32,
    /// The moving-average window the lab drew its diagnostics with (a redraw's default).
    pub smooth: usize,
    /// Whether the papers' claims are judged (the sweep's `[lab].paper_claims`; true in a file
    /// from before the key existed).
    #[serde(default = "yes")]
    pub paper_claims: bool,
    /// The sweep's own claims (`[[claim]]`), judged on a redraw as by the lab.
    #[serde(default)]
    pub claims: Vec<ClaimSpec>,
    /// The runs, in the sweep's order.
    pub runs: Vec<RunData>,
}

fn yes() -> bool {
    true
}

impl LabData {
    /// Reads each run's metrics.jsonl (at `summary.run_dir`); `paper_claims` and `claims` are the
    /// sweep's (what the verdicts judge).
    pub fn collect(
        runs: &[RunSummary],
        smooth: usize,
        paper_claims: bool,
        claims: &[ClaimSpec],
    ) -> LabData {
        let runs = runs
            .iter()
            .map(|r| {
                let lines = read_lines(Path::new(&r.run_dir));
                RunData {
                    summary: r.clone(),
                    accuracy: series(&lines, Eval::Accuracy)
                        .into_iter()
                        .filter(|p| p.1.is_finite())
                        .map(|(s, a)| (s as u64, a))
                        .collect(),
                    series: SERIES
                        .iter()
                        .map(|k| {
                            let pts = series(&lines, k);
                            (k.key().to_string(), Steps::from_points(&pts, SIGNIFICANT))
                        })
                        .filter(|(_, s)| !s.values.is_empty())
                        .collect(),
                }
            })
            .collect();
        LabData {
            format: FORMAT,
            smooth,
            paper_claims,
            claims: claims.to_vec(),
            runs,
        }
    }

    /// The runs' summaries, each with [`RunSummary::clip_frac_mean`] from its `clip_frac` series
    /// and [`RunSummary::ratio_min_run`] / [`RunSummary::ratio_max_run`] from its `ratio/min` and
    /// `ratio/max` series (so the lab and a redraw, both reading this file, agree; a file from
    /// before the fields existed gets them too).
    pub fn summaries(&self) -> Vec<RunSummary> {
        self.runs
            .iter()
            .map(|r| {
                let pts = r.points(Metric::ClipFrac.key());
                let over = |k: Metric, f: fn(f64, f64) -> f64| {
                    r.points(k.key()).into_iter().map(|p| p.1).reduce(f)
                };
                RunSummary {
                    clip_frac_mean: (!pts.is_empty())
                        .then(|| pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64),
                    ratio_min_run: over(Metric::RatioMin, f64::min),
                    ratio_max_run: over(Metric::RatioMax, f64::max),
                    ..r.summary.clone()
                }
            })
            .collect()
    }

    /// Writes DIR/lab_data.json (compact: one line per run).
    ///
    /// # Errors
    /// I/O.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let mut s = format!(
            "{{\"format\": {}, \"smooth\": {}, \"paper_claims\": {}, \"claims\": {},\n\"runs\": [\n",
            self.format,
            self.smooth,
            self.paper_claims,
            serde_json::to_string(&self.claims)?
        );
        for (i, r) in self.runs.iter().enumerate() {
            s.push_str(&serde_json::to_string(r)?);
            s.push_str(if i + 1 < self.runs.len() { ",\n" } else { "\n" });
        }
        s.push_str("]}\n");
        let path = dir.join(FILE);
        let tmp = dir.join(format!(".{FILE}.tmp"));
        std::fs::write(&tmp, s).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    /// Reads DIR/lab_data.json.
    ///
    /// # Errors
    /// A missing or malformed file, another [`FORMAT`].
    pub fn read(dir: &Path) -> anyhow::Result<LabData> {
        let path = dir.join(FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (a lab directory written by `rlvr lab` has one)",
                path.display()
            )
        })?;
        let d: LabData =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        anyhow::ensure!(
            d.format == FORMAT,
            "{}: format {} (this rlvr reads format {FORMAT})",
            path.display(),
            d.format
        );
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_round_trip_with_gaps_and_rounding() {
        let pts = [(1.0, 0.123456), (2.0, 1e-7), (4.0, 12345.678)];
        let s = Steps::from_points(&pts, 4);
        assert_eq!(s.start, 1);
        assert_eq!(s.values.len(), 4);
        assert_eq!(s.values[2], None);
        assert_eq!(s.points(), [(1.0, 0.1235), (2.0, 1e-7), (4.0, 12350.0)]);
        assert_eq!(round(0.0, 4), 0.0);
        let z = Steps::from_points(&[(3.0, 0.0), (4.0, 1.0), (5.0, 0.5)], 4);
        let j = serde_json::to_string(&z).unwrap();
        assert_eq!(j, r#"{"start":3,"values":[0,1,0.5]}"#);
        assert_eq!(serde_json::from_str::<Steps>(&j).unwrap(), z);
    }
}
