//! The answer forms of MATH-500 golds and of model completions that the MATH verifier must judge,
//! each case with the reason it is right or wrong. Cases are written from MATH-500's gold formats (data/math500) and from the
//! semantics Math-Verify's README documents; none is taken from Math-Verify's test suite.
//!
//! A case is `(gold, completion, expected, why)`; a completion without `\boxed` is boxed whole.

use rlvr_reward::math::MathVerifier;
use rlvr_reward::Sample;

type Case = (&'static str, &'static str, bool, &'static str);

fn run(class: &str, cases: &[Case]) {
    let mut bad = Vec::new();
    for &(gold, completion, expected, why) in cases {
        let boxed;
        let c = if completion.contains("\\boxed") {
            completion
        } else {
            boxed = format!("so the answer is $\\boxed{{{completion}}}$.");
            &boxed
        };
        let (s, text) = MathVerifier.explain(&Sample::new(c, gold));
        if s.correct != expected {
            bad.push(format!(
                "[{class}] gold {gold:?} vs {completion:?}: expected {expected} ({why})\n{text}"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} cases wrong:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

/// MATH-500 gold class: integers (e.g. `10`, `-2`, `0`).
const INTEGERS: &[Case] = &[
    ("10", "10", true, "same integer"),
    ("10", "10.0", true, "10.0 is exactly 10"),
    (
        "10",
        "+10",
        true,
        "a leading plus does not change the value",
    ),
    ("-2", "-2", true, "same negative integer"),
    ("-2", "2", false, "sign differs"),
    ("0", "0", true, "zero"),
    (
        "0",
        "5x - 7y + 11z + 4 = 0",
        false,
        "an equation with variables is not a chain ending in its value",
    ),
    (
        "12",
        "3 \\times 4 = 12",
        true,
        "a solution chain of constants reads its last side",
    ),
    (
        "12",
        "3 \\times 4 = 13",
        false,
        "the chain's stated result is wrong",
    ),
    (
        "7",
        "11a+c = 7",
        false,
        "an equation in variables is not the number 7",
    ),
    ("5", "x = 5", true, "label x dropped"),
    ("5", "5x", false, "5x is an expression, not 5"),
    (
        "1000",
        "1,000",
        true,
        "comma directly followed by three digits is a thousands separator",
    ),
];

#[test]
fn integers() {
    run("integer", INTEGERS);
}

/// MATH-500 gold class: fractions (`\frac{3}{56}`, `\dfrac{17}{50}`, `\frac 34`, `\frac9{19}`, negative).
const FRACTIONS: &[Case] = &[
    ("\\frac{3}{56}", "\\dfrac{3}{56}", true, "\\dfrac is \\frac"),
    ("\\dfrac{17}{50}", "0.34", true, "0.34 is exactly 17/50"),
    ("\\frac 34", "\\tfrac{3}{4}", true, "shorthand and \\tfrac"),
    ("\\frac9{19}", "9/19", true, "slash fraction"),
    (
        "\\frac{1}{3}",
        "\\cfrac{1}{3}",
        true,
        "\\cfrac is a continued-fraction style \\frac",
    ),
    (
        "\\frac{1}{3}",
        "\\cfrac{2}{1+\\cfrac{5}{1}}",
        true,
        "a nested \\cfrac evaluates to 2/6",
    ),
    (
        "-\\frac{24}{25}",
        "\\frac{-24}{25}",
        true,
        "sign inside the numerator",
    ),
    ("-\\frac{24}{25}", "\\frac{24}{25}", false, "sign lost"),
    (
        "\\frac{1}{3}",
        "0.333",
        false,
        "a finite decimal is not 1/3 (no \\approx)",
    ),
    (
        "\\frac{1}{3}",
        "0.33333333",
        false,
        "still a different rational",
    ),
    (
        "\\frac{2}{3}",
        "\\frac{4}{6}",
        true,
        "unreduced fraction, same value",
    ),
];

#[test]
fn fractions() {
    run("fraction", FRACTIONS);
}

/// MATH-500 gold class: decimals (`.0000672`, `0.15`, `326.5`).
const DECIMALS: &[Case] = &[
    (".0000672", "0.0000672", true, "leading zero added"),
    (
        ".0000672",
        "6.72 \\times 10^{-5}",
        true,
        "scientific notation, same value",
    ),
    ("0.15", "\\frac{3}{20}", true, "3/20 is exactly 0.15"),
    ("326.5", "326.50", true, "trailing zero"),
    ("326.5", "326", false, "truncated"),
    (
        "15",
        "15\\%",
        true,
        "`\\%` is dropped like a unit (MATH golds write `15\\%` for 15)",
    ),
    (
        "0.15",
        "15\\%",
        false,
        "so 15% reads as 15, which is not 0.15",
    ),
];

#[test]
fn decimals() {
    run("decimal", DECIMALS);
}

/// MATH-500 gold class: radicals, π and other irrational constants (`2\sqrt{5}`, `12\pi`,
/// `\frac{\sqrt{3}}{3}`, `11\sqrt2`).
const RADICALS_AND_PI: &[Case] = &[
    ("2\\sqrt{5}", "\\sqrt{20}", true, "same value"),
    (
        "\\frac{\\sqrt{3}}{3}",
        "\\frac{1}{\\sqrt{3}}",
        true,
        "rationalised denominator, same value",
    ),
    ("11\\sqrt2", "11 \\sqrt{2}", true, "shorthand argument"),
    ("12\\pi", "12 \\pi", true, "spacing"),
    (
        "12\\pi",
        "37.70",
        false,
        "a bare decimal without \\approx is not 12π",
    ),
    (
        "12\\pi",
        "\\approx 37.70",
        true,
        "\\approx with two decimals: |12π − 37.70| < 0.01",
    ),
    (
        "12\\pi",
        "\\approx 37.5",
        false,
        "|12π − 37.5| ≈ 0.2 > 0.1, one unit of the last decimal",
    ),
    ("\\sqrt{53}", "\\sqrt{35}", false, "different radicand"),
    ("18+2\\pi", "2(\\pi+9)", true, "factored, same value"),
    ("\\frac{20000}{\\pi}", "20000/\\pi", true, "slash form"),
];

#[test]
fn radicals_and_pi() {
    run("radical/pi", RADICALS_AND_PI);
}

/// MATH-500 gold class: mixed numbers (`1\frac{4}{5}`, `137 \frac{1}{2}`).
const MIXED_NUMBERS: &[Case] = &[
    ("1\\frac{4}{5}", "\\frac{9}{5}", true, "1 4/5 is 9/5"),
    ("137 \\frac{1}{2}", "137.5", true, "137 1/2 is 137.5"),
    (
        "137 \\frac{1}{2}",
        "\\frac{137}{2}",
        false,
        "137/2 is 68.5, not 137 1/2",
    ),
];

#[test]
fn mixed_numbers() {
    run("mixed number", MIXED_NUMBERS);
}

/// MATH-500 gold class: numbers with thousands separators (`10,\!080`, `58,500`, `\$32,\!348`,
/// `11,\! 111,\! 111,\! 100`), and the `{,}` / thin-space separators models write.
const THOUSANDS_SEPARATORS: &[Case] = &[
    (
        "10,\\!080",
        "10080",
        true,
        "`,\\!` is a thousands separator",
    ),
    ("58,500", "58500", true, "comma then three digits"),
    (
        "11,\\! 111,\\! 111,\\! 100",
        "11111111100",
        true,
        "`,\\!` groups with spaces after them",
    ),
    (
        "14916",
        "14{,}916",
        true,
        "`{,}` is MATH's own thousands separator",
    ),
    ("14916", "14\\,916", true, "thin space between groups"),
    ("14916", "14\u{2009}916", true, "unicode thin space"),
    (
        "32349",
        "32, 349",
        false,
        "a comma followed by a space separates two numbers",
    ),
    (
        "32, 349",
        "32,349",
        false,
        "and a comma directly followed by three digits is one number",
    ),
    ("\\$32,\\!348", "32348", true, "currency and separator"),
    (
        "1000.99",
        "1,000.99€",
        true,
        "grouped decimal with a euro sign",
    ),
];

#[test]
fn thousands_separators() {
    run("thousands", THOUSANDS_SEPARATORS);
}

/// MATH-500 gold class: degrees (`90^\circ`, `106^\circ`).
const DEGREES: &[Case] = &[
    ("90^\\circ", "90", true, "degree sign dropped"),
    ("90^\\circ", "90°", true, "unicode degree sign"),
    ("90^\\circ", "90^{\\circ}", true, "braced"),
    (
        "90^\\circ",
        "90 \\text{ degrees}",
        true,
        "unit word in \\text",
    ),
    ("90^\\circ", "90 degrees", true, "bare unit word"),
    ("106^\\circ", "116^\\circ", false, "different angle"),
];

#[test]
fn degrees() {
    run("degree", DEGREES);
}

/// MATH-500 gold class: money (`\$18.90`, `\$36`) and other currency signs.
const CURRENCY: &[Case] = &[
    ("\\$18.90", "18.9", true, "dollar sign and trailing zero"),
    ("\\$18.90", "\\$18.90", true, "same"),
    ("\\$36", "36 dollars", true, "unit word"),
    ("\\$36", "€36", true, "euro sign dropped"),
    ("\\$36", "£36", true, "pound sign dropped"),
    ("\\$18.90", "\\$19.90", false, "different amount"),
];

#[test]
fn currency() {
    run("currency", CURRENCY);
}

/// MATH-500 gold class: units in `\text`/`\mbox` (`5.4 \text{ cents}`, `15\mbox{ cm}^2`,
/// `\frac{270}7\text{ degrees}`), and the unit forms models write.
const UNITS: &[Case] = &[
    (
        "5.4 \\text{ cents}",
        "5.4",
        true,
        "unit dropped on the gold",
    ),
    (
        "15\\mbox{ cm}^2",
        "15 \\text{cm}^2",
        true,
        "unit and its exponent dropped on both sides",
    ),
    (
        "\\frac{270}7\\text{ degrees}",
        "\\frac{270}{7}",
        true,
        "unit dropped",
    ),
    (
        "\\frac{1}{3}",
        "\\frac{1}{3} \\text{meters}",
        true,
        "\\text unit without a leading space",
    ),
    ("125", "125\\textnormal{ miles}", true, "\\textnormal unit"),
    ("125", "125 \\mbox{miles}", true, "\\mbox unit"),
    ("125", "125 miles", true, "bare unit word"),
    ("12", "12 m²", true, "unicode square after a unit letter"),
    (
        "12",
        "12 \\mathrm{~km/h}",
        true,
        "\\mathrm unit with a tilde",
    ),
    ("12", "13 \\text{ cm}", false, "wrong number with a unit"),
    (
        "\\text{Evelyn}",
        "\\text{Evelyn}",
        true,
        "text answer, not a unit (nothing before it)",
    ),
];

#[test]
fn units() {
    run("units", UNITS);
}

/// MATH-500 gold class: complex numbers (`-2 + 7i`, `1 - 12i`, `6+9i`).
const COMPLEX_NUMBERS: &[Case] = &[
    ("-2 + 7i", "7i - 2", true, "terms reordered"),
    ("1 - 12i", "1-12i", true, "spacing"),
    ("6+9i", "6-9i", false, "conjugate"),
    ("1+2i", "(1+2i)", true, "outer parentheses"),
];

#[test]
fn complex_numbers() {
    run("complex", COMPLEX_NUMBERS);
}

/// MATH-500 gold class: expressions in variables (`x^3+3x-6`, `2k+2`, `3R^2`, `(a+5)(b+2)`, `p - q`,
/// `\cot x`, `\frac{11+9a}{20}`), symbolic equivalence by seeded sampling.
const EXPRESSIONS: &[Case] = &[
    ("x^3+3x-6", "3x + x^3 - 6", true, "terms reordered"),
    ("2k+2", "2(k+1)", true, "factored"),
    ("2k+2", "2k+1", false, "different polynomial"),
    ("3R^2", "3 R^{2}", true, "braced exponent"),
    ("(a+5)(b+2)", "ab + 2a + 5b + 10", true, "expanded product"),
    ("(a+5)(b+2)", "(a+2)(b+5)", false, "different product"),
    ("p - q", "-(q - p)", true, "negated difference"),
    ("\\cot x", "\\frac{\\cos x}{\\sin x}", true, "trig identity"),
    ("\\cot x", "\\tan x", false, "different function"),
    ("\\tan^2 y + 1", "\\sec^2 y", true, "Pythagorean identity"),
    (
        "\\frac{11+9a}{20}",
        "\\frac{11}{20} + \\frac{9a}{20}",
        true,
        "split fraction",
    ),
    (
        "x^5 - x^4 + x^3 - x^2 + x - 1",
        "(x-1)(x^4+x^2+1)",
        true,
        "factored form",
    ),
    ("8n^2 + 4n + 1", "8n^2 + 4n", false, "constant term missing"),
    ("\\sin^{-1} x", "\\arcsin x", true, "inverse sine notation"),
    ("\\ln 8", "3\\ln 2", true, "log rule"),
];

#[test]
fn expressions() {
    run("expression", EXPRESSIONS);
}

/// MATH-500 gold class: ordered tuples (`(-1,6)`, `(1,-16,-4,43)`, `\left( 3, \frac{\pi}{2} \right)`).
const TUPLES: &[Case] = &[
    ("(-1,6)", "(-1, 6)", true, "spacing"),
    ("(-1,6)", "(6,-1)", false, "a tuple is ordered"),
    (
        "(1,-16,-4,43)",
        "\\left(1,-16,-4,43\\right)",
        true,
        "\\left/\\right",
    ),
    ("(1,-16,-4,43)", "(1,-16,-4)", false, "an element missing"),
    (
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "(3, \\pi/2)",
        true,
        "elementwise equivalence",
    ),
    (
        "(-1,6)",
        "-1, 6",
        false,
        "a bare list is not an ordered pair (kept from the old verifier)",
    ),
    ("(-1,6)", "[-1,6]", false, "brackets differ"),
    ("(p,q)=(3,2)", "(3,2)", true, "tuple label (p,q) dropped"),
    (
        "(3,2)",
        "(p,q)=(3,2)",
        true,
        "label dropped on the answer side too",
    ),
    (
        "(2,4)",
        "2 < x < 4",
        true,
        "(a,b) may be an interval: a relation carrying both endpoints matches",
    ),
    (
        "(8,-2)",
        "8 < x < -2",
        false,
        "with 8 > -2 the gold can only be a point, not an interval",
    ),
];

#[test]
fn tuples() {
    run("tuple", TUPLES);
}

/// MATH-500 gold class: intervals (`(3,4]`, `(-\infty, 0]`, `(2,\infty)`,
/// `\left[ \frac{\pi^2}{8}, \frac{5 \pi^2}{4} \right]`, `\left(\frac{3}{5},\frac{8}{3}\right]`).
const INTERVALS: &[Case] = &[
    ("(3,4]", "(3, 4]", true, "spacing"),
    ("(3,4]", "[3,4]", false, "left endpoint closedness differs"),
    ("(-\\infty, 0]", "(-\\infty,0]", true, "infinite endpoint"),
    (
        "(-\\infty, 0]",
        "x \\le 0",
        true,
        "relation form of the interval",
    ),
    (
        "(-\\infty, 0]",
        "0 \\geq x",
        true,
        "flipped relation, direction normalised",
    ),
    (
        "(-\\infty, 0]",
        "x < 0",
        false,
        "open where the gold is closed",
    ),
    ("(2,\\infty)", "x > 2", true, "relation form"),
    (
        "(2,\\infty)",
        "x+1 > 3",
        false,
        "the variable side must be a label, not an expression",
    ),
    (
        "(2,\\infty)",
        "y > x",
        false,
        "two variables describe no interval",
    ),
    (
        "(0,1)",
        "0<f(x)<1",
        true,
        "a bare interval gold accepts any single label, e.g. f(x)",
    ),
    (
        "\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]",
        "[\\pi^2/8, 5\\pi^2/4]",
        true,
        "elementwise",
    ),
    (
        "\\left(\\frac{3}{5},\\frac{8}{3}\\right]",
        "\\frac35 < x \\le \\frac83",
        true,
        "relation chain",
    ),
    (
        "\\left(\\frac{3}{5},\\frac{8}{3}\\right]",
        "\\frac35 < x < \\frac83",
        false,
        "right end open",
    ),
    (
        "x \\in [-2,7]",
        "-2 \\le x \\le 7",
        true,
        "membership gold against the relation",
    ),
    (
        "x \\in [-2,7]",
        "-2 \\le y \\le 7",
        false,
        "the gold names x; y is another variable",
    ),
    ("x \\in [-2,7]", "[-2,7]", true, "membership label dropped"),
    (
        "[-2,7]",
        "x \\in [-2, 7]",
        true,
        "label dropped on the answer side",
    ),
];

#[test]
fn intervals() {
    run("interval", INTERVALS);
}

/// MATH-500 gold class: unions of intervals (`(-\infty, 2) \cup (3, \infty)`, `(0,9) \cup (9,36)`).
const UNIONS: &[Case] = &[
    (
        "(-\\infty, 2) \\cup (3, \\infty)",
        "(-\\infty,2)\\cup(3,\\infty)",
        true,
        "spacing",
    ),
    (
        "(-\\infty, 2) \\cup (3, \\infty)",
        "x < 2 \\text{ or } x > 3",
        true,
        "relations joined by or",
    ),
    (
        "(-\\infty, 2) \\cup (3, \\infty)",
        "x < 2 \\lor x > 3",
        true,
        "\\lor",
    ),
    (
        "(-\\infty, 2) \\cup (3, \\infty)",
        "x < 2 \\text{ or } y > 3",
        false,
        "two different variables",
    ),
    (
        "(-\\infty, 2) \\cup (3, \\infty)",
        "x < 2",
        false,
        "half of the union",
    ),
    (
        "(0,9) \\cup (9,36)",
        "(0,36)",
        false,
        "9 is excluded from the gold",
    ),
    (
        "(-\\infty, 5) \\cup (5, \\infty)",
        "x \\neq 5",
        true,
        "negated equality is the union around 5",
    ),
    (
        "(-\\infty, 5) \\cup (5, \\infty)",
        "x \\ne 4",
        false,
        "wrong excluded point",
    ),
];

#[test]
fn unions() {
    run("union", UNIONS);
}

/// MATH-500 gold class: bare lists of solutions (`1,-2`, `3, 5, 7`, `-2,1`), order-insensitive.
const LISTS: &[Case] = &[
    ("1,-2", "-2, 1", true, "a list of solutions is unordered"),
    ("3, 5, 7", "7,5,3", true, "unordered"),
    ("3, 5, 7", "3, 5", false, "an item missing"),
    ("3, 5, 7", "3, 5, 7, 9", false, "an extra item"),
    ("3, 5, 7", "\\{3,5,7\\}", true, "set of the same items"),
    ("6 \\text{ and } 8", "6,8", true, "\"and\" separates items"),
    ("6 and 8", "8, 6", true, "bare \"and\""),
    ("AB=4, CD=5", "4, 5", true, "labels dropped per item"),
    (
        "4, 5",
        "AB=4, CD=5",
        true,
        "labels dropped on the answer side too",
    ),
    ("1,-2", "x = 1, x = -2", true, "each item labelled"),
    (
        "1,-2",
        "x = 1 \\text{ or } x = -2",
        true,
        "items joined by or",
    ),
    ("1,-2", "1", false, "a single answer for a two-answer gold"),
];

#[test]
fn lists() {
    run("list", LISTS);
}

/// MATH-500 gold class: sets (`\{1\pm\sqrt{5},-2\}`) and unions of finite sets.
const SETS: &[Case] = &[
    (
        "\\{1\\pm\\sqrt{5},-2\\}",
        "\\{-2, 1\\pm\\sqrt{5}\\}",
        true,
        "reordered",
    ),
    (
        "\\{1\\pm\\sqrt{5},-2\\}",
        "-2, 1+\\sqrt5, 1-\\sqrt5",
        true,
        "\\pm expanded into two items",
    ),
    (
        "\\{1\\pm\\sqrt{5},-2\\}",
        "-2, 1+\\sqrt5",
        false,
        "one root of the pair missing",
    ),
    (
        "\\{1,2,3,4\\}",
        "\\{1,3\\} \\cup \\{2,4\\}",
        true,
        "union of finite sets",
    ),
    ("\\{-2021, 2021\\}", "\\pm 2021", true, "\\pm pair"),
    ("\\{5\\}", "5", true, "a one-element set and its element"),
];

#[test]
fn sets() {
    run("set", SETS);
}

/// MATH-500 gold class: `\pm` answers (`1 \pm \sqrt{19}`, `3 \pm 2 \sqrt{2}`).
const PLUS_MINUS: &[Case] = &[
    ("1 \\pm \\sqrt{19}", "1\\pm\\sqrt{19}", true, "spacing"),
    (
        "1 \\pm \\sqrt{19}",
        "1+\\sqrt{19}, 1-\\sqrt{19}",
        true,
        "both values listed",
    ),
    (
        "3 \\pm 2 \\sqrt{2}",
        "3 \\mp 2\\sqrt{2}",
        true,
        "\\mp gives the same pair",
    ),
    (
        "3 \\pm 2 \\sqrt{2}",
        "3 + 2\\sqrt{2}",
        false,
        "only one of the two",
    ),
    (
        "1 \\pm \\sqrt{19}",
        "\\boxed{1+\\sqrt{19}} and \\boxed{1-\\sqrt{19}}",
        true,
        "one box per value",
    ),
];

#[test]
fn plus_minus() {
    run("pm", PLUS_MINUS);
}

/// MATH-500 gold class: equations (`y = 2x + 3`, `y = -2x`, `5x - 7y + 11z + 4 = 0`, `x=5`).
const EQUATIONS: &[Case] = &[
    ("y = 2x + 3", "y=3+2x", true, "same right side"),
    ("y = 2x + 3", "2x + 3", true, "label y dropped"),
    (
        "y = 2x + 3",
        "2x - y + 3 = 0",
        true,
        "same line, other arrangement",
    ),
    ("y = 2x + 3", "y = 3x + 2", false, "different line"),
    ("y = -2x", "2x + y = 0", true, "same line"),
    (
        "5x - 7y + 11z + 4 = 0",
        "-5x + 7y - 11z - 4 = 0",
        true,
        "both sides negated",
    ),
    (
        "5x - 7y + 11z + 4 = 0",
        "10x - 14y + 22z + 8 = 0",
        true,
        "scaled by 2",
    ),
    (
        "5x - 7y + 11z + 4 = 0",
        "5x - 7y + 11z = -4",
        true,
        "constant moved across",
    ),
    (
        "5x - 7y + 11z + 4 = 0",
        "5x - 7y + 11z + 4",
        false,
        "an expression is not the plane",
    ),
    (
        "2x+4y-3=0",
        "y=-\\frac12x+\\frac34",
        true,
        "same solution set",
    ),
    ("x^2 = 4", "x = 2", false, "not the same solution set"),
    (
        "7 = 11a+c",
        "11a+c",
        false,
        "gold number-equation is not matched by one side",
    ),
    (
        "7 = 11a+c",
        "11a + c = 7",
        true,
        "the same equation with sides swapped",
    ),
    ("x=5", "5", true, "label dropped"),
    ("x=5", "5 = x", true, "label on the right"),
    ("f(x)=1", "1", true, "function label dropped"),
    (
        "1",
        "f(x) = 1",
        true,
        "function label dropped on the answer side",
    ),
    (
        "y = 2x + 3",
        "f(x) = 2x + 3",
        true,
        "a function's name labels the same rule as y",
    ),
    (
        "y = 2x + 3",
        "x = 2y + 3",
        false,
        "the labels say which variable is which: another line",
    ),
];

#[test]
fn equations() {
    run("equation", EQUATIONS);
}

/// MATH-500 gold class: matrices and vectors (`pmatrix`).
const MATRICES: &[Case] = &[
    (
        "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
        "\\begin{bmatrix} -1 & 0 \\\\ 0 & -1 \\end{bmatrix}",
        true,
        "bmatrix and pmatrix hold the same matrix",
    ),
    (
        "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
        "\\left[ \\begin{array}{cc} -1 & 0 \\\\ 0 & -1 \\end{array} \\right]",
        true,
        "array in brackets",
    ),
    (
        "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
        "\\begin{pmatrix} -1 & 0 \\\\ 0 & 1 \\end{pmatrix}",
        false,
        "one cell differs",
    ),
    (
        "\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}",
        "\\begin{pmatrix} \\frac{1}{5} \\\\ -\\frac{18}{5} \\end{pmatrix}",
        true,
        "cells compared by value",
    ),
    (
        "\\begin{pmatrix} -18 \\\\ -49 \\\\ 96 \\end{pmatrix}",
        "\\begin{pmatrix} -18 & -49 & 96 \\end{pmatrix}",
        false,
        "a row is not a column",
    ),
];

#[test]
fn matrices() {
    run("matrix", MATRICES);
}

/// MATH-500 gold class: numbers in a base (`204_5`, `4210_{5}`).
const BASES: &[Case] = &[
    ("204_5", "204_{5}", true, "braced subscript"),
    ("4210_{5}", "4210_5", true, "unbraced subscript"),
    ("204_5", "204_6", false, "different base"),
    ("204_5", "204", false, "base dropped"),
];

#[test]
fn bases() {
    run("base", BASES);
}

/// MATH-500 gold class: text and multiple choice (`\text{Evelyn}`, `\text{east}`, `\text{(B)}`).
const TEXT_ANSWERS: &[Case] = &[
    ("\\text{Evelyn}", "Evelyn", true, "text unwrapped"),
    (
        "\\text{east}",
        "\\text{seat}",
        false,
        "different word with the same letters",
    ),
    ("\\text{(B)}", "B", true, "choice letter"),
    ("\\text{(B)}", "(B)", true, "choice in parentheses"),
    ("\\text{(B)}", "C", false, "other choice"),
    ("\\text{even}", "\\textnormal{even}", true, "\\textnormal"),
];

#[test]
fn text_answers() {
    run("text", TEXT_ANSWERS);
}

/// Completions with several boxes: a multi-answer gold reads all of them; a single-answer gold reads
/// only the last.
const SEVERAL_BOXES: &[Case] = &[
    (
        "1,-2",
        "So $\\boxed{-2}$ and $\\boxed{1}$.",
        true,
        "one box per solution",
    ),
    (
        "1,-2",
        "$\\boxed{-2}$, $\\boxed{1}$ and again $\\boxed{1}$",
        true,
        "a repeated box counts once",
    ),
    (
        "1,-2",
        "$\\boxed{-2}$ and $\\boxed{3}$",
        false,
        "second solution wrong",
    ),
    (
        "1,-2",
        "$\\boxed{-2}$, $\\boxed{1}$, $\\boxed{3}$",
        false,
        "an extra wrong box is not ignored",
    ),
    (
        "1,-2",
        "first $\\boxed{-2}$ then $\\boxed{-2, 1}$",
        true,
        "the last box alone holds both",
    ),
    (
        "5",
        "$\\boxed{3}$ ... no, $\\boxed{5}$",
        true,
        "single-answer gold: last box",
    ),
    (
        "5",
        "$\\boxed{5}$ ... no, $\\boxed{3}$",
        false,
        "single-answer gold: only the last box counts",
    ),
    (
        "\\{-2021, 2021\\}",
        "$\\boxed{2021}$ or $\\boxed{-2021}$",
        true,
        "set from boxes",
    ),
];

#[test]
fn several_boxes() {
    run("boxes", SEVERAL_BOXES);
}

/// Relations and inequalities against relations: direction normalised, `\ge` / `>=` / `≥` alike.
const RELATIONS: &[Case] = &[
    ("x \\geq 5", "x >= 5", true, "ASCII >="),
    ("x \\geq 5", "x \u{2265} 5", true, "unicode ≥"),
    ("x \\geq 5", "5 \\leq x", true, "flipped sides"),
    ("x \\geq 5", "x \\geqslant 5", true, "\\geqslant"),
    ("x \\geq 5", "x > 5", false, "strict vs non-strict"),
    ("x \\geq 5", "x \\leq 5", false, "opposite direction"),
    ("x \\geq 5", "y \\geq 5", false, "another variable"),
    (
        "x \\geq 5",
        "[5, \\infty)",
        true,
        "the interval the relation describes",
    ),
    (
        "-2 \\le x \\le 7",
        "x \\in [-2,7]",
        true,
        "relation gold against membership",
    ),
    ("a \\neq 2", "2 \\neq a", true, "≠ is symmetric"),
    ("x \\geq 5", "x \\not< 5", true, "negated <"),
    ("x > 5", "x \\not\\leq 5", true, "negated ≤"),
    ("x > 5", "x \\nleq 5", true, "\\nleq"),
    ("x > 5", "x \\not\\geq 5", false, "negated ≥ is <"),
    ("x \\geq 5", "5", false, "a number is not a relation"),
];

#[test]
fn relations() {
    run("relation", RELATIONS);
}

/// `\approx` answers, with the stated tolerance (one unit in the last written decimal, at most 1%).
const APPROXIMATIONS: &[Case] = &[
    (
        "\\frac{1}{3}",
        "\\approx 0.33",
        true,
        "two decimals, within 0.01 and 1%",
    ),
    (
        "\\frac{1}{3}",
        "\\approx 0.3",
        false,
        "off by 0.033: more than 1% of the value",
    ),
    (
        "\\frac{1}{3}",
        "\\frac{1}{3} \\approx 0.333",
        true,
        "the exact side before \\approx matches",
    ),
    (
        "\\frac{1}{3}",
        "x = \\frac{1}{3} \\approx 0.33",
        true,
        "label and exact side",
    ),
    ("\\sqrt{2}", "\\approx 1.414", true, "three decimals"),
    (
        "\\sqrt{2}",
        "\\approx 1.42",
        true,
        "|√2 − 1.42| < 0.01: one unit of the last decimal is allowed",
    ),
    ("\\sqrt{2}", "\\approx 1.43", false, "|√2 − 1.43| > 0.01"),
    (
        "0.003",
        "\\approx 0",
        false,
        "\\approx 0 never matches a non-zero gold",
    ),
    ("\\pi", "\\approx 3.14", true, "π to two decimals"),
    ("\\pi", "3.14", false, "a bare decimal is not π"),
];

#[test]
fn approximations() {
    run("approx", APPROXIMATIONS);
}

/// Solution chains: the last side is the answer.
const CHAINS: &[Case] = &[
    (
        "12",
        "3 \\cdot 4 = 12",
        true,
        "a chain of constants reads its last side",
    ),
    ("12", "x = 3 \\cdot 4 = 12", true, "label, working, result"),
    (
        "12",
        "x = 12 = 13",
        false,
        "the last side is the result, and it is wrong",
    ),
    (
        "2k+2",
        "f(k) = 2(k+1) = 2k+2",
        true,
        "chain ending in an expression",
    ),
    (
        "7",
        "11a + c = 7",
        false,
        "an equation in variables is not a chain",
    ),
];

#[test]
fn chains() {
    run("chain", CHAINS);
}

/// Attempts to collect a reward without the answer: each must score 0.
const UNHACKABLE: &[Case] = &[
    (
        "5",
        "\\boxed{1} \\boxed{2} \\boxed{3} \\boxed{4} \\boxed{5} \\boxed{6}",
        false,
        "boxing every candidate: a single gold reads the last box only",
    ),
    (
        "1,-2",
        "\\boxed{1} \\boxed{-2} \\boxed{0} \\boxed{3}",
        false,
        "boxing extra candidates: the set of boxes must equal the gold set",
    ),
    (
        "5",
        "1, 2, 3, 4, 5",
        false,
        "a list containing the gold is not the gold",
    ),
    (
        "5",
        "5, 5",
        false,
        "a two-item list is not a single answer, even with equal items",
    ),
    ("5", "x \\ge 5", false, "a relation is not a number"),
    (
        "(0,1)",
        "0 < x+1 < 1",
        false,
        "an expression in the middle describes another interval",
    ),
    (
        "(0,1)",
        "(-\\infty, \\infty)",
        false,
        "everything is not the interval",
    ),
    (
        "(0,1)",
        "\\mathbb{R}",
        false,
        "the real line is not the interval",
    ),
    ("7 = 11a+c", "11a+c", false, "one side of the gold equation"),
    (
        "7 = 11a+c",
        "7",
        false,
        "the other side of the gold equation",
    ),
    (
        "0",
        "x - x = 0",
        false,
        "an identity with a variable is not a chain",
    ),
    (
        "\\frac{1}{3}",
        "\\approx 0",
        false,
        "\\approx with no precision",
    ),
    ("32349", "32, 349", false, "two numbers are not one"),
    ("\\sqrt{2}", "\\frac{0}{0}", false, "undefined"),
    (
        "x^2+1",
        "x^2+1+0\\cdot y",
        true,
        "a variable with coefficient zero does not change the function",
    ),
    (
        "x^2+1",
        "x^2 + 1.0000001",
        false,
        "beyond the 1e-9 relative tolerance",
    ),
    (
        "2",
        "\\sqrt{4}",
        true,
        "an irrational-looking form with a rational value",
    ),
    ("y = 2x + 3", "y", false, "the label alone"),
    (
        "\\text{Evelyn}",
        "\\text{Evelyn or Navin}",
        false,
        "hedging between names",
    ),
];

#[test]
fn unhackable() {
    run("hack", UNHACKABLE);
}

/// Answers the verifier used to misjudge, one case each (forms models trained on
/// NuminaMath/OpenThoughts write).
const ISSUE_17_EXAMPLES: &[Case] = &[
    ("6 and 8", "6,8", true, "gold in words, answer as a list"),
    (
        "AB=4, CD=5",
        "4, 5",
        true,
        "labelled gold against bare values",
    ),
    (
        "-2, 1",
        "$\\boxed{-2}$ and $\\boxed{1}$",
        true,
        "several boxes",
    ),
    ("x \\geq 5", "x >= 5", true, "ASCII relation"),
    (
        "x \\geq 5",
        "5 \\geq x",
        false,
        "flipped sides reverse the meaning: 5 ≥ x is x ≤ 5",
    ),
    (
        "x \\geq 5",
        "5 \\leq x",
        true,
        "flipped sides with the flipped symbol",
    ),
    ("(p,q)=(3,2)", "(3,2)", true, "labelled tuple gold"),
    ("f(x)=1", "1", true, "labelled function value"),
    (
        "\\frac{1}{3}",
        "\\frac{1}{3} \\text{meters}",
        true,
        "unit in \\text",
    ),
    (
        "125",
        "125\\textnormal{ miles}",
        true,
        "unit in \\textnormal",
    ),
    ("1000.99", "1,000.99€", true, "euro sign and separator"),
    ("5", "5 m²", true, "unit with a superscript"),
    ("(0,1)", "0<f(x)<1", true, "relation against interval"),
    (
        "x \\in [-2,7]",
        "-2 \\le x \\le 7",
        true,
        "relation against membership",
    ),
    (
        "2x+4y-3=0",
        "y=-\\frac12x+\\frac34",
        true,
        "equivalent equations",
    ),
    ("\\frac{1}{3}", "\\approx 0.333", true, "\\approx"),
    ("14916", "14{,}916", true, "MATH's thousands separator"),
    ("\\frac{2}{3}", "\\cfrac{2}{3}", true, "\\cfrac"),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\left[ \\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array} \\right]",
        true,
        "array matrix in brackets",
    ),
    ("\\tan^2 y + 1", "\\sec^2 y", true, "trig identity"),
    ("\\{-2021, 2021\\}", "\\pm 2021", true, "\\pm against a set"),
    (
        "32349",
        "32, 349",
        false,
        "false positive: a list, not a number",
    ),
    (
        "7 = 11a+c",
        "11a+c",
        false,
        "false positive: one side of the gold equation",
    ),
];

#[test]
fn issue_17_examples() {
    run("reported misses", ISSUE_17_EXAMPLES);
}

/// Constants and combinatorics models write: Euler's `e`, `\exp`, logs, factorials, binomials.
const CONSTANTS_AND_COMBINATORICS: &[Case] = &[
    ("e^2", "\\exp(2)", true, "e is Euler's number"),
    ("e^2", "7.389", false, "a bare decimal is not e^2"),
    (
        "e^2",
        "\\approx 7.389",
        true,
        "within one unit of the third decimal",
    ),
    ("\\ln 2", "\\log_e 2", true, "log base e"),
    ("3", "\\log_2 8", true, "log base 2 of 8"),
    ("120", "5!", true, "factorial"),
    ("120", "4!", false, "24"),
    ("10", "\\binom{5}{2}", true, "5 choose 2"),
    ("10", "\\dbinom{5}{3}", true, "5 choose 3"),
    ("\\frac{1}{4}", "\\frac{\\binom{4}{2}}{24}", true, "6/24"),
];

#[test]
fn constants_and_combinatorics() {
    run("constants", CONSTANTS_AND_COMBINATORICS);
}

/// Other forms models write, against MATH-style golds.
const MODEL_FORMS: &[Case] = &[
    (
        "\\frac{\\sqrt{3}}{2}",
        "\\frac{1}{2}\\sqrt{3}",
        true,
        "coefficient written first",
    ),
    (
        "\\sqrt[3]{2}",
        "2^{1/3}",
        true,
        "root as a fractional power",
    ),
    ("1500", "1.5 \\times 10^{3}", true, "scientific notation"),
    ("\\frac{5}{2}", "2\\frac{1}{2}", true, "mixed number"),
    (
        "(-\\infty, -3] \\cup [2, \\infty)",
        "x \\le -3 \\text{ or } x \\ge 2",
        true,
        "relations joined by or",
    ),
    (
        "(-\\infty,-3]\\cup[2,\\infty)",
        "(-\\infty, -3] \\cup [2, +\\infty)",
        true,
        "+\\infty",
    ),
    (
        "a=2, b=3",
        "b = 3, a = 2",
        true,
        "labelled list, order free",
    ),
    ("5", "\\mathbf{5}", true, "bold"),
    (
        "\\dfrac{\\pi}{4}",
        "45^\\circ",
        false,
        "radians are not degrees: the degree sign is dropped, 45 ≠ π/4",
    ),
    ("4", "x=4 \\text{ cm}", true, "label and unit"),
    ("6", "6 \\text{ ways}", true, "a counting word as a unit"),
    ("\\text{B}", "\\textbf{(B)}", true, "bold choice"),
    ("0", "-0", true, "negative zero"),
    ("\\{-1, 1\\}", "x = \\pm 1", true, "labelled \\pm"),
    ("1, 2", "x_1 = 1, x_2 = 2", true, "subscripted labels"),
    (
        "(x-1)^2 + (y+2)^2 = 9",
        "x^2 - 2x + y^2 + 4y - 4 = 0",
        true,
        "circle expanded",
    ),
    (
        "(x-1)^2 + (y+2)^2 = 9",
        "x^2 - 2x + y^2 + 4y - 5 = 0",
        false,
        "another circle",
    ),
    (
        "\\frac{x+1}{x-1}",
        "1 + \\frac{2}{x-1}",
        true,
        "partial fraction",
    ),
    ("\\cos^2 x - \\sin^2 x", "\\cos 2x", true, "double angle"),
    ("|x-1|", "\\left| 1 - x \\right|", true, "absolute value"),
    ("|x-1|", "x - 1", false, "not the same function for x < 1"),
    (
        "(3, -1)",
        "x=3, y=-1",
        true,
        "labelled values against an ordered pair, in order",
    ),
    (
        "(3, -1)",
        "x=-1, y=3",
        false,
        "labelled values in the wrong order",
    ),
    ("[2,5)", "2 \\leq x < 5", true, "half-open interval"),
    ("18", "18 \\text{ square units}", true, "unit words"),
    (
        "\\frac{1}{6}",
        "16.67\\%",
        false,
        "a percentage is read as its number",
    ),
    (
        "x < -1 \\text{ or } x > 1",
        "(-\\infty,-1)\\cup(1,\\infty)",
        true,
        "gold relations, answer intervals",
    ),
    (
        "4",
        "\\boxed{4}\\text{ units}",
        true,
        "unit outside the box",
    ),
];

#[test]
fn model_forms() {
    run("model", MODEL_FORMS);
}

/// Every case of this file.
const ALL: &[&[Case]] = &[
    INTEGERS,
    FRACTIONS,
    DECIMALS,
    RADICALS_AND_PI,
    MIXED_NUMBERS,
    THOUSANDS_SEPARATORS,
    DEGREES,
    CURRENCY,
    UNITS,
    COMPLEX_NUMBERS,
    EXPRESSIONS,
    TUPLES,
    INTERVALS,
    UNIONS,
    LISTS,
    SETS,
    PLUS_MINUS,
    EQUATIONS,
    MATRICES,
    BASES,
    TEXT_ANSWERS,
    SEVERAL_BOXES,
    RELATIONS,
    APPROXIMATIONS,
    CHAINS,
    UNHACKABLE,
    ISSUE_17_EXAMPLES,
    CONSTANTS_AND_COMBINATORICS,
    MODEL_FORMS,
];

/// The form class of a MATH-500 gold answer, by how it is written.
fn gold_class(g: &str) -> &'static str {
    let has_in = g
        .match_indices("\\in")
        .any(|(k, _)| !g[k + 3..].starts_with(|c: char| c.is_ascii_alphabetic()));
    let bracketed = ["(", "[", "\\left(", "\\left["]
        .iter()
        .any(|b| g.starts_with(b));
    let commandless: String = {
        let mut out = String::new();
        let mut chars = g.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\\' {
                while chars.peek().is_some_and(|c| c.is_ascii_alphabetic()) {
                    chars.next();
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    let digit_group = g
        .as_bytes()
        .windows(5)
        .any(|w| w[0].is_ascii_digit() && w[1] == b',' && w[2..].iter().all(u8::is_ascii_digit));
    match () {
        _ if g.contains("matrix") => "matrix",
        _ if g.contains("\\cup") => "union",
        _ if has_in => "membership",
        _ if g.contains("\\{") => "set",
        _ if g.contains("\\pm") => "pm",
        _ if g.contains('=') => "equation",
        _ if bracketed && g.contains(',') => {
            if g.contains(']') || g.contains("\\infty") || g.starts_with('[') {
                "interval"
            } else {
                "tuple"
            }
        }
        _ if g.starts_with("\\text") => "text",
        _ if g.contains("\\text") || g.contains("\\mbox") => "units",
        _ if g.contains("^\\circ") => "degree",
        _ if g.contains("\\$") => "currency",
        _ if g.contains('_') => "base",
        _ if g.contains(",\\!") || digit_group => "thousands",
        _ if g.contains(',') => "list",
        _ if g.ends_with('i') && g.chars().any(|c| c.is_ascii_digit()) => "complex",
        _ if commandless.chars().any(|c| c.is_ascii_alphabetic()) => "expression",
        _ if g.contains("\\sqrt") || g.contains("\\pi") => "radical/pi",
        _ if g.starts_with(|c: char| c.is_ascii_digit()) && g.contains("\\frac") => "mixed number",
        _ if g.contains("\\frac") || g.contains('/') => "fraction",
        _ if g.contains('.') => "decimal",
        _ => "integer",
    }
}

/// Every form class of the MATH-500 golds (data/math500) is represented by at least one case gold of
/// this file (classes by [`gold_class`]; the per-class counts are printed with `--nocapture`).
#[test]
fn every_math500_gold_class_is_covered() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/math500/test.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut math500 = std::collections::BTreeMap::<&str, usize>::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        *math500
            .entry(gold_class(row["answer"].as_str().unwrap()))
            .or_default() += 1;
    }
    let mut ours = std::collections::BTreeMap::<&str, usize>::new();
    for cases in ALL {
        for (gold, ..) in cases.iter() {
            *ours.entry(gold_class(gold)).or_default() += 1;
        }
    }
    for (class, n) in &math500 {
        println!(
            "{class}: {n} MATH-500 golds, {} cases here",
            ours.get(class).unwrap_or(&0)
        );
    }
    let missing: Vec<_> = math500.keys().filter(|c| !ours.contains_key(*c)).collect();
    assert!(missing.is_empty(), "classes without a case: {missing:?}");
    assert!(math500.len() >= 18, "{math500:?}");
}
