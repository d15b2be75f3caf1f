//! Rotary position embedding on q and k, forward and backward (`kernels/src/rotary.py`).
//!
//! Buffers named after the parameters: `q`/`dq`, `q_out`/`dq_out` `[tokens, q_heads, head_dim]`;
//! `k`/`dk`, `k_out`/`dk_out` `[tokens, kv_heads, head_dim]`, all contiguous; `cos`, `sin`
//! `[max_pos, head_dim]` f32 tables; `pos` `[tokens]` i32 (each token's position: arbitrary,
//! repeated, out of order in the shared-prompt layout). Grid `(tokens,)`: one program per token
//! rotates all its q heads, then all its k heads. The outputs may alias the inputs (in place):
//! pass the same device buffer under both names.

use super::super::manifest::{DType, KernelEntry};
use super::super::plan::{cdiv, LaunchPlan, PlanBuilder};
use super::super::{Result, TritonError};

/// The shapes of one rotary launch.
#[derive(Clone, Copy, Debug)]
pub struct Rotary {
    /// Tokens.
    pub tokens: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension (the variant's `HEAD_DIM`).
    pub head_dim: usize,
}

/// The variant name of `kernel` (`"fwd"`, `"bwd"`) for `dtype` and `head_dim` (64 or 128).
pub fn variant(kernel: &str, dtype: DType, head_dim: usize) -> String {
    let dt = if dtype == DType::Bf16 { "bf16" } else { "f32" };
    format!("rotary_{kernel}_{dt}_d{head_dim}")
}

/// The plan for `entry` at shapes `s`.
///
/// Errors: a head dim other than the variant's `HEAD_DIM`; another family's entry;
/// [`PlanBuilder`]'s checks.
pub fn plan(entry: &KernelEntry, s: &Rotary) -> Result<LaunchPlan> {
    let name = &entry.name;
    let d = entry.constexpr_int("HEAD_DIM")? as usize;
    if d != s.head_dim {
        return Err(TritonError::Plan {
            name: name.clone(),
            why: format!("head dim {} but the variant's HEAD_DIM is {d}", s.head_dim),
        });
    }
    let names = match entry.entry.as_str() {
        "rotary_fwd_kernel" => ["q", "k", "q_out", "k_out"],
        "rotary_bwd_kernel" => ["dq", "dk", "dq_out", "dk_out"],
        other => {
            return Err(TritonError::Plan {
                name: name.clone(),
                why: format!("{other} is not a rotary kernel"),
            })
        }
    };
    let mut b = PlanBuilder::new(entry);
    for n in names {
        b = b.buf(n, n);
    }
    b.buf("cos", "cos")
        .buf("sin", "sin")
        .buf("pos", "pos")
        .i32("n_qh", s.q_heads)
        .i32("n_kh", s.kv_heads)
        .finish([cdiv(name, s.tokens, 1)?, 1, 1])
}

/// [`plan`] at a small shape: 5 tokens, 7 query heads, 1 key head (GQA 7).
pub fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
    let head_dim = entry.constexpr_int("HEAD_DIM")? as usize;
    plan(
        entry,
        &Rotary {
            tokens: 5,
            q_heads: 7,
            kv_heads: 1,
            head_dim,
        },
    )
}
