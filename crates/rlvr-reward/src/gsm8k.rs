//! GSM8K verifier: numeric final answers.
//!
//! Gold: the value after the last `####` of a reference solution, else the last `\boxed{}`, else the
//! reference read as a bare answer. Extraction from the completion (DESIGN.md section 10):
//! - [`Gsm8kMode::Strict`]: only `#### N`: the last `####` directly followed by a number (spaces, `:`,
//!   `$` and markdown emphasis allowed in between, so a markdown heading `#### Step 3` is not an answer);
//! - [`Gsm8kMode::Flexible`] (default): `#### N`, then the last `\boxed{}`, then the last "answer is" /
//!   "answer:" phrase followed by a number on its line, then the last number anywhere; first that
//!   yields a number wins. In a box or an answer phrase holding an equation, the number after the last
//!   `=` is taken (`\boxed{2 \times 9 = 18}` → 18).
//!
//! Values are compared exactly (see [`crate::number`]): thousands separators, `$`, trailing units and
//! `%`, a trailing period, markdown bold/italics, spaces, unicode minus, a leading `+`, `18.00` = `18`,
//! `3/4` = `\frac{3}{4}` = `0.75`. The whole completion is searched: peers that looked only at the last
//! 300 characters scored early answers 0 (DESIGN.md section 5).

use crate::extract::{after_hashes, all_after_hashes, answer_phrases, last_boxed};
use crate::number::{first_number, last_number, NumToken, ScanOptions};
use crate::{Sample, Score, Verifier};
use serde::{Deserialize, Serialize};

/// Which answer forms the GSM8K verifier accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Gsm8kMode {
    /// `#### N` only.
    Strict,
    /// `#### N`, `\boxed{}`, an "answer is" phrase, then the last number, in that order.
    #[default]
    Flexible,
}

const SEGMENT: ScanOptions = ScanOptions { space_groups: true };

/// The gold answer of a reference: after the last `####`, else the last `\boxed{}`, else the first
/// number of the bare reference. `None` when the reference holds no number.
pub fn gold_number(reference: &str) -> Option<NumToken> {
    if let Some(seg) = after_hashes(reference) {
        return first_number(seg, SEGMENT);
    }
    if let Some(b) = last_boxed(reference) {
        return first_number(b, SEGMENT);
    }
    first_number(reference, SEGMENT)
}

/// The number `segment` starts with, after spaces, `:`, `$`/`\$` and markdown emphasis: `#### 72`,
/// `#### $1,000.`, `#### **18**` count; a markdown heading such as `#### Step 3: add` does not.
pub fn leading_number(segment: &str) -> Option<NumToken> {
    let mut rest = segment;
    loop {
        let t = rest
            .trim_start_matches(|c: char| c.is_whitespace() || matches!(c, ':' | '$' | '*' | '_'));
        let t = t.strip_prefix("\\$").unwrap_or(t);
        if t.len() == rest.len() {
            break;
        }
        rest = t;
    }
    let offset = segment.len() - rest.len();
    let line = rest.split('\n').next().unwrap_or("");
    let tok = first_number(line, SEGMENT)?;
    (tok.start == 0).then(|| NumToken {
        start: tok.start + offset,
        end: tok.end + offset,
        ..tok
    })
}

/// The part of an answer segment after its last `=` (`\boxed{2 \times 9 = 18}` → `18`), or all of it.
fn result_part(segment: &str) -> &str {
    match segment.rfind('=') {
        Some(i) if segment[i + 1..].chars().any(|c| c.is_ascii_digit()) => &segment[i + 1..],
        _ => segment,
    }
}

/// The answer a completion gives, per `mode` (see the module docs). `None` when it gives none.
pub fn extract_number(completion: &str, mode: Gsm8kMode) -> Option<NumToken> {
    if let Some(n) = all_after_hashes(completion)
        .into_iter()
        .find_map(leading_number)
    {
        return Some(n);
    }
    if mode == Gsm8kMode::Strict {
        return None;
    }
    if let Some(n) = last_boxed(completion).and_then(|s| first_number(result_part(s), SEGMENT)) {
        return Some(n);
    }
    if let Some(n) = answer_phrases(completion)
        .into_iter()
        .find_map(|s| first_number(result_part(s), ScanOptions::default()))
    {
        return Some(n);
    }
    last_number(completion)
}

/// Scores GSM8K completions: reward 1 when the extracted number equals the gold, else 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gsm8kVerifier {
    /// Extraction mode.
    pub mode: Gsm8kMode,
}

impl Verifier for Gsm8kVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, crate::RewardError> {
        let gold = gold_number(sample.reference);
        let got = extract_number(sample.completion, self.mode);
        let correct = matches!((&gold, &got), (Some(g), Some(e)) if g.same_number(e));
        Ok(Score::binary(
            correct,
            got.map(|t| t.canonical),
            gold.map(|t| t.canonical),
        ))
    }
}
