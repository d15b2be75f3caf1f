//! TensorBoard event files (`RUN_DIR/tensorboard/events.out.tfevents.*`): every scalar of
//! metrics.jsonl, eval.jsonl and diagnostics.jsonl, and the resolved config as text.
//!
//! The format is TensorFlow's `Event` protobuf (`tensorflow/core/util/event.proto`,
//! `summary.proto`), each event framed as a TFRecord: the length (u64 little-endian), the masked
//! CRC-32C of the length, the serialized event, the masked CRC-32C of the event. The messages are
//! derived with `prost` (only the fields rlvr writes, under their proto field numbers), the CRC is
//! the `crc32c` crate's.
//!
//! Tags (stable; TensorBoard groups them by the part before the first `/`): a metrics.jsonl key is
//! its own tag (`loss`, `reward/mean`, `reward/<component>/mean`, …) except the `eval/*` keys,
//! which come from eval.jsonl as `eval/<field>`; a diagnostics.jsonl key `k` is `diagnostics/k`;
//! the config is the text tag `config`. Booleans are written as 0/1, nulls are left out (a gap).
//! The log-ratio histograms of diagnostics.jsonl (`hist/ratio`, `hist/mismatch`: token counts over
//! `rlvr_algo::RATIO_HIST_EDGES`) are TensorBoard histograms under `diagnostics/hist/…` (see
//! [`histograms`] for how the buckets map).
//!
//! Each step's events are written with one `write_all` and flushed, so a killed run leaves a file
//! whose completed steps a reader sees (at most a torn last record, which readers skip). On resume
//! the JSONL files are cut back to the checkpoint and [`rebuild`] writes the events afresh from
//! them, so the event file always agrees with the JSONL files.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use prost::Message;
use serde_json::{Map, Value};

/// `tensorflow.Event` (the fields written here).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The step.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// `file_version` (first event) or `summary`.
    #[prost(oneof = "EventWhat", tags = "3, 5")]
    pub what: Option<EventWhat>,
}

/// The `what` oneof of [`Event`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum EventWhat {
    /// `brain.Event:2` in the first event of a file.
    #[prost(string, tag = "3")]
    FileVersion(String),
    /// The values of one step.
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`: a scalar (`simple_value`) or a tensor with plugin metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    /// The tag.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A scalar.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    /// A histogram (TensorBoard's histograms and distributions dashboards).
    #[prost(message, optional, tag = "5")]
    pub histo: Option<HistogramProto>,
    /// A tensor (the text plugin's string).
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<TensorProto>,
    /// Which plugin reads `tensor`.
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
}

/// `tensorflow.HistogramProto`: bucket `i` counts the values in
/// `(bucket_limit[i-1], bucket_limit[i]]`, the first from `min`; TensorBoard draws the first bucket
/// from `min` and the last up to `max`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HistogramProto {
    /// The left end of the first bucket.
    #[prost(double, tag = "1")]
    pub min: f64,
    /// The right end of the last bucket.
    #[prost(double, tag = "2")]
    pub max: f64,
    /// The number of values (the sum of `bucket`).
    #[prost(double, tag = "3")]
    pub num: f64,
    /// The sum of the values (0 here: rlvr keeps counts per bucket only).
    #[prost(double, tag = "4")]
    pub sum: f64,
    /// The sum of the squared values (0 here, as `sum`).
    #[prost(double, tag = "5")]
    pub sum_squares: f64,
    /// The right edge of each bucket.
    #[prost(double, repeated, tag = "6")]
    pub bucket_limit: Vec<f64>,
    /// The count of each bucket.
    #[prost(double, repeated, tag = "7")]
    pub bucket: Vec<f64>,
}

/// `tensorflow.SummaryMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryMetadata {
    /// The plugin.
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `tensorflow.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginData {
    /// `text` here.
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

/// `tensorflow.TensorProto` (a string tensor).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// `DT_STRING` = 7.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// The shape (a scalar: no dims).
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShapeProto>,
    /// The strings.
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto` (no dims: a scalar).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {}

/// The folder of a run's event files.
pub fn dir(run_dir: &Path) -> PathBuf {
    run_dir.join("tensorboard")
}

/// TFRecord's masked CRC-32C.
fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One event framed as a TFRecord.
pub fn frame(event: &Event) -> Vec<u8> {
    let data = event.encode_to_vec();
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(&data);
    out.extend_from_slice(&masked_crc(&data).to_le_bytes());
    out
}

/// Reads every complete event of a file (a torn last record ends the list).
///
/// # Errors
/// I/O errors, a CRC mismatch or an undecodable event, naming the file and the byte offset.
pub fn read_events(path: &Path) -> anyhow::Result<Vec<Event>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 12 <= bytes.len() {
        let len_b = &bytes[at..at + 8];
        let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
        anyhow::ensure!(
            crc == masked_crc(len_b),
            "{}: bad length CRC at byte {at}",
            path.display()
        );
        let len = u64::from_le_bytes(len_b.try_into().expect("8 bytes")) as usize;
        let end = at + 12 + len + 4;
        if end > bytes.len() {
            break;
        }
        let data = &bytes[at + 12..at + 12 + len];
        let crc = u32::from_le_bytes(bytes[end - 4..end].try_into().expect("4 bytes"));
        anyhow::ensure!(
            crc == masked_crc(data),
            "{}: bad data CRC at byte {at}",
            path.display()
        );
        out.push(Event::decode(data).with_context(|| format!("{}: byte {at}", path.display()))?);
        at = end;
    }
    Ok(out)
}

/// Which JSONL file a record comes from (it decides the tags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// metrics.jsonl: keys as tags, `eval/*` left to eval.jsonl.
    Metrics,
    /// eval.jsonl: `eval/<field>`.
    Eval,
    /// diagnostics.jsonl: `diagnostics/<key>`.
    Diagnostics,
}

/// The scalars of one JSONL record as (tag, value): numbers as f32, booleans as 0/1, everything
/// else (null, strings, lists) left out; `step` is the event's step, not a tag.
pub fn scalars(source: Source, record: &Map<String, Value>) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    for (k, v) in record {
        if k == "step" {
            continue;
        }
        let tag = match source {
            Source::Metrics if k.starts_with("eval/") => continue,
            Source::Metrics => k.clone(),
            Source::Eval if k.starts_with("eval/") => k.clone(),
            Source::Eval => format!("eval/{k}"),
            Source::Diagnostics => format!("diagnostics/{k}"),
        };
        let x = match v {
            Value::Number(n) => n.as_f64(),
            Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
            _ => None,
        };
        if let Some(x) = x {
            out.push((tag, x as f32));
        }
    }
    out
}

/// The outer ends drawn for the open first and last buckets of a log-ratio histogram (nats): the
/// edges of `RATIO_HIST_EDGES` are ±10 at most, so ±20 draws those buckets as wide as `[-20, -10)`
/// and `[10, 20)`.
const HIST_OUTER: f64 = 20.0;

/// The log-ratio histograms of one diagnostics.jsonl record as (tag, histogram): each key
/// `hist/…` whose value is `RATIO_BUCKETS` finite counts over `rlvr_algo::RATIO_HIST_EDGES` (other
/// sources and keys give none). Bucket `k` keeps its count; its right edge is `RATIO_HIST_EDGES[k]`
/// (the last one's is [`HIST_OUTER`]), and `min` is −[`HIST_OUTER`]. rlvr's buckets are closed on
/// the left (`e ≤ log ρ < e'`), TensorBoard's on the right: a value exactly on an edge is counted
/// one bucket up of where TensorBoard's convention would put it, and `sum`/`sum_squares` are 0
/// (not recorded). A step with no tokens (all counts 0) is left out.
pub fn histograms(source: Source, record: &Map<String, Value>) -> Vec<(String, HistogramProto)> {
    use rlvr_algo::{RATIO_BUCKETS, RATIO_HIST_EDGES};
    if source != Source::Diagnostics {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (k, v) in record {
        if !k.starts_with("hist/") {
            continue;
        }
        let Some(a) = v.as_array() else { continue };
        let counts: Option<Vec<f64>> = a.iter().map(Value::as_f64).collect();
        let Some(bucket) = counts else { continue };
        if bucket.len() != RATIO_BUCKETS || bucket.iter().any(|c| !c.is_finite()) {
            continue;
        }
        let num: f64 = bucket.iter().sum();
        if num <= 0.0 {
            continue;
        }
        let mut bucket_limit = RATIO_HIST_EDGES.to_vec();
        bucket_limit.push(HIST_OUTER);
        out.push((
            format!("diagnostics/{k}"),
            HistogramProto {
                min: -HIST_OUTER,
                max: HIST_OUTER,
                num,
                sum: 0.0,
                sum_squares: 0.0,
                bucket_limit,
                bucket,
            },
        ));
    }
    out
}

/// The event file of a run, appended to step by step. The file (and its directory) is created
/// at the first record written, so a run that fails before its first step or evaluation leaves
/// no event file (TensorBoard would list it as an empty run).
pub struct EventWriter {
    path: PathBuf,
    /// The open file, once something was written.
    file: Option<std::fs::File>,
    /// The file-version and config events, written first when the file is created.
    header: Vec<u8>,
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl EventWriter {
    /// Starts a new event file in `RUN_DIR/tensorboard/` (removing the run's older ones now), with
    /// the file-version event and the resolved config as text at step 0; the file is created
    /// with the first record ([`EventWriter`]).
    ///
    /// # Errors
    /// I/O errors naming the file.
    pub fn create(run_dir: &Path, config_toml: &str) -> anyhow::Result<Self> {
        let d = dir(run_dir);
        if d.exists() {
            for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
                let p = e?.path();
                let is_events = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("events.out.tfevents."));
                if is_events {
                    std::fs::remove_file(&p)
                        .with_context(|| format!("removing {}", p.display()))?;
                }
            }
        }
        let wall = now();
        let path = d.join(format!("events.out.tfevents.{}.rlvr", wall as u64));
        let mut bytes = frame(&Event {
            wall_time: wall,
            step: 0,
            what: Some(EventWhat::FileVersion("brain.Event:2".into())),
        });
        let text = SummaryValue {
            tag: "config".into(),
            simple_value: None,
            histo: None,
            // Indented: Markdown shows it as code, one key per line.
            tensor: Some(TensorProto {
                dtype: 7,
                tensor_shape: Some(TensorShapeProto {}),
                string_val: vec![config_toml
                    .lines()
                    .map(|l| format!("    {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
                    .into_bytes()],
            }),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".into(),
                }),
            }),
        };
        bytes.extend(frame(&Event {
            wall_time: wall,
            step: 0,
            what: Some(EventWhat::Summary(Summary { value: vec![text] })),
        }));
        Ok(EventWriter {
            path,
            file: None,
            header: bytes,
        })
    }

    /// The event file's path (the file exists once a record was written).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the scalars and histograms of one JSONL record (its `step` field is the event's
    /// step), flushed.
    ///
    /// # Errors
    /// I/O errors naming the file; a record without `step`.
    pub fn record(&mut self, source: Source, record: &Map<String, Value>) -> anyhow::Result<()> {
        let step = record
            .get("step")
            .and_then(Value::as_i64)
            .context("a JSONL record without an integer `step`")?;
        let mut value: Vec<SummaryValue> = scalars(source, record)
            .into_iter()
            .map(|(tag, x)| SummaryValue {
                tag,
                simple_value: Some(x),
                histo: None,
                tensor: None,
                metadata: None,
            })
            .collect();
        value.extend(
            histograms(source, record)
                .into_iter()
                .map(|(tag, h)| SummaryValue {
                    tag,
                    simple_value: None,
                    histo: Some(h),
                    tensor: None,
                    metadata: None,
                }),
        );
        if value.is_empty() {
            return Ok(());
        }
        let bytes = frame(&Event {
            wall_time: now(),
            step,
            what: Some(EventWhat::Summary(Summary { value })),
        });
        self.write(&bytes)
    }

    /// Appends the scalars of a JSONL line (as written to the file).
    ///
    /// # Errors
    /// A line that is not a JSON object; I/O errors.
    pub fn line(&mut self, source: Source, line: &str) -> anyhow::Result<()> {
        let m: Map<String, Value> = serde_json::from_str(line)
            .with_context(|| format!("a {source:?} line that is not a JSON object"))?;
        self.record(source, &m)
    }

    fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                if let Some(d) = self.path.parent() {
                    std::fs::create_dir_all(d)
                        .with_context(|| format!("creating {}", d.display()))?;
                }
                let mut f = std::fs::File::create(&self.path)
                    .with_context(|| format!("creating {}", self.path.display()))?;
                f.write_all(&self.header)
                    .with_context(|| format!("writing {}", self.path.display()))?;
                self.file.insert(f)
            }
        };
        file.write_all(bytes)
            .and_then(|_| file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// A fresh event file for `run_dir` from its JSONL files as they are (metrics.jsonl, eval.jsonl,
/// diagnostics.jsonl, each when present), after the config: what a resume starts from.
///
/// # Errors
/// I/O errors; a malformed line (naming file and line).
pub fn rebuild(run_dir: &Path, config_toml: &str) -> anyhow::Result<EventWriter> {
    let mut w = EventWriter::create(run_dir, config_toml)?;
    for (name, source) in [
        ("metrics.jsonl", Source::Metrics),
        ("eval.jsonl", Source::Eval),
        ("diagnostics.jsonl", Source::Diagnostics),
    ] {
        let p = run_dir.join(name);
        if !p.exists() {
            continue;
        }
        for rec in super::metrics::read_metrics(&p)? {
            w.record(source, &rec)?;
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C's standard check value ("123456789" → 0xE3069283) and its TFRecord mask worked
    /// by hand: rotate right by 15 → 0x2507C60D, plus 0xA282EAD8 → 0xC78AB0E5 (mod 2³²).
    #[test]
    fn masked_crc_matches_hand_computation() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
    }

    /// A run that fails before its first record leaves no event file (and no directory), so
    /// TensorBoard lists no empty run; a resume's `create` still removes the older files at once.
    #[test]
    fn no_event_file_before_the_first_record() {
        let d = tempfile::tempdir().unwrap();
        let w = EventWriter::create(d.path(), "a = 1").unwrap();
        assert!(!dir(d.path()).exists());
        drop(w);
        assert!(!dir(d.path()).exists());
        let mut w = EventWriter::create(d.path(), "a = 1").unwrap();
        // A record with no scalar writes nothing either.
        w.line(Source::Metrics, r#"{"step":1,"x":null}"#).unwrap();
        assert!(!w.path().exists());
        w.line(Source::Metrics, r#"{"step":1,"loss":0.5}"#).unwrap();
        let ev = read_events(w.path()).unwrap();
        assert_eq!(ev.len(), 3, "file version, config, the step");
        let old = w.path().to_path_buf();
        drop(w);
        let w = EventWriter::create(d.path(), "a = 2").unwrap();
        assert!(!old.exists() && !w.path().exists());
    }

    #[test]
    fn events_round_trip_and_a_torn_record_is_dropped() {
        let d = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(d.path(), "a = 1").unwrap();
        w.line(
            Source::Metrics,
            r#"{"step":1,"loss":0.5,"eval/accuracy":0.25,"skipped":true,"x":null}"#,
        )
        .unwrap();
        w.line(
            Source::Diagnostics,
            r#"{"step":1,"rows":8,"hist/ratio":[0,1,0,0,0,0,5,2,0,0,0,0,3],"hist/mismatch":null,"staleness/counts":[4,4]}"#,
        )
        .unwrap();
        let p = w.path().to_path_buf();
        let ev = read_events(&p).unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(
            ev[0].what,
            Some(EventWhat::FileVersion("brain.Event:2".into()))
        );
        let Some(EventWhat::Summary(s)) = &ev[2].what else {
            panic!("{:?}", ev[2]);
        };
        let got: Vec<(&str, Option<f32>)> = s
            .value
            .iter()
            .map(|v| (v.tag.as_str(), v.simple_value))
            .collect();
        assert_eq!(got, vec![("loss", Some(0.5)), ("skipped", Some(1.0))]);
        assert_eq!(ev[2].step, 1);
        let Some(EventWhat::Summary(s)) = &ev[3].what else {
            panic!();
        };
        assert_eq!(s.value[0].tag, "diagnostics/rows");
        // The ratio histogram: counts unchanged, right edges RATIO_HIST_EDGES then +20.
        assert_eq!(s.value.len(), 2, "{:?}", s.value);
        assert_eq!(s.value[1].tag, "diagnostics/hist/ratio");
        let h = s.value[1].histo.as_ref().unwrap();
        assert_eq!(
            h.bucket,
            vec![0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0]
        );
        assert_eq!(h.num, 11.0);
        assert_eq!((h.min, h.max), (-20.0, 20.0));
        assert_eq!(h.bucket_limit[0], -10.0);
        assert_eq!(h.bucket_limit[6], 1e-4);
        assert_eq!(h.bucket_limit[12], 20.0);
        // Cut the file inside the last record: the reader keeps the complete ones.
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        assert_eq!(read_events(&p).unwrap().len(), 3);
    }
}
