//! Launch records of the real kernel families, in two sets:
//!
//! - [`record_small`]: for each family in the manifest, plans built by [`super::families`] at
//!   awkward shapes (partial blocks, GQA 7, out-of-order positions, offsets), with inputs from a
//!   fixed seed and the expected outputs computed here in f64 from the same (rounded) inputs, or
//!   by this crate's own CPU op where one exists (AdamW's passes). The crate's tests write them
//!   for `kernels/replay.py` (Triton's interpreter); `rlvr kernels record --shape small` writes
//!   the same records for `kernels/replay_gpu.py` (the committed cubins on a GPU).
//! - [`record_bench`]: every distinct launch of one training step at a benchmark shape
//!   ([`BenchShape`], e.g. Qwen2.5-0.5B at 16 × 512 tokens in bf16), random inputs, no
//!   expected outputs, each with its [`Timing`] (op group and launches per step), for
//!   `kernels/replay_gpu.py --time`.
//!
//! Why f64 loops here rather than rlvr-model's ops: rlvr-kernels is layer 0 and cannot depend
//! on rlvr-model; the formulas are short, and each follows the kernel module's docstring
//! (itself checked against rlvr's CPU ops by the kernel tests). A wrong grid, stride or
//! argument order gives a wrong or missing output, which any correct oracle catches.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::families::{
    adamw, aligned_name, attention, decode, logprob_head, rmsnorm, rotary, swiglu,
};
use super::manifest::{DType, KernelEntry, Manifest, Target};
use super::plan::LaunchPlan;
use super::record::{HostBuffer, Recorder, Timing, Tolerance};
use super::{Result, TritonError};

/// Deterministic inputs in [-1, 1): a 64-bit LCG (Knuth's MMIX constants), seeded.
pub fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

type Bufs = BTreeMap<String, HostBuffer>;
type Expected = BTreeMap<String, (HostBuffer, Tolerance)>;

fn f32s(shape: &[usize], v: &[f64]) -> HostBuffer {
    HostBuffer::f32(shape, &v.iter().map(|x| *x as f32).collect::<Vec<_>>())
}

/// Values rounded to `dtype` (f32 or bf16), as the host buffer and as f64.
fn input(dtype: DType, shape: &[usize], seed: u64, scale: f32) -> (HostBuffer, Vec<f64>) {
    let n = shape.iter().product();
    let v: Vec<f32> = uniform(seed, n).iter().map(|x| x * scale).collect();
    let b = match dtype {
        DType::Bf16 => HostBuffer::bf16(shape, &v),
        _ => HostBuffer::f32(shape, &v),
    };
    let f = b.to_f32().unwrap().iter().map(|x| *x as f64).collect();
    (b, f)
}

fn out(dtype: DType, shape: &[usize], v: &[f64]) -> HostBuffer {
    let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    match dtype {
        DType::Bf16 => HostBuffer::bf16(shape, &v),
        _ => HostBuffer::f32(shape, &v),
    }
}

fn tol(dtype: DType) -> Tolerance {
    if dtype == DType::Bf16 {
        Tolerance::BF16
    } else {
        Tolerance::F32
    }
}

/// A normwise bound: f32 as [`Tolerance::F32`]; bf16 `2⁻⁷·max|want| + 2⁻⁷·|want|`, for outputs
/// whose terms cancel or that were computed from bf16-rounded intermediates (a few bf16
/// roundings relative to the output's scale, as the kernel tests bound them).
fn tol_norm(dtype: DType, want: &[f64]) -> Tolerance {
    if dtype == DType::Bf16 {
        let scale = want.iter().fold(0.0f64, |a, b| a.max(b.abs()));
        Tolerance {
            atol: scale / 128.0 + 1e-5,
            rtol: 1.0 / 128.0,
        }
    } else {
        Tolerance::F32
    }
}

struct Rec<'a> {
    rec: &'a Recorder,
    m: &'a Manifest,
    target: Target,
    out: Vec<PathBuf>,
    /// Recording the aligned twins (`_a16`): [`Rec::entry`] gives a variant's twin where the
    /// manifest has one, the labels get the suffix, and the shapes are multiples of 16.
    aligned: bool,
    /// The first write that failed (later writes are skipped).
    err: Option<TritonError>,
    /// Whether to write the expected outputs.
    expected: bool,
}

impl<'a> Rec<'a> {
    fn entry(&self, name: &str) -> &'a KernelEntry {
        if self.aligned {
            if let Ok(k) = self.m.entry(&aligned_name(name), self.target) {
                return k;
            }
        }
        (self.m.entry(name, self.target))
            .unwrap_or_else(|e| panic!("the plan builders' variant names drifted: {e}"))
    }

    /// `unaligned` while recording the fallbacks, `aligned` while recording the twins.
    fn len(&self, unaligned: usize, aligned: usize) -> usize {
        if self.aligned {
            aligned
        } else {
            unaligned
        }
    }

    fn write(&mut self, label: &str, k: &KernelEntry, plan: &LaunchPlan, b: Bufs, e: Expected) {
        if self.err.is_some() {
            return;
        }
        if self.aligned && !k.is_aligned() {
            return; // a kernel without a twin: recorded with the fallbacks already
        }
        let label = if self.aligned {
            aligned_name(label)
        } else {
            label.to_string()
        };
        let e = if self.expected { e } else { Expected::new() };
        match self.rec.record(&label, k, plan, &b, &e) {
            Ok(d) => self.out.push(d),
            Err(e) => self.err = Some(e),
        }
    }
}

fn has(m: &Manifest, family: &str) -> bool {
    m.kernels.iter().any(|k| k.family == family)
}

/// The small-shape records of every family of `m` for `target`, with the expected outputs
/// unless `expected` is false; returns the record directories (labels: the kernel and dtype,
/// e.g. `rmsnorm_add_fwd_bf16_h1024`).
///
/// Errors: the first record that could not be written ([`TritonError::Record`]). Panics when
/// the manifest lacks a variant the plan builders name (a manifest out of step with this crate).
pub fn record_small(
    rec: &Recorder,
    m: &Manifest,
    target: Target,
    expected: bool,
) -> Result<Vec<PathBuf>> {
    let mut r = Rec {
        rec,
        m,
        target,
        out: Vec::new(),
        aligned: false,
        err: None,
        expected,
    };
    // The fallbacks at awkward shapes, then the aligned twins (where the manifest has any) at
    // shapes whose lengths are multiples of 16.
    let twins = m.kernels.iter().any(|k| k.is_aligned());
    for aligned in [false, true] {
        if aligned && !twins {
            break;
        }
        r.aligned = aligned;
        if has(m, "rmsnorm") {
            rmsnorm_records(&mut r);
        }
        if has(m, "swiglu") {
            swiglu_records(&mut r);
        }
        if has(m, "rotary") {
            rotary_records(&mut r);
        }
        if has(m, "adamw") {
            adamw_records(&mut r);
        }
        if has(m, "logprob_head") {
            logprob_records(&mut r);
        }
        if has(m, "attention") {
            attention_records(&mut r);
        }
        if has(m, "decode") {
            decode_records(&mut r);
        }
    }
    match r.err {
        Some(e) => Err(e),
        None => Ok(r.out),
    }
}

/// Columns per RMSNorm block size (`rmsnorm::BLOCKS`): each a partial block, so every
/// variant is recorded; the smallest also records the dw kernel.
const RMSNORM_COLS: [usize; 5] = [100, 896, 1500, 3584, 5120];
/// The aligned twins' widths: multiples of 16 in the classes that have twins (1024 to 8192).
const RMSNORM_COLS_ALIGNED: [usize; 4] = [896, 1504, 3584, 5120];

fn rmsnorm_records(r: &mut Rec) {
    // The aligned twins' widths are multiples of 16 in the same block classes (h128 has no twin).
    let widths = if r.aligned {
        &RMSNORM_COLS_ALIGNED[..]
    } else {
        &RMSNORM_COLS[..]
    };
    for &cols in widths {
        rmsnorm_records_of(r, cols);
    }
}

fn rmsnorm_records_of(r: &mut Rec, cols: usize) {
    let rows = 5usize;
    let hb = *(rmsnorm::BLOCKS.iter().find(|b| cols <= **b)).expect("a recorded width has a block");
    let s = rmsnorm::RmsNorm {
        rows,
        cols,
        eps: 1e-6,
        rows_per_prog: 2,
    };
    let parts = rows.div_ceil(s.rows_per_prog);
    for dt in [DType::Fp32, DType::Bf16] {
        let dn = dt.name();
        let (x, xf) = input(dt, &[rows, cols], 11, 2.0);
        let (res, rf) = input(dt, &[rows, cols], 12, 1.0);
        let (w, wf) = input(dt, &[cols], 13, 1.5);
        let rc = [rows, cols];
        // Forward, with and without the residual add.
        for add in [false, true] {
            let kernel = if add { "add_fwd" } else { "fwd" };
            let k = r.entry(&rmsnorm::variant(kernel, dt, cols).unwrap());
            let plan = rmsnorm::plan(k, &s).unwrap();
            let mut h = xf.clone();
            if add {
                let hb = out(
                    dt,
                    &rc,
                    &(0..rows * cols).map(|i| xf[i] + rf[i]).collect::<Vec<_>>(),
                );
                h = hb.to_f32().unwrap().iter().map(|v| *v as f64).collect();
            }
            let (mut y, mut rstd) = (vec![0.0; rows * cols], vec![0.0; rows]);
            for i in 0..rows {
                let row = &h[i * cols..(i + 1) * cols];
                let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
                rstd[i] = 1.0 / (ms + s.eps as f64).sqrt();
                for c in 0..cols {
                    y[i * cols + c] = row[c] * rstd[i] * wf[c];
                }
            }
            let mut b = Bufs::from([
                ("x".into(), x.clone()),
                ("w".into(), w.clone()),
                ("y".into(), HostBuffer::zeros(dt, &rc)),
                ("rstd".into(), HostBuffer::zeros(DType::Fp32, &[rows])),
            ]);
            let mut e = Expected::from([
                ("y".into(), (out(dt, &rc, &y), tol(dt))),
                ("rstd".into(), (f32s(&[rows], &rstd), Tolerance::F32)),
            ]);
            if add {
                b.insert("residual".into(), res.clone());
                b.insert("h_out".into(), HostBuffer::zeros(dt, &rc));
                e.insert("h_out".into(), (out(dt, &rc, &h), tol(dt)));
            }
            r.write(&format!("rmsnorm_{kernel}_{dn}_h{hb}"), k, &plan, b, e);
        }
        // Backward. bf16: dx's terms cancel and the kernel multiplies by the bf16-rounded
        // normalised input, so its bound is normwise (see `tol_norm`).
        // Backward from h (= x here), its rstd, dy and (add variant) dres.
        let (dy, dyf) = input(dt, &rc, 14, 1.0);
        let (dres, dresf) = input(dt, &rc, 15, 0.5);
        let rstd: Vec<f64> = (0..rows)
            .map(|i| {
                let ms = xf[i * cols..(i + 1) * cols]
                    .iter()
                    .map(|v| v * v)
                    .sum::<f64>()
                    / cols as f64;
                1.0 / (ms + s.eps as f64).sqrt()
            })
            .collect();
        let rstd_buf = f32s(&[rows], &rstd);
        let rstd32: Vec<f64> = rstd_buf
            .to_f32()
            .unwrap()
            .iter()
            .map(|v| *v as f64)
            .collect();
        let mut dw_part = vec![0.0; parts * cols];
        let mut dx = vec![0.0; rows * cols];
        for i in 0..rows {
            let rr = rstd32[i];
            let n: Vec<f64> = (0..cols).map(|c| xf[i * cols + c] * rr).collect();
            let dn: Vec<f64> = (0..cols).map(|c| dyf[i * cols + c] * wf[c]).collect();
            let mean = (0..cols).map(|c| dn[c] * n[c]).sum::<f64>() / cols as f64;
            for c in 0..cols {
                dx[i * cols + c] = rr * (dn[c] - n[c] * mean);
                dw_part[(i / s.rows_per_prog) * cols + c] += dyf[i * cols + c] * n[c];
            }
        }
        for add in [false, true] {
            let kernel = if add { "add_bwd" } else { "bwd" };
            let k = r.entry(&rmsnorm::variant(kernel, dt, cols).unwrap());
            let plan = rmsnorm::plan(k, &s).unwrap();
            let dxa: Vec<f64> = (0..rows * cols)
                .map(|i| dx[i] + if add { dresf[i] } else { 0.0 })
                .collect();
            let mut b = Bufs::from([
                ("dy".into(), dy.clone()),
                ("h".into(), x.clone()),
                ("w".into(), w.clone()),
                ("rstd".into(), rstd_buf.clone()),
                ("dx".into(), HostBuffer::zeros(dt, &rc)),
                (
                    "dw_part".into(),
                    HostBuffer::zeros(DType::Fp32, &[parts, cols]),
                ),
            ]);
            if add {
                b.insert("dres".into(), dres.clone());
            }
            let e = Expected::from([
                ("dx".into(), (out(dt, &rc, &dxa), tol_norm(dt, &dxa))),
                (
                    "dw_part".into(),
                    (f32s(&[parts, cols], &dw_part), tol_norm(dt, &dw_part)),
                ),
            ]);
            r.write(&format!("rmsnorm_{kernel}_{dn}_h{hb}"), k, &plan, b, e);
        }
        if cols != RMSNORM_COLS[0] {
            continue;
        }
        // The fixed-order sum of the partials, over more columns than one block.
        let wc = r.len(300, 304);
        let wide = rmsnorm::RmsNorm { cols: wc, ..s };
        let k = r.entry(&rmsnorm::variant("dw", dt, wc).unwrap());
        let plan = rmsnorm::plan(k, &wide).unwrap();
        let (p, pf) = input(DType::Fp32, &[parts, wc], 16, 1.0);
        let dw: Vec<f64> = (0..wc)
            .map(|c| (0..parts).map(|q| pf[q * wc + c]).sum())
            .collect();
        let b = Bufs::from([
            ("dw_part".into(), p),
            ("dw".into(), HostBuffer::zeros(dt, &[wc])),
        ]);
        let e = Expected::from([("dw".into(), (out(dt, &[wc], &dw), tol(dt)))]);
        r.write(&format!("rmsnorm_dw_{dn}"), k, &plan, b, e);
    }
}

fn silu_parts(g: f64) -> (f64, f64) {
    let sig = 1.0 / (1.0 + (-g).exp());
    (g * sig, sig)
}

fn swiglu_records(r: &mut Rec) {
    for dt in [DType::Fp32, DType::Bf16] {
        swiglu_records_of(r, dt);
    }
}

fn swiglu_records_of(r: &mut Rec, dt: DType) {
    let dn = dt.name();
    let k = r.entry(&swiglu::variant("fwd", dt));
    let block = k.constexpr_int("BLOCK").unwrap() as usize;
    let s = swiglu::Swiglu {
        rows: 3,
        cols: block + r.len(37, 48),
    };
    let sh = [s.rows, s.cols];
    let n = s.rows * s.cols;
    let (g, gf) = input(dt, &sh, 21, 4.0);
    let (u, uf) = input(dt, &sh, 22, 2.0);
    let (da, daf) = input(dt, &sh, 23, 1.0);
    let a: Vec<f64> = (0..n).map(|i| silu_parts(gf[i]).0 * uf[i]).collect();
    let plan = swiglu::plan(k, &s).unwrap();
    let b = Bufs::from([
        ("g".into(), g.clone()),
        ("u".into(), u.clone()),
        ("a".into(), HostBuffer::zeros(dt, &sh)),
    ]);
    let e = Expected::from([("a".into(), (out(dt, &sh, &a), tol_norm(dt, &a)))]);
    r.write(&format!("swiglu_fwd_{dn}"), k, &plan, b, e);
    let k = r.entry(&swiglu::variant("bwd", dt));
    let plan = swiglu::plan(k, &s).unwrap();
    let (mut dg, mut du) = (vec![0.0; n], vec![0.0; n]);
    for i in 0..n {
        let (silu, sig) = silu_parts(gf[i]);
        du[i] = daf[i] * silu;
        dg[i] = daf[i] * uf[i] * sig * (1.0 + gf[i] * (1.0 - sig));
    }
    let b = Bufs::from([
        ("g".into(), g),
        ("u".into(), u),
        ("da".into(), da),
        ("dg".into(), HostBuffer::zeros(dt, &sh)),
        ("du".into(), HostBuffer::zeros(dt, &sh)),
    ]);
    let e = Expected::from([
        ("dg".into(), (out(dt, &sh, &dg), tol_norm(dt, &dg))),
        ("du".into(), (out(dt, &sh, &du), tol_norm(dt, &du))),
    ]);
    r.write(&format!("swiglu_bwd_{dn}"), k, &plan, b, e);
}

fn rotary_records(r: &mut Rec) {
    for dt in [DType::Fp32, DType::Bf16] {
        for d in [64, 128] {
            rotary_records_of(r, dt, d);
        }
    }
}

fn rotary_records_of(r: &mut Rec, dt: DType, d: usize) {
    let (tokens, hq, hk, max_pos) = (5usize, 7usize, 1usize, 12usize);
    let half = d / 2;
    let s = rotary::Rotary {
        tokens,
        q_heads: hq,
        kv_heads: hk,
        head_dim: d,
    };
    // rlvr's tables: angle pos·θ^(−2j/d), the half repeated.
    let (cos_b, sin_b) = rope_tables(max_pos, d);
    let cos32: Vec<f64> = cos_b.to_f32().unwrap().iter().map(|v| *v as f64).collect();
    let sin32: Vec<f64> = sin_b.to_f32().unwrap().iter().map(|v| *v as f64).collect();
    let pos = [7i32, 3, 3, 11, 0]; // repeated and out of order, as in the shared-prompt layout
    for (kernel, names, transpose) in [
        ("fwd", ["q", "k", "q_out", "k_out"], false),
        ("bwd", ["dq", "dk", "dq_out", "dk_out"], true),
    ] {
        let k = r.entry(&rotary::variant(kernel, dt, d));
        let plan = rotary::plan(k, &s).unwrap();
        let mut b = Bufs::from([
            ("cos".into(), cos_b.clone()),
            ("sin".into(), sin_b.clone()),
            ("pos".into(), HostBuffer::i32(&[tokens], &pos)),
        ]);
        let mut e = Expected::new();
        for (i, heads) in [(0usize, hq), (1, hk)] {
            let sh = [tokens, heads, d];
            let (x, xf) = input(dt, &sh, 31 + i as u64, 1.0);
            let mut y = vec![0.0; xf.len()];
            for (t, p) in pos.iter().enumerate() {
                let row = *p as usize * d;
                for h in 0..heads {
                    let o = (t * heads + h) * d;
                    for j in 0..half {
                        let (x1, x2) = (xf[o + j], xf[o + j + half]);
                        let (c1, c2) = (cos32[row + j], cos32[row + j + half]);
                        let (s1, s2) = (sin32[row + j], sin32[row + j + half]);
                        let (y1, y2) = if transpose {
                            (x1 * c1 + x2 * s2, x2 * c2 - x1 * s1)
                        } else {
                            (x1 * c1 - x2 * s1, x2 * c2 + x1 * s2)
                        };
                        y[o + j] = y1;
                        y[o + j + half] = y2;
                    }
                }
            }
            b.insert(names[i].into(), x);
            b.insert(names[i + 2].into(), HostBuffer::zeros(dt, &sh));
            e.insert(names[i + 2].into(), (out(dt, &sh, &y), tol_norm(dt, &y)));
        }
        r.write(
            &format!("rotary_{kernel}_{}_d{d}", dt.name()),
            k,
            &plan,
            b,
            e,
        );
    }
}

fn decode_records(r: &mut Rec) {
    for dt in [DType::Fp32, DType::Bf16] {
        for d in [64, 128] {
            decode_rope_kv_record(r, dt, d);
            decode_attn_records(r, dt, d);
        }
    }
}

/// rlvr's rotary tables (`Rotary::table`'s angles, θ = 10000) for positions `0..max_pos`, f32.
fn rope_tables(max_pos: usize, d: usize) -> (HostBuffer, HostBuffer) {
    let half = d / 2;
    let mut cos = vec![0.0; max_pos * d];
    let mut sin = vec![0.0; max_pos * d];
    for p in 0..max_pos {
        for j in 0..half {
            let a = p as f64 * 10000f64.powf(-2.0 * j as f64 / d as f64);
            for c in [j, j + half] {
                cos[p * d + c] = a.cos();
                sin[p * d + c] = a.sin();
            }
        }
    }
    (f32s(&[max_pos, d], &cos), f32s(&[max_pos, d], &sin))
}

/// `decode_rope_kv`: 3 rows at uneven positions and cache columns; the fallbacks with separate
/// q/k/v buffers, the aligned twins with a fused QKV buffer (both layouts replayed). The caches
/// start random: every column but the written one must come back unchanged.
fn decode_rope_kv_record(r: &mut Rec, dt: DType, d: usize) {
    let (rows, hq, hk, cap, max_pos) = (3usize, 14usize, 2usize, 10usize, 40usize);
    let half = d / 2;
    let s = decode::Decode {
        rows,
        q_heads: hq,
        kv_heads: hk,
        head_dim: d,
        capacity: cap,
        fused_qkv: r.aligned,
        softmax_scale: 1.0,
    };
    let k = r.entry(&decode::variant("rope_kv", dt, d));
    let plan = decode::plan(k, &s).unwrap();
    let (cos_b, sin_b) = rope_tables(max_pos, d);
    let table = |b: &HostBuffer| -> Vec<f64> {
        let v = b.to_f32().unwrap();
        // bf16 variants round the tables to the dtype first (as the CPU op casts them)
        let v = if dt == DType::Bf16 {
            HostBuffer::bf16(&[v.len()], &v).to_f32().unwrap()
        } else {
            v
        };
        v.iter().map(|x| *x as f64).collect()
    };
    let (cf, sf) = (table(&cos_b), table(&sin_b));
    let pos = [39i32, 0, 17];
    let cols = [9i32, 0, 4];
    let rot = |x: &[f64], heads: usize| -> Vec<f64> {
        let mut y = vec![0.0; x.len()];
        for (t, p) in pos.iter().enumerate() {
            let row = *p as usize * d;
            for h in 0..heads {
                let o = (t * heads + h) * d;
                for j in 0..half {
                    let (x1, x2) = (x[o + j], x[o + j + half]);
                    y[o + j] = x1 * cf[row + j] - x2 * sf[row + j];
                    y[o + j + half] = x2 * cf[row + j + half] + x1 * sf[row + j + half];
                }
            }
        }
        y
    };
    let (q, qf) = input(dt, &[rows, hq, d], 81, 1.0);
    let (kb, kf) = input(dt, &[rows, hk, d], 82, 1.0);
    let (vb, vf) = input(dt, &[rows, hk, d], 83, 1.0);
    let csh = [rows, hk, cap, d];
    let (kc, mut kcf) = input(dt, &csh, 84, 1.0);
    let (vc, mut vcf) = input(dt, &csh, 85, 1.0);
    let (qr, kr) = (rot(&qf, hq), rot(&kf, hk));
    for (t, c) in cols.iter().enumerate() {
        for h in 0..hk {
            let at = ((t * hk + h) * cap + *c as usize) * d;
            let from = (t * hk + h) * d;
            kcf[at..at + d].copy_from_slice(&kr[from..from + d]);
            vcf[at..at + d].copy_from_slice(&vf[from..from + d]);
        }
    }
    let mut b = Bufs::from([
        ("q_out".into(), HostBuffer::zeros(dt, &[rows, hq, d])),
        ("k_cache".into(), kc),
        ("v_cache".into(), vc),
        ("cos".into(), cos_b),
        ("sin".into(), sin_b),
        ("pos".into(), HostBuffer::i32(&[rows], &pos)),
        ("cols".into(), HostBuffer::i32(&[rows], &cols)),
    ]);
    if s.fused_qkv {
        let row = (hq + 2 * hk) * d;
        let mut all = Vec::with_capacity(rows * row);
        for t in 0..rows {
            all.extend_from_slice(&qf[t * hq * d..(t + 1) * hq * d]);
            all.extend_from_slice(&kf[t * hk * d..(t + 1) * hk * d]);
            all.extend_from_slice(&vf[t * hk * d..(t + 1) * hk * d]);
        }
        b.insert("qkv".into(), out(dt, &[rows, row], &all));
    } else {
        b.insert("q".into(), q);
        b.insert("k".into(), kb);
        b.insert("v".into(), vb);
    }
    let e = Expected::from([
        (
            "q_out".into(),
            (out(dt, &[rows, hq, d], &qr), tol_norm(dt, &qr)),
        ),
        ("k_cache".into(), (out(dt, &csh, &kcf), tol_norm(dt, &kcf))),
        // the value is copied: exact
        (
            "v_cache".into(),
            (
                out(dt, &csh, &vcf),
                Tolerance {
                    atol: 0.0,
                    rtol: 0.0,
                },
            ),
        ),
    ]);
    r.write(
        &format!("decode_rope_kv_{}_d{d}", dt.name()),
        k,
        &plan,
        b,
        e,
    );
}

/// `decode_attn` and `decode_attn_combine`: 3 rows of uneven lengths (300: two splits, 1, 257:
/// two splits, the second of one key), GQA 7, the first row's first 5 columns masked by the
/// bias; the partials' expected values are the float64 attention over each split (slots past a
/// row's splits stay 0), and the combine's input is those partials.
fn decode_attn_records(r: &mut Rec, dt: DType, d: usize) {
    let (rows, hq, hk, cap) = (3usize, 14usize, 2usize, 300usize);
    let rep = hq / hk;
    let s = decode::Decode {
        rows,
        q_heads: hq,
        kv_heads: hk,
        head_dim: d,
        capacity: cap,
        fused_qkv: false,
        softmax_scale: 1.0 / (d as f32).sqrt(),
    };
    let ka = r.entry(&decode::variant("attn", dt, d));
    let kc = r.entry(&decode::variant("attn_combine", dt, d));
    let rule = decode::SplitRule::of(ka).unwrap();
    let ns = s.n_splits(ka).unwrap();
    let lens = [300i32, 1, 257];
    let mut bias = vec![0.0f64; rows * cap];
    for x in &mut bias[..5] {
        *x = -1e30;
    }
    let (q, qf) = input(dt, &[rows, hq, d], 91, 1.0);
    let csh = [rows, hk, cap, d];
    let (kcb, kf) = input(dt, &csh, 92, 1.0);
    let (vcb, vf) = input(dt, &csh, 93, 1.0);
    let scale = s.softmax_scale as f64;
    let mut o_part = vec![0.0f64; rows * hq * ns * d];
    let mut lse_part = vec![0.0f64; rows * hq * ns];
    let mut o = vec![0.0f64; rows * hq * d];
    for (b, len) in lens.iter().map(|l| *l as usize).enumerate() {
        let span = rule.split_len(len);
        for h in 0..hq {
            let qi = (b * hq + h) * d;
            let kv = |j: usize| ((b * hk + h / rep) * cap + j) * d;
            let sc: Vec<f64> = (0..len)
                .map(|j| {
                    let dot: f64 = (0..d).map(|x| qf[qi + x] * kf[kv(j) + x]).sum();
                    dot * scale + bias[b * cap + j]
                })
                .collect();
            let attend = |lo: usize, hi: usize| -> (Vec<f64>, f64) {
                let m = sc[lo..hi].iter().fold(f64::NEG_INFINITY, |a, x| a.max(*x));
                let z: f64 = sc[lo..hi].iter().map(|x| (x - m).exp()).sum();
                let out = (0..d)
                    .map(|x| {
                        (lo..hi)
                            .map(|j| (sc[j] - m).exp() / z * vf[kv(j) + x])
                            .sum()
                    })
                    .collect();
                (out, (m + z.ln()) * std::f64::consts::LOG2_E)
            };
            for sp in 0..rule.splits(len) {
                let (lo, hi) = (sp * span, ((sp + 1) * span).min(len));
                let (po, lse2) = attend(lo, hi);
                let row = (b * hq + h) * ns + sp;
                o_part[row * d..(row + 1) * d].copy_from_slice(&po);
                lse_part[row] = lse2;
            }
            let (full, _) = attend(0, len);
            o[qi..qi + d].copy_from_slice(&full);
        }
    }
    let (psh, lsh, osh) = ([rows, hq, ns, d], [rows, hq, ns], [rows, hq, d]);
    let bias_b = f32s(&[rows, cap], &bias);
    let lens_b = HostBuffer::i32(&[rows], &lens);
    let plan = decode::plan(ka, &s).unwrap();
    let b = Bufs::from([
        ("q_out".into(), q),
        ("k_cache".into(), kcb),
        ("v_cache".into(), vcb),
        ("bias".into(), bias_b),
        ("lens".into(), lens_b.clone()),
        ("o_part".into(), HostBuffer::zeros(DType::Fp32, &psh)),
        ("lse_part".into(), HostBuffer::zeros(DType::Fp32, &lsh)),
    ]);
    let e = Expected::from([
        (
            "o_part".into(),
            (f32s(&psh, &o_part), tol_norm(dt, &o_part)),
        ),
        (
            "lse_part".into(),
            (f32s(&lsh, &lse_part), tol_norm(dt, &lse_part)),
        ),
    ]);
    r.write(&format!("decode_attn_{}_d{d}", dt.name()), ka, &plan, b, e);
    let plan = decode::plan(kc, &s).unwrap();
    let b = Bufs::from([
        ("o_part".into(), f32s(&psh, &o_part)),
        ("lse_part".into(), f32s(&lsh, &lse_part)),
        ("lens".into(), lens_b),
        ("o".into(), HostBuffer::zeros(dt, &osh)),
    ]);
    let e = Expected::from([("o".into(), (out(dt, &osh, &o), tol(dt)))]);
    r.write(
        &format!("decode_attn_combine_{}_d{d}", dt.name()),
        kc,
        &plan,
        b,
        e,
    );
}

fn adamw_records(r: &mut Rec) {
    use candle_core::{Device, Tensor};
    let n = r.len(2500, 2512);
    let c = adamw::AdamwScalars::new(1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 0.8);
    for (name, gdt) in [
        ("adamw_f32", DType::Fp32),
        ("adamw_master_bf16", DType::Fp32),
        ("adamw_master_bf16_gbf16", DType::Bf16),
    ] {
        let k = r.entry(name);
        let plan = adamw::plan(k, &adamw::Adamw::Step { n, scalars: c }).unwrap();
        let (p, pf) = input(DType::Fp32, &[n], 41, 1.0);
        let (g, gf) = input(gdt, &[n], 42, 0.1);
        let (m, mf) = input(DType::Fp32, &[n], 43, 0.01);
        let (v0, _) = input(DType::Fp32, &[n], 44, 1.0);
        let vf: Vec<f32> = v0.to_f32().unwrap().iter().map(|x| x * x * 1e-4).collect();
        let v = HostBuffer::f32(&[n], &vf);
        // The CPU op: this crate's in-place AdamW passes on the scaled gradient.
        let t = |x: &[f64]| {
            let x: Vec<f32> = x.iter().map(|v| *v as f32).collect();
            Tensor::from_vec(x, n, &Device::Cpu).unwrap()
        };
        let gs: Vec<f64> = gf
            .iter()
            .map(|x| (*x as f32 * c.grad_scale) as f64)
            .collect();
        let (pt, gt, mt) = (t(&pf), t(&gs), t(&mf));
        let vt = Tensor::from_vec(vf.clone(), n, &Device::Cpu).unwrap();
        mt.inplace_op2(
            &gt,
            &crate::adamw::MomentUpdate {
                beta: c.beta1,
                square: false,
            },
        )
        .unwrap();
        vt.inplace_op2(
            &gt,
            &crate::adamw::MomentUpdate {
                beta: c.beta2,
                square: true,
            },
        )
        .unwrap();
        let upd = crate::adamw::ParamUpdate {
            decay: c.decay,
            lr: c.lr,
            inv_bc1: c.inv_bc1,
            inv_bc2: c.inv_bc2,
            eps: c.eps,
        };
        pt.inplace_op3(&mt, &vt, &upd).unwrap();
        let vec = |x: &Tensor| x.to_vec1::<f32>().unwrap();
        let mut b = Bufs::from([
            ("param".into(), p),
            ("grad".into(), g),
            ("exp_avg".into(), m),
            ("exp_avg_sq".into(), v),
        ]);
        let mut e = Expected::from([
            (
                "param".into(),
                (HostBuffer::f32(&[n], &vec(&pt)), Tolerance::F32),
            ),
            (
                "exp_avg".into(),
                (HostBuffer::f32(&[n], &vec(&mt)), Tolerance::F32),
            ),
            (
                "exp_avg_sq".into(),
                (HostBuffer::f32(&[n], &vec(&vt)), Tolerance::F32),
            ),
        ]);
        if k.params.iter().any(|p| p.name == "copy") {
            b.insert("copy".into(), HostBuffer::zeros(DType::Bf16, &[n]));
            e.insert(
                "copy".into(),
                (HostBuffer::bf16(&[n], &vec(&pt)), Tolerance::BF16),
            );
        }
        r.write(name, k, &plan, b, e);
    }
    // The sum of squares into slots 1.. of the partials (f32 and bf16 gradients), then their
    // total.
    for gdt in [DType::Fp32, DType::Bf16] {
        grad_sumsq_record(r, gdt);
    }
    let k = r.entry("grad_sumsq_total");
    let np = 2500;
    let plan = adamw::plan(k, &adamw::Adamw::Total { n_partials: np }).unwrap();
    let (p, pf) = input(DType::Fp32, &[np], 46, 3.0);
    let total: f64 = pf.iter().sum();
    let out = HostBuffer {
        dtype: DType::Fp64,
        shape: vec![1],
        bytes: total.to_le_bytes().to_vec(),
    };
    let b = Bufs::from([
        ("partials".into(), p),
        ("out".into(), HostBuffer::zeros(DType::Fp64, &[1])),
    ]);
    let e = Expected::from([("out".into(), (out, Tolerance::F32))]);
    r.write("grad_sumsq_total", k, &plan, b, e);
}

/// `grad_sumsq_{f32,bf16}` over 40 000 elements into slots 1.. of the partials.
fn grad_sumsq_record(r: &mut Rec, gdt: DType) {
    let name = format!(
        "grad_sumsq_{}",
        if gdt == DType::Bf16 { "bf16" } else { "f32" }
    );
    let k = r.entry(&name);
    let n = 40_000;
    let s = adamw::Adamw::SumSq {
        n,
        partials_offset: 1,
    };
    let plan = adamw::plan(k, &s).unwrap();
    let parts = adamw::partials_for(k, n).unwrap();
    let (g, gf) = input(gdt, &[n], 45, 1.0);
    let span = (k.constexpr_int("BLOCK").unwrap() * k.constexpr_int("ITERS").unwrap()) as usize;
    let mut want = vec![0.0; parts + 1];
    for (i, x) in gf.iter().enumerate() {
        want[1 + i / span] += x * x;
    }
    let b = Bufs::from([
        ("grad".into(), g),
        (
            "partials".into(),
            HostBuffer::zeros(DType::Fp32, &[parts + 1]),
        ),
    ]);
    let e = Expected::from([(
        "partials".into(),
        (f32s(&[parts + 1], &want), Tolerance::F32),
    )]);
    r.write(&name, k, &plan, b, e);
}

fn logprob_records(r: &mut Rec) {
    for dt in [DType::Fp32, DType::Bf16] {
        for cap in [None, Some(4.0)] {
            logprob_records_of(r, dt, cap);
        }
    }
}

/// The head's three kernels on logits of `dt` (bf16: widened when loaded, the gradient
/// rounded to nearest even when stored); with `cap` the final-logit softcap variants (a cap of
/// 4 against logits of up to ±8: saturated and linear parts both).
fn logprob_records_of(r: &mut Rec, dt: DType, cap: Option<f32>) {
    let dts = if dt == DType::Bf16 { "bf16" } else { "f32" };
    let sfx = match cap {
        Some(_) => format!("softcap_{dts}"),
        None => dts.to_string(),
    };
    // The scaled logit of a raw one, and ∂s/∂(z·inv_t) (1 without a cap), in f64.
    let capf = cap.map(|c| c as f64);
    let scaled = |z: f64, it: f64| match capf {
        Some(c) => c * it * (z / c).tanh(),
        None => z * it,
    };
    let dcap = |z: f64| match capf {
        Some(c) => 1.0 - (z / c).tanh().powi(2),
        None => 1.0,
    };
    let (rows, n_cols, stride, col0) = (3usize, r.len(1500, 1504), 1536usize, 3000usize);
    let inv_t = 1.0f32 / 0.7;
    let s = logprob_head::LogprobChunk {
        rows,
        n_cols,
        stride_z: stride,
        col0,
        first: false,
        inv_t,
        cap: cap.unwrap_or(0.0),
    };
    let (z, zf) = input(dt, &[rows, stride], 51, 8.0);
    let targets = [3007i32, 100, 4499]; // inside, outside (an earlier chunk), last column
                                        // A state as if an earlier chunk had been merged: M, S, D, s_y.
    let prior: [[f64; 4]; 3] = [
        [2.0, 40.0, -30.0, 1.5],
        [3.0, 55.0, -41.0, 2.5],
        [1.0, 30.0, -20.0, 0.5],
    ];
    let it = inv_t as f64;
    let mut state = vec![0.0; rows * 4];
    for i in 0..rows {
        let [m0, s0, d0, sy0] = prior[i];
        let sc: Vec<f64> = (0..n_cols)
            .map(|c| scaled(zf[i * stride + c], it))
            .collect();
        let m = sc.iter().fold(m0, |a, b| a.max(*b));
        let se = s0 * (m0 - m).exp() + sc.iter().map(|v| (v - m).exp()).sum::<f64>();
        // D = Σ e^{s−M}(s−M) over both parts, re-based to the new max.
        let dd = (m0 - m).exp() * (d0 + (m0 - m) * s0)
            + sc.iter().map(|v| (v - m).exp() * (v - m)).sum::<f64>();
        let y = targets[i] as usize;
        let sy = if (col0..col0 + n_cols).contains(&y) {
            sc[y - col0]
        } else {
            sy0
        };
        state[i * 4..i * 4 + 4].copy_from_slice(&[m, se, dd, sy]);
    }
    let prior_flat: Vec<f64> = prior.iter().flatten().copied().collect();
    let k = r.entry(&format!("logprob_fwd_{sfx}"));
    let plan = logprob_head::plan(k, &s).unwrap();
    let b = Bufs::from([
        ("z".into(), z.clone()),
        ("targets".into(), HostBuffer::i32(&[rows], &targets)),
        ("state".into(), f32s(&[rows, 4], &prior_flat)),
    ]);
    let e = Expected::from([("state".into(), (f32s(&[rows, 4], &state), Tolerance::F32))]);
    r.write(&format!("logprob_fwd_{sfx}"), k, &plan, b, e);
    // finish: out = (s_y − M − ln S, ln S − D/S) from the merged state.
    let sb = f32s(&[rows, 4], &state);
    let st: Vec<f64> = sb.to_f32().unwrap().iter().map(|v| *v as f64).collect();
    let outv: Vec<f64> = (0..rows)
        .flat_map(|i| {
            let (m, se, dd, sy) = (st[i * 4], st[i * 4 + 1], st[i * 4 + 2], st[i * 4 + 3]);
            [(sy - m) - se.ln(), se.ln() - dd / se]
        })
        .collect();
    let k = r.entry("logprob_finish");
    let plan = logprob_head::plan(k, &s).unwrap();
    let b = Bufs::from([
        ("state".into(), sb.clone()),
        ("out".into(), HostBuffer::zeros(DType::Fp32, &[rows, 2])),
    ]);
    let e = Expected::from([("out".into(), (f32s(&[rows, 2], &outv), Tolerance::F32))]);
    if dt == DType::Fp32 && cap.is_none() {
        r.write("logprob_finish", k, &plan, b, e); // f32 state only: once
    }
    // backward, in place on z: dz = inv_t·(g_ℓ(δ_jy − p_j) − g_H p_j (log p_j + H)).
    let ob = f32s(&[rows, 2], &outv);
    let o: Vec<f64> = ob.to_f32().unwrap().iter().map(|v| *v as f64).collect();
    let grad = [0.5, -0.25, 1.0, 0.0, -1.5, 2.0];
    let mut dz = zf.clone(); // columns past n_cols keep the logits
    for i in 0..rows {
        let (m, ln_s, h) = (st[i * 4], st[i * 4 + 1].ln(), o[i * 2 + 1]);
        let (gl, gh) = (grad[i * 2], grad[i * 2 + 1]);
        for c in 0..n_cols {
            let zc = zf[i * stride + c];
            let lp = scaled(zc, it) - m - ln_s;
            let p = lp.exp();
            let mut ds = -gl * p - gh * p * (lp + h);
            if c + col0 == targets[i] as usize {
                ds += gl;
            }
            dz[i * stride + c] = ds * dcap(zc) * it;
        }
    }
    let k = r.entry(&format!("logprob_bwd_{sfx}"));
    let plan = logprob_head::plan(k, &s).unwrap();
    let b = Bufs::from([
        ("z".into(), z),
        ("targets".into(), HostBuffer::i32(&[rows], &targets)),
        ("state".into(), sb),
        ("out".into(), ob),
        ("grad".into(), f32s(&[rows, 2], &grad)),
    ]);
    let e = Expected::from([("z".into(), (out(dt, &[rows, stride], &dz), tol(dt)))]);
    r.write(&format!("logprob_bwd_{sfx}"), k, &plan, b, e);
}

/// Attention (f32, head dim 64) on the shared-prompt example layout: the forward, then each
/// backward kernel from f32-rounded `lse`/`delta`. Output buffers start at a sentinel, which the
/// padding rows (never written) must keep. Also through a sliding window of 7 keys (labels
/// `_w7`; 37-row prompt: the completions' first 6 rows still see some of it, the rest not).
fn attention_records(r: &mut Rec) {
    for dt in [DType::Fp32, DType::Bf16] {
        for d in [64, 128] {
            attention_records_of(r, dt, d, 0);
        }
        attention_records_of(r, dt, 64, 7);
    }
}

/// One (dtype, head dim) of [`attention_records`]. bf16: P and dS are rounded to bf16 before
/// their matmuls, so the bounds are normwise ([`tol_norm`]); lse and delta stay f32.
fn attention_records_of(r: &mut Rec, dt: DType, d: usize, window: usize) {
    let sfx = format!("{}_d{d}", if dt == DType::Bf16 { "bf16" } else { "f32" });
    let label = |name: &str| match window {
        0 => name.to_string(),
        w => format!("{name}_w{w}"),
    };
    let l = attention::Layout {
        window,
        ..attention::example_layout(d)
    };
    let (n, hq, hk) = (l.n_tokens, l.q_heads, l.kv_heads);
    let rep = hq / hk;
    let scale = l.softmax_scale as f64;
    let (q, qf) = input(dt, &[n, hq, d], 61, 1.0);
    let (k, kf) = input(dt, &[n, hk, d], 62, 1.0);
    let (v, vf) = input(dt, &[n, hk, d], 63, 1.0);
    let (dob, dof) = input(dt, &[n, hq, d], 64, 1.0);
    const SENTINEL: f64 = 7.0;
    let qi = |t: usize, h: usize| (t * hq + h) * d;
    let ki = |t: usize, h: usize| (t * hk + h) * d;
    let dot = |a: &[f64], ia: usize, b: &[f64], ib: usize| {
        (0..d).map(|x| a[ia + x] * b[ib + x]).sum::<f64>()
    };
    // Every (query row, its key rows): prefix key j at position j, own row i at prefix_len + i;
    // a window keeps the keys at positions p with q − window < p.
    let mut queries: Vec<(usize, Vec<usize>)> = Vec::new();
    for s in &l.seqs {
        for i in 0..s.len {
            let qpos = s.prefix_len + i;
            let seen = |p: usize| window == 0 || qpos - p < window;
            let mut keys: Vec<usize> = (0..s.prefix_len)
                .filter(|&j| seen(j))
                .map(|j| s.prefix_start + j)
                .collect();
            keys.extend(
                (0..=i)
                    .filter(|&j| seen(s.prefix_len + j))
                    .map(|j| s.start + j),
            );
            queries.push((s.start + i, keys));
        }
    }
    let mut o = vec![SENTINEL; n * hq * d];
    let mut lse = vec![SENTINEL; hq * n];
    for (t, keys) in &queries {
        for h in 0..hq {
            let sc: Vec<f64> = keys
                .iter()
                .map(|j| scale * dot(&qf, qi(*t, h), &kf, ki(*j, h / rep)))
                .collect();
            let m = sc.iter().fold(f64::NEG_INFINITY, |a, b| a.max(*b));
            let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            lse[h * n + t] = m + z.ln();
            for x in 0..d {
                o[qi(*t, h) + x] = (keys.iter().zip(&sc))
                    .map(|(j, s)| (s - m).exp() / z * vf[ki(*j, h / rep) + x])
                    .sum();
            }
        }
    }
    let sent = |len: usize| f32s(&[len], &vec![SENTINEL; len]);
    // bf16 bounds relative to the written rows' scale (the padding rows keep the sentinel).
    let tn = |w: &[f64]| {
        let rows: Vec<f64> = w.iter().copied().filter(|x| *x != SENTINEL).collect();
        tol_norm(dt, &rows)
    };
    let shape_q = [n, hq, d];
    let k_fwd = r.entry(&format!("attn_fwd_{sfx}"));
    let (plan, desc) = attention::plan(k_fwd, &l).unwrap();
    let descs = |desc: BTreeMap<String, Vec<i32>>| -> Bufs {
        desc.into_iter()
            .map(|(name, v)| (name, HostBuffer::i32(&[v.len()], &v)))
            .collect()
    };
    let mut b = descs(desc);
    b.extend([
        ("q".into(), q.clone()),
        ("k".into(), k.clone()),
        ("v".into(), v.clone()),
        ("o".into(), out(dt, &shape_q, &vec![SENTINEL; n * hq * d])),
        ("lse".into(), sent(hq * n)),
    ]);
    let e = Expected::from([
        ("o".into(), (out(dt, &shape_q, &o), tn(&o))),
        ("lse".into(), (f32s(&[hq * n], &lse), Tolerance::F32)),
    ]);
    r.write(&label(&format!("attn_fwd_{sfx}")), k_fwd, &plan, b, e);
    // The backward's inputs: o and lse as the forward wrote them (f32), delta from them.
    let ob = out(dt, &shape_q, &o);
    let of: Vec<f64> = ob.to_f32().unwrap().iter().map(|x| *x as f64).collect();
    let lse_b = f32s(&[hq * n], &lse);
    let lsef: Vec<f64> = lse_b.to_f32().unwrap().iter().map(|x| *x as f64).collect();
    let mut delta = vec![SENTINEL; hq * n];
    for (t, _) in &queries {
        for h in 0..hq {
            delta[h * n + t] = dot(&dof, qi(*t, h), &of, qi(*t, h));
        }
    }
    let k_pre = r.entry(&format!("attn_bwd_pre_{sfx}"));
    let (plan, desc) = attention::plan(k_pre, &l).unwrap();
    let mut b = descs(desc);
    b.extend([
        ("o".into(), ob.clone()),
        ("do".into(), dob.clone()),
        ("delta".into(), sent(hq * n)),
    ]);
    let e = Expected::from([("delta".into(), (f32s(&[hq * n], &delta), Tolerance::F32))]);
    r.write(&label(&format!("attn_bwd_pre_{sfx}")), k_pre, &plan, b, e);
    let delta_b = f32s(&[hq * n], &delta);
    let deltaf: Vec<f64> = delta_b
        .to_f32()
        .unwrap()
        .iter()
        .map(|x| *x as f64)
        .collect();
    let mut dq = vec![SENTINEL; n * hq * d];
    let mut dk = vec![SENTINEL; n * hk * d];
    let mut dv = vec![SENTINEL; n * hk * d];
    for s in &l.seqs {
        for t in s.start..s.start + s.len {
            for h in 0..hk {
                dk[ki(t, h)..ki(t, h) + d].fill(0.0);
                dv[ki(t, h)..ki(t, h) + d].fill(0.0);
            }
        }
    }
    for (t, keys) in &queries {
        for h in 0..hq {
            let g = h / rep;
            dq[qi(*t, h)..qi(*t, h) + d].fill(0.0);
            for j in keys {
                let p = (scale * dot(&qf, qi(*t, h), &kf, ki(*j, g)) - lsef[h * n + t]).exp();
                let dp = dot(&dof, qi(*t, h), &vf, ki(*j, g));
                let ds = p * (dp - deltaf[h * n + t]);
                for x in 0..d {
                    dq[qi(*t, h) + x] += scale * ds * kf[ki(*j, g) + x];
                    dk[ki(*j, g) + x] += scale * ds * qf[qi(*t, h) + x];
                    dv[ki(*j, g) + x] += p * dof[qi(*t, h) + x];
                }
            }
        }
    }
    let shape_k = [n, hk, d];
    for (name, outs) in [
        (
            format!("attn_bwd_dkdv_{sfx}"),
            vec![("dk", &dk), ("dv", &dv)],
        ),
        (format!("attn_bwd_dq_{sfx}"), vec![("dq", &dq)]),
    ] {
        let kk = r.entry(&name);
        let (plan, desc) = attention::plan(kk, &l).unwrap();
        let mut b = descs(desc);
        b.extend([
            ("q".into(), q.clone()),
            ("k".into(), k.clone()),
            ("v".into(), v.clone()),
            ("do".into(), dob.clone()),
            ("lse".into(), lse_b.clone()),
            ("delta".into(), delta_b.clone()),
        ]);
        let mut e = Expected::new();
        for (o_name, want) in outs {
            let sh: &[usize] = if o_name == "dq" { &shape_q } else { &shape_k };
            b.insert(o_name.into(), out(dt, sh, &vec![SENTINEL; want.len()]));
            e.insert(o_name.into(), (out(dt, sh, want), tn(want)));
        }
        r.write(&label(&name), kk, &plan, b, e);
    }
}

// ---------------------------------------------------------------------------------------------
// The benchmark shape: one training step's launches, for timing.

/// A model and batch shape whose training step's kernel launches [`record_bench`] writes.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BenchShape {
    /// What it is called (`--shape`).
    pub name: String,
    /// Rows (sequences) per step.
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dim.
    pub head_dim: usize,
    /// MLP intermediate size.
    pub intermediate: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Whether the output head is the embedding (no separate lm_head parameters).
    pub tie_embeddings: bool,
    /// The activations' and weights' dtype (the AdamW masters are f32).
    pub dtype: DType,
    /// Logits per head chunk (`rlvr_model::chunked::CHUNK_ELEMS_GPU`, 32 Mi).
    pub head_chunk_elems: usize,
    /// Elements of the one tensor AdamW is timed on (its time is scaled to all parameters).
    pub adamw_sample: usize,
    /// RMSNorm's eps.
    pub rms_eps: f32,
}

/// Issue 44's per-step budgets at the Qwen2.5-0.5B benchmark shape on an H100/H200, in ms:
/// (group, budget, what the group holds).
pub const BUDGETS_MS: [(&str, f64, &str); 4] = [
    (
        "attention",
        10.0,
        "attention forward + backward (pre, dK/dV, dQ), every layer",
    ),
    (
        "head",
        25.0,
        "the log-prob head's chunk kernels (the logits and dX/dW GEMMs by cuBLAS are not timed here)",
    ),
    (
        "layer",
        15.0,
        "RMSNorm with the residual (x2 per layer and the final norm), rotary, SwiGLU; forward and backward",
    ),
    (
        "adamw",
        6.0,
        "AdamW over every parameter and the gradient norm's sums of squares",
    ),
];

impl BenchShape {
    /// Qwen2.5-0.5B (hidden 896, 24 layers, 14 query / 2 KV heads of 64, intermediate 4864,
    /// vocabulary 151936, tied embeddings) at 16 rows × 512 tokens in bf16: `bench/gpu.sh`'s
    /// training step.
    pub fn qwen2_5_0_5b() -> Self {
        BenchShape {
            name: "qwen2.5-0.5b".into(),
            rows: 16,
            seq_len: 512,
            hidden: 896,
            layers: 24,
            q_heads: 14,
            kv_heads: 2,
            head_dim: 64,
            intermediate: 4864,
            vocab: 151936,
            tie_embeddings: true,
            dtype: DType::Bf16,
            head_chunk_elems: 32 << 20,
            adamw_sample: 1 << 24,
            rms_eps: 1e-6,
        }
    }

    /// Tokens per step.
    pub fn tokens(&self) -> usize {
        self.rows * self.seq_len
    }

    /// Trainable parameters (Qwen2's: q/k/v with biases, o, gate/up/down, two norms per layer,
    /// the final norm, the embedding, and the lm head unless tied): 494 032 768 for
    /// [`BenchShape::qwen2_5_0_5b`].
    pub fn params(&self) -> usize {
        let (h, kv) = (self.hidden, self.kv_heads * self.head_dim);
        let q = self.q_heads * self.head_dim;
        let attn = h * q + q + 2 * (h * kv + kv) + q * h;
        let mlp = 3 * h * self.intermediate;
        let layer = attn + mlp + 2 * h;
        let embed = self.vocab * h;
        let head = if self.tie_embeddings { 0 } else { embed };
        embed + head + self.layers * layer + h
    }

    /// The head's vocabulary chunk width (as `rlvr_model::chunked::chunk_width`).
    pub fn head_chunk_width(&self) -> usize {
        (self.head_chunk_elems / self.tokens().max(1)).clamp(1, self.vocab.max(1))
    }
}

/// Random `dtype` values in `[-scale, scale)` (seeded; no expected outputs depend on them).
fn random(dtype: DType, shape: &[usize], seed: u64, scale: f32) -> HostBuffer {
    input(dtype, shape, seed, scale).0
}

/// `build` for `name`'s aligned twin (`_a16`) when the manifest has one for `target` and its
/// plan accepts the launch (every length it assumes a multiple of 16 is), else for `name`: the
/// benchmark times the variant that the model's fused ops launch at that shape.
fn twin_or<T>(
    m: &Manifest,
    target: Target,
    name: &str,
    build: impl Fn(&KernelEntry) -> Result<T>,
) -> Result<T> {
    if let Ok(e) = m.entry(&aligned_name(name), target) {
        if let Ok(p) = build(e) {
            return Ok(p);
        }
    }
    build(m.entry(name, target)?)
}

/// Writes the launches of one training step at `shape` for `target` (random inputs, no
/// expected outputs), each with its [`Timing`], and `bench.json` (the shape, its parameter
/// count, [`BUDGETS_MS`] and every record's group and repeat) in the recorder's directory.
/// Returns the record directories.
///
/// One record per distinct launch: per layer the norms (x2 with the residual add), rotary,
/// SwiGLU and attention forward and backward (repeat = layers, or 2·layers for the norms);
/// the head's forward and backward per vocabulary chunk (repeat = full chunks, plus the last
/// partial one) and its finish; AdamW and the gradient's sum of squares on one tensor of
/// `adamw_sample` elements, scaled to all parameters (a fractional repeat), and the total once.
///
/// Errors: a variant the manifest lacks for `target`, a plan builder's refusal, a write that
/// failed. Sizes at [`BenchShape::qwen2_5_0_5b`]: 1.5 GB in 21 records (swiglu's backward 0.4 GB).
pub fn record_bench(
    rec: &Recorder,
    m: &Manifest,
    target: Target,
    shape: &BenchShape,
) -> Result<Vec<PathBuf>> {
    let dt = shape.dtype;
    let n = shape.tokens();
    let (h, l) = (shape.hidden, shape.layers);
    let mut out = Vec::new();
    let mut index = Vec::new();
    let mut seed = 1000u64;
    let mut write =
        |label: &str, _name: &str, plan: &LaunchPlan, b: Bufs, timing: Timing| -> Result<()> {
            let name = plan.name.as_str(); // the twin's, where it was taken
            let k = m.entry(name, target)?;
            let d = rec.record_timed(label, k, plan, &b, &Expected::new(), Some(&timing))?;
            index.push(serde_json::json!({
                "label": label, "name": name, "group": timing.group,
                "repeat": timing.repeat, "note": timing.note,
            }));
            out.push(d);
            Ok(())
        };
    let mut rnd = |dtype: DType, sh: &[usize], scale: f32| {
        seed += 1;
        random(dtype, sh, seed, scale)
    };
    let t = |group: &str, repeat: f64, note: String| Timing {
        group: group.into(),
        repeat,
        note,
    };
    let entry = |name: &str| m.entry(name, target);

    // RMSNorm with the residual add: every layer's two norms, the first layer's input norm
    // being a plain one and the final norm an add (2·layers − 1 + 1 adds, 1 plain).
    let rs = rmsnorm::RmsNorm {
        rows: n,
        cols: h,
        eps: shape.rms_eps,
        rows_per_prog: n.div_ceil(512),
    };
    let parts = n.div_ceil(rs.rows_per_prog);
    let nh = [n, h];
    let norms_add = 2 * l;
    for (kernel, repeat, note) in [
        (
            "add_fwd",
            norms_add as f64,
            format!("2 per layer x {l} (the final norm included, the first input norm not)"),
        ),
        ("fwd", 1.0, "the first layer's input norm".to_string()),
        (
            "add_bwd",
            norms_add as f64,
            format!("2 per layer x {l}, as the forward"),
        ),
        ("bwd", 1.0, "the first layer's input norm".to_string()),
    ] {
        let name = rmsnorm::variant(kernel, dt, h)?;
        let plan = twin_or(m, target, &name, |e| rmsnorm::plan(e, &rs))?;
        let rstd = HostBuffer::f32(&[n], &vec![1.0; n]);
        let mut b = Bufs::from([("w".into(), rnd(dt, &[h], 1.0)), ("rstd".into(), rstd)]);
        if kernel.ends_with("fwd") {
            b.insert("x".into(), rnd(dt, &nh, 1.0));
            b.insert("y".into(), HostBuffer::zeros(dt, &nh));
            if kernel == "add_fwd" {
                b.insert("residual".into(), rnd(dt, &nh, 1.0));
                b.insert("h_out".into(), HostBuffer::zeros(dt, &nh));
            }
        } else {
            b.insert("dy".into(), rnd(dt, &nh, 1.0));
            b.insert("h".into(), rnd(dt, &nh, 1.0));
            b.insert("dx".into(), HostBuffer::zeros(dt, &nh));
            b.insert(
                "dw_part".into(),
                HostBuffer::zeros(DType::Fp32, &[parts, h]),
            );
            if kernel == "add_bwd" {
                b.insert("dres".into(), rnd(dt, &nh, 1.0));
            }
        }
        write(
            &format!("layer_rmsnorm_{kernel}"),
            &name,
            &plan,
            b,
            t("layer", repeat, note),
        )?;
    }
    let name = rmsnorm::variant("dw", dt, h)?;
    let plan = twin_or(m, target, &name, |e| rmsnorm::plan(e, &rs))?;
    let b = Bufs::from([
        ("dw_part".into(), rnd(DType::Fp32, &[parts, h], 1.0)),
        ("dw".into(), HostBuffer::zeros(dt, &[h])),
    ]);
    let note = format!("every norm's weight gradient: 2 x {l} + 1");
    write(
        "layer_rmsnorm_dw",
        &name,
        &plan,
        b,
        t("layer", (norms_add + 1) as f64, note),
    )?;

    // Rotary on q and k, forward and backward, once per layer.
    let d = shape.head_dim;
    let ro = rotary::Rotary {
        tokens: n,
        q_heads: shape.q_heads,
        kv_heads: shape.kv_heads,
        head_dim: d,
    };
    let (qs, ks) = ([n, shape.q_heads, d], [n, shape.kv_heads, d]);
    let pos: Vec<i32> = (0..n).map(|i| (i % shape.seq_len) as i32).collect();
    for (kernel, names) in [
        ("fwd", ["q", "k", "q_out", "k_out"]),
        ("bwd", ["dq", "dk", "dq_out", "dk_out"]),
    ] {
        let name = rotary::variant(kernel, dt, d);
        let plan = twin_or(m, target, &name, |e| rotary::plan(e, &ro))?;
        let b = Bufs::from([
            ("cos".into(), rnd(DType::Fp32, &[shape.seq_len, d], 1.0)),
            ("sin".into(), rnd(DType::Fp32, &[shape.seq_len, d], 1.0)),
            ("pos".into(), HostBuffer::i32(&[n], &pos)),
            (names[0].into(), rnd(dt, &qs, 1.0)),
            (names[1].into(), rnd(dt, &ks, 1.0)),
            (names[2].into(), HostBuffer::zeros(dt, &qs)),
            (names[3].into(), HostBuffer::zeros(dt, &ks)),
        ]);
        let note = format!("q and k, once per layer x {l}");
        write(
            &format!("layer_rotary_{kernel}"),
            &name,
            &plan,
            b,
            t("layer", l as f64, note),
        )?;
    }

    // SwiGLU, forward and backward, once per layer.
    let sw = swiglu::Swiglu {
        rows: n,
        cols: shape.intermediate,
    };
    let ni = [n, shape.intermediate];
    for kernel in ["fwd", "bwd"] {
        let name = swiglu::variant(kernel, dt);
        let plan = twin_or(m, target, &name, |e| swiglu::plan(e, &sw))?;
        let mut b = Bufs::from([
            ("g".into(), rnd(dt, &ni, 4.0)),
            ("u".into(), rnd(dt, &ni, 2.0)),
        ]);
        if kernel == "fwd" {
            b.insert("a".into(), HostBuffer::zeros(dt, &ni));
        } else {
            b.insert("da".into(), rnd(dt, &ni, 1.0));
            b.insert("dg".into(), HostBuffer::zeros(dt, &ni));
            b.insert("du".into(), HostBuffer::zeros(dt, &ni));
        }
        let note = format!("once per layer x {l}");
        write(
            &format!("layer_swiglu_{kernel}"),
            &name,
            &plan,
            b,
            t("layer", l as f64, note),
        )?;
    }

    // Attention: every row its own causal sequence (the unshared layout).
    let lay = attention::Layout {
        n_tokens: n,
        seqs: (0..shape.rows)
            .map(|r| attention::Seq {
                start: r * shape.seq_len,
                len: shape.seq_len,
                prefix_start: 0,
                prefix_len: 0,
            })
            .collect(),
        q_heads: shape.q_heads,
        kv_heads: shape.kv_heads,
        head_dim: d,
        softmax_scale: 1.0 / (d as f32).sqrt(),
        window: 0,
    };
    let hq_n = [shape.q_heads * n];
    let attn_sfx = format!("{}_d{d}", if dt == DType::Bf16 { "bf16" } else { "f32" });
    for kernel in ["fwd", "bwd_pre", "bwd_dkdv", "bwd_dq"] {
        let name = format!("attn_{kernel}_{attn_sfx}");
        let (plan, desc) = twin_or(m, target, &name, |e| attention::plan(e, &lay))?;
        let mut b: Bufs = (desc.into_iter())
            .map(|(k, v)| (k, HostBuffer::i32(&[v.len()], &v)))
            .collect();
        // Inputs a plausible size: lse about ln(keys), so exp(s − lse) stays below 1.
        let lse = HostBuffer::f32(&hq_n, &vec![(shape.seq_len as f32).ln(); hq_n[0]]);
        for buf in plan.buffers() {
            if b.contains_key(buf) {
                continue;
            }
            let v = match buf {
                "q" | "do" | "o" if kernel != "fwd" || buf == "q" => rnd(dt, &qs, 1.0),
                "k" | "v" => rnd(dt, &ks, 1.0),
                "lse" if kernel != "fwd" => lse.clone(),
                "delta" if kernel != "bwd_pre" => rnd(DType::Fp32, &hq_n, 0.1),
                "o" | "dq" => HostBuffer::zeros(dt, &qs),
                "dk" | "dv" => HostBuffer::zeros(dt, &ks),
                "lse" | "delta" => HostBuffer::zeros(DType::Fp32, &hq_n),
                other => {
                    return Err(TritonError::Record(format!(
                        "{name}: no benchmark input for buffer {other}"
                    )))
                }
            };
            b.insert(buf.to_string(), v);
        }
        let note = format!("once per layer x {l}");
        write(
            &format!("attention_{kernel}"),
            &name,
            &plan,
            b,
            t("attention", l as f64, note),
        )?;
    }

    // The log-prob head: per vocabulary chunk of the logits, the merge into the online
    // state and the in-place gradient; the finish once.
    let width = shape.head_chunk_width();
    let full = shape.vocab / width;
    let last = shape.vocab - full * width;
    let targets: Vec<i32> = uniform(7, n)
        .iter()
        .map(|u| ((u + 1.0) / 2.0 * shape.vocab as f32) as i32 % shape.vocab as i32)
        .collect();
    let state0: Vec<f32> = (0..n).flat_map(|_| [1.0f32, 100.0, -5.0, 0.5]).collect();
    let out0: Vec<f32> = (0..n).flat_map(|_| [-3.0f32, 2.0]).collect();
    let lp = if dt == DType::Bf16 { "bf16" } else { "f32" };
    for (kernel, group_note) in [("fwd", "merge"), ("bwd", "in-place gradient")] {
        for (cols, repeat, which) in [(width, full, "chunk"), (last, 1, "last_chunk")] {
            if cols == 0 || repeat == 0 {
                continue;
            }
            let name = format!("logprob_{kernel}_{lp}");
            let s = logprob_head::LogprobChunk {
                rows: n,
                n_cols: cols,
                stride_z: cols,
                col0: if which == "chunk" { 0 } else { full * width },
                first: false,
                inv_t: 1.0,
                cap: 0.0,
            };
            let plan = twin_or(m, target, &name, |e| logprob_head::plan(e, &s))?;
            let mut b = Bufs::from([
                ("z".into(), rnd(dt, &[n, cols], 8.0)),
                ("targets".into(), HostBuffer::i32(&[n], &targets)),
                ("state".into(), HostBuffer::f32(&[n, 4], &state0)),
            ]);
            if kernel == "bwd" {
                b.insert("out".into(), HostBuffer::f32(&[n, 2], &out0));
                b.insert("grad".into(), rnd(DType::Fp32, &[n, 2], 1.0));
            }
            let note = format!(
                "the {group_note} of {which}s of {cols} logits x {n} rows: {repeat} of the \
                 vocabulary's {} chunks of {width}",
                full + usize::from(last > 0)
            );
            write(
                &format!("head_{kernel}_{which}"),
                &name,
                &plan,
                b,
                t("head", repeat as f64, note),
            )?;
        }
    }
    let s = logprob_head::LogprobChunk {
        rows: n,
        n_cols: 1,
        stride_z: 1,
        col0: 0,
        first: false,
        inv_t: 1.0,
        cap: 0.0,
    };
    let plan = logprob_head::plan(entry("logprob_finish")?, &s)?;
    let b = Bufs::from([
        ("state".into(), HostBuffer::f32(&[n, 4], &state0)),
        ("out".into(), HostBuffer::zeros(DType::Fp32, &[n, 2])),
    ]);
    let note = "once per step".to_string();
    write(
        "head_finish",
        "logprob_finish",
        &plan,
        b,
        t("head", 1.0, note),
    )?;

    // AdamW: one tensor of `adamw_sample` elements, its time scaled to every parameter.
    let params = shape.params();
    let sample = shape.adamw_sample.min(params).max(1);
    let scale = params as f64 / sample as f64;
    let (adamw_name, sumsq_name) = if dt == DType::Bf16 {
        ("adamw_master_bf16_gbf16", "grad_sumsq_bf16")
    } else {
        ("adamw_f32", "grad_sumsq_f32")
    };
    let c = adamw::AdamwScalars::new(1e-5, 0.9, 0.999, 1e-8, 0.01, 10, 1.0);
    let step = adamw::Adamw::Step {
        n: sample,
        scalars: c,
    };
    let plan = twin_or(m, target, adamw_name, |e| adamw::plan(e, &step))?;
    let v: Vec<f32> = uniform(9, sample).iter().map(|x| x * x * 1e-4).collect();
    let mut b = Bufs::from([
        ("param".into(), rnd(DType::Fp32, &[sample], 0.05)),
        ("grad".into(), rnd(dt, &[sample], 1e-3)),
        ("exp_avg".into(), rnd(DType::Fp32, &[sample], 1e-3)),
        ("exp_avg_sq".into(), HostBuffer::f32(&[sample], &v)),
    ]);
    if plan.buffers().contains(&"copy") {
        b.insert("copy".into(), HostBuffer::zeros(DType::Bf16, &[sample]));
    }
    let scaled = format!(
        "SCALED: one tensor of {sample} elements timed, x {scale:.3} for all {params} parameters"
    );
    write(
        "adamw_step",
        adamw_name,
        &plan,
        b,
        t("adamw", scale, scaled.clone()),
    )?;
    let k = entry(sumsq_name)?;
    let plan = adamw::plan(
        k,
        &adamw::Adamw::SumSq {
            n: sample,
            partials_offset: 0,
        },
    )?;
    let np = adamw::partials_for(k, sample)?;
    let b = Bufs::from([
        ("grad".into(), rnd(dt, &[sample], 1e-3)),
        ("partials".into(), HostBuffer::zeros(DType::Fp32, &[np])),
    ]);
    write(
        "adamw_grad_sumsq",
        sumsq_name,
        &plan,
        b,
        t("adamw", scale, scaled),
    )?;
    let total = adamw::partials_for(k, params)?;
    let plan = adamw::plan(
        entry("grad_sumsq_total")?,
        &adamw::Adamw::Total { n_partials: total },
    )?;
    let b = Bufs::from([
        ("partials".into(), rnd(DType::Fp32, &[total], 1.0)),
        ("out".into(), HostBuffer::zeros(DType::Fp64, &[1])),
    ]);
    let note = format!("once per step, over the {total} partials of all {params} parameters");
    write(
        "adamw_grad_sumsq_total",
        "grad_sumsq_total",
        &plan,
        b,
        t("adamw", 1.0, note),
    )?;

    let budgets: serde_json::Map<String, serde_json::Value> = (BUDGETS_MS.iter())
        .map(|(g, ms, what)| {
            (
                g.to_string(),
                serde_json::json!({"budget_ms": ms, "what": what}),
            )
        })
        .collect();
    let bench = serde_json::json!({
        "format": 1,
        "shape": shape,
        "tokens": n,
        "params": params,
        "target": target,
        "groups": budgets,
        "records": index,
    });
    let path = rec.dir().join("bench.json");
    std::fs::write(&path, serde_json::to_string_pretty(&bench).expect("JSON"))
        .map_err(|e| TritonError::Record(format!("cannot write {}: {e}", path.display())))?;
    Ok(out)
}
