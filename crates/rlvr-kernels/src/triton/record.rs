//! The launch recorder: a [`LaunchPlan`] written with the CPU op's inputs and expected outputs,
//! for `kernels/replay.py` to run under Triton's interpreter. No GPU is involved: a wrong grid,
//! stride or argument order in a plan builder gives a wrong replayed result on a CPU.
//!
//! A record is a directory `<dir>/<label>/` holding `record.json` and one raw little-endian
//! file per buffer (`<buffer>.bin`: its initial contents, outputs included, since in-place
//! kernels read them) and per expected output (`<buffer>.expected.bin`). `record.json`:
//!
//! ```json
//! {
//!   "format": 1,
//!   "label": "fixture_rows_scale_bf16_b128",
//!   "name": "rows_scale_bf16_b128", "entry": "rows_scale_kernel", "family": "fixture",
//!   "source": "crates/rlvr-kernels/testdata/triton/fixture.py",
//!   "target": "sm90a", "grid": [3, 2, 1], "block": [128, 1, 1], "shared_bytes": 0,
//!   "num_warps": 4, "constexprs": {"BLOCK": 128},
//!   "args": [
//!     {"param": "x_ptr", "kind": "ptr", "buffer": "x", "offset_elems": 5, "dtype": "bf16"},
//!     {"param": "y_ptr", "kind": "ptr", "buffer": "y", "offset_elems": 0, "dtype": "bf16"},
//!     {"param": "n_rows", "kind": "i32", "value": 3}, ...,
//!     {"param": "alpha", "kind": "f32", "value": -0.75},
//!     {"param": "global_scratch", "kind": "scratch"},
//!     {"param": "profile_scratch", "kind": "scratch"}
//!   ],
//!   "buffers": {"x": {"dtype": "bf16", "shape": [485], "file": "x.bin"},
//!               "y": {"dtype": "bf16", "shape": [3, 152], "file": "y.bin"}},
//!   "expected": {"y": {"dtype": "bf16", "shape": [3, 152], "file": "y.expected.bin",
//!                      "atol": 1e-5, "rtol": 0.0078125}}
//! }
//! ```
//!
//! Scalar kinds are `i32`, `i64`, `f32` (f32 values written as the shortest decimal that reads
//! back as the same f32). The replayer finds the variant `name` built for `target` in `source`'s
//! `VARIANTS` (or any `kernels/src/*.py`),
//! checks that its function is `entry` and its non-constexpr parameters are the `param`s in
//! order and its constexprs equal `constexprs`, launches it on exactly `grid` with the
//! arguments (scratch omitted: the Python kernel has no such parameters), and compares each
//! expected buffer: `|got − want| ≤ atol + rtol·|want|` elementwise, in f32.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::manifest::{DType, KernelEntry};
use super::plan::{Arg, LaunchPlan};
use super::{Result, TritonError};

/// The record format written (`"format"` in `record.json`).
pub const RECORD_FORMAT: u32 = 1;

/// The environment variable naming the directory records are written to.
pub const RECORD_ENV: &str = "RLVR_KERNEL_RECORD";

/// A host-side buffer: a flat little-endian byte image of `shape` elements of `dtype`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostBuffer {
    /// The element type.
    pub dtype: DType,
    /// The logical shape (row-major); the bytes hold its product of elements.
    pub shape: Vec<usize>,
    /// The elements, little-endian.
    pub bytes: Vec<u8>,
}

impl HostBuffer {
    /// f32 values.
    pub fn f32(shape: &[usize], values: &[f32]) -> Self {
        Self::check_len(shape, values.len());
        HostBuffer {
            dtype: DType::Fp32,
            shape: shape.to_vec(),
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// bf16 values, rounded from f32 to nearest even (as the GPU's `cvt.rn.bf16.f32`).
    pub fn bf16(shape: &[usize], values: &[f32]) -> Self {
        Self::check_len(shape, values.len());
        HostBuffer {
            dtype: DType::Bf16,
            shape: shape.to_vec(),
            bytes: (values.iter())
                .flat_map(|v| bf16_bits(*v).to_le_bytes())
                .collect(),
        }
    }

    /// i32 values.
    pub fn i32(shape: &[usize], values: &[i32]) -> Self {
        Self::check_len(shape, values.len());
        HostBuffer {
            dtype: DType::I32,
            shape: shape.to_vec(),
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// Zeros of `dtype`.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Self {
        HostBuffer {
            dtype,
            shape: shape.to_vec(),
            bytes: vec![0; shape.iter().product::<usize>() * dtype.size()],
        }
    }

    /// Elements in the buffer.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The elements as f32 (fp32 and bf16 buffers; `None` for others).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        match self.dtype {
            DType::Fp32 => Some(
                (self.bytes.chunks_exact(4))
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            DType::Bf16 => Some(
                (self.bytes.chunks_exact(2))
                    .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                    .collect(),
            ),
            _ => None,
        }
    }

    fn check_len(shape: &[usize], n: usize) {
        assert_eq!(
            shape.iter().product::<usize>(),
            n,
            "HostBuffer: shape {shape:?} for {n} values"
        );
    }
}

/// f32 → bf16 bits, rounded to nearest even; NaN stays a (quiet) NaN.
pub fn bf16_bits(v: f32) -> u16 {
    if v.is_nan() {
        return 0x7FC0;
    }
    let u = v.to_bits();
    ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) as u16
}

/// How close a replayed output must be to the CPU op's: `|got − want| ≤ atol + rtol·|want|`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Tolerance {
    /// f32 outputs: within 1e-5 (issue 44's bar for f32 kernels against the CPU op).
    pub const F32: Tolerance = Tolerance {
        atol: 1e-5,
        rtol: 1e-5,
    };
    /// bf16 outputs: one bf16 rounding (2⁻⁸ relative) of an f32-accurate value.
    pub const BF16: Tolerance = Tolerance {
        atol: 1e-5,
        rtol: 1.0 / 128.0,
    };
}

#[derive(Serialize, Deserialize)]
struct BufferRecord {
    dtype: DType,
    shape: Vec<usize>,
    file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    atol: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rtol: Option<f64>,
}

#[derive(Serialize, Deserialize)]
struct ArgRecord {
    param: String,
    #[serde(flatten)]
    arg: Arg,
}

#[derive(Serialize, Deserialize)]
struct Record {
    format: u32,
    label: String,
    name: String,
    entry: String,
    family: String,
    source: String,
    target: super::manifest::Target,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    num_warps: u32,
    constexprs: BTreeMap<String, serde_json::Value>,
    args: Vec<ArgRecord>,
    buffers: BTreeMap<String, BufferRecord>,
    expected: BTreeMap<String, BufferRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timing: Option<Timing>,
}

/// What a timed record stands for in a training step (records at a benchmark shape, written by
/// `rlvr kernels record`): `kernels/replay_gpu.py --time` multiplies the launch's median time
/// by `repeat` and sums per `group`. Written as `"timing"` in `record.json`; absent otherwise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The op group whose per-step budget the launch counts against (`attention`, `head`,
    /// `layer`, `adamw`).
    pub group: String,
    /// How many times per training step this launch happens (e.g. 24 layers × 2 norms); not
    /// an integer where one launch stands for a scaled share (AdamW over all parameters
    /// measured on one tensor).
    pub repeat: f64,
    /// How `repeat` was derived, for the report.
    pub note: String,
}

/// Writes launch records into a directory (see the module doc for the format).
#[derive(Clone, Debug)]
pub struct Recorder {
    dir: PathBuf,
}

fn rec_err(why: String) -> TritonError {
    TritonError::Record(why)
}

impl Recorder {
    /// A recorder writing under `dir` (created if absent).
    ///
    /// Errors: [`TritonError::Record`] when the directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .map_err(|e| rec_err(format!("cannot create {}: {e}", dir.display())))?;
        Ok(Recorder { dir })
    }

    /// The recorder [`RECORD_ENV`] (`RLVR_KERNEL_RECORD=DIR`) asks for; `None` when unset or
    /// empty.
    pub fn from_env() -> Option<Result<Self>> {
        let dir = std::env::var_os(RECORD_ENV).filter(|d| !d.is_empty())?;
        Some(Recorder::new(dir))
    }

    /// The directory records go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `plan` (made for `entry`) as record `label`, with `buffers` (every buffer the
    /// plan's pointers name, with its contents before the launch) and `expected` (the CPU op's
    /// results for some of those buffers, with their tolerances). Replaces an earlier record of
    /// the same label. Returns the record's directory.
    ///
    /// Errors: [`TritonError::Record`] when the plan does not fit the entry, an f32 scalar is
    /// not finite, a pointer names a buffer not given or of another dtype, an offset lies outside its buffer, an expected
    /// output is not one of the plan's buffers or differs in dtype or shape, or a write fails.
    pub fn record(
        &self,
        label: &str,
        entry: &KernelEntry,
        plan: &LaunchPlan,
        buffers: &BTreeMap<String, HostBuffer>,
        expected: &BTreeMap<String, (HostBuffer, Tolerance)>,
    ) -> Result<PathBuf> {
        self.record_timed(label, entry, plan, buffers, expected, None)
    }

    /// [`Recorder::record`] with what the launch stands for in a training step (`timing`:
    /// written as `"timing"` in `record.json` when given).
    ///
    /// Errors: as [`Recorder::record`].
    pub fn record_timed(
        &self,
        label: &str,
        entry: &KernelEntry,
        plan: &LaunchPlan,
        buffers: &BTreeMap<String, HostBuffer>,
        expected: &BTreeMap<String, (HostBuffer, Tolerance)>,
        timing: Option<&Timing>,
    ) -> Result<PathBuf> {
        if label.is_empty()
            || !label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(rec_err(format!("label {label:?}: use [A-Za-z0-9_.-]")));
        }
        plan.check_against(entry)
            .map_err(|e| rec_err(format!("{label}: {e}")))?;
        for (a, param) in plan.args.iter().zip(&plan.params) {
            if let Arg::F32 { value } = a {
                if !value.is_finite() {
                    return Err(rec_err(format!(
                        "{label}: {param} = {value} (JSON has no non-finite numbers)"
                    )));
                }
            }
            if let Arg::Ptr {
                buffer,
                offset_elems,
                dtype,
            } = a
            {
                let Some(b) = buffers.get(buffer) else {
                    return Err(rec_err(format!("{label}: buffer {buffer} not given")));
                };
                if b.dtype != *dtype {
                    return Err(rec_err(format!(
                        "{label}: buffer {buffer} is {}, the plan passes it as {dtype}",
                        b.dtype
                    )));
                }
                if *offset_elems > b.len() {
                    return Err(rec_err(format!(
                        "{label}: offset {offset_elems} past buffer {buffer}'s {} elements",
                        b.len()
                    )));
                }
            }
        }
        let used = plan.buffers();
        for (name, (want, _)) in expected {
            let Some(b) = buffers.get(name).filter(|_| used.contains(&name.as_str())) else {
                return Err(rec_err(format!(
                    "{label}: expected output {name} is not a buffer of the plan"
                )));
            };
            if (b.dtype, &b.shape) != (want.dtype, &want.shape) {
                return Err(rec_err(format!(
                    "{label}: expected {name} is {} {:?}, the buffer {} {:?}",
                    want.dtype, want.shape, b.dtype, b.shape
                )));
            }
        }
        let dir = self.dir.join(label);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| rec_err(format!("cannot replace {}: {e}", dir.display())))?;
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| rec_err(format!("cannot create {}: {e}", dir.display())))?;
        let write = |file: &str, bytes: &[u8]| {
            std::fs::write(dir.join(file), bytes)
                .map_err(|e| rec_err(format!("cannot write {}: {e}", dir.join(file).display())))
        };
        let mut buf_recs = BTreeMap::new();
        for name in &used {
            let b = &buffers[*name];
            let file = format!("{name}.bin");
            write(&file, &b.bytes)?;
            buf_recs.insert(
                name.to_string(),
                BufferRecord {
                    dtype: b.dtype,
                    shape: b.shape.clone(),
                    file,
                    atol: None,
                    rtol: None,
                },
            );
        }
        let mut exp_recs = BTreeMap::new();
        for (name, (want, tol)) in expected {
            let file = format!("{name}.expected.bin");
            write(&file, &want.bytes)?;
            exp_recs.insert(
                name.clone(),
                BufferRecord {
                    dtype: want.dtype,
                    shape: want.shape.clone(),
                    file,
                    atol: Some(tol.atol),
                    rtol: Some(tol.rtol),
                },
            );
        }
        let rec = Record {
            format: RECORD_FORMAT,
            label: label.into(),
            name: plan.name.clone(),
            entry: plan.entry.clone(),
            family: entry.family.clone(),
            source: entry.source.clone(),
            target: plan.target,
            grid: plan.grid,
            block: plan.block,
            shared_bytes: plan.shared_bytes,
            num_warps: entry.num_warps,
            constexprs: entry.constexprs.clone(),
            args: (plan.params.iter().zip(&plan.args))
                .map(|(p, a)| ArgRecord {
                    param: p.clone(),
                    arg: a.clone(),
                })
                .collect(),
            buffers: buf_recs,
            expected: exp_recs,
            timing: timing.cloned(),
        };
        let json = serde_json::to_string_pretty(&rec).expect("a record serialises");
        write("record.json", json.as_bytes())?;
        Ok(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_np_tensor() {
        // kernels/np_tensor.py's bf16(): nearest even, NaN → 0x7FC0.
        assert_eq!(bf16_bits(1.0), 0x3F80);
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80); // tie → even
        assert_eq!(bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82); // tie → even
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(bf16_bits(f32::NAN), 0x7FC0);
        assert_eq!(bf16_bits(-0.0), 0x8000);
        let b = HostBuffer::bf16(&[2], &[1.5, -2.0]);
        assert_eq!(b.to_f32().unwrap(), vec![1.5, -2.0]);
    }
}
