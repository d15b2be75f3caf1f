//! PTX `.entry` parameter lists, parsed, and the ABI check of a manifest entry against its PTX.
//!
//! Triton's launch ABI is the kernel's non-constexpr arguments in order plus two trailing scratch
//! pointers, and it drifts between Triton versions; the launcher passes arguments by position, so
//! a mismatch is a silent memory error on the GPU. [`check_abi`] catches it on any machine from
//! the committed PTX: entry name, parameter count, order, pointer or scalar and width, the
//! `.target` and `.version` the driver must load, and `.reqntid` against the block size.
//! [`check_plan`] checks a launch plan's own argument list against the same PTX, and
//! [`check_cubin`] the cubin's ELF header (machine, SM) and kernel section.
//!
//! The parameter forms Triton emits (PTX ISA §5.1.6, "Kernel Function Parameters"):
//! `.param .u64 .ptr .global .align 1 k_param_0` (a pointer), `.param .u32 k_param_2`,
//! `.param .f32 k_param_3`, `.param .u64 k_param_4` (an i64).

use super::manifest::{DType, KernelEntry, ParamKind, Target};
use super::plan::{Arg, LaunchPlan};
use super::{Result, TritonError};

/// The highest PTX ISA version the launcher ships: what the CUDA 13.0 driver (the lent
/// machines' 580 series) loads. Triton 3.9 emits 9.4 by default; the generator asks for 9.0.
pub const MAX_PTX_VERSION: (u32, u32) = (9, 0);

/// A PTX parameter's type class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxClass {
    /// `.uN`
    Unsigned,
    /// `.sN`
    Signed,
    /// `.bN` (untyped bits)
    Bits,
    /// `.fN`
    Float,
}

/// One `.param` of an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxParam {
    /// Its name in the PTX (`<entry>_param_<i>` for Triton's kernels).
    pub name: String,
    /// The type class.
    pub class: PtxClass,
    /// The width in bits.
    pub bits: u32,
    /// Marked `.ptr` (a pointer, with an optional state space and alignment).
    pub ptr: bool,
}

/// One `.entry` (a kernel function).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxEntry {
    /// The function name.
    pub name: String,
    /// The parameters in order.
    pub params: Vec<PtxParam>,
    /// `.reqntid` (the exact block shape), when given.
    pub reqntid: Option<[u32; 3]>,
}

/// What [`parse`] reads of a PTX module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxModule {
    /// `.version major.minor`.
    pub version: (u32, u32),
    /// `.target`'s architecture (`sm_90a`).
    pub target: String,
    /// Every `.entry`, in order.
    pub entries: Vec<PtxEntry>,
}

fn err(why: String) -> TritonError {
    TritonError::Manifest(format!("PTX: {why}"))
}

/// The PTX text without `//` and `/* */` comments.
fn strip_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut rest = ptx;
    while !rest.is_empty() {
        let line = rest.find("//");
        let block = rest.find("/*");
        match (line, block) {
            (Some(l), b) if b.is_none_or(|b| l < b) => {
                out.push_str(&rest[..l]);
                rest = rest[l..].find('\n').map_or("", |n| &rest[l + n..]);
            }
            (_, Some(b)) => {
                out.push_str(&rest[..b]);
                out.push(' ');
                rest = rest[b..].find("*/").map_or("", |e| &rest[b + e + 2..]);
            }
            _ => {
                out.push_str(rest);
                rest = "";
            }
        }
    }
    out
}

fn parse_param(text: &str) -> std::result::Result<PtxParam, String> {
    let toks: Vec<&str> = text.split_whitespace().collect();
    if toks.first() != Some(&".param") {
        return Err(format!("parameter {text:?} does not start with .param"));
    }
    let mut ty = None;
    let mut ptr = false;
    let mut name = None;
    let mut i = 1;
    while i < toks.len() {
        let t = toks[i];
        match t {
            ".ptr" => ptr = true,
            ".global" | ".shared" | ".const" | ".local" => {}
            ".align" => i += 1,
            _ if t.starts_with('.') => {
                let (class, bits) = t[1..].split_at(1);
                let class = match class {
                    "u" => PtxClass::Unsigned,
                    "s" => PtxClass::Signed,
                    "b" => PtxClass::Bits,
                    "f" => PtxClass::Float,
                    _ => return Err(format!("unknown parameter type {t} in {text:?}")),
                };
                let bits = bits
                    .parse::<u32>()
                    .map_err(|_| format!("unknown parameter type {t} in {text:?}"))?;
                ty = Some((class, bits));
            }
            _ => name = Some(t),
        }
        i += 1;
    }
    let (Some((class, bits)), Some(name)) = (ty, name) else {
        return Err(format!("cannot read parameter {text:?}"));
    };
    if name.contains('[') {
        return Err(format!(
            "parameter {text:?} is an array (a struct by value), which Triton does not emit"
        ));
    }
    Ok(PtxParam {
        name: name.to_string(),
        class,
        bits,
        ptr,
    })
}

/// Parses a PTX module's `.version`, `.target` and every `.entry` with its parameters and
/// `.reqntid`.
///
/// Errors: [`TritonError::Manifest`] ("PTX: ...") for a missing `.version`/`.target`, an entry
/// without a closed parameter list, a parameter form Triton does not emit.
pub fn parse(ptx: &str) -> Result<PtxModule> {
    let text = strip_comments(ptx);
    let mut version = None;
    let mut target = None;
    for line in text.lines() {
        let mut t = line.split_whitespace();
        match t.next() {
            Some(".version") if version.is_none() => {
                let v = t.next().unwrap_or("");
                let (a, b) = v.split_once('.').unwrap_or((v, ""));
                version = Some(
                    (a.parse::<u32>().ok())
                        .zip(b.parse::<u32>().ok())
                        .ok_or_else(|| err(format!("cannot read .version {v:?}")))?,
                );
            }
            Some(".target") if target.is_none() => {
                let rest: String = t.collect::<Vec<_>>().join(" ");
                target = rest.split(',').next().map(|s| s.trim().to_string());
            }
            _ => {}
        }
    }
    let mut entries = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(".entry") {
        let after = &rest[at + ".entry".len()..];
        let open = after
            .find('(')
            .ok_or_else(|| err("an .entry without a parameter list".into()))?;
        let name = after[..open].trim().to_string();
        let close = after[open..]
            .find(')')
            .ok_or_else(|| err(format!(".entry {name}: unclosed parameter list")))?
            + open;
        let list = after[open + 1..close].trim();
        let params = if list.is_empty() {
            Vec::new()
        } else {
            (list.split(','))
                .map(parse_param)
                .collect::<std::result::Result<Vec<_>, String>>()
                .map_err(|e| err(format!(".entry {name}: {e}")))?
        };
        // Performance directives sit between the parameter list and the body's `{`.
        let body = after[close..].find('{').map_or(after.len(), |b| close + b);
        let directives = &after[close + 1..body];
        let reqntid = match directives.find(".reqntid") {
            None => None,
            Some(r) => {
                let tail = &directives[r + ".reqntid".len()..];
                let end = tail.find(['.', '\n']).unwrap_or(tail.len());
                let dims: Vec<u32> = (tail[..end].split(','))
                    .map(|d| d.trim().parse::<u32>())
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|_| err(format!(".entry {name}: cannot read .reqntid")))?;
                if dims.is_empty() || dims.len() > 3 {
                    return Err(err(format!(".entry {name}: .reqntid {dims:?}")));
                }
                let mut d = [1u32; 3];
                d[..dims.len()].copy_from_slice(&dims);
                Some(d)
            }
        };
        entries.push(PtxEntry {
            name,
            params,
            reqntid,
        });
        rest = &after[body..];
    }
    Ok(PtxModule {
        version: version.ok_or_else(|| err("no .version directive".into()))?,
        target: target.ok_or_else(|| err("no .target directive".into()))?,
        entries,
    })
}

/// Whether a manifest parameter of `kind`/`dtype` is passed as `p`: pointers and scratch as a
/// 64-bit `.ptr`; scalars by width (`i32`/`u32` as a 32-bit integer, `fp32` as `.f32`, ...).
fn fits(kind: ParamKind, dtype: DType, p: &PtxParam) -> bool {
    use PtxClass::*;
    match kind {
        ParamKind::Ptr | ParamKind::Scratch => {
            p.ptr && p.bits == 64 && matches!(p.class, Unsigned | Bits)
        }
        ParamKind::Scalar => {
            let int = matches!(p.class, Unsigned | Signed | Bits);
            let bits = (dtype.size() * 8) as u32;
            !p.ptr
                && match dtype {
                    DType::Fp32 | DType::Fp64 => matches!(p.class, Float | Bits) && p.bits == bits,
                    DType::Fp16 | DType::Bf16 => matches!(p.class, Bits) && p.bits == 16,
                    _ => int && p.bits == bits,
                }
        }
    }
}

fn describe(p: &PtxParam) -> String {
    let c = match p.class {
        PtxClass::Unsigned => 'u',
        PtxClass::Signed => 's',
        PtxClass::Bits => 'b',
        PtxClass::Float => 'f',
    };
    format!(".{c}{}{}", p.bits, if p.ptr { " .ptr" } else { "" })
}

/// Checks a manifest entry against the text of its PTX: the `.entry` named `entry.entry`
/// exists (and is the module's only one), its parameters match `entry.params` in count, order,
/// pointer or scalar and width, the two scratch pointers come last, `.target` is the entry's
/// target (`sm_90a`, `sm_80`), `.version` equals the manifest's and is at most
/// [`MAX_PTX_VERSION`], and `.reqntid` is `[threads, 1, 1]`.
///
/// Errors: [`TritonError::Abi`] listing every disagreement; a PTX that does not parse.
pub fn check_abi(entry: &KernelEntry, ptx: &str) -> Result<()> {
    let m = parse(ptx)?;
    let mut why = Vec::new();
    if m.target != entry.target.ptx_arch() {
        why.push(format!(
            ".target {} but the manifest says {} ({})",
            m.target,
            entry.target,
            entry.target.ptx_arch()
        ));
    }
    let version = format!("{}.{}", m.version.0, m.version.1);
    if version != entry.ptx_version {
        why.push(format!(
            ".version {version} but the manifest says {}",
            entry.ptx_version
        ));
    }
    if m.version > MAX_PTX_VERSION {
        why.push(format!(
            ".version {version} is newer than {}.{}, the most the CUDA 13.0 driver loads",
            MAX_PTX_VERSION.0, MAX_PTX_VERSION.1
        ));
    }
    if m.entries.len() != 1 {
        let names: Vec<&str> = m.entries.iter().map(|e| e.name.as_str()).collect();
        why.push(format!("the module has entries {names:?}, expected one"));
    }
    match m.entries.iter().find(|e| e.name == entry.entry) {
        None => why.push(format!("no .entry {}", entry.entry)),
        Some(e) => {
            if e.params.len() != entry.params.len() {
                why.push(format!(
                    "{} PTX parameters, the manifest lists {} ({})",
                    e.params.len(),
                    entry.params.len(),
                    (entry.params.iter())
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            for (i, (want, got)) in entry.params.iter().zip(&e.params).enumerate() {
                if !fits(want.kind, want.dtype, got) {
                    why.push(format!(
                        "parameter {i} ({}, {:?} {}) is {} in the PTX",
                        want.name,
                        want.kind,
                        want.dtype,
                        describe(got)
                    ));
                }
            }
            let n = entry.params.len();
            if n < 2
                || entry.params[n - 2..]
                    .iter()
                    .any(|p| p.kind != ParamKind::Scratch)
            {
                why.push("the last two parameters are not the scratch pointers".into());
            }
            match e.reqntid {
                Some(r) if r == [entry.threads, 1, 1] => {}
                r => why.push(format!(
                    ".reqntid {r:?} but the manifest's block is [{}, 1, 1]",
                    entry.threads
                )),
            }
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(TritonError::Abi {
            name: entry.name.clone(),
            target: entry.target,
            why: why.join("; "),
        })
    }
}

/// Checks a launch plan's own argument list against the PTX of its entry: as many arguments as
/// `.param`s, each of the kind and width its parameter declares (pointers and scratch as 64-bit
/// `.ptr`, `I32` as a 32-bit integer, `I64` as a 64-bit integer, `F32` as `.f32`), the two
/// scratch pointers last.
///
/// Errors: [`TritonError::Abi`] listing every disagreement; a PTX that does not parse.
pub fn check_plan(plan: &LaunchPlan, ptx: &str) -> Result<()> {
    let m = parse(ptx)?;
    let mut why = Vec::new();
    match m.entries.iter().find(|e| e.name == plan.entry) {
        None => why.push(format!("no .entry {}", plan.entry)),
        Some(e) => {
            if e.params.len() != plan.args.len() {
                why.push(format!(
                    "the plan passes {} arguments, the PTX entry takes {}",
                    plan.args.len(),
                    e.params.len()
                ));
            }
            for (i, (a, p)) in plan.args.iter().zip(&e.params).enumerate() {
                let (kind, dtype) = match a {
                    Arg::Ptr { dtype, .. } => (ParamKind::Ptr, *dtype),
                    Arg::I32 { .. } => (ParamKind::Scalar, DType::I32),
                    Arg::I64 { .. } => (ParamKind::Scalar, DType::I64),
                    Arg::F32 { .. } => (ParamKind::Scalar, DType::Fp32),
                    Arg::Scratch => (ParamKind::Scratch, DType::U8),
                };
                if !fits(kind, dtype, p) {
                    why.push(format!(
                        "argument {i} ({}, {}) is passed for {} {}",
                        plan.params.get(i).map_or("?", |s| s.as_str()),
                        a.describe(),
                        p.name,
                        describe(p)
                    ));
                }
            }
            let n = plan.args.len();
            if n < 2 || plan.args[n - 2..] != [Arg::Scratch, Arg::Scratch] {
                why.push("the plan's last two arguments are not the scratch pointers".into());
            }
            if e.reqntid.is_some_and(|r| r != plan.block) {
                why.push(format!(
                    "block {:?} but .reqntid {:?}",
                    plan.block,
                    e.reqntid.unwrap()
                ));
            }
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(TritonError::Abi {
            name: plan.name.clone(),
            target: plan.target,
            why: why.join("; "),
        })
    }
}

/// ELF `e_machine` of NVIDIA cubins (EM_CUDA).
pub const EM_CUDA: u16 = 190;

/// Checks a cubin's ELF header and symbols against its manifest entry: a 64-bit little-endian
/// ELF for `EM_CUDA` whose SM (bits 8–15 of `e_flags`: 90, 80) is the entry's target's, holding
/// the entry's kernel (a `.text.<entry>` section). What a cubin copied to the wrong target
/// directory, or one of another kernel, fails on; the driver would refuse it only on a GPU.
///
/// Errors: [`TritonError::Abi`] naming what differs.
pub fn check_cubin(entry: &KernelEntry, cubin: &[u8]) -> Result<()> {
    let mut why = Vec::new();
    if cubin.len() < 64 || &cubin[..4] != b"\x7fELF" || cubin[4] != 2 || cubin[5] != 1 {
        why.push("not a 64-bit little-endian ELF file".to_string());
    } else {
        let machine = u16::from_le_bytes([cubin[18], cubin[19]]);
        let flags = u32::from_le_bytes([cubin[48], cubin[49], cubin[50], cubin[51]]);
        let sm = (flags >> 8) & 0xff;
        let want = match entry.target {
            Target::Sm90a => 90,
            Target::Sm80 => 80,
        };
        if machine != EM_CUDA {
            why.push(format!("ELF machine {machine}, not EM_CUDA ({EM_CUDA})"));
        }
        if sm != want {
            why.push(format!(
                "compiled for sm_{sm}, the entry's target is {}",
                entry.target
            ));
        }
        let text = format!(".text.{}", entry.entry);
        if !cubin.windows(text.len()).any(|w| w == text.as_bytes()) {
            why.push(format!("no section {text}"));
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(TritonError::Abi {
            name: entry.name.clone(),
            target: entry.target,
            why: format!("cubin {}: {}", entry.cubin, why.join("; ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::triton::manifest::Manifest;
    use std::path::Path;

    const SAMPLE: &str = "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 9.0\n\
        .target sm_90a\n.address_size 64\n\n\t// .globl\tk /* a */\n.visible .entry k(\n\
        \t.param .u64 .ptr .global .align 1 k_param_0,\n\t.param .u32 k_param_1,\n\
        \t.param .f32 k_param_2,\n\t.param .u64 k_param_3,\n\
        \t.param .u64 .ptr .global .align 1 k_param_4,\n\
        \t.param .u64 .ptr .global .align 1 k_param_5\n)\n.reqntid 128, 1, 1\n.maxnreg 255\n{\n\
        \tld.param.b64 %rd1, [k_param_0];\n\tret;\n}\n";

    #[test]
    fn parses_the_forms_triton_emits() {
        let m = parse(SAMPLE).unwrap();
        assert_eq!(m.version, (9, 0));
        assert_eq!(m.target, "sm_90a");
        assert_eq!(m.entries.len(), 1);
        let e = &m.entries[0];
        assert_eq!(e.name, "k");
        assert_eq!(e.reqntid, Some([128, 1, 1]));
        let got: Vec<(PtxClass, u32, bool)> =
            e.params.iter().map(|p| (p.class, p.bits, p.ptr)).collect();
        use PtxClass::*;
        assert_eq!(
            got,
            vec![
                (Unsigned, 64, true),
                (Unsigned, 32, false),
                (Float, 32, false),
                (Unsigned, 64, false),
                (Unsigned, 64, true),
                (Unsigned, 64, true),
            ]
        );
        assert_eq!(e.params[3].name, "k_param_3");
        let e = parse(
            ".version 9.0\n.target sm_80\n.entry k(\n.param .align 8 .b8 k_param_0[16]\n)\n{}",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("array"), "{e}");
        assert!(parse(".target sm_80\n")
            .unwrap_err()
            .to_string()
            .contains(".version"));
    }

    fn fixture_dir() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/triton"))
    }

    #[test]
    fn fixture_entries_match_their_ptx() {
        let m = Manifest::parse(crate::triton::manifest::tests::FIXTURE).unwrap();
        for k in &m.kernels {
            let ptx = std::fs::read_to_string(fixture_dir().join(&k.ptx)).unwrap();
            check_abi(k, &ptx).unwrap();
        }
    }

    #[test]
    fn abi_mismatches_are_named() {
        let m = Manifest::parse(crate::triton::manifest::tests::FIXTURE).unwrap();
        let k = m
            .entry("rows_scale_f32_b64", crate::triton::Target::Sm90a)
            .unwrap();
        let ptx = std::fs::read_to_string(fixture_dir().join(&k.ptx)).unwrap();
        let check = |k: &KernelEntry, ptx: &str| check_abi(k, ptx).unwrap_err().to_string();
        // Two parameters swapped in the manifest (a pointer and a scalar).
        let mut bad = k.clone();
        bad.params.swap(1, 2);
        let e = check(&bad, &ptx);
        assert!(
            e.contains("parameter 1 (n_rows, Scalar i32) is .u64 .ptr"),
            "{e}"
        );
        assert!(e.contains("parameter 2 (y_ptr, Ptr fp32) is .u32"), "{e}");
        // An f32 scalar declared i32: same width, other class.
        let mut bad = k.clone();
        bad.params[6].dtype = DType::I32;
        assert!(check(&bad, &ptx).contains("parameter 6 (alpha, Scalar i32) is .f32"));
        // A parameter missing (e.g. the scratch pointers of an older Triton).
        let mut bad = k.clone();
        bad.params.pop();
        let e = check(&bad, &ptx);
        assert!(e.contains("9 PTX parameters, the manifest lists 8"), "{e}");
        assert!(e.contains("not the scratch pointers"), "{e}");
        let mut bad = k.clone();
        bad.entry = "other_kernel".into();
        assert!(check(&bad, &ptx).contains("no .entry other_kernel"));
        let mut bad = k.clone();
        bad.threads = 128;
        assert!(check(&bad, &ptx).contains(".reqntid Some([64, 1, 1])"));
        let mut bad = k.clone();
        bad.target = crate::triton::Target::Sm80;
        assert!(check(&bad, &ptx).contains(".target sm_90a but the manifest says sm80"));
        let newer = ptx.replace(".version 9.0", ".version 9.4");
        let e = check(k, &newer);
        assert!(e.contains(".version 9.4 but the manifest says 9.0"), "{e}");
        assert!(e.contains("newer than 9.0"), "{e}");
        assert!(e.contains("rows_scale_f32_b64 (sm90a)"), "{e}");
    }

    /// A minimal cubin-like image: the ELF header fields check_cubin reads, and a section name.
    fn fake_cubin(machine: u16, sm: u32, entry: &str) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[48..52].copy_from_slice(&(0x0600_0004 | (sm << 8)).to_le_bytes());
        b.extend_from_slice(format!("\0.text.{entry}\0").as_bytes());
        b
    }

    #[test]
    fn cubin_header_and_kernel() {
        let m = Manifest::parse(crate::triton::manifest::tests::FIXTURE).unwrap();
        let k = m.entry("rows_scale_f32_b64", Target::Sm90a).unwrap();
        check_cubin(k, &fake_cubin(EM_CUDA, 90, "rows_scale_kernel")).unwrap();
        let e = check_cubin(k, &fake_cubin(EM_CUDA, 80, "rows_scale_kernel")).unwrap_err();
        assert!(
            e.to_string()
                .contains("compiled for sm_80, the entry's target is sm90a"),
            "{e}"
        );
        let e = check_cubin(k, &fake_cubin(62, 90, "other_kernel"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ELF machine 62") && e.contains("no section .text.rows_scale_kernel"),
            "{e}"
        );
        let e = check_cubin(k, b"not an elf").unwrap_err().to_string();
        assert!(e.contains("not a 64-bit little-endian ELF"), "{e}");
    }
}
