//! Countdown verifier: reach a target with `+ - * /` and parentheses, using each given number exactly
//! once.
//!
//! The completion's expression is read from its last `<answer>...</answer>` (else the last `\boxed{}`,
//! else its last non-empty line); an `= N` tail is ignored (the side with operators is taken). It is
//! parsed by a real recursive-descent parser (never an eval) accepting non-negative integer literals,
//! binary `+ - * /` (also `×`, `·`, `x`, `÷`, `\times`, `\cdot`, `\div`, unicode minus; `$` and
//! `\(`/`\)` ignored) and parentheses;
//! unary minus, decimals and other characters are rejected. Evaluation is exact rational arithmetic
//! (`(3/2)*4` = 6). Reward 1 only when the literals are exactly the given numbers as a multiset and the
//! value equals the target; a division by zero, an overflow, a parse error, a missing or extra number
//! all score 0 (the reason is kept in [`CountdownFault`] for debugging, not raised as an error).
//!
//! Reference: JSON `{"numbers": [..], "target": N}` (see [`CountdownProblem::to_reference`]).

use crate::extract::{answer_tag, last_boxed};
use crate::number::Rational;
use crate::{truncate, RewardError, Sample, Score, Verifier};
use serde::{Deserialize, Serialize};

/// One countdown problem.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountdownProblem {
    /// The numbers to use, each exactly once (non-negative).
    pub numbers: Vec<i64>,
    /// The value to reach.
    pub target: i64,
}

impl CountdownProblem {
    /// The reference string the verifier reads: `{"numbers":[..],"target":N}`.
    pub fn to_reference(&self) -> String {
        serde_json::to_string(self).expect("a struct of integers always serialises")
    }

    /// Reads a reference written by [`CountdownProblem::to_reference`].
    ///
    /// # Errors
    /// [`RewardError::BadReference`] naming the JSON problem.
    pub fn from_reference(reference: &str) -> Result<Self, RewardError> {
        serde_json::from_str(reference.trim()).map_err(|e| RewardError::BadReference {
            task: "countdown",
            reference: truncate(reference, 200),
            reason: format!("expected {{\"numbers\": [int, ...], \"target\": int}}: {e}"),
        })
    }
}

/// Why a countdown answer scored 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountdownFault {
    /// The expression is not valid syntax (byte offset and what was expected).
    #[error("parse error at byte {pos}: {msg}")]
    Parse {
        /// Byte offset in the expression.
        pos: usize,
        /// What went wrong.
        msg: &'static str,
    },
    /// A division by zero occurred.
    #[error("division by zero")]
    DivisionByZero,
    /// An intermediate value overflowed i128.
    #[error("arithmetic overflow")]
    Overflow,
    /// The literals used are not exactly the given numbers.
    #[error("numbers used {used:?} are not exactly {given:?}")]
    WrongNumbers {
        /// Literals in the expression, sorted.
        used: Vec<i128>,
        /// Given numbers, sorted.
        given: Vec<i128>,
    },
    /// The value is not the target.
    #[error("value {value} is not the target {target}")]
    WrongValue {
        /// The exact value reached.
        value: String,
        /// The target.
        target: i64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok {
    Num(i128),
    Op(u8),
    Open,
    Close,
}

fn tokenize(s: &str) -> Result<Vec<(usize, Tok)>, CountdownFault> {
    let mut out = Vec::new();
    let mut i = 0;
    let b = s.as_bytes();
    while i < s.len() {
        let rest = &s[i..];
        let c = rest.chars().next().unwrap_or(' ');
        let word = [("\\times", b'*'), ("\\cdot", b'*'), ("\\div", b'/')]
            .iter()
            .find(|(w, _)| rest.starts_with(w));
        if let Some((w, op)) = word {
            out.push((i, Tok::Op(*op)));
            i += w.len();
            continue;
        }
        let tok = match c {
            '0'..='9' => {
                let n = b[i..].iter().take_while(|d| d.is_ascii_digit()).count();
                let mut v: i128 = 0;
                for d in &b[i..i + n] {
                    v = v
                        .checked_mul(10)
                        .and_then(|v| v.checked_add((d - b'0') as i128))
                        .ok_or(CountdownFault::Overflow)?;
                }
                out.push((i, Tok::Num(v)));
                i += n;
                continue;
            }
            '+' => Tok::Op(b'+'),
            '-' | '\u{2212}' | '\u{2013}' => Tok::Op(b'-'),
            '*' | '×' | '·' | 'x' | 'X' => Tok::Op(b'*'),
            '/' | '÷' => Tok::Op(b'/'),
            '(' | '[' | '{' => Tok::Open,
            ')' | ']' | '}' => Tok::Close,
            c if c.is_whitespace() || c == '$' => {
                i += c.len_utf8();
                continue;
            }
            '\\' if rest.starts_with("\\(") || rest.starts_with("\\)") => {
                i += 2;
                continue;
            }
            _ => {
                return Err(CountdownFault::Parse {
                    pos: i,
                    msg: "unexpected character (allowed: integers, + - * /, parentheses)",
                })
            }
        };
        out.push((i, tok));
        i += c.len_utf8();
    }
    Ok(out)
}

const MAX_DEPTH: usize = 256;

struct Eval<'a> {
    toks: &'a [(usize, Tok)],
    i: usize,
    end: usize,
    used: Vec<i128>,
    depth: usize,
}

impl Eval<'_> {
    fn pos(&self) -> usize {
        self.toks.get(self.i).map(|t| t.0).unwrap_or(self.end)
    }
    fn err(&self, msg: &'static str) -> CountdownFault {
        CountdownFault::Parse {
            pos: self.pos(),
            msg,
        }
    }
    fn expr(&mut self) -> Result<Rational, CountdownFault> {
        let mut v = self.term()?;
        while let Some(&(_, Tok::Op(op @ (b'+' | b'-')))) = self.toks.get(self.i) {
            self.i += 1;
            let r = self.term()?;
            v = if op == b'+' {
                v.checked_add(r)
            } else {
                v.checked_sub(r)
            }
            .ok_or(CountdownFault::Overflow)?;
        }
        Ok(v)
    }
    fn term(&mut self) -> Result<Rational, CountdownFault> {
        let mut v = self.atom()?;
        while let Some(&(_, Tok::Op(op @ (b'*' | b'/')))) = self.toks.get(self.i) {
            self.i += 1;
            let r = self.atom()?;
            v = if op == b'*' {
                v.checked_mul(r).ok_or(CountdownFault::Overflow)?
            } else if r.is_zero() {
                return Err(CountdownFault::DivisionByZero);
            } else {
                v.checked_div(r).ok_or(CountdownFault::Overflow)?
            };
        }
        Ok(v)
    }
    fn atom(&mut self) -> Result<Rational, CountdownFault> {
        match self.toks.get(self.i).map(|t| t.1) {
            Some(Tok::Num(n)) => {
                self.i += 1;
                self.used.push(n);
                Ok(Rational::from_int(n))
            }
            Some(Tok::Open) => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(self.err("parentheses nested too deeply"));
                }
                self.i += 1;
                let v = self.expr()?;
                if self.toks.get(self.i).map(|t| t.1) != Some(Tok::Close) {
                    return Err(self.err("expected `)`"));
                }
                self.i += 1;
                self.depth -= 1;
                Ok(v)
            }
            Some(Tok::Op(b'-')) => Err(self.err("unary minus is not allowed")),
            Some(_) => Err(self.err("expected a number or `(`")),
            None => Err(self.err("unexpected end of expression")),
        }
    }
}

/// Parses and evaluates `expr` exactly; returns the value and the integer literals used, in order.
///
/// # Errors
/// [`CountdownFault::Parse`], [`CountdownFault::DivisionByZero`] or [`CountdownFault::Overflow`].
pub fn evaluate(expr: &str) -> Result<(Rational, Vec<i128>), CountdownFault> {
    let toks = tokenize(expr)?;
    let mut e = Eval {
        toks: &toks,
        i: 0,
        end: expr.len(),
        used: Vec::new(),
        depth: 0,
    };
    let v = e.expr()?;
    if e.i != toks.len() {
        return Err(e.err("unexpected token after the expression"));
    }
    Ok((v, e.used))
}

/// The expression a completion proposes (see the module docs), trimmed; `None` when empty.
pub fn extract_expression(completion: &str) -> Option<String> {
    let region = answer_tag(completion)
        .or_else(|| last_boxed(completion))
        .unwrap_or_else(|| {
            completion
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
        });
    let has_op = |s: &str| s.contains(['+', '-', '*', '/', '×', '÷', '\\']);
    let parts: Vec<&str> = region.split('=').collect();
    let chosen = parts
        .iter()
        .copied()
        .find(|p| has_op(p))
        .unwrap_or(parts[0])
        .trim();
    (!chosen.is_empty()).then(|| chosen.to_string())
}

/// Checks `expr` against a problem: `Ok(())` when it is correct, else the fault.
///
/// # Errors
/// The [`CountdownFault`] that makes the answer wrong.
pub fn check(expr: &str, problem: &CountdownProblem) -> Result<(), CountdownFault> {
    let (value, mut used) = evaluate(expr)?;
    let mut given: Vec<i128> = problem.numbers.iter().map(|&n| n as i128).collect();
    used.sort_unstable();
    given.sort_unstable();
    if used != given {
        return Err(CountdownFault::WrongNumbers { used, given });
    }
    if value != Rational::from_int(problem.target as i128) {
        return Err(CountdownFault::WrongValue {
            value: value.to_string(),
            target: problem.target,
        });
    }
    Ok(())
}

/// Scores countdown completions (reference: [`CountdownProblem::to_reference`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountdownVerifier;

impl Verifier for CountdownVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, RewardError> {
        let problem = CountdownProblem::from_reference(sample.reference)?;
        let expr = extract_expression(sample.completion);
        let correct = expr.as_deref().is_some_and(|e| check(e, &problem).is_ok());
        Ok(Score::binary(
            correct,
            expr,
            Some(problem.target.to_string()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults() {
        let p = CountdownProblem {
            numbers: vec![3, 4, 2],
            target: 6,
        };
        assert_eq!(
            check(
                "(3/2)*4",
                &CountdownProblem {
                    numbers: vec![3, 2, 4],
                    target: 6
                }
            ),
            Ok(())
        );
        assert_eq!(check("3*4/2", &p), Ok(()));
        assert_eq!(check("3 × 4 ÷ 2", &p), Ok(()));
        assert_eq!(check("4/(2-2)*3", &p), Err(CountdownFault::DivisionByZero));
        assert!(matches!(
            check("3*2", &p),
            Err(CountdownFault::WrongNumbers { .. })
        ));
        assert!(matches!(
            check("3*4/2*2", &p),
            Err(CountdownFault::WrongNumbers { .. })
        ));
        assert!(matches!(
            check("-3+4+2", &p),
            Err(CountdownFault::Parse { .. })
        ));
        assert!(matches!(
            check("3+4+2", &p),
            Err(CountdownFault::WrongValue { .. })
        ));
        assert!(matches!(
            check("__import__('os')", &p),
            Err(CountdownFault::Parse { .. })
        ));
    }
}
