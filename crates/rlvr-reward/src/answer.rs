//! Structural comparison of two normalised MATH answers (see [`crate::math`] for the policies and
//! [`crate::latex::normalize_keep_label`] for the normal form).
//!
//! [`compare`] takes the gold first: a few rules are asymmetric on purpose (each says why where it is
//! applied). It returns the verdict with the reasons that decided it, for `rlvr reward --explain`.

use crate::expr::{is_constant, parse_expr, proportional, same_value, Expr};
use crate::latex::{find_command, OR_SEP, ROW_BREAK, SET_CLOSE, SET_OPEN};

/// Deepest recursion of [`compare`] (each level strips a bracket, list, label or relation).
const MAX_DEPTH: usize = 16;
/// Longest list compared as an unordered multiset (quadratic matching); longer lists compare in order.
const MAX_UNORDERED: usize = 64;

/// A verdict and the reasons that led to it (outermost first).
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// Whether the answers were judged equal.
    pub equal: bool,
    /// Why, one short sentence per deciding step (at most 24).
    pub reasons: Vec<String>,
}

struct Ctx {
    reasons: Vec<String>,
    quiet: bool,
}

impl Ctx {
    fn note(&mut self, depth: usize, msg: impl Into<String>) {
        if !self.quiet && self.reasons.len() < 24 {
            self.reasons
                .push(format!("{}{}", "  ".repeat(depth.min(8)), msg.into()));
        }
    }
}

/// Compares a normalised gold answer with a normalised predicted one (gold first).
pub fn compare(gold: &str, pred: &str) -> Judgement {
    let mut cx = Ctx {
        reasons: Vec::new(),
        quiet: false,
    };
    let equal = eq(gold, pred, 0, &mut cx);
    Judgement {
        equal,
        reasons: cx.reasons,
    }
}

/// Splits `s` at top-level occurrences of `sep` (outside (), [], {}, and set braces).
pub(crate) fn split_top<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    split_top_any(s, &[sep])
}

/// Splits `s` at top-level occurrences of any of `seps` (outside brackets).
fn split_top_any<'a>(s: &'a str, seps: &[&str]) -> Vec<&'a str> {
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

/// Splits a bracketed list `(a,b]` into its brackets and elements, if `s` is one with a top-level comma
/// (or a set `\{a\}` with any number of elements).
fn bracketed(s: &str) -> Option<(char, char, Vec<&str>)> {
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
fn matrix(s: &str) -> Option<Vec<Vec<&str>>> {
    let body = s
        .strip_prefix("\\begin{matrix}")
        .and_then(|r| r.strip_suffix("\\end{matrix}"))?;
    let rows = body.trim_end_matches(ROW_BREAK).split(ROW_BREAK);
    Some(rows.map(|r| r.split('&').collect()).collect())
}

/// How a list's items compare.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ListKind {
    /// `\{a, b\}` (also a union of such sets).
    Set,
    /// `a, b` or `a \text{ and } b` or `a \text{ or } b`, or the two values of `a \pm b`.
    Bare,
}

/// `a \pm b` (one top-level `\pm` or `\mp`) → `a+b`, `a-b`.
fn expand_pm(s: &str) -> Option<Vec<String>> {
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
fn list_items(s: &str) -> Option<(ListKind, Vec<String>)> {
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

/// Unordered multiset equality of items under [`eq`].
fn same_multiset(a: &[String], b: &[String], depth: usize, cx: &mut Ctx) -> bool {
    if a.len() != b.len() {
        cx.note(depth, format!("{} items against {}", a.len(), b.len()));
        return false;
    }
    if a.len() > MAX_UNORDERED {
        return a.iter().zip(b).all(|(x, y)| eq(x, y, depth + 1, cx));
    }
    let mut used = vec![false; b.len()];
    for (k, x) in a.iter().enumerate() {
        let hit = (0..b.len()).find(|&j| !used[j] && eq_quiet(x, &b[j], depth + 1));
        match hit {
            Some(j) => used[j] = true,
            None => {
                cx.note(depth, format!("gold item {} ({x}) has no match", k + 1));
                return false;
            }
        }
    }
    true
}

/// [`eq`] without recording reasons (for trial matches).
fn eq_quiet(a: &str, b: &str, depth: usize) -> bool {
    eq(
        a,
        b,
        depth,
        &mut Ctx {
            reasons: Vec::new(),
            quiet: true,
        },
    )
}

/// A label name: letters (at most 6, e.g. `x`, `AB`, `Area`) or a Greek command, with an optional
/// subscript, primes and argument list (`x_1`, `f'(x)`, `P(A)`), or an angle (`\angle ABC`,
/// `m\angle A`).
fn is_label_name(s: &str) -> bool {
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

/// A label: a label name or a tuple of names (`(p,q)`).
fn is_label(s: &str) -> bool {
    if let Some(('(', ')', parts)) = bracketed(s) {
        return parts.iter().all(|p| is_label_name(p));
    }
    is_label_name(s)
}

/// The two sides of an equation with exactly one top-level `=`.
fn equation(s: &str) -> Option<(&str, &str)> {
    let sides = split_top(s, "=");
    (sides.len() == 2 && !sides[0].is_empty() && !sides[1].is_empty()).then(|| (sides[0], sides[1]))
}

/// `label \in set` → (label, set).
fn membership(s: &str) -> Option<(&str, &str)> {
    let k = find_command(s, "in")?;
    let (lhs, rhs) = (&s[..k], &s[k + 3..]);
    (is_label(lhs) && !rhs.is_empty()).then_some((lhs, rhs))
}

const REL_OPS: [char; 5] = ['<', '>', '\u{2264}', '\u{2265}', '\u{2260}'];

/// A relation chain `a < b ≤ c` with its direction normalised to `<`/`≤` (`x ≥ 5` → `5 ≤ x`).
#[derive(Debug)]
struct Relation<'a> {
    sides: Vec<&'a str>,
    ops: Vec<char>,
}

fn relation(s: &str) -> Option<Relation<'_>> {
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
struct Interval {
    lo: String,
    hi: String,
    lo_closed: bool,
    hi_closed: bool,
}

fn bound_value(s: &str) -> Option<f64> {
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
fn intervals(s: &str) -> Option<Vec<Interval>> {
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
fn relation_intervals(r: &Relation<'_>) -> Option<(String, Vec<Interval>)> {
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
fn as_intervals(s: &str) -> Option<(Option<String>, Vec<Interval>)> {
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

fn same_intervals(g: &[Interval], p: &[Interval], depth: usize, cx: &mut Ctx) -> bool {
    let key = |i: &Interval| bound_value(&i.lo).unwrap_or(f64::NAN);
    let mut g = g.to_vec();
    let mut p = p.to_vec();
    g.sort_by(|a, b| key(a).total_cmp(&key(b)));
    p.sort_by(|a, b| key(a).total_cmp(&key(b)));
    if g.len() != p.len() {
        cx.note(depth, format!("{} intervals against {}", g.len(), p.len()));
        return false;
    }
    for (a, b) in g.iter().zip(&p) {
        if a.lo_closed != b.lo_closed || a.hi_closed != b.hi_closed {
            cx.note(
                depth,
                "an endpoint is open on one side and closed on the other",
            );
            return false;
        }
        if !eq(&a.lo, &b.lo, depth + 1, cx) || !eq(&a.hi, &b.hi, depth + 1, cx) {
            return false;
        }
    }
    true
}

/// Tolerance of an `\approx` answer: one unit in its last written decimal place, and at most this share
/// of the exact value (so `\approx 0` never matches a small non-zero gold).
pub const APPROX_REL: f64 = 0.01;

/// A plain decimal `-12.34` → (value, decimals written).
fn decimal(s: &str) -> Option<(f64, i32)> {
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
fn approx_close(exact: &str, approx: &str) -> bool {
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
fn approx_split(s: &str) -> Option<(&str, &str)> {
    let parts = split_top(s, "\\approx");
    if parts.len() < 2 {
        return None;
    }
    let last = parts[parts.len() - 1];
    let before = &s[..s.len() - last.len() - "\\approx".len()];
    Some((before, last))
}

/// Expressions compared by value (see [`crate::expr::same_value`]).
fn same_expr(g: &str, p: &str, depth: usize, cx: &mut Ctx) -> bool {
    match (parse_expr(g), parse_expr(p)) {
        (Some(a), Some(b)) => {
            let r = same_value(&a, &b);
            let how = if is_constant(&a) && is_constant(&b) {
                "values"
            } else {
                "values at the seeded sample points"
            };
            cx.note(
                depth,
                format!("{g} vs {p}: {how} {}", if r { "agree" } else { "differ" }),
            );
            r
        }
        _ => {
            cx.note(
                depth,
                format!("{g} vs {p}: different text, not both expressions"),
            );
            false
        }
    }
}

/// `lhs - rhs` of an equation, when both sides are expressions.
fn difference(l: &str, r: &str) -> Option<Expr> {
    Some(Expr::Sub(
        Box::new(parse_expr(l)?),
        Box::new(parse_expr(r)?),
    ))
}

/// Puts a label on the left: `5 = x` → (`x`, `5`).
fn orient<'a>(l: &'a str, r: &'a str) -> (&'a str, &'a str) {
    if !is_label(l) && is_label(r) {
        (r, l)
    } else {
        (l, r)
    }
}

fn rhs_constant(s: &str) -> bool {
    parse_expr(s).is_some_and(|e| is_constant(&e))
}

/// Equations on one or both sides (see the policy in [`crate::math`]).
fn eq_equations(g: &str, p: &str, depth: usize, cx: &mut Ctx) -> Option<bool> {
    match (equation(g), equation(p)) {
        (Some((gl, gr)), Some((pl, pr))) => {
            let ((gl, gr), (pl, pr)) = (orient(gl, gr), orient(pl, pr));
            if is_label(gl) && is_label(pl) && (gl == pl || rhs_constant(gr) || rhs_constant(pr)) {
                cx.note(depth, format!("labels {gl} and {pl} dropped"));
                if eq(gr, pr, depth + 1, cx) {
                    return Some(true);
                }
            }
            if let (Some(a), Some(b)) = (difference(gl, gr), difference(pl, pr)) {
                if proportional(&a, &b) {
                    cx.note(
                        depth,
                        "same equation: lhs - rhs proportional at the sample points",
                    );
                    return Some(true);
                }
            }
            let r = (eq_quiet(gl, pl, depth + 1) && eq_quiet(gr, pr, depth + 1))
                || (eq_quiet(gl, pr, depth + 1) && eq_quiet(gr, pl, depth + 1));
            cx.note(
                depth,
                format!(
                    "equations {}",
                    if r { "match side by side" } else { "differ" }
                ),
            );
            Some(r)
        }
        (Some((gl, gr)), None) => {
            let (gl, gr) = orient(gl, gr);
            if is_label(gl) {
                cx.note(depth, format!("gold label {gl} dropped"));
                Some(eq(gr, p, depth + 1, cx))
            } else {
                // Asymmetry: an unlabelled gold equation (`7 = 11a+c`, a plane `5x-7y+4=0`) is the
                // answer as a whole; an expression that is one of its sides is not.
                cx.note(
                    depth,
                    "gold is an equation without a label; the answer is not an equation",
                );
                Some(false)
            }
        }
        (None, Some((pl, pr))) => {
            let (pl, pr) = orient(pl, pr);
            if is_label(pl) {
                cx.note(depth, format!("answer label {pl} dropped"));
                Some(eq(g, pr, depth + 1, cx))
            } else if rhs_constant(pr) && rhs_constant(pl) {
                // Solution chain: `3 \times 4 = 12` states 12 as the result. An equation with a variable
                // (`11a+c = 7`, `5x-7y+4 = 0`) is not working towards a number and stays an equation.
                cx.note(
                    depth,
                    format!("answer is a chain: its last side {pr} is read"),
                );
                Some(eq(g, pr, depth + 1, cx))
            } else {
                cx.note(depth, "answer is an equation; the gold is not");
                Some(false)
            }
        }
        (None, None) => None,
    }
}

/// Two relations (direction normalised), or a relation against an interval form.
fn eq_relations(g: &str, p: &str, depth: usize, cx: &mut Ctx) -> Option<bool> {
    let (rg, rp) = (relation(g), relation(p));
    if rg.is_none() && rp.is_none() {
        let or = OR_SEP.to_string();
        if !g.contains(OR_SEP) && !p.contains(OR_SEP)
            || split_top(g, &or).len() + split_top(p, &or).len() < 3
        {
            return None;
        }
    }
    if let (Some(a), Some(b)) = (&rg, &rp) {
        if a.ops == b.ops && a.sides.len() == b.sides.len() {
            let same = a
                .sides
                .iter()
                .zip(&b.sides)
                .all(|(x, y)| eq_quiet(x, y, depth + 1));
            let swapped = a.ops == ['\u{2260}']
                && eq_quiet(a.sides[0], b.sides[1], depth + 1)
                && eq_quiet(a.sides[1], b.sides[0], depth + 1);
            if same || swapped {
                cx.note(depth, "same relation after normalising its direction");
                return Some(true);
            }
        }
    }
    let (ig, ip) = (as_intervals(g)?, as_intervals(p)?);
    // Asymmetry: a gold that names its variable (`x \in [..]`, `0 < x < 1`) accepts only that variable;
    // a bare interval gold names none, so any single label (`f(x)`, `t`) may carry it.
    if let (Some(vg), Some(vp)) = (&ig.0, &ip.0) {
        if vg != vp {
            cx.note(
                depth,
                format!("the answer's variable {vp} is not the gold's {vg}"),
            );
            return Some(false);
        }
    }
    cx.note(depth, "compared as sets of intervals");
    Some(same_intervals(&ig.1, &ip.1, depth, cx))
}

/// Equivalence of two normalised answers, gold first.
fn eq(g: &str, p: &str, depth: usize, cx: &mut Ctx) -> bool {
    if g == p {
        cx.note(depth, format!("{g}: identical after normalisation"));
        return true;
    }
    if depth > MAX_DEPTH || g.is_empty() || p.is_empty() {
        cx.note(depth, "empty or too deeply nested");
        return false;
    }
    // `\approx`: the exact side before it may match; the decimal after it matches within tolerance.
    if let Some((before, approx)) = approx_split(p) {
        if !before.is_empty() && eq_quiet(g, before, depth + 1) {
            cx.note(depth, "the exact value before \\approx matches");
            return true;
        }
        let r = approx_close(g, approx);
        cx.note(
            depth,
            format!(
                "{approx} is {}within the \\approx tolerance of {g}",
                if r { "" } else { "not " }
            ),
        );
        return r;
    }
    if let Some((before, approx)) = approx_split(g) {
        let r = (!before.is_empty() && eq_quiet(before, p, depth + 1)) || approx_close(p, approx);
        cx.note(
            depth,
            format!(
                "gold given as \\approx {approx}: {}",
                if r { "match" } else { "no match" }
            ),
        );
        return r;
    }
    // Lists, sets and `\pm` pairs.
    let (lg, lp) = (list_items(g), list_items(p));
    let rel_list = |s: &str| {
        split_top(s, &OR_SEP.to_string())
            .iter()
            .all(|x| relation(x).is_some())
    };
    if lg.is_some() || lp.is_some() {
        if !(rel_list(g) && rel_list(p))
            && !(rel_list(p) && intervals(g).is_some())
            && !(rel_list(g) && intervals(p).is_some())
        {
            return match (lg, lp) {
                (Some((_, a)), Some((_, b))) => {
                    cx.note(
                        depth,
                        format!("lists of {} and {} items, order ignored", a.len(), b.len()),
                    );
                    let r = same_multiset(&a, &b, depth, cx);
                    if r {
                        cx.note(depth, "every item matched");
                    }
                    r
                }
                (Some((ListKind::Set, a)), None) | (None, Some((ListKind::Set, a)))
                    if a.len() == 1 =>
                {
                    let (x, y) = if list_items(g).is_some() {
                        (a[0].as_str(), p)
                    } else {
                        (g, a[0].as_str())
                    };
                    eq(x, y, depth + 1, cx)
                }
                _ => {
                    cx.note(
                        depth,
                        "one side is a list of answers, the other a single answer",
                    );
                    false
                }
            };
        }
    }
    // Solution chains `a = b = c`: the last side is the answer (a label in front is kept).
    let chain = split_top(p, "=");
    if chain.len() > 2 {
        let last = chain[chain.len() - 1];
        let read = if is_label(chain[0]) {
            format!("{}={last}", chain[0])
        } else {
            last.to_string()
        };
        cx.note(
            depth,
            format!("answer is a chain of {} sides: {read} is read", chain.len()),
        );
        return eq(g, &read, depth + 1, cx);
    }
    if let Some(r) = eq_relations(g, p, depth, cx) {
        return r;
    }
    // `x \in S` against `S`: the label is dropped on either side.
    match (membership(g), membership(p)) {
        (Some((_, a)), None) => return eq(a, p, depth + 1, cx),
        (None, Some((_, b))) => return eq(g, b, depth + 1, cx),
        (Some((x, a)), Some((y, b))) => return x == y && eq(a, b, depth + 1, cx),
        _ => {}
    }
    if let Some(r) = eq_equations(g, p, depth, cx) {
        return r;
    }
    let (ug, up) = (split_top(g, "\\cup"), split_top(p, "\\cup"));
    if ug.len() > 1 || up.len() > 1 {
        let r = ug.len() == up.len() && ug.iter().zip(&up).all(|(x, y)| eq(x, y, depth + 1, cx));
        cx.note(
            depth,
            format!(
                "unions compared part by part in order: {}",
                if r { "match" } else { "differ" }
            ),
        );
        return r;
    }
    match (bracketed(g), bracketed(p)) {
        (Some((og, cg, pg)), Some((op, cp, pp))) => {
            if og != op || cg != cp {
                cx.note(depth, format!("brackets {og}..{cg} against {op}..{cp}"));
                return false;
            }
            let r =
                pg.len() == pp.len() && pg.iter().zip(&pp).all(|(x, y)| eq(x, y, depth + 1, cx));
            cx.note(
                depth,
                format!(
                    "tuples/intervals of {} and {} elements compared in order: {}",
                    pg.len(),
                    pp.len(),
                    if r { "match" } else { "differ" }
                ),
            );
            return r;
        }
        (None, None) => {}
        _ => {
            cx.note(depth, "a tuple or interval against something else");
            return false;
        }
    }
    if let (Some(mg), Some(mp)) = (matrix(g), matrix(p)) {
        let r = mg.len() == mp.len()
            && mg.iter().zip(&mp).all(|(a, b)| {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| eq(x, y, depth + 1, cx))
            });
        cx.note(
            depth,
            format!(
                "matrices compared cell by cell: {}",
                if r { "match" } else { "differ" }
            ),
        );
        return r;
    }
    same_expr(g, p, depth, cx)
}

/// What kind of answer a normalised string is, for explanations.
pub fn describe(s: &str) -> String {
    if s.is_empty() {
        return "empty".into();
    }
    if let Some((_, a)) = approx_split(s) {
        return format!("approximation ≈ {a}");
    }
    if let Some((k, items)) = list_items(s) {
        return format!(
            "{} of {} items: {}",
            if k == ListKind::Set { "set" } else { "list" },
            items.len(),
            items.join(" | ")
        );
    }
    if let Some(r) = relation(s) {
        let ops: String = r.ops.iter().collect();
        return format!("relation ({ops}) between {}", r.sides.join(" | "));
    }
    if let Some((l, r)) = equation(s) {
        let (l, r) = orient(l, r);
        return if is_label(l) {
            format!("labelled answer {l} = {r}")
        } else {
            format!("equation {l} = {r}")
        };
    }
    if let Some((v, set)) = membership(s) {
        return format!("membership {v} ∈ {set}");
    }
    if split_top(s, "\\cup").len() > 1 {
        return format!("union of {} parts", split_top(s, "\\cup").len());
    }
    if let Some((o, c, parts)) = bracketed(s) {
        let what = if intervals(s).is_some() {
            "interval or tuple"
        } else {
            "tuple"
        };
        return format!("{what} {o}..{c} of {} elements", parts.len());
    }
    if let Some(m) = matrix(s) {
        return format!("matrix {}×{}", m.len(), m.first().map_or(0, Vec::len));
    }
    match parse_expr(s) {
        Some(e) if is_constant(&e) => match e.eval(&|_| f64::NAN) {
            v if v.exact.is_some() => format!(
                "number {}",
                v.exact.map(|r| r.to_string()).unwrap_or_default()
            ),
            v => format!("constant ≈ {}", v.approx),
        },
        Some(_) => "expression in variables".into(),
        None => "text (compared as written)".into(),
    }
}

/// How many answers a normalised answer holds: the items of a list, set or `\pm` pair, else 1.
pub fn answer_count(s: &str) -> usize {
    list_items(s).map_or(1, |(_, items)| items.len())
}
