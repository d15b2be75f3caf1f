//! The manifest of the compiled kernels (`kernels/build/manifest.json`), typed.
//!
//! `kernels/generate.py` writes it; its format is the contract in `kernels/README.md`. One entry
//! per (variant name, target): the PTX entry point, its ordered parameters (the kernel's
//! non-constexpr arguments, then Triton's two scratch pointers), warps, shared memory, scratch
//! sizes, registers and spills. `build.rs` embeds the committed file (and, for the `cuda`
//! feature, the cubins), so nothing here reads the disk at run time.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::{Result, TritonError};

// MANIFEST_JSON (and CUBINS under `cuda`), written by build.rs from kernels/build/.
include!(concat!(env!("OUT_DIR"), "/triton_artifacts.rs"));

/// The manifest format this crate reads (`"format"` in the file).
pub const FORMAT: u32 = 1;

/// Most threads a CUDA block may have.
pub const MAX_THREADS: u32 = 1024;

/// A compilation target: which GPUs can run the code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Target {
    /// Hopper (H100/H200, compute capability 9.0), with its sm_90a-only instructions.
    #[serde(rename = "sm90a")]
    Sm90a,
    /// Ampere and Ada (compute capability 8.x: A100, RTX 30xx/40xx, L40S).
    #[serde(rename = "sm80")]
    Sm80,
}

impl Target {
    /// Every target, in the order the launcher prefers them.
    pub const ALL: [Target; 2] = [Target::Sm90a, Target::Sm80];

    /// The target for a device of compute capability `(major, minor)`: (9, 0) → sm90a,
    /// (8, x) → sm80, provided `shipped` has it.
    ///
    /// Errors: [`TritonError::Capability`] for any other capability (sm_89's tensor cores run
    /// sm80 code, but sm_100 and later cannot run sm_90a code) or a target not shipped, naming
    /// the capability and the shipped targets.
    pub fn for_capability(major: u32, minor: u32, shipped: &[Target]) -> Result<Target> {
        let want = match (major, minor) {
            (9, 0) => Some(Target::Sm90a),
            (8, _) => Some(Target::Sm80),
            _ => None,
        };
        match want {
            Some(t) if shipped.contains(&t) => Ok(t),
            _ => Err(TritonError::Capability {
                major,
                minor,
                shipped: if shipped.is_empty() {
                    "no target".into()
                } else {
                    shipped
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            }),
        }
    }

    /// The manifest's name (`"sm90a"`, `"sm80"`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm90a => "sm90a",
            Target::Sm80 => "sm80",
        }
    }

    /// The PTX `.target` directive's architecture (`sm_90a`, `sm_80`).
    pub fn ptx_arch(self) -> &'static str {
        match self {
            Target::Sm90a => "sm_90a",
            Target::Sm80 => "sm_80",
        }
    }

    /// Most shared memory (static + dynamic) one block may use on this target's GPUs, bytes:
    /// 227 KiB on sm_90, 163 KiB on sm_80 (the A100; sm_86/sm_89 allow 99 KiB, which the
    /// launcher checks against the device itself).
    pub fn max_shared_bytes(self) -> u32 {
        match self {
            Target::Sm90a => 227 * 1024,
            Target::Sm80 => 163 * 1024,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type: of what a pointer parameter points to, or of a scalar parameter (the
/// Triton signature's names: `"fp32"`, `"bf16"`, `"i32"`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float.
    Fp32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    Fp16,
    /// 64-bit float.
    Fp64,
    /// Boolean (a byte in memory and in PTX parameters).
    I1,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned byte (the scratch pointers' type).
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I1 | DType::I8 | DType::U8 => 1,
            DType::Bf16 | DType::Fp16 | DType::I16 | DType::U16 => 2,
            DType::Fp32 | DType::I32 | DType::U32 => 4,
            DType::Fp64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The manifest's name.
    pub fn name(self) -> &'static str {
        match self {
            DType::Fp32 => "fp32",
            DType::Bf16 => "bf16",
            DType::Fp16 => "fp16",
            DType::Fp64 => "fp64",
            DType::I1 => "i1",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::Fp32 | DType::Bf16 | DType::Fp16 | DType::Fp64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a kernel parameter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamKind {
    /// A global-memory pointer (a 64-bit address) to elements of `dtype`.
    Ptr,
    /// A value passed by value (`dtype` gives its width).
    Scalar,
    /// One of Triton's two trailing scratch pointers (global, profile), passed as null: the
    /// launcher refuses kernels that need scratch memory.
    Scratch,
}

/// One kernel parameter, in the PTX entry's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Param {
    /// The Triton kernel's argument name (the PTX names them `<entry>_param_<i>`).
    pub name: String,
    /// Pointer, scalar or scratch.
    pub kind: ParamKind,
    /// The pointee type of a pointer, the type of a scalar, `u8` for scratch.
    pub dtype: DType,
    /// What the compiled code assumes the argument divisible by (Triton's `tt.divisibility`):
    /// a pointer's device address in bytes, an integer scalar's value. Optional in the file
    /// (absent = 1, nothing assumed); 16 for the aligned (`_a16`) variants' pointers and listed
    /// integers. The plan builder and [`super::LaunchPlan::resolve`] refuse arguments that
    /// break it.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub divisibility: u32,
}

fn one() -> u32 {
    1
}

fn is_one(d: &u32) -> bool {
    *d == 1
}

/// One compiled kernel: a variant for one target (a manifest `kernels[]` item).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelEntry {
    /// The variant name, unique per target; what the launcher asks for.
    pub name: String,
    /// The kernel family: the module under `kernels/src/` (`"rmsnorm"`, `"attention"`, ...).
    pub family: String,
    /// The module's path from the repository root.
    pub source: String,
    /// SHA-256 of the module's file as compiled, followed by the shared helper modules it imports
    /// (`kernels/src/_*.py`, e.g. `_bf16.py`), in import order.
    pub source_sha256: String,
    /// The target compiled for.
    pub target: Target,
    /// The PTX `.entry` / cubin function name (the `@triton.jit` function's name).
    pub entry: String,
    /// The cubin, relative to `kernels/build/`.
    pub cubin: String,
    /// The PTX, relative to `kernels/build/`.
    pub ptx: String,
    /// The PTX ISA version (`"9.0"`).
    pub ptx_version: String,
    /// The parameters in order, the two scratch pointers last.
    pub params: Vec<Param>,
    /// The variant's constexpr values (block sizes, head dim, flags).
    pub constexprs: BTreeMap<String, serde_json::Value>,
    /// Warps per block.
    pub num_warps: u32,
    /// Threads per block (`num_warps · 32`): the launch's block is `[threads, 1, 1]`.
    pub threads: u32,
    /// Software pipeline stages.
    pub num_stages: u32,
    /// CTAs per cluster; the launcher supports 1 only.
    pub num_ctas: u32,
    /// Thread-block cluster shape; the launcher supports `[1, 1, 1]` only.
    pub cluster_dims: [u32; 3],
    /// Dynamic shared memory the launch must request, bytes.
    pub shared_bytes: u32,
    /// Global scratch memory the kernel needs, bytes; the launcher refuses non-zero.
    pub global_scratch_bytes: u64,
    /// Profiler scratch memory, bytes; the launcher refuses non-zero.
    pub profile_scratch_bytes: u64,
    /// Whether fused multiply-add contraction was allowed.
    pub fp_fusion: bool,
    /// Registers per thread, from the CUDA 13.0 ptxas that assembled the cubin.
    pub registers: u32,
    /// Spill bytes (stores + loads) ptxas reported.
    pub spills: u32,
    /// Whether the kernel needs a cooperative (grid-synchronising) launch. Not in the format's
    /// example (Triton's kernels never set it); read when present, and refused when true.
    #[serde(default)]
    pub launch_cooperative_grid: bool,
}

impl KernelEntry {
    /// Checks that the launcher can run this entry as it is: no scratch memory, one CTA and no
    /// cluster, no cooperative launch, `threads == num_warps · 32 ≤ 1024`, shared memory within
    /// the target's limit, exactly two scratch parameters and they come last.
    ///
    /// Errors: [`TritonError::Unsupported`], naming every reason found.
    pub fn check_launchable(&self) -> Result<()> {
        let mut why = Vec::new();
        if self.global_scratch_bytes != 0 {
            why.push(format!(
                "needs {} bytes of global scratch memory (the launcher passes a null scratch pointer)",
                self.global_scratch_bytes
            ));
        }
        if self.profile_scratch_bytes != 0 {
            why.push(format!(
                "needs {} bytes of profile scratch memory (the launcher passes a null scratch pointer)",
                self.profile_scratch_bytes
            ));
        }
        if self.num_ctas != 1 || self.cluster_dims != [1, 1, 1] {
            why.push(format!(
                "num_ctas {} with cluster dims {:?}: clusters are not supported",
                self.num_ctas, self.cluster_dims
            ));
        }
        if self.launch_cooperative_grid {
            why.push("needs a cooperative launch, which is not supported".into());
        }
        if self.threads != self.num_warps * 32 {
            why.push(format!(
                "{} threads for {} warps (expected {})",
                self.threads,
                self.num_warps,
                self.num_warps * 32
            ));
        }
        if self.threads == 0 || self.threads > MAX_THREADS {
            why.push(format!(
                "{} threads per block (CUDA allows 1 to {MAX_THREADS})",
                self.threads
            ));
        }
        if self.shared_bytes > self.target.max_shared_bytes() {
            why.push(format!(
                "{} bytes of shared memory, over {}'s {} per block",
                self.shared_bytes,
                self.target,
                self.target.max_shared_bytes()
            ));
        }
        for p in &self.params {
            let d = p.divisibility;
            let bad_kind = d > 1
                && (p.kind == ParamKind::Scratch
                    || p.dtype.is_float() && p.kind == ParamKind::Scalar);
            if d == 0 || !d.is_power_of_two() || bad_kind {
                why.push(format!(
                    "parameter {} ({:?} {}) declares divisibility {d} (a power of two, on \
                     pointers and integers only)",
                    p.name, p.kind, p.dtype
                ));
            }
        }
        let scratch: Vec<usize> = (self.params.iter().enumerate())
            .filter(|(_, p)| p.kind == ParamKind::Scratch)
            .map(|(i, _)| i)
            .collect();
        let n = self.params.len();
        if n < 2 || scratch != [n - 2, n - 1] {
            why.push(format!(
                "the scratch parameters are at positions {scratch:?} of {n}; Triton's ABI puts \
                 exactly two last"
            ));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(self.unsupported(why.join("; ")))
        }
    }

    /// Whether the compiled code assumes any parameter divisible (an aligned `_a16` variant:
    /// some parameter's `divisibility` is over 1).
    pub fn is_aligned(&self) -> bool {
        self.params.iter().any(|p| p.divisibility > 1)
    }

    /// Checks the entry's shared memory against a device's opt-in limit per block, bytes
    /// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`; 99 KiB on sm_86/sm_89).
    ///
    /// Errors: [`TritonError::Unsupported`] naming both sizes.
    pub fn check_shared_limit(&self, device_max_bytes: u32) -> Result<()> {
        if self.shared_bytes > device_max_bytes {
            return Err(self.unsupported(format!(
                "{} bytes of shared memory, over this device's {device_max_bytes} per block",
                self.shared_bytes
            )));
        }
        Ok(())
    }

    /// The integer constexpr `key` (a block size, the head dim).
    ///
    /// Errors: [`TritonError::Plan`] when absent or not an integer.
    pub fn constexpr_int(&self, key: &str) -> Result<i64> {
        match self.constexprs.get(key).and_then(|v| v.as_i64()) {
            Some(v) => Ok(v),
            None => Err(TritonError::Plan {
                name: self.name.clone(),
                why: format!(
                    "constexpr {key} is {:?}, expected an integer",
                    self.constexprs.get(key)
                ),
            }),
        }
    }

    /// The parameters a plan supplies: all but the trailing scratch pointers.
    pub fn call_params(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(|p| p.kind != ParamKind::Scratch)
    }

    fn unsupported(&self, why: String) -> TritonError {
        TritonError::Unsupported {
            name: self.name.clone(),
            target: self.target,
            why,
        }
    }
}

/// The whole manifest (`kernels/build/manifest.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format version; [`FORMAT`] is read.
    pub format: u32,
    /// The Triton version that compiled the kernels (pinned in `kernels/requirements.txt`).
    pub triton: String,
    /// The ptxas version that assembled the cubins.
    pub ptxas: String,
    /// One entry per (variant, target).
    pub kernels: Vec<KernelEntry>,
    /// [`Manifest::entry`]'s index, built at its first call.
    #[serde(skip)]
    index: EntryIndex,
}

/// Name → position in `kernels` per target (in [`Target::ALL`]'s order): a launch looks its entry
/// up by name, and a linear scan of ~350 names was microseconds per launch, which an eager decode
/// step pays some 200 times. Equal to any other index (a cache, not content).
#[derive(Clone, Debug, Default)]
struct EntryIndex(std::sync::OnceLock<std::collections::HashMap<String, [Option<usize>; 2]>>);

impl PartialEq for EntryIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Manifest {
    /// Parses a manifest's JSON text.
    ///
    /// Errors: [`TritonError::Manifest`] for malformed JSON, a missing field, another format or
    /// a (name, target) listed twice. Entries the launcher cannot run are kept: each is refused
    /// when asked for ([`Manifest::entry`]), so one bad kernel does not disable the others.
    pub fn parse(json: &str) -> Result<Manifest> {
        let m: Manifest = serde_json::from_str(json)
            .map_err(|e| TritonError::Manifest(format!("cannot read it: {e}")))?;
        if m.format != FORMAT {
            return Err(TritonError::Manifest(format!(
                "format {} (this build of rlvr-kernels reads format {FORMAT})",
                m.format
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for k in &m.kernels {
            if !seen.insert((k.name.as_str(), k.target)) {
                return Err(TritonError::Manifest(format!(
                    "{} ({}) is listed twice",
                    k.name, k.target
                )));
            }
        }
        Ok(m)
    }

    /// The manifest committed under `kernels/build/` when this crate was built.
    ///
    /// Errors: [`TritonError::Manifest`] when that file was absent at build time (no kernels
    /// shipped) or does not parse.
    pub fn committed() -> Result<&'static Manifest> {
        static PARSED: OnceLock<std::result::Result<Manifest, String>> = OnceLock::new();
        let parsed = PARSED.get_or_init(|| match MANIFEST_JSON {
            Some(json) => Manifest::parse(json).map_err(|e| e.to_string()),
            None => Err(
                "kernels/build/manifest.json was absent when rlvr-kernels was built: \
                         this build ships no compiled kernels"
                    .into(),
            ),
        });
        match parsed {
            Ok(m) => Ok(m),
            Err(e) => Err(TritonError::Manifest(e.clone())),
        }
    }

    /// The targets that have at least one entry, in [`Target::ALL`]'s order.
    pub fn targets(&self) -> Vec<Target> {
        (Target::ALL.into_iter())
            .filter(|t| self.kernels.iter().any(|k| k.target == *t))
            .collect()
    }

    /// The target to use on a device of compute capability `(major, minor)`; see
    /// [`Target::for_capability`].
    pub fn target_for(&self, major: u32, minor: u32) -> Result<Target> {
        Target::for_capability(major, minor, &self.targets())
    }

    /// The entry `name` for `target`, checked launchable ([`KernelEntry::check_launchable`]).
    ///
    /// Errors: [`TritonError::NoKernel`] listing what the target has;
    /// [`TritonError::Unsupported`] for an entry the launcher cannot run.
    pub fn entry(&self, name: &str, target: Target) -> Result<&KernelEntry> {
        let Some(k) = self.lookup(name, target) else {
            let names: Vec<&str> = (self.kernels.iter())
                .filter(|k| k.target == target)
                .map(|k| k.name.as_str())
                .collect();
            return Err(TritonError::NoKernel {
                name: name.into(),
                target,
                available: if names.is_empty() {
                    format!("nothing for {target}")
                } else {
                    format!("{target} has {}", names.join(", "))
                },
            });
        };
        k.check_launchable()?;
        Ok(k)
    }

    /// The launchable entry `name` for `target`, or `None` (no message built: for probing an
    /// optional variant, such as an aligned twin, at every launch).
    pub fn find(&self, name: &str, target: Target) -> Option<&KernelEntry> {
        (self.lookup(name, target)).filter(|k| k.check_launchable().is_ok())
    }

    /// The entry `name` for `target` (launchable or not), by the index built at the first call.
    fn lookup(&self, name: &str, target: Target) -> Option<&KernelEntry> {
        let slot = Target::ALL.iter().position(|t| *t == target).unwrap_or(0);
        let index = self.index.0.get_or_init(|| {
            let mut m: std::collections::HashMap<String, [Option<usize>; 2]> = Default::default();
            for (i, k) in self.kernels.iter().enumerate() {
                let t = Target::ALL.iter().position(|t| *t == k.target).unwrap_or(0);
                m.entry(k.name.clone()).or_default()[t].get_or_insert(i);
            }
            m
        });
        // The index, checked (`kernels` is public: an edit after the first call falls back to
        // the scan).
        let indexed = (index.get(name).and_then(|t| t[slot]))
            .and_then(|i| self.kernels.get(i))
            .filter(|k| k.name == name && k.target == target);
        indexed.or_else(|| (self.kernels.iter()).find(|k| k.name == name && k.target == target))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The fixture manifest (`testdata/triton/`, made by its `make_fixture.py`).
    pub(crate) const FIXTURE: &str = include_str!("../../testdata/triton/manifest.json");

    #[test]
    fn fixture_parses_and_every_entry_is_launchable() {
        let m = Manifest::parse(FIXTURE).unwrap();
        assert_eq!(m.targets(), vec![Target::Sm90a, Target::Sm80]);
        assert_eq!(m.kernels.len(), 4);
        for k in &m.kernels {
            k.check_launchable().unwrap();
            assert_eq!(m.entry(&k.name, k.target).unwrap(), k);
        }
        let k = m.entry("rows_scale_bf16_b128", Target::Sm80).unwrap();
        assert_eq!((k.entry.as_str(), k.threads), ("rows_scale_kernel", 128));
        assert_eq!(k.constexpr_int("BLOCK").unwrap(), 128);
        assert_eq!(k.call_params().count(), 7);
    }

    #[test]
    fn target_by_compute_capability() {
        let both = [Target::Sm90a, Target::Sm80];
        assert_eq!(Target::for_capability(9, 0, &both).unwrap(), Target::Sm90a);
        for minor in [0, 6, 9] {
            assert_eq!(
                Target::for_capability(8, minor, &both).unwrap(),
                Target::Sm80
            );
        }
        let e = Target::for_capability(10, 0, &both)
            .unwrap_err()
            .to_string();
        assert!(e.contains("10.0") && e.contains("sm90a, sm80"), "{e}");
        let e = Target::for_capability(7, 5, &both).unwrap_err().to_string();
        assert!(e.contains("7.5"), "{e}");
        // Hopper when only sm80 is shipped: refused, not run on the portable build silently.
        let e = (Target::for_capability(9, 0, &[Target::Sm80]).unwrap_err()).to_string();
        assert!(e.contains("9.0") && e.contains("ships sm80"), "{e}");
        let e = Target::for_capability(8, 0, &[]).unwrap_err().to_string();
        assert!(e.contains("no target"), "{e}");
    }

    /// The fixture's first entry with `edit` applied to its JSON object.
    fn edited(edit: impl Fn(&mut serde_json::Value)) -> KernelEntry {
        let mut v: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
        let k = &mut v["kernels"][0];
        edit(k);
        serde_json::from_value(k.clone()).unwrap()
    }

    #[test]
    fn refusals_name_the_reason() {
        type Edit = Box<dyn Fn(&mut serde_json::Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|k| k["global_scratch_bytes"] = 256.into()),
                "256 bytes of global scratch",
            ),
            (
                Box::new(|k| k["profile_scratch_bytes"] = 8.into()),
                "8 bytes of profile scratch",
            ),
            (
                Box::new(|k| k["num_ctas"] = 2.into()),
                "clusters are not supported",
            ),
            (
                Box::new(|k| k["cluster_dims"] = serde_json::json!([2, 1, 1])),
                "clusters are not supported",
            ),
            (
                Box::new(|k| k["launch_cooperative_grid"] = true.into()),
                "cooperative launch",
            ),
            (
                Box::new(|k| {
                    k["num_warps"] = 64.into();
                    k["threads"] = 2048.into();
                }),
                "2048 threads per block",
            ),
            (
                Box::new(|k| k["threads"] = 96.into()),
                "96 threads for 4 warps",
            ),
            (
                Box::new(|k| k["shared_bytes"] = (300 * 1024).into()),
                "307200 bytes of shared memory",
            ),
            (
                Box::new(|k| {
                    let p = k["params"].as_array_mut().unwrap();
                    let last = p.pop().unwrap();
                    p.insert(0, last);
                }),
                "scratch parameters are at positions [0, 8]",
            ),
        ];
        for (edit, want) in cases {
            let k = edited(edit);
            let e = k.check_launchable().unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should contain {want:?}");
            assert!(e.contains(&k.name) && e.contains("not launchable"), "{e}");
        }
        let k = edited(|k| k["shared_bytes"] = (120 * 1024).into());
        k.check_launchable().unwrap();
        let e = k.check_shared_limit(99 * 1024).unwrap_err().to_string();
        assert!(e.contains("122880") && e.contains("101376"), "{e}");
    }

    #[test]
    fn manifest_level_refusals() {
        let e = Manifest::parse("{}").unwrap_err().to_string();
        assert!(e.contains("missing field"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
        v["format"] = 2.into();
        let e = Manifest::parse(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("format 2"), "{e}");
        v["format"] = 1.into();
        let first = v["kernels"][0].clone();
        v["kernels"].as_array_mut().unwrap().push(first);
        let e = Manifest::parse(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
        let m = Manifest::parse(FIXTURE).unwrap();
        let e = m
            .entry("rmsnorm_fwd", Target::Sm90a)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no compiled kernel rmsnorm_fwd for sm90a")
                && e.contains("rows_scale_bf16_b128"),
            "{e}"
        );
    }

    #[test]
    fn committed_manifest_when_shipped() {
        match MANIFEST_JSON {
            Some(_) => {
                let m = Manifest::committed().unwrap();
                assert_eq!(m.format, FORMAT);
            }
            None => {
                let e = Manifest::committed().unwrap_err().to_string();
                assert!(e.contains("ships no compiled kernels"), "{e}");
            }
        }
    }
}
