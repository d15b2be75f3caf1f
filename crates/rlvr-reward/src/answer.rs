//! Structural comparison of two normalised MATH answers (see [`crate::math`] for the policies and
//! [`crate::latex::normalize_keep_label`] for the normal form).
//!
//! [`compare`] takes the gold first: a few rules are asymmetric on purpose (each says why where it is
//! applied). It returns the verdict with the reasons that decided it, for `rlvr reward --explain`.

use crate::expr::{parse_expr, Expr};
use crate::forms::{
    approx_close, approx_split, as_intervals, bound_value, bracketed, decimal, equation, intervals,
    is_label, list_items, matrix, matrix_arithmetic, membership, relation, split_top, Interval,
    ListKind,
};
use crate::latex::OR_SEP;
use crate::sampling::{is_constant, proportion, proportional, same_value};

/// Deepest recursion of [`compare`] (each level strips a bracket, list, label or relation).
const MAX_DEPTH: usize = 16;
/// Most comparison steps of one [`compare`] call: nested lists of lists could otherwise multiply the
/// quadratic item matching at every level. Past it the answers are judged unequal.
const MAX_STEPS: usize = 50_000;
/// Most bytes one [`compare`] call may scan, summed over its steps (each step makes a constant number of
/// linear passes over its two strings).
const MAX_WORK: usize = 1_000_000;
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
    /// Comparison steps taken so far (bounded by [`MAX_STEPS`]).
    steps: usize,
    /// Bytes of the compared strings so far, summed over steps (bounded by [`MAX_WORK`]).
    work: usize,
}

impl Ctx {
    fn note(&mut self, depth: usize, msg: impl Into<String>) {
        if !self.quiet && self.reasons.len() < 24 {
            self.reasons
                .push(format!("{}{}", "  ".repeat(depth.min(8)), msg.into()));
        }
    }
}

/// Compares a normalised gold answer with a normalised predicted one (gold first), with reasons.
pub fn compare(gold: &str, pred: &str) -> Judgement {
    compare_with(gold, pred, true)
}

/// [`compare`]; with `explain` off no reasons are recorded (the scoring path).
pub fn compare_with(gold: &str, pred: &str, explain: bool) -> Judgement {
    let mut cx = Ctx {
        reasons: Vec::new(),
        quiet: !explain,
        steps: 0,
        work: 0,
    };
    let equal = eq(gold, pred, 0, &mut cx);
    Judgement {
        equal,
        reasons: cx.reasons,
    }
}

/// True when one side is a round-bracket tuple and `items` (the other side's list) are all labelled
/// (`x=3, y=-1`), as many as the tuple's elements.
fn labelled_tuple(g: &str, p: &str, items: &[String]) -> bool {
    let tuple = if list_items(g).is_some() { p } else { g };
    matches!(bracketed(tuple), Some(('(', ')', parts)) if parts.len() == items.len())
        && items
            .iter()
            .all(|i| equation(i).is_some_and(|(l, _)| is_label(l)))
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
        let hit = (0..b.len()).find(|&j| !used[j] && eq_quiet(x, &b[j], depth + 1, cx));
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

/// [`eq`] without recording reasons (for trial matches); shares the step budget.
fn eq_quiet(a: &str, b: &str, depth: usize, cx: &mut Ctx) -> bool {
    let q = cx.quiet;
    cx.quiet = true;
    let r = eq(a, b, depth, cx);
    cx.quiet = q;
    r
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

/// Expressions compared by value (see [`crate::sampling::same_value`]).
fn same_expr(g: &str, p: &str, depth: usize, cx: &mut Ctx) -> bool {
    // A machine-printed decimal (at least [`PRINTED_DIGITS`] significant digits, `0.0833333333333333`)
    // is the value it rounds: it matches a constant within one unit of its last place.
    for (exact, printed) in [(g, p), (p, g)] {
        if printed_close(exact, printed) {
            cx.note(
                depth,
                format!("{printed} is {exact} printed to its last digit"),
            );
            return true;
        }
    }
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

/// Fewest significant digits of a decimal read as a machine printout of an exact value (a float's
/// `repr`, `0.0833333333333333` for 1/12), which [`same_expr`] matches within half a unit of its
/// last place. A person's rounding (`0.333`, `2.6667`) has fewer and is refused, as before.
pub const PRINTED_DIGITS: usize = 12;

/// Whether `printed` is a decimal of at least [`PRINTED_DIGITS`] significant digits within half a
/// unit of its last place of the constant `exact` (which is not itself a decimal).
fn printed_close(exact: &str, printed: &str) -> bool {
    let body = printed.trim_start_matches('-');
    let sig = body
        .trim_start_matches(['0', '.'])
        .bytes()
        .filter(u8::is_ascii_digit)
        .count();
    if sig < PRINTED_DIGITS || decimal(exact).is_some() {
        return false;
    }
    let (Some((v, d)), Some(e)) = (decimal(printed), parse_expr(exact)) else {
        return false;
    };
    if !is_constant(&e) {
        return false;
    }
    let x = e.eval(&|_| f64::NAN).approx;
    // Half a unit of the last place: a printout is rounded to nearest.
    x.is_finite()
        && (x - v).abs() <= 0.5 * 10f64.powi(-d) * (1.0 + 1e-6) + 4.0 * f64::EPSILON * x.abs()
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
            // Both labelled: the right sides compare when the labels agree, when a side is a value, or
            // when a label is a function's name (`y = 2x+3` and `f(x) = 2x+3` name the same rule).
            let applied = |l: &str| l.ends_with(')') && !l.starts_with('(');
            if is_label(gl)
                && is_label(pl)
                && (gl == pl || rhs_constant(gr) || rhs_constant(pr) || applied(gl) || applied(pl))
            {
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
            let r = (eq_quiet(gl, pl, depth + 1, cx) && eq_quiet(gr, pr, depth + 1, cx))
                || (eq_quiet(gl, pr, depth + 1, cx) && eq_quiet(gr, pl, depth + 1, cx));
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
                .all(|(x, y)| eq_quiet(x, y, depth + 1, cx));
            let swapped = a.ops == ['\u{2260}']
                && eq_quiet(a.sides[0], b.sides[1], depth + 1, cx)
                && eq_quiet(a.sides[1], b.sides[0], depth + 1, cx);
            if same || swapped {
                cx.note(depth, "same relation after normalising its direction");
                return Some(true);
            }
            // One inequality each (`x < 1`, `-x > -1`, both read as `lhs < rhs`): the same
            // relation when rhs - lhs of the two are proportional by a positive constant (a negative
            // one would flip it; `≠` takes either sign).
            if a.sides.len() == 2 {
                if let (Some(dg), Some(dp)) = (
                    difference(a.sides[1], a.sides[0]),
                    difference(b.sides[1], b.sides[0]),
                ) {
                    if proportion(&dg, &dp).is_some_and(|c| c > 0.0 || a.ops == ['\u{2260}']) {
                        cx.note(
                            depth,
                            "same inequality: rhs - lhs proportional by a positive constant",
                        );
                        return Some(true);
                    }
                }
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
// One function because the answer forms are tried in one fixed priority order
// (identical, `\approx`, lists and sets, chains, relations, labels, equations, unions, intervals,
// matrices, then numbers and expressions), and that order decides which form wins; split, the order
// would be spread over several functions.
fn eq(g: &str, p: &str, depth: usize, cx: &mut Ctx) -> bool {
    if g == p {
        cx.note(depth, format!("{g}: identical after normalisation"));
        return true;
    }
    cx.steps += 1;
    cx.work += g.len() + p.len();
    if cx.steps > MAX_STEPS || cx.work > MAX_WORK {
        if cx.steps < MAX_STEPS + 2 {
            cx.steps = MAX_STEPS + 2;
            cx.note(depth, "comparison step budget exhausted: judged unequal");
        }
        return false;
    }
    if depth > MAX_DEPTH || g.is_empty() || p.is_empty() {
        cx.note(depth, "empty or too deeply nested");
        return false;
    }
    // `\approx`: the exact side before it may match; the decimal after it matches within tolerance.
    if let Some((before, approx)) = approx_split(p) {
        if !before.is_empty() && eq_quiet(g, before, depth + 1, cx) {
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
        let r =
            (!before.is_empty() && eq_quiet(before, p, depth + 1, cx)) || approx_close(p, approx);
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
        s.contains(['<', '>', '\u{2264}', '\u{2265}', '\u{2260}'])
            && split_top(s, &OR_SEP.to_string())
                .iter()
                .all(|x| relation(x).is_some())
    };
    // Relations joined by "or" are a union of intervals, not a list of answers.
    let relational = (rel_list(g) && rel_list(p))
        || (rel_list(p) && intervals(g).is_some())
        || (rel_list(g) && intervals(p).is_some());
    if (lg.is_some() || lp.is_some()) && !relational {
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
            (Some((ListKind::Set, a)), None) | (None, Some((ListKind::Set, a))) if a.len() == 1 => {
                let (x, y) = if list_items(g).is_some() {
                    (a[0].as_str(), p)
                } else {
                    (g, a[0].as_str())
                };
                eq(x, y, depth + 1, cx)
            }
            (Some((ListKind::Bare, items)), None) | (None, Some((ListKind::Bare, items)))
                if labelled_tuple(g, p, &items) =>
            {
                // `x=3, y=-1` against the tuple `(3,-1)`: every item labelled, read in order.
                let tuple = if list_items(g).is_some() { p } else { g };
                let parts = bracketed(tuple).map(|b| b.2).unwrap_or_default();
                let values: Vec<&str> = items
                    .iter()
                    .filter_map(|i| equation(i).map(|e| e.1))
                    .collect();
                cx.note(depth, "labelled values read in order against the tuple");
                parts
                    .iter()
                    .zip(&values)
                    .all(|(x, y)| eq(x, y, depth + 1, cx))
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
    // Solution chains `a = b = c`: the last side is the answer (a label in front is kept), in the
    // gold as in the answer (`z = 1 + 1 = 2` states z = 2).
    if let Some((read, n)) = chain_reading(g) {
        cx.note(
            depth,
            format!("gold is a chain of {n} sides: {read} is read"),
        );
        return eq(&read, p, depth + 1, cx);
    }
    if let Some((read, n)) = chain_reading(p) {
        cx.note(
            depth,
            format!("answer is a chain of {n} sides: {read} is read"),
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
    // Matrix arithmetic (`A + B`, `AB`) on either side: the resulting cells, as expressions.
    let (ag, ap) = (matrix_arithmetic(g), matrix_arithmetic(p));
    if ag.is_some() || ap.is_some() {
        let cells = |a: Option<Vec<Vec<String>>>, s: &str| {
            a.or_else(|| {
                matrix(s).map(|m| {
                    m.into_iter()
                        .map(|r| r.into_iter().map(str::to_string).collect())
                        .collect()
                })
            })
        };
        if let (Some(mg), Some(mp)) = (cells(ag, g), cells(ap, p)) {
            let r = mg.len() == mp.len()
                && mg.iter().zip(&mp).all(|(a, b)| {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| eq(x, y, depth + 1, cx))
                });
            cx.note(
                depth,
                format!(
                    "matrix arithmetic evaluated, compared cell by cell: {}",
                    if r { "match" } else { "differ" }
                ),
            );
            return r;
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

/// What a solution chain `a = b = c` (three sides or more) states: its last side, with a label in
/// front kept (`z = 1 + 1 = 2` reads `z=2`), and its number of sides; `None` for fewer sides.
fn chain_reading(s: &str) -> Option<(String, usize)> {
    let sides = split_top(s, "=");
    if sides.len() <= 2 {
        return None;
    }
    let last = sides[sides.len() - 1];
    let read = if is_label(sides[0]) {
        format!("{}={last}", sides[0])
    } else {
        last.to_string()
    };
    Some((read, sides.len()))
}
