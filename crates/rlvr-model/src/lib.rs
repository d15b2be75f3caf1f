//! `rlvr-model`: the policy model of rlvr.
//!
//! - [`device`]: compute dtype and device, parsed once from their names.
//! - [`config`]: `config.json` of HuggingFace checkpoints (transformers-4 and -5 styles).
//! - [`weights`]: safetensors I/O (single file or sharded), atomic writes.
//! - [`model`]: the decoder (Qwen2/Qwen2.5, Qwen3, Llama): one forward for training (per-token
//!   log-probs and entropy with gradients), prefill and cached decoding; its blocks are private
//!   (`layers`), in candle's model-file layout.
//! - [`shared_prefix`]: the training forward of whole groups with each prompt computed once.
//! - [`kv`]: the [`KvStore`] interface of cached decoding and the reference [`KvCache`].
//! - [`tokenizer`]: tokenizer.json, special tokens, EOS ids, chat templates (minijinja).
//! - [`lora`]: LoRA adapters on the decoder's projections (PEFT's math, files and names).
//! - [`checkpoint`]: loading a whole model directory and writing one (`rlvr init`, checkpoints).
//! - [`gguf`]: GGUF files (llama.cpp) converted to a HuggingFace checkpoint (`rlvr convert`).

pub mod checkpoint;
pub mod chunked;
pub mod config;
pub mod device;
pub mod error;
pub mod gguf;
mod head;
pub mod kernels;
pub mod kv;
mod layers;
pub mod lora;
pub mod model;
pub mod ops;
pub mod optim;
mod param;
pub mod recompute;
pub mod shared_prefix;
#[cfg(unix)]
pub mod template_sandbox;
pub mod tokenizer;
pub mod weights;

pub use config::{Arch, GemmaConfig, ModelConfig, RopeScaling, SlidingWindow};
pub use device::{ComputeDtype, DeviceSpec};
pub use error::{ModelError, Result};
pub use head::LogProbs;
pub use kernels::{FusedOp, KernelSwitches, Switch};
pub use kv::{KvCache, KvStore};
pub use lora::{LoraConfig, LoraTarget};
pub use model::Model;
/// Largest `[N, V]` f32 logits (bytes) the CPU's fused head keeps for its backward
/// (`rlvr_kernels::LogitStash`); memory estimates (`rlvr plan`) count it.
pub use rlvr_kernels::STASH_MAX_BYTES;
pub use shared_prefix::{PromptGroup, SharedPrefixBatch};
pub use tokenizer::{Message, TokenizerBundle};

/// Parses a dtype name (`--dtype`): see [`ComputeDtype`]'s `FromStr`.
///
/// # Errors
/// An unknown name, listing the accepted ones.
pub fn parse_dtype(s: &str) -> Result<candle_core::DType> {
    match s.parse::<ComputeDtype>()? {
        ComputeDtype::Auto => Err(error::ModelError::Invalid(
            "dtype \"auto\" depends on the device: give f32 or bf16 here (`auto` is for the \
             config's model.dtype, resolved against model.device)"
                .into(),
        )),
        d => Ok(d.dtype()),
    }
}

/// Parses and opens a device name (`--device`): see [`DeviceSpec`]'s `FromStr` and
/// [`DeviceSpec::open`].
///
/// # Errors
/// An unknown name (listing the accepted forms), `cuda:N` without CUDA support or without that GPU.
pub fn parse_device(s: &str) -> Result<candle_core::Device> {
    s.parse::<DeviceSpec>()?.open()
}

/// Bytes the allocator has handed out and not had back (glibc's `mallinfo2`: heap chunks in
/// use plus mmapped blocks): the program's live heap memory, unlike the resident size, which
/// keeps what [`keep_freed_memory`] retains. `None` off glibc. Takes the allocator's arena
/// locks for a few microseconds.
pub fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics (glibc ≥ 2.33).
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
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
