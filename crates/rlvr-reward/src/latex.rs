//! LaTeX answer normalisation and a small expression evaluator for the MATH verifier.
//!
//! [`normalize`] follows the string normalisation of Hendrycks et al.'s MATH grader (`strip_string`)
//! and extends it: `\left`/`\right` and spacing commands dropped, `\dfrac`/`\tfrac` → `\frac`,
//! `\frac12` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`, units in `\text{ ...}` dropped, other `\text{..}`
//! unwrapped, `^\circ`, `°`, `\%`, `\$` dropped, spaces removed, thousands separators removed, a unit
//! word after a plain number dropped (`18.90 dollars` → `18.90`), a short `x =` left-hand side dropped,
//! `(C)` → `C`.
//!
//! The tables and passes live in [`crate::latex_rules`], the markers they write and the brace
//! scanner they share in [`crate::latex_marks`].
//!
//! [`crate::expr::parse_expr`] then reads a normalised answer as an arithmetic expression.

use crate::latex_marks::{matching_brace, LIST_SEP};
pub use crate::latex_marks::{OR_SEP, ROW_BREAK, SET_CLOSE, SET_OPEN};
use crate::latex_rules::{
    join_explicit_groups, mark_list_commas, replace_commands, strip_text, strip_unit_words,
    REPLACEMENTS,
};

/// Deepest nesting of `( [ {` in `s` (linear).
fn max_depth(s: &str) -> usize {
    let (mut d, mut m) = (0usize, 0usize);
    for b in s.bytes() {
        match b {
            b'(' | b'[' | b'{' => {
                d += 1;
                m = m.max(d);
            }
            b')' | b']' | b'}' => d = d.saturating_sub(1),
            _ => {}
        }
    }
    m
}

/// Deepest bracket nesting that [`normalize`] rewrites structurally; deeper input is only stripped of
/// whitespace (keeps hostile input linear and the recursion shallow).
pub const MAX_NORMALIZE_DEPTH: usize = 200;

/// Wraps single-character arguments of `\frac` and `\sqrt` in braces: `\frac12` → `\frac{1}{2}`,
/// `\frac9{19}` → `\frac{9}{19}`, `\sqrt2` → `\sqrt{2}`; and `^{2}` / `_{5}` single tokens lose braces.
fn fix_args(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let (cmd, nargs) = if rest.starts_with("\\frac") {
            ("\\frac", 2)
        } else if rest.starts_with("\\sqrt") {
            ("\\sqrt", 1)
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
            continue;
        };
        out.push_str(cmd);
        i += cmd.len();
        for _ in 0..nargs {
            let r = &s[i..];
            if r.starts_with('{') {
                match matching_brace(s, i) {
                    Some(close) => {
                        out.push('{');
                        out.push_str(&fix_args(&s[i + 1..close]));
                        out.push('}');
                        i = close + 1;
                    }
                    None => break,
                }
            } else if r.starts_with('[') {
                // \sqrt[n]{x}: keep the index and still read the braced radicand.
                break;
            } else if let Some(c) = r.chars().next().filter(|c| c.is_alphanumeric()) {
                out.push('{');
                out.push(c);
                out.push('}');
                i += c.len_utf8();
            } else {
                break;
            }
        }
    }
    out
}

/// Removes braces around a single character after `^` or `_` (`x^{2}` → `x^2`, `4210_{5}` → `4210_5`).
fn unbrace_scripts(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        out.push(c);
        if (c == '^' || c == '_')
            && chars.get(i + 1) == Some(&'{')
            && chars.get(i + 3) == Some(&'}')
        {
            if let Some(&x) = chars.get(i + 2) {
                out.push(x);
                i += 4;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// True for `-?\d{1,3}(,\d{3})+(\.\d+)?`.
fn is_grouped_number(s: &str) -> bool {
    let s = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = match s.split_once('.') {
        Some((a, b)) => (a, Some(b)),
        None => (s, None),
    };
    if let Some(f) = frac {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    let groups: Vec<&str> = int.split(',').collect();
    groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_digit()))
        && groups[1..].iter().all(|g| g.len() == 3)
}

/// Normalises a LaTeX answer for comparison (see the module docs). Total: never fails.
///
/// ```
/// use rlvr_reward::latex::normalize;
/// assert_eq!(normalize(r"\left( 3, \dfrac{\pi}{2} \right)"), r"(3,\frac{\pi}{2})");
/// assert_eq!(normalize(r"\$32,\!348"), "32348");
/// assert_eq!(normalize(r"\frac{270}7\text{ degrees}"), r"\frac{270}{7}");
/// ```
pub fn normalize(answer: &str) -> String {
    strip_short_label(normalize_keep_label(answer))
}

/// Drops a short left-hand side: `x=5` → `5`, `x\in[-2,7]` → `[-2,7]` (at most two characters before a
/// single `=` or the `\in` command).
fn strip_short_label(mut s: String) -> String {
    if let Some(k) = find_command(&s, "in") {
        let (lhs, rhs) = (&s[..k], &s[k + 3..]);
        if lhs.chars().count() <= 2 && !rhs.is_empty() {
            return rhs.to_string();
        }
    }
    if s.matches('=').count() == 1 {
        if let Some((lhs, rhs)) = s.split_once('=') {
            if lhs.chars().count() <= 2 && !rhs.is_empty() {
                s = rhs.to_string();
            }
        }
    }
    s
}

/// Byte offset of the first `\name` in `s` that is the whole command name (`\in` but not `\infty`).
pub(crate) fn find_command(s: &str, name: &str) -> Option<usize> {
    let pat = format!("\\{name}");
    s.match_indices(&pat)
        .map(|(k, _)| k)
        .find(|&k| !s[k + pat.len()..].starts_with(|c: char| c.is_ascii_alphabetic()))
}

/// Rewrites every matrix environment (`pmatrix`, `bmatrix`, `Bmatrix`, `smallmatrix`, `array` with its
/// column spec) to `\begin{matrix}...\end{matrix}`, and drops brackets around a whole matrix
/// (`\left[\begin{array}{cc}..\end{array}\right]`).
fn canonical_matrix(s: &str) -> String {
    if !s.contains("\\begin{") {
        return s.to_string();
    }
    let mut out = s.to_string();
    for env in ["pmatrix", "bmatrix", "Bmatrix", "smallmatrix", "array"] {
        out = out.replace(&format!("\\end{{{env}}}"), "\\end{matrix}");
        let open = format!("\\begin{{{env}}}");
        while let Some(k) = out.find(&open) {
            let mut end = k + open.len();
            if env == "array" && out[end..].starts_with('{') {
                end = matching_brace(&out, end).map_or(end, |c| c + 1);
            }
            out.replace_range(k..end, "\\begin{matrix}");
        }
    }
    for (o, c) in [('[', ']'), ('(', ')')] {
        if out.starts_with(o) && out.ends_with(c) {
            let inner = &out[1..out.len() - 1];
            if inner.starts_with("\\begin{matrix}") && inner.ends_with("\\end{matrix}") {
                out = inner.to_string();
            }
        }
    }
    out
}

/// `\\name` (exactly two backslashes, then a letter) → `\name`; other text unchanged (`\\\end`
/// stays a row break before `\end`).
fn undouble_commands(s: &str) -> String {
    if !s.contains("\\\\") {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut run = 0usize;
    for c in s.chars() {
        if c == '\\' {
            run += 1;
            continue;
        }
        let keep = if run == 2 && c.is_ascii_alphabetic() {
            1
        } else {
            run
        };
        out.extend(std::iter::repeat_n('\\', keep));
        run = 0;
        out.push(c);
    }
    out.extend(std::iter::repeat_n('\\', run));
    out
}

/// Turns the words `and` / `or` between answers into a list comma / [`OR_SEP`] (`6 and 8`).
fn connector_words(s: &str) -> String {
    if !s.contains(" and ") && !s.contains(" or ") {
        return s.to_string();
    }
    s.replace(" and ", " , ")
        .replace(" or ", &format!(" {OR_SEP} "))
}

/// [`normalize`] without dropping a short left-hand side (`x = 5` stays `x=5`): the MATH verifier strips
/// labels itself, per list item and symmetrically, and needs equations whole.
pub fn normalize_keep_label(answer: &str) -> String {
    let trimmed = answer.trim();
    if max_depth(trimmed) > MAX_NORMALIZE_DEPTH {
        let mut s = trimmed.to_string();
        s.retain(|c| !c.is_whitespace());
        return s;
    }
    // A doubled backslash before a command name is an escaped command (`\\boxed`, `\\left(` from
    // text written through one more layer of escaping), not a row break followed by a letter.
    let undoubled = undouble_commands(trimmed);
    // `;` separates answers (`-12;-11;-10`, `(0;-2;6)`): a list comma.
    let semis = undoubled.replace(';', ", ");
    // LaTeX's row break `\\` first, so `\ ` (a spacing command) cannot eat half of it.
    let mut s = join_explicit_groups(
        &semis
            .replace('\u{2212}', "-")
            .replace("\\\\", &ROW_BREAK.to_string()),
    );
    for (from, to) in REPLACEMENTS {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s = replace_commands(&s);
    // Negated relations (`\not<`, `\not\leq`, ...) become their complements.
    for (from, to) in [
        ("\\not<", "\u{2265}"),
        ("\\not>", "\u{2264}"),
        ("\\not\u{2264}", ">"),
        ("\\not\u{2265}", "<"),
    ] {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s = strip_text(&s);
    s = connector_words(&s);
    s = strip_unit_words(&s);
    s = mark_list_commas(&s);
    s.retain(|c| !c.is_whitespace());
    s = fix_args(&s);
    s = unbrace_scripts(&s);
    while s.ends_with(['.', ',', LIST_SEP]) {
        s.pop();
    }
    s = canonical_matrix(&s);
    // One brace group around the whole answer (`{1,2,3}`, an argument's braces kept by the box) is
    // grouping only: `\{..\}` is the set.
    while s.starts_with('{') && matching_brace(&s, 0) == Some(s.len() - 1) {
        s = s[1..s.len() - 1].to_string();
    }
    if s.contains(LIST_SEP) {
        let parts: Vec<String> = s
            .split(LIST_SEP)
            .map(|p| {
                if is_grouped_number(p) {
                    p.replace(',', "")
                } else {
                    p.to_string()
                }
            })
            .collect();
        s = parts.join(",");
    } else if is_grouped_number(&s) {
        s.retain(|c| c != ',');
    }
    // A plain number followed by a unit word written without `\text` (`18.90dollars`, `30degrees`):
    // keep the number. Words of one or two letters stay, since they may be variables (`5x`, `2xy`).
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(s.len());
    let tail = &s[digits_end..];
    if digits_end > 0 && tail.len() >= 3 && tail.bytes().all(|b| b.is_ascii_alphabetic()) {
        s.truncate(digits_end);
    }
    if s.starts_with('.') {
        s.insert(0, '0');
    } else if s.starts_with("-.") {
        s.insert(1, '0');
    }
    // `(C)` → `C` for a single capital letter (multiple-choice answers).
    let b = s.as_bytes();
    if b.len() == 3 && b[0] == b'(' && b[2] == b')' && b[1].is_ascii_uppercase() {
        s = s[1..2].to_string();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisations() {
        let cases = [
            (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
            (r"90^\circ", "90"),
            (r"10,\!080", "10080"),
            (r"\text{(C)}", "C"),
            (r"\frac 59", r"\frac{5}{9}"),
            (r"\frac9{19}", r"\frac{9}{19}"),
            (r"11\sqrt2", r"11\sqrt{2}"),
            (r"864 \mbox{ inches}^2", "864"),
            (r"5.4 \text{ cents}", "5.4"),
            (r"\text{Evelyn}", "Evelyn"),
            (r"x \in [-2,7]", "[-2,7]"),
            (r"x=5", "5"),
            (r".0000672", "0.0000672"),
            (r"4210_{5}", "4210_5"),
            (r"50\%", "50"),
            (r"\{1\pm\sqrt{5},-2\}", "\u{2983}1\\pm\\sqrt{5},-2\u{2984}"),
        ];
        for (a, b) in cases {
            assert_eq!(normalize(a), b, "{a}");
        }
    }
}
