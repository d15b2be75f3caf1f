//! The GPU kernels written in Triton (`kernels/` at the repository root), compiled ahead of time
//! and committed as cubin/PTX with a manifest (`kernels/build/manifest.json`, format in
//! `kernels/README.md`), and what rlvr needs to launch them: issue 44.
//!
//! Everything but `cuda` is plain Rust, built and tested on any machine:
//! - [`manifest`]: the typed manifest (embedded at build time by `build.rs`, so `cargo build`
//!   needs neither Python nor nvcc), its refusals (scratch memory, clusters, cooperative
//!   launch, threads, shared memory) and the choice of target by compute capability.
//! - [`ptx`]: a parser of PTX `.entry` parameter lists, and the ABI check of a manifest entry
//!   against its PTX (entry name, parameters, `.target`, `.version`, `.reqntid`).
//! - [`plan`]: [`LaunchPlan`] (entry, grid, block, shared memory, arguments) and its builder,
//!   which checks every argument against the manifest's parameter list.
//! - [`families`]: one plan builder per kernel family, deriving grid and arguments from shapes.
//! - [`record`]: the launch recorder: plans written with the CPU op's inputs and expected
//!   outputs, replayed by `kernels/replay.py` under Triton's interpreter (no GPU).
//! - [`records`]: the records themselves: every family at small awkward shapes with the CPU
//!   results (the crate's tests and `rlvr kernels record --shape small`), and the launches of a
//!   training step at a benchmark shape with random inputs, for `kernels/replay_gpu.py --time`.
//! - `cuda` (feature `cuda`): the launcher, loading cubins with cudarc on candle's stream.
//!
//! Why ahead-of-time Triton: the same kernel source runs on a CPU under Triton's interpreter
//! (tests without a GPU) and compiles without a GPU to sm_90a/sm_80 code; the committed
//! artifacts keep Python and the CUDA toolkit out of rlvr's build and binary.

#[cfg(any(feature = "cuda", feature = "cudarc-check"))]
pub mod cuda;
pub mod families;
pub mod manifest;
pub mod plan;
pub mod ptx;
pub mod record;
pub mod records;
#[cfg(test)]
mod tests;

pub use manifest::{DType, KernelEntry, Manifest, Param, ParamKind, Target};
pub use plan::{Arg, DeviceBuffer, LaunchPlan, PlanBuilder, RawArg};
pub use record::{HostBuffer, Recorder, Timing, Tolerance};

static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Triton kernel launches queued by this process so far (every successful `cuda::launch`; 0
/// without the `cuda` feature): what `rlvr bench sample` divides by the decode steps to report
/// the fused path's launches per step. Graph replays launch no Triton kernel one by one and are
/// not counted.
pub fn launch_count() -> u64 {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(any(feature = "cuda", feature = "cudarc-check"))]
pub(crate) fn count_launch() {
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// The kernel families that passed the GPU check on a real GPU (`bench/gpu_check.sh`'s `kernels`
/// part; BENCHMARKS.md names the run, machine and commit for each). The model turns a fused op on
/// by default (`kernels.<op> = "auto"`) on CUDA only for a family listed here; every other fused
/// op is opt-in (`"on"`). Empty: no GPU check of the Triton kernels has run yet.
pub const GPU_VERIFIED: &[&str] = &[];

/// What the Triton launcher refuses, each with the entry, parameter or value involved.
#[derive(Debug, thiserror::Error)]
pub enum TritonError {
    /// The manifest is absent, unreadable or not of the supported format.
    #[error("kernel manifest: {0}")]
    Manifest(String),
    /// A compiled kernel the launcher cannot run as it is (scratch memory, clusters,
    /// cooperative launch, too many threads, too much shared memory).
    #[error("kernel {name} ({target}) is not launchable: {why}")]
    Unsupported {
        /// The variant's name.
        name: String,
        /// The target it was compiled for.
        target: Target,
        /// The reason.
        why: String,
    },
    /// No compiled code for this GPU.
    #[error(
        "compute capability {major}.{minor} has no compiled Triton kernels: this build ships {shipped} \
         (9.0 runs sm90a, 8.x runs sm80)"
    )]
    Capability {
        /// The device's major compute capability.
        major: u32,
        /// The device's minor compute capability.
        minor: u32,
        /// The targets the manifest has, comma-separated.
        shipped: String,
    },
    /// The manifest has no entry of that name for that target.
    #[error("no compiled kernel {name} for {target} in the manifest ({available})")]
    NoKernel {
        /// The variant asked for.
        name: String,
        /// The target asked for.
        target: Target,
        /// What the manifest offers for that target (or that it has nothing).
        available: String,
    },
    /// A compiled entry's PTX disagrees with the manifest.
    #[error("kernel {name} ({target}): the PTX disagrees with the manifest: {why}")]
    Abi {
        /// The variant's name.
        name: String,
        /// Its target.
        target: Target,
        /// Every disagreement found, `; `-separated.
        why: String,
    },
    /// A launch plan whose shapes or arguments do not fit its entry.
    #[error("launch plan for {name}: {why}")]
    Plan {
        /// The variant's name.
        name: String,
        /// The mismatch, naming the parameter.
        why: String,
    },
    /// The launch recorder could not write or check a record.
    #[error("launch recorder: {0}")]
    Record(String),
    /// A CUDA driver call failed (feature `cuda`).
    #[error("CUDA driver: {0}")]
    Driver(String),
}

/// `Result` with a [`TritonError`].
pub type Result<T> = std::result::Result<T, TritonError>;

impl From<TritonError> for candle_core::Error {
    fn from(e: TritonError) -> Self {
        candle_core::Error::Msg(e.to_string())
    }
}
