//! Fused lm_head + log-softmax + gather (+ entropy) with a hand-written backward: per-token
//! log-probs of hidden states without ever holding the `[N, V]` logits.
//!
//! Determinism: every sum has an order fixed by the data. The forward's per-(chunk, row)
//! statistics land in their own slots and are merged per row in chunk order; the backward's
//! `∂W` chunks are disjoint, and its `∂h = Σ_c G_c·W_c` is summed over a fixed split of the
//! vocabulary chunks into [`dh_groups`] groups (each summed in chunk order by one task), whose
//! partial sums are then added in group order. So values and gradients are bit-identical whatever
//! the number of threads (tested at the Qwen2.5 vocabulary with 1, 2 and 4 threads).

use std::sync::Arc;

use candle_core::{CpuStorage, DType, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::exp::{chunk_grad, chunk_grad_softcap, chunk_stats, softcap_in_place};
use crate::gemm::{sgemm, MatRef};
use crate::storage::contiguous_f32_2d;

/// Vocabulary rows of `W` per task (one task computes the logits of these columns).
const VOCAB_CHUNK: usize = 256;
/// Hidden-state rows per block inside a task; a task's logits block is
/// `ROW_BLOCK × VOCAB_CHUNK` f32 (512 KiB), which stays in L2.
const ROW_BLOCK: usize = 512;
/// Most groups the backward's `∂h` sum is split into (see [`dh_groups`]).
const MAX_DH_GROUPS: usize = 16;
/// Memory the backward's per-group `∂h` partial sums may take together, bytes.
const DH_PARTIALS_BYTES: usize = 64 << 20;

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
/// embedding's other gradient. CPU, f32, contiguous inputs only; `rlvr_model::Model` uses
/// `lm_head` + `Model::logprobs_unfused` elsewhere (tested equal in value and gradient).
///
/// With a [`LogitStash`] the forward keeps the scaled logits (`N·V` f32) for the backward, which
/// then skips their recomputation (a third of the head's matmul work) at the cost of that memory.
///
/// With [`LmHeadLogprobOp::softcap`] (Gemma 2's final-logit softcapping, `cap = 30`) the logits
/// `z = h·Wᵀ` become `cap · tanh(z / cap)` before the temperature, as transformers' `Gemma2ForCausalLM`
/// does: the scaled logits are `s = (cap / T) · tanh(z / cap)` (by [`crate::exp::tanh_fast`]),
/// and the backward multiplies `∂L/∂s` by `1 − tanh²(z / cap)`, recovered from `s` itself (no
/// extra buffer: `tanh(z / cap) = s · T / cap`).
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
    /// Final-logit softcapping `cap` (> 0; Gemma 2's `final_logit_softcapping`): the logits become
    /// `cap · tanh(z / cap)` before the temperature. `None`: plain logits.
    pub softcap: Option<f32>,
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

/// The number of groups the backward splits the vocabulary chunks into for `∂h`: each group's
/// partial sum `[n, hd]` is one task's, so up to [`MAX_DH_GROUPS`] tasks run in parallel, with at
/// most [`DH_PARTIALS_BYTES`] of partial sums together. A function of the shapes only (never of
/// the thread count), so the summation order is too.
pub fn dh_groups(n: usize, hd: usize, nchunks: usize) -> usize {
    let per = n.saturating_mul(hd).saturating_mul(4).max(1);
    (DH_PARTIALS_BYTES / per)
        .clamp(1, MAX_DH_GROUPS)
        .min(nchunks.max(1))
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
        if let Some(cap) = self.softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
            candle_core::bail!(
                "LmHeadLogprobOp: final-logit softcap {cap} (must be finite and > 0)"
            );
        }
        Ok(())
    }

    /// The scaled target logit `s_y` in f64 from the dot product `z_y = h_y·W_y`.
    fn scaled(&self, z: f64) -> f64 {
        match self.softcap {
            None => z * self.inv_t as f64,
            Some(cap) => {
                let cap = cap as f64;
                cap * self.inv_t as f64 * (z / cap).tanh()
            }
        }
    }
}

/// Scaled logits of rows `r0..r0+rb` against vocabulary rows `c0..c0+vc` into `z` `[rb, vc]`:
/// `z·inv_t`, or with a final-logit `softcap` `(cap·inv_t)·tanh(z / cap)`.
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
    softcap: Option<f32>,
) {
    let lhs = MatRef {
        data: &h[r0 * hd..],
        rs: hd,
        cs: 1,
    };
    // Wᵀ's block: element (k, j) = W[c0 + j][k].
    let rhs = MatRef {
        data: &w[c0 * hd..],
        rs: 1,
        cs: hd,
    };
    match softcap {
        None => sgemm(rb, vc, hd, z, vc, false, lhs, rhs, inv_t),
        Some(cap) => {
            sgemm(rb, vc, hd, z, vc, false, lhs, rhs, 1.0);
            softcap_in_place(&mut z[..rb * vc], 1.0 / cap, cap * inv_t);
        }
    }
}

impl LmHeadLogprobOp {
    /// The backward op for the forward's result `res` and its gradient `grad_res` (both read to the
    /// host), computing `∂W` too when `weight_grad` (the full op) or only `∂h` (the frozen head).
    fn grad_op(
        &self,
        res: &Tensor,
        grad_res: &Tensor,
        weight_grad: bool,
    ) -> candle_core::Result<LmHeadLogprobGradOp> {
        Ok(LmHeadLogprobGradOp {
            fwd: self.clone(),
            grad: grad_res.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?,
            res: res.flatten_all()?.to_vec1()?,
            weight_grad,
        })
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
        let (h, n, hd) = contiguous_f32_2d(s1, l1, "LmHeadLogprobOp", "hidden states")?;
        let (w, v, hd2) = contiguous_f32_2d(s2, l2, "LmHeadLogprobOp", "head weight")?;
        self.check(n, hd, v, hd2)?;
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
                logits_block(z, h, w, hd, r0, rb, c0, vc, self.inv_t, self.softcap);
                for i in 0..rb {
                    let row = &z[i * vc..(i + 1) * vc];
                    let (m, se, sd) = chunk_stats(row, self.entropy);
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
        // Merge per row, chunks in order.
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
        let op = self.grad_op(res, grad_res, true)?;
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
    /// Compute `∂W` too (rows `N..N+V` of the output); false: the output is `∂h` `[N, H]` only.
    weight_grad: bool,
}

/// What one vocabulary chunk's backward reads: the inputs and each row's (lse, g_ℓ, g_H, H).
struct GradCtx<'a> {
    h: &'a [f32],
    w: &'a [f32],
    n: usize,
    v: usize,
    hd: usize,
    rows: &'a [[f32; 4]],
    targets: &'a [u32],
    inv_t: f32,
    softcap: Option<f32>,
}

impl GradCtx<'_> {
    /// Chunk `c`'s backward: its logits (recomputed into scratch `z`, or read from its slot of
    /// the stash when `stashed`) → ∂s in place; `gw` (this chunk's rows of ∂W; empty: no ∂W) =
    /// inv_t·Gᵀ·h and `acc` (∂h, `[n, hd]`) += inv_t·G·W_c, where ∂z = inv_t·∂s.
    fn chunk(&self, acc: &mut [f32], z: &mut [f32], c: usize, gw: &mut [f32], stashed: bool) {
        let (n, hd, inv_t) = (self.n, self.hd, self.inv_t);
        let c0 = c * VOCAB_CHUNK;
        let vc = VOCAB_CHUNK.min(self.v - c0);
        for r0 in (0..n).step_by(ROW_BLOCK) {
            let rb = ROW_BLOCK.min(n - r0);
            let z = if stashed {
                &mut z[r0 * vc..(r0 + rb) * vc]
            } else {
                logits_block(z, self.h, self.w, hd, r0, rb, c0, vc, inv_t, self.softcap);
                &mut z[..rb * vc]
            };
            for i in 0..rb {
                let [lse, gl, gh, ent] = self.rows[r0 + i];
                let row = &mut z[i * vc..(i + 1) * vc];
                let y = self.targets[r0 + i] as usize;
                let inside = (c0..c0 + vc).contains(&y);
                match self.softcap {
                    None => {
                        chunk_grad(row, lse, gl, gh, ent);
                        if inside {
                            row[y - c0] += gl;
                        }
                    }
                    Some(cap) => {
                        // ∂s/∂(z·inv_t) = 1 − tanh²(z / cap), tanh(z / cap) = s · inv_scale.
                        let inv_scale = 1.0 / (cap * inv_t);
                        let ty = if inside { row[y - c0] * inv_scale } else { 0.0 };
                        chunk_grad_softcap(row, lse, gl, gh, ent, inv_scale);
                        if inside {
                            row[y - c0] += gl * (1.0 - ty * ty);
                        }
                    }
                }
            }
            let z: &[f32] = z;
            if !gw.is_empty() {
                // ∂W_c[vc, hd] (+)= inv_t · Gᵀ[vc, rb] · h[rb, hd].
                let gt = MatRef {
                    data: z,
                    rs: 1,
                    cs: vc,
                };
                let hb = MatRef {
                    data: &self.h[r0 * hd..],
                    rs: hd,
                    cs: 1,
                };
                sgemm(vc, hd, rb, gw, hd, r0 > 0, gt, hb, inv_t);
            }
            // ∂h[rb, hd] += inv_t · G[rb, vc] · W_c[vc, hd].
            let g = MatRef {
                data: z,
                rs: vc,
                cs: 1,
            };
            let wc = MatRef {
                data: &self.w[c0 * hd..],
                rs: hd,
                cs: 1,
            };
            sgemm(rb, hd, vc, &mut acc[r0 * hd..], hd, true, g, wc, inv_t);
        }
    }
}

impl candle_core::CustomOp2 for LmHeadLogprobGradOp {
    fn name(&self) -> &'static str {
        "lm-head-logprob-entropy-grad"
    }

    // One function because per vocabulary chunk the forward is recomputed and both gradient
    // products are taken in one pass, which is what bounds memory to one chunk.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (h, n, hd) = contiguous_f32_2d(s1, l1, "LmHeadLogprobOp", "hidden states")?;
        let (w, v, hd2) = contiguous_f32_2d(s2, l2, "LmHeadLogprobOp", "head weight")?;
        let f = &self.fwd;
        f.check(n, hd, v, hd2)?;
        // Per row: log-sum-exp of the scaled logits, recovered from the forward output as
        // lse = s_y − ℓ_y; the entropy; the upstream gradients (g_H dropped without entropy).
        let rows: Vec<[f32; 4]> = (0..n)
            .map(|i| {
                let y = f.targets[i] as usize;
                let hy = &h[i * hd..(i + 1) * hd];
                let wy = &w[y * hd..(y + 1) * hd];
                let dot: f64 = hy.iter().zip(wy).map(|(&a, &b)| a as f64 * b as f64).sum();
                let lse = (f.scaled(dot) - self.res[2 * i] as f64) as f32;
                let (gl, gh) = if f.entropy {
                    (self.grad[2 * i], self.grad[2 * i + 1])
                } else {
                    (self.grad[2 * i], 0.0)
                };
                [lse, gl, gh, self.res[2 * i + 1]]
            })
            .collect();
        let ctx = GradCtx {
            h,
            w,
            n,
            v,
            hd,
            rows: &rows,
            targets: &f.targets,
            inv_t: f.inv_t,
            softcap: f.softcap,
        };
        let wrows = if self.weight_grad { v } else { 0 };
        let mut out = vec![0f32; (n + wrows) * hd];
        let (gh_out, gw_out) = out.split_at_mut(n * hd);
        let mut kept = f
            .stash
            .as_ref()
            .and_then(|s| s.take())
            .filter(|k| k.len() == n * v);
        // A fixed split of the chunks into groups (see `dh_groups`): group g owns chunks
        // [g·per, (g+1)·per), its rows of ∂W, its slots of the stash and its own ∂h partial sum.
        // Without ∂W each group gets an empty ∂W slice (the ∂h sums are the same).
        let nchunks = v.div_ceil(VOCAB_CHUNK);
        let per = nchunks.div_ceil(dh_groups(n, hd, nchunks));
        let ngroups = nchunks.div_ceil(per);
        let gw_groups: Vec<&mut [f32]> = if self.weight_grad {
            gw_out.chunks_mut(per * VOCAB_CHUNK * hd).collect()
        } else {
            (0..ngroups).map(|_| <&mut [f32]>::default()).collect()
        };
        // Chunk i of a group's ∂W rows (empty without ∂W).
        let chunk_gw = |total: usize, i: usize| -> std::ops::Range<usize> {
            let len = VOCAB_CHUNK * hd;
            (i * len).min(total)..((i + 1) * len).min(total)
        };
        let in_group = |g: usize| (g * per..((g + 1) * per).min(nchunks)).enumerate();
        let mut partials: Vec<Vec<f32>> = Vec::new();
        match kept.as_mut() {
            Some(kept) => gw_groups
                .into_par_iter()
                .zip(kept.par_chunks_mut(per * VOCAB_CHUNK * n))
                .enumerate()
                .map(|(g, (gw, z))| {
                    let mut acc = vec![0f32; n * hd];
                    let mut zs = z.chunks_mut(VOCAB_CHUNK * n);
                    for (i, c) in in_group(g) {
                        let z = zs.next().expect("one stash slot per chunk");
                        let r = chunk_gw(gw.len(), i);
                        ctx.chunk(&mut acc, z, c, &mut gw[r], true);
                    }
                    acc
                })
                .collect_into_vec(&mut partials),
            None => gw_groups
                .into_par_iter()
                .enumerate()
                .map(|(g, gw)| {
                    let mut acc = vec![0f32; n * hd];
                    let mut z = vec![0f32; ROW_BLOCK.min(n) * VOCAB_CHUNK];
                    for (i, c) in in_group(g) {
                        let r = chunk_gw(gw.len(), i);
                        ctx.chunk(&mut acc, &mut z, c, &mut gw[r], false);
                    }
                    acc
                })
                .collect_into_vec(&mut partials),
        }
        if let Some(kept) = kept {
            recycle_stash(kept);
        }
        // ∂h: the groups' partial sums added in group order.
        for p in &partials {
            gh_out.iter_mut().zip(p).for_each(|(x, y)| *x += y);
        }
        Ok((CpuStorage::F32(out), Shape::from((n + wrows, hd))))
    }
}

/// [`LmHeadLogprobOp`] over a frozen head weight: the same forward (bit-identical values), and a
/// backward that gives `∂h` only (bit-identical to [`LmHeadLogprobOp`]'s: the same chunk groups,
/// summed in the same order) and computes no `∂W` (a third of the head's backward matmul work,
/// and no `[V, H]` gradient). For LoRA training, where the lm_head is not trained.
#[derive(Clone)]
pub struct FrozenHeadLogprobOp(pub LmHeadLogprobOp);

impl candle_core::CustomOp2 for FrozenHeadLogprobOp {
    fn name(&self) -> &'static str {
        "lm-head-logprob-entropy-frozen-head"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.0.cpu_fwd(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let op = self.0.grad_op(res, grad_res, false)?;
        Ok((Some(h.apply_op2_no_bwd(w, &op)?), None))
    }
}
