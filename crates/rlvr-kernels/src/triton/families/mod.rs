//! Plan builders, one per kernel family: each derives the grid and the argument list of its
//! kernels from shapes and strides, in the parameter order of the family's module under
//! `kernels/src/`, and [`super::PlanBuilder`] checks every argument against the manifest.
//!
//! [`example_plan`] gives, for any manifest entry, the plan its family's builder makes at a
//! small shape: the ABI test compares that argument list with the manifest and the PTX, and
//! the recorder test replays it. A family listed in the manifest needs a builder here, or a
//! place in [`FAMILIES_WITHOUT_PLAN`].

use super::manifest::KernelEntry;
use super::plan::LaunchPlan;
use super::Result;

pub mod adamw;
pub mod attention;
pub mod logprob_head;
pub mod rmsnorm;
pub mod rotary;
pub mod swiglu;

/// Kernel families compiled in `kernels/` whose launch plans are not written yet. The ABI test
/// accepts their entries (PTX against manifest only) and fails once a builder exists for one
/// still listed here.
pub const FAMILIES_WITHOUT_PLAN: &[&str] = &[];

/// The plan `entry`'s family builds at a small example shape; `None` for a family without a
/// builder.
///
/// Errors: the builder's, e.g. an entry whose parameters are not what the builder passes
/// ([`super::TritonError::Plan`] naming the entry and parameter).
pub fn example_plan(entry: &KernelEntry) -> Option<Result<LaunchPlan>> {
    match entry.family.as_str() {
        "adamw" => Some(adamw::example(entry)),
        "attention" => Some(attention::example(entry)),
        "logprob_head" => Some(logprob_head::example(entry)),
        "rmsnorm" => Some(rmsnorm::example(entry)),
        "rotary" => Some(rotary::example(entry)),
        "swiglu" => Some(swiglu::example(entry)),
        #[cfg(test)]
        "fixture" => Some(fixture::example(entry)),
        _ => None,
    }
}

/// The fixture family of the crate's tests (`testdata/triton/fixture.py`): `y[r, c] =
/// alpha · x[r·stride_x + c] + r` on a (rows, column blocks) grid.
#[cfg(test)]
pub(crate) mod fixture {
    use super::super::manifest::KernelEntry;
    use super::super::plan::{cdiv, LaunchPlan, PlanBuilder};
    use super::super::Result;

    /// Shapes of one launch: `rows × cols` read from `x` (from element `x_offset`) with row
    /// stride `stride_x`, written to `y` with row stride `stride_y`.
    pub(crate) struct RowsScale {
        pub x_offset: usize,
        pub rows: usize,
        pub cols: usize,
        pub stride_x: usize,
        pub stride_y: usize,
        pub alpha: f32,
    }

    pub(crate) fn plan(entry: &KernelEntry, s: &RowsScale) -> Result<LaunchPlan> {
        let block = entry.constexpr_int("BLOCK")? as usize;
        PlanBuilder::new(entry)
            .buf_at("x_ptr", "x", s.x_offset)
            .buf("y_ptr", "y")
            .i32("n_rows", s.rows)
            .i32("n_cols", s.cols)
            .i32("stride_x", s.stride_x)
            .i32("stride_y", s.stride_y)
            .f32("alpha", s.alpha)
            .finish([
                cdiv(&entry.name, s.rows, 1)?,
                cdiv(&entry.name, s.cols, block)?,
                1,
            ])
    }

    pub(crate) fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
        let s = RowsScale {
            x_offset: 5,
            rows: 3,
            cols: 150,
            stride_x: 160,
            stride_y: 150,
            alpha: 0.5,
        };
        plan(entry, &s)
    }
}
