//! MATH (Hendrycks et al.; MATH-500) verifier.
//!
//! Gold: the last `\boxed{}` of the reference when it has one (a full solution), else the reference as
//! a bare answer. Extracted: the last `\boxed{}` of the completion (nested braces; `\fbox` too); no box
//! scores 0. Both are normalised by [`crate::latex::normalize`] and then judged equal by
//! [`equivalent`]:
//! 1. equal normalised strings;
//! 2. unions (`A\cup B`) part by part; tuples and intervals (`(a,b]`) element by element with the same
//!    brackets; sets (`\{a,b\}`) and bare lists (`1,-2`) as unordered multisets (a set equals the same
//!    bare list); matrices (`pmatrix`, `bmatrix`) cell by cell;
//! 3. equations with one `=` side by side;
//! 4. expressions: exact rational equality when both sides are rational (`0.5` = `\frac12`, but
//!    `0.333` ≠ `\frac13`), otherwise numeric agreement (relative 1e-9) at three fixed assignments of the
//!    variables (`p - q` = `-q + p`, `\frac{\sqrt3}{2}` = `\sqrt{3}/2`, `2\sqrt2` = `\sqrt8`).

use crate::expr::parse_expr;
use crate::extract::last_boxed;
use crate::latex::{normalize, ROW_BREAK, SET_CLOSE, SET_OPEN};
use crate::{Sample, Score, Verifier};
use std::collections::BTreeSet;

/// Splits `s` at top-level occurrences of `sep` (outside (), [], {}, and set braces).
fn split_top(s: &str, sep: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut last = 0;
    let mut i = 0;
    while i < s.len() {
        let c = match s[i..].chars().next() {
            Some(c) => c,
            None => break,
        };
        match c {
            '(' | '[' | '{' | SET_OPEN => depth += 1,
            ')' | ']' | '}' | SET_CLOSE => depth -= 1,
            _ => {}
        }
        if depth == 0 && s[i..].starts_with(sep) {
            parts.push(s[last..i].to_string());
            i += sep.len();
            last = i;
            continue;
        }
        i += c.len_utf8();
    }
    parts.push(s[last..].to_string());
    parts
}

/// True when the bracket opening at byte 0 closes at the last character.
fn encloses_whole(s: &str) -> bool {
    let mut depth = 0i32;
    let n = s.chars().count();
    for (k, c) in s.chars().enumerate() {
        match c {
            '(' | '[' | '{' | SET_OPEN => depth += 1,
            ')' | ']' | '}' | SET_CLOSE => depth -= 1,
            _ => {}
        }
        if depth == 0 && k + 1 < n {
            return false;
        }
    }
    depth == 0
}

/// Splits a bracketed list `(a,b]` into its brackets and elements, if `s` is one with a top-level comma.
fn bracketed(s: &str) -> Option<(char, char, Vec<String>)> {
    let first = s.chars().next()?;
    let last = s.chars().next_back()?;
    if !matches!(first, '(' | '[' | SET_OPEN) || !matches!(last, ')' | ']' | SET_CLOSE) {
        return None;
    }
    if s.chars().count() < 2 || !encloses_whole(s) {
        return None;
    }
    let inner = &s[first.len_utf8()..s.len() - last.len_utf8()];
    let parts = split_top(inner, ",");
    (parts.len() > 1 || first == SET_OPEN).then_some((first, last, parts))
}

/// The rows and cells of a normalised `\begin{pmatrix}...\end{pmatrix}` (also bmatrix, matrix).
fn matrix(s: &str) -> Option<Vec<Vec<String>>> {
    for env in ["pmatrix", "bmatrix", "matrix"] {
        let body = s
            .strip_prefix(&format!("\\begin{{{env}}}"))
            .and_then(|r| r.strip_suffix(&format!("\\end{{{env}}}")));
        if let Some(body) = body {
            let rows = body.trim_end_matches(ROW_BREAK).split(ROW_BREAK);
            return Some(
                rows.map(|r| r.split('&').map(str::to_string).collect())
                    .collect(),
            );
        }
    }
    None
}

/// Unordered multiset equality under [`equiv_norm`].
fn same_multiset(a: &[String], b: &[String], depth: usize) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() > 64 {
        // Quadratic matching is bounded: long lists compare in order.
        return a.iter().zip(b).all(|(x, y)| equiv_norm(x, y, depth + 1));
    }
    let mut used = vec![false; b.len()];
    a.iter().all(|x| {
        let hit = (0..b.len()).find(|&j| !used[j] && equiv_norm(x, &b[j], depth + 1));
        match hit {
            Some(j) => {
                used[j] = true;
                true
            }
            None => false,
        }
    })
}

/// Numeric agreement of two expressions (see the module docs).
fn same_expression(a: &str, b: &str) -> bool {
    let (Some(ea), Some(eb)) = (parse_expr(a), parse_expr(b)) else {
        return false;
    };
    let mut vars = BTreeSet::new();
    ea.vars(&mut vars);
    eb.vars(&mut vars);
    let vars: Vec<char> = vars.into_iter().collect();
    let mut agreed = 0;
    for trial in 0..3 {
        let assign = |c: char| {
            let k = vars.iter().position(|&v| v == c).unwrap_or(0) as f64;
            // Distinct irrational-ish values per variable and trial.
            0.6180339887 + 1.3247179572 * k + 0.7548776662 * trial as f64 + 0.1 * (k * k)
        };
        let (va, vb) = (ea.eval(&assign), eb.eval(&assign));
        if let (Some(x), Some(y)) = (va.exact, vb.exact) {
            return x == y;
        }
        let (x, y) = (va.approx, vb.approx);
        if !x.is_finite() || !y.is_finite() {
            if x.is_finite() != y.is_finite() {
                return false;
            }
            continue;
        }
        if (x - y).abs() > 1e-9 * x.abs().max(y.abs()).max(1.0) {
            return false;
        }
        agreed += 1;
    }
    agreed > 0
}

/// Equivalence of two already normalised answers.
fn equiv_norm(a: &str, b: &str, depth: usize) -> bool {
    if a == b {
        return true;
    }
    if depth > 16 || a.is_empty() || b.is_empty() {
        return false;
    }
    let (ua, ub) = (split_top(a, "\\cup"), split_top(b, "\\cup"));
    if ua.len() > 1 || ub.len() > 1 {
        return ua.len() == ub.len()
            && ua.iter().zip(&ub).all(|(x, y)| equiv_norm(x, y, depth + 1));
    }
    match (bracketed(a), bracketed(b)) {
        (Some((oa, ca, pa)), Some((ob, cb, pb))) => {
            if oa != ob || ca != cb {
                return false;
            }
            if oa == SET_OPEN {
                return same_multiset(&pa, &pb, depth);
            }
            return pa.len() == pb.len()
                && pa.iter().zip(&pb).all(|(x, y)| equiv_norm(x, y, depth + 1));
        }
        (None, None) => {}
        // A set against a bare list (`\{1,2\}` vs `1, 2`): both are solution sets.
        (Some((SET_OPEN, SET_CLOSE, pa)), None) if !b.starts_with(['(', '[']) => {
            return same_multiset(&pa, &split_top(b, ","), depth);
        }
        (None, Some((SET_OPEN, SET_CLOSE, pb))) if !a.starts_with(['(', '[']) => {
            return same_multiset(&split_top(a, ","), &pb, depth);
        }
        _ => return false,
    }
    if let (Some(ma), Some(mb)) = (matrix(a), matrix(b)) {
        return ma.len() == mb.len()
            && ma.iter().zip(&mb).all(|(ra, rb)| {
                ra.len() == rb.len() && ra.iter().zip(rb).all(|(x, y)| equiv_norm(x, y, depth + 1))
            });
    }
    let (la, lb) = (split_top(a, ","), split_top(b, ","));
    if la.len() > 1 || lb.len() > 1 {
        return same_multiset(&la, &lb, depth);
    }
    let (qa, qb) = (split_top(a, "="), split_top(b, "="));
    if qa.len() > 1 || qb.len() > 1 {
        return qa.len() == qb.len()
            && qa.iter().zip(&qb).all(|(x, y)| equiv_norm(x, y, depth + 1));
    }
    same_expression(a, b)
}

/// True when two LaTeX answers are equivalent (normalised, then compared as in the module docs).
///
/// ```
/// use rlvr_reward::math::equivalent;
/// assert!(equivalent(r"\dfrac{1}{2}", "0.5"));
/// assert!(equivalent(r"\left( 3, \frac{\pi}{2} \right)", r"(3,\pi/2)"));
/// assert!(!equivalent("(3,4]", "(3,4)"));
/// ```
pub fn equivalent(a: &str, b: &str) -> bool {
    equiv_norm(&normalize(a), &normalize(b), 0)
}

/// The gold answer of a MATH reference: its last `\boxed{}`, else the whole reference.
pub fn gold_answer(reference: &str) -> &str {
    last_boxed(reference).unwrap_or(reference).trim()
}

/// Scores MATH completions: reward 1 when the last boxed answer is [`equivalent`] to the gold.
#[derive(Debug, Clone, Copy, Default)]
pub struct MathVerifier;

impl Verifier for MathVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, crate::RewardError> {
        let gold = gold_answer(sample.reference);
        let got = last_boxed(sample.completion).map(str::trim);
        let correct = got.is_some_and(|g| equivalent(g, gold));
        Ok(Score::binary(
            correct,
            got.map(str::to_string),
            Some(gold.to_string()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures() {
        assert!(equivalent("1,-2", "-2, 1"));
        assert!(equivalent(r"\{1\pm\sqrt{5},-2\}", r"\{-2, 1\pm\sqrt{5}\}"));
        assert!(equivalent("(0,9) \\cup (9,36)", "(0, 9)\\cup(9, 36)"));
        assert!(!equivalent("(0,9) \\cup (9,36)", "(9,36)\\cup(0,9)"));
        assert!(equivalent("y = 2x + 3", "y=3+2x"));
        assert!(!equivalent("(1,2)", "1,2"));
        assert!(!equivalent("(a+5)(b+2)", "(a+2)(b+5)"));
        assert!(equivalent("(a+5)(b+2)", "(b+2)(a+5)"));
    }
}
