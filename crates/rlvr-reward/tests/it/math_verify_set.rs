//! The MATH verifier on data/math_verify/cases.jsonl: the cases of Math-Verify's public test suite
//! that its LaTeX extraction judges (written by scripts/make_math_verify_set.py; source, commit and
//! licence in data/math_verify/README.md). rlvr must agree with Math-Verify's verdict on at least
//! 90% of them, 98% of the plain forms (numbers, fractions, short expressions, intervals), and never
//! accept a pair Math-Verify rejects (0 false positives).

use rlvr_reward::math::MathVerifier;
use rlvr_reward::Sample;

#[derive(serde::Deserialize)]
struct Case {
    source: String,
    expected: u8,
    form: String,
    plain: bool,
    reference: String,
    completion: String,
}

fn cases() -> Vec<Case> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/math_verify/cases.jsonl");
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn agrees_with_math_verify_on_its_test_cases() {
    let cases = cases();
    assert!(cases.len() >= 170, "{}", cases.len());
    let mut by_form: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    let (mut ok, mut plain, mut plain_ok) = (0, 0, 0);
    let mut false_pos = Vec::new();
    let mut misses = Vec::new();
    for c in &cases {
        let (s, _) = MathVerifier.explain(&Sample::new(&c.completion, &c.reference));
        let right = s.correct == (c.expected == 1);
        let e = by_form.entry(&c.form).or_default();
        e.1 += 1;
        if right {
            e.0 += 1;
            ok += 1;
        } else if c.expected == 0 {
            false_pos.push(format!(
                "{}: {:?} vs {:?}",
                c.source, c.reference, c.completion
            ));
        } else {
            misses.push(format!(
                "{} [{}]: {:?} vs {:?}",
                c.source, c.form, c.reference, c.completion
            ));
        }
        if c.plain {
            plain += 1;
            plain_ok += usize::from(right);
        }
    }
    let report = format!(
        "{ok}/{} ({:.1}%), plain {plain_ok}/{plain} ({:.1}%), per form {by_form:?}\nfalse positives:\n{}\nmisses:\n{}",
        cases.len(),
        100.0 * ok as f64 / cases.len() as f64,
        100.0 * plain_ok as f64 / plain as f64,
        false_pos.join("\n"),
        misses.join("\n")
    );
    eprintln!("{report}");
    assert!(false_pos.is_empty(), "{report}");
    assert!(ok as f64 >= 0.90 * cases.len() as f64, "{report}");
    assert!(plain_ok as f64 >= 0.98 * plain as f64, "{report}");
}
