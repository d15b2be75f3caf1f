//! Vectorised `exp` and the per-row pieces of a softmax over a chunk of logits, shared by the
//! fused lm_head (its forward statistics and its backward) and the sampler's token selection, so
//! both sides' softmax weights come from the same function.
//!
//! The bodies are plain Rust in [`LANES`] independent f32 lanes that the compiler vectorises;
//! where the CPU has AVX2 and FMA ([`crate::cpu::has_avx2`]) the same body is compiled with those
//! features enabled. The lane order is the same either way, so results are identical.

/// f32 lanes of the vectorised loops (two AVX2 registers, one AVX-512 register).
pub const LANES: usize = 16;

/// `exp(x)` for f32 in straight-line code the compiler vectorises: Cephes' range reduction and
/// degree-6 polynomial (max relative error ≈ 2 ulp on the clamped range); inputs are clamped to
/// [−87.3, 88.3], so tiny results are ~1e-38 rather than 0.
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

/// Runs `$body` compiled with AVX2+FMA when the CPU has them, else as plain code.
macro_rules! dispatch_avx2 {
    (fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $body:ident) => {
        fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                if crate::cpu::has_avx2() {
                    // SAFETY: the CPU supports AVX2 and FMA (checked just above); the body is
                    // safe Rust, only compiled with those features enabled.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

/// (max s, Σ exp(s − max), Σ exp(s − max)·(s − max)) over one row chunk of scaled logits; the
/// third is 0 without `entropy`.
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

dispatch_avx2!(fn chunk_stats_dispatch(s: &[f32], entropy: bool) -> (f32, f32, f32) = chunk_stats_body);
dispatch_avx2!(fn chunk_grad_dispatch(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32) -> () = chunk_grad_body);

/// (max s, Σ exp(s − max), Σ exp(s − max)·(s − max)) over a row chunk `s` of scaled logits
/// (the third 0 without `entropy`), by [`exp_fast`] in [`LANES`] lanes.
pub fn chunk_stats(s: &[f32], entropy: bool) -> (f32, f32, f32) {
    chunk_stats_dispatch(s, entropy)
}

/// In place on a row chunk of scaled logits `s`: s → ∂L/∂s = −g_ℓ·p − g_H·p·(log p + H) with
/// p = exp(s − lse) (the target's +g_ℓ is left to the caller).
pub fn chunk_grad(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32) {
    chunk_grad_dispatch(s, lse, gl, gh, h)
}

/// `max_i x_i · inv_t` (NaN never wins), in [`LANES`] lanes.
pub fn scaled_max(x: &[f32], inv_t: f32) -> f32 {
    scaled_max_dispatch(x, inv_t)
}

#[inline(always)]
fn scaled_max_body(x: &[f32], inv_t: f32) -> f32 {
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

dispatch_avx2!(fn scaled_max_dispatch(x: &[f32], inv_t: f32) -> f32 = scaled_max_body);

/// Softmax weights by blocks: `w[i] = exp(x_i · inv_t − m)` (by [`exp_fast`]) and `sums[b]` the
/// f64 sum of block b's weights, blocks of `block` entries (`w.len() == x.len()`,
/// `sums.len() == x.len().div_ceil(block)`). Within a block the sum runs in [`LANES`] f32 lanes
/// (relative error ~1e-7 for blocks of 1024).
///
/// Panics when the lengths disagree.
pub fn exp_block_sums(
    x: &[f32],
    inv_t: f32,
    m: f32,
    block: usize,
    w: &mut [f32],
    sums: &mut [f64],
) {
    assert!(w.len() == x.len() && sums.len() == x.len().div_ceil(block));
    exp_block_sums_dispatch(x, inv_t, m, block, w, sums)
}

#[inline(always)]
fn exp_block_sums_body(
    x: &[f32],
    inv_t: f32,
    m: f32,
    block: usize,
    w: &mut [f32],
    sums: &mut [f64],
) {
    for ((xb, wb), s) in x
        .chunks(block)
        .zip(w.chunks_mut(block))
        .zip(sums.iter_mut())
    {
        let mut acc = [0f32; LANES];
        let mut xi = xb.chunks_exact(LANES);
        let mut wi = wb.chunks_exact_mut(LANES);
        for (xc, wc) in (&mut xi).zip(&mut wi) {
            for l in 0..LANES {
                let e = exp_fast(xc[l] * inv_t - m);
                wc[l] = e;
                acc[l] += e;
            }
        }
        let mut tail = 0f32;
        for (&xv, wv) in xi.remainder().iter().zip(wi.into_remainder()) {
            let e = exp_fast(xv * inv_t - m);
            *wv = e;
            tail += e;
        }
        *s = acc.iter().map(|&a| a as f64).sum::<f64>() + tail as f64;
    }
}

dispatch_avx2!(fn exp_block_sums_dispatch(x: &[f32], inv_t: f32, m: f32, block: usize, w: &mut [f32], sums: &mut [f64]) -> () = exp_block_sums_body);

/// `tanh(x)` for f32 in straight-line code the compiler vectorises: `sign(x)·(1 − e)/(1 + e)` with
/// `e = exp(−2|x|)` by [`exp_fast`]. Absolute error ≤ 2e-7 over the whole line (the subtraction
/// `1 − e` makes the *relative* error near 0 larger than `f32::tanh`'s; softcapped logits are
/// then off by at most `cap · 2e-7`, the order of f32's own rounding of a logit near `cap`);
/// exactly ±1 for |x| ≥ 43.6 (where `exp_fast` clamps).
#[inline(always)]
pub fn tanh_fast(x: f32) -> f32 {
    let a = if x < 0.0 { -x } else { x };
    let e = exp_fast(-2.0 * a);
    let t = (1.0 - e) / (1.0 + e);
    if x < 0.0 {
        -t
    } else {
        t
    }
}

/// Final-logit softcapping in place (Gemma 2, `cap · tanh(z / cap)`; Team Gemma, "Gemma 2", arXiv
/// 2408.00118, §2): `z ← scale · tanh(z · inv_cap)`, where the caller folds the temperature into
/// `scale = cap / T` and `inv_cap = 1 / cap`. By [`tanh_fast`] in [`LANES`] lanes.
pub fn softcap_in_place(z: &mut [f32], inv_cap: f32, scale: f32) {
    softcap_dispatch(z, inv_cap, scale)
}

#[inline(always)]
fn softcap_body(z: &mut [f32], inv_cap: f32, scale: f32) {
    for x in z.iter_mut() {
        *x = scale * tanh_fast(*x * inv_cap);
    }
}

dispatch_avx2!(fn softcap_dispatch(z: &mut [f32], inv_cap: f32, scale: f32) -> () = softcap_body);

/// [`chunk_grad`] through a final-logit softcap: `s` holds the softcapped scaled logits
/// `s = (cap / T) · tanh(z / cap)`, and becomes `∂L/∂s · (1 − tanh²(z / cap))` with
/// `tanh(z / cap) = s · inv_scale` (`inv_scale = T / cap`): the gradient w.r.t. `z / T`, so the
/// caller's `inv_t` factor still gives `∂L/∂z`. The target's `+g_ℓ` is again left to the caller,
/// who multiplies it by the same `1 − tanh²` of the target's logit.
pub fn chunk_grad_softcap(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32, inv_scale: f32) {
    chunk_grad_softcap_dispatch(s, lse, gl, gh, h, inv_scale)
}

#[inline(always)]
fn chunk_grad_softcap_body(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32, inv_scale: f32) {
    if gh == 0.0 {
        for x in s.iter_mut() {
            let t = *x * inv_scale;
            *x = -gl * exp_fast(*x - lse) * (1.0 - t * t);
        }
    } else {
        for x in s.iter_mut() {
            let t = *x * inv_scale;
            let lp = *x - lse;
            let p = exp_fast(lp);
            *x = (-gl * p - gh * p * (lp + h)) * (1.0 - t * t);
        }
    }
}

dispatch_avx2!(fn chunk_grad_softcap_dispatch(s: &mut [f32], lse: f32, gl: f32, gh: f32, h: f32, inv_scale: f32) -> () = chunk_grad_softcap_body);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_fast_is_within_4_ulp_of_std() {
        for i in -8000..8000 {
            let x = i as f32 * 0.01;
            let (a, b) = (exp_fast(x), x.exp());
            assert!(((a - b) / b).abs() < 5e-7, "{x}: {a} vs {b}");
        }
    }

    #[test]
    fn block_sums_add_up_to_the_softmax_normaliser() {
        let x: Vec<f32> = (0..2500).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        let m = scaled_max(&x, 0.5);
        assert_eq!(m, 100.0 * 0.05 * 0.5);
        let mut w = vec![0f32; x.len()];
        let mut sums = vec![0f64; 3];
        exp_block_sums(&x, 0.5, m, 1024, &mut w, &mut sums);
        let want: f64 = x.iter().map(|&v| ((v * 0.5 - m) as f64).exp()).sum();
        let got: f64 = sums.iter().sum();
        assert!((got - want).abs() / want < 1e-6, "{got} vs {want}");
        assert!((w[7] as f64 - ((x[7] * 0.5 - m) as f64).exp()).abs() < 1e-6);
    }

    #[test]
    fn tanh_fast_is_within_2e7_of_std() {
        for i in -60000..60000 {
            let x = i as f32 * 1e-3;
            let (a, b) = (tanh_fast(x), (x as f64).tanh());
            assert!((a as f64 - b).abs() <= 2e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(tanh_fast(100.0), 1.0);
        assert_eq!(tanh_fast(-100.0), -1.0);
        assert_eq!(tanh_fast(0.0), 0.0);
    }

    #[test]
    fn softcap_and_its_gradient_match_f64() {
        let (cap, t) = (30f32, 0.7f32);
        let z: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 1.9).collect();
        let mut s = z.clone();
        softcap_in_place(&mut s, 1.0 / cap, cap / t);
        for (&zi, &si) in z.iter().zip(&s) {
            let want = cap as f64 / t as f64 * (zi as f64 / cap as f64).tanh();
            assert!((si as f64 - want).abs() < 1e-5, "{zi}: {si} vs {want}");
        }
        // The gradient factor 1 − tanh² against f64, with g_H = 0 and g_H ≠ 0.
        for gh in [0f32, 0.4] {
            let (lse, gl, h) = (60f32, 1.3f32, 2.0f32);
            let mut g = s.clone();
            chunk_grad_softcap(&mut g, lse, gl, gh, h, t / cap);
            for ((&zi, &si), &gi) in z.iter().zip(&s).zip(&g) {
                let th = (zi as f64 / cap as f64).tanh();
                let lp = si as f64 - lse as f64;
                let p = lp.exp();
                let want = (-(gl as f64) * p - gh as f64 * p * (lp + h as f64)) * (1.0 - th * th);
                assert!(
                    (gi as f64 - want).abs() < 1e-5 * want.abs().max(1e-3),
                    "{zi}: {gi} vs {want}"
                );
            }
        }
    }
}
