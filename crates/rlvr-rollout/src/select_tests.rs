//! Tests of `select` (host token selection).

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
