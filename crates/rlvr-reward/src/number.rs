//! Exact numbers: a checked `i128` rational and a scanner that finds the numbers written in free text.
//!
//! Every comparison of answers in this crate is exact: `18.00`, `18`, `36/2` and `\frac{36}{2}` are the
//! same [`Rational`]; `0.333` and `1/3` are not. Arithmetic is checked: an overflow is reported as `None`
//! (the verifiers then fall back to comparing canonical digit strings, or score 0), never a panic or a
//! wrapped value.

use std::cmp::Ordering;
use std::fmt;

/// An exact rational number `num / den` in lowest terms with `den > 0`.
///
/// All operations are checked: they return `None` on overflow of `i128` or on division by zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rational {
    num: i128,
    den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    // Works on magnitudes; `i128::MIN` is excluded by the callers (checked_abs).
    a = a.abs();
    b = b.abs();
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Rational {
    /// The integer `n`.
    pub fn from_int(n: i128) -> Self {
        Rational { num: n, den: 1 }
    }

    /// `num / den` reduced to lowest terms; `None` when `den == 0` or a magnitude is `i128::MIN`.
    pub fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 || num == i128::MIN || den == i128::MIN {
            return None;
        }
        let g = gcd(num, den).max(1);
        let (mut n, mut d) = (num / g, den / g);
        if d < 0 {
            n = -n;
            d = -d;
        }
        Some(Rational { num: n, den: d })
    }

    /// Numerator (sign carrier).
    pub fn numer(&self) -> i128 {
        self.num
    }

    /// Denominator, always positive.
    pub fn denom(&self) -> i128 {
        self.den
    }

    /// True when the denominator is 1.
    pub fn is_integer(&self) -> bool {
        self.den == 1
    }

    /// True when the value is zero.
    pub fn is_zero(&self) -> bool {
        self.num == 0
    }

    /// Checked addition.
    pub fn checked_add(self, o: Self) -> Option<Self> {
        let g = gcd(self.den, o.den);
        let l = (self.den / g).checked_mul(o.den)?;
        let a = self.num.checked_mul(l / self.den)?;
        let b = o.num.checked_mul(l / o.den)?;
        Rational::new(a.checked_add(b)?, l)
    }

    /// Checked subtraction.
    pub fn checked_sub(self, o: Self) -> Option<Self> {
        self.checked_add(o.checked_neg()?)
    }

    /// Checked negation.
    pub fn checked_neg(self) -> Option<Self> {
        Some(Rational {
            num: self.num.checked_neg()?,
            den: self.den,
        })
    }

    /// Checked multiplication (cross-reduced first to delay overflow).
    pub fn checked_mul(self, o: Self) -> Option<Self> {
        let g1 = gcd(self.num, o.den).max(1);
        let g2 = gcd(o.num, self.den).max(1);
        let n = (self.num / g1).checked_mul(o.num / g2)?;
        let d = (self.den / g2).checked_mul(o.den / g1)?;
        Rational::new(n, d)
    }

    /// Checked division; `None` when dividing by zero.
    pub fn checked_div(self, o: Self) -> Option<Self> {
        if o.num == 0 {
            return None;
        }
        self.checked_mul(Rational::new(o.den, o.num)?)
    }

    /// Checked integer power (negative exponents invert); `None` on overflow, `0^-n`, or `|exp| > 256`.
    pub fn checked_pow(self, exp: i128) -> Option<Self> {
        if exp.unsigned_abs() > 256 {
            return None;
        }
        let mut acc = Rational::from_int(1);
        for _ in 0..exp.unsigned_abs() {
            acc = acc.checked_mul(self)?;
        }
        if exp < 0 {
            Rational::from_int(1).checked_div(acc)
        } else {
            Some(acc)
        }
    }

    /// Nearest `f64` (for approximate comparisons of expressions that are not rational).
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }
}

impl PartialOrd for Rational {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rational {
    fn cmp(&self, other: &Self) -> Ordering {
        // Compare a/b with c/d via a*d vs c*b, falling back to f64 if that overflows.
        match (
            self.num.checked_mul(other.den),
            other.num.checked_mul(self.den),
        ) {
            (Some(l), Some(r)) => l.cmp(&r),
            _ => self
                .to_f64()
                .partial_cmp(&other.to_f64())
                .unwrap_or(Ordering::Equal),
        }
    }
}

impl fmt::Display for Rational {
    /// Integers print as `18`, other values as `3/4` or `-7/2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

/// A number found in text by [`scan_numbers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumToken {
    /// Byte offset of the first character of the token (sign included) in the scanned text.
    pub start: usize,
    /// Byte offset one past the token's last character.
    pub end: usize,
    /// The exact value, `None` when it does not fit an `i128` rational (more than ~38 digits).
    pub value: Option<Rational>,
    /// Canonical text: ASCII `-` for any minus, no `+`, no separators, no trailing decimal zeros,
    /// fractions as `a/b` (so `1,000.50` → `1000.5`, `\frac{3}{4}` → `3/4`, `−7` → `-7`).
    pub canonical: String,
}

impl NumToken {
    /// True when both tokens denote the same number (exact values, or canonical text when a value
    /// overflowed).
    pub fn same_number(&self, other: &NumToken) -> bool {
        match (self.value, other.value) {
            (Some(a), Some(b)) => a == b,
            _ => self.canonical == other.canonical,
        }
    }
}

/// Characters accepted as a minus sign: ASCII hyphen-minus, U+2212 MINUS SIGN, U+FE63, U+FF0D.
pub(crate) fn is_minus(c: char) -> bool {
    matches!(c, '-' | '\u{2212}' | '\u{FE63}' | '\u{FF0D}')
}

/// Characters accepted between digit groups of three: `,`, no-break space, narrow no-break space,
/// thin space, and (when `spaces` is on) a plain space.
fn is_group_sep(c: char, spaces: bool) -> bool {
    matches!(c, ',' | '\u{00A0}' | '\u{202F}' | '\u{2009}') || (spaces && c == ' ')
}

/// Options of [`scan_numbers`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanOptions {
    /// Accept a plain space between groups of three digits (`1 000`). Off for free text, where
    /// `3 100` is more often two numbers; on inside an answer segment such as `#### 1 000`.
    pub space_groups: bool,
}

/// Parses the unsigned decimal `int_digits[.frac_digits]` into an exact rational, `None` on overflow.
fn decimal_value(int_digits: &str, frac_digits: &str) -> Option<Rational> {
    let mut n: i128 = 0;
    for b in int_digits.bytes().chain(frac_digits.bytes()) {
        n = n.checked_mul(10)?.checked_add((b - b'0') as i128)?;
    }
    let den = 10i128.checked_pow(frac_digits.len() as u32)?;
    Rational::new(n, den)
}

/// Canonical decimal text: leading zeros dropped (`007` → `7`), trailing fraction zeros dropped.
fn decimal_canonical(int_digits: &str, frac_digits: &str) -> String {
    let i = int_digits.trim_start_matches('0');
    let i = if i.is_empty() { "0" } else { i };
    let f = frac_digits.trim_end_matches('0');
    if f.is_empty() {
        i.to_string()
    } else {
        format!("{i}.{f}")
    }
}

/// One unsigned decimal at byte `i` of `s` (digits with optional valid thousands grouping and an
/// optional `.digits` part, or `.digits`). Returns (end, integer digits, fraction digits).
fn scan_unsigned(s: &str, i: usize, opts: ScanOptions) -> Option<(usize, String, String)> {
    let b = s.as_bytes();
    let mut j = i;
    while j < b.len() && b[j].is_ascii_digit() {
        j += 1;
    }
    let mut int_digits = s[i..j].to_string();
    // Thousands grouping: only when the first group has 1-3 digits and every later group exactly 3.
    if (1..=3).contains(&(j - i)) {
        let mut k = j;
        loop {
            let rest = &s[k..];
            let mut chars = rest.chars();
            let sep_len = match chars.next() {
                Some(c) if is_group_sep(c, opts.space_groups) => c.len_utf8(),
                Some('{') if rest.starts_with("{,}") => 3,
                _ => break,
            };
            let g = k + sep_len;
            let digits = b[g..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits != 3 {
                break;
            }
            int_digits.push_str(&s[g..g + 3]);
            k = g + 3;
        }
        j = k;
    }
    let mut frac = String::new();
    if j < b.len() && b[j] == b'.' {
        let d = b[j + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if d > 0 {
            frac = s[j + 1..j + 1 + d].to_string();
            j += 1 + d;
        }
    }
    if int_digits.is_empty() && frac.is_empty() {
        return None;
    }
    Some((j, int_digits, frac))
}

/// Reads `{digits}` (optionally signed, spaces allowed) at byte `i`, for `\frac{3}{4}`.
fn scan_braced_number(s: &str, i: usize) -> Option<(usize, Rational, String)> {
    let rest = s.get(i..)?;
    let inner_start = i + rest.find(|c: char| !c.is_whitespace())?;
    if !s[inner_start..].starts_with('{') {
        // `\frac34` shorthand: a single digit.
        let c = s[inner_start..].chars().next()?;
        let d = c.to_digit(10)?;
        return Some((
            inner_start + 1,
            Rational::from_int(d as i128),
            d.to_string(),
        ));
    }
    let close = inner_start + s[inner_start..].find('}')?;
    let body = s[inner_start + 1..close].trim();
    let (neg, body) = match body.chars().next() {
        Some(c) if is_minus(c) => (true, body[c.len_utf8()..].trim_start()),
        _ => (false, body),
    };
    let (end, ip, fp) = scan_unsigned(body, 0, ScanOptions::default())?;
    if end != body.len() {
        return None;
    }
    let mut v = decimal_value(&ip, &fp)?;
    let mut c = decimal_canonical(&ip, &fp);
    if neg {
        v = v.checked_neg()?;
        c = format!("-{c}");
    }
    Some((close + 1, v, c))
}

/// Tries `\frac{a}{b}` (also `\dfrac`, `\tfrac`, `\frac34`) at byte `i`.
fn scan_latex_frac(s: &str, i: usize) -> Option<(usize, Rational, String)> {
    let rest = &s[i..];
    let after = ["\\frac", "\\dfrac", "\\tfrac"]
        .iter()
        .find(|p| rest.starts_with(**p))
        .map(|p| i + p.len())?;
    let (e1, n, nc) = scan_braced_number(s, after)?;
    let (e2, d, dc) = scan_braced_number(s, e1)?;
    let v = n.checked_div(d)?;
    Some((e2, v, format!("{nc}/{dc}")))
}

/// Finds every number written in `text`, left to right, in one linear pass.
///
/// Recognised: integers and decimals (`18`, `18.00`, `.5`), valid thousands grouping (`1,000`,
/// `1{,}000`, no-break/thin spaces, plain spaces with [`ScanOptions::space_groups`]), a sign (ASCII `-`,
/// U+2212 and other minus signs, or `+`; `-$5` too) when it directly precedes the digits and does not follow a
/// letter, digit or closing bracket (so `5-3` is `5` and `3`, but `x = -3` is `-3`), simple fractions
/// `3/4` (no spaces) and `\frac{3}{4}` / `\dfrac` / `\tfrac`. Everything else (`$`, `%`, units,
/// markdown `**`, a trailing period) is left out of the token.
pub fn scan_numbers(text: &str, opts: ScanOptions) -> Vec<NumToken> {
    let mut out = Vec::new();
    scan_each(text, opts, &mut |t| {
        out.push(t);
        true
    });
    out
}

/// The scanner behind [`scan_numbers`]: hands each token to `sink` and stops when it returns false (so
/// [`first_number`] reads only what it needs and [`last_number`] keeps one token at a time).
///
/// About 100 lines: one left-to-right pass with the sign, LaTeX-fraction and decimal cases inline, kept
/// together so the single-pass (linear-time) structure stays visible.
fn scan_each(text: &str, opts: ScanOptions, sink: &mut dyn FnMut(NumToken) -> bool) {
    let b = text.as_bytes();
    let mut i = 0;
    let mut prev: Option<char> = None;
    while i < b.len() {
        let c = match text[i..].chars().next() {
            Some(c) => c,
            None => break,
        };
        // Sign handling.
        let mut start = i;
        let mut neg = false;
        let mut body = i;
        let sign_ok =
            !matches!(prev, Some(p) if p.is_alphanumeric() || matches!(p, ')' | ']' | '}' | '.'));
        if (is_minus(c) || c == '+') && sign_ok {
            let mut n = i + c.len_utf8();
            // A currency sign between the sign and the digits: `-$5`, `-\$5`.
            if text[n..].starts_with("\\$") {
                n += 2;
            } else if text[n..].starts_with('$') {
                n += 1;
            }
            let starts_num = text[n..].starts_with(|d: char| d.is_ascii_digit())
                || (text[n..].starts_with('.')
                    && text[n + 1..].starts_with(|d: char| d.is_ascii_digit()))
                || text[n..].starts_with("\\frac")
                || text[n..].starts_with("\\dfrac")
                || text[n..].starts_with("\\tfrac");
            if starts_num {
                neg = is_minus(c);
                body = n;
            }
        }
        let prev_is_digit = matches!(prev, Some(p) if p.is_ascii_digit());
        let parsed: Option<(usize, Option<Rational>, String)> = if body == i && c == '\\' {
            scan_latex_frac(text, i).map(|(e, v, c)| (e, Some(v), c))
        } else if body != i && text[body..].starts_with('\\') {
            scan_latex_frac(text, body).map(|(e, v, c)| (e, Some(v), c))
        } else if !prev_is_digit
            && (text[body..].starts_with(|d: char| d.is_ascii_digit())
                || (text[body..].starts_with('.')
                    && text[body + 1..].starts_with(|d: char| d.is_ascii_digit())
                    && (body != i || !matches!(prev, Some(p) if p.is_alphanumeric()))))
        {
            scan_unsigned(text, body, opts).map(|(end, ip, fp)| {
                let mut v = decimal_value(&ip, &fp);
                let mut canon = decimal_canonical(&ip, &fp);
                let mut end = end;
                // Simple fraction a/b: integers on both sides, no spaces.
                if fp.is_empty() && text[end..].starts_with('/') {
                    let dl = b[end + 1..]
                        .iter()
                        .take_while(|c| c.is_ascii_digit())
                        .count();
                    if dl > 0 {
                        let ds = &text[end + 1..end + 1 + dl];
                        let dv = decimal_value(ds, "");
                        v = match (v, dv) {
                            (Some(n), Some(d)) => n.checked_div(d),
                            _ => None,
                        };
                        canon = format!("{canon}/{}", decimal_canonical(ds, ""));
                        end = end + 1 + dl;
                    }
                }
                (end, v, canon)
            })
        } else {
            None
        };
        match parsed {
            Some((end, value, canon)) => {
                let value = if neg {
                    value.and_then(|v| v.checked_neg())
                } else {
                    value
                };
                let is_zero = value.map(|v| v.is_zero()).unwrap_or(false);
                let canonical = if neg && !is_zero {
                    format!("-{canon}")
                } else {
                    canon
                };
                if body == i {
                    start = i;
                }
                let more = sink(NumToken {
                    start,
                    end,
                    value,
                    canonical,
                });
                if !more {
                    break;
                }
                prev = text[..end].chars().next_back();
                i = end;
            }
            None => {
                prev = Some(c);
                i += c.len_utf8();
            }
        }
    }
}

/// The number that `text` consists of, ignoring `$`, `%`, markdown emphasis, spaces, a trailing period
/// and trailing units: the first number token when the text holds at least one.
pub fn first_number(text: &str, opts: ScanOptions) -> Option<NumToken> {
    let mut first = None;
    scan_each(text, opts, &mut |t| {
        first = Some(t);
        false
    });
    first
}

/// The last number token of `text`.
pub fn last_number(text: &str) -> Option<NumToken> {
    let mut last = None;
    scan_each(text, ScanOptions::default(), &mut |t| {
        last = Some(t);
        true
    });
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> Vec<String> {
        scan_numbers(s, ScanOptions::default())
            .into_iter()
            .map(|t| t.canonical)
            .collect()
    }

    #[test]
    fn rational_basics() {
        let a = Rational::new(6, -4).unwrap();
        assert_eq!(a.to_string(), "-3/2");
        assert_eq!(
            a.checked_add(Rational::from_int(2)).unwrap().to_string(),
            "1/2"
        );
        assert!(Rational::from_int(1)
            .checked_div(Rational::from_int(0))
            .is_none());
        assert!(Rational::from_int(i128::MAX)
            .checked_add(Rational::from_int(1))
            .is_none());
        assert_eq!(
            Rational::from_int(2).checked_pow(-2).unwrap().to_string(),
            "1/4"
        );
    }

    #[test]
    fn scanner_cases() {
        assert_eq!(canon("I have 1,000 apples and $18.00."), ["1000", "18"]);
        assert_eq!(
            canon("5-3 = 2, x = -3, y = \u{2212}7"),
            ["5", "3", "2", "-3", "-7"]
        );
        assert_eq!(canon("**18**"), ["18"]);
        assert_eq!(
            canon("3/4 and \\frac{3}{4} and \\dfrac12"),
            ["3/4", "3/4", "1/2"]
        );
        assert_eq!(canon("+5 and 1{,}234"), ["5", "1234"]);
        assert_eq!(canon("abc-5"), ["5"]);
        assert_eq!(canon("1,23"), ["1", "23"]);
        assert_eq!(canon("0.50%"), ["0.5"]);
        assert_eq!(canon("-0"), ["0"]);
        assert_eq!(
            canon("a loss of -$5 and -\\$6.50 but $-7"),
            ["-5", "-6.5", "-7"]
        );
        let big = "123456789012345678901234567890123456789012345";
        let t = scan_numbers(big, ScanOptions::default());
        assert_eq!(t.len(), 1);
        assert!(t[0].value.is_none());
        assert_eq!(t[0].canonical, big);
    }
}
