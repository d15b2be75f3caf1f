//! Seeded synthetic problem generators for countdown and arithmetic.
//!
//! Problem `i` of a split depends only on (seed, split, i): it is drawn from its own
//! [`SplitMix64`] stream, so a dataset of 100 problems is the prefix of one of 10,000, and outputs do
//! not depend on threads or batch sizes. The generated test split never repeats a question of the
//! train split with the same seed.

use crate::{DataError, Result};
use rlvr_reward::countdown::{evaluate, CountdownProblem};
use rlvr_reward::number::Rational;
use serde::{Deserialize, Serialize};

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, portable, seedable generator whose output never
/// changes with a dependency update (unlike `rand`'s `StdRng`).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// A generator for stream `(seed, a, b)` (a hash of the three).
    pub fn stream(seed: u64, a: u64, b: u64) -> Self {
        let mut s = SplitMix64(seed ^ 0x5851_F42D_4C95_7F2D);
        let x = s.next_u64() ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut s = SplitMix64(x);
        let y = s.next_u64() ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03);
        SplitMix64(y)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (Lemire's multiply-shift; bias below 2^-64 per draw is negligible here).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let span = hi - lo + 1;
        if span == 0 {
            return self.next_u64();
        }
        lo + ((self.next_u64() as u128 * span as u128) >> 64) as u64
    }

    /// Uniform index below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.range(0, n as u64 - 1) as usize
    }
}

/// Which split a generated problem belongs to (a different random stream each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Training problems.
    Train,
    /// Held-out problems.
    Test,
}

impl Split {
    fn stream_id(self) -> u64 {
        match self {
            Split::Train => 1,
            Split::Test => 2,
        }
    }
}

/// An arithmetic operator of the generators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// `+`
    #[serde(rename = "+")]
    Add,
    /// `-`
    #[serde(rename = "-")]
    Sub,
    /// `*`
    #[serde(rename = "*")]
    Mul,
    /// `/` (exact division: answers may be fractions such as `7/4`)
    #[serde(rename = "/")]
    Div,
}

impl Op {
    fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
            Op::Mul => '*',
            Op::Div => '/',
        }
    }
    fn apply(self, a: Rational, b: Rational) -> Option<Rational> {
        match self {
            Op::Add => a.checked_add(b),
            Op::Sub => a.checked_sub(b),
            Op::Mul => a.checked_mul(b),
            Op::Div => a.checked_div(b),
        }
    }
}

fn digit_range(min_digits: u32, max_digits: u32) -> (u64, u64) {
    let lo = if min_digits <= 1 {
        0
    } else {
        10u64.pow(min_digits - 1)
    };
    (lo, 10u64.pow(max_digits) - 1)
}

/// Countdown generator knobs (`[data.countdown]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CountdownGenConfig {
    /// How many numbers each problem gives. Default 3.
    pub numbers: usize,
    /// Fewest digits of a given number (1 allows 1..9). Default 1.
    pub min_digits: u32,
    /// Most digits of a given number. Default 2 (numbers 1..99, as in TinyZero).
    pub max_digits: u32,
    /// Operators the hidden solution may use. Default all four.
    pub operators: Vec<Op>,
    /// Largest target; solutions must reach an integer in 1..=max_target. Default 1000.
    pub max_target: i64,
    /// Problems in a generated train split, 1 to 10⁷. Default 10000.
    pub train_size: usize,
    /// Problems in a generated test split, 1 to 10⁷. Default 500.
    pub test_size: usize,
}

impl Default for CountdownGenConfig {
    fn default() -> Self {
        CountdownGenConfig {
            numbers: 3,
            min_digits: 1,
            max_digits: 2,
            operators: vec![Op::Add, Op::Sub, Op::Mul, Op::Div],
            max_target: 1000,
            train_size: 10_000,
            test_size: 500,
        }
    }
}

/// The most problems a generated split may hold (`train_size`, `test_size`): ten million short
/// problems already take gigabytes, and every one is drawn at start-up.
pub const MAX_GENERATED: usize = 10_000_000;

/// Refuses a `data.{table}.train_size` or `test_size` of 0 or above [`MAX_GENERATED`].
fn check_sizes(table: &str, train_size: usize, test_size: usize) -> Result<()> {
    for (key, n) in [("train_size", train_size), ("test_size", test_size)] {
        if !(1..=MAX_GENERATED).contains(&n) {
            return Err(DataError::Config(format!(
                "data.{table}.{key} = {n} is out of range: expected 1 to {MAX_GENERATED} problems"
            )));
        }
    }
    Ok(())
}

fn check_digits(table: &str, min: u32, max: u32) -> Result<()> {
    if !(1..=9).contains(&min) || !(min..=9).contains(&max) {
        return Err(DataError::Config(format!(
            "data.{table}: need 1 <= min_digits <= max_digits <= 9, got {min} and {max}"
        )));
    }
    Ok(())
}

impl CountdownGenConfig {
    /// Checks the knobs.
    ///
    /// # Errors
    /// [`DataError::Config`] naming the key.
    pub fn validate(&self) -> Result<()> {
        check_digits("countdown", self.min_digits, self.max_digits)?;
        check_sizes("countdown", self.train_size, self.test_size)?;
        if !(2..=8).contains(&self.numbers) {
            return Err(DataError::Config(format!(
                "data.countdown.numbers must be 2..=8, got {}",
                self.numbers
            )));
        }
        if self.operators.is_empty() || self.max_target < 1 {
            return Err(DataError::Config(
                "data.countdown needs at least one operator and max_target >= 1".into(),
            ));
        }
        Ok(())
    }

    /// Problem `index` of `split`: numbers drawn uniformly from the digit range (never 0), combined in
    /// a random order with random operators into a hidden solution whose value (an integer in
    /// 1..=max_target) is the target; redrawn until one qualifies (at most 10,000 tries).
    ///
    /// # Errors
    /// [`DataError::Config`] when no qualifying problem was found (knobs too tight).
    pub fn generate(
        &self,
        seed: u64,
        split: Split,
        index: u64,
    ) -> Result<(CountdownProblem, String)> {
        let mut rng = SplitMix64::stream(seed, (split.stream_id() << 8) | 1, index);
        let (lo, hi) = digit_range(self.min_digits, self.max_digits);
        for _ in 0..10_000 {
            let numbers: Vec<i64> = (0..self.numbers)
                .map(|_| rng.range(lo.max(1), hi) as i64)
                .collect();
            // Combine in random order: ((a op b) op c) ... with random parenthesisation of pairs.
            let mut items: Vec<(String, Rational)> = numbers
                .iter()
                .map(|&n| (n.to_string(), Rational::from_int(n as i128)))
                .collect();
            let mut ok = true;
            while items.len() > 1 {
                let i = rng.below(items.len());
                let a = items.swap_remove(i);
                let j = rng.below(items.len());
                let b = items.swap_remove(j);
                let op = self.operators[rng.below(self.operators.len())];
                match op.apply(a.1, b.1) {
                    Some(v) => items.push((format!("({} {} {})", a.0, op.symbol(), b.0), v)),
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            let Some((solution, value)) = items.pop().filter(|_| ok) else {
                continue;
            };
            if value.is_integer() && value.numer() >= 1 && value.numer() <= self.max_target as i128
            {
                debug_assert_eq!(evaluate(&solution).map(|v| v.0), Ok(value));
                let target = value.numer() as i64;
                return Ok((CountdownProblem { numbers, target }, solution));
            }
        }
        Err(DataError::Config(
            "data.countdown: no problem reached a target in 1..=max_target after 10000 draws; widen the knobs".into(),
        ))
    }
}

/// Arithmetic generator knobs (`[data.arithmetic]`), e.g. DESIGN.md section 11's `aaa+bbb=`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArithmeticGenConfig {
    /// Operands per problem. Default 2.
    pub operands: usize,
    /// Fewest digits of an operand (1 allows 0..9). Default 2.
    pub min_digits: u32,
    /// Most digits of an operand. Default 3 (operands 10..=999).
    pub max_digits: u32,
    /// Operators, drawn uniformly between operands (usual precedence). Default `+` only.
    pub operators: Vec<Op>,
    /// Zero-pad every operand to `max_digits` (fixed-width problems such as `042+317=`). Default true.
    pub pad: bool,
    /// Problems in a generated train split, 1 to 10⁷. Default 10000.
    pub train_size: usize,
    /// Problems in a generated test split, 1 to 10⁷. Default 500.
    pub test_size: usize,
}

impl Default for ArithmeticGenConfig {
    fn default() -> Self {
        ArithmeticGenConfig {
            operands: 2,
            min_digits: 2,
            max_digits: 3,
            operators: vec![Op::Add],
            pad: true,
            train_size: 10_000,
            test_size: 500,
        }
    }
}

impl ArithmeticGenConfig {
    /// Checks the knobs.
    ///
    /// # Errors
    /// [`DataError::Config`] naming the key.
    pub fn validate(&self) -> Result<()> {
        check_digits("arithmetic", self.min_digits, self.max_digits)?;
        check_sizes("arithmetic", self.train_size, self.test_size)?;
        if !(2..=16).contains(&self.operands) || self.operators.is_empty() {
            return Err(DataError::Config(format!(
                "data.arithmetic needs 2..=16 operands and at least one operator, got {} and {:?}",
                self.operands, self.operators
            )));
        }
        Ok(())
    }

    /// Problem `index` of `split`: the question (`123+456=`) and its exact answer (`579`, `-12`, `7/4`).
    /// A draw that divides by zero or overflows is redrawn.
    ///
    /// # Errors
    /// [`DataError::Config`] when 10,000 draws all failed.
    pub fn generate(&self, seed: u64, split: Split, index: u64) -> Result<(String, String)> {
        let mut rng = SplitMix64::stream(seed, (split.stream_id() << 8) | 2, index);
        let (lo, hi) = digit_range(self.min_digits, self.max_digits);
        for _ in 0..10_000 {
            let mut q = String::new();
            for k in 0..self.operands {
                if k > 0 {
                    q.push(self.operators[rng.below(self.operators.len())].symbol());
                }
                let n = rng.range(lo, hi);
                if self.pad {
                    q.push_str(&format!("{n:0width$}", width = self.max_digits as usize));
                } else {
                    q.push_str(&n.to_string());
                }
            }
            if let Ok((v, _)) = evaluate(&q) {
                q.push('=');
                return Ok((q, v.to_string()));
            }
        }
        Err(DataError::Config(
            "data.arithmetic: 10000 draws all divided by zero; raise min_digits or drop `/`".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn countdown_problems_are_solvable_and_seeded() {
        let g = CountdownGenConfig::default();
        for i in 0..200 {
            let (p, sol) = g.generate(7, Split::Train, i).unwrap();
            assert_eq!(
                rlvr_reward::countdown::check(&sol, &p),
                Ok(()),
                "{sol} {p:?}"
            );
            assert_eq!(g.generate(7, Split::Train, i).unwrap().0, p);
        }
        assert_ne!(
            g.generate(7, Split::Train, 0).unwrap(),
            g.generate(7, Split::Test, 0).unwrap()
        );
    }

    #[test]
    fn arithmetic_problems() {
        let g = ArithmeticGenConfig::default();
        let (q, a) = g.generate(0, Split::Train, 0).unwrap();
        assert_eq!(q.len(), 8, "{q}");
        let (l, r) = q.trim_end_matches('=').split_once('+').unwrap();
        assert_eq!(
            l.parse::<i64>().unwrap() + r.parse::<i64>().unwrap(),
            a.parse::<i64>().unwrap()
        );
        let div = ArithmeticGenConfig {
            operators: vec![Op::Div],
            min_digits: 1,
            max_digits: 1,
            ..g
        };
        for i in 0..50 {
            let (q, a) = div.generate(0, Split::Test, i).unwrap();
            let (x, y) = q.trim_end_matches('=').split_once('/').unwrap();
            let v = Rational::new(x.parse().unwrap(), y.parse().unwrap()).unwrap();
            assert_eq!(v.to_string(), a);
        }
    }
}
