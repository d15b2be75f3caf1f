//! Fused per-token log-prob and entropy over the vocabulary, with a hand-written backward.
//!
//! The unfused path (`log_softmax` then `gather`, entropy from `exp(logp)·logp`) makes about ten
//! single-threaded passes over the `[N, V]` logits forward and as many backward, and keeps several
//! `[N, V]` intermediates alive for autograd. This op makes two parallel passes forward and one
//! backward, keeps nothing but its `[N, 2]` output, and gives the same values (tested against the
//! unfused path). CPU, f32 only; other devices and dtypes use the unfused path.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};
use rayon::prelude::*;

/// `[N, V]` logits → `[N, 2]`: column 0 is `log_softmax(z/T)[y]`, column 1 the entropy of
/// `softmax(z/T)` in nats (0 when not asked for). Gradients flow to the logits through both.
#[derive(Clone)]
pub struct TokenLogprobOp {
    /// The scored token of each row, `[N]`.
    pub targets: Arc<Vec<u32>>,
    /// 1 / temperature.
    pub inv_t: f32,
    /// Compute the entropy column (costs one more multiply-add per logit).
    pub entropy: bool,
}

fn rows<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
) -> candle_core::Result<(&'a [f32], usize, usize)> {
    let (n, v) = layout.shape().dims2()?;
    let data = match storage {
        CpuStorage::F32(d) => d,
        _ => candle_core::bail!("TokenLogprobOp needs f32 logits"),
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("TokenLogprobOp needs contiguous logits");
    };
    Ok((&data[start..end], n, v))
}

/// Row statistics: (max of s, Σ exp(s − max), Σ exp(s − max)·s) with s = z·inv_t.
fn row_stats(z: &[f32], inv_t: f32, entropy: bool) -> (f32, f64, f64) {
    let m = z.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x)) * inv_t;
    let (mut se, mut ses) = (0f64, 0f64);
    if entropy {
        for &x in z {
            let s = x * inv_t;
            let e = (s - m).exp();
            se += e as f64;
            ses += (e * s) as f64;
        }
    } else {
        for &x in z {
            se += ((x * inv_t - m).exp()) as f64;
        }
    }
    (m, se, ses)
}

impl CustomOp1 for TokenLogprobOp {
    fn name(&self) -> &'static str {
        "token-logprob-entropy"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (data, n, v) = rows(storage, layout)?;
        if self.targets.len() != n {
            candle_core::bail!(
                "TokenLogprobOp: {} targets for {n} rows",
                self.targets.len()
            );
        }
        let mut out = vec![0f32; n * 2];
        out.par_chunks_mut(2).enumerate().for_each(|(i, o)| {
            let z = &data[i * v..(i + 1) * v];
            let (m, se, ses) = row_stats(z, self.inv_t, self.entropy);
            let lse = m as f64 + se.ln();
            let y = self.targets[i] as usize;
            o[0] = (z[y.min(v - 1)] as f64 * self.inv_t as f64 - lse) as f32;
            o[1] = if self.entropy {
                (lse - ses / se) as f32
            } else {
                0.0
            };
        });
        Ok((CpuStorage::F32(out), Shape::from((n, 2))))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let g: Vec<f32> = grad_res.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
        let r: Vec<f32> = res.flatten_all()?.to_vec1()?;
        let op = TokenLogprobGradOp {
            fwd: self.clone(),
            grad: Arc::new(g),
            res: Arc::new(r),
        };
        Ok(Some(arg.apply_op1_no_bwd(&op)?))
    }
}

/// The backward of [`TokenLogprobOp`]: `[N, V]` gradient w.r.t. the logits,
/// `∂/∂z_j = (1/T)·[g_ℓ·(δ_jy − p_j) − g_H·p_j·(log p_j + H)]`.
struct TokenLogprobGradOp {
    fwd: TokenLogprobOp,
    /// Upstream gradient `[N, 2]` (g_ℓ, g_H), row-major.
    grad: Arc<Vec<f32>>,
    /// Forward output `[N, 2]` (ℓ_y, H), row-major.
    res: Arc<Vec<f32>>,
}

impl CustomOp1 for TokenLogprobGradOp {
    fn name(&self) -> &'static str {
        "token-logprob-entropy-grad"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (data, n, v) = rows(storage, layout)?;
        let inv_t = self.fwd.inv_t;
        let mut out = vec![0f32; n * v];
        out.par_chunks_mut(v).enumerate().for_each(|(i, o)| {
            let z = &data[i * v..(i + 1) * v];
            let (gl, gh) = (self.grad[2 * i], self.grad[2 * i + 1]);
            let y = (self.fwd.targets[i] as usize).min(v - 1);
            // log-sum-exp recovered from the forward output: lse = s_y − ℓ_y.
            let lse = z[y] * inv_t - self.res[2 * i];
            let h = self.res[2 * i + 1];
            if gh == 0.0 || !self.fwd.entropy {
                for (o, &x) in o.iter_mut().zip(z) {
                    let p = (x * inv_t - lse).exp();
                    *o = -gl * p * inv_t;
                }
            } else {
                for (o, &x) in o.iter_mut().zip(z) {
                    let lp = x * inv_t - lse;
                    let p = lp.exp();
                    *o = (-gl * p - gh * p * (lp + h)) * inv_t;
                }
            }
            o[y] += gl * inv_t;
        });
        Ok((CpuStorage::F32(out), Shape::from((n, v))))
    }
}

// ---------------------------------------------------------------------------------------------
// Fused lm_head + log-softmax + gather + entropy.
// ---------------------------------------------------------------------------------------------

/// Vocabulary rows of `W` per task (one task computes the logits of these columns).
const VOCAB_CHUNK: usize = 256;
/// Hidden-state rows per block inside a task; a task's logits block is
/// `ROW_BLOCK × VOCAB_CHUNK` f32 (512 KiB), which stays in L2.
const ROW_BLOCK: usize = 512;

/// Fused `lm_head` + log-softmax + gather (+ entropy) over hidden states `h` `[N, H]` and the
/// head weight `W` `[V, H]` (the embedding when tied) → `[N, 2]` f32: column 0 is
/// `log_softmax(h·Wᵀ / T)[y]`, column 1 the entropy of `softmax(h·Wᵀ / T)` in nats (0 when not
/// asked for).
///
/// The `[N, V]` logits never exist: the vocabulary is cut into chunks of `VOCAB_CHUNK` rows of
/// `W`, processed in parallel; each chunk's logits (`ROW_BLOCK × VOCAB_CHUNK` at a time, computed
/// with the `gemm` crate, single-threaded per task) are reduced to per-row (max, Σexp, Σexp·s)
/// and merged. The backward recomputes each chunk's logits, turns them into the gradient w.r.t.
/// the logits in place and accumulates `∂h = G·W` and `∂W = Gᵀ·h`, so it too holds one chunk at a
/// time. Gradients flow to both `h` and `W`; for tied embeddings candle adds `∂W` to the
/// embedding's other gradient. CPU, f32, contiguous inputs only; the model uses
/// `Model::lm_head` + `Model::logprobs_unfused` elsewhere (tested equal in value and gradient).
///
/// With a [`LogitStash`] the forward keeps the scaled logits (`N·V` f32) for the backward, which
/// then skips their recomputation (a third of the head's matmul work) at the cost of that memory.
#[derive(Clone)]
pub struct LmHeadLogprobOp {
    /// The scored token of each row, `[N]`, each `< V`.
    pub targets: Arc<Vec<u32>>,
    /// 1 / temperature.
    pub inv_t: f32,
    /// Compute the entropy column (and its gradient).
    pub entropy: bool,
    /// Where the forward leaves the logits for the backward; `None`: the backward recomputes them.
    pub stash: Option<Arc<LogitStash>>,
}

/// Largest `[N, V]` f32 logits the model keeps for the backward (512 MiB); above it the backward
/// recomputes them.
pub const STASH_MAX_BYTES: usize = 512 << 20;

/// The scaled logits of one [`LmHeadLogprobOp`] forward, kept for its backward (which takes them:
/// a second backward recomputes). Layout: vocabulary chunk after chunk, each `[N, chunk]`.
#[derive(Default)]
pub struct LogitStash(std::sync::Mutex<Option<Vec<f32>>>);

impl LogitStash {
    /// A stash when the `[n, v]` f32 logits fit in `max_bytes`, else `None`.
    pub fn within(n: usize, v: usize, max_bytes: usize) -> Option<Arc<Self>> {
        (n.saturating_mul(v).saturating_mul(4) <= max_bytes).then(Default::default)
    }

    fn put(&self, logits: Vec<f32>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(logits);
    }

    fn take(&self) -> Option<Vec<f32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The last stash buffer a backward finished with, reused by the next forward: a fresh `N·V`
/// allocation is `mmap`ed and page-faulted in on every step (≈ 6% of a step here). Holds at
/// most [`STASH_MAX_BYTES`] for the life of the process once a training step has run.
static STASH_CACHE: std::sync::Mutex<Vec<f32>> = std::sync::Mutex::new(Vec::new());

/// A buffer of `len` f32 (contents unspecified), from [`STASH_CACHE`] when it is there.
fn stash_buffer(len: usize) -> Vec<f32> {
    let mut b = std::mem::take(&mut *STASH_CACHE.lock().unwrap_or_else(|e| e.into_inner()));
    if b.len() >= len {
        b.truncate(len);
    } else {
        b = vec![0f32; len];
    }
    b
}

/// Returns a stash buffer to [`STASH_CACHE`] (keeping the larger of it and the cached one).
fn recycle_stash(b: Vec<f32>) {
    let mut cache = STASH_CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if b.capacity() > cache.capacity() {
        *cache = b;
    }
}

fn contiguous_f32<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> candle_core::Result<(&'a [f32], usize, usize)> {
    let (r, c) = layout.shape().dims2()?;
    let data = match storage {
        CpuStorage::F32(d) => d,
        _ => candle_core::bail!("LmHeadLogprobOp needs f32 {what}"),
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("LmHeadLogprobOp needs contiguous {what}");
    };
    Ok((&data[start..end], r, c))
}

impl LmHeadLogprobOp {
    fn check(&self, n: usize, h: usize, v: usize, h2: usize) -> candle_core::Result<()> {
        if h != h2 {
            candle_core::bail!("LmHeadLogprobOp: hidden [{n}, {h}] vs weight [{v}, {h2}]");
        }
        if self.targets.len() != n {
            candle_core::bail!(
                "LmHeadLogprobOp: {} targets for {n} rows",
                self.targets.len()
            );
        }
        if let Some(&y) = self.targets.iter().find(|&&y| y as usize >= v) {
            candle_core::bail!("LmHeadLogprobOp: target {y} outside the vocabulary ({v})");
        }
        Ok(())
    }
}

/// `dst[m, n] (+)= beta · lhs[m, k] · rhs[k, n]`, single-threaded, with (row, column) strides.
///
/// # Safety
/// The pointers and strides must describe valid, non-overlapping matrices of those shapes.
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    lhs: *const f32,
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: *const f32,
    rhs_rs: usize,
    rhs_cs: usize,
    beta: f32,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        accumulate,
        lhs,
        lhs_cs as isize,
        lhs_rs as isize,
        rhs,
        rhs_cs as isize,
        rhs_rs as isize,
        1.0,
        beta,
        false,
        false,
        false,
        gemm::Parallelism::None,
    )
}

/// `exp(x)` for f32 in straight-line code the compiler vectorises: Cephes' range reduction and
/// degree-6 polynomial (max relative error ≈ 2 ulp on the clamped range); inputs are clamped to
/// [−87.3, 88.3], so tiny results are ~1e-38 rather than 0. Shared with the sampler
/// (`rlvr-rollout`'s token selection), so both sides' softmax weights come from the same function.
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer
    let x = if x < -87.3 { -87.3 } else { x };
    let x = if x > 88.3 { 88.3 } else { x };
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_2e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    y * f32::from_bits(((ni + 127) << 23) as u32)
}

const LANES: usize = 16;

/// (max s, Σ exp(s − max), Σ exp(s − max)·(s − max)) over one row chunk of scaled logits.
#[inline(always)]
fn chunk_stats_body(s: &[f32], entropy: bool) -> (f32, f32, f32) {
    let mut mx = [f32::NEG_INFINITY; LANES];
    let it = s.chunks_exact(LANES);
    let rem = it.remainder();
    for c in it {
        for l in 0..LANES {
            if c[l] > mx[l] {
                mx[l] = c[l];
            }
        }
    }
    let mut m = rem.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
    for x in mx {
        m = m.max(x);
    }
    let (mut se, mut sd) = ([0f32; LANES], [0f32; LANES]);
    let it = s.chunks_exact(LANES);
    let rem = it.remainder();
    if entropy {
        for c in it {
            for l in 0..LANES {
                let d = c[l] - m;
                let e = exp_fast(d);
                se[l] += e;
                sd[l] += e * d;
            }
        }
    } else {
        for c in it {
            for l in 0..LANES {
                se[l] += exp_fast(c[l] - m);
            }
        }
    }
    let (mut a, mut b) = (0f32, 0f32);
    for &x in rem {
        let d = x - m;
        let e = exp_fast(d);
        a += e;
        b += e * d;
    }
    (
        m,
        se.iter().sum::<f32>() + a,
        if entropy {
            sd.iter().sum::<f32>() + b
        } else {
            0.0
        },
    )
}

/// In place: scaled logits s → ∂L/∂s = −g_ℓ·p − g_H·p·(log p + H), p = exp(s − lse).
#[inline(always)]
fn chunk_grad_body(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32) {
    if gh == 0.0 {
        for x in s.iter_mut() {
            *x = -gl * exp_fast(*x - lse);
        }
    } else {
        for x in s.iter_mut() {
            let lp = *x - lse;
            let p = exp_fast(lp);
            *x = -gl * p - gh * p * (lp + h);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_stats_avx2(s: &[f32], entropy: bool) -> (f32, f32, f32) {
    chunk_stats_body(s, entropy)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chunk_grad_avx2(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32) {
    chunk_grad_body(s, lse, gl, gh, h)
}

/// Whether the running CPU has AVX2 and FMA (the vectorised paths here and in the sampler's
/// token selection; std caches the detection).
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn chunk_stats(s: &[f32], entropy: bool, avx2: bool) -> (f32, f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the CPU supports AVX2 and FMA (checked by the caller with `has_avx2`).
        return unsafe { chunk_stats_avx2(s, entropy) };
    }
    let _ = avx2;
    chunk_stats_body(s, entropy)
}

fn chunk_grad(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32, avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: the CPU supports AVX2 and FMA (checked by the caller with `has_avx2`).
        return unsafe { chunk_grad_avx2(s, lse, gl, gh, h) };
    }
    let _ = avx2;
    chunk_grad_body(s, lse, gl, gh, h)
}

/// Scaled logits of rows `r0..r0+rb` against vocabulary rows `c0..c0+vc` into `z` `[rb, vc]`.
#[allow(clippy::too_many_arguments)]
fn logits_block(
    z: &mut [f32],
    h: &[f32],
    w: &[f32],
    hd: usize,
    r0: usize,
    rb: usize,
    c0: usize,
    vc: usize,
    inv_t: f32,
) {
    assert!(z.len() >= rb * vc && h.len() >= (r0 + rb) * hd && w.len() >= (c0 + vc) * hd);
    // SAFETY: bounds checked above; z does not overlap h or w.
    unsafe {
        sgemm(
            rb,
            vc,
            hd,
            z.as_mut_ptr(),
            vc,
            false,
            h.as_ptr().add(r0 * hd),
            hd,
            1,
            w.as_ptr().add(c0 * hd),
            1,
            hd,
            inv_t,
        )
    }
}

impl candle_core::CustomOp2 for LmHeadLogprobOp {
    fn name(&self) -> &'static str {
        "lm-head-logprob-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (h, n, hd) = contiguous_f32(s1, l1, "hidden states")?;
        let (w, v, hd2) = contiguous_f32(s2, l2, "head weight")?;
        self.check(n, hd, v, hd2)?;
        let avx2 = has_avx2();
        let nchunks = v.div_ceil(VOCAB_CHUNK);
        // Per (chunk, row): max, Σexp(s − max), Σexp(s − max)·(s − max), s_y (when y is in it).
        let mut stats = vec![[0f32; 4]; nchunks * n];
        let mut kept = match self.stash {
            Some(_) => stash_buffer(n * v),
            None => vec![],
        };
        let chunk_stats_of = |z: &mut [f32], c: usize, st: &mut [[f32; 4]], whole: bool| {
            let c0 = c * VOCAB_CHUNK;
            let vc = VOCAB_CHUNK.min(v - c0);
            for r0 in (0..n).step_by(ROW_BLOCK) {
                let rb = ROW_BLOCK.min(n - r0);
                // With a stash, z is this chunk's whole [n, vc] slot in it.
                let z = if whole { &mut z[r0 * vc..] } else { &mut *z };
                logits_block(z, h, w, hd, r0, rb, c0, vc, self.inv_t);
                for i in 0..rb {
                    let row = &z[i * vc..(i + 1) * vc];
                    let (m, se, sd) = chunk_stats(row, self.entropy, avx2);
                    let y = self.targets[r0 + i] as usize;
                    let sy = if (c0..c0 + vc).contains(&y) {
                        row[y - c0]
                    } else {
                        0.0
                    };
                    st[r0 + i] = [m, se, sd, sy];
                }
            }
        };
        if self.stash.is_some() {
            stats
                .par_chunks_mut(n)
                .zip(kept.par_chunks_mut(VOCAB_CHUNK * n))
                .enumerate()
                .for_each(|(c, (st, z))| chunk_stats_of(z, c, st, true));
        } else {
            stats.par_chunks_mut(n).enumerate().for_each_init(
                || vec![0f32; ROW_BLOCK.min(n) * VOCAB_CHUNK],
                |z, (c, st)| chunk_stats_of(z, c, st, false),
            );
        }
        if let Some(stash) = &self.stash {
            stash.put(kept);
        }
        let mut out = vec![0f32; n * 2];
        out.par_chunks_mut(2).enumerate().for_each(|(i, o)| {
            let mm = (0..nchunks).fold(f32::NEG_INFINITY, |a, c| a.max(stats[c * n + i][0]));
            let (mut se, mut sd) = (0f64, 0f64);
            for c in 0..nchunks {
                let [m, e, d, _] = stats[c * n + i];
                let shift = (m - mm) as f64;
                let scale = shift.exp();
                se += e as f64 * scale;
                sd += scale * (d as f64 + e as f64 * shift);
            }
            let y = self.targets[i] as usize;
            let sy = stats[(y / VOCAB_CHUNK) * n + i][3] as f64;
            let lse = mm as f64 + se.ln();
            o[0] = (sy - lse) as f32;
            o[1] = if self.entropy {
                (se.ln() - sd / se) as f32
            } else {
                0.0
            };
        });
        Ok((CpuStorage::F32(out), Shape::from((n, 2))))
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, hd) = h.dims2()?;
        let g: Vec<f32> = grad_res.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
        let r: Vec<f32> = res.flatten_all()?.to_vec1()?;
        let op = LmHeadLogprobGradOp {
            fwd: self.clone(),
            grad: g,
            res: r,
        };
        let both = h.apply_op2_no_bwd(w, &op)?;
        let v = both.dim(0)? - n;
        Ok((
            Some(both.narrow(0, 0, n)?),
            Some(both.narrow(0, n, v)?.reshape((v, hd))?),
        ))
    }
}

/// The backward of [`LmHeadLogprobOp`]: `[N + V, H]`, rows `0..N` the gradient w.r.t. `h`,
/// rows `N..N+V` the gradient w.r.t. `W` (one allocation; the caller narrows it).
struct LmHeadLogprobGradOp {
    fwd: LmHeadLogprobOp,
    /// Upstream gradient `[N, 2]` (g_ℓ, g_H), row-major.
    grad: Vec<f32>,
    /// Forward output `[N, 2]` (ℓ_y, H), row-major.
    res: Vec<f32>,
}

impl candle_core::CustomOp2 for LmHeadLogprobGradOp {
    fn name(&self) -> &'static str {
        "lm-head-logprob-entropy-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (h, n, hd) = contiguous_f32(s1, l1, "hidden states")?;
        let (w, v, hd2) = contiguous_f32(s2, l2, "head weight")?;
        let f = &self.fwd;
        f.check(n, hd, v, hd2)?;
        let avx2 = has_avx2();
        // Per row: log-sum-exp of the scaled logits, recovered from the forward output as
        // lse = s_y − ℓ_y; the entropy; the upstream gradients (g_H dropped without entropy).
        let rows: Vec<[f32; 4]> = (0..n)
            .map(|i| {
                let y = f.targets[i] as usize;
                let hy = &h[i * hd..(i + 1) * hd];
                let wy = &w[y * hd..(y + 1) * hd];
                let dot: f64 = hy.iter().zip(wy).map(|(&a, &b)| a as f64 * b as f64).sum();
                let lse = (dot * f.inv_t as f64 - self.res[2 * i] as f64) as f32;
                let (gl, gh) = if f.entropy {
                    (self.grad[2 * i], self.grad[2 * i + 1])
                } else {
                    (self.grad[2 * i], 0.0)
                };
                [lse, gl, gh, self.res[2 * i + 1]]
            })
            .collect();
        let mut out = vec![0f32; (n + v) * hd];
        let (gh_out, gw_out) = out.split_at_mut(n * hd);
        let kept = f
            .stash
            .as_ref()
            .and_then(|s| s.take())
            .filter(|k| k.len() == n * v);
        // One vocabulary chunk: its logits (recomputed into scratch z, or its slot of the
        // stash) → ∂s in place; ∂W_c (+)= inv_t·Gᵀ·h_blk, acc[blk] += inv_t·G·W_c (∂z = inv_t·∂s).
        let chunk = |acc: &mut [f32], z: &mut [f32], c: usize, gw: &mut [f32], stashed: bool| {
            let c0 = c * VOCAB_CHUNK;
            let vc = gw.len() / hd;
            for r0 in (0..n).step_by(ROW_BLOCK) {
                let rb = ROW_BLOCK.min(n - r0);
                let z = if stashed {
                    &mut z[r0 * vc..]
                } else {
                    logits_block(z, h, w, hd, r0, rb, c0, vc, f.inv_t);
                    &mut *z
                };
                for i in 0..rb {
                    let [lse, gl, gh, ent] = rows[r0 + i];
                    let row = &mut z[i * vc..(i + 1) * vc];
                    chunk_grad(row, lse, gl, gh, ent, avx2);
                    let y = f.targets[r0 + i] as usize;
                    if (c0..c0 + vc).contains(&y) {
                        row[y - c0] += gl;
                    }
                }
                assert!(z.len() >= rb * vc && acc.len() == n * hd && gw.len() == vc * hd);
                // SAFETY: shapes and strides describe the buffers above (bounds asserted), which
                // do not overlap one another.
                unsafe {
                    sgemm(
                        vc,
                        hd,
                        rb,
                        gw.as_mut_ptr(),
                        hd,
                        r0 > 0,
                        z.as_ptr(),
                        1,
                        vc,
                        h.as_ptr().add(r0 * hd),
                        hd,
                        1,
                        f.inv_t,
                    );
                    sgemm(
                        rb,
                        hd,
                        vc,
                        acc.as_mut_ptr().add(r0 * hd),
                        hd,
                        true,
                        z.as_ptr(),
                        vc,
                        1,
                        w.as_ptr().add(c0 * hd),
                        hd,
                        1,
                        f.inv_t,
                    );
                }
            }
        };
        let sum = |mut a: Vec<f32>, b: Vec<f32>| {
            a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
            a
        };
        let gh_acc = match kept {
            Some(mut kept) => {
                let acc = gw_out
                    .par_chunks_mut(VOCAB_CHUNK * hd)
                    .zip(kept.par_chunks_mut(VOCAB_CHUNK * n))
                    .enumerate()
                    .fold(
                        || vec![0f32; n * hd],
                        |mut acc, (c, (gw, z))| {
                            chunk(&mut acc, z, c, gw, true);
                            acc
                        },
                    )
                    .reduce_with(sum);
                recycle_stash(kept);
                acc
            }
            None => gw_out
                .par_chunks_mut(VOCAB_CHUNK * hd)
                .enumerate()
                .fold(
                    || {
                        (
                            vec![0f32; n * hd],
                            vec![0f32; ROW_BLOCK.min(n) * VOCAB_CHUNK],
                        )
                    },
                    |(mut acc, mut z), (c, gw)| {
                        chunk(&mut acc, &mut z, c, gw, false);
                        (acc, z)
                    },
                )
                .map(|(acc, _)| acc)
                .reduce_with(sum),
        };
        if let Some(acc) = gh_acc {
            gh_out.copy_from_slice(&acc);
        }
        Ok((CpuStorage::F32(out), Shape::from((n + v, hd))))
    }
}
