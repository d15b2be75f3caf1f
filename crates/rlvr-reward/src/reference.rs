//! Config reference rows generated from `///` comments: the keys of a verifier table
//! (`data.verifier`, each kind's keys, a judge's `parse` rule) and of `[reward]` (its components and
//! format reward). rlvr-train's README embeds them in its config reference, which a test keeps in
//! sync and which fails on a key that has no row.
//!
//! The rows are read from this crate's sources (`include_str!`), so a field's doc comment is its
//! one description: a new field without a `///` comment has no row, and the test names it.

/// The sources whose config types have rows.
const SOURCES: [&str; 4] = [
    include_str!("combine.rs"),
    include_str!("judge.rs"),
    include_str!("reward_model.rs"),
    include_str!("format.rs"),
];

/// One documented item of a struct or an enum: its name and its `///` comment on one line.
#[derive(Debug, Clone, PartialEq)]
pub struct DocItem {
    /// The field's name, or the variant's name as written in a config (its serde tag value).
    pub name: String,
    /// The `///` comment's lines joined by spaces.
    pub doc: String,
    /// A newtype variant's inner type (`Judge(JudgeConfig)` → `JudgeConfig`).
    pub newtype: Option<String>,
    /// Whether it is a variant with fields in braces (`Gsm8k { mode }`).
    pub has_fields: bool,
}

/// The body lines of the item whose header line is `header` (trimmed, e.g.
/// `pub struct FormatReward {`) in `src`, up to its closing brace, and the body's indentation.
fn body<'a>(src: &'a str, header: &str) -> Option<Vec<&'a str>> {
    let mut lines = src.lines();
    let open = lines.by_ref().find(|l| l.trim() == header)?;
    let indent = open.len() - open.trim_start().len();
    let close = format!("{}}}", " ".repeat(indent));
    Some(lines.take_while(|l| !l.starts_with(&close)).collect())
}

/// `Gsm8k` → `gsm8k`, `RewardModel` → `reward-model` (serde's `kebab-case`).
fn kebab(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The `rename = "..."` of a `#[serde(...)]` attribute line, if any.
fn renamed(attr: &str) -> Option<String> {
    let rest = &attr[attr.find("rename = \"")? + "rename = \"".len()..];
    Some(rest[..rest.find('"')?].to_string())
}

/// The documented fields of the struct or struct variant whose header line is `header`, in
/// order (`pub` or not). A field without a `///` comment is left out.
///
/// # Panics
/// When `header` is in none of `srcs` (a renamed type: the reference test fails loudly).
pub fn fields(srcs: &[&str], header: &str) -> Vec<DocItem> {
    let lines = srcs
        .iter()
        .find_map(|s| body(s, header))
        .unwrap_or_else(|| panic!("`{header}` is not in the given sources"));
    let mut out = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    let mut rename = None;
    for line in lines {
        let l = line.trim();
        if let Some(d) = l.strip_prefix("///") {
            doc.push(d.trim());
            continue;
        }
        if l.starts_with("#[") {
            rename = rename.or_else(|| renamed(l));
            continue;
        }
        if l.starts_with("//") {
            continue;
        }
        let decl = l.strip_prefix("pub ").unwrap_or(l);
        if let Some((name, _)) = decl.split_once(':') {
            let name = name.trim();
            let ident = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if ident && !doc.is_empty() {
                out.push(DocItem {
                    name: rename.take().unwrap_or_else(|| name.to_string()),
                    doc: doc.join(" "),
                    newtype: None,
                    has_fields: false,
                });
            }
        }
        doc.clear();
        rename = None;
    }
    out
}

/// The variants of `pub enum NAME {` in `srcs`, with their config names (a `rename`, else
/// kebab-case) and `///` comments, in order.
///
/// # Panics
/// When the enum is in none of `srcs`.
pub fn variants(srcs: &[&str], name: &str) -> Vec<DocItem> {
    let header = format!("pub enum {name} {{");
    let lines = srcs
        .iter()
        .find_map(|s| body(s, &header))
        .unwrap_or_else(|| panic!("`{header}` is not in the given sources"));
    let mut out = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    let mut rename = None;
    let mut depth = 0usize;
    for line in lines {
        let l = line.trim();
        if depth > 0 && l.starts_with("//") {
            continue;
        }
        if depth == 0 {
            if let Some(d) = l.strip_prefix("///") {
                doc.push(d.trim());
                continue;
            }
            if l.starts_with("//") {
                continue;
            }
            if l.starts_with("#[") {
                rename = rename.or_else(|| renamed(l));
                continue;
            }
            let end = l
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .unwrap_or(l.len());
            let ident = &l[..end];
            if ident.starts_with(|c: char| c.is_ascii_uppercase()) {
                let rest = l[end..].trim_start();
                out.push(DocItem {
                    name: rename.take().unwrap_or_else(|| kebab(ident)),
                    doc: doc.join(" "),
                    newtype: rest
                        .strip_prefix('(')
                        .and_then(|r| r.split_once(')'))
                        .map(|(t, _)| t.trim().to_string()),
                    has_fields: rest.starts_with('{') && !rest.starts_with("{}"),
                });
            }
            doc.clear();
            rename = None;
        }
        depth += l.matches('{').count();
        depth = depth.saturating_sub(l.matches('}').count());
    }
    out
}

/// A Markdown table row: `| `KEY`NOTE | DOC |` (`|` in the text escaped).
pub fn row(key: &str, note: &str, doc: &str) -> String {
    format!("| `{key}`{note} | {} |\n", doc.replace('|', "\\|"))
}

/// The rows of a table tagged by `tag` (`kind`, `rule`) whose variants are the enum `name`:
/// `PREFIX.TAG` listing each variant's name and comment, then each variant's fields (a struct
/// variant's, or a newtype variant's struct's) as `PREFIX.FIELD (kind `NAME`)`. `note` names the
/// enclosing variant (`kind `judge`, `) for a tagged table inside another.
fn tagged_rows(name: &str, tag: &str, prefix: &str, note: &str) -> String {
    let vs = variants(&SOURCES, name);
    let listed: Vec<String> = vs
        .iter()
        .map(|v| format!("`{}`: {}", v.name, v.doc))
        .collect();
    let within = if note.is_empty() {
        String::new()
    } else {
        format!(" ({})", note.trim_end_matches(", "))
    };
    let mut out = row(
        &format!("{prefix}.{tag}"),
        &within,
        &format!("One of: {}", listed.join(" ")),
    );
    for v in &vs {
        let header = match &v.newtype {
            Some(t) => format!("pub struct {t} {{"),
            None if v.has_fields => variant_header(name, &v.name),
            None => continue,
        };
        let note = format!(" ({note}{tag} `{}`)", v.name);
        for f in fields(&SOURCES, &header) {
            out.push_str(&row(&format!("{prefix}.{}", f.name), &note, &f.doc));
            if name == "VerifierConfig" && v.name == "judge" && f.name == "parse" {
                out.push_str(&tagged_rows(
                    "JudgeParse",
                    "rule",
                    &format!("{prefix}.parse"),
                    "kind `judge`, ",
                ));
            }
        }
    }
    out
}

/// The header line of struct variant `variant` (its config name) of enum `name`.
fn variant_header(name: &str, variant: &str) -> String {
    let header = format!("pub enum {name} {{");
    let lines = SOURCES
        .iter()
        .find_map(|s| body(s, &header))
        .expect("the enum is in SOURCES");
    lines
        .iter()
        .map(|l| l.trim())
        .find(|l| {
            l.ends_with('{') && {
                let ident = l.trim_end_matches('{').trim();
                kebab(ident) == variant
            }
        })
        .unwrap_or_else(|| panic!("variant `{variant}` of {name} has no fields"))
        .to_string()
}

/// The rows of a verifier table at `prefix` (`data.verifier`): its `kind`, then every kind's
/// keys (`PREFIX.mode (kind `gsm8k`)`, ...), a judge's `parse` rule included.
pub fn verifier_rows(prefix: &str) -> String {
    tagged_rows("VerifierConfig", "kind", prefix, "")
}

/// The rows of `[reward]`: `reward.components` and each component's keys
/// (`reward.components[].name`, ...; a component's `verifier` has the keys of `data.verifier`),
/// `reward.format` and its keys.
pub fn reward_rows() -> String {
    let mut out = String::new();
    for f in fields(&SOURCES, "pub struct RewardConfig {") {
        out.push_str(&row(&format!("reward.{}", f.name), "", &f.doc));
        let (header, prefix) = match f.name.as_str() {
            "components" => ("pub struct ComponentConfig {", "reward.components[]"),
            "format" => ("pub struct FormatReward {", "reward.format"),
            _ => continue,
        };
        for g in fields(&SOURCES, header) {
            out.push_str(&row(&format!("{prefix}.{}", g.name), "", &g.doc));
        }
    }
    out
}
