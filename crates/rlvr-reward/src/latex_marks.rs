//! The alphabet of a normalised LaTeX answer and the scanner its passes share: the private-use
//! characters that [`crate::latex::normalize`] and the tables of [`crate::latex_rules`] write in
//! place of LaTeX's literal braces, row breaks, "or" and top-level list commas, which the answer
//! forms ([`crate::forms`], [`crate::answer`]) read back; and [`matching_brace`]. A leaf below both
//! the pipeline ([`crate::latex`], which re-exports the public markers) and its rules.

/// Private-use stand-ins for LaTeX's literal braces `\{` and `\}` after normalisation.
pub const SET_OPEN: char = '\u{2983}';
/// See [`SET_OPEN`].
pub const SET_CLOSE: char = '\u{2984}';

/// Private-use stand-in for LaTeX's row break `\\` (matrix rows) after normalisation.
pub const ROW_BREAK: char = '\u{2986}';

/// Private-use stand-in for "or" between answers (`x<2 \text{ or } x>3`, `\lor`): a list separator
/// that also makes a union when the items are relations.
pub const OR_SEP: char = '\u{2980}';

/// Internal marker of a comma followed by a space at the top level: a list separator, never a
/// thousands separator (`32, 349` is two numbers).
pub(crate) const LIST_SEP: char = '\u{2985}';

/// Index of the `}` matching the `{` at byte `open`, if any (linear scan).
pub(crate) fn matching_brace(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}
