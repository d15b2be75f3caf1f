//! `rlvr-kernels`: the CPU kernels of rlvr, as candle custom ops and plain slice functions.
//!
//! - [`lm_head`]: the fused lm_head + log-softmax + gather (+ entropy) op and its backward; the
//!   `[N, V]` logits never exist (the training step's head at a 151936-token vocabulary).
//! - [`token_logprob`]: the same log-prob/entropy reduction over given logits.
//! - [`skinny`]: `x · wᵀ` for a few rows of x (the decode step's projections).
//! - [`packed_head`]: the lm_head repacked once per sampling call for the decode steps (AVX-512).
//! - [`exp`]: vectorised `exp` and the softmax pieces shared by the head and token selection.
//! - [`adamw`]: the in-place AdamW and gradient-accumulation passes.
//! - [`cpu`]: CPU feature detection, done once.
//! - [`graph`]: CUDA-graph capture and replay of the sampler's decode step: the per-bucket
//!   control flow (plain Rust) and (feature `cuda`) the capture on candle's stream.
//! - [`triton`]: the GPU kernels written in Triton, compiled ahead of time: manifest, PTX ABI
//!   check, launch plans, the launch recorder, and (feature `cuda`) the launcher.
//!
//! All of rlvr's SIMD and raw-pointer `unsafe` code lives in this crate, each block with its
//! SAFETY argument: the `target_feature` calls are made only after [`cpu::features`] found the
//! feature; the one call into the `gemm` crate's raw-pointer API is wrapped by a bounds-checked
//! function over slices; parallel writes go through disjoint `&mut` slices (`par_chunks_mut`,
//! rows split with `chunks_mut`), never through shared raw pointers.
//!
//! Every parallel reduction here sums in an order fixed by the data (chunk boundaries are
//! constants or functions of the shapes, partial results are combined in index order), so
//! results are bit-identical whatever the rayon pool's size.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! // log-probs of tokens 1 and 0 under softmax(h · Wᵀ), fused.
//! let h = Tensor::new(&[[1f32, 0.0], [0.0, 2.0]], &Device::Cpu).unwrap();
//! let w = Tensor::new(&[[1f32, 0.0], [0.0, 1.0]], &Device::Cpu).unwrap();
//! let op = rlvr_kernels::lm_head::LmHeadLogprobOp {
//!     targets: std::sync::Arc::new(vec![1, 0]),
//!     inv_t: 1.0,
//!     entropy: false,
//!     stash: None,
//!     softcap: None,
//! };
//! let out: Vec<Vec<f32>> = h.apply_op2(&w, op).unwrap().to_vec2().unwrap();
//! let want = -(1f32 + 1f32.exp()).ln(); // log softmax([1, 0])[1]
//! assert!((out[0][0] - want).abs() < 1e-6);
//! ```

#![warn(missing_docs)]

pub mod adamw;
pub mod cpu;
pub mod exp;
mod gemm;
pub mod graph;
pub mod lm_head;
pub mod packed_head;
pub mod skinny;
mod storage;
pub mod token_logprob;
pub mod triton;

pub use lm_head::{FrozenHeadLogprobOp, LmHeadLogprobOp, LogitStash, STASH_MAX_BYTES};
pub use packed_head::PackedHead;
pub use skinny::skinny_matmul;
pub use token_logprob::TokenLogprobOp;
