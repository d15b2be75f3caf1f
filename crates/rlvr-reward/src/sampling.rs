//! Seeded numeric sampling for symbolic equivalence: two parsed expressions are compared by value at
//! fixed pseudo-random points (never by evaluating code). Used by [`crate::answer`].

use crate::expr::{Expr, Value};
use std::collections::BTreeSet;

/// Seed of the sample points of [`same_value`] and [`proportional`] (fixed: the same pair always gets
/// the same verdict).
pub const SAMPLE_SEED: u64 = 0x5EED_0017;
/// Number of sample points: a third with every variable in (0.1, 0.9), a third in (1.1, 3), a third in
/// (-3, -0.1) (so domains such as `\arcsin`'s and `\ln`'s are met).
pub const SAMPLE_POINTS: usize = 12;
/// Relative tolerance of numeric agreement: `|x - y| <= REL_TOL * max(1, |x|, |y|)`.
pub const REL_TOL: f64 = 1e-9;
/// Fewest sample points at which both sides must be defined (finite) for a sampled verdict.
pub const MIN_DEFINED: usize = 3;

/// SplitMix64: a tiny seeded generator for the sample points.
struct SplitMix(u64);

impl SplitMix {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The variables of both expressions, and for each sample point a value per variable.
fn sample_points(a: &Expr, b: &Expr) -> (Vec<char>, Vec<Vec<f64>>) {
    let mut set = BTreeSet::new();
    a.vars(&mut set);
    b.vars(&mut set);
    let vars: Vec<char> = set.into_iter().collect();
    let mut rng = SplitMix(SAMPLE_SEED);
    let points = (0..SAMPLE_POINTS)
        .map(|p| {
            let (lo, hi) = match p % 3 {
                0 => (0.1, 0.9),
                1 => (1.1, 3.0),
                _ => (-3.0, -0.1),
            };
            vars.iter()
                .map(|_| lo + (hi - lo) * rng.next_f64())
                .collect()
        })
        .collect();
    (vars, points)
}

fn eval_at(e: &Expr, vars: &[char], point: &[f64]) -> Value {
    e.eval(&|c| {
        vars.iter()
            .position(|&v| v == c)
            .map_or(f64::NAN, |k| point[k])
    })
}

fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= REL_TOL * x.abs().max(y.abs()).max(1.0)
}

/// True when `e` mentions no variable.
pub fn is_constant(e: &Expr) -> bool {
    let mut v = BTreeSet::new();
    e.vars(&mut v);
    v.is_empty()
}

/// Whether two expressions denote the same value (or the same function of their variables).
///
/// Both exact (rational, no variables): exact equality (`0.333` ≠ `\frac13`). Otherwise both are
/// evaluated at [`SAMPLE_POINTS`] seeded points ([`SAMPLE_SEED`]); they agree when every point where
/// one side is defined has the other defined too, at least [`MIN_DEFINED`] points are defined, and
/// every defined point agrees within [`REL_TOL`] (relative, floor 1). Sampling can in principle accept
/// two different functions that agree at every sample point; with 12 irrational points per variable this
/// needs a contrived pair and never a plain wrong number.
pub fn same_value(a: &Expr, b: &Expr) -> bool {
    let (vars, points) = sample_points(a, b);
    let mut defined = 0;
    for p in &points {
        let (x, y) = (eval_at(a, &vars, p), eval_at(b, &vars, p));
        if let (Some(r), Some(q)) = (x.exact, y.exact) {
            return r == q;
        }
        let (x, y) = (x.approx, y.approx);
        if x.is_finite() != y.is_finite() {
            return false;
        }
        if x.is_finite() {
            if !close(x, y) {
                return false;
            }
            defined += 1;
        }
        if vars.is_empty() {
            break;
        }
    }
    defined >= MIN_DEFINED || (vars.is_empty() && defined == 1)
}

/// Whether `a = 0` and `b = 0` are the same equation in the sense used for equations: `a = c · b` for
/// one non-zero constant `c`, checked at the sample points of [`same_value`] (each side must mention a
/// variable; points where both vanish are skipped, a point where only one vanishes refutes).
pub fn proportional(a: &Expr, b: &Expr) -> bool {
    proportion(a, b).is_some()
}

/// The constant `c` of [`proportional`] (`a = c · b` at every sample point), when there is one.
pub fn proportion(a: &Expr, b: &Expr) -> Option<f64> {
    if is_constant(a) || is_constant(b) {
        return None;
    }
    let (vars, points) = sample_points(a, b);
    let mut ratio: Option<f64> = None;
    let mut defined = 0;
    for p in &points {
        let (x, y) = (eval_at(a, &vars, p).approx, eval_at(b, &vars, p).approx);
        if x.is_finite() != y.is_finite() {
            return None;
        }
        if !x.is_finite() {
            continue;
        }
        let (zx, zy) = (x.abs() < 1e-12, y.abs() < 1e-12);
        if zx || zy {
            if zx != zy {
                return None;
            }
            continue;
        }
        let r = x / y;
        match ratio {
            None => ratio = Some(r),
            Some(r0) if !close(r0, r) => return None,
            _ => {}
        }
        defined += 1;
    }
    (defined >= MIN_DEFINED).then_some(ratio).flatten()
}
