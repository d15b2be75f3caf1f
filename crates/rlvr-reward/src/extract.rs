//! Answer extraction shared by the verifiers: `\boxed{...}` with nested braces, `<answer>` tags,
//! "the answer is" phrases and `####` markers. Every function here reads the whole text in time
//! linear in its length (no window that could miss an early answer, no backtracking).

/// For each candidate `{` position (sorted ascending), the position of its matching `}`, in one pass.
///
/// `\{` and `\}` (LaTeX literal braces) are not structural. Unclosed candidates get `None`. Only the
/// candidates' closes are stored, so memory stays small even for text full of braces.
fn closes_for(text: &str, candidates: &[usize]) -> Vec<Option<usize>> {
    let b = text.as_bytes();
    let mut closes = vec![None; candidates.len()];
    // Stack of open braces: the candidate index when the brace is a candidate.
    let mut stack: Vec<Option<usize>> = Vec::new();
    let mut next = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                // Skip the escaped character (`\{`, `\}`, `\\`).
                i += 2;
                continue;
            }
            b'{' => {
                while next < candidates.len() && candidates[next] < i {
                    next += 1;
                }
                if next < candidates.len() && candidates[next] == i {
                    stack.push(Some(next));
                    next += 1;
                } else {
                    stack.push(None);
                }
            }
            b'}' => {
                if let Some(Some(k)) = stack.pop() {
                    closes[k] = Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    closes
}

/// Byte offsets of every `\\boxed`/`\\fbox` in `text`, found in one pass each: where each keyword ends
/// (`starts`, sorted), where its argument begins after optional spaces (`opens`), the braced opens
/// (`braced`, sorted) and each braced open's matching close (`closes`, `None` when unclosed).
struct BoxScan {
    starts: Vec<usize>,
    opens: Vec<usize>,
    braced: Vec<usize>,
    closes: Vec<Option<usize>>,
}

impl BoxScan {
    /// The content of box `i` of `text` and the offset where it ends (the closing brace, or the end
    /// of a bare `\boxed 5` token), or `None` for an unclosed or empty box.
    fn content<'t>(&self, text: &'t str, i: usize) -> Option<(&'t str, usize)> {
        let (after, open) = (self.starts[i], self.opens[i]);
        if text[open..].starts_with('{') {
            let k = self
                .braced
                .binary_search(&open)
                .expect("every braced open is listed");
            self.closes[k].map(|close| (&text[open + 1..close], close))
        } else if open > after {
            // `\boxed 5`: a space, then a bare token.
            let rest = &text[open..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '$')
                .unwrap_or(rest.len());
            (end > 0).then(|| (&rest[..end], open + end))
        } else {
            None
        }
    }
}

/// Scans `text` once for the boxes that [`last_boxed`] and [`all_boxed`] read.
fn scan_boxes(text: &str) -> BoxScan {
    let mut starts: Vec<usize> = Vec::new();
    for pat in ["\\boxed", "\\fbox"] {
        starts.extend(text.match_indices(pat).map(|(i, p)| i + p.len()));
    }
    starts.sort_unstable();
    let opens: Vec<usize> = starts
        .iter()
        .map(|&after| after + (text[after..].len() - text[after..].trim_start().len()))
        .collect();
    let braced: Vec<usize> = opens
        .iter()
        .copied()
        .filter(|&o| text[o..].starts_with('{'))
        .collect();
    let closes = closes_for(text, &braced);
    BoxScan {
        starts,
        opens,
        braced,
        closes,
    }
}

/// The content of the last complete `\boxed{...}` (or `\fbox{...}`) in `text`, nested braces included.
///
/// `\boxed 5` (no braces) yields the token up to the next whitespace or `$`. An unclosed last box is
/// skipped in favour of the previous complete one. Returns `None` when the text has no complete box.
/// One pass over the text, whatever the number of boxes.
///
/// ```
/// use rlvr_reward::extract::last_boxed;
/// assert_eq!(last_boxed(r"so \boxed{1} then \boxed{\frac{a}{b}}."), Some(r"\frac{a}{b}"));
/// ```
pub fn last_boxed(text: &str) -> Option<&str> {
    let scan = scan_boxes(text);
    (0..scan.starts.len())
        .rev()
        .find_map(|i| scan.content(text, i))
        .map(|(c, _)| c)
}

/// The contents of every complete `\boxed{...}` / `\fbox{...}` in `text`, in order; a box inside another
/// box is part of the outer one and not listed on its own. Same rules as [`last_boxed`] (`\boxed 5`,
/// unclosed boxes skipped); one pass over the text.
///
/// ```
/// use rlvr_reward::extract::all_boxed;
/// assert_eq!(all_boxed(r"\boxed{-2} and \boxed{1}; \boxed{\boxed{3}}"), ["-2", "1", r"\boxed{3}"]);
/// ```
pub fn all_boxed(text: &str) -> Vec<&str> {
    let scan = scan_boxes(text);
    let mut out = Vec::new();
    let mut covered = 0usize;
    for i in 0..scan.starts.len() {
        if scan.starts[i] <= covered {
            continue;
        }
        if let Some((c, end)) = scan.content(text, i) {
            out.push(c);
            covered = end;
        }
    }
    out
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

/// For every `####` marker of `text`, last first: the text after it up to the end of its line or the
/// next marker, whichever comes first (non-overlapping, so reading them all is linear).
pub fn all_after_hashes(text: &str) -> Vec<&str> {
    let hits: Vec<usize> = text.match_indices("####").map(|(i, _)| i).collect();
    let mut out = Vec::with_capacity(hits.len());
    for k in (0..hits.len()).rev() {
        let start = hits[k] + 4;
        // A run of five or more `#` is one marker: skip the extra ones.
        if hits.get(k + 1).is_some_and(|&n| n < start) {
            continue;
        }
        let limit = hits.get(k + 1).map_or(text.len(), |&n| n.max(start));
        let seg = text[start..limit].trim_start_matches('#');
        out.push(seg.split('\n').next().unwrap_or(""));
    }
    out
}

/// Phrases that introduce a final answer, matched ASCII-case-insensitively.
const ANSWER_PHRASES: [&str; 2] = ["answer is", "answer:"];

/// For every "answer is" / "answer:" phrase in `text`, last first: the text after it up to the end of
/// its line or the next phrase, whichever comes first (so the segments never overlap and reading them
/// all is linear in the text length).
///
/// Case-insensitive, so "The final answer is", "ANSWER:" and "**Answer:**" all count.
pub fn answer_phrases(text: &str) -> Vec<&str> {
    let lower = text.to_ascii_lowercase();
    let mut hits: Vec<(usize, usize)> = Vec::new();
    for p in ANSWER_PHRASES {
        hits.extend(lower.match_indices(p).map(|(i, _)| (i, i + p.len())));
    }
    hits.sort_unstable();
    let mut out = Vec::with_capacity(hits.len());
    for k in (0..hits.len()).rev() {
        let start = hits[k].1;
        let limit = hits.get(k + 1).map_or(text.len(), |h| h.0.max(start));
        let seg = &text[start..limit];
        out.push(seg.split('\n').next().unwrap_or(""));
    }
    out
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
            all_after_hashes("#### 1\n## x #### 2 #### 3"),
            [" 3", " 2 ", " 1"]
        );
        assert_eq!(
            answer_phrases("The answer is 5.\nFinal Answer: 6"),
            [" 6", " 5."]
        );
    }
}
