//! Format reward: a bonus for following a `<think>...</think><answer>...</answer>` template, a penalty
//! otherwise. It is reported apart from correctness ([`crate::combine::RewardBreakdown::format`]) and
//! never counts towards the `accuracy` metric.

use serde::{Deserialize, Serialize};

/// Format reward settings (the `[reward.format]` table).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FormatReward {
    /// Added when the completion follows the template; finite with |bonus| ≤ 1e6. Default 0.1.
    pub bonus: f64,
    /// Added when it does not (usually negative); finite with |penalty| ≤ 1e6. Default -0.1.
    pub penalty: f64,
}

impl Default for FormatReward {
    fn default() -> Self {
        FormatReward {
            bonus: 0.1,
            penalty: -0.1,
        }
    }
}

/// True when `completion` is, up to surrounding whitespace, exactly one `<think>...</think>` followed by
/// one `<answer>...</answer>` (whitespace allowed between them), with no nested or repeated tags.
pub fn follows_template(completion: &str) -> bool {
    let s = completion.trim();
    let Some(rest) = s.strip_prefix("<think>") else {
        return false;
    };
    let Some(te) = rest.find("</think>") else {
        return false;
    };
    let think = &rest[..te];
    let after = rest[te + "</think>".len()..].trim_start();
    let Some(ans) = after
        .strip_prefix("<answer>")
        .and_then(|a| a.strip_suffix("</answer>"))
    else {
        return false;
    };
    let tags = ["<think>", "</think>", "<answer>", "</answer>"];
    !tags.iter().any(|t| think.contains(t) || ans.contains(t))
}

impl FormatReward {
    /// The bonus or the penalty for `completion`.
    pub fn score(&self, completion: &str) -> f64 {
        if follows_template(completion) {
            self.bonus
        } else {
            self.penalty
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template() {
        assert!(follows_template("<think>a</think>\n<answer>5</answer>\n"));
        assert!(!follows_template(
            "<think>a</think><answer>5</answer> extra"
        ));
        assert!(!follows_template("<answer>5</answer>"));
        assert!(!follows_template(
            "<think>a<think></think><answer>5</answer>"
        ));
        assert!(!follows_template("<think>a</think><answer>5"));
    }
}
