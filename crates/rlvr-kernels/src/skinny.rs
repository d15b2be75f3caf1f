//! A CPU kernel for skinny matmuls `y = x · wᵀ` with few rows of x (the B
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
pub const MAX_ROWS: usize = 16;

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
                // SAFETY (loads): c + 8 ≤ kc ≤ k, so wp + c..c+8 lies in the weight row `wr` (k
                // floats) and xp + (b0+b)·k + c..+8 in x row b0 + b < m ([m, k], checked by the
                // caller); unaligned loads (`loadu`) need no alignment.
                let wv = _mm256_loadu_ps(wp.add(c));
                for (b, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add((b0 + b) * k + c)), wv, *a);
                }
                c += 8;
            }
            for (b, a) in acc.iter().enumerate() {
                let mut lanes = [0f32; 8];
                // SAFETY: `lanes` holds exactly the 8 floats stored.
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
    if m.is_multiple_of(8) && crate::cpu::has_avx2() {
        assert!(x.len() == m * k && w.len().is_multiple_of(k) && out.len() == w.len() / k * m);
        // SAFETY: the CPU supports AVX2 and FMA (checked just above); the shapes are the ones
        // `block_avx2` requires (asserted just above).
        return unsafe { block_avx2(x, w, m, k, out) };
    }
    block(x, w, m, k, out)
}

fn contiguous_f32<'a>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [f32]> {
    crate::storage::contiguous_f32(s, l, "skinny-matmul", "input")
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
pub fn skinny_matmul(x: &Tensor, w: &Tensor) -> Option<candle_core::Result<Tensor>> {
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
