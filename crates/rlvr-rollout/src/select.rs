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

/// f32 lanes of the vectorised passes (two AVX2 registers, one AVX-512 register).
const LANES: usize = 16;

/// `max_i x_i · inv_t` (NaN never wins), in [`LANES`] independent lanes the compiler vectorises.
fn scaled_max(x: &[f32], inv_t: f32) -> f32 {
    #[inline(always)]
    fn body(x: &[f32], inv_t: f32) -> f32 {
        let mut mx = [f32::NEG_INFINITY; LANES];
        let it = x.chunks_exact(LANES);
        let rem = it.remainder();
        for c in it {
            for l in 0..LANES {
                let y = c[l] * inv_t;
                if y > mx[l] {
                    mx[l] = y;
                }
            }
        }
        let m = rem.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v * inv_t));
        mx.iter().fold(m, |a, &v| a.max(v))
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(x: &[f32], inv_t: f32) -> f32 {
        body(x, inv_t)
    }
    #[cfg(target_arch = "x86_64")]
    if rlvr_model::fused::has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2(x, inv_t) };
    }
    body(x, inv_t)
}

/// Fills `scratch.weights` with `exp(x_i · inv_t − m)` (by [`rlvr_model::fused::exp_fast`], the
/// trainer's exp) and `scratch.block_sums` with the f64 sum of each [`BLOCK`]; returns the total.
/// Within a block the sum runs in [`LANES`] f32 lanes of 64 terms each (relative error ~1e-7).
fn weights(x: &[f32], inv_t: f32, m: f32, scratch: &mut Scratch) -> f64 {
    #[inline(always)]
    fn body(x: &[f32], inv_t: f32, m: f32, w: &mut [f32], sums: &mut [f64]) {
        for ((xb, wb), s) in x
            .chunks(BLOCK)
            .zip(w.chunks_mut(BLOCK))
            .zip(sums.iter_mut())
        {
            let mut acc = [0f32; LANES];
            let mut xi = xb.chunks_exact(LANES);
            let mut wi = wb.chunks_exact_mut(LANES);
            for (xc, wc) in (&mut xi).zip(&mut wi) {
                for l in 0..LANES {
                    let e = rlvr_model::fused::exp_fast(xc[l] * inv_t - m);
                    wc[l] = e;
                    acc[l] += e;
                }
            }
            let mut tail = 0f32;
            for (&xv, wv) in xi.remainder().iter().zip(wi.into_remainder()) {
                let e = rlvr_model::fused::exp_fast(xv * inv_t - m);
                *wv = e;
                tail += e;
            }
            *s = acc.iter().map(|&a| a as f64).sum::<f64>() + tail as f64;
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(x: &[f32], inv_t: f32, m: f32, w: &mut [f32], sums: &mut [f64]) {
        body(x, inv_t, m, w, sums)
    }
    let (w, sums) = (&mut scratch.weights, &mut scratch.block_sums);
    w.clear();
    w.resize(x.len(), 0.0);
    sums.clear();
    sums.resize(x.len().div_ceil(BLOCK), 0.0);
    #[cfg(target_arch = "x86_64")]
    if rlvr_model::fused::has_avx2() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { avx2(x, inv_t, m, w, sums) };
        return sums.iter().sum();
    }
    body(x, inv_t, m, w, sums);
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
mod tests {
    use super::*;

    /// Reference nucleus by full sort: smallest prefix of the descending order with mass ≥ need.
    fn nucleus_by_sort(w: &[f32], need: f64) -> usize {
        let mut s: Vec<f32> = w.to_vec();
        s.sort_by(|a, b| b.total_cmp(a));
        let mut acc = 0.0;
        for (i, &x) in s.iter().enumerate() {
            acc += x as f64;
            if acc >= need {
                return i + 1;
            }
        }
        s.len()
    }

    fn check_nucleus(w: &[f32], top_p: f64) {
        let total: f64 = w.iter().map(|&x| x as f64).sum();
        let mut idx: Vec<u32> = (0..w.len() as u32).collect();
        let n = nucleus(&mut idx, w, top_p * total);
        assert_eq!(n, nucleus_by_sort(w, top_p * total), "size, top_p {top_p}");
        // The kept set is the n heaviest: its lightest ≥ the heaviest dropped.
        let min_kept = idx[..n]
            .iter()
            .map(|&i| w[i as usize])
            .fold(f32::MAX, f32::min);
        let max_dropped = idx[n..].iter().map(|&i| w[i as usize]).fold(0.0, f32::max);
        assert!(min_kept >= max_dropped);
    }

    #[test]
    fn nucleus_matches_a_full_sort() {
        let mut s = 12345u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        };
        for len in [1usize, 2, 3, 10, 1000] {
            let w: Vec<f32> = (0..len).map(|_| rnd()).collect();
            // Many ties: a coarse grid.
            let ties: Vec<f32> = w.iter().map(|x| (x * 4.0).floor() / 4.0 + 0.01).collect();
            for p in [1e-9, 0.1, 0.5, 0.9, 0.999, 1.0] {
                check_nucleus(&w, p);
                check_nucleus(&ties, p);
            }
        }
        // A peaked row keeps one token.
        check_nucleus(&[100.0, 1e-3, 1e-3, 1e-4], 0.9);
    }

    #[test]
    fn histogram_nucleus_keeps_the_sorted_nucleus() {
        let mut s = 99u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32
        };
        for len in [1usize, 5, 300, 5000] {
            // Near-uniform and peaked rows; weights in (0, 1] with max 1 as `choose` makes them.
            for spread in [0.1f32, 3.0, 20.0] {
                let y: Vec<f32> = (0..len).map(|_| rnd() * spread).collect();
                let m = y.iter().cloned().fold(f32::MIN, f32::max);
                let w: Vec<f32> = y.iter().map(|v| (v - m).exp()).collect();
                let total: f64 = w.iter().map(|&x| x as f64).sum();
                for p in [0.05, 0.5, 0.9, 0.99] {
                    let size = nucleus_by_sort(&w, p * total);
                    let mut sorted = w.clone();
                    sorted.sort_by(|a, b| b.total_cmp(a));
                    let lightest_kept = sorted[size - 1];
                    let (mut mass, mut idx) = (vec![], vec![]);
                    let mut seen = std::collections::HashSet::new();
                    for i in 0..400 {
                        let u = (i as f64 + 0.5) / 400.0;
                        let t = nucleus_sample(&w, p * total, u, &mut mass, &mut idx);
                        assert!(
                            w[t] >= lightest_kept,
                            "len {len} p {p}: drew a dropped token"
                        );
                        seen.insert(t);
                    }
                    assert!(seen.len() <= size);
                    if size <= 50 {
                        assert!(
                            seen.len() * 10 >= size * 7,
                            "len {len} p {p}: support too small"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn greedy_takes_first_max_and_logprob_at_t1() {
        let x = [1.0f32, 3.0, 3.0, -2.0];
        let sel = Selection {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
        };
        let c = choose(&x, &sel, 0.5, &[], &mut Scratch::default());
        assert_eq!(c.token, 1);
        let z: f64 = x.iter().map(|&v| (v as f64).exp()).sum();
        assert!((c.logprob as f64 - (3.0 - z.ln())).abs() < 1e-6);
    }

    #[test]
    fn logprob_uses_temperature_over_the_full_vocabulary() {
        let x = [0.5f32, 2.0, -1.0, 1.5];
        for (t, k, p) in [(0.7, None, 1.0), (1.3, Some(2), 1.0), (1.0, None, 0.5)] {
            let sel = Selection {
                temperature: t,
                top_k: k,
                top_p: p,
            };
            for u in [0.0, 0.3, 0.99] {
                let c = choose(&x, &sel, u, &[], &mut Scratch::default());
                let z: f64 = x.iter().map(|&v| (v as f64 / t).exp()).sum();
                let want = x[c.token as usize] as f64 / t - z.ln();
                assert!((c.logprob as f64 - want).abs() < 1e-6, "{t} {k:?} {p}");
            }
        }
    }

    #[test]
    fn truncation_restricts_the_support() {
        let x = [0.0f32, 5.0, 4.0, 1.0, 4.5];
        let mut sc = Scratch::default();
        let top2 = Selection {
            temperature: 1.0,
            top_k: Some(2),
            top_p: 1.0,
        };
        let nuc = Selection {
            temperature: 1.0,
            top_k: None,
            top_p: 0.5,
        };
        for i in 0..100 {
            let u = i as f64 / 100.0;
            assert!([1, 4].contains(&choose(&x, &top2, u, &[], &mut sc).token));
            // p(5.0) ≈ 0.51 alone reaches 0.5.
            assert_eq!(choose(&x, &nuc, u, &[], &mut sc).token, 1);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        // u on a fine grid maps to tokens in proportion to their probabilities.
        let x = [0.0f32, (2.0f32).ln(), (3.0f32).ln()];
        let sel = Selection {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
        };
        let mut counts = [0usize; 3];
        let n = 6000;
        for i in 0..n {
            let c = choose(
                &x,
                &sel,
                (i as f64 + 0.5) / n as f64,
                &[],
                &mut Scratch::default(),
            );
            counts[c.token as usize] += 1;
        }
        assert_eq!(counts, [1000, 2000, 3000]);
    }

    /// A row of 5000 logits (several blocks, a partial last one): the drawn token's interval of
    /// the exact (f64) cumulative distribution holds u, up to the f32 weights' rounding, and the
    /// log-prob equals the f64 log-softmax; the same for greedy.
    #[test]
    fn block_walk_draws_by_the_exact_cumulative_distribution() {
        let v = 5000;
        let x: Vec<f32> = (0..v)
            .map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 6.0)
            .collect();
        let t = 0.8f64;
        let p: Vec<f64> = x.iter().map(|&a| (a as f64 / t).exp()).collect();
        let z: f64 = p.iter().sum();
        let cdf: Vec<f64> = p
            .iter()
            .scan(0.0, |c, &q| {
                *c += q / z;
                Some(*c)
            })
            .collect();
        let sel = Selection {
            temperature: t,
            top_k: None,
            top_p: 1.0,
        };
        let mut sc = Scratch::default();
        for i in 0..400 {
            let u = (i as f64 + 0.37) / 400.0;
            let c = choose(&x, &sel, u, &[], &mut sc);
            let k = c.token as usize;
            let lo = if k == 0 { 0.0 } else { cdf[k - 1] };
            assert!(
                lo - 1e-5 <= u && u <= cdf[k] + 1e-5,
                "u {u}: token {k} [{lo}, {}]",
                cdf[k]
            );
            let want = (p[k] / z).ln();
            assert!(
                (c.logprob as f64 - want).abs() < 1e-5,
                "{} vs {want}",
                c.logprob
            );
        }
        let g = choose(
            &x,
            &Selection {
                temperature: 0.0,
                ..sel
            },
            0.0,
            &[],
            &mut sc,
        );
        assert_eq!(g.token as usize, argmax(&x).0);
    }

    /// Weights 1:2:3 with id 2 banned: draws split 1:2 over ids 0 and 1 (uniform grid of u), and
    /// the log-prob stays that of the full distribution: ln(1/6) and ln(2/6). Greedy skips the
    /// banned maximum; top-p is measured on the renormalised rest (0.9 of {1/3, 2/3} needs both).
    #[test]
    fn banned_ids_are_never_drawn_and_keep_full_logprobs() {
        let x = [0.0f32, (2.0f32).ln(), (3.0f32).ln()];
        let mut sel = Selection {
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
        };
        let mut counts = [0usize; 3];
        let n = 3000;
        for i in 0..n {
            let u = (i as f64 + 0.5) / n as f64;
            let c = choose(&x, &sel, u, &[2], &mut Scratch::default());
            counts[c.token as usize] += 1;
            let want = [(1.0f64 / 6.0).ln(), (2.0f64 / 6.0).ln()][c.token as usize];
            assert!((c.logprob as f64 - want).abs() < 1e-6, "{c:?}");
        }
        assert_eq!(counts, [1000, 2000, 0]);
        sel.top_p = 0.9;
        let mut seen = [false; 3];
        for i in 0..100 {
            let c = choose(&x, &sel, i as f64 / 100.0, &[2], &mut Scratch::default());
            seen[c.token as usize] = true;
        }
        assert_eq!(seen, [true, true, false]);
        sel.temperature = 0.0;
        let c = choose(&x, &sel, 0.0, &[2], &mut Scratch::default());
        assert_eq!(c.token, 1);
        assert!((c.logprob as f64 - (2.0f64 / 6.0).ln()).abs() < 1e-6);
    }
}
