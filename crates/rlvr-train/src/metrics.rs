//! metrics.jsonl (DESIGN.md section 10): one JSON object per step with exactly the listed keys
//! (null where undefined), plus `eval/*` at evaluation steps; and the other JSONL files of the run
//! directory (rollouts.jsonl, eval.jsonl, diagnostics.jsonl).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

/// The metric keys of every metrics.jsonl line, in the order written (DESIGN.md section 10).
pub const METRIC_KEYS: [&str; 26] = [
    "step",
    "loss",
    "reward/mean",
    "reward/std",
    "accuracy",
    "completion_len/mean",
    "clip_frac",
    "clip_frac/low",
    "clip_frac/high",
    "ratio/mean",
    "ratio/min",
    "ratio/max",
    "kl_ref",
    "kl_behaviour",
    "entropy",
    "ess",
    "grad_norm",
    "lr",
    "staleness/mean",
    "staleness/max",
    "zero_std_frac",
    "masked_frac",
    "skipped",
    "time/sample_s",
    "time/train_s",
    "tokens_per_s",
];

/// Keys whose values depend on wall-clock time (excluded from reproducibility comparisons).
pub const TIME_KEYS: [&str; 3] = ["time/sample_s", "time/train_s", "tokens_per_s"];

/// One metrics line being filled: every key of [`METRIC_KEYS`] starts null.
#[derive(Debug, Clone)]
pub struct MetricsLine {
    values: Vec<(String, Value)>,
}

impl MetricsLine {
    /// A line for `step` with every other key null.
    pub fn new(step: u64) -> Self {
        let mut values: Vec<(String, Value)> = METRIC_KEYS
            .iter()
            .map(|k| (k.to_string(), Value::Null))
            .collect();
        values[0].1 = Value::from(step);
        MetricsLine { values }
    }

    /// Sets `key` to a float (non-finite → null) or null.
    pub fn set(&mut self, key: &str, v: Option<f64>) {
        let v = match v {
            Some(x) if x.is_finite() => Value::from(x),
            _ => Value::Null,
        };
        self.set_value(key, v);
    }

    /// Sets `key` to any JSON value, appending it when it is not a standard key (e.g. `eval/*`).
    pub fn set_value(&mut self, key: &str, v: Value) {
        match self.values.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.values.push((key.to_string(), v)),
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.values.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The line as compact JSON, keys in order.
    pub fn to_json(&self) -> String {
        let parts: Vec<String> = self
            .values
            .iter()
            .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), v))
            .collect();
        format!("{{{}}}", parts.join(","))
    }
}

/// Appends one line to `path` (created when missing) and flushes it.
///
/// # Errors
/// I/O errors naming the file.
pub fn append_line(path: &Path, line: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{line}").with_context(|| format!("writing {}", path.display()))?;
    f.flush()?;
    Ok(())
}

/// Drops the lines of a JSONL file whose `step` is above `step` (and any torn last line): run at
/// resume so that the files continue from the checkpoint.
///
/// # Errors
/// I/O errors.
pub fn truncate_after(path: &Path, step: u64) -> anyhow::Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let mut kept = String::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v.get("step")
            .and_then(Value::as_u64)
            .is_some_and(|s| s <= step)
        {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    rlvr_model::weights::atomic_write(path, kept.as_bytes())?;
    Ok(())
}

/// Reads every line of a metrics.jsonl file.
///
/// # Errors
/// I/O or JSON errors naming file and line.
pub fn read_metrics(path: &Path) -> anyhow::Result<Vec<serde_json::Map<String, Value>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}:{}", path.display(), i + 1))
        })
        .collect()
}

/// The metrics line of one step (DESIGN.md section 10 keys; null where undefined).
pub fn step_metrics(
    step: u64,
    exps: &[crate::experience::Experience],
    rep: &crate::trainer::StepReport,
    lr: f64,
    sample_s: f64,
    train_s: f64,
) -> MetricsLine {
    let mut l = MetricsLine::new(step);
    let rewards: Vec<f64> = exps.iter().filter_map(|e| e.reward).collect();
    let mean = |x: &[f64]| (!x.is_empty()).then(|| x.iter().sum::<f64>() / x.len() as f64);
    let rm = mean(&rewards);
    l.set("reward/mean", rm);
    l.set(
        "reward/std",
        rm.map(|m| {
            (rewards.iter().map(|r| (r - m).powi(2)).sum::<f64>() / rewards.len() as f64).sqrt()
        }),
    );
    let correct: Vec<f64> = exps
        .iter()
        .filter_map(|e| e.is_correct())
        .map(|c| if c { 1.0 } else { 0.0 })
        .collect();
    l.set("accuracy", mean(&correct));
    let lens: Vec<f64> = exps.iter().map(|e| e.completion_ids.len() as f64).collect();
    l.set("completion_len/mean", mean(&lens));
    let st: Vec<f64> = exps
        .iter()
        .filter_map(|e| e.staleness(step))
        .map(|s| s as f64)
        .collect();
    l.set("staleness/mean", mean(&st));
    l.set("staleness/max", st.iter().cloned().reduce(f64::max));
    if let Some(m) = &rep.loss {
        l.set("loss", Some(m.loss));
        l.set("clip_frac", m.clip_frac);
        l.set("clip_frac/low", m.clip_frac_low);
        l.set("clip_frac/high", m.clip_frac_high);
        l.set("ratio/mean", m.ratio_mean);
        l.set("ratio/min", m.ratio_min);
        l.set("ratio/max", m.ratio_max);
        l.set("kl_ref", m.kl_ref);
        l.set("kl_behaviour", m.kl_behaviour);
        l.set("entropy", m.entropy);
        l.set("ess", m.ess);
        l.set("masked_frac", m.masked_frac);
    }
    l.set("zero_std_frac", rep.adv.zero_std_frac());
    l.set("grad_norm", rep.grad_norm);
    l.set("lr", Some(lr));
    l.set_value("skipped", serde_json::Value::Bool(rep.skipped));
    l.set("time/sample_s", Some(sample_s));
    l.set("time/train_s", Some(train_s));
    let tokens: usize = exps.iter().map(|e| e.completion_ids.len()).sum();
    let secs = sample_s + train_s;
    l.set("tokens_per_s", (secs > 0.0).then(|| tokens as f64 / secs));
    l
}
