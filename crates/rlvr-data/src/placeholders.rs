//! The `{name}` placeholder language of prompt templates: text with `{name}` placeholders filled
//! from a problem's variables (`question`, and per task `numbers`, `target`, or any field of a
//! `jsonl` row); `{{` and `}}` are literal braces. A leaf below both the `[data]` config (which
//! checks its template when it is validated) and prompt building ([`crate::template`], which fills it).

use crate::{DataError, Result};

enum Piece {
    Text(String),
    Var(String),
}

fn parse(template: &str) -> Result<Vec<Piece>> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|p| p.1) == Some('{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek().map(|p| p.1) == Some('}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let rest = &template[i + 1..];
                let end = rest.find('}').ok_or_else(|| {
                    DataError::Template(format!(
                        "unclosed `{{` at byte {i} of {template:?} (write `{{{{` for a literal brace)"
                    ))
                })?;
                let name = &rest[..end];
                if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    return Err(DataError::Template(format!(
                        "bad placeholder `{{{name}}}` at byte {i} (names are letters, digits and `_`; write `{{{{` for a literal brace)"
                    )));
                }
                out.push(Piece::Text(std::mem::take(&mut text)));
                out.push(Piece::Var(name.to_string()));
                for _ in 0..end + 1 {
                    chars.next();
                }
            }
            '}' => {
                return Err(DataError::Template(format!(
                    "stray `}}` at byte {i} of {template:?} (write `}}}}` for a literal brace)"
                )))
            }
            c => text.push(c),
        }
    }
    out.push(Piece::Text(text));
    Ok(out)
}

/// Checks that `template` is well formed (placeholders are only resolved per problem).
///
/// # Errors
/// [`DataError::Template`] naming the position.
pub fn check_template(template: &str) -> Result<()> {
    parse(template).map(|_| ())
}

/// Fills `template` from `vars` (name, value).
///
/// # Errors
/// [`DataError::Template`] for a malformed template or a placeholder with no value (listing those
/// available).
pub fn fill(template: &str, vars: &[(String, String)]) -> Result<String> {
    let mut out = String::with_capacity(template.len() + 64);
    for p in parse(template)? {
        match p {
            Piece::Text(t) => out.push_str(&t),
            Piece::Var(name) => match vars.iter().find(|(k, _)| *k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    let names: Vec<&str> = rlvr_reward::visible_columns(vars)
                        .map(|(k, _)| k.as_str())
                        .collect();
                    return Err(DataError::Template(format!(
                        "placeholder `{{{name}}}` has no value; available: {names:?}"
                    )));
                }
            },
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(q: &str) -> Vec<(String, String)> {
        vec![("question".into(), q.into())]
    }

    #[test]
    fn fill_and_escape() {
        assert_eq!(
            fill("Q: {question} {{x}}", &vars("1+1")).unwrap(),
            "Q: 1+1 {x}"
        );
        assert!(fill("{nope}", &vars("a"))
            .unwrap_err()
            .to_string()
            .contains("`{nope}`"));
        assert!(check_template("{question").is_err());
        assert!(check_template("\\boxed{}").is_err());
        assert!(check_template("\\boxed{{}}").is_ok());
    }
}
