//! Plan builders, one per kernel family: each derives the grid and the argument list of its
//! kernels from shapes and strides, in the parameter order of the family's module under
//! `kernels/src/`, and [`super::PlanBuilder`] checks every argument against the manifest.
//!
//! [`example_plan`] gives, for any manifest entry, the plan its family's builder makes at a
//! small shape: the ABI test compares that argument list with the manifest and the PTX, and
//! the recorder test replays it. A family listed in the manifest needs a builder here, or a
//! place in [`FAMILIES_WITHOUT_PLAN`].

use super::manifest::{KernelEntry, Manifest, Target};
use super::plan::{DeviceBuffer, LaunchPlan};
use super::Result;

/// The name suffix of a variant's aligned twin (`kernels/variant.py`'s `ALIGNED_SUFFIX`):
/// compiled assuming every pointer 16-byte aligned and some integers (row lengths, strides,
/// element counts) multiples of 16, so that it loads and stores 128 bits at a time.
pub const ALIGNED_SUFFIX: &str = "_a16";

/// The name of `name`'s aligned twin (`rmsnorm_fwd_bf16_h1024` → `rmsnorm_fwd_bf16_h1024_a16`).
pub fn aligned_name(name: &str) -> String {
    format!("{name}{ALIGNED_SUFFIX}")
}

/// The plan for variant `name` or, preferably, its aligned twin: `build` (a family's `plan`
/// at the launch's shapes) is made for [`aligned_name`]`(name)` when `m` has it for `target`,
/// and that plan is taken when the builder accepts it (every element offset and integer the
/// twin assumes divisible is) and, with `buffers` given, when it resolves against them (every
/// device address it assumes aligned is). Otherwise the plan for `name` itself, the fallback
/// compiled without assumptions; its errors are the ones returned.
///
/// ```
/// # use rlvr_kernels::triton::{families, Manifest, Target};
/// # fn go(m: &Manifest) -> rlvr_kernels::triton::Result<()> {
/// use families::swiglu::{plan, Swiglu};
/// let s = Swiglu { rows: 16 * 512, cols: 4864 };
/// let p = families::pick(m, "swiglu_fwd_bf16", Target::Sm90a, None, |e| plan(e, &s))?;
/// assert_eq!(p.name, "swiglu_fwd_bf16_a16"); // 4864 = 16 · 304
/// # Ok(()) }
/// ```
pub fn pick(
    m: &Manifest,
    name: &str,
    target: Target,
    buffers: Option<&[(&str, DeviceBuffer)]>,
    build: impl Fn(&KernelEntry) -> Result<LaunchPlan>,
) -> Result<LaunchPlan> {
    if let Some(k) = m.find(&aligned_name(name), target) {
        if let Ok(plan) = build(k) {
            if buffers.is_none_or(|b| plan.resolve(b).is_ok()) {
                return Ok(plan);
            }
        }
    }
    build(m.entry(name, target)?)
}

pub mod adamw;
pub mod attention;
pub mod decode;
pub mod logprob_head;
pub mod rmsnorm;
pub mod rotary;
pub mod swiglu;

/// `x` for an unaligned entry; for an aligned one (some parameter assumed divisible by 16),
/// `x` rounded down to a multiple of 16 (at least 16): the example shapes' lengths.
pub(crate) fn example_len(entry: &KernelEntry, x: usize) -> usize {
    if entry.is_aligned() {
        (x / 16 * 16).max(16)
    } else {
        x
    }
}

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
        "decode" => Some(decode::example(entry)),
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

#[cfg(test)]
mod tests {
    use super::super::manifest::tests::FIXTURE;
    use super::super::plan::DeviceBuffer;
    use super::super::DType;
    use super::fixture::{plan, RowsScale};
    use super::*;

    /// The fixture manifest plus an aligned twin of `rows_scale_bf16_b128` for sm80 only.
    fn manifest_with_twin() -> Manifest {
        let mut v: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
        let kernels = v["kernels"].as_array_mut().unwrap();
        let mut twin = (kernels.iter())
            .find(|k| k["name"] == "rows_scale_bf16_b128" && k["target"] == "sm80")
            .unwrap()
            .clone();
        twin["name"] = aligned_name("rows_scale_bf16_b128").into();
        for p in twin["params"].as_array_mut().unwrap() {
            if ["x_ptr", "y_ptr", "n_cols", "stride_x", "stride_y"]
                .contains(&p["name"].as_str().unwrap())
            {
                p["divisibility"] = 16.into();
            }
        }
        kernels.push(twin);
        Manifest::parse(&v.to_string()).unwrap()
    }

    fn shape(x_offset: usize, cols: usize) -> RowsScale {
        RowsScale {
            x_offset,
            rows: 3,
            cols,
            stride_x: 160,
            stride_y: 160,
            alpha: 0.5,
        }
    }

    #[test]
    fn pick_takes_the_aligned_twin_when_everything_qualifies() {
        let m = manifest_with_twin();
        let k = m.entry("rows_scale_bf16_b128_a16", Target::Sm80).unwrap();
        assert_eq!(k.params[0].divisibility, 16);
        assert_eq!(k.params[2].divisibility, 1); // n_rows
        let pick = |s: &RowsScale, bufs: Option<&[(&str, DeviceBuffer)]>, t| {
            pick(&m, "rows_scale_bf16_b128", t, bufs, |e| plan(e, s))
                .unwrap()
                .name
        };
        let fallback = "rows_scale_bf16_b128";
        let twin = "rows_scale_bf16_b128_a16";
        assert_eq!(pick(&shape(8, 160), None, Target::Sm80), twin);
        // n_cols not a multiple of 16, an offset of 5 bf16 elements (10 bytes): the fallback.
        assert_eq!(pick(&shape(8, 150), None, Target::Sm80), fallback);
        assert_eq!(pick(&shape(5, 160), None, Target::Sm80), fallback);
        // No twin for sm90a: the fallback.
        assert_eq!(pick(&shape(8, 160), None, Target::Sm90a), fallback);
        // The device addresses decide too.
        let buf = |ptr| DeviceBuffer {
            ptr,
            dtype: DType::Bf16,
            len: 1024,
        };
        let good = [("x", buf(0x10000)), ("y", buf(0x20000))];
        let odd = [("x", buf(0x10002)), ("y", buf(0x20000))];
        assert_eq!(pick(&shape(8, 160), Some(&good), Target::Sm80), twin);
        assert_eq!(pick(&shape(8, 160), Some(&odd), Target::Sm80), fallback);
        // The fallback's own errors are the ones returned.
        let e = super::pick(&m, "rows_scale_bf16_b128", Target::Sm80, None, |e| {
            plan(e, &shape(8, 160)).and_then(|_| {
                Err(super::super::TritonError::Plan {
                    name: e.name.clone(),
                    why: "refused".into(),
                })
            })
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rows_scale_bf16_b128") && e.contains("refused"),
            "{e}"
        );
        assert!(!e.contains("_a16"), "{e}");
        let e = super::pick(&m, "no_such", Target::Sm80, None, |e| {
            plan(e, &shape(8, 160))
        });
        assert!(e.unwrap_err().to_string().contains("no_such"));
    }

    /// Every aligned twin in the committed manifest has its fallback (same target, same
    /// parameters apart from the divisibility), so [`pick`] can always fall back.
    #[test]
    fn committed_twins_have_their_fallback() {
        let Ok(m) = Manifest::committed() else {
            return;
        };
        let mut twins = 0;
        for k in m.kernels.iter().filter(|k| k.is_aligned()) {
            twins += 1;
            let base = k.name.strip_suffix(ALIGNED_SUFFIX).unwrap_or_else(|| {
                panic!(
                    "{} assumes divisibility but is not named *{ALIGNED_SUFFIX}",
                    k.name
                )
            });
            let f = m.entry(base, k.target).unwrap();
            assert!(!f.is_aligned(), "{base}");
            let strip = |e: &KernelEntry| {
                (e.params.iter())
                    .map(|p| (p.name.clone(), p.kind, p.dtype))
                    .collect::<Vec<_>>()
            };
            assert_eq!(strip(k), strip(f), "{}", k.name);
            // (Constexprs and warps may differ: a twin that spilled with the fallback's takes
            // others, e.g. attn_bwd_dkdv_bf16_d64_a16's BLOCK_M on sm80.)
            assert_eq!(k.entry, f.entry, "{}", k.name);
        }
        assert!(
            twins > 0 || m.kernels.is_empty(),
            "no aligned variant in kernels/build/"
        );
    }
}
