//! Launch plans: what one kernel launch is, as plain data, built and checked without a GPU.
//!
//! A [`LaunchPlan`] names the compiled entry, the grid, the block and shared memory (from the
//! manifest), and the arguments in the PTX parameter order: pointers as (buffer name, element
//! offset, dtype), scalars by value, and the two scratch pointers as nulls. The CUDA launcher
//! (`triton::cuda`) maps buffer names to device pointers; the recorder ([`super::record`])
//! maps them to host data for the interpreter's replay. [`PlanBuilder`] is how the family
//! builders ([`super::families`]) make one: each argument is checked against the manifest's
//! parameter at its position.

use serde::{Deserialize, Serialize};

use super::manifest::{DType, KernelEntry, ParamKind, Target};
use super::{Result, TritonError};

/// CUDA's grid limits: x up to 2³¹ − 1, y and z up to 65535 blocks.
pub const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// One kernel argument, in the PTX parameter order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Arg {
    /// A device pointer: the start of buffer `buffer` plus `offset_elems` elements of `dtype`.
    Ptr {
        /// The buffer's name, which the launcher and the recorder resolve.
        buffer: String,
        /// Elements (of `dtype`) from the buffer's start.
        offset_elems: usize,
        /// The element type, the manifest parameter's.
        dtype: DType,
    },
    /// A 32-bit integer scalar (`i32`, `u32` parameters).
    I32 {
        /// The value.
        value: i32,
    },
    /// A 64-bit integer scalar (`i64`, `u64` parameters).
    I64 {
        /// The value.
        value: i64,
    },
    /// A 32-bit float scalar (`fp32` parameters).
    F32 {
        /// The value.
        value: f32,
    },
    /// One of Triton's trailing scratch pointers: passed as null (entries needing scratch
    /// memory are refused by [`KernelEntry::check_launchable`]).
    Scratch,
}

impl Arg {
    /// A short description for messages (`"ptr fp32"`, `"i32 scalar"`, ...).
    pub fn describe(&self) -> String {
        match self {
            Arg::Ptr { dtype, .. } => format!("ptr {dtype}"),
            Arg::I32 { .. } => "i32 scalar".into(),
            Arg::I64 { .. } => "i64 scalar".into(),
            Arg::F32 { .. } => "f32 scalar".into(),
            Arg::Scratch => "scratch pointer".into(),
        }
    }

    /// Whether this argument can be passed for a parameter of `kind`/`dtype`: pointers of the
    /// same dtype, `I32` for 32-bit integers, `I64` for 64-bit integers, `F32` for `fp32`.
    pub fn fits(&self, kind: ParamKind, dtype: DType) -> bool {
        match (self, kind) {
            (Arg::Ptr { dtype: d, .. }, ParamKind::Ptr) => *d == dtype,
            (Arg::I32 { .. }, ParamKind::Scalar) => matches!(dtype, DType::I32 | DType::U32),
            (Arg::I64 { .. }, ParamKind::Scalar) => matches!(dtype, DType::I64 | DType::U64),
            (Arg::F32 { .. }, ParamKind::Scalar) => dtype == DType::Fp32,
            (Arg::Scratch, ParamKind::Scratch) => true,
            _ => false,
        }
    }
}

/// Why `arg` breaks parameter `param`'s declared divisibility `d` (the aligned variants'
/// `tt.divisibility = 16`): a pointer whose element offset is not a multiple of `d` bytes, an
/// integer not a multiple of `d`. `None` when it satisfies it (always for `d <= 1`).
pub fn divisibility_violation(param: &str, arg: &Arg, d: u32) -> Option<String> {
    if d <= 1 {
        return None;
    }
    let d64 = u64::from(d);
    match arg {
        Arg::Ptr {
            buffer,
            offset_elems,
            dtype,
        } => {
            let bytes = (*offset_elems as u64) * dtype.size() as u64;
            (!bytes.is_multiple_of(d64)).then(|| {
                format!(
                    "{param} assumes a {d}-byte-aligned address, but it points {offset_elems} \
                     elements ({bytes} bytes) into buffer {buffer}: use the unaligned variant"
                )
            })
        }
        Arg::I32 { value } => (i64::from(*value) % i64::from(d) != 0).then(|| {
            format!("{param} = {value} is assumed a multiple of {d}: use the unaligned variant")
        }),
        Arg::I64 { value } => (*value % i64::from(d) != 0).then(|| {
            format!("{param} = {value} is assumed a multiple of {d}: use the unaligned variant")
        }),
        Arg::F32 { .. } | Arg::Scratch => Some(format!(
            "{param} declares divisibility {d}, which only pointers and integers can have"
        )),
    }
}

/// One kernel launch, fully described: everything the CUDA launcher passes to `cuLaunchKernel`
/// except the buffers' device addresses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchPlan {
    /// The variant's name (the manifest entry's `name`).
    pub name: String,
    /// The PTX `.entry` / cubin function.
    pub entry: String,
    /// The target the entry was compiled for.
    pub target: Target,
    /// Blocks in x, y, z (x is `tl.program_id(0)`).
    pub grid: [u32; 3],
    /// Threads per block: `[threads, 1, 1]` from the manifest.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes, from the manifest.
    pub shared_bytes: u32,
    /// The arguments in PTX parameter order, scratch pointers included.
    pub args: Vec<Arg>,
    /// The parameter names, parallel to `args` (the manifest's).
    pub params: Vec<String>,
    /// What each parameter is assumed divisible by, parallel to `args` (the manifest's
    /// `divisibility`, 1 = nothing): [`LaunchPlan::resolve`] refuses a device address that is
    /// not a multiple of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub divisibility: Vec<u32>,
}

impl LaunchPlan {
    /// The buffers the plan's pointers name, in first-use order, each once.
    pub fn buffers(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for a in &self.args {
            if let Arg::Ptr { buffer, .. } = a {
                if !out.contains(&buffer.as_str()) {
                    out.push(buffer);
                }
            }
        }
        out
    }

    /// Checks the plan against `entry` again (count, kinds and widths, name, target, block,
    /// shared memory): what the launcher does before a launch, since a plan is plain data.
    ///
    /// Errors: [`TritonError::Plan`] naming the entry and the parameter.
    pub fn check_against(&self, entry: &KernelEntry) -> Result<()> {
        let plan_err = |why: String| TritonError::Plan {
            name: entry.name.clone(),
            why,
        };
        if self.name != entry.name || self.entry != entry.entry || self.target != entry.target {
            return Err(plan_err(format!(
                "the plan is for {} ({}, {}), the entry is {} ({}, {})",
                self.name, self.entry, self.target, entry.name, entry.entry, entry.target
            )));
        }
        if self.block != [entry.threads, 1, 1] || self.shared_bytes != entry.shared_bytes {
            return Err(plan_err(format!(
                "block {:?} with {} bytes of shared memory, the entry needs [{}, 1, 1] and {}",
                self.block, self.shared_bytes, entry.threads, entry.shared_bytes
            )));
        }
        if self.args.len() != entry.params.len() || self.params.len() != entry.params.len() {
            return Err(plan_err(format!(
                "{} arguments, the entry has {} parameters",
                self.args.len(),
                entry.params.len()
            )));
        }
        for (i, ((a, n), p)) in (self.args.iter().zip(&self.params))
            .zip(&entry.params)
            .enumerate()
        {
            if *n != p.name || !a.fits(p.kind, p.dtype) {
                return Err(plan_err(format!(
                    "argument {i} is {n} ({}), parameter {i} is {} ({:?} {})",
                    a.describe(),
                    p.name,
                    p.kind,
                    p.dtype
                )));
            }
            if let Some(why) = divisibility_violation(n, a, p.divisibility) {
                return Err(plan_err(why));
            }
        }
        let want: Vec<u32> = entry.params.iter().map(|p| p.divisibility).collect();
        if self.divisibility != want
            && !(self.divisibility.is_empty() && want.iter().all(|d| *d == 1))
        {
            return Err(plan_err(format!(
                "the plan assumes divisibilities {:?}, the entry declares {want:?}",
                self.divisibility
            )));
        }
        check_grid(&entry.name, self.grid)
    }
}

/// One buffer of a launch on the device: the address of its first element (storage offset
/// included), its element type and its length in elements (for the plan's offsets). Plain data:
/// the CUDA launcher fills it from candle storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBuffer {
    /// Device address of element 0.
    pub ptr: u64,
    /// Element type.
    pub dtype: DType,
    /// Elements from `ptr` on.
    pub len: usize,
}

/// One argument's value exactly as the driver receives it (`cuLaunchKernel`'s parameter
/// buffer): a pointer as its 64-bit address, a scratch pointer as 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RawArg {
    /// A device address (pointers and the null scratch pointers).
    U64(u64),
    /// A 32-bit integer.
    I32(i32),
    /// A 64-bit integer.
    I64(i64),
    /// A 32-bit float.
    F32(f32),
}

impl LaunchPlan {
    /// The argument values of a launch, in order: each pointer resolved against the device
    /// buffer of its name (address + `offset_elems · dtype size`), scalars as they are, scratch
    /// pointers null. Pure: what the CUDA launcher passes, computed and tested without a GPU.
    ///
    /// Errors: [`TritonError::Plan`] naming the parameter, for a buffer not given, of another
    /// dtype, or shorter than the pointer's offset, and for an argument that breaks the
    /// parameter's declared divisibility (an aligned variant's pointer at an address that is
    /// not a multiple of 16 bytes, an integer not a multiple of 16).
    pub fn resolve(&self, buffers: &[(&str, DeviceBuffer)]) -> Result<Vec<RawArg>> {
        let err = |why: String| TritonError::Plan {
            name: self.name.clone(),
            why,
        };
        let mut out = Vec::with_capacity(self.args.len());
        for (i, (a, param)) in self.args.iter().zip(&self.params).enumerate() {
            let d = self.divisibility.get(i).copied().unwrap_or(1);
            if let Some(why) = divisibility_violation(param, a, d) {
                return Err(err(why));
            }
            out.push(match a {
                Arg::Ptr {
                    buffer,
                    offset_elems,
                    dtype,
                } => {
                    let Some((_, b)) = buffers.iter().find(|(n, _)| n == buffer) else {
                        return Err(err(format!("{param}: no device buffer {buffer} given")));
                    };
                    if b.dtype != *dtype || *offset_elems > b.len {
                        return Err(err(format!(
                            "{param}: buffer {buffer} is {} elements of {}, the plan needs \
                             {dtype} from element {offset_elems}",
                            b.len, b.dtype
                        )));
                    }
                    let addr = b.ptr + (*offset_elems * dtype.size()) as u64;
                    if d > 1 && !addr.is_multiple_of(u64::from(d)) {
                        return Err(err(format!(
                            "{param} assumes a {d}-byte-aligned address, but buffer {buffer} \
                             + {offset_elems} elements is at {addr:#x}: use the unaligned variant"
                        )));
                    }
                    RawArg::U64(addr)
                }
                Arg::I32 { value } => RawArg::I32(*value),
                Arg::I64 { value } => RawArg::I64(*value),
                Arg::F32 { value } => RawArg::F32(*value),
                Arg::Scratch => RawArg::U64(0),
            });
        }
        Ok(out)
    }
}

fn check_grid(name: &str, grid: [u32; 3]) -> Result<()> {
    for (d, (g, max)) in grid.iter().zip(MAX_GRID).enumerate() {
        if *g == 0 || *g > max {
            return Err(TritonError::Plan {
                name: name.into(),
                why: format!(
                    "grid {grid:?}: dimension {d} must be 1 to {max} (an empty launch is the \
                     caller's to skip)"
                ),
            });
        }
    }
    Ok(())
}

/// Builds a [`LaunchPlan`] for one manifest entry, argument by argument in parameter order;
/// each is checked against the parameter at its position (name, pointer or scalar, dtype or
/// width), and the scratch pointers are appended by [`PlanBuilder::finish`].
///
/// ```
/// # use rlvr_kernels::triton::{Manifest, PlanBuilder, Target, DType};
/// # let json = include_str!("../../testdata/triton/manifest.json");
/// let m = Manifest::parse(json).unwrap();
/// let k = m.entry("rows_scale_f32_b64", Target::Sm90a).unwrap();
/// let plan = PlanBuilder::new(k)
///     .ptr("x_ptr", "x", 0, DType::Fp32)
///     .ptr("y_ptr", "y", 0, DType::Fp32)
///     .i32("n_rows", 3).i32("n_cols", 100).i32("stride_x", 100).i32("stride_y", 100)
///     .f32("alpha", 0.5)
///     .finish([3, 2, 1])
///     .unwrap();
/// assert_eq!(plan.block, [64, 1, 1]);
/// assert_eq!(plan.args.len(), 9); // 7 + the two scratch pointers
/// ```
pub struct PlanBuilder<'a> {
    entry: &'a KernelEntry,
    args: Vec<Arg>,
    params: Vec<String>,
    error: Option<String>,
}

impl<'a> PlanBuilder<'a> {
    /// A builder for `entry` (a manifest entry, already checked launchable by
    /// [`super::Manifest::entry`]).
    pub fn new(entry: &'a KernelEntry) -> Self {
        PlanBuilder {
            entry,
            args: Vec::new(),
            params: Vec::new(),
            error: None,
        }
    }

    /// The entry this builder is for.
    pub fn entry(&self) -> &'a KernelEntry {
        self.entry
    }

    fn push(mut self, name: &str, arg: Arg) -> Self {
        if self.error.is_some() {
            return self;
        }
        let i = self.args.len();
        let call: Vec<_> = self.entry.call_params().collect();
        match call.get(i) {
            None => {
                self.error = Some(format!(
                    "argument {i} ({name}, {}) is one too many: the entry has {} parameters \
                     before the scratch pointers",
                    arg.describe(),
                    call.len()
                ))
            }
            Some(p) if p.name != name || !arg.fits(p.kind, p.dtype) => {
                self.error = Some(format!(
                    "argument {i} is {name} ({}), but parameter {i} is {} ({:?} {})",
                    arg.describe(),
                    p.name,
                    p.kind,
                    p.dtype
                ))
            }
            Some(p) => {
                if let Some(why) = divisibility_violation(name, &arg, p.divisibility) {
                    self.error = Some(why);
                    return self;
                }
                self.args.push(arg);
                self.params.push(name.to_string());
            }
        }
        self
    }

    /// A pointer parameter `name`: buffer `buffer` from element `offset_elems`, of `dtype`.
    pub fn ptr(self, name: &str, buffer: &str, offset_elems: usize, dtype: DType) -> Self {
        let arg = Arg::Ptr {
            buffer: buffer.into(),
            offset_elems,
            dtype,
        };
        self.push(name, arg)
    }

    /// A pointer parameter `name` to buffer `buffer`'s start, of the manifest parameter's
    /// dtype (for buffers whose dtype the variant fixes).
    pub fn buf(self, name: &str, buffer: &str) -> Self {
        self.buf_at(name, buffer, 0)
    }

    /// [`PlanBuilder::buf`] from element `offset_elems` of the buffer.
    pub fn buf_at(self, name: &str, buffer: &str, offset_elems: usize) -> Self {
        let i = self.args.len();
        let dtype = (self.entry.call_params().nth(i))
            .filter(|p| p.kind == ParamKind::Ptr)
            .map_or(DType::U8, |p| p.dtype);
        self.ptr(name, buffer, offset_elems, dtype)
    }

    /// A 32-bit integer scalar. Errors at [`PlanBuilder::finish`] when `value` does not fit.
    pub fn i32(mut self, name: &str, value: impl TryInto<i32> + Copy + std::fmt::Debug) -> Self {
        match value.try_into() {
            Ok(v) => self.push(name, Arg::I32 { value: v }),
            Err(_) => {
                if self.error.is_none() {
                    self.error = Some(format!("{name} = {value:?} does not fit an i32"));
                }
                self
            }
        }
    }

    /// A 64-bit integer scalar.
    pub fn i64(self, name: &str, value: i64) -> Self {
        self.push(name, Arg::I64 { value })
    }

    /// A 32-bit float scalar.
    pub fn f32(self, name: &str, value: f32) -> Self {
        self.push(name, Arg::F32 { value })
    }

    /// The plan, launched on `grid`.
    ///
    /// Errors: [`TritonError::Plan`] naming the entry and the first argument that did not
    /// match its parameter (wrong name, kind, dtype or width; one too many; an element offset
    /// or integer that breaks the parameter's declared divisibility), a missing
    /// argument, or a grid dimension of 0 or over CUDA's limit.
    pub fn finish(self, grid: [u32; 3]) -> Result<LaunchPlan> {
        let e = self.entry;
        let plan_err = |why: String| TritonError::Plan {
            name: e.name.clone(),
            why,
        };
        if let Some(why) = self.error {
            return Err(plan_err(why));
        }
        let missing: Vec<&str> = (e.call_params().skip(self.args.len()))
            .map(|p| p.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(plan_err(format!(
                "missing arguments {}",
                missing.join(", ")
            )));
        }
        check_grid(&e.name, grid)?;
        let (mut args, mut params) = (self.args, self.params);
        for p in e.params.iter().filter(|p| p.kind == ParamKind::Scratch) {
            args.push(Arg::Scratch);
            params.push(p.name.clone());
        }
        let plan = LaunchPlan {
            name: e.name.clone(),
            entry: e.entry.clone(),
            target: e.target,
            grid,
            block: [e.threads, 1, 1],
            shared_bytes: e.shared_bytes,
            args,
            params,
            divisibility: if e.params.iter().any(|p| p.divisibility > 1) {
                e.params.iter().map(|p| p.divisibility).collect()
            } else {
                Vec::new()
            },
        };
        plan.check_against(e)?;
        Ok(plan)
    }
}

/// `ceil(a / b)` as a grid dimension. Errors when it exceeds `u32`.
pub fn cdiv(name: &str, a: usize, b: usize) -> Result<u32> {
    u32::try_from(a.div_ceil(b.max(1))).map_err(|_| TritonError::Plan {
        name: name.into(),
        why: format!("{a} / {b} blocks do not fit a grid dimension"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::triton::manifest::{tests::FIXTURE, Manifest};

    fn entry() -> KernelEntry {
        let m = Manifest::parse(FIXTURE).unwrap();
        m.entry("rows_scale_bf16_b128", Target::Sm80)
            .unwrap()
            .clone()
    }

    fn good(k: &KernelEntry) -> PlanBuilder<'_> {
        PlanBuilder::new(k)
            .buf("x_ptr", "x")
            .buf("y_ptr", "y")
            .i32("n_rows", 2)
            .i32("n_cols", 10)
            .i32("stride_x", 10)
            .i32("stride_y", 12)
    }

    #[test]
    fn builds_in_parameter_order_with_scratch_nulls() {
        let k = entry();
        let p = good(&k).f32("alpha", 2.0).finish([2, 1, 1]).unwrap();
        assert_eq!(p.block, [128, 1, 1]);
        assert_eq!(
            p.args[0],
            Arg::Ptr {
                buffer: "x".into(),
                offset_elems: 0,
                dtype: DType::Bf16
            }
        );
        assert_eq!(p.args[6], Arg::F32 { value: 2.0 });
        assert_eq!(&p.args[7..], &[Arg::Scratch, Arg::Scratch]);
        assert_eq!(p.params[7], "global_scratch");
        assert_eq!(p.buffers(), vec!["x", "y"]);
        p.check_against(&k).unwrap();
    }

    #[test]
    fn mismatches_name_the_entry_and_parameter() {
        let k = entry();
        let msg = |r: Result<LaunchPlan>| r.unwrap_err().to_string();
        // A scalar of the wrong kind.
        let e = msg(good(&k).i32("alpha", 2).finish([1, 1, 1]));
        assert!(
            e.contains("rows_scale_bf16_b128")
                && e.contains(
                    "argument 6 is alpha (i32 scalar), but parameter 6 is alpha (Scalar fp32)"
                ),
            "{e}"
        );
        // Two arguments swapped.
        let e = msg(PlanBuilder::new(&k).buf("y_ptr", "y").finish([1, 1, 1]));
        assert!(e.contains("argument 0 is y_ptr"), "{e}");
        // A pointer of the wrong dtype.
        let e = msg(PlanBuilder::new(&k)
            .ptr("x_ptr", "x", 0, DType::Fp32)
            .finish([1, 1, 1]));
        assert!(
            e.contains("(ptr fp32), but parameter 0 is x_ptr (Ptr bf16)"),
            "{e}"
        );
        // Too few, too many.
        let e = msg(good(&k).finish([1, 1, 1]));
        assert!(e.contains("missing arguments alpha"), "{e}");
        let e = msg(good(&k).f32("alpha", 1.0).i32("extra", 1).finish([1, 1, 1]));
        assert!(
            e.contains("argument 7 (extra, i32 scalar) is one too many"),
            "{e}"
        );
        // Values and grids out of range.
        let e = msg(good(&k).f32("alpha", 1.0).finish([1, 0, 1]));
        assert!(e.contains("dimension 1 must be 1 to 65535"), "{e}");
        let e = msg(PlanBuilder::new(&k)
            .buf("x_ptr", "x")
            .buf("y_ptr", "y")
            .i32("n_rows", 1usize << 40)
            .finish([1, 1, 1]));
        assert!(e.contains("does not fit an i32"), "{e}");
        // A plan edited after building is caught before a launch.
        let mut p = good(&k).f32("alpha", 1.0).finish([1, 1, 1]).unwrap();
        p.args.swap(2, 6);
        let e = p.check_against(&k).unwrap_err().to_string();
        assert!(e.contains("argument 2 is n_rows (f32 scalar)"), "{e}");
    }

    /// The fixture's bf16 entry as an aligned twin: both pointers and `n_cols`, `stride_x`,
    /// `stride_y` assumed divisible by 16.
    pub(crate) fn aligned_entry() -> KernelEntry {
        let mut k = entry();
        k.name.push_str("_a16");
        for p in &mut k.params {
            if ["x_ptr", "y_ptr", "n_cols", "stride_x", "stride_y"].contains(&p.name.as_str()) {
                p.divisibility = 16;
            }
        }
        k
    }

    #[test]
    fn divisibility_is_refused_naming_entry_and_parameter() {
        let k = aligned_entry();
        k.check_launchable().unwrap();
        assert!(k.is_aligned() && !entry().is_aligned());
        let build = |x_off: usize, cols: i32, stride_y: i32| {
            PlanBuilder::new(&k)
                .buf_at("x_ptr", "x", x_off)
                .buf("y_ptr", "y")
                .i32("n_rows", 3) // not declared: any value
                .i32("n_cols", cols)
                .i32("stride_x", 32)
                .i32("stride_y", stride_y)
                .f32("alpha", 1.0)
                .finish([3, 1, 1])
        };
        // bf16: an offset of 8 elements is 16 bytes; n_rows = 3 is not declared.
        let p = build(8, 32, 48).unwrap();
        assert_eq!(p.divisibility, vec![16, 16, 1, 16, 16, 16, 1, 1, 1]);
        p.check_against(&k).unwrap();
        let msg = |r: Result<LaunchPlan>| r.unwrap_err().to_string();
        let e = msg(build(4, 32, 48));
        assert!(
            e.contains("rows_scale_bf16_b128_a16")
                && e.contains("x_ptr assumes a 16-byte-aligned address")
                && e.contains("4 elements (8 bytes) into buffer x"),
            "{e}"
        );
        let e = msg(build(8, 30, 48));
        assert!(
            e.contains("rows_scale_bf16_b128_a16")
                && e.contains("n_cols = 30 is assumed a multiple of 16"),
            "{e}"
        );
        let e = msg(build(8, 32, 40));
        assert!(e.contains("stride_y = 40"), "{e}");
        // The same arguments for the fallback (no divisibility declared) are fine, and its plan
        // carries no divisibility list (the plans of unaligned entries are unchanged).
        let f = entry();
        let p = PlanBuilder::new(&f)
            .buf_at("x_ptr", "x", 4)
            .buf("y_ptr", "y")
            .i32("n_rows", 3)
            .i32("n_cols", 30)
            .i32("stride_x", 30)
            .i32("stride_y", 30)
            .f32("alpha", 1.0)
            .finish([3, 1, 1])
            .unwrap();
        assert!(p.divisibility.is_empty());
        // A plan edited after building is caught before a launch.
        let mut p = build(8, 32, 48).unwrap();
        p.args[3] = Arg::I32 { value: 33 };
        let e = p.check_against(&k).unwrap_err().to_string();
        assert!(e.contains("n_cols = 33"), "{e}");
        let mut p = build(8, 32, 48).unwrap();
        p.divisibility.clear();
        let e = p.check_against(&k).unwrap_err().to_string();
        assert!(e.contains("the plan assumes divisibilities []"), "{e}");
        // The device addresses: element offset fine, but the buffer's own start not aligned
        // (a tensor view starting 2 elements into its allocation).
        let p = build(8, 32, 48).unwrap();
        let buf = |ptr, len| DeviceBuffer {
            ptr,
            dtype: DType::Bf16,
            len,
        };
        p.resolve(&[("x", buf(0x1000, 200)), ("y", buf(0x2000, 200))])
            .unwrap();
        let e = p
            .resolve(&[("x", buf(0x1004, 200)), ("y", buf(0x2000, 200))])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rows_scale_bf16_b128_a16")
                && e.contains("x_ptr assumes a 16-byte-aligned address, but buffer x + 8 elements is at 0x1014"),
            "{e}"
        );
        // A declared divisibility the launcher cannot honour is refused with the entry.
        let mut bad = aligned_entry();
        bad.params[6].divisibility = 16; // alpha, an f32
        let e = bad.check_launchable().unwrap_err().to_string();
        assert!(
            e.contains("parameter alpha") && e.contains("divisibility 16"),
            "{e}"
        );
        bad.params[6].divisibility = 12;
        assert!(bad.check_launchable().is_err());
    }

    #[test]
    fn resolve_gives_the_driver_values() {
        let k = entry();
        let p = PlanBuilder::new(&k)
            .buf_at("x_ptr", "x", 5)
            .buf("y_ptr", "y")
            .i32("n_rows", 2)
            .i32("n_cols", 10)
            .i32("stride_x", 10)
            .i32("stride_y", 12)
            .f32("alpha", 2.0)
            .finish([2, 1, 1])
            .unwrap();
        let buf = |ptr, dtype, len| DeviceBuffer { ptr, dtype, len };
        let x = buf(0x1000, DType::Bf16, 25);
        let y = buf(0x8000, DType::Bf16, 24);
        let v = p.resolve(&[("y", y), ("x", x)]).unwrap();
        assert_eq!(
            v,
            vec![
                RawArg::U64(0x1000 + 5 * 2), // bf16: 2 bytes per element
                RawArg::U64(0x8000),
                RawArg::I32(2),
                RawArg::I32(10),
                RawArg::I32(10),
                RawArg::I32(12),
                RawArg::F32(2.0),
                RawArg::U64(0),
                RawArg::U64(0),
            ]
        );
        let msg = |b: &[(&str, DeviceBuffer)]| p.resolve(b).unwrap_err().to_string();
        assert!(msg(&[("x", x)]).contains("y_ptr: no device buffer y given"));
        let e = msg(&[("x", buf(0x1000, DType::Fp32, 25)), ("y", y)]);
        assert!(
            e.contains("x_ptr: buffer x is 25 elements of fp32, the plan needs bf16"),
            "{e}"
        );
        let e = msg(&[("x", buf(0x1000, DType::Bf16, 4)), ("y", y)]);
        assert!(e.contains("from element 5"), "{e}");
    }
}
