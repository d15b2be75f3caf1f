//! Answer extraction shared by the verifiers: `\boxed{...}` with nested braces, `<answer>` tags,
//! "the answer is" phrases and `####` markers. Every function here reads the whole text in time
//! linear in its length (no window that could miss an early answer, no backtracking).

use std::collections::HashMap;

/// Byte positions of matching braces: for each structural `{`, the position of its `}`.
///
/// `\{` and `\}` (LaTeX literal braces) are not structural. Unclosed `{` have no entry.
fn brace_pairs(text: &str) -> HashMap<usize, usize> {
    let b = text.as_bytes();
    let mut stack = Vec::new();
    let mut pairs = HashMap::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                // Skip the escaped character (`\{`, `\}`, `\\`).
                i += 2;
                continue;
            }
            b'{' => stack.push(i),
            b'}' => {
                if let Some(o) = stack.pop() {
                    pairs.insert(o, i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    pairs
}

/// The content of the last complete `\boxed{...}` (or `\fbox{...}`) in `text`, nested braces included.
///
/// `\boxed 5` (no braces) yields the token up to the next whitespace or `$`. An unclosed last box is
/// skipped in favour of the previous complete one. Returns `None` when the text has no complete box.
///
/// ```
/// use rlvr_reward::extract::last_boxed;
/// assert_eq!(last_boxed(r"so \boxed{1} then \boxed{\frac{a}{b}}."), Some(r"\frac{a}{b}"));
/// ```
pub fn last_boxed(text: &str) -> Option<&str> {
    let mut starts: Vec<(usize, usize)> = Vec::new();
    for pat in ["\\boxed", "\\fbox"] {
        starts.extend(text.match_indices(pat).map(|(i, p)| (i, i + p.len())));
    }
    if starts.is_empty() {
        return None;
    }
    starts.sort_unstable();
    let pairs = brace_pairs(text);
    for &(_, after) in starts.iter().rev() {
        let rest = &text[after..];
        let trimmed = rest.trim_start();
        let open = after + (rest.len() - trimmed.len());
        if trimmed.starts_with('{') {
            if let Some(&close) = pairs.get(&open) {
                return Some(&text[open + 1..close]);
            }
        } else if trimmed.len() < rest.len() {
            // `\boxed 5`: a space, then a bare token.
            let end = trimmed
                .find(|c: char| c.is_whitespace() || c == '$')
                .unwrap_or(trimmed.len());
            if end > 0 {
                return Some(&trimmed[..end]);
            }
        }
    }
    None
}

/// The content of the last `<answer>...</answer>` pair in `text`, if any.
pub fn answer_tag(text: &str) -> Option<&str> {
    let close = text.rfind("</answer>")?;
    let open = text[..close].rfind("<answer>")?;
    Some(&text[open + "<answer>".len()..close])
}

/// The text on the same line after the last `####` marker of `text`, if any.
pub fn after_hashes(text: &str) -> Option<&str> {
    let i = text.rfind("####")?;
    let rest = text[i..].trim_start_matches('#');
    Some(rest.split('\n').next().unwrap_or(""))
}

/// Phrases that introduce a final answer, matched ASCII-case-insensitively.
const ANSWER_PHRASES: [&str; 2] = ["answer is", "answer:"];

/// For every "answer is" / "answer:" phrase in `text`, last first: the rest of its line.
///
/// Case-insensitive, so "The final answer is", "ANSWER:" and "**Answer:**" all count.
pub fn answer_phrases(text: &str) -> Vec<&str> {
    let lower = text.to_ascii_lowercase();
    let mut hits: Vec<usize> = Vec::new();
    for p in ANSWER_PHRASES {
        hits.extend(lower.match_indices(p).map(|(i, _)| i + p.len()));
    }
    hits.sort_unstable_by(|a, b| b.cmp(a));
    hits.into_iter()
        .map(|i| text[i..].split('\n').next().unwrap_or(""))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_nested_and_unclosed() {
        assert_eq!(last_boxed(r"\boxed{\frac{1}{2}}"), Some(r"\frac{1}{2}"));
        assert_eq!(last_boxed(r"\boxed{1} \boxed{2"), Some("1"));
        assert_eq!(last_boxed(r"\boxed{\{1,2\}}"), Some(r"\{1,2\}"));
        assert_eq!(last_boxed(r"$\boxed 5$"), Some("5"));
        assert_eq!(last_boxed(r"\fbox{7}"), Some("7"));
        assert_eq!(last_boxed("none"), None);
    }

    #[test]
    fn tags_and_phrases() {
        assert_eq!(
            answer_tag("<answer>1</answer> <answer>2</answer>"),
            Some("2")
        );
        assert_eq!(after_hashes("a\n#### 72\nmore"), Some(" 72"));
        assert_eq!(
            answer_phrases("The answer is 5.\nFinal Answer: 6"),
            [" 6", " 5."]
        );
    }
}
