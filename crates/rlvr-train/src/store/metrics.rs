//! The JSONL files of a run directory: metrics.jsonl (DESIGN.md section 10: one JSON object per
//! step with exactly the listed keys, null where undefined, plus `eval/*` at evaluation steps),
//! and the appending, reading and resume cut-back that rollouts.jsonl, eval.jsonl and
//! diagnostics.jsonl share with it. The code is rlvr-rundir's (shared with `rlvr plot` and the
//! lab); this module names it where the trainer's stages look for it.

pub use rlvr_rundir::jsonl::{append_line, read_metrics, truncate_after, MetricsLine};
pub use rlvr_rundir::key::{Eval, Metric, METRIC_KEYS, TIME_KEYS};

/// The mean of each key's values, keys in order: `(key, value)` pairs in the order given (one per
/// item that carries the key), each key's values summed in that order and divided by their count,
/// so a key set that changes between items averages each key over its own items. Used for
/// `reward/<component>/<key>/mean` and `env/metrics/<name>/mean`.
pub(crate) fn keyed_means(pairs: impl IntoIterator<Item = (String, f64)>) -> Vec<(String, f64)> {
    let mut sums: std::collections::BTreeMap<String, (f64, u64)> = Default::default();
    for (key, x) in pairs {
        let s = sums.entry(key).or_default();
        s.0 += x;
        s.1 += 1;
    }
    sums.into_iter()
        .map(|(key, (sum, n))| (key, sum / n as f64))
        .collect()
}
