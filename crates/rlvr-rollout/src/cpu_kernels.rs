//! A CPU kernel for the decode step's skinny matmuls `y = x · wᵀ` with few rows of x (the B
//! sequences of a decode step) and a large row-major weight `w` `[N, K]`.
//!
//! candle's general GEMM reaches ~20 GFLOP/s on these shapes (M = 8, the lm_head's N = 32000),
//! which made the lm_head alone 5–8 ms per step on 2 cores. This kernel streams each weight row
//! once, computes its dot products with every x row in 8 independent f32 lanes (vectorised with
//! AVX2 when the CPU has it, chosen at run time; plain SSE otherwise, with identical results since
//! the lane order is the same), and splits the weight rows over the rayon pool. It is used only
//! for f32 on the CPU; every other case goes through candle's matmul.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

/// Most x rows for which the kernel beats candle's GEMM (above it the GEMM's blocking wins).
pub(crate) const MAX_ROWS: usize = 16;

/// Weight rows per parallel task.
const ROWS_PER_TASK: usize = 512;

/// `x · wᵀ` for x `[M, K]`, w `[N, K]`, both f32 on the CPU.
struct SkinnyMatmul;

#[inline(always)]
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Dot products of weight rows `w` (`[n, k]`) with every x row (`[m, k]`), written to
/// `out[j * m + b]` (transposed block, `[n, m]`).
#[inline(always)]
fn block(x: &[f32], w: &[f32], m: usize, k: usize, out: &mut [f32]) {
    for (j, wr) in w.chunks_exact(k).enumerate() {
        for b in 0..m {
            out[j * m + b] = dot8(&x[b * k..(b + 1) * k], wr);
        }
    }
}

/// AVX2+FMA version of [`block`] for `m` a multiple of 8: each 8-float slice of a weight row is
/// loaded once and multiplied into 8 register accumulators, one per x row.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `x` is `[m, k]` with `m.is_multiple_of(8)`, `w` is `[n, k]`, `out`
/// holds `n · m` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(x: &[f32], w: &[f32], m: usize, k: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(m.is_multiple_of(8) && x.len() == m * k && out.len() * k == w.len() * m);
    let kc = k / 8 * 8;
    let xp = x.as_ptr();
    for (j, wr) in w.chunks_exact(k).enumerate() {
        let wp = wr.as_ptr();
        for b0 in (0..m).step_by(8) {
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut c = 0;
            while c < kc {
                let wv = _mm256_loadu_ps(wp.add(c));
                for (b, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add((b0 + b) * k + c)), wv, *a);
                }
                c += 8;
            }
            for (b, a) in acc.iter().enumerate() {
                let mut lanes = [0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), *a);
                let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
                    + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
                for i in kc..k {
                    sum += x[(b0 + b) * k + i] * wr[i];
                }
                out[j * m + b0 + b] = sum;
            }
        }
    }
}

fn block_dispatch(x: &[f32], w: &[f32], m: usize, k: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if m.is_multiple_of(8)
        && std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above); shapes as documented.
        return unsafe { block_avx2(x, w, m, k, out) };
    }
    block(x, w, m, k, out)
}

fn contiguous_f32<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<f32>()?[a..b]),
        None => candle_core::bail!("skinny-matmul: non-contiguous input"),
    }
}

impl CustomOp2 for SkinnyMatmul {
    fn name(&self) -> &'static str {
        "skinny-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, k) = l1.shape().dims2()?;
        let (n, k2) = l2.shape().dims2()?;
        if k != k2 {
            candle_core::bail!("skinny-matmul: x [{m}, {k}] · wᵀ with w [{n}, {k2}]");
        }
        let w = contiguous_f32(s2, l2)?;
        // x padded with zero rows to a multiple of 8 (the AVX2 kernel's register block).
        let mp = m.div_ceil(8) * 8;
        let mut x = contiguous_f32(s1, l1)?.to_vec();
        x.resize(mp * k, 0.0);
        // Transposed result [n, mp], one disjoint chunk per task; then transposed to [m, n].
        let mut t = vec![0f32; n * mp];
        t.par_chunks_mut(ROWS_PER_TASK * mp)
            .zip(w.par_chunks(ROWS_PER_TASK * k))
            .for_each(|(o, wc)| block_dispatch(&x, wc, mp, k, o));
        let mut y = vec![0f32; m * n];
        for (j, col) in t.chunks_exact(mp).enumerate() {
            for (b, &v) in col[..m].iter().enumerate() {
                y[b * n + j] = v;
            }
        }
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

/// `x · wᵀ` (x `[M, K]`, w `[N, K]`) by the skinny kernel when both are contiguous f32 CPU
/// tensors and M ≤ [`MAX_ROWS`]; `None` otherwise (use candle's matmul).
pub(crate) fn skinny_matmul(x: &Tensor, w: &Tensor) -> Option<candle_core::Result<Tensor>> {
    let ok = x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && w.dtype() == candle_core::DType::F32
        && x.rank() == 2
        && w.rank() == 2
        && x.dims()[0] <= MAX_ROWS
        && x.is_contiguous()
        && w.is_contiguous();
    ok.then(|| x.apply_op2_no_bwd(w, &SkinnyMatmul))
}

/// Vocabulary rows per panel of a [`PackedHead`] (four AVX-512 registers of outputs).
const PANEL: usize = 64;

/// The lm_head weight `[V, H]` repacked once per [`crate::Sampler::sample`] call for the decode
/// steps' `logits = h · Wᵀ` on CPUs with AVX-512: panels of [`PANEL`] vocabulary rows, each stored
/// `[H][PANEL]` (the transpose of its rows; the last panel zero-padded).
///
/// A general GEMM repacks the whole weight on every call (candle's gemm spent 46% of a decode
/// step's samples packing, against 25% in its microkernel, at 32 rows × the 151936-row Qwen2.5
/// head). Packing once per `sample` call and reusing it for every step leaves only the
/// microkernel: 4 rows × 64 outputs in 16 registers, 4 weight loads and 4 broadcasts per 16
/// FMAs. Costs one copy of the head (155 MB at V = 151936, H = 256) while sampling. Summation
/// order differs from candle's matmul (logits agree to ~1e-6 relative; tested).
pub(crate) struct PackedHead {
    data: Vec<f32>,
    v: usize,
    h: usize,
}

/// Whether the running CPU has AVX-512F (the packed head's kernel).
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| std::is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl PackedHead {
    /// Packs `w` (`[V, H]`, f32, CPU) when the CPU has AVX-512F; `None` otherwise (or for other
    /// dtypes and devices: the caller keeps its matmul).
    pub(crate) fn new(w: &Tensor) -> candle_core::Result<Option<Self>> {
        if !has_avx512()
            || !w.device().is_cpu()
            || w.dtype() != candle_core::DType::F32
            || w.rank() != 2
        {
            return Ok(None);
        }
        let (v, h) = w.dims2()?;
        let w = w.contiguous()?;
        let (s, l) = w.storage_and_layout();
        let src = match &*s {
            candle_core::Storage::Cpu(c) => contiguous_f32(c, l)?,
            _ => return Ok(None),
        };
        let panels = v.div_ceil(PANEL);
        let mut data = vec![0f32; panels * h * PANEL];
        data.par_chunks_mut(h * PANEL)
            .enumerate()
            .for_each(|(p, dst)| {
                let r0 = p * PANEL;
                for r in 0..PANEL.min(v - r0) {
                    let row = &src[(r0 + r) * h..(r0 + r + 1) * h];
                    for (k, &x) in row.iter().enumerate() {
                        dst[k * PANEL + r] = x;
                    }
                }
            });
        Ok(Some(PackedHead { data, v, h }))
    }

    /// `x · Wᵀ`: x `[M, H]` f32 on the CPU → logits `[M, V]` f32.
    pub(crate) fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (m, h) = x.dims2()?;
        if h != self.h {
            candle_core::bail!(
                "packed lm_head: x [{m}, {h}] for a head of width {}",
                self.h
            );
        }
        let x: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let (v, hh) = (self.v, self.h);
        let mut out = vec![0f32; m * v];
        // Tasks own disjoint column ranges of `out`; rows are strided by V.
        struct Out(*mut f32);
        // SAFETY: each task writes only its own panels' columns (disjoint), see below.
        unsafe impl Send for Out {}
        unsafe impl Sync for Out {}
        let dst = Out(out.as_mut_ptr());
        const PANELS_PER_TASK: usize = 16;
        self.data
            .par_chunks(hh * PANEL * PANELS_PER_TASK)
            .enumerate()
            .for_each(|(t, panels)| {
                let dst = &dst;
                for (i, panel) in panels.chunks(hh * PANEL).enumerate() {
                    let c0 = (t * PANELS_PER_TASK + i) * PANEL;
                    let cols = PANEL.min(v - c0);
                    let mut tile = [0f32; 4 * PANEL];
                    for r0 in (0..m).step_by(4) {
                        let rows = 4.min(m - r0);
                        // SAFETY: AVX-512F is present (checked in `new`); `x` holds rows
                        // r0..r0+rows of width hh; `panel` is hh × PANEL; `tile` rows × PANEL.
                        #[cfg(target_arch = "x86_64")]
                        unsafe {
                            panel_kernel(&x[r0 * hh..], hh, rows, panel, &mut tile)
                        };
                        for r in 0..rows {
                            // SAFETY: row r0 + r < m and columns c0..c0+cols < v lie inside
                            // `out` ([m, v]); no other task writes these columns.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    tile.as_ptr().add(r * PANEL),
                                    dst.0.add((r0 + r) * v + c0),
                                    cols,
                                );
                            }
                        }
                    }
                }
            });
        Tensor::from_vec(out, (m, v), &candle_core::Device::Cpu)
    }
}

/// `tile[r][0..64] = Σ_k x[r][k] · panel[k][0..64]` for `rows` ≤ 4 rows of x (row stride `h`).
///
/// # Safety
/// The CPU supports AVX-512F; `x` holds `rows · h` floats, `panel` `h · 64`, `tile` `4 · 64`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn panel_kernel(x: &[f32], h: usize, rows: usize, panel: &[f32], tile: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(x.len() >= rows * h && panel.len() >= h * PANEL && tile.len() >= 4 * PANEL);
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let xp = x.as_ptr();
    let pp = panel.as_ptr();
    macro_rules! run {
        ($r:expr) => {
            for k in 0..h {
                let w = pp.add(k * PANEL);
                let w0 = _mm512_loadu_ps(w);
                let w1 = _mm512_loadu_ps(w.add(16));
                let w2 = _mm512_loadu_ps(w.add(32));
                let w3 = _mm512_loadu_ps(w.add(48));
                for r in 0..$r {
                    let xb = _mm512_set1_ps(*xp.add(r * h + k));
                    acc[r][0] = _mm512_fmadd_ps(xb, w0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(xb, w1, acc[r][1]);
                    acc[r][2] = _mm512_fmadd_ps(xb, w2, acc[r][2]);
                    acc[r][3] = _mm512_fmadd_ps(xb, w3, acc[r][3]);
                }
            }
        };
    }
    match rows {
        4 => run!(4),
        3 => run!(3),
        2 => run!(2),
        _ => run!(1),
    }
    for (r, row) in acc.iter().enumerate().take(rows) {
        for (j, a) in row.iter().enumerate() {
            _mm512_storeu_ps(tile.as_mut_ptr().add(r * PANEL + j * 16), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::parity_tests::max_abs_diff;
    use candle_core::{Device, Tensor};

    #[test]
    fn skinny_matmul_equals_candle_matmul() {
        let d = Device::Cpu;
        for (m, k, n) in [(1, 8, 3), (8, 256, 1100), (3, 37, 513), (16, 64, 2000)] {
            let x = Tensor::randn(0f32, 1., (m, k), &d).unwrap();
            let w = Tensor::randn(0f32, 1., (n, k), &d).unwrap();
            let want = x.matmul(&w.t().unwrap()).unwrap();
            let got = super::skinny_matmul(&x, &w).unwrap().unwrap();
            let diff = max_abs_diff(&want, &got);
            assert!(diff < 1e-4, "{m}x{k}x{n}: {diff}");
        }
    }

    /// The packed head equals candle's matmul for row counts around the 4-row block, widths that
    /// are not a multiple of 16 and vocabularies with a partial last panel. Without AVX-512 it
    /// declines (None), and the decode step keeps candle's matmul.
    #[test]
    fn packed_head_equals_candle_matmul() {
        let d = Device::Cpu;
        for (m, k, n) in [
            (1, 8, 3),
            (4, 64, 1000),
            (7, 37, 129),
            (33, 256, 2048),
            (64, 96, 65),
        ] {
            let x = Tensor::randn(0f32, 1., (m, k), &d).unwrap();
            let w = Tensor::randn(0f32, 1., (n, k), &d).unwrap();
            let Some(p) = super::PackedHead::new(&w).unwrap() else {
                assert!(!super::has_avx512());
                return;
            };
            let want = x.matmul(&w.t().unwrap()).unwrap();
            let got = p.matmul(&x).unwrap();
            assert_eq!(got.dims(), &[m, n]);
            let diff = max_abs_diff(&want, &got);
            assert!(diff < 1e-4, "{m}x{k}x{n}: {diff}");
        }
    }
}
