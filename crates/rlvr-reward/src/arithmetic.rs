//! Arithmetic verifier for generated problems such as `123+456=` (DESIGN.md section 11's quickstart).
//!
//! Fields: the reference is the exact answer, a bare number (`579`, `-12`, `7/4`, `0.25`) or a solution
//! ending in `#### N`. The completion's answer is read from its last `<answer>...</answer>` when it has
//! one, else from the whole completion:
//! - [`Gsm8kMode::Strict`]: that text must be exactly one number (surrounding spaces, `$`, markdown
//!   emphasis and a trailing period allowed); `579 because` scores 0;
//! - [`Gsm8kMode::Flexible`] (default): GSM8K's flexible extraction (`####`, `\boxed{}`, "answer is",
//!   last number).
//!
//! Values are compared exactly, so zero-padded `0579` equals `579` and `0.50` equals `1/2`.

use crate::extract::answer_tag;
use crate::gsm8k::{extract_number, gold_number, Gsm8kMode};
use crate::number::{scan_numbers, NumToken, ScanOptions};
use crate::{Sample, Score, Verifier};

/// The single number `text` consists of (strict mode), if it is one.
fn sole_number(text: &str) -> Option<NumToken> {
    let toks = scan_numbers(text, ScanOptions::default());
    let [tok] = toks.as_slice() else {
        return None;
    };
    let is_decoration = |c: char| c.is_whitespace() || matches!(c, '$' | '*' | '_' | '.');
    let outside_ok =
        text[..tok.start].chars().all(is_decoration) && text[tok.end..].chars().all(is_decoration);
    outside_ok.then(|| tok.clone())
}

/// Scores arithmetic completions: reward 1 when the answer equals the reference exactly.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArithmeticVerifier {
    /// Extraction mode (see the module docs).
    pub mode: Gsm8kMode,
}

impl Verifier for ArithmeticVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, crate::RewardError> {
        let gold = gold_number(sample.reference);
        let region = answer_tag(sample.completion).unwrap_or(sample.completion);
        let got = match self.mode {
            Gsm8kMode::Strict => sole_number(region),
            Gsm8kMode::Flexible => extract_number(region, Gsm8kMode::Flexible),
        };
        let correct = matches!((&gold, &got), (Some(g), Some(e)) if g.same_number(e));
        Ok(Score::binary(
            correct,
            got.map(|t| t.canonical),
            gold.map(|t| t.canonical),
        ))
    }
}
