//! The JSONL files of a run directory: the metrics line writer (DESIGN.md section 10: one JSON
//! object per step with exactly the keys of [`Metric::ALL`], null where undefined, plus `eval/*` at
//! evaluation steps), the append and the resume cut-back that rollouts.jsonl, eval.jsonl and
//! diagnostics.jsonl share with it, and the readers of `rlvr plot` ([`read_metrics`]: strict;
//! [`read_metrics_but_a_cut_end`]: strict but for a last line cut by a kill) and the lab
//! ([`read_lines`]: lenient, for a run being written or killed mid-line).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde_json::{Map, Value};

use crate::key::Metric;

pub use crate::key::{METRIC_KEYS, TIME_KEYS};

/// One parsed JSONL line.
pub type Line = Map<String, Value>;

/// One metrics line being filled: every key of [`Metric::ALL`] starts null.
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

    /// Sets `key` (a [`Metric`], an [`crate::key::Eval`] or another key) to a float (non-finite →
    /// null) or null.
    pub fn set(&mut self, key: impl AsRef<str>, v: Option<f64>) {
        let v = match v {
            Some(x) if x.is_finite() => Value::from(x),
            _ => Value::Null,
        };
        self.set_value(key, v);
    }

    /// Sets `key` to any JSON value, appending it when it is not a standard key (e.g. `eval/*`).
    pub fn set_value(&mut self, key: impl AsRef<str>, v: Value) {
        let key = key.as_ref();
        match self.values.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.values.push((key.to_string(), v)),
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: impl AsRef<str>) -> Option<&Value> {
        let key = key.as_ref();
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
/// file is left missing. The file is replaced atomically ([`crate::fs::atomic_write`]).
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
        if v.get(Metric::Step.key())
            .and_then(Value::as_u64)
            .is_some_and(|s| s <= step)
        {
            kept.extend_from_slice(line);
            kept.push(b'\n');
        }
    }
    crate::fs::atomic_write(path, &kept).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads every line of a JSONL file (metrics.jsonl, eval.jsonl, diagnostics.jsonl); blank lines
/// are skipped.
///
/// # Errors
/// I/O or JSON errors naming file and line.
pub fn read_metrics(path: &Path) -> anyhow::Result<Vec<Line>> {
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

/// [`read_metrics`], but a last line cut short (a run killed while writing it: the JSON ends
/// early, or the file ends without its newline) is left out. Returns the lines before it and,
/// when one was left out, a warning naming the file and the line.
///
/// # Errors
/// I/O errors; a line that is not JSON anywhere else (named with file and line).
pub fn read_metrics_but_a_cut_end(path: &Path) -> anyhow::Result<(Vec<Line>, Option<String>)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) => std::borrow::Cow::Borrowed(t),
        // A character cut at the very end (a kill inside a multi-byte character): the last
        // line's JSON then ends early too.
        Err(e) if e.error_len().is_none() => String::from_utf8_lossy(&bytes),
        Err(e) => {
            let line = bytes[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1;
            anyhow::bail!("{}:{line}: not UTF-8 ({e})", path.display());
        }
    };
    let numbered: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let mut lines = Vec::with_capacity(numbered.len());
    for (k, &(i, l)) in numbered.iter().enumerate() {
        match serde_json::from_str::<Line>(l) {
            Ok(v) => lines.push(v),
            Err(e)
                if k + 1 == numbered.len()
                    && (e.classify() == serde_json::error::Category::Eof
                        || !text.ends_with('\n')) =>
            {
                let warning = format!(
                    "{}:{}: the last line is cut short ({e}; a run killed while writing it), \
                     left out",
                    path.display(),
                    i + 1
                );
                return Ok((lines, Some(warning)));
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("{}:{}", path.display(), i + 1)))
            }
        }
    }
    Ok((lines, None))
}

/// Reads the lines of `run_dir`'s metrics.jsonl that parse as JSON objects, leniently: a missing
/// file gives none, and an unparsable line (one cut by a kill, one being written) is skipped.
pub fn read_lines(run_dir: &Path) -> Vec<Line> {
    std::fs::read_to_string(crate::files::metrics(run_dir))
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The (step, value) of `key` on `line`, when both are numbers.
pub fn point(line: &Line, key: impl AsRef<str>) -> Option<(f64, f64)> {
    Some((
        line.get(Metric::Step.key())?.as_f64()?,
        line.get(key.as_ref())?.as_f64()?,
    ))
}

/// (step, value) of `key` over `lines`, in file order; lines where either is null or not a number
/// are skipped.
pub fn series(lines: &[Line], key: impl AsRef<str>) -> Vec<(f64, f64)> {
    let key = key.as_ref();
    lines.iter().filter_map(|l| point(l, key)).collect()
}

/// The number in `key` of `line`, if any.
pub fn number(line: &Line, key: impl AsRef<str>) -> Option<f64> {
    line.get(key.as_ref())?.as_f64()
}

/// The step of `run_dir`'s metrics.jsonl's last parsable line (the steps the run has reached), 0
/// without one.
pub fn last_step(run_dir: &Path) -> u64 {
    std::fs::read_to_string(crate::files::metrics(run_dir))
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find_map(|l| serde_json::from_str::<Value>(l).ok())
        })
        .and_then(|v| v.get(Metric::Step.key())?.as_u64())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Eval;

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

    /// `rlvr plot`'s reader leaves out a last line a kill cut short (inside the JSON, inside a
    /// multi-byte character, or whole but without its newline) with a warning naming the file
    /// and the line; any other bad line is an error naming them.
    #[test]
    fn a_cut_last_line_is_left_out_with_a_warning_naming_file_and_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metrics.jsonl");
        let good = "{\"step\":1}\n\n{\"step\":2}\n";
        let read = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            read_metrics_but_a_cut_end(&path).map(|(l, w)| (l.len(), w))
        };
        assert_eq!(read(good.as_bytes()).unwrap(), (2, None));
        for cut in [
            &b"{\"step\":3,\"loss\":0."[..],
            b"{\"step\":3,\"completion\":\"\xC3",
            b"{\"step\":3,\"loss\":1}x",
            b"{\"step\":3,\"lo\n",
        ] {
            let mut bytes = good.as_bytes().to_vec();
            bytes.extend_from_slice(cut);
            let (n, w) = read(&bytes).unwrap();
            let w = w.unwrap();
            assert_eq!(n, 2, "{w}");
            assert!(
                w.starts_with(&format!("{}:4: the last line is cut short", path.display())),
                "{w}"
            );
        }
        for (bad, line) in [
            (&b"{\"step\":3,\"lo\n{\"step\":4}\n"[..], 4),
            (b"not json\n", 4),
            (b"{\"step\":3,\"x\":\"\xC3\"}\n{\"step\":4}\n", 4),
        ] {
            let mut bytes = good.as_bytes().to_vec();
            bytes.extend_from_slice(bad);
            let e = format!("{:#}", read(&bytes).unwrap_err());
            assert!(e.starts_with(&format!("{}:{line}", path.display())), "{e}");
        }
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

    #[test]
    fn a_written_line_reads_back_through_both_readers() {
        let tmp = tempfile::tempdir().unwrap();
        let path = crate::files::metrics(tmp.path());
        for t in 1..=3u64 {
            let mut l = MetricsLine::new(t);
            l.set(Metric::Loss, Some(0.5 * t as f64));
            l.set(Metric::KlBehaviour, Some(f64::NAN)); // non-finite → null
            if t == 2 {
                l.set(Eval::Accuracy, Some(0.25));
            }
            assert_eq!(l.keys().count(), 26 + usize::from(t == 2));
            append_line(&path, &l.to_json()).unwrap();
        }
        // A torn last line: the lenient reader skips it, the strict one names file and line.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"step\":4,\"lo")
            .unwrap();
        let lines = read_lines(tmp.path());
        assert_eq!(lines.len(), 3);
        assert_eq!(
            series(&lines, Metric::Loss),
            [(1.0, 0.5), (2.0, 1.0), (3.0, 1.5)]
        );
        assert_eq!(series(&lines, Eval::Accuracy), [(2.0, 0.25)]);
        assert!(series(&lines, Metric::KlBehaviour).is_empty());
        assert_eq!(last_step(tmp.path()), 3);
        assert_eq!(last_step(&tmp.path().join("none")), 0);
        let e = read_metrics(&path).unwrap_err();
        assert!(format!("{e:#}").contains("metrics.jsonl:4"), "{e:#}");
        let first = &lines[0];
        let keys: Vec<&str> = first.keys().map(String::as_str).collect();
        // serde_json's Map is sorted unless preserve_order; compare as sets.
        let mut want = METRIC_KEYS.to_vec();
        want.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(got, want);
    }
}
