//! Every GSM8K and MATH-500 gold solution, fed back as a completion, scores 1 against its own reference
//! and 0 against other rows' references except where the answers are truly equal.

use rlvr_reward::gsm8k::{Gsm8kMode, Gsm8kVerifier};
use rlvr_reward::math::MathVerifier;
use rlvr_reward::{Sample, Verifier};
use serde_json::Value;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/");

/// Reads a JSONL file splitting on `\n` only (GSM8K train row 2381 holds U+2028).
fn rows(rel: &str) -> Vec<Value> {
    let path = format!("{DATA}{rel}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

fn field<'a>(row: &'a Value, key: &str) -> &'a str {
    row[key].as_str().expect("string field")
}

/// Independent oracle for GSM8K: the text after `#### `, commas removed, as an integer.
fn gsm8k_value(solution: &str) -> i64 {
    let (_, tail) = solution.rsplit_once("#### ").expect("#### marker");
    tail.trim()
        .replace(',', "")
        .parse()
        .expect("integer answer")
}

#[test]
fn gsm8k_gold_solutions_score_one_on_self_and_zero_on_others() {
    let mut all = rows("gsm8k/train.jsonl");
    let n_train = all.len();
    all.extend(rows("gsm8k/test.jsonl"));
    assert_eq!((n_train, all.len()), (7473, 8792));
    let sols: Vec<&str> = all.iter().map(|r| field(r, "answer")).collect();
    let values: Vec<i64> = sols.iter().map(|s| gsm8k_value(s)).collect();
    // A partner with the same answer for each row, so equal pairs are exercised too.
    let mut by_value = std::collections::HashMap::<i64, Vec<usize>>::new();
    for (i, v) in values.iter().enumerate() {
        by_value.entry(*v).or_default().push(i);
    }
    let (mut equal_pairs, mut pairs) = (0usize, 0usize);
    for mode in [Gsm8kMode::Strict, Gsm8kMode::Flexible] {
        let v = Gsm8kVerifier { mode };
        for i in 0..sols.len() {
            let own = v.score(&Sample::new(sols[i], sols[i])).unwrap();
            assert_eq!(own.reward, 1.0, "row {i} vs itself ({mode:?}): {own:?}");
            // Bare-answer reference too.
            let bare = values[i].to_string();
            assert_eq!(
                v.score(&Sample::new(sols[i], &bare)).unwrap().reward,
                1.0,
                "row {i} bare"
            );
            let same = &by_value[&values[i]];
            let partner = same.iter().copied().find(|&j| j != i);
            let others = (1..=6).map(|k| (i + k * 1291) % sols.len()).chain(partner);
            for j in others {
                if j == i {
                    continue;
                }
                let s = v.score(&Sample::new(sols[i], sols[j])).unwrap();
                let truly_equal = values[i] == values[j];
                assert_eq!(
                    s.reward == 1.0,
                    truly_equal,
                    "row {i} vs row {j} ({mode:?}): {s:?}"
                );
                pairs += 1;
                equal_pairs += truly_equal as usize;
            }
        }
    }
    assert!(
        pairs > 100_000 && equal_pairs > 10_000,
        "{pairs} pairs, {equal_pairs} equal"
    );
}

/// Pairs of textually different MATH-500 answers that denote the same answer, checked by hand.
const MATH_EQUAL: &[(&str, &str)] = &[
    ("90^\\circ", "90"),
    ("120^\\circ", "120"),
    ("30^\\circ", "30"),
    ("36^\\circ", "36"),
    ("\\$36", "36"),
    ("\\$36", "36^\\circ"),
    ("x=5", "5"),
    ("1,-2", "-2,1"),
    ("\\frac{1}{4}", "\\frac14"),
    ("10,\\!080", "10080"),
    ("15\\mbox{ cm}^2", "15"),
    ("2 \\sqrt{5}", "2\\sqrt{5}"),
];

fn math_truly_equal(a: &str, b: &str) -> bool {
    a == b
        || MATH_EQUAL
            .iter()
            .any(|&(x, y)| (x, y) == (a, b) || (y, x) == (a, b))
}

#[test]
fn math500_gold_solutions_score_one_on_self_and_zero_on_others_all_pairs() {
    let all = rows("math500/test.jsonl");
    assert_eq!(all.len(), 500);
    let v = MathVerifier;
    for (i, a) in all.iter().enumerate() {
        for (j, b) in all.iter().enumerate() {
            let (ans_a, ans_b) = (field(a, "answer"), field(b, "answer"));
            let s = v.score(&Sample::new(field(a, "solution"), ans_b)).unwrap();
            assert_eq!(
                s.reward == 1.0,
                math_truly_equal(ans_a, ans_b),
                "row {i} ({ans_a:?}) vs row {j} ({ans_b:?}): {s:?}"
            );
        }
        // The full solution as the reference works as well.
        let s = v
            .score(&Sample::new(field(a, "solution"), field(a, "solution")))
            .unwrap();
        assert_eq!(s.reward, 1.0, "row {i} vs its own solution");
    }
}
