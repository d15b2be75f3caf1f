//! The lm_head packed for decode steps on CPUs with AVX-512 (see [`PackedHead`]).

use candle_core::Tensor;
use rayon::prelude::*;

/// Vocabulary rows per panel of a [`PackedHead`] (four AVX-512 registers of outputs).
const PANEL: usize = 64;

/// The lm_head weight `[V, H]` repacked once per sampling call (`rlvr_rollout::Sampler::sample`) for the decode
/// steps' `logits = h · Wᵀ` on CPUs with AVX-512: panels of [`PANEL`] vocabulary rows, each stored
/// `[H][PANEL]` (the transpose of its rows; the last panel zero-padded).
///
/// A general GEMM repacks the whole weight on every call (candle's gemm spent 46% of a decode
/// step's samples packing, against 25% in its microkernel, at 32 rows × the 151936-row Qwen2.5
/// head). Packing once per `sample` call and reusing it for every step leaves only the
/// microkernel: 4 rows × 64 outputs in 16 registers, 4 weight loads and 4 broadcasts per 16
/// FMAs. Costs one copy of the head (155 MB at V = 151936, H = 256) while sampling. Summation
/// order differs from candle's matmul (logits agree to ~1e-6 relative; tested).
pub struct PackedHead {
    data: Vec<f32>,
    v: usize,
    h: usize,
}

impl PackedHead {
    /// Packs `w` (`[V, H]`, f32, CPU) when the CPU has AVX-512F; `None` otherwise (or for other
    /// dtypes and devices: the caller keeps its matmul).
    pub fn new(w: &Tensor) -> candle_core::Result<Option<Self>> {
        if !crate::cpu::has_avx512()
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
            candle_core::Storage::Cpu(c) => {
                crate::storage::contiguous_f32(c, l, "packed lm_head", "weight")?
            }
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
    pub fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (m, h) = x.dims2()?;
        if h != self.h {
            candle_core::bail!(
                "packed lm_head: x [{m}, {h}] for a head of width {}",
                self.h
            );
        }
        let x: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let (v, hh) = (self.v, self.h);
        if m == 0 {
            return Tensor::zeros((0, v), candle_core::DType::F32, &candle_core::Device::Cpu);
        }
        let mut out = vec![0f32; m * v];
        // Task t owns the columns of its PANELS_PER_TASK panels in every row of `out`: each row
        // is split at those column boundaries and task t gets the t-th piece of every row, so
        // the tasks' writes are disjoint by construction.
        const PANELS_PER_TASK: usize = 16;
        let task_cols = PANELS_PER_TASK * PANEL;
        let mut pieces: Vec<Vec<&mut [f32]>> = (0..v.div_ceil(task_cols))
            .map(|_| Vec::with_capacity(m))
            .collect();
        for row in out.chunks_mut(v) {
            for (t, piece) in row.chunks_mut(task_cols).enumerate() {
                pieces[t].push(piece);
            }
        }
        let avx512 = crate::cpu::has_avx512();
        pieces
            .into_par_iter()
            .zip(self.data.par_chunks(hh * PANEL * PANELS_PER_TASK))
            .for_each(|(mut rows_out, panels)| {
                for (i, panel) in panels.chunks(hh * PANEL).enumerate() {
                    let c0 = i * PANEL;
                    let cols = PANEL.min(rows_out[0].len() - c0);
                    let mut tile = [0f32; 4 * PANEL];
                    for r0 in (0..m).step_by(4) {
                        let rows = 4.min(m - r0);
                        panel_tile(&x[r0 * hh..], hh, rows, panel, &mut tile, avx512);
                        for r in 0..rows {
                            rows_out[r0 + r][c0..c0 + cols]
                                .copy_from_slice(&tile[r * PANEL..r * PANEL + cols]);
                        }
                    }
                }
            });
        Tensor::from_vec(out, (m, v), &candle_core::Device::Cpu)
    }
}

/// `tile[r][0..64] = Σ_k x[r][k] · panel[k][0..64]` for `rows` ≤ 4 rows of x (row stride `h`),
/// by the AVX-512 kernel when `avx512` (the CPU's feature, detected once), else in plain code.
/// Both sum over k in order with one fused multiply-add per term.
///
/// Panics when a slice is shorter than the shapes say.
fn panel_tile(
    x: &[f32],
    h: usize,
    rows: usize,
    panel: &[f32],
    tile: &mut [f32; 4 * PANEL],
    avx512: bool,
) {
    assert!(rows <= 4 && x.len() >= rows * h && panel.len() >= h * PANEL);
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: the CPU has AVX-512F (detected by `crate::cpu`); the slice lengths are the
        // ones `panel_kernel` requires (asserted above).
        unsafe { panel_kernel(x, h, rows, panel, tile) };
        return;
    }
    let _ = avx512;
    for r in 0..rows {
        let mut acc = [0f32; PANEL];
        for k in 0..h {
            let xb = x[r * h + k];
            let w = &panel[k * PANEL..(k + 1) * PANEL];
            for (a, &wv) in acc.iter_mut().zip(w) {
                *a = xb.mul_add(wv, *a);
            }
        }
        tile[r * PANEL..(r + 1) * PANEL].copy_from_slice(&acc);
    }
}

/// The AVX-512 microkernel of [`panel_tile`].
///
/// # Safety
/// The CPU supports AVX-512F; `x` holds `rows · h` floats, `panel` `h · 64`, `tile` `4 · 64`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn panel_kernel(x: &[f32], h: usize, rows: usize, panel: &[f32], tile: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(x.len() >= rows * h && panel.len() >= h * PANEL && tile.len() >= 4 * PANEL);
    // SAFETY (pointer arithmetic below): k < h and r < rows, so xp + r·h + k lies in x
    // (rows · h floats), pp + k·64 .. +64 in panel (h · 64) and tile + r·64 + j·16 .. +16 in
    // tile (4 · 64); unaligned loads/stores need no alignment.
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
