//! The JSONL files of a run directory: metrics.jsonl (DESIGN.md section 10: one JSON object per
//! step with exactly the listed keys, null where undefined, plus `eval/*` at evaluation steps),
//! and the appending, reading and resume cut-back that rollouts.jsonl, eval.jsonl and
//! diagnostics.jsonl share with it.

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
pub const TIME_KEYS: [&str; 4] = [
    "time/sample_s",
    "time/train_s",
    "tokens_per_s",
    "time/env_s",
];

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

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(|(k, _)| k.as_str())
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

/// Drops the lines of a JSONL file whose `step` is above `step` (and any torn or unparsable line,
/// such as a last line cut inside a multi-byte character): run at resume so that the files continue
/// from the checkpoint. Works on bytes, so a file holding invalid UTF-8 is still cut back; a missing
/// file is left missing.
///
/// # Errors
/// I/O errors naming the file.
pub fn truncate_after(path: &Path, step: u64) -> anyhow::Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut kept = Vec::with_capacity(bytes.len());
    for line in bytes.split(|&b| b == b'\n') {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if v.get("step")
            .and_then(Value::as_u64)
            .is_some_and(|s| s <= step)
        {
            kept.extend_from_slice(line);
            kept.push(b'\n');
        }
    }
    rlvr_model::weights::atomic_write(path, &kept)
        .with_context(|| format!("writing {}", path.display()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_in(path: &Path) -> Vec<u64> {
        let bytes = std::fs::read(path).unwrap();
        let text = String::from_utf8(bytes).expect("cut back to valid UTF-8");
        text.lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn a_torn_non_ascii_last_line_does_not_stop_the_cut_back() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("rollouts.jsonl");
        let mut bytes = Vec::new();
        for s in 1..=4 {
            bytes.extend_from_slice(
                format!("{{\"step\":{s},\"completion\":\"é{s}\"}}\n").as_bytes(),
            );
        }
        // The next line was cut inside "é" (0xC3 0xA9): invalid UTF-8 at the end of the file.
        bytes.extend_from_slice(b"{\"step\":5,\"completion\":\"\xC3");
        std::fs::write(&path, &bytes).unwrap();
        truncate_after(&path, 2).unwrap();
        assert_eq!(steps_in(&path), [1, 2]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"é2\"") && text.ends_with("}\n"), "{text}");
        // Invalid UTF-8 inside a kept step's line is dropped with the line, the rest kept.
        std::fs::write(
            &path,
            b"{\"step\":1}\n{\"step\":2,\"x\":\"\xFF\"}\n{\"step\":3}\n",
        )
        .unwrap();
        truncate_after(&path, 3).unwrap();
        assert_eq!(steps_in(&path), [1, 3]);
        // A missing file stays missing.
        truncate_after(&tmp.path().join("none.jsonl"), 1).unwrap();
        assert!(!tmp.path().join("none.jsonl").exists());
    }
}
