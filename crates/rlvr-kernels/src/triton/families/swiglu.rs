//! SwiGLU's gating `a = silu(g) · u`, forward and backward (`kernels/src/swiglu.py`).
//!
//! Buffers named after the parameters, `[rows, cols]` row-major contiguous: `g`, `u`, `a`
//! (forward), `da`, `dg`, `du` (backward). Grid `(rows, cdiv(cols, BLOCK))`.

use super::super::manifest::{DType, KernelEntry};
use super::super::plan::{cdiv, LaunchPlan, PlanBuilder};
use super::super::{Result, TritonError};

/// The shapes of one SwiGLU launch.
#[derive(Clone, Copy, Debug)]
pub struct Swiglu {
    /// Rows (tokens).
    pub rows: usize,
    /// Elements per row (the MLP's intermediate size).
    pub cols: usize,
}

/// The variant name of `kernel` (`"fwd"`, `"bwd"`) for `dtype` (`Fp32` or `Bf16`).
pub fn variant(kernel: &str, dtype: DType) -> String {
    format!(
        "swiglu_{kernel}_{}",
        if dtype == DType::Bf16 { "bf16" } else { "f32" }
    )
}

/// The plan for `entry` at shapes `s`. Errors: another family's entry; [`PlanBuilder`]'s checks.
pub fn plan(entry: &KernelEntry, s: &Swiglu) -> Result<LaunchPlan> {
    let name = &entry.name;
    let block = entry.constexpr_int("BLOCK")? as usize;
    let grid = [cdiv(name, s.rows, 1)?, cdiv(name, s.cols, block)?, 1];
    let b = PlanBuilder::new(entry).buf("g", "g").buf("u", "u");
    match entry.entry.as_str() {
        "swiglu_fwd_kernel" => b.buf("a", "a").i32("n_cols", s.cols).finish(grid),
        "swiglu_bwd_kernel" => (b.buf("da", "da").buf("dg", "dg").buf("du", "du"))
            .i32("n_cols", s.cols)
            .finish(grid),
        other => Err(TritonError::Plan {
            name: name.clone(),
            why: format!("{other} is not a SwiGLU kernel"),
        }),
    }
}

/// [`plan`] at a small shape: 3 rows of `BLOCK + 37` elements (a partial last block; aligned
/// variants: `BLOCK + 32`).
pub fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
    let block = entry.constexpr_int("BLOCK")? as usize;
    plan(
        entry,
        &Swiglu {
            rows: 3,
            cols: super::example_len(entry, block + 37),
        },
    )
}
