//! LaTeX answer normalisation and a small expression evaluator for the MATH verifier.
//!
//! [`normalize`] follows the string normalisation of Hendrycks et al.'s MATH grader (`strip_string`)
//! and extends it: `\left`/`\right` and spacing commands dropped, `\dfrac`/`\tfrac` → `\frac`,
//! `\frac12` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`, units in `\text{ ...}` dropped, other `\text{..}`
//! unwrapped, `^\circ`, `\%`, `\$` dropped, spaces removed, thousands separators removed, a short
//! `x =` left-hand side dropped, `(C)` → `C`.
//!
//! [`parse_expr`] reads the normalised string as an arithmetic expression (numbers, single-letter
//! variables, `\pi`, `\frac`, `\sqrt`, `^`, implicit multiplication) that [`Expr::eval`] evaluates
//! exactly when it can (rationals) and approximately otherwise. Parsing is recursive descent with a
//! depth limit, so hostile input returns `None` instead of overflowing the stack.

use crate::number::Rational;
use std::collections::BTreeSet;

/// Private-use stand-ins for LaTeX's literal braces `\{` and `\}` after normalisation.
pub const SET_OPEN: char = '\u{2983}';
/// See [`SET_OPEN`].
pub const SET_CLOSE: char = '\u{2984}';

/// Plain substitutions applied in order before structural clean-up.
const REPLACEMENTS: &[(&str, &str)] = &[
    ("\\left", ""),
    ("\\right", ""),
    ("\\bigl", ""),
    ("\\bigr", ""),
    ("\\Bigl", ""),
    ("\\Bigr", ""),
    ("\\big", ""),
    ("\\Big", ""),
    ("\\displaystyle", ""),
    ("\\!", ""),
    ("\\,", ""),
    ("\\:", ""),
    ("\\;", ""),
    ("\\qquad", ""),
    ("\\quad", ""),
    ("\\ ", ""),
    ("~", ""),
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("\\mbox", "\\text"),
    ("\\textbf", "\\text"),
    ("\\textit", "\\text"),
    ("\\textrm", "\\text"),
    ("\\mathrm", "\\text"),
    ("\\mathbf", "\\text"),
    ("\\operatorname", "\\text"),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\circ", ""),
    ("\\degree", ""),
    ("\\%", ""),
    ("%", ""),
    ("\\$", ""),
    ("$", ""),
    ("\\cdot", "*"),
    ("\\times", "*"),
    ("\\{", "\u{2983}"),
    ("\\}", "\u{2984}"),
];

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

/// Removes `\text{ unit}` groups whose content starts with a space (units such as `\text{ cm}^2`), and
/// unwraps every other `\text{...}` to its content.
fn strip_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut seen_content = false;
    while let Some(k) = s[i..].find("\\text") {
        let at = i + k;
        out.push_str(&s[i..at]);
        seen_content |= s[i..at].chars().any(|c| !c.is_whitespace());
        let after = at + "\\text".len();
        let open = after + (s[after..].len() - s[after..].trim_start().len());
        match (s[open..].starts_with('{'), matching_brace(s, open)) {
            (true, Some(close)) => {
                let inner = &s[open + 1..close];
                let mut next = close + 1;
                let is_unit = inner.starts_with(' ') && seen_content;
                if is_unit {
                    // Drop a following exponent (`\text{ cm}^2`).
                    let rest = &s[next..];
                    if let Some(r) = rest.strip_prefix('^') {
                        let n = if r.starts_with('{') {
                            matching_brace(rest, 1).map(|c| c + 1).unwrap_or(1)
                        } else {
                            1 + r.chars().next().map(char::len_utf8).unwrap_or(0)
                        };
                        next += n;
                    }
                } else {
                    out.push_str(inner);
                    seen_content |= inner.chars().any(|c| !c.is_whitespace());
                }
                i = next;
            }
            _ => {
                out.push_str("\\text");
                i = after;
            }
        }
    }
    out.push_str(&s[i..]);
    out
}

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
    let mut s = answer.trim().replace('\u{2212}', "-");
    for (from, to) in REPLACEMENTS {
        if s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s = strip_text(&s);
    s.retain(|c| !c.is_whitespace());
    s = fix_args(&s);
    s = unbrace_scripts(&s);
    while s.ends_with('.') || s.ends_with(',') {
        s.pop();
    }
    // Short left-hand side: `x=5` → `5`, `x\in[-2,7]` → `[-2,7]`.
    if let Some((lhs, rhs)) = s.split_once("\\in") {
        if lhs.chars().count() <= 2 && !rhs.is_empty() {
            s = rhs.to_string();
        }
    }
    if s.matches('=').count() == 1 {
        if let Some((lhs, rhs)) = s.split_once('=') {
            if lhs.chars().count() <= 2 && !rhs.is_empty() {
                s = rhs.to_string();
            }
        }
    }
    if is_grouped_number(&s) {
        s.retain(|c| c != ',');
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

/// An arithmetic expression tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An exact number.
    Num(Rational),
    /// A single-letter variable (also `i`, `e`: treated as unknowns, compared symbolically by sampling).
    Var(char),
    /// π.
    Pi,
    /// Negation.
    Neg(Box<Expr>),
    /// Sum.
    Add(Box<Expr>, Box<Expr>),
    /// Difference.
    Sub(Box<Expr>, Box<Expr>),
    /// Product.
    Mul(Box<Expr>, Box<Expr>),
    /// Quotient.
    Div(Box<Expr>, Box<Expr>),
    /// Power.
    Pow(Box<Expr>, Box<Expr>),
    /// Square root (or n-th root with an index).
    Root(Box<Expr>, Option<Box<Expr>>),
}

/// An evaluated value: exact when every step was rational, always with an `f64` approximation.
#[derive(Debug, Clone, Copy)]
pub struct Value {
    /// The exact value, when known.
    pub exact: Option<Rational>,
    /// The approximate value (NaN when undefined).
    pub approx: f64,
}

impl Value {
    fn exact(r: Rational) -> Self {
        Value {
            exact: Some(r),
            approx: r.to_f64(),
        }
    }
    fn approx(x: f64) -> Self {
        Value {
            exact: None,
            approx: x,
        }
    }
}

impl Expr {
    /// Evaluates with `vars` giving each variable's value (unlisted variables are NaN).
    pub fn eval(&self, vars: &dyn Fn(char) -> f64) -> Value {
        use Expr::*;
        let bin = |a: &Expr,
                   b: &Expr,
                   ex: fn(Rational, Rational) -> Option<Rational>,
                   ap: fn(f64, f64) -> f64| {
            let (x, y) = (a.eval(vars), b.eval(vars));
            match (x.exact, y.exact) {
                (Some(p), Some(q)) => match ex(p, q) {
                    Some(r) => Value::exact(r),
                    None => Value::approx(ap(x.approx, y.approx)),
                },
                _ => Value::approx(ap(x.approx, y.approx)),
            }
        };
        match self {
            Num(r) => Value::exact(*r),
            Var(c) => Value::approx(vars(*c)),
            Pi => Value::approx(std::f64::consts::PI),
            Neg(a) => {
                let x = a.eval(vars);
                match x.exact.and_then(|r| r.checked_neg()) {
                    Some(r) => Value::exact(r),
                    None => Value::approx(-x.approx),
                }
            }
            Add(a, b) => bin(a, b, Rational::checked_add, |x, y| x + y),
            Sub(a, b) => bin(a, b, Rational::checked_sub, |x, y| x - y),
            Mul(a, b) => bin(a, b, Rational::checked_mul, |x, y| x * y),
            Div(a, b) => bin(a, b, Rational::checked_div, |x, y| x / y),
            Pow(a, b) => bin(
                a,
                b,
                |p, q| {
                    if q.is_integer() {
                        p.checked_pow(q.numer())
                    } else {
                        None
                    }
                },
                f64::powf,
            ),
            Root(a, n) => {
                let x = a.eval(vars).approx;
                match n {
                    None => Value::approx(x.sqrt()),
                    Some(n) => Value::approx(x.powf(1.0 / n.eval(vars).approx)),
                }
            }
        }
    }

    /// The variables the expression mentions.
    pub fn vars(&self, out: &mut BTreeSet<char>) {
        use Expr::*;
        match self {
            Var(c) => {
                out.insert(*c);
            }
            Num(_) | Pi => {}
            Neg(a) => a.vars(out),
            Root(a, n) => {
                a.vars(out);
                if let Some(n) = n {
                    n.vars(out);
                }
            }
            Add(a, b) | Sub(a, b) | Mul(a, b) | Div(a, b) | Pow(a, b) => {
                a.vars(out);
                b.vars(out);
            }
        }
    }
}

const MAX_DEPTH: usize = 64;
/// Most nodes an expression may have: bounds the depth of left-assoc chains (`1+1+...`), whose
/// evaluation and drop recurse.
const MAX_NODES: usize = 2_000;

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
    nodes: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn starts(&self, p: &str) -> bool {
        self.s[self.i..].starts_with(p.as_bytes())
    }
    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        self.nodes += 1;
        (self.depth <= MAX_DEPTH && self.nodes <= MAX_NODES).then_some(())
    }

    fn expr(&mut self) -> Option<Expr> {
        self.enter()?;
        let mut e = self.term()?;
        loop {
            if self.eat(b'+') {
                e = Expr::Add(Box::new(e), Box::new(self.term()?));
            } else if self.eat(b'-') {
                e = Expr::Sub(Box::new(e), Box::new(self.term()?));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Some(e)
    }

    fn starts_atom(&self) -> bool {
        match self.peek() {
            Some(c) if c.is_ascii_alphanumeric() || c == b'(' || c == b'{' || c == b'.' => true,
            Some(b'\\') => self.starts("\\frac") || self.starts("\\sqrt") || self.starts("\\pi"),
            _ => false,
        }
    }

    fn term(&mut self) -> Option<Expr> {
        self.enter()?;
        let mut e = self.unary()?;
        loop {
            if self.eat(b'*') {
                e = Expr::Mul(Box::new(e), Box::new(self.unary()?));
            } else if self.eat(b'/') {
                e = Expr::Div(Box::new(e), Box::new(self.unary()?));
            } else if self.starts_atom() {
                e = Expr::Mul(Box::new(e), Box::new(self.power()?));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Some(e)
    }

    fn unary(&mut self) -> Option<Expr> {
        self.enter()?;
        let e = if self.eat(b'-') {
            Expr::Neg(Box::new(self.unary()?))
        } else if self.eat(b'+') {
            self.unary()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Some(e)
    }

    fn power(&mut self) -> Option<Expr> {
        self.enter()?;
        let base = self.atom()?;
        let e = if self.eat(b'^') {
            let exp = if self.peek() == Some(b'{') {
                self.atom()?
            } else if self.peek() == Some(b'-') {
                self.unary()?
            } else {
                // A single digit or letter: `x^23` is x²·3 in LaTeX.
                let c = self.peek()?;
                self.i += 1;
                if c.is_ascii_digit() {
                    Expr::Num(Rational::from_int((c - b'0') as i128))
                } else if c.is_ascii_alphabetic() {
                    Expr::Var(c as char)
                } else {
                    return None;
                }
            };
            Expr::Pow(Box::new(base), Box::new(exp))
        } else {
            base
        };
        self.depth -= 1;
        Some(e)
    }

    fn group(&mut self, open: u8, close: u8) -> Option<Expr> {
        if !self.eat(open) {
            return None;
        }
        let e = self.expr()?;
        self.eat(close).then_some(e)
    }

    fn atom(&mut self) -> Option<Expr> {
        self.enter()?;
        let c = self.peek()?;
        let e = if c.is_ascii_digit() || c == b'.' {
            let st = self.i;
            while matches!(self.peek(), Some(d) if d.is_ascii_digit()) {
                self.i += 1;
            }
            let int = std::str::from_utf8(&self.s[st..self.i]).ok()?;
            let mut frac = "";
            if self.peek() == Some(b'.') {
                self.i += 1;
                let fs = self.i;
                while matches!(self.peek(), Some(d) if d.is_ascii_digit()) {
                    self.i += 1;
                }
                frac = std::str::from_utf8(&self.s[fs..self.i]).ok()?;
            }
            if int.is_empty() && frac.is_empty() {
                return None;
            }
            let mut n: i128 = 0;
            for b in int.bytes().chain(frac.bytes()) {
                n = n.checked_mul(10)?.checked_add((b - b'0') as i128)?;
            }
            Expr::Num(Rational::new(n, 10i128.checked_pow(frac.len() as u32)?)?)
        } else if c.is_ascii_alphabetic() {
            // Three or more letters in a row is a word (`east`, `even`), not a product of variables.
            let run = self.s[self.i..]
                .iter()
                .take_while(|b| b.is_ascii_alphabetic())
                .count();
            if run >= 3 {
                return None;
            }
            self.i += 1;
            Expr::Var(c as char)
        } else if c == b'(' {
            self.group(b'(', b')')?
        } else if c == b'{' {
            self.group(b'{', b'}')?
        } else if self.starts("\\frac") {
            self.i += 5;
            let n = self.group(b'{', b'}')?;
            let d = self.group(b'{', b'}')?;
            Expr::Div(Box::new(n), Box::new(d))
        } else if self.starts("\\sqrt") {
            self.i += 5;
            let index = if self.peek() == Some(b'[') {
                Some(Box::new(self.group(b'[', b']')?))
            } else {
                None
            };
            Expr::Root(Box::new(self.group(b'{', b'}')?), index)
        } else if self.starts("\\pi") {
            self.i += 3;
            Expr::Pi
        } else {
            return None;
        };
        self.depth -= 1;
        Some(e)
    }
}

/// Parses a normalised answer (see [`normalize`]) as an expression; `None` when it is not one
/// (words, base subscripts, matrices, `\pm`, unbalanced brackets, nesting deeper than 64, more than
/// 2,000 nodes).
pub fn parse_expr(s: &str) -> Option<Expr> {
    // Mixed numbers: `1\frac{4}{5}` is 1 + 4/5, not 1 · 4/5.
    if let Some(k) = s.find("\\frac{") {
        let (whole, rest) = s.split_at(k);
        if !whole.is_empty() && whole.bytes().all(|b| b.is_ascii_digit()) {
            let mut p = Parser {
                s: rest.as_bytes(),
                i: 0,
                depth: 0,
                nodes: 0,
            };
            let frac = p.atom()?;
            let simple = matches!(&frac, Expr::Div(a, b) if matches!(**a, Expr::Num(_)) && matches!(**b, Expr::Num(_)));
            if p.i == rest.len() && simple {
                let w: i128 = whole.parse().ok()?;
                return Some(Expr::Add(
                    Box::new(Expr::Num(Rational::from_int(w))),
                    Box::new(frac),
                ));
            }
        }
    }
    let mut p = Parser {
        s: s.as_bytes(),
        i: 0,
        depth: 0,
        nodes: 0,
    };
    let e = p.expr()?;
    (p.i == s.len()).then_some(e)
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

    #[test]
    fn expressions() {
        let v = |s: &str| parse_expr(&normalize(s)).map(|e| e.eval(&|_| 0.5));
        assert_eq!(v(r"\frac{3}{4}").unwrap().exact, Rational::new(3, 4));
        assert_eq!(v(r"1\frac{4}{5}").unwrap().exact, Rational::new(9, 5));
        assert_eq!(v(r"2^{-2}").unwrap().exact, Rational::new(1, 4));
        assert!((v(r"\frac{\sqrt{3}}{2}").unwrap().approx - 0.866_025_403_784).abs() < 1e-9);
        assert!(v(r"\text{east}").is_none());
        assert!(v(&"(".repeat(1000)).is_none());
    }
}
