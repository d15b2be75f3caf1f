//! The shapes a normalised MATH answer can have, read without judging: top-level splitting, brackets,
//! lists and sets (with `\pm` pairs), matrices, labels, equations, memberships, relations, intervals and
//! `\approx` values. [`crate::answer`] compares them.

use crate::expr::parse_expr;
use crate::latex::{find_command, OR_SEP, ROW_BREAK, SET_CLOSE, SET_OPEN};
use crate::sampling::is_constant;

/// Splits `s` at top-level occurrences of `sep` (outside (), [], {}, and set braces).
pub(crate) fn split_top<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    split_top_any(s, &[sep])
}

/// Splits `s` at top-level occurrences of any of `seps` (outside brackets).
pub(crate) fn split_top_any<'a>(s: &'a str, seps: &[&str]) -> Vec<&'a str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut last = 0;
    let mut i = 0;
    while i < s.len() {
        let Some(c) = s[i..].chars().next() else {
            break;
        };
        match c {
            '(' | '[' | '{' | SET_OPEN => depth += 1,
            ')' | ']' | '}' | SET_CLOSE => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            if let Some(sep) = seps.iter().find(|p| s[i..].starts_with(**p)) {
                // `\in` must not match `\infty`.
                let whole = !sep.starts_with('\\')
                    || !s[i + sep.len()..].starts_with(|c: char| c.is_ascii_alphabetic());
                if whole {
                    parts.push(&s[last..i]);
                    i += sep.len();
                    last = i;
                    continue;
                }
            }
        }
        i += c.len_utf8();
    }
    parts.push(&s[last..]);
    parts
}

/// True when the bracket opening at byte 0 closes at the last character.
pub(crate) fn encloses_whole(s: &str) -> bool {
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

/// Splits a bracketed list `(a,b]` into its brackets and elements, if `s` is one with a top-level comma
/// (or a set `\{a\}` with any number of elements).
pub(crate) fn bracketed(s: &str) -> Option<(char, char, Vec<&str>)> {
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

/// The rows and cells of a normalised `\begin{matrix}...\end{matrix}` (every matrix environment is
/// rewritten to this one by the normaliser).
pub(crate) fn matrix(s: &str) -> Option<Vec<Vec<&str>>> {
    let body = s
        .strip_prefix("\\begin{matrix}")
        .and_then(|r| r.strip_suffix("\\end{matrix}"))?;
    let rows = body.trim_end_matches(ROW_BREAK).split(ROW_BREAK);
    Some(rows.map(|r| r.split('&').collect()).collect())
}

/// Most cells of a matrix expression [`matrix_arithmetic`] evaluates (bounds the work).
pub(crate) const MAX_MATRIX_CELLS: usize = 256;

/// A sum, difference or product of normalised matrices (`A+B`, `A-B`, `AB`, `A*B`), as the cells of
/// the result written as expressions (`(1)+(5)`, `(1)*(5)+(2)*(7)`), evaluated left to right; `None`
/// for a single matrix, other text between them, shapes that do not conform, or more than
/// [`MAX_MATRIX_CELLS`] cells.
pub(crate) fn matrix_arithmetic(s: &str) -> Option<Vec<Vec<String>>> {
    const OPEN: &str = "\\begin{matrix}";
    const CLOSE: &str = "\\end{matrix}";
    let mut rest = s;
    let mut acc: Option<Vec<Vec<String>>> = None;
    let mut op = "";
    let mut count = 0;
    while !rest.is_empty() {
        let body = rest.strip_prefix(OPEN)?;
        let end = body.find(CLOSE)?;
        if body[..end].contains(OPEN) {
            return None;
        }
        let m: Vec<Vec<String>> = matrix(&rest[..OPEN.len() + end + CLOSE.len()])?
            .into_iter()
            .map(|r| r.into_iter().map(|c| format!("({c})")).collect())
            .collect();
        if m.iter().map(Vec::len).sum::<usize>() > MAX_MATRIX_CELLS
            || m.iter().any(|r| r.len() != m[0].len())
        {
            return None;
        }
        rest = &body[end + CLOSE.len()..];
        acc = Some(match acc {
            None => m,
            Some(a) => match op {
                "+" | "-" => {
                    if a.len() != m.len() || a[0].len() != m[0].len() {
                        return None;
                    }
                    a.iter()
                        .zip(&m)
                        .map(|(x, y)| {
                            x.iter()
                                .zip(y)
                                .map(|(p, q)| format!("({p}){op}{q}"))
                                .collect()
                        })
                        .collect()
                }
                _ => {
                    if a[0].len() != m.len() {
                        return None;
                    }
                    (0..a.len())
                        .map(|i| {
                            (0..m[0].len())
                                .map(|j| {
                                    let terms: Vec<String> = (0..m.len())
                                        .map(|k| format!("{}*{}", a[i][k], m[k][j]))
                                        .collect();
                                    format!("({})", terms.join("+"))
                                })
                                .collect()
                        })
                        .collect()
                }
            },
        });
        count += 1;
        op = match rest.chars().next() {
            Some(c @ ('+' | '-' | '*')) => {
                rest = &rest[1..];
                match c {
                    '+' => "+",
                    '-' => "-",
                    _ => "*",
                }
            }
            _ => "*",
        };
    }
    (count > 1 && op == "*").then_some(acc?)
}

/// How a list's items compare.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ListKind {
    /// `\{a, b\}` (also a union of such sets).
    Set,
    /// `a, b` or `a \text{ and } b` or `a \text{ or } b`, or the two values of `a \pm b`.
    Bare,
}

/// `a \pm b` (one top-level `\pm` or `\mp`) → `a+b`, `a-b`.
pub(crate) fn expand_pm(s: &str) -> Option<Vec<String>> {
    let parts = split_top_any(s, &["\\pm", "\\mp"]);
    if parts.len() != 2 || parts[1].is_empty() {
        return None;
    }
    let (a, b) = (parts[0], parts[1]);
    if a.is_empty() {
        return Some(vec![format!("{b}"), format!("-({b})")]);
    }
    Some(vec![format!("{a}+({b})"), format!("{a}-({b})")])
}

/// The items of a list-shaped answer: a set, a union of sets, a bare comma / "and" / "or" list, or a
/// `\pm` pair; each item's own `\pm` is expanded too. `None` for anything else.
pub(crate) fn list_items(s: &str) -> Option<(ListKind, Vec<String>)> {
    let (kind, raw): (ListKind, Vec<String>) =
        if let Some((SET_OPEN, SET_CLOSE, parts)) = bracketed(s) {
            (ListKind::Set, parts.iter().map(|p| p.to_string()).collect())
        } else if split_top(s, "\\cup").len() > 1
            && split_top(s, "\\cup")
                .iter()
                .all(|p| p.starts_with(SET_OPEN))
        {
            let mut all = Vec::new();
            for part in split_top(s, "\\cup") {
                let (_, _, items) = bracketed(part)?;
                all.extend(items.iter().map(|p| p.to_string()));
            }
            (ListKind::Set, all)
        } else {
            let parts = split_top_any(s, &[",", &OR_SEP.to_string()]);
            if parts.len() > 1 {
                (
                    ListKind::Bare,
                    parts.iter().map(|p| p.to_string()).collect(),
                )
            } else {
                (ListKind::Bare, expand_pm(s)?)
            }
        };
    let mut items = Vec::with_capacity(raw.len());
    for it in raw {
        match expand_pm(&it) {
            Some(two) => items.extend(two),
            None => items.push(it),
        }
    }
    Some((kind, items))
}

/// A label name: letters (at most 6, e.g. `x`, `AB`, `Area`) or a Greek command, with an optional
/// subscript, primes and argument list (`x_1`, `f'(x)`, `P(A)`), or an angle (`\angle ABC`,
/// `m\angle A`).
pub(crate) fn is_label_name(s: &str) -> bool {
    let s = s
        .strip_prefix("m\\angle")
        .or_else(|| s.strip_prefix("\\angle"))
        .unwrap_or(s);
    let b = s.as_bytes();
    let mut i = 0;
    if b.first() == Some(&b'\\') {
        let n = b[1..]
            .iter()
            .take_while(|c| c.is_ascii_alphabetic())
            .count();
        const GREEK: &[&str] = &[
            "alpha", "beta", "gamma", "delta", "theta", "lambda", "mu", "rho", "sigma", "tau",
            "phi", "psi", "omega", "varphi", "epsilon",
        ];
        if !GREEK.contains(&&s[1..1 + n]) {
            return false;
        }
        i = 1 + n;
    } else {
        let n = b.iter().take_while(|c| c.is_ascii_alphabetic()).count();
        if n == 0 || n > 6 {
            return false;
        }
        i += n;
    }
    if b.get(i) == Some(&b'_') {
        i += 1;
        if b.get(i) == Some(&b'{') {
            let n = b[i..].iter().position(|&c| c == b'}');
            match n {
                Some(n) if b[i + 1..i + n].iter().all(|c| c.is_ascii_alphanumeric()) => i += n + 1,
                _ => return false,
            }
        } else if b.get(i).is_some_and(|c| c.is_ascii_alphanumeric()) {
            i += 1;
        } else {
            return false;
        }
    }
    while b.get(i) == Some(&b'\'') {
        i += 1;
    }
    let rest = &s[i..];
    if rest.is_empty() {
        return true;
    }
    // An argument list: `f(x)`, `P(A,B)`, `g(2)`.
    rest.starts_with('(')
        && rest.ends_with(')')
        && encloses_whole(rest)
        && split_top(&rest[1..rest.len() - 1], ",").iter().all(|a| {
            !a.is_empty()
                && a.chars()
                    .all(|c| c.is_alphanumeric() || c == '.' || c == '-')
        })
}

/// A label: a label name, a tuple of names (`(p,q)`), or a quantity named by names only: a ratio
/// (`A:B`, `V_1:V_2`), a quotient (`\frac{NO}{BO}`) or a length (`|AB|`).
pub(crate) fn is_label(s: &str) -> bool {
    if let Some(('(', ')', parts)) = bracketed(s) {
        return parts.iter().all(|p| is_label_name(p));
    }
    if let Some(inner) = s.strip_prefix('|').and_then(|r| r.strip_suffix('|')) {
        return is_label_name(inner);
    }
    if let Some(rest) = s.strip_prefix("\\frac{") {
        if let Some(close) = crate::latex_marks::matching_brace(s, "\\frac".len()) {
            let num = &rest[..close - "\\frac{".len()];
            let den = &s[close + 1..];
            if let Some(den) = den.strip_prefix('{').and_then(|d| d.strip_suffix('}')) {
                return is_label_name(num) && is_label_name(den);
            }
        }
        return false;
    }
    let ratio = split_top(s, ":");
    if ratio.len() > 1 {
        return ratio.iter().all(|p| is_label_name(p));
    }
    is_label_name(s)
}

/// The two sides of an equation with exactly one top-level `=`.
pub(crate) fn equation(s: &str) -> Option<(&str, &str)> {
    let sides = split_top(s, "=");
    (sides.len() == 2 && !sides[0].is_empty() && !sides[1].is_empty()).then(|| (sides[0], sides[1]))
}

/// `label \in set` → (label, set).
pub(crate) fn membership(s: &str) -> Option<(&str, &str)> {
    let k = find_command(s, "in")?;
    let (lhs, rhs) = (&s[..k], &s[k + 3..]);
    (is_label(lhs) && !rhs.is_empty()).then_some((lhs, rhs))
}

pub(crate) const REL_OPS: [char; 5] = ['<', '>', '\u{2264}', '\u{2265}', '\u{2260}'];

/// A relation chain `a < b ≤ c` with its direction normalised to `<`/`≤` (`x ≥ 5` → `5 ≤ x`).
#[derive(Debug)]
pub(crate) struct Relation<'a> {
    pub(crate) sides: Vec<&'a str>,
    pub(crate) ops: Vec<char>,
}

pub(crate) fn relation(s: &str) -> Option<Relation<'_>> {
    let mut sides = Vec::new();
    let mut ops = Vec::new();
    let mut depth = 0i32;
    let mut last = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' | SET_OPEN => depth += 1,
            ')' | ']' | '}' | SET_CLOSE => depth -= 1,
            _ if depth == 0 && REL_OPS.contains(&c) => {
                sides.push(&s[last..i]);
                ops.push(c);
                last = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if ops.is_empty() {
        return None;
    }
    sides.push(&s[last..]);
    if sides.iter().any(|x| x.is_empty()) {
        return None;
    }
    if ops.iter().all(|&o| o == '>' || o == '\u{2265}') {
        sides.reverse();
        ops.reverse();
        for o in &mut ops {
            *o = if *o == '>' { '<' } else { '\u{2264}' };
        }
    }
    Some(Relation { sides, ops })
}

/// An interval bound: its text and whether it is closed.
#[derive(Debug, Clone)]
pub(crate) struct Interval {
    pub(crate) lo: String,
    pub(crate) hi: String,
    pub(crate) lo_closed: bool,
    pub(crate) hi_closed: bool,
}

pub(crate) fn bound_value(s: &str) -> Option<f64> {
    match s {
        "\\infty" => Some(f64::INFINITY),
        "-\\infty" => Some(f64::NEG_INFINITY),
        _ => {
            let e = parse_expr(s)?;
            is_constant(&e).then(|| e.eval(&|_| f64::NAN).approx)
        }
    }
}

/// An interval `(a,b]` (or a union of them), when its bounds are constants with `a < b`: a pair whose
/// first value is not below the second is a point, not an interval.
pub(crate) fn intervals(s: &str) -> Option<Vec<Interval>> {
    split_top(s, "\\cup")
        .into_iter()
        .map(|part| {
            let (o, c, items) = bracketed(part)?;
            if o == SET_OPEN || items.len() != 2 {
                return None;
            }
            let (lo, hi) = (bound_value(items[0])?, bound_value(items[1])?);
            (lo < hi).then(|| Interval {
                lo: items[0].to_string(),
                hi: items[1].to_string(),
                lo_closed: o == '[',
                hi_closed: c == ']',
            })
        })
        .collect()
}

/// The set a relation in one variable describes, as intervals, with the variable. The variable side
/// must be a label (`x`, `f(x)`), every other side a constant: `0 < x+1 < 1` or `0 < x < y` describe no
/// interval of a named quantity and never match one.
pub(crate) fn relation_intervals(r: &Relation<'_>) -> Option<(String, Vec<Interval>)> {
    let constant = |s: &str| bound_value(s).is_some_and(|v| !v.is_nan());
    let iv = |lo: &str, hi: &str, lc: bool, hc: bool| Interval {
        lo: lo.to_string(),
        hi: hi.to_string(),
        lo_closed: lc,
        hi_closed: hc,
    };
    match (r.sides.as_slice(), r.ops.as_slice()) {
        ([a, b], [op]) => {
            let (var, c, var_left) = if is_label(a) && constant(b) {
                (*a, *b, true)
            } else if is_label(b) && constant(a) {
                (*b, *a, false)
            } else {
                return None;
            };
            let closed = *op == '\u{2264}';
            let ivs = match (op, var_left) {
                ('\u{2260}', _) => vec![
                    iv("-\\infty", c, false, false),
                    iv(c, "\\infty", false, false),
                ],
                (_, true) => vec![iv("-\\infty", c, false, closed)],
                (_, false) => vec![iv(c, "\\infty", closed, false)],
            };
            Some((var.to_string(), ivs))
        }
        ([a, v, b], [o1, o2])
            if is_label(v)
                && constant(a)
                && constant(b)
                && !o1.eq(&'\u{2260}')
                && !o2.eq(&'\u{2260}') =>
        {
            Some((
                v.to_string(),
                vec![iv(a, b, *o1 == '\u{2264}', *o2 == '\u{2264}')],
            ))
        }
        _ => None,
    }
}

/// The set an answer describes as intervals, with its variable when it names one: an interval or union,
/// `x \in` one, a relation, or relations joined by "or" (all in the same variable).
pub(crate) fn as_intervals(s: &str) -> Option<(Option<String>, Vec<Interval>)> {
    if let Some((var, set)) = membership(s) {
        return Some((Some(var.to_string()), intervals(set)?));
    }
    if let Some(iv) = intervals(s) {
        return Some((None, iv));
    }
    let parts = split_top(s, &OR_SEP.to_string());
    let mut var: Option<String> = None;
    let mut all = Vec::new();
    for p in parts {
        let (v, ivs) = relation_intervals(&relation(p)?)?;
        if var.as_ref().is_some_and(|w| *w != v) {
            return None;
        }
        var = Some(v);
        all.extend(ivs);
    }
    Some((var, all))
}

/// Tolerance of an `\approx` answer: one unit in its last written decimal place, and at most this share
/// of the exact value (so `\approx 0` never matches a small non-zero gold).
pub const APPROX_REL: f64 = 0.01;

/// A plain decimal `-12.34` → (value, decimals written).
pub(crate) fn decimal(s: &str) -> Option<(f64, i32)> {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some((s.parse().ok()?, frac.len() as i32))
}

/// Whether the decimal `approx` is within the [`APPROX_REL`] tolerance of the constant `exact`.
pub(crate) fn approx_close(exact: &str, approx: &str) -> bool {
    let (Some(e), Some((v, d))) = (parse_expr(exact), decimal(approx)) else {
        return false;
    };
    if !is_constant(&e) {
        return false;
    }
    let x = e.eval(&|_| f64::NAN).approx;
    let diff = (x - v).abs();
    x.is_finite() && diff <= 10f64.powi(-d) * (1.0 + 1e-9) && diff <= APPROX_REL * x.abs()
}

/// `a \approx b` → (a, b) at the last top-level `\approx` (a may be empty).
pub(crate) fn approx_split(s: &str) -> Option<(&str, &str)> {
    let parts = split_top(s, "\\approx");
    if parts.len() < 2 {
        return None;
    }
    let last = parts[parts.len() - 1];
    let before = &s[..s.len() - last.len() - "\\approx".len()];
    Some((before, last))
}
