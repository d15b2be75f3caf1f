//! RMSNorm with the residual add, forward and backward (`kernels/src/rmsnorm.py`).
//!
//! Buffers are named after the kernel parameters, each row-major and contiguous:
//! `x`, `residual`, `h_out`, `y`, `dy`, `h`, `dres`, `dx` `[rows, cols]`; `w` `[cols]`; `rstd`
//! `[rows]` f32; `dw_part` `[cdiv(rows, rows_per_prog), cols]` f32; `dw` `[cols]`.
//! Grids: the forward kernels one program per row; the backward kernels one per
//! `rows_per_prog` rows (each writes its partial `dw` row); `rmsnorm_dw_kernel` one per
//! `BLOCK` columns, summing the partials in order.

use super::super::manifest::{DType, KernelEntry};
use super::super::plan::{cdiv, LaunchPlan, PlanBuilder};
use super::super::{Result, TritonError};

/// The hidden-size classes of the row kernels (`BLOCKS` in rmsnorm.py): a row of `cols`
/// elements uses the smallest class ≥ `cols`.
pub const BLOCKS: [usize; 5] = [128, 1024, 2048, 4096, 8192];

/// The shapes of one RMSNorm launch.
#[derive(Clone, Copy, Debug)]
pub struct RmsNorm {
    /// Rows (tokens).
    pub rows: usize,
    /// Elements per row (the hidden size).
    pub cols: usize,
    /// ε inside the square root.
    pub eps: f32,
    /// Rows per backward program (the `dw` partials' granularity; fixes the summation order).
    pub rows_per_prog: usize,
}

/// The variant name of `kernel` (`"fwd"`, `"add_fwd"`, `"bwd"`, `"add_bwd"`, `"dw"`) for rows
/// of `cols` elements of `dtype` (`Fp32` or `Bf16`). Errors: rows wider than the largest class.
pub fn variant(kernel: &str, dtype: DType, cols: usize) -> Result<String> {
    let dt = if dtype == DType::Bf16 { "bf16" } else { "f32" };
    if kernel == "dw" {
        return Ok(format!("rmsnorm_dw_{dt}"));
    }
    let Some(b) = BLOCKS.iter().find(|b| cols <= **b) else {
        return Err(TritonError::Plan {
            name: format!("rmsnorm_{kernel}_{dt}"),
            why: format!(
                "rows of {cols} elements exceed the largest class ({})",
                BLOCKS[4]
            ),
        });
    };
    Ok(format!("rmsnorm_{kernel}_{dt}_h{b}"))
}

/// The plan for `entry` (any kernel of the family) at shapes `s`.
///
/// Errors: a row wider than the variant's `BLOCK`, an entry of another family or kernel, and
/// [`PlanBuilder`]'s argument checks.
pub fn plan(entry: &KernelEntry, s: &RmsNorm) -> Result<LaunchPlan> {
    let name = &entry.name;
    let block = entry.constexpr_int("BLOCK")? as usize;
    let b = PlanBuilder::new(entry);
    let row_kernel = entry.entry != "rmsnorm_dw_kernel";
    if row_kernel && s.cols > block {
        return Err(TritonError::Plan {
            name: name.clone(),
            why: format!("rows of {} elements exceed BLOCK {block}", s.cols),
        });
    }
    let parts = cdiv(name, s.rows, s.rows_per_prog)?;
    match entry.entry.as_str() {
        "rmsnorm_fwd_kernel" => b
            .buf("x", "x")
            .buf("w", "w")
            .buf("y", "y")
            .buf("rstd", "rstd")
            .i32("n_cols", s.cols)
            .f32("eps", s.eps)
            .finish([cdiv(name, s.rows, 1)?, 1, 1]),
        "rmsnorm_add_fwd_kernel" => b
            .buf("x", "x")
            .buf("residual", "residual")
            .buf("w", "w")
            .buf("h_out", "h_out")
            .buf("y", "y")
            .buf("rstd", "rstd")
            .i32("n_cols", s.cols)
            .f32("eps", s.eps)
            .finish([cdiv(name, s.rows, 1)?, 1, 1]),
        "rmsnorm_bwd_kernel" | "rmsnorm_add_bwd_kernel" => {
            let mut b = b
                .buf("dy", "dy")
                .buf("h", "h")
                .buf("w", "w")
                .buf("rstd", "rstd");
            if entry.entry == "rmsnorm_add_bwd_kernel" {
                b = b.buf("dres", "dres");
            }
            b.buf("dx", "dx")
                .buf("dw_part", "dw_part")
                .i32("n_rows", s.rows)
                .i32("n_cols", s.cols)
                .i32("rows_per_prog", s.rows_per_prog)
                .finish([parts, 1, 1])
        }
        "rmsnorm_dw_kernel" => b
            .buf("dw_part", "dw_part")
            .buf("dw", "dw")
            .i32("n_parts", parts)
            .i32("n_cols", s.cols)
            .finish([cdiv(name, s.cols, block)?, 1, 1]),
        other => Err(TritonError::Plan {
            name: name.clone(),
            why: format!("{other} is not an RMSNorm kernel"),
        }),
    }
}

/// [`plan`] at a small shape: 5 rows of `min(BLOCK, 896) − 3` elements (aligned variants:
/// rounded down to a multiple of 16), 2 rows per backward program.
pub fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
    let block = entry.constexpr_int("BLOCK")? as usize;
    let cols = if entry.entry == "rmsnorm_dw_kernel" {
        896
    } else {
        super::example_len(entry, block.min(896) - 3)
    };
    plan(
        entry,
        &RmsNorm {
            rows: 5,
            cols,
            eps: 1e-6,
            rows_per_prog: 2,
        },
    )
}
