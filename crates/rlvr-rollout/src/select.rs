//! Choosing the next token from one row of logits: greedy, temperature, top-k and top-p
//! (nucleus) sampling, and the behaviour log-prob of the chosen token.
//!
//! Top-k and top-p use partial selection, never a full vocabulary sort: top-k is one
//! `select_nth_unstable` (expected O(V)), and the nucleus is found by a mass-guided three-way
//! quickselect (expected O(V)) that keeps the heaviest tokens until their mass reaches `top_p`.
//! That matters for near-uniform distributions (a fresh model), whose nucleus is most of the
//! vocabulary: a sort there cost about 30% of decode time (DESIGN.md section 7).
//!
//! Order of operations follows transformers' `generate` warpers: temperature, then top-k, then
//! top-p measured on the renormalised top-k distribution.

/// The token chosen for one row and its behaviour log-prob.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// The sampled (or greedy) token id.
    pub token: u32,
    /// `log_softmax(logits / T)[token]` over the FULL vocabulary (DESIGN.md section 3), in nats,
    /// whatever top-k/top-p truncation was used to draw the token. For greedy (T = 0) it is taken
    /// at T = 1, i.e. `log_softmax(logits)[token]`.
    pub logprob: f32,
}

/// How to pick a token; see [`crate::SamplingParams`] for the meaning of each field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selection {
    /// 0 = greedy; otherwise logits are divided by it.
    pub temperature: f64,
    /// Keep the k most likely tokens; `None` = off.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens with mass ≥ `top_p`; 1 = off.
    pub top_p: f64,
}

/// Reusable buffers, so that a decode step allocates nothing per row.
#[derive(Default)]
pub struct Scratch {
    weights: Vec<f32>,
    block_sums: Vec<f64>,
    idx: Vec<u32>,
    mass: Vec<f64>,
}

/// Picks a token from `logits` (`[V]`, f32, one row) with the uniform draw `u` ∈ [0, 1).
///
/// Greedy ties go to the lowest id (as an argmax that keeps the first maximum). Sampling walks the
/// kept tokens accumulating `exp(logit/T − max)` until it passes `u · total`; the walk order is
/// deterministic, so the same logits and `u` give the same token.
///
/// `banned` ids (the stop ids while `rollout.min_new_tokens` is unmet) are never chosen: their
/// weight is removed before top-k/top-p, as transformers' `MinNewTokensLengthLogitsProcessor` sets
/// their logits to −inf before the warpers. The returned log-prob is still taken over the full,
/// unmasked distribution, like the top-k/top-p truncation, so that it equals the trainer's
/// recomputed log-prob. Ids outside the vocabulary are ignored.
///
/// Panics if `logits` is empty (the engine never passes an empty row).
pub fn choose(
    logits: &[f32],
    sel: &Selection,
    u: f64,
    banned: &[u32],
    scratch: &mut Scratch,
) -> Choice {
    assert!(!logits.is_empty(), "choose: empty logits row");
    let v = logits.len();
    let is_banned = |i: usize| !banned.is_empty() && banned.contains(&(i as u32));
    if sel.temperature == 0.0 {
        let best = if banned.is_empty() {
            argmax(logits).0
        } else {
            let mut best = 0;
            let mut bv = f32::NEG_INFINITY;
            for (i, &x) in logits.iter().enumerate() {
                if x > bv && !is_banned(i) {
                    bv = x;
                    best = i;
                }
            }
            best
        };
        let lp = log_softmax_at(logits, 1.0, best, scratch);
        return Choice {
            token: best as u32,
            logprob: lp,
        };
    }
    let inv_t = (1.0 / sel.temperature) as f32;
    // Scaled logits y = x · (1/T) in f32, as the trainer's `logits / T`; weights e = exp(y − max).
    let m = scaled_max(logits, inv_t);
    let total = weights(logits, inv_t, m, scratch);
    let (w, sums) = (&mut scratch.weights, &mut scratch.block_sums);
    // The draw's support: banned weights removed (the log-prob keeps the full `total`).
    let mut draw_total = total;
    for &b in banned {
        if let Some(e) = w.get_mut(b as usize) {
            draw_total -= *e as f64;
            sums[b as usize / BLOCK] -= *e as f64;
            *e = 0.0;
        }
    }
    let k = sel.top_k.filter(|&k| k > 0 && k < v);
    let token = if k.is_none() && sel.top_p >= 1.0 {
        walk_blocks(w, sums, u * draw_total)
    } else if k.is_none() {
        nucleus_sample(
            w,
            sel.top_p * draw_total,
            u,
            &mut scratch.mass,
            &mut scratch.idx,
        )
    } else {
        let idx = &mut scratch.idx;
        idx.clear();
        idx.extend(0..v as u32);
        let mut n = v;
        if let Some(k) = k {
            // Heaviest k first (unordered); ties broken by id for determinism.
            idx.select_nth_unstable_by(k - 1, |&a, &b| {
                w[b as usize].total_cmp(&w[a as usize]).then(a.cmp(&b))
            });
            n = k;
        }
        if sel.top_p < 1.0 {
            let mass: f64 = idx[..n].iter().map(|&i| w[i as usize] as f64).sum();
            n = nucleus(&mut idx[..n], w, sel.top_p * mass);
        }
        let kept: f64 = idx[..n].iter().map(|&i| w[i as usize] as f64).sum();
        walk(w, idx[..n].iter().map(|&i| i as usize), u * kept)
    };
    let y = logits[token] * inv_t;
    Choice {
        token: token as u32,
        logprob: ((y - m) as f64 - total.ln()) as f32,
    }
}

/// First index of the maximum (NaN never wins) and the maximum.
pub fn argmax(x: &[f32]) -> (usize, f32) {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    (best, bv)
}

/// `log_softmax(x / t)[at]` over the whole row (block sums in f64, see [`choose`]).
pub fn log_softmax_at(x: &[f32], t: f64, at: usize, scratch: &mut Scratch) -> f32 {
    let inv_t = (1.0 / t) as f32;
    let m = scaled_max(x, inv_t);
    let total = weights(x, inv_t, m, scratch);
    ((x[at] * inv_t - m) as f64 - total.ln()) as f32
}

/// Tokens per block of [`weights`]' partial sums: the walk of a full-vocabulary draw skips whole
/// blocks by their sums and walks one block token by token.
pub(crate) const BLOCK: usize = 1024;

/// `max_i x_i · inv_t` (NaN never wins), vectorised (`rlvr_kernels::exp::scaled_max`).
fn scaled_max(x: &[f32], inv_t: f32) -> f32 {
    rlvr_kernels::exp::scaled_max(x, inv_t)
}

/// Fills `scratch.weights` with `exp(x_i · inv_t − m)` (by `rlvr_kernels::exp::exp_fast`, the
/// trainer's exp) and `scratch.block_sums` with the f64 sum of each [`BLOCK`]; returns the total.
/// Within a block the sum runs in 16 f32 lanes of 64 terms each (relative error ~1e-7).
fn weights(x: &[f32], inv_t: f32, m: f32, scratch: &mut Scratch) -> f64 {
    let (w, sums) = (&mut scratch.weights, &mut scratch.block_sums);
    w.clear();
    w.resize(x.len(), 0.0);
    sums.clear();
    sums.resize(x.len().div_ceil(BLOCK), 0.0);
    rlvr_kernels::exp::exp_block_sums(x, inv_t, m, BLOCK, w, sums);
    sums.iter().sum()
}

/// [`walk`] over the whole row in id order, skipping whole blocks by their `sums` (of `w`, per
/// [`BLOCK`]). Returns the first index whose running sum exceeds `target`, or the last token with
/// weight when rounding leaves the target unreached.
fn walk_blocks(w: &[f32], sums: &[f64], target: f64) -> usize {
    let (b, before) = pick_block(sums.iter().copied(), target);
    let lo = b * BLOCK;
    walk(w, lo..(lo + BLOCK).min(w.len()), target - before)
}

/// The block a draw falls in, from the blocks' weight sums in order: the first whose running sum
/// exceeds `target`, with the sum of the blocks before it. When rounding leaves the target
/// unreached, the last block with weight (whose [`walk`] then ends on its last token with
/// weight); `(0, 0)` when no block has weight. Shared by the host path and
/// [`crate::device_select`].
pub(crate) fn pick_block(sums: impl Iterator<Item = f64>, target: f64) -> (usize, f64) {
    let (mut acc, mut last) = (0.0f64, None);
    for (b, s) in sums.enumerate() {
        if s <= 0.0 {
            continue;
        }
        if acc + s > target {
            return (b, acc);
        }
        last = Some((b, acc));
        acc += s;
    }
    last.unwrap_or((0, 0.0))
}

/// Walks `order`, accumulating `w`, and returns the first index whose running sum exceeds
/// `target`; the last index when rounding leaves the target unreached.
pub(crate) fn walk(w: &[f32], order: impl Iterator<Item = usize>, target: f64) -> usize {
    let mut acc = 0.0f64;
    let mut last = 0;
    for i in order {
        let e = w[i] as f64;
        if e <= 0.0 {
            continue;
        }
        acc += e;
        last = i;
        if acc > target {
            return i;
        }
    }
    last
}

/// Histogram bucket of a weight in [0, 1]: the top 13 bits of its f32 pattern (exponent and 4
/// mantissa bits). For non-negative floats the bit pattern is monotonic, so a heavier bucket
/// holds only heavier weights. 1.0 falls in bucket 2032.
#[inline(always)]
fn bucket(e: f32) -> usize {
    (e.to_bits() >> 19) as usize
}

const BUCKETS: usize = 2033;

/// Draws from the nucleus of the whole row (no top-k) without sorting: one pass builds the mass
/// of each [`bucket`]; scanning buckets from the heaviest finds the boundary bucket where the
/// running mass reaches `need`; every token in a heavier bucket is kept, and the boundary bucket
/// (a few per cent of the vocabulary at most) is resolved exactly by [`nucleus`]. The draw walks
/// the kept tokens in id order, then the kept boundary tokens. Same kept set as a sort.
fn nucleus_sample(w: &[f32], need: f64, u: f64, mass: &mut Vec<f64>, idx: &mut Vec<u32>) -> usize {
    mass.clear();
    mass.resize(BUCKETS, 0.0);
    for &e in w {
        mass[bucket(e).min(BUCKETS - 1)] += e as f64;
    }
    let mut acc = 0.0;
    let mut boundary = 0;
    for b in (0..BUCKETS).rev() {
        if mass[b] > 0.0 && acc + mass[b] >= need {
            boundary = b;
            break;
        }
        acc += mass[b];
    }
    idx.clear();
    idx.extend(
        w.iter()
            .enumerate()
            .filter(|(_, &e)| bucket(e).min(BUCKETS - 1) == boundary)
            .map(|(i, _)| i as u32),
    );
    let n = if idx.is_empty() {
        0
    } else {
        nucleus(idx, w, need - acc)
    };
    let kept_boundary: f64 = idx[..n].iter().map(|&i| w[i as usize] as f64).sum();
    let target = u * (acc + kept_boundary);
    let heavier = w
        .iter()
        .enumerate()
        .filter(|(_, &e)| bucket(e).min(BUCKETS - 1) > boundary)
        .map(|(i, _)| i);
    walk(
        w,
        heavier.chain(idx[..n].iter().map(|&i| i as usize)),
        target,
    )
}

/// Reorders `idx` so that `idx[..n]` is the nucleus and returns n ≥ 1: the smallest set of the
/// heaviest tokens (by `w`) whose total weight reaches `need`. Among equal weights at the
/// boundary the order left by the partition decides (deterministic for equal inputs).
///
/// A three-way quickselect guided by mass: partition around a pivot into heavier / equal /
/// lighter; if the heavier part alone reaches `need`, recurse into it; otherwise keep it, take
/// equal-weight tokens as needed, and recurse into the lighter part with the remaining need.
/// Expected O(len) time.
pub fn nucleus(idx: &mut [u32], w: &[f32], need: f64) -> usize {
    let (mut lo, mut hi) = (0usize, idx.len());
    let mut need = need;
    while hi - lo > 1 {
        let p = w[idx[lo + (hi - lo) / 2] as usize];
        // Dutch national flag: [lo, gt) > p, [gt, i) == p, [lt, hi) < p.
        let (mut gt, mut i, mut lt) = (lo, lo, hi);
        while i < lt {
            let x = w[idx[i] as usize];
            if x > p {
                idx.swap(gt, i);
                gt += 1;
                i += 1;
            } else if x < p {
                lt -= 1;
                idx.swap(i, lt);
            } else {
                i += 1;
            }
        }
        let mass_gt: f64 = idx[lo..gt].iter().map(|&j| w[j as usize] as f64).sum();
        if mass_gt >= need && gt > lo {
            hi = gt;
            continue;
        }
        need -= mass_gt;
        let n_eq = lt - gt;
        let m_eq = p as f64 * n_eq as f64;
        if m_eq >= need {
            let take = if p > 0.0 {
                ((need / p as f64).ceil() as usize).clamp(1, n_eq)
            } else {
                1
            };
            return gt + take;
        }
        need -= m_eq;
        if lt == hi {
            return hi; // everything kept (rounding left some need)
        }
        lo = lt;
    }
    hi.max(1)
}

#[cfg(test)]
#[path = "select_tests.rs"]
mod tests;
