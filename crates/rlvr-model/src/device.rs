//! Where and in which precision the model computes: [`ComputeDtype`] and [`DeviceSpec`], parsed once
//! from their names (config values `model.dtype`/`model.device`, command-line `--dtype`/`--device`)
//! and turned into candle's `DType`/`Device` where a tensor is made.
//!
//! Both (de)serialise as their names, so a TOML config holds `dtype = "bf16"` and
//! `device = "cuda:0"`, and an unknown name fails at load with the accepted names listed.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// Compute dtype of the weights and activations.
///
/// `f32` and `bf16` are the training dtypes. `f16` serves inference (`rlvr eval`, `rlvr logprobs`);
/// training refuses it (rlvr-train's config check) because, without loss scaling, f16 gradients
/// underflow and its 65504 range overflows in long-sequence sums. `f64` is for reference checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ComputeDtype {
    /// 32-bit float (`f32`, `float32`).
    F32,
    /// bfloat16 (`bf16`, `bfloat16`): f32's range with an 8-bit mantissa.
    Bf16,
    /// IEEE half (`f16`, `float16`): inference only.
    F16,
    /// 64-bit float (`f64`, `float64`): reference checks.
    F64,
    /// `auto`: `bf16` on a GPU (training keeps f32 master weights and AdamW moments), `f32` on the
    /// CPU ([`ComputeDtype::for_device`]); rlvr-train resolves it once the device is known.
    Auto,
}

impl ComputeDtype {
    /// Every dtype with its canonical name (what [`fmt::Display`] writes).
    pub const ALL: [(ComputeDtype, &'static str); 4] = [
        (ComputeDtype::F32, "f32"),
        (ComputeDtype::Bf16, "bf16"),
        (ComputeDtype::F16, "f16"),
        (ComputeDtype::F64, "f64"),
    ];

    /// The canonical name: `f32`, `bf16`, `f16` or `f64`.
    pub fn name(self) -> &'static str {
        match self {
            ComputeDtype::F32 => "f32",
            ComputeDtype::Bf16 => "bf16",
            ComputeDtype::F16 => "f16",
            ComputeDtype::F64 => "f64",
            ComputeDtype::Auto => "auto",
        }
    }

    /// `auto` resolved for `device`: `bf16` on a CUDA device, `f32` on the CPU (and for a device
    /// still `auto`); any other dtype unchanged.
    pub fn for_device(self, device: DeviceSpec) -> ComputeDtype {
        match (self, device) {
            (ComputeDtype::Auto, DeviceSpec::Cuda(_) | DeviceSpec::CudaLocal) => ComputeDtype::Bf16,
            (ComputeDtype::Auto, _) => ComputeDtype::F32,
            (d, _) => d,
        }
    }

    /// candle's dtype. `auto` not yet resolved ([`ComputeDtype::for_device`]) is f32, the CPU's.
    pub fn dtype(self) -> DType {
        match self {
            ComputeDtype::F32 | ComputeDtype::Auto => DType::F32,
            ComputeDtype::Bf16 => DType::BF16,
            ComputeDtype::F16 => DType::F16,
            ComputeDtype::F64 => DType::F64,
        }
    }

    /// Whether training may use it (all but `f16`: see the type's docs).
    pub fn trainable(self) -> bool {
        self != ComputeDtype::F16
    }
}

impl From<ComputeDtype> for DType {
    fn from(d: ComputeDtype) -> DType {
        d.dtype()
    }
}

impl fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ComputeDtype {
    type Err = ModelError;

    /// Parses `f32`/`float32`, `bf16`/`bfloat16`, `f16`/`float16` or `f64`/`float64`.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] naming the value and listing the accepted names.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "f32" | "float32" => ComputeDtype::F32,
            "bf16" | "bfloat16" => ComputeDtype::Bf16,
            "f16" | "float16" => ComputeDtype::F16,
            "f64" | "float64" => ComputeDtype::F64,
            "auto" => ComputeDtype::Auto,
            _ => {
                return Err(ModelError::Invalid(format!(
                    "unknown dtype {s:?}: expected one of auto, f32, bf16, f16 (inference only), \
                     f64 (or float32, bfloat16, float16, float64)"
                )))
            }
        })
    }
}

impl TryFrom<String> for ComputeDtype {
    type Error = ModelError;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<ComputeDtype> for String {
    fn from(d: ComputeDtype) -> String {
        d.name().to_string()
    }
}

/// The device the model computes on: the CPU or one CUDA GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceSpec {
    /// The CPU (`cpu`).
    Cpu,
    /// CUDA GPU of this ordinal (`cuda:N`). Needs a binary built with the `cuda` feature.
    Cuda(usize),
    /// `cuda` without an ordinal: the GPU of this process's local rank under a data-parallel
    /// launcher (rlvr-dist's `device_for` turns it into `cuda:{local rank}`), `cuda:0` in one
    /// process.
    CudaLocal,
    /// `auto`: the GPU of this process (as [`DeviceSpec::CudaLocal`]) when the binary has CUDA and
    /// that GPU can be opened, else the CPU. rlvr-train resolves it once at start and says what it
    /// chose; [`DeviceSpec::open`] decides the same way for one process.
    Auto,
}

/// CUDA GPU `ordinal`, opened once per process: every later call returns the same [`Device`].
///
/// candle's `Device::new_cuda` makes a new device (its own id) on every call; tensors of two such
/// devices cannot be combined ("device mismatch"). The policy, the reference model, the sampler and
/// the NCCL communicator therefore all take their GPU from here.
///
/// One stream for every thread: candle's `Device::new_cuda` queues each host thread's work on that
/// thread's own per-thread default stream, with nothing ordering them, so the explorer thread
/// (sync offset ≥ 1) could read the weights the trainer thread had queued a copy of before the
/// copy ran, a buffer could be freed on one stream while the other still read it, and two
/// concurrent streams sharing one cuBLAS handle lose cuBLAS's bit-reproducibility (its guarantee
/// holds with one active stream). With one stream (`Device::new_cuda_with_stream`), the queue's
/// order is the threads' causal order (a channel send happens after the work queued before it),
/// so cudarc's per-buffer events are not needed: they are turned off before any buffer exists
/// (with one stream they would only add host time to every op). The one thing a shared stream
/// forbids is a CUDA-graph capture while another thread queues work: the explorer thread holds a
/// `rlvr_kernels::graph::CaptureBlock` for its life, under which every decode step runs eagerly.
fn cuda_device(ordinal: usize) -> candle_core::Result<Device> {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    static OPENED: OnceLock<Mutex<BTreeMap<usize, Device>>> = OnceLock::new();
    let mut opened = OPENED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(d) = opened.get(&ordinal) {
        return Ok(d.clone());
    }
    let d = Device::new_cuda_with_stream(ordinal)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = &d {
        // SAFETY: every thread queues on this device's one stream (above), so stream order orders
        // each read after its write and each free after its last use; no buffer exists yet, and
        // no other stream is made (cudarc tracks events only for buffers made while it is on).
        unsafe { c.disable_event_tracking() };
        // The memory pool keeps freed memory, and cuBLAS gets a workspace of its own (what
        // `prepare_device` says why).
        rlvr_kernels::triton::cuda::prepare_device(&c.cuda_stream(), &c.cublas_handle())
            .map_err(candle_core::Error::wrap)?;
    }
    opened.insert(ordinal, d.clone());
    Ok(d)
}

impl DeviceSpec {
    /// CUDA GPU `ordinal`, when this binary has CUDA and the GPU can be opened (none otherwise:
    /// a CPU build, no driver, or no such GPU visible).
    pub fn open_gpu(ordinal: usize) -> Option<Device> {
        if !candle_core::utils::cuda_is_available() {
            return None;
        }
        cuda_device(ordinal).ok()
    }

    /// Opens the device.
    ///
    /// # Errors
    /// `cuda:N` on a binary built without the `cuda` feature ([`ModelError::Invalid`] saying so and
    /// how to run on the CPU instead), or a CUDA driver error (no such GPU).
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Auto => Ok(DeviceSpec::open_gpu(0).unwrap_or(Device::Cpu)),
            DeviceSpec::CudaLocal => DeviceSpec::Cuda(0).open(),
            DeviceSpec::Cuda(n) => {
                if !cfg!(feature = "cuda") {
                    return Err(ModelError::Invalid(format!(
                        "device cuda:{n}: this rlvr was built without CUDA support (rebuild with \
                         `--features cuda`); to compute on the CPU instead use \
                         `--set model.device=\"cpu\"` (rlvr train) or `--device cpu`"
                    )));
                }
                cuda_device(n).map_err(|e| {
                    ModelError::Invalid(format!(
                        "device cuda:{n} could not be opened ({e}); to compute on the CPU instead \
                         use `--set model.device=\"cpu\"` (rlvr train) or `--device cpu`"
                    ))
                })
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::CudaLocal => f.write_str("cuda"),
            DeviceSpec::Auto => f.write_str("auto"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = ModelError;

    /// Parses `auto`, `cpu`, `cuda` ([`DeviceSpec::CudaLocal`]) or `cuda:N`.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] naming the value and listing the accepted forms.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            ModelError::Invalid(format!(
                "unknown device {s:?}: expected auto, cuda, cpu or cuda:N"
            ))
        };
        match s {
            "cpu" => return Ok(DeviceSpec::Cpu),
            "auto" => return Ok(DeviceSpec::Auto),
            _ => {}
        }
        match s.strip_prefix("cuda") {
            Some("") => Ok(DeviceSpec::CudaLocal),
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(bad),
            None => Err(bad()),
        }
    }
}

impl TryFrom<String> for DeviceSpec {
    type Error = ModelError;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> String {
        d.to_string()
    }
}
