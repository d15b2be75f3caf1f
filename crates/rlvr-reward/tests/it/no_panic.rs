//! Property tests: parsers and verifiers never panic on arbitrary input.

use proptest::prelude::*;
use rlvr_reward::arithmetic::ArithmeticVerifier;
use rlvr_reward::countdown::{self, CountdownProblem, CountdownVerifier};
use rlvr_reward::gsm8k::{Gsm8kMode, Gsm8kVerifier};
use rlvr_reward::math::{equivalent, MathVerifier};
use rlvr_reward::number::{scan_numbers, ScanOptions};
use rlvr_reward::{extract, latex, Sample, Verifier};

/// Strings biased towards the characters the parsers care about.
fn mathy() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec![
                "\\boxed{",
                "\\frac",
                "\\dfrac",
                "{",
                "}",
                "(",
                ")",
                "[",
                "]",
                "\\{",
                "\\}",
                "\\sqrt",
                "\\pi",
                "\\text{",
                " cm}",
                "^",
                "_",
                "-",
                "\u{2212}",
                "+",
                "*",
                "/",
                ",",
                ".",
                "=",
                "####",
                "answer is",
                "<answer>",
                "</answer>",
                "\\cup",
                "\\left",
                "\\right",
                "$",
                "%",
                "x",
                "i",
                "0",
                "1",
                "9",
                "123",
                "999999999999999999999999999999999999999999",
                " ",
                "\n",
                "\u{2028}",
                "\u{202F}",
                "é",
                "\\",
                "{,}",
                "\\!",
                "^\\circ",
            ])
            .prop_map(str::to_string),
            any::<char>().prop_map(|c| c.to_string()),
        ],
        0..60,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_strings_never_panic(a in any::<String>(), b in any::<String>()) {
        run_all(&a, &b);
    }

    #[test]
    fn mathy_strings_never_panic(a in mathy(), b in mathy()) {
        run_all(&a, &b);
    }

    #[test]
    fn new_forms_never_panic(a in forms(), b in forms()) {
        run_all(&a, &b);
        // Several boxes against a multi-answer gold, and explanations.
        let c = format!("\\boxed{{{a}}} and \\boxed{{{b}}}");
        let _ = MathVerifier.score(&Sample::new(&c, "1, -2"));
        let _ = MathVerifier.explain(&Sample::new(&c, &b));
        let _ = rlvr_reward::answer::describe(&latex::normalize_keep_label(&a));
    }

    #[test]
    fn countdown_expressions_never_panic(e in "[0-9+\\-*/() ]{0,40}") {
        let _ = countdown::evaluate(&e);
        let p = CountdownProblem { numbers: vec![1, 2, 3], target: 6 };
        let _ = countdown::check(&e, &p);
    }
}

/// Strings built from the MATH answer forms (tests/it/math_forms.rs): relations, intervals, labels, units, separators,
/// `\approx`, `\pm`, matrices, functions.
fn forms() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec![
                "\\le",
                "\\leq",
                "\\geq",
                "\\ne",
                "\\neq",
                "\\not=",
                "<",
                ">",
                "<=",
                ">=",
                "\u{2264}",
                "\u{2265}",
                "\\in",
                "\\infty",
                "-\\infty",
                "\\cup",
                "\\approx",
                "\\pm",
                "\\mp",
                "=",
                "x",
                "y",
                "f(x)",
                "(p,q)",
                "AB",
                "\\angle",
                "\\theta",
                "\\sin",
                "\\cos",
                "\\sec",
                "\\cot",
                "\\ln",
                "\\log_",
                "\\arcsin",
                "^{-1}",
                "^",
                "_",
                "\\text{ or }",
                "\\text{and}",
                " and ",
                " or ",
                "\\lor",
                "\\textnormal{ miles}",
                "\\mbox{cm}",
                "m\u{00B2}",
                "\u{20AC}",
                "\u{00B0}",
                "{,}",
                ",\\!",
                "\u{2009}",
                ", ",
                ",",
                "\\cfrac{",
                "\\tfrac",
                "\\begin{pmatrix}",
                "\\end{pmatrix}",
                "\\begin{array}{cc}",
                "\\end{array}",
                "&",
                "\\\\",
                "\\left[",
                "\\right]",
                "\\{",
                "\\}",
                "(",
                ")",
                "[",
                "]",
                "{",
                "}",
                "0",
                "1",
                "5",
                "916",
                ".",
                "-",
                "+",
                "\\frac",
                "\\sqrt",
                "\\pi",
                "\\boxed{",
                "\\",
                " ",
            ])
            .prop_map(str::to_string),
            any::<char>().prop_map(|c| c.to_string()),
        ],
        0..40,
    )
    .prop_map(|v| v.concat())
}

fn run_all(a: &str, b: &str) {
    let _ = scan_numbers(a, ScanOptions { space_groups: true });
    let _ = extract::last_boxed(a);
    let _ = extract::answer_tag(a);
    let _ = extract::answer_phrases(a);
    let n = latex::normalize(a);
    let _ = rlvr_reward::expr::parse_expr(&n).map(|e| e.eval(&|_| 0.5));
    let _ = equivalent(a, b);
    let s = Sample::new(a, b);
    for mode in [Gsm8kMode::Strict, Gsm8kMode::Flexible] {
        let _ = Gsm8kVerifier { mode }.score(&s);
        let _ = ArithmeticVerifier { mode }.score(&s);
    }
    let _ = MathVerifier.score(&s);
    let _ = CountdownVerifier.score(&s);
    let r = CountdownProblem {
        numbers: vec![1, 2, 3],
        target: 6,
    }
    .to_reference();
    let _ = CountdownVerifier.score(&Sample::new(a, &r));
}

#[test]
fn deep_nesting_does_not_overflow_the_stack() {
    let deep = format!("\\boxed{{{}1{}}}", "(".repeat(100_000), ")".repeat(100_000));
    run_all(&deep, &deep);
    let deep_frac = format!(
        "\\boxed{{{}1{}}}",
        "\\frac{".repeat(5_000),
        "}{2}".repeat(5_000)
    );
    run_all(&deep_frac, "1");
    // Long left-associative chains are bounded (their evaluation and drop would recurse per term).
    let chain = format!("\\boxed{{{}1}}", "1+".repeat(300_000));
    run_all(&chain, "300001");
    let cd = format!(
        "<answer>{}1{}</answer>",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    let r = CountdownProblem {
        numbers: vec![1],
        target: 1,
    }
    .to_reference();
    assert_eq!(
        CountdownVerifier
            .score(&Sample::new(&cd, &r))
            .unwrap()
            .reward,
        0.0
    );
}

/// Seconds `f` takes.
fn secs(f: impl FnOnce()) -> f64 {
    let t = std::time::Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Adversarial sizes a runaway or hostile completion can reach: 1 MB completions, 100k-deep braces, 10k-term expressions, many boxes;
/// each scored within a generous bound (seconds, so unoptimised builds pass too) and without
/// overflowing the stack.
#[test]
fn adversarial_inputs_are_bounded() {
    let golds = [
        "1, -2",
        "(0,1)",
        "x \\in [-2,7]",
        "y = 2x+3",
        "\\frac{1}{3}",
        "7 = 11a+c",
    ];
    let deep_braces = format!("\\boxed{{{}1{}}}", "{".repeat(100_000), "}".repeat(100_000));
    let deep_frac = format!(
        "\\boxed{{{}1{}}}",
        "\\frac{".repeat(100_000),
        "}{2}".repeat(100_000)
    );
    let terms = format!("\\boxed{{{}x}}", "x^2+\\sin x-".repeat(10_000));
    let relations = format!("\\boxed{{{}x}}", "x<".repeat(10_000));
    let list = format!("\\boxed{{{}1}}", "1, ".repeat(100_000));
    let many_boxes = "\\boxed{1} and \\boxed{-2} ".repeat(40_000);
    let nested_boxes = format!("{}1{}", "\\boxed{".repeat(50_000), "}".repeat(50_000));
    let megabyte = format!(
        "{}\\boxed{{x \\geq 5}}",
        "Let $x \\le 7$, so $f(x) = \\frac{1}{3} \\approx 0.33$, and {,} ".repeat(20_000)
    );
    let pm = format!("\\boxed{{{}1}}", "1\\pm".repeat(10_000));
    // Nested sets whose innermost items differ: matching would multiply at every level without the
    // step budget.
    let mut nested = (1..=10)
        .map(|k| k.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut other = (1..=9).map(|k| k.to_string()).collect::<Vec<_>>().join(",") + ",11";
    for _ in 0..4 {
        nested = vec![format!("\\{{{nested}\\}}"); 10].join(",");
        other = vec![format!("\\{{{other}\\}}"); 10].join(",");
    }
    let nested_box = format!("\\boxed{{\\{{{nested}\\}}}}");
    let t = secs(|| {
        let s = MathVerifier.score(&Sample::new(&nested_box, &format!("\\{{{other}\\}}")));
        assert_eq!(s.unwrap().reward, 0.0);
    });
    eprintln!("nested sets: {t:.2} s");
    assert!(t < 10.0, "nested sets: {t:.2} s");
    for c in [
        &deep_braces,
        &deep_frac,
        &terms,
        &relations,
        &list,
        &many_boxes,
        &nested_boxes,
        &megabyte,
        &pm,
    ] {
        for g in golds {
            let t = secs(|| {
                let _ = MathVerifier.score(&Sample::new(c, g));
            });
            assert!(t < 10.0, "{} bytes against {g:?}: {t:.2} s", c.len());
        }
        // The completion's own box as the gold, too (both sides hostile).
        let inner = extract::last_boxed(c).unwrap_or("");
        let t = secs(|| {
            let _ = MathVerifier.score(&Sample::new(c, inner));
            let _ = MathVerifier.explain(&Sample::new(c, inner));
        });
        assert!(t < 10.0, "{} bytes against itself: {t:.2} s", c.len());
    }
    assert!(megabyte.len() > 1_000_000);
    // The answer at the end of the megabyte is still found and judged.
    assert_eq!(
        MathVerifier
            .score(&Sample::new(&megabyte, "[5, \\infty)"))
            .unwrap()
            .reward,
        1.0
    );
    assert_eq!(
        MathVerifier
            .score(&Sample::new(&many_boxes, "1, -2"))
            .unwrap()
            .reward,
        1.0
    );
}
