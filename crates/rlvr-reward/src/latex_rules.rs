//! The tables and passes of [`crate::latex::normalize`]: plain substitutions, whole-command
//! replacements (relations, connectors), `\text{..}` units and connectors, unit words, and the thousands
//! and list separators.

use crate::latex_marks::{matching_brace, LIST_SEP, SET_CLOSE, SET_OPEN};

/// Plain substitutions applied in order before structural clean-up.
pub(crate) const REPLACEMENTS: &[(&str, &str)] = &[
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
    ("\\cfrac", "\\frac"),
    ("\\mbox", "\\text"),
    ("\\hbox", "\\text"),
    ("\\textnormal", "\\text"),
    ("\\textup", "\\text"),
    ("\\textsf", "\\text"),
    ("\\texttt", "\\text"),
    ("\\mathit", "\\text"),
    ("\\mathsf", "\\text"),
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
    ("\u{00B0}", ""),
    ("\\%", ""),
    ("%", ""),
    ("\\$", ""),
    ("$", ""),
    ("\\cdot", "*"),
    ("\\times", "*"),
    ("\\lbrace", "\\{"),
    ("\\lvert", "|"),
    ("\\rvert", "|"),
    ("\\vert", "|"),
    ("\\rbrace", "\\}"),
    ("\\mathbb{R}", "(-\\infty,\\infty)"),
    ("\\varnothing", "\\emptyset"),
    ("\u{221A}", "\\sqrt"),
    ("\\{", "\u{2983}"),
    ("\\}", "\u{2984}"),
    // Currency signs (`\$` above), unicode operators and superscripts.
    ("\u{20AC}", ""),
    ("\u{00A3}", ""),
    ("\u{00A5}", ""),
    ("\u{20B9}", ""),
    ("\\euro", ""),
    ("\\pounds", ""),
    ("\u{00B2}", "^2"),
    ("\u{00B3}", "^3"),
    ("\u{00D7}", "*"),
    ("\u{00B7}", "*"),
    ("\u{00F7}", "/"),
    ("\u{00B1}", "\\pm"),
    ("\u{2213}", "\\mp"),
    ("\u{221E}", "\\infty"),
    ("\u{03C0}", "\\pi"),
    ("\u{2248}", "\\approx"),
    ("\u{2A7D}", "\u{2264}"),
    ("\u{2A7E}", "\u{2265}"),
    ("<=", "\u{2264}"),
    (">=", "\u{2265}"),
    ("!=", "\u{2260}"),
    ("\\not=", "\u{2260}"),
    ("+\\infty", "\\infty"),
];

/// LaTeX commands replaced only as whole command names (so `\le` does not eat `\leq` or `\left`):
/// relations become one character each (`≤ ≥ ≠ < >`), `\lor`/`\vee` the [`OR_SEP`] connector, `\land`
/// and `\wedge` a list comma.
pub(crate) const COMMANDS: &[(&str, &str)] = &[
    ("le", "\u{2264}"),
    ("leq", "\u{2264}"),
    ("leqslant", "\u{2264}"),
    ("ge", "\u{2265}"),
    ("geq", "\u{2265}"),
    ("geqslant", "\u{2265}"),
    ("ne", "\u{2260}"),
    ("neq", "\u{2260}"),
    ("lt", "<"),
    ("gt", ">"),
    ("nless", "\u{2265}"),
    ("ngtr", "\u{2264}"),
    ("nleq", ">"),
    ("ngeq", "<"),
    ("lor", "\u{2980}"),
    ("vee", "\u{2980}"),
    ("land", ","),
    ("wedge", ","),
    ("infin", "\\infty"),
    ("hline", ""),
];

/// Unit words dropped after a value when written without `\text` (`125 miles`, `3 km/h`, `12 m^2`).
pub(crate) const UNIT_WORDS: &[&str] = &[
    "m",
    "cm",
    "mm",
    "km",
    "meter",
    "meters",
    "metre",
    "metres",
    "centimeter",
    "centimeters",
    "kilometer",
    "kilometers",
    "in",
    "inch",
    "inches",
    "ft",
    "foot",
    "feet",
    "yd",
    "yard",
    "yards",
    "mi",
    "mile",
    "miles",
    "mph",
    "s",
    "sec",
    "second",
    "seconds",
    "min",
    "minute",
    "minutes",
    "h",
    "hr",
    "hrs",
    "hour",
    "hours",
    "day",
    "days",
    "week",
    "weeks",
    "month",
    "months",
    "year",
    "years",
    "g",
    "kg",
    "gram",
    "grams",
    "kilogram",
    "kilograms",
    "lb",
    "lbs",
    "pound",
    "pounds",
    "ounce",
    "ounces",
    "oz",
    "l",
    "ml",
    "liter",
    "liters",
    "litre",
    "litres",
    "gallon",
    "gallons",
    "dollar",
    "dollars",
    "cent",
    "cents",
    "euro",
    "euros",
    "degree",
    "degrees",
    "unit",
    "units",
    "square",
    "sq",
    "cubic",
    "people",
    "students",
    "percent",
    "times",
];

/// What a `\text{...}` group's content is, for [`strip_text`].
fn text_role(inner: &str, seen_content: bool) -> TextRole {
    let t = inner.trim();
    match t {
        "and" | "&" => return TextRole::Connector(","),
        "or" => return TextRole::Connector("\u{2980}"),
        _ => {}
    }
    // After a value, a group of letters (with `/`, `^`, digits, `.` and spaces) is a unit: `\text{ cm}^2`,
    // `\text{meters}`, `\mbox{ inches}`, `\text{km/h}`. Before any value it is the answer itself
    // (`\text{Evelyn}`, `\text{(C)}`).
    let unit_like = t.starts_with(|c: char| c.is_alphabetic())
        && t.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, ' ' | '/' | '^' | '.' | '-' | '\''));
    if seen_content && (unit_like || inner.starts_with(' ')) && !matches!(t, "e" | "i") {
        TextRole::Unit
    } else {
        TextRole::Content
    }
}

enum TextRole {
    Unit,
    Connector(&'static str),
    Content,
}

/// Removes `\text{...}` units after a value (`\text{ cm}^2`, `\text{meters}`), turns the connector words
/// `and` / `or` into a list comma / [`OR_SEP`], and unwraps every other `\text{...}` to its content.
pub(crate) fn strip_text(s: &str) -> String {
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
                match text_role(inner, seen_content) {
                    TextRole::Unit => {
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
                    }
                    TextRole::Connector(c) => {
                        out.push(' ');
                        out.push_str(c);
                        out.push(' ');
                    }
                    TextRole::Content => {
                        out.push_str(inner);
                        seen_content |= inner.chars().any(|c| !c.is_whitespace());
                    }
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

/// Replaces whole LaTeX command names per [`COMMANDS`] (`\le` but not `\left`), in one pass.
pub(crate) fn replace_commands(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(k) = rest.find('\\') {
        out.push_str(&rest[..k]);
        let after = &rest[k + 1..];
        let n = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let name = &after[..n];
        match COMMANDS.iter().find(|(c, _)| *c == name) {
            Some((_, to)) if n > 0 => out.push_str(to),
            _ => {
                out.push('\\');
                out.push_str(name);
            }
        }
        rest = &after[n..];
    }
    out.push_str(rest);
    out
}

/// Joins digit groups written with LaTeX's explicit thousands separators `{,}` and `,\!` (spaces allowed
/// after them): `14{,}916` → `14916`, `11,\! 111,\! 100` → `11111100`. A group must be exactly three
/// digits after a digit.
pub(crate) fn join_explicit_groups(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        let sep = ["{,}", ",\\!"].iter().find(|p| rest.starts_with(**p));
        if let Some(p) = sep {
            let after = &rest[p.len()..];
            let trimmed = after.trim_start();
            let digits = trimmed.bytes().take_while(u8::is_ascii_digit).count();
            if out.ends_with(|c: char| c.is_ascii_digit()) && digits == 3 {
                i += p.len() + (after.len() - trimmed.len());
                continue;
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Marks commas followed by whitespace at bracket depth 0 as [`LIST_SEP`] (list separators).
pub(crate) fn mark_list_commas(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut depth = 0i32;
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '(' | '[' | '{' | SET_OPEN => depth += 1,
            ')' | ']' | '}' | SET_CLOSE => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 && it.peek().is_some_and(|n| n.is_whitespace()) {
            out.push(LIST_SEP);
        } else {
            out.push(c);
        }
    }
    out
}

/// Drops unit words written without `\text` after a value (`125 miles`, `3 km/h`, `12 m^2`), while the
/// text is still split by spaces. Only a trailing run of [`UNIT_WORDS`] directly after a token ending in
/// a digit, `}` or `)` is dropped.
pub(crate) fn strip_unit_words(s: &str) -> String {
    let toks: Vec<&str> = s.split_whitespace().collect();
    let is_unit = |t: &str| {
        let base = t.split('^').next().unwrap_or(t);
        let base = base.trim_end_matches(['.', ',']);
        !base.is_empty()
            && base
                .split('/')
                .all(|w| UNIT_WORDS.contains(&w.to_ascii_lowercase().as_str()))
    };
    let mut keep = toks.len();
    while keep > 1 && is_unit(toks[keep - 1]) {
        keep -= 1;
    }
    if keep == toks.len()
        || !toks[keep - 1].ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == ')')
    {
        return s.to_string();
    }
    toks[..keep].join(" ")
}
