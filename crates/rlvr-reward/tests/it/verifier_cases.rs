//! Hand-written verifier cases: every answer normalisation the verifiers apply (thousands
//! separators, `$`, units and %, markdown, LaTeX fractions and spacing, ...) and each answer-parsing fault of
//! DESIGN.md section 5, through one `check` helper per verifier.

use rlvr_reward::arithmetic::ArithmeticVerifier;
use rlvr_reward::countdown::{CountdownProblem, CountdownVerifier};
use rlvr_reward::gsm8k::{Gsm8kMode, Gsm8kVerifier};
use rlvr_reward::math::MathVerifier;
use rlvr_reward::{Sample, Verifier};

/// Scores `completion` against `reference` and checks reward and extracted answer.
fn check(
    v: &dyn Verifier,
    completion: &str,
    reference: &str,
    reward: f64,
    extracted: Option<&str>,
) {
    let s = v.score(&Sample::new(completion, reference)).unwrap();
    assert_eq!(
        (s.reward, s.extracted.as_deref()),
        (reward, extracted),
        "completion {completion:?} reference {reference:?}: {s:?}"
    );
}

const FLEX: Gsm8kVerifier = Gsm8kVerifier {
    mode: Gsm8kMode::Flexible,
};
const STRICT: Gsm8kVerifier = Gsm8kVerifier {
    mode: Gsm8kMode::Strict,
};

#[test]
fn gsm8k_normalisations() {
    let cases: &[(&str, &str, f64, Option<&str>)] = &[
        // thousands separators ("1,000" vs "1000", DESIGN.md section 5)
        ("So the total is 1,000", "#### 1000", 1.0, Some("1000")),
        ("#### 1000", "#### 1,000", 1.0, Some("1000")),
        (
            "It costs 1,234,567 dollars",
            "1234567",
            1.0,
            Some("1234567"),
        ),
        ("\\boxed{1{,}000}", "1000", 1.0, Some("1000")),
        ("#### 1\u{202F}000", "1000", 1.0, Some("1000")),
        // `$` ("$18", DESIGN.md section 5)
        ("She earns $18", "#### 18", 1.0, Some("18")),
        ("The answer is \\$18.", "18", 1.0, Some("18")),
        // trailing units and %
        ("He walked 18 miles", "18", 1.0, Some("18")),
        ("The discount is 25%", "#### 25", 1.0, Some("25")),
        // trailing period
        ("The answer is 18.", "18", 1.0, Some("18")),
        // markdown bold and italics ("**18**", DESIGN.md section 5)
        ("**Answer:** **18**", "18", 1.0, Some("18")),
        ("the answer is _18_", "18", 1.0, Some("18")),
        ("*18*", "18", 1.0, Some("18")),
        // spaces
        ("####    18   ", "  18 ", 1.0, Some("18")),
        ("#### 1 000", "1000", 1.0, Some("1000")),
        // unicode minus and negative answers (DESIGN.md section 5)
        ("The temperature is \u{2212}7", "#### -7", 1.0, Some("-7")),
        ("The change is -12 points.", "#### -12", 1.0, Some("-12")),
        ("The answer is 12", "#### -12", 0.0, Some("12")),
        // leading +
        ("The answer is +5", "5", 1.0, Some("5")),
        // 18.00 equals 18 (DESIGN.md section 5)
        ("#### 18.00", "18", 1.0, Some("18")),
        ("It costs $18.50", "18.5", 1.0, Some("18.5")),
        ("It is 0.5", "1/2", 1.0, Some("0.5")),
        // simple fractions
        ("She ate 3/4 of it", "0.75", 1.0, Some("3/4")),
        ("\\boxed{\\frac{3}{4}}", "3/4", 1.0, Some("3/4")),
        ("\\boxed{\\dfrac{6}{8}}", "0.75", 1.0, Some("6/8")),
        // wrong answers
        ("The answer is 17", "18", 0.0, Some("17")),
        ("I don't know", "18", 0.0, None),
        // 5-3 is not -3
        ("5-3", "3", 1.0, Some("3")),
    ];
    for &(c, r, reward, ex) in cases {
        check(&FLEX, c, r, reward, ex);
    }
}

#[test]
fn gsm8k_whole_completion_is_searched() {
    // An answer far more than 300 characters before the end (DESIGN.md section 5) still counts.
    let tail = " I double-checked every step carefully and everything adds up.".repeat(20);
    let c = format!("Reasoning...\n#### 42\n{tail}");
    check(&STRICT, &c, "#### 42", 1.0, Some("42"));
    let c = format!("The answer is 42.\n{}", "Thanks for reading. ".repeat(30));
    check(&FLEX, &c, "42", 1.0, Some("42"));
}

#[test]
fn gsm8k_modes_and_order() {
    // Strict accepts `#### N` only.
    check(&STRICT, "The answer is 18", "18", 0.0, None);
    check(&STRICT, "\\boxed{18}", "18", 0.0, None);
    check(&STRICT, "blah\n#### $18.", "18", 1.0, Some("18"));
    // A markdown heading is not an answer marker; the last `####` followed by a number is.
    check(
        &STRICT,
        "#### 18\n#### Step 3: check\nDone",
        "18",
        1.0,
        Some("18"),
    );
    check(&STRICT, "#### Step 1: add\nSo 5 apples.", "5", 0.0, None);
    check(&FLEX, "#### Step 1: add\nSo 5 apples.", "5", 1.0, Some("5"));
    check(&STRICT, "#### **\\$1,000**", "1000", 1.0, Some("1000"));
    check(&STRICT, "####: \\frac{3}{4}", "0.75", 1.0, Some("3/4"));
    check(&STRICT, "#### \u{2212}3", "-3", 1.0, Some("-3"));
    // Flexible order: ####, then boxed, then "answer is", then the last number.
    check(&FLEX, "\\boxed{7} ... #### 8 ... 9", "8", 1.0, Some("8"));
    check(
        &FLEX,
        "The answer is 5. So \\boxed{7}. Then 9",
        "7",
        1.0,
        Some("7"),
    );
    check(
        &FLEX,
        "The answer is 5, since 2+3=5 and 4 apples",
        "5",
        1.0,
        Some("5"),
    );
    check(&FLEX, "2 + 3 = 5 so we get 5 apples", "5", 1.0, Some("5"));
    // An equation in a box or an answer phrase: the result after the last `=`.
    check(&FLEX, "\\boxed{2 \\times 9 = 18}", "18", 1.0, Some("18"));
    check(
        &FLEX,
        "The answer is 2 × 9 = 18 apples.",
        "18",
        1.0,
        Some("18"),
    );
    check(&FLEX, "The answer is x = 18", "18", 1.0, Some("18"));
    // Gold from a full solution is its last #### value; from a boxed reference, the box.
    check(&FLEX, "10", "a <<5*2=10>> b\n#### 10", 1.0, Some("10"));
    check(&FLEX, "10", "so \\boxed{10}", 1.0, Some("10"));
}

const MATH: MathVerifier = MathVerifier;

#[test]
fn math_normalisations() {
    let cases: &[(&str, &str, f64)] = &[
        // \frac, \dfrac, \tfrac and shorthand
        ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
        ("\\boxed{\\tfrac34}", "\\frac{3}{4}", 1.0),
        ("\\boxed{0.75}", "\\frac34", 1.0),
        ("\\boxed{\\frac{3}{4}}", "\\frac{4}{3}", 0.0),
        ("\\boxed{0.333}", "\\frac13", 0.0),
        // \left / \right and spacing commands
        (
            "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}",
            "(3,\\frac{\\pi}{2})",
            1.0,
        ),
        ("\\boxed{10,\\!080}", "10080", 1.0),
        ("\\boxed{1\\,000\\;}", "1000", 1.0),
        // \text{...} (units dropped, words unwrapped)
        ("\\boxed{\\text{Evelyn}}", "Evelyn", 1.0),
        ("\\boxed{5.4 \\text{ cents}}", "5.4", 1.0),
        ("\\boxed{\\text{east}}", "\\text{seat}", 0.0),
        ("\\boxed{\\text{(C)}}", "C", 1.0),
        // ^\circ, \%, \$
        ("\\boxed{90^\\circ}", "90", 1.0),
        ("\\boxed{50\\%}", "50", 1.0),
        ("\\boxed{\\$18.90}", "18.9", 1.0),
        // \sqrt
        ("\\boxed{11\\sqrt2}", "11\\sqrt{2}", 1.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\sqrt{3}/2", 1.0),
        ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", 0.0),
        // \pi
        ("\\boxed{2\\pi}", "\\pi \\cdot 2", 1.0),
        ("\\boxed{3.14}", "\\pi", 0.0),
        // tuples and intervals
        ("\\boxed{(1, -2)}", "(1,-2)", 1.0),
        ("\\boxed{(-2,1)}", "(1,-2)", 0.0),
        ("\\boxed{(3,4]}", "(3,4]", 1.0),
        ("\\boxed{[3,4]}", "(3,4]", 0.0),
        ("\\boxed{(-\\infty, 0]}", "(-\\infty,0]", 1.0),
        ("\\boxed{(0,9)\\cup(9,36)}", "(0,9) \\cup (9,36)", 1.0),
        // equivalent expressions
        ("\\boxed{-q+p}", "p - q", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("\\boxed{x^2+2x}", "(x+1)^2", 0.0),
        ("\\boxed{x = 5}", "5", 1.0),
        ("\\boxed{1\\frac{4}{5}}", "\\frac95", 1.0),
        // nested braces and the last box
        (
            "first \\boxed{1}, finally \\boxed{\\frac{1}{\\sqrt{2}}}",
            "\\frac{\\sqrt{2}}{2}",
            1.0,
        ),
        ("no box: the answer is 5", "5", 0.0),
        // degree sign, unit words, sets vs lists, matrices
        ("\\boxed{90°}", "90^\\circ", 1.0),
        ("\\boxed{18.90 dollars}", "\\$18.90", 1.0),
        ("\\boxed{5x}", "5", 0.0),
        (
            "\\boxed{-2, 1\\pm\\sqrt{5}}",
            "\\{1\\pm\\sqrt{5},-2\\}",
            1.0,
        ),
        ("\\boxed{(-2, 1)}", "\\{1,-2\\}", 0.0),
        (
            "\\boxed{\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac23 \\\\ 5/3 \\end{pmatrix}}",
            "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
            1.0,
        ),
        (
            "\\boxed{\\begin{pmatrix} 1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}}",
            "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
            0.0,
        ),
    ];
    for &(c, r, reward) in cases {
        let s = MATH.score(&Sample::new(c, r)).unwrap();
        assert_eq!(s.reward, reward, "completion {c:?} reference {r:?}: {s:?}");
    }
}

fn countdown_ref(numbers: &[i64], target: i64) -> String {
    CountdownProblem {
        numbers: numbers.to_vec(),
        target,
    }
    .to_reference()
}

#[test]
fn countdown_cases() {
    let r = countdown_ref(&[3, 4, 2], 6);
    let cd = CountdownVerifier;
    check(
        &cd,
        "<think>try</think><answer>(3/2)*4</answer>",
        &countdown_ref(&[3, 2, 4], 6),
        1.0,
        Some("(3/2)*4"),
    );
    check(
        &cd,
        "<answer>3 * 4 / 2 = 6</answer>",
        &r,
        1.0,
        Some("3 * 4 / 2"),
    );
    check(
        &cd,
        "<answer>3 * 4 / 2</answer> <answer>3*2</answer>",
        &r,
        0.0,
        Some("3*2"),
    );
    // Each number exactly once: missing and repeated numbers score 0.
    check(&cd, "<answer>3*2</answer>", &r, 0.0, Some("3*2"));
    check(&cd, "<answer>3*2*4/4</answer>", &r, 0.0, Some("3*2*4/4"));
    // Division by zero scores 0 (and does not panic).
    check(
        &cd,
        "<answer>3*4/(2-2)</answer>",
        &countdown_ref(&[3, 4, 2, 2], 6),
        0.0,
        Some("3*4/(2-2)"),
    );
    // Never an eval: anything but numbers, operators and parentheses is rejected.
    check(
        &cd,
        "<answer>__import__('os').system('true')</answer>",
        &r,
        0.0,
        Some("__import__('os').system('true')"),
    );
    // Unary minus is not an allowed operator.
    check(
        &cd,
        "<answer>-(3-4)*2*3</answer>",
        &countdown_ref(&[3, 4, 2, 3], 6),
        0.0,
        Some("-(3-4)*2*3"),
    );
    // Exact rational arithmetic: 1/3*3 is exactly 1.
    check(
        &cd,
        "<answer>1/3*3+5</answer>",
        &countdown_ref(&[1, 3, 3, 5], 6),
        1.0,
        Some("1/3*3+5"),
    );
    // Without tags, the last line is read.
    check(
        &cd,
        "Let me see.\n(4 - 2) × 3",
        &r,
        1.0,
        Some("(4 - 2) × 3"),
    );
    // A bad reference is an error, not a zero.
    assert!(cd.score(&Sample::new("1", "not json")).is_err());
}

#[test]
fn arithmetic_cases() {
    let flex = ArithmeticVerifier {
        mode: Gsm8kMode::Flexible,
    };
    let strict = ArithmeticVerifier {
        mode: Gsm8kMode::Strict,
    };
    check(&strict, "579", "579", 1.0, Some("579"));
    check(&strict, "0579", "579", 1.0, Some("579"));
    check(&strict, " 579.\n", "579", 1.0, Some("579"));
    check(&strict, "579 because", "579", 0.0, None);
    check(&strict, "<answer>-12</answer>", "-12", 1.0, Some("-12"));
    check(&flex, "12+34: the answer is 46", "46", 1.0, Some("46"));
    check(&flex, "7/4", "1.75", 1.0, Some("7/4"));
}
