//! Shows that scoring time grows linearly with the completion length, up to 1 MB.
//!
//! Run: `cargo run --release -p rlvr-reward --example bench_linear`
//!
//! For each verifier and input size (1 KiB … 1 MiB) it builds a completion of that size from
//! realistic material (GSM8K-style reasoning with numbers and `<<a*b=c>>` annotations, LaTeX with
//! boxes and fractions, a countdown answer hidden before a long tail), times the median of several
//! runs and prints nanoseconds per byte. Linear time means a flat ns/byte column; the last column is the
//! ratio of the 1 MiB figure to the 16 KiB one (≈1 for linear, ≈64 for quadratic).

use rlvr_reward::countdown::{CountdownProblem, CountdownVerifier};
use rlvr_reward::gsm8k::{Gsm8kMode, Gsm8kVerifier};
use rlvr_reward::math::MathVerifier;
use rlvr_reward::{Sample, Verifier};
use std::time::Instant;

const SIZES: [usize; 6] = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20];

/// `unit` repeated up to `size` bytes (cut at a char boundary), with `head` first and `tail` last.
fn build(head: &str, unit: &str, tail: &str, size: usize) -> String {
    let mut s = String::with_capacity(size + 64);
    s.push_str(head);
    while s.len() + unit.len() + tail.len() <= size {
        s.push_str(unit);
    }
    s.push_str(tail);
    s
}

fn time_ns(v: &dyn Verifier, completion: &str, reference: &str) -> f64 {
    let runs = if completion.len() > 1 << 18 { 5 } else { 21 };
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let s = v
                .score(&Sample::new(completion, reference))
                .expect("valid reference");
            std::hint::black_box(s);
            start.elapsed().as_nanos() as f64
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

type Case = (
    &'static str,
    Box<dyn Verifier>,
    Box<dyn Fn(usize) -> String>,
    String,
);

fn main() {
    let countdown_ref = CountdownProblem {
        numbers: vec![3, 4, 2],
        target: 6,
    }
    .to_reference();
    let cases: Vec<Case> = vec![
        (
            "gsm8k flexible, answer at the start",
            Box::new(Gsm8kVerifier {
                mode: Gsm8kMode::Flexible,
            }),
            Box::new(|n| {
                build(
                    "The answer is 1,234.\n",
                    "She sold 48/2 = <<48/2=24>>24 clips, so 3 x $12.50 = $37.50 in all.\n",
                    "",
                    n,
                )
            }),
            "#### 1234".into(),
        ),
        (
            "gsm8k strict, #### at the start",
            Box::new(Gsm8kVerifier {
                mode: Gsm8kMode::Strict,
            }),
            Box::new(|n| {
                build(
                    "#### 10\n",
                    "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute; the answer is 10.\n",
                    "",
                    n,
                )
            }),
            "10".into(),
        ),
        (
            "gsm8k flexible, last number (no marker)",
            Box::new(Gsm8kVerifier {
                mode: Gsm8kMode::Flexible,
            }),
            Box::new(|n| {
                build(
                    "",
                    "Then 1,200 - 3/4 of 80 leaves \u{2212}7 degrees and **18.00** dollars. ",
                    "So 42.",
                    n,
                )
            }),
            "42".into(),
        ),
        (
            "math, last boxed among many",
            Box::new(MathVerifier),
            Box::new(|n| {
                build("", "We get $\\frac{3}{4} + \\left(x^2\\right)$, so \\boxed{\\dfrac{1}{2}} is wrong. ", "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", n)
            }),
            "(3,\\frac{\\pi}{2})".into(),
        ),
        (
            "math, multi-answer gold, every box read",
            Box::new(MathVerifier),
            Box::new(|n| {
                build(
                    "",
                    "If $x \\geq 2$ then $f(x) = 14{,}916$; try \\boxed{-2} and \\boxed{1}. ",
                    "",
                    n,
                )
            }),
            "1 \\pm \\sqrt{2}, -2, 1".into(),
        ),
        (
            "countdown, answer tag then a long tail",
            Box::new(CountdownVerifier),
            Box::new(|n| {
                build(
                    "<answer>(3 * 4) / 2</answer>\n",
                    "I checked: 3*4 = 12 and 12/2 = 6 (nothing else uses {x}).\n",
                    "",
                    n,
                )
            }),
            countdown_ref,
        ),
    ];
    println!(
        "| verifier | 1 KiB | 4 KiB | 16 KiB | 64 KiB | 256 KiB | 1 MiB | ns/B 1 MiB ÷ 16 KiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, v, make, reference) in &cases {
        let mut per_byte = Vec::new();
        let mut cells = Vec::new();
        for &n in &SIZES {
            let c = make(n);
            let ns = time_ns(v.as_ref(), &c, reference);
            per_byte.push(ns / c.len() as f64);
            cells.push(format!(
                "{:.3} ms ({:.1} ns/B)",
                ns / 1e6,
                ns / c.len() as f64
            ));
        }
        println!(
            "| {name} | {} | {:.2} |",
            cells.join(" | "),
            per_byte[5] / per_byte[2]
        );
    }
}
