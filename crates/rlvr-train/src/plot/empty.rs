//! Why a panel of `rlvr plot` has no data, in words written into it ([`why_empty`]): a run's
//! file without the key, or with null at every step, and when rlvr writes such a key.

use std::path::Path;

use super::{metric_source, read_lines};

/// Why a run has no value of a metric to draw ([`why_empty`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Empty {
    /// What the run's file holds: "`KEY` is null at every step", "no `KEY` in metrics.jsonl".
    pub why: String,
    /// When rlvr writes that key ([`when_logged`]), if it is written only sometimes.
    pub when: Option<&'static str>,
}

impl Empty {
    /// `why: when`, the note of a panel left empty.
    pub fn full(&self) -> String {
        match self.when {
            Some(w) => format!("{}: {w}", self.why),
            None => self.why.clone(),
        }
    }
}

/// Why `run` has no value of `metric` to draw, in a few words for the panel that stays empty:
/// the file is missing, the key is absent, null at every step, or holds no numbers (a
/// histogram), and when rlvr writes that key ([`when_logged`]), e.g. "`mismatch/masked_frac` is
/// null at every step: logged only with algorithm.mismatch_correction on".
pub(crate) fn why_empty(run: &Path, metric: &str) -> Empty {
    let (path, key) = metric_source(run, metric);
    let file = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into(),
    );
    let why = match read_lines(&path) {
        Err(_) => format!("no {file} in this run"),
        Ok(lines) => {
            let values: Vec<&serde_json::Value> = lines.iter().filter_map(|l| l.get(key)).collect();
            if values.is_empty() {
                format!("no `{key}` in {file}")
            } else if values.iter().all(|v| v.is_null()) {
                format!("`{key}` is null at every step")
            } else if values.iter().any(|v| v.is_array()) {
                format!("`{key}` holds arrays, not numbers (a histogram: draw it with --heatmap)")
            } else {
                format!("`{key}` holds no numbers")
            }
        }
    };
    Empty {
        why,
        when: when_logged(key),
    }
}

/// When rlvr writes a key that is null or absent otherwise (docs/runs.md, docs/corrections.md,
/// docs/environments.md), for [`why_empty`]'s note.
fn when_logged(key: &str) -> Option<&'static str> {
    let rules: [(&str, &str); 7] = [
        (
            "mismatch/",
            "logged only with algorithm.mismatch_correction on",
        ),
        ("opsm/", "logged only with algorithm.opsm_delta set"),
        (
            "red_drop/",
            "logged only with RED-Drop on (algorithm.red_drop)",
        ),
        (
            "hist/mismatch",
            "null on the steps without on-policy (staleness 0) rows",
        ),
        ("env/", "logged only by multi-turn runs (an [env] table)"),
        (
            "eval/",
            "logged only at evaluation steps (train.eval_every, data.test)",
        ),
        (
            "reward/",
            "a reward component's keys exist only with [[reward.components]]",
        ),
    ];
    rules
        .iter()
        .find(|(p, _)| key.starts_with(p))
        .map(|(_, w)| *w)
        .filter(|w| !w.starts_with("a reward") || key.matches('/').count() > 1)
}
