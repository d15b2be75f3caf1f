//! A small expression evaluator for normalised MATH answers (see [`crate::latex::normalize`]).
//!
//! [`parse_expr`] reads numbers, single-letter variables, `\pi`, `\frac`, `\sqrt` (and `\sqrt[n]`),
//! `^`, `+ - * /` and implicit multiplication; [`Expr::eval`] evaluates exactly when every step is
//! rational and approximately otherwise. Parsing is recursive descent with a depth limit (64) and a node
//! limit (2,000), so hostile input returns `None` instead of overflowing the stack.

use crate::expr_fns::greek;
pub use crate::expr_fns::Func;
use crate::number::Rational;
use std::collections::BTreeSet;

/// An arithmetic expression tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An exact number.
    Num(Rational),
    /// A single-letter variable (`i` too: an unknown, compared symbolically by sampling); `e` is Euler's
    /// number.
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
    /// An elementary function applied to its argument (`\sin x`, `\ln(2)`).
    Func(Func, Box<Expr>),
    /// Factorial `n!` (exact for integers 0..=33, else undefined).
    Fact(Box<Expr>),
    /// Binomial coefficient `\binom{n}{k}` (exact for integers 0 <= k <= n <= 120, else undefined).
    Binom(Box<Expr>, Box<Expr>),
}

/// `n!` for a small non-negative integer.
fn factorial(n: Rational) -> Option<Rational> {
    if !n.is_integer() || !(0..=33).contains(&n.numer()) {
        return None;
    }
    let mut acc = Rational::from_int(1);
    for k in 2..=n.numer() {
        acc = acc.checked_mul(Rational::from_int(k))?;
    }
    Some(acc)
}

/// `n choose k` for small non-negative integers.
fn binomial(n: Rational, k: Rational) -> Option<Rational> {
    if !n.is_integer() || !k.is_integer() || !(0..=120).contains(&n.numer()) {
        return None;
    }
    let (n, k) = (n.numer(), k.numer());
    if !(0..=n).contains(&k) {
        return None;
    }
    let mut acc = Rational::from_int(1);
    for j in 0..k.min(n - k) {
        acc = acc
            .checked_mul(Rational::from_int(n - j))?
            .checked_div(Rational::from_int(j + 1))?;
    }
    Some(acc)
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
            Var('e') => Value::approx(std::f64::consts::E),
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
            Func(f, a) => Value::approx(f.apply(a.eval(vars).approx)),
            Fact(a) => a
                .eval(vars)
                .exact
                .and_then(factorial)
                .map_or(Value::approx(f64::NAN), Value::exact),
            Binom(n, k) => match (n.eval(vars).exact, k.eval(vars).exact) {
                (Some(n), Some(k)) => binomial(n, k).map_or(Value::approx(f64::NAN), Value::exact),
                _ => Value::approx(f64::NAN),
            },
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
            Var('e') => {}
            Var(c) => {
                out.insert(*c);
            }
            Num(_) | Pi => {}
            Neg(a) | Func(_, a) | Fact(a) => a.vars(out),
            Binom(a, b) => {
                a.vars(out);
                b.vars(out);
            }
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
    /// The command name at the cursor (`""` when the cursor is not on a command). Whitespace is gone
    /// after normalisation (`\cos x` → `\cosx`), so a known name that prefixes the letter run is the
    /// command (the longest such name) and the rest is read after it.
    fn command_name(&self) -> &str {
        if self.peek() != Some(b'\\') {
            return "";
        }
        let rest = &self.s[self.i + 1..];
        let n = rest.iter().take_while(|b| b.is_ascii_alphabetic()).count();
        let run = std::str::from_utf8(&rest[..n]).unwrap_or("");
        let known = |name: &str| {
            matches!(name, "frac" | "sqrt" | "pi" | "binom" | "dbinom" | "tbinom")
                || greek(name).is_some()
                || Func::from_name(name).is_some()
        };
        (1..=run.len())
            .rev()
            .map(|k| &run[..k])
            .find(|p| known(p))
            .unwrap_or(run)
    }

    /// A function application after its name: optional `^exp` and `_base`, then `(..)`, `{..}` or an
    /// implicit product of atoms (`\sin 2x`, stopping before the next function: `\sin x \cos x`).
    fn function(&mut self, f: Func) -> Option<Expr> {
        let mut exp = None;
        let mut base = None;
        for _ in 0..2 {
            if self.eat(b'^') {
                exp = Some(self.script()?);
            } else if self.eat(b'_') && f == Func::Ln {
                base = Some(self.script()?);
            }
        }
        let arg = if matches!(self.peek(), Some(b'(') | Some(b'{')) {
            self.power()?
        } else {
            let mut a = self.power()?;
            while self.starts_atom() && Func::from_name(self.command_name()).is_none() {
                a = Expr::Mul(Box::new(a), Box::new(self.power()?));
            }
            a
        };
        let minus_one = Expr::Neg(Box::new(Expr::Num(Rational::from_int(1))));
        let (f, exp) = match (exp, f.inverse()) {
            (Some(e), Some(inv)) if e == minus_one => (inv, None),
            (e, _) => (f, e),
        };
        let mut e = Expr::Func(f, Box::new(arg));
        if let Some(b) = base {
            e = Expr::Div(Box::new(e), Box::new(Expr::Func(Func::Ln, Box::new(b))));
        }
        Some(match exp {
            Some(x) => Expr::Pow(Box::new(e), Box::new(x)),
            None => e,
        })
    }

    /// A superscript or subscript: `{..}`, `-x`, or a single digit or letter.
    fn script(&mut self) -> Option<Expr> {
        if self.peek() == Some(b'{') {
            self.atom()
        } else if self.peek() == Some(b'-') {
            self.unary()
        } else {
            let c = self.peek()?;
            self.i += 1;
            if c.is_ascii_digit() {
                Some(Expr::Num(Rational::from_int((c - b'0') as i128)))
            } else if c.is_ascii_alphabetic() {
                Some(Expr::Var(c as char))
            } else {
                None
            }
        }
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
            Some(b'\\') => {
                let name = self.command_name();
                matches!(name, "frac" | "sqrt" | "pi" | "binom" | "dbinom" | "tbinom")
                    || greek(name).is_some()
                    || Func::from_name(name).is_some()
            }
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
        let mut base = self.atom()?;
        while self.eat(b'!') {
            base = Expr::Fact(Box::new(base));
        }
        let e = if self.eat(b'^') {
            // A single digit or letter: `x^23` is x²·3 in LaTeX.
            let exp = self.script()?;
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
        } else if c == b'|' {
            // `|x|`; not an implicit factor (`2|x|` is not read), so a closing bar is never an opening.
            Expr::Func(Func::Abs, Box::new(self.group(b'|', b'|')?))
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
        } else if matches!(self.command_name(), "binom" | "dbinom" | "tbinom") {
            self.i += 1 + self.command_name().len();
            let n = self.group(b'{', b'}')?;
            let k = self.group(b'{', b'}')?;
            Expr::Binom(Box::new(n), Box::new(k))
        } else if self.command_name() == "pi" {
            self.i += 3;
            Expr::Pi
        } else if let Some(g) = greek(self.command_name()) {
            self.i += 1 + self.command_name().len();
            Expr::Var(g)
        } else if let Some(f) = Func::from_name(self.command_name()) {
            self.i += 1 + self.command_name().len();
            self.function(f)?
        } else {
            return None;
        };
        self.depth -= 1;
        Some(e)
    }
}

/// Parses a normalised answer (see [`crate::latex::normalize`]) as an expression; `None` when it is not one
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
    use crate::latex::normalize;

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
