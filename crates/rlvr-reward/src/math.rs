//! MATH (Hendrycks et al.; MATH-500) verifier.
//!
//! # What is compared
//! Gold: the last `\boxed{}` of the reference when it has one (a full solution), else the reference as a
//! bare answer. Extracted: the last `\boxed{}` of the completion (nested braces; `\fbox` too); no box
//! scores 0. When the gold holds several answers (a list, a set, `a \pm b`) and the last box does not
//! match it, the set of all boxes of the completion is tried as well (`\boxed{-2}` and `\boxed{1}`
//! against `1, -2`; a box repeated with the same normalised text counts once; at most the last
//! [`MAX_BOXES`] boxes). A single-answer gold is only ever compared with the last box, so boxing every
//! candidate gains nothing. A reference with several different boxes at most
//! [`MAX_WORDS_BETWEEN_BOXES`] words apart (`\boxed{1} and \boxed{-2}`, Math-Verify's gold
//! extraction) is also read as one list of answers: the completion matches it or its last box (a
//! MATH solution that boxes an intermediate value keeps its last box as the answer).
//!
//! Both sides are normalised by [`crate::latex::normalize_keep_label`] and compared by
//! [`crate::answer::compare`], gold first. The normal form drops `\left`/`\right`, spacing (`\,` `\!`
//! `\quad` `~`), `\displaystyle`; maps `\dfrac`/`\tfrac`/`\cfrac` to `\frac`, `\mbox`/`\textnormal`/
//! `\mathrm`/... to `\text`; drops `\text{..}` units after a value (`\frac13 \text{meters}`,
//! `125\textnormal{ miles}`, `15\mbox{ cm}^2`) and unit words after a number (`125 miles`, `3 km/h`); drops
//! `^\circ`, `°`, `\%`, `\$`, `€`, `£`, `¥`; reads `²`/`³` as powers, `≤ \le \leq \leqslant <=` as one
//! relation (likewise `≥`, `≠`, `\not=`), `and` as a list comma and `or`/`\lor` as a union of relations;
//! reads a doubled backslash before a command name as one (`\\boxed`, `\\le`: text escaped once
//! more), `;` as a list comma (`-12;-11`, `(0;-2;6)`) and one brace group around the whole answer as
//! grouping only (`{1,2,3}` is the list; `\{1,2,3\}` the set); joins thousands groups (`14,916`, `14{,}916`, `10,\!080`, thin spaces); rewrites every matrix
//! environment (`pmatrix`, `bmatrix`, `array` in `\left[ \right]`, ...) to one.
//!
//! # Policies (where rlvr follows Math-Verify and where it differs)
//! Math-Verify (Hugging Face; its README) parses both sides to SymPy and compares them, gold first, by
//! string, numeric (rounded) and symbolic equality, with sets order-insensitive, relations with their
//! direction normalised (`a < 2` = `2 > a`), intervals, matrices and equations. rlvr follows those
//! semantics with a parser of its own and no computer algebra:
//! - **Numbers**: exact rational equality (`0.5` = `\frac12`, `18.00` = `18`). *Differs*: Math-Verify
//!   rounds floats (6 digits), so `0.333333` may match `\frac13`; rlvr never equates a finite decimal with a
//!   different rational (`0.333` ≠ `\frac13`) unless the answer says `\approx`.
//! - **Printed decimals**: a decimal of at least [`crate::answer::PRINTED_DIGITS`] (12) significant
//!   digits is a machine printout (`0.0833333333333333`) and matches the constant it rounds to
//!   within half a unit of its last place (Math-Verify's rounding, for printouts only).
//! - **`\approx`**: a decimal after `\approx` matches when within one unit of its last written decimal
//!   place and within [`crate::forms::APPROX_REL`] (1%) of the exact value (`\approx 0.33` matches
//!   `\frac13`, `\approx 0.3` does not, `\approx 0` matches no non-zero gold); an exact side before the
//!   `\approx` may match instead (`\frac13 \approx 0.33`).
//! - **Expressions**: symbolic equivalence by seeded numeric evaluation: both sides are parsed (numbers,
//!   variables, Greek letters, `\pi`, Euler's `e`, `\frac`, `\sqrt`, powers, `\sin`...`\arctan`,
//!   `\sec`/`\csc`/`\cot`, `\ln`/`\log`/`\log_b`, `\exp`, `|x|`, `n!`, `\binom`; `i` is an unknown, so complex
//!   arithmetic such as `i^2 = -1` is not applied) and evaluated at 12 points drawn with a fixed seed
//!   ([`crate::sampling::SAMPLE_SEED`]); they agree when every point agrees within relative 1e-9
//!   ([`crate::sampling::REL_TOL`]) and both are defined at the same points (at least 3). So `\sec^2 y` =
//!   `\tan^2 y + 1` and `(x+1)^2` = `x^2+2x+1`. Math-Verify uses SymPy's `simplify`; sampling decides the
//!   same pairs for the expressions answers contain and is bounded in time.
//! - **Lists and sets**: a set `\{..\}`, a bare list `a, b`, "`a` and `b`", a union of finite sets and the
//!   two values of `a \pm b` are compared as unordered multisets (`\pm 2021` = `\{-2021, 2021\}`), like
//!   Math-Verify's sets. A comma followed by a space always separates items (`32, 349` is two numbers); a
//!   comma directly followed by exactly three digits in a lone number is a thousands separator
//!   (`14,916`). *Asymmetry kept from the old verifier*: a tuple `(1,2)` never equals the bare list `1,2`;
//!   it does equal a list whose every item is labelled, read in the written order (`x=3, y=-1` =
//!   `(3,-1)`), since the labels say the values are coordinates.
//! - **`(a, b)`**: written the same way as an open interval and an ordered pair. rlvr does not guess
//!   which: `(a, b)` against `(a', b')` compares element by element in order with the same brackets, which
//!   is right for both readings. It matches a relation (`a < x < b`) only when `a < b` (so it can be an
//!   interval); a relation then carries exactly the two endpoints of the gold, so nothing is gained by
//!   writing one for a point.
//! - **Intervals and relations**: relations are compared with their direction normalised (`x \ge 5` =
//!   `5 \le x`; `\ne` either way round); a relation in one variable is compared with an interval gold as
//!   the set it describes (`-2 \le x \le 7` = `x \in [-2,7]`, `0 < f(x) < 1` = `(0,1)`, `x \ne 5` =
//!   `(-\infty,5)\cup(5,\infty)`, `x<2 \text{ or } x>3` = `(-\infty,2)\cup(3,\infty)`). *Asymmetry*: the
//!   variable side must be a label and the other sides constants (`0 < x+1 < 1` or `0 < x < y` match no
//!   interval); a gold that names its variable (`x \in ..`, `0<x<1`) accepts only that variable, while a
//!   bare interval gold accepts any single label. Two unions written as intervals still compare part by
//!   part in order, as before.
//! - **Inequalities**: two one-sided relations also match when their rhs − lhs (after direction
//!   normalising) are proportional by a positive constant at the sample points (`x < 1` = `-x > -1`
//!   = `2x < 2`; `x < 1` ≠ `-x < -1`).
//! - **Labels** (`x =`, `f(x) =`, `(p,q) =`, `AB =`, `\angle A =`, `x \in`, and quantities named by
//!   names only: `A:B =`, `|AB| =`, `\frac{NO}{BO} =`) are dropped on either side and
//!   per list item (`AB=4, CD=5` = `4, 5`), like Math-Verify's non-strict mode. A label is a name of at
//!   most six letters or a Greek letter, with an optional subscript, primes and argument list, or a tuple
//!   of names. *Asymmetry*: a gold equation whose left side is not a label (`7 = 11a+c`, a plane
//!   `5x - 7y + 11z + 4 = 0`) is the answer as a whole: a bare expression that is one of its sides does not
//!   match (`11a+c` is not `7 = 11a+c`).
//! - **Equations**: two equations match when their `lhs - rhs` are proportional by one non-zero constant
//!   at the sample points (`2x+4y-3=0` = `y=-\frac12x+\frac34`); labelled equations compare right sides
//!   when the labels agree, a right side is constant (`x = 5` = `y = 5`, as a label is dropped) or a label
//!   is a function's name (`y = 2x+3` = `f(x) = 2x+3`); otherwise the labels matter (`x = 2y+3` is another
//!   line than `y = 2x+3`). Math-Verify compares equations
//!   symbolically; proportionality is stricter (`x^2 = 4` is not `x = 2`, rightly).
//! - **Solution chains**: in the answer and in the gold, `a = b = c` reads as its last side (a label in front kept), and
//!   an unlabelled `a = c` with constant sides reads as `c` (`3 \times 4 = 12` → 12). Earlier sides are
//!   working and are not checked; the chain states its last side as the result. *Asymmetry*: an equation
//!   with a variable (`11a + c = 7`, `5x - 7y + 4 = 0`) is not a chain and never matches a number gold.
//! - **Matrices**: every matrix environment compares cell by cell; a sum, difference or product of
//!   matrices (`A + B`, `A B`, `A \cdot B`) is evaluated to its cells first (at most
//!   256 cells a matrix). Vectors are not equated with tuples.
//! - **Text** answers (`\text{Evelyn}`, `(C)`) compare as written after normalisation (case-sensitive).
//! - **Percent**: `\%` is dropped like a unit (MATH writes `15\%` for the answer 15), so `15\%` is not
//!   `0.15`.
//!
//! Bounded work: normalisation is linear and skips structure below bracket depth
//! [`crate::latex::MAX_NORMALIZE_DEPTH`]; expressions stop at depth 64 and 2,000 nodes; comparison
//! recursion stops at depth 16; unordered matching is used for lists of at most 64 items; one comparison
//! takes at most 50,000 steps and scans at most 1 MB summed over its steps (past either it judges the
//! answers unequal: nested lists of lists cannot multiply the matching); at most [`MAX_BOXES`] boxes
//! are read.

use crate::answer::{compare, compare_with, describe, Judgement};
use crate::extract::{all_boxed, last_boxed};
use crate::latex::normalize_keep_label;
use crate::{Sample, Score, Verifier};

/// Most boxes of a completion read together against a multi-answer gold (the last ones).
pub const MAX_BOXES: usize = 64;

/// True when two LaTeX answers are equivalent: `gold` first (a few rules are asymmetric, see the module
/// docs), both normalised, then compared.
///
/// ```
/// use rlvr_reward::math::equivalent;
/// assert!(equivalent(r"\dfrac{1}{2}", "0.5"));
/// assert!(equivalent(r"\left( 3, \frac{\pi}{2} \right)", r"(3,\pi/2)"));
/// assert!(!equivalent("(3,4]", "(3,4)"));
/// assert!(equivalent(r"x \in [-2,7]", r"-2 \le x \le 7"));
/// assert!(!equivalent("7 = 11a+c", "11a+c"));
/// ```
pub fn equivalent(gold: &str, answer: &str) -> bool {
    judge(gold, answer).equal
}

/// [`equivalent`] with the reasons of the verdict.
pub fn judge(gold: &str, answer: &str) -> Judgement {
    compare(&normalize_keep_label(gold), &normalize_keep_label(answer))
}

/// The gold answer of a MATH reference: its last `\boxed{}`, else the whole reference.
pub fn gold_answer(reference: &str) -> &str {
    last_boxed(reference).unwrap_or(reference).trim()
}

/// The last [`MAX_BOXES`] boxes, normalised, repeats dropped, joined by commas into one list.
fn joined_boxes(boxes: &[&str]) -> String {
    let mut kept: Vec<String> = Vec::new();
    for b in &boxes[boxes.len().saturating_sub(MAX_BOXES)..] {
        let n = normalize_keep_label(b);
        if !n.is_empty() && !kept.contains(&n) {
            kept.push(n);
        }
    }
    kept.join(",")
}

/// Most words of prose between two boxes of a reference that still read as one list of answers
/// (`\boxed{1} and \boxed{-2}`, `\boxed{1} papers and \boxed{2} bins`); boxes further apart are
/// separate results, of which the last is the answer.
pub const MAX_WORDS_BETWEEN_BOXES: usize = 3;

/// A reference's boxes as one normalised list, when it has at least two different ones and at
/// most [`MAX_WORDS_BETWEEN_BOXES`] words between each two.
fn gold_boxes(reference: &str) -> Option<String> {
    let boxes = all_boxed(reference);
    if boxes.len() < 2 {
        return None;
    }
    let base = reference.as_ptr() as usize;
    for w in boxes.windows(2) {
        let end = w[0].as_ptr() as usize - base + w[0].len();
        let start = w[1].as_ptr() as usize - base;
        let gap = reference.get(end..start).unwrap_or("");
        let words = gap
            .split(|c: char| !c.is_ascii_alphabetic())
            .filter(|t| t.len() >= 2 && !matches!(*t, "boxed" | "fbox"))
            .count();
        if words > MAX_WORDS_BETWEEN_BOXES {
            return None;
        }
    }
    let joined = joined_boxes(&boxes);
    (crate::answer::answer_count(&joined) > 1 && joined.contains(',')).then_some(joined)
}

/// True when a normalised gold holds several answers (a list, a set or a `\pm` pair).
fn is_multi(gold_norm: &str) -> bool {
    crate::answer::answer_count(gold_norm) > 1
}

/// Scores MATH completions: reward 1 when the last boxed answer (or, for a multi-answer gold, the set of
/// all boxes) is [`equivalent`] to the gold.
#[derive(Debug, Clone, Copy, Default)]
pub struct MathVerifier;

impl MathVerifier {
    /// Scores `sample` and explains the verdict: how both sides were read and normalised, what form each
    /// has, and the steps that decided (the text `rlvr reward --task math --explain` prints).
    pub fn explain(&self, sample: &Sample<'_>) -> (Score, String) {
        let mut text = String::new();
        let s = self.run(sample, Some(&mut text));
        (s, text)
    }

    /// Scores `sample`, writing the explanation to `log` when given.
    fn run(&self, sample: &Sample<'_>, mut log: Option<&mut String>) -> Score {
        let explain = log.is_some();
        let mut say = |f: &dyn Fn() -> String| {
            if let Some(l) = log.as_deref_mut() {
                l.push_str(&f());
            }
        };
        let gold = gold_answer(sample.reference);
        let gn = normalize_keep_label(gold);
        say(&|| {
            format!(
                "gold:      {gold:?}\n  normalised {gn:?}: {}\n",
                describe(&gn)
            )
        });
        let Some(last) = last_boxed(sample.completion).map(str::trim) else {
            say(&|| {
                "extracted: none (no complete \\boxed{} in the completion)\nverdict:   not equal\n"
                    .into()
            });
            return Score::binary(false, None, Some(gold.to_string()));
        };
        let ln = normalize_keep_label(last);
        let multi = is_multi(&gn);
        let boxes = if multi || gold_boxes(sample.reference).is_some() {
            all_boxed(sample.completion)
        } else {
            Vec::new()
        };
        say(&|| {
            format!(
                "extracted: {last:?} (the last box)\n  normalised {ln:?}: {}\n",
                describe(&ln)
            )
        });
        let mut j = compare_with(&gn, &ln, explain);
        let mut extracted = last.to_string();
        // A reference with several different boxes (`\boxed{1}` and `\boxed{-2}`) may be one answer
        // per box: the completion matches the boxes read as one list, as well as the last box.
        if !j.equal {
            if let Some(all) = gold_boxes(sample.reference) {
                let an = if boxes.len() > 1 {
                    joined_boxes(&boxes)
                } else {
                    ln.clone()
                };
                let r = compare_with(&all, &an, explain);
                say(&|| format!("  the reference has several boxes, read as one list {all:?}\n"));
                if r.equal {
                    j = r;
                    if boxes.len() > 1 {
                        extracted = boxes
                            .iter()
                            .map(|b| b.trim())
                            .collect::<Vec<_>>()
                            .join(", ");
                    }
                }
            }
        }
        if !j.equal && multi && boxes.len() > 1 {
            let joined = joined_boxes(&boxes);
            let all = compare_with(&gn, &joined, explain);
            say(&|| {
                format!(
                    "  the gold has several answers: all {} boxes read as one list {joined:?}: {}\n",
                    boxes.len(),
                    describe(&joined)
                )
            });
            if all.equal {
                extracted = boxes
                    .iter()
                    .map(|b| b.trim())
                    .collect::<Vec<_>>()
                    .join(", ");
            }
            j.reasons.push("-- against all boxes:".into());
            j.reasons.extend(all.reasons);
            j.equal = all.equal;
        }
        say(&|| {
            let mut t = format!(
                "verdict:   {}\n",
                if j.equal { "equal" } else { "not equal" }
            );
            for r in &j.reasons {
                t.push_str(&format!("  {r}\n"));
            }
            t
        });
        Score::binary(j.equal, Some(extracted), Some(gold.to_string()))
    }
}

impl Verifier for MathVerifier {
    fn score(&self, sample: &Sample<'_>) -> Result<Score, crate::RewardError> {
        Ok(self.run(sample, None))
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

    fn scores(reference: &str, completion: &str) -> bool {
        MathVerifier
            .score(&Sample::new(completion, reference))
            .unwrap()
            .correct
    }

    /// The forms accepted for issue 47 (Math-Verify's test cases), each with its refusals.
    #[test]
    fn a_reference_with_several_close_boxes_is_a_list() {
        // Boxes a few words apart are one answer each (Math-Verify's gold extraction).
        assert!(scores(
            r"\(\boxed{1}\) and \(\boxed{-2}\).",
            r"$\boxed{-2,1}$"
        ));
        assert!(scores(r"$\boxed{1}\boxed{2}$", r"$\boxed{1,2}$"));
        assert!(scores(
            r"\boxed{1} papers and \boxed{2} bins",
            r"\boxed{2} and \boxed{1}"
        ));
        assert!(!scores(r"\boxed{1} and \boxed{2}", r"\boxed{1,2,3}"));
        // Far apart, they are working and a result: the last box is the answer.
        assert!(!scores(
            r"\boxed{1} no no no no no \boxed{2}",
            r"$\boxed{1,2}$"
        ));
        assert!(scores(
            r"\boxed{1} no no no no no \boxed{2}",
            r"$\boxed{2}$"
        ));
        // A MATH solution boxing an intermediate value keeps its last box as the answer.
        let sol = r"so $x = \boxed{7}$. Then the total is $3x + 1 = \boxed{22}$.";
        assert!(scores(sol, r"\boxed{22}"));
        assert!(!scores(sol, r"\boxed{7}"));
    }

    #[test]
    fn inequalities_scaled_by_a_negative_number_flip() {
        assert!(equivalent("x < 1", "-x > -1"));
        assert!(equivalent("x <= 1", "-x >= -1"));
        assert!(equivalent("x < 1", "2x < 2"));
        assert!(equivalent(r"x \ne 1", r"1 - x \ne 0"));
        assert!(!equivalent("x < 1", "-x < -1"));
        assert!(!equivalent("x < 1", "-x >= -1"));
        assert!(!equivalent("x < 1", "x < 2"));
    }

    #[test]
    fn matrix_sums_and_products_are_evaluated() {
        let m = |s: &str| format!("\\begin{{pmatrix}}{s}\\end{{pmatrix}}");
        let (a, b) = (m(r"1 & 2 \\ 3 & 4"), m(r"5 & 6 \\ 7 & 8"));
        assert!(equivalent(&m(r"6 & 8 \\ 10 & 12"), &format!("{a} + {b}")));
        assert!(equivalent(&m(r"-4 & -4 \\ -4 & -4"), &format!("{a} - {b}")));
        assert!(equivalent(&m(r"19 & 22 \\ 43 & 50"), &format!("{a} {b}")));
        assert!(equivalent(
            &m(r"19 & 22 \\ 43 & 50"),
            &format!(r"{a} \cdot {b}")
        ));
        assert!(!equivalent(&m(r"19 & 22 \\ 43 & 50"), &format!("{b} {a}")));
        assert!(!equivalent(&m(r"6 & 8 \\ 10 & 13"), &format!("{a} + {b}")));
        // Shapes that do not conform are no matrix.
        assert!(!equivalent(&m("6 & 8"), &format!("{a} + {}", m("5 & 6"))));
    }

    #[test]
    fn gold_chains_read_their_last_side() {
        assert!(equivalent("z = 1 + 1 = 2", "z = 3+3 = 2"));
        assert!(equivalent(r"1 = \zzz = x = 0", "0"));
        assert!(!equivalent("z = 1 + 1 = 2", "z = 3"));
        assert!(!equivalent("z = 1 + 1 = 2", "w = 1 + 1 = 3"));
    }

    #[test]
    fn machine_printed_decimals_are_their_value() {
        assert!(equivalent(r"\frac{1}{12}", "0.0833333333333333"));
        assert!(equivalent("0.0833333333333333", r"\frac{1}{12}"));
        assert!(equivalent(r"\frac{2}{3}", "0.666666666666667"));
        // A person's rounding, or a printout off in its last digit, is not.
        assert!(!equivalent(r"\frac{1}{12}", "0.0833"));
        assert!(!equivalent(r"\frac{1}{12}", "0.0833333333334"));
        assert!(!equivalent(r"\frac{1}{12}", "0.0833333333333433"));
    }

    #[test]
    fn escaped_commands_braces_and_semicolons() {
        // `\\boxed`, `\\le`: a command written with a doubled backslash.
        assert!(equivalent(r"-2 \\le x \\le 7", r"x \in [-2,7]"));
        assert!(!equivalent(r"-2 \\le x \\le 7", r"x \in [-2,8]"));
        // Three backslashes are a row break before a command, as before.
        assert!(equivalent(
            r"\begin{pmatrix}1&0\\\end{pmatrix}",
            r"\begin{pmatrix}1&0\end{pmatrix}"
        ));
        // One brace group around the whole answer only groups: `{1,2,3}` is the list 1, 2, 3.
        assert!(equivalent("{1,2,3}", "3,2,1"));
        assert!(!equivalent("{1,2,3}", "1,2"));
        assert!(!equivalent("(1,3)", "{1,3}"));
        // `;` separates answers, also inside a tuple.
        assert!(equivalent("-12;-11;-10", r"\{-10, -11, -12\}"));
        assert!(equivalent("(0;-2;6),(4;0;0)", "(4, 0, 0), (0, -2, 6)"));
        assert!(!equivalent("(0;-2;6)", "(0, 6, -2)"));
    }

    #[test]
    fn quantities_named_by_names_are_labels() {
        assert!(equivalent("|AB|=1", "1"));
        assert!(equivalent("A:B=1", "1"));
        assert!(equivalent(r"S_{MBCN}:S=7:32", "7:32"));
        assert!(equivalent(
            r"\frac{NO}{BO}=\frac{1}{\sqrt{6}}",
            r"\frac{1}{\sqrt{6}}"
        ));
        assert!(!equivalent("|AB|=1", "2"));
        // Not a label: a number or an expression with a value on the left.
        assert!(!equivalent("7 = 11a+c", "11a+c"));
        assert!(!equivalent("|x-1|=2", "2"));
    }
}
