//! `rlvr-model`: the policy model of rlvr.
//!
//! - [`config`]: `config.json` of HuggingFace checkpoints (transformers-4 and -5 styles).
//! - [`weights`]: safetensors I/O (single file or sharded), atomic writes.
//! - [`model`]: the decoder (Qwen2/Qwen2.5, Qwen3, Llama) with a differentiable training forward
//!   giving per-token log-probs and entropy, and a KV-cached inference forward.
//! - [`tokenizer`]: tokenizer.json, special tokens, EOS ids, chat templates (minijinja).
//! - [`checkpoint`]: loading a whole model directory and writing one (`rlvr init`, checkpoints).

pub mod checkpoint;
pub mod chunked;
pub mod config;
pub mod error;
pub mod fused;
pub mod model;
pub mod ops;
pub mod optim;
pub mod tokenizer;
pub mod weights;

pub use config::{Arch, ModelConfig, RopeScaling};
pub use error::{ModelError, Result};
pub use model::{KvCache, LogProbs, Model};
pub use tokenizer::{Message, TokenizerBundle};

/// Parses a dtype name as used in configs and on the command line: "f32"/"float32",
/// "bf16"/"bfloat16", "f16"/"float16".
pub fn parse_dtype(s: &str) -> Option<candle_core::DType> {
    match s {
        "f32" | "float32" => Some(candle_core::DType::F32),
        "bf16" | "bfloat16" => Some(candle_core::DType::BF16),
        "f16" | "float16" => Some(candle_core::DType::F16),
        "f64" | "float64" => Some(candle_core::DType::F64),
        _ => None,
    }
}

/// Parses a device name: "cpu" or "cuda:N" (needs the `cuda` feature).
pub fn parse_device(s: &str) -> Result<candle_core::Device> {
    if s == "cpu" {
        return Ok(candle_core::Device::Cpu);
    }
    if let Some(n) = s.strip_prefix("cuda") {
        let n = n.strip_prefix(':').unwrap_or("0");
        let ord: usize = n
            .parse()
            .map_err(|_| ModelError::Invalid(format!("bad device `{s}` (cpu or cuda:N)")))?;
        return Ok(candle_core::Device::new_cuda(ord)?);
    }
    Err(ModelError::Invalid(format!(
        "bad device `{s}` (cpu or cuda:N)"
    )))
}

/// Makes glibc's malloc keep freed memory for reuse instead of returning it to the kernel. Call
/// once at program start, before threads start (the `rlvr` binary does).
///
/// A training step allocates and frees tensors of tens to hundreds of MB per micro-batch (the
/// tied embedding's `[V, H]` gradient is 155 MB at the Qwen2.5 vocabulary). glibc serves each
/// allocation above 32 MB with its own `mmap` and `munmap`s it on free, so the next one takes a
/// page fault on every 4 KiB page: 19% of an RL step's samples in `perf` (BENCHMARKS.md, RL step).
/// With `M_MMAP_MAX = 0` every allocation comes from the heap and freed blocks are reused;
/// `M_TRIM_THRESHOLD` keeps up to 2 GiB of free heap top from being trimmed. Peak RSS grows by the
/// fragmentation (1.65 → 1.77 GB on the RL-step benchmark). A no-op off glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}
