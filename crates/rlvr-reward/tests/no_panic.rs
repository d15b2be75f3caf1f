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
    fn countdown_expressions_never_panic(e in "[0-9+\\-*/() ]{0,40}") {
        let _ = countdown::evaluate(&e);
        let p = CountdownProblem { numbers: vec![1, 2, 3], target: 6 };
        let _ = countdown::check(&e, &p);
    }
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
