//! The log-prob head over vocabulary chunks (`kernels/src/logprob_head.py`): per chunk of
//! logits from cuBLAS, the online log-sum-exp state, then the target log-prob and entropy,
//! and the gradient in place. The `logprob_{fwd,bwd}_softcap_*` variants apply Gemma 2's
//! final-logit softcapping `cap · tanh(z / cap)` to the chunk first (their `cap` argument; the
//! plain variants take it and ignore it).
//!
//! Buffers named after the parameters: `z` `[rows, stride_z]` (one chunk of `n_cols ≤
//! stride_z` logits per row, f32 or bf16), `targets` `[rows]` i32 (vocabulary ids), `state`
//! `[rows, 4]` f32 (M, S, D, s_y), `out` `[rows, 2]` f32 (log p_y, H), `grad` `[rows, 2]` f32
//! (the gradients of `out`). Grids: `logprob_fwd_kernel` `(rows,)` per chunk, in vocabulary
//! order; `logprob_finish_kernel` `cdiv(rows, BLOCK)`; `logprob_bwd_kernel` `(rows,
//! cdiv(n_cols, BLOCK))` per chunk.

use super::super::manifest::KernelEntry;
use super::super::plan::{cdiv, LaunchPlan, PlanBuilder};
use super::super::{Result, TritonError};

/// The shapes of one launch on one chunk of the vocabulary.
#[derive(Clone, Copy, Debug)]
pub struct LogprobChunk {
    /// Rows (tokens).
    pub rows: usize,
    /// Logits in this chunk per row.
    pub n_cols: usize,
    /// `z`'s row stride, elements (≥ `n_cols`).
    pub stride_z: usize,
    /// The vocabulary id of the chunk's first column.
    pub col0: usize,
    /// Whether this is the first chunk (the forward starts a fresh state).
    pub first: bool,
    /// 1 / temperature, f32.
    pub inv_t: f32,
    /// The final-logit softcap (> 0) the `_softcap` variants apply; the plain variants ignore
    /// it (pass 0).
    pub cap: f32,
}

/// The forward (`"fwd"`) or backward (`"bwd"`) kernel's variant name for logits of `dt`
/// (`"f32"` or `"bf16"`), with Gemma 2's final-logit softcap or without.
pub fn variant_name(kernel: &str, dt: &str, softcap: bool) -> String {
    if softcap {
        format!("logprob_{kernel}_softcap_{dt}")
    } else {
        format!("logprob_{kernel}_{dt}")
    }
}

/// The plan for `entry` at `s` (the finish kernel uses `s.rows` only).
///
/// Errors: `stride_z < n_cols`; another family's entry; [`PlanBuilder`]'s checks.
pub fn plan(entry: &KernelEntry, s: &LogprobChunk) -> Result<LaunchPlan> {
    let name = &entry.name;
    let block = entry.constexpr_int("BLOCK")? as usize;
    if s.stride_z < s.n_cols {
        return Err(TritonError::Plan {
            name: name.clone(),
            why: format!("row stride {} < {} columns", s.stride_z, s.n_cols),
        });
    }
    let b = PlanBuilder::new(entry);
    match entry.entry.as_str() {
        "logprob_fwd_kernel" => b
            .buf("z", "z")
            .buf("targets", "targets")
            .buf("state", "state")
            .i32("n_cols", s.n_cols)
            .i32("stride_z", s.stride_z)
            .i32("col0", s.col0)
            .i32("first", s.first as i32)
            .f32("inv_t", s.inv_t)
            .f32("cap", s.cap)
            .finish([cdiv(name, s.rows, 1)?, 1, 1]),
        "logprob_finish_kernel" => b
            .buf("state", "state")
            .buf("out", "out")
            .i32("n_rows", s.rows)
            .finish([cdiv(name, s.rows, block)?, 1, 1]),
        "logprob_bwd_kernel" => b
            .buf("z", "z")
            .buf("targets", "targets")
            .buf("state", "state")
            .buf("out", "out")
            .buf("grad", "grad")
            .i32("n_cols", s.n_cols)
            .i32("stride_z", s.stride_z)
            .i32("col0", s.col0)
            .f32("inv_t", s.inv_t)
            .f32("cap", s.cap)
            .finish([cdiv(name, s.rows, 1)?, cdiv(name, s.n_cols, block)?, 1]),
        other => Err(TritonError::Plan {
            name: name.clone(),
            why: format!("{other} is not a log-prob head kernel"),
        }),
    }
}

/// [`plan`] at a small shape: 3 rows, a chunk of 1500 of 1536 columns starting at id 3000.
pub fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
    let s = LogprobChunk {
        rows: 3,
        n_cols: super::example_len(entry, 1500),
        stride_z: 1536,
        col0: 3000,
        first: false,
        inv_t: 1.0 / 0.7,
        cap: 30.0,
    };
    plan(entry, &s)
}
