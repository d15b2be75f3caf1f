//! No file circle, in every crate (issue 43, item 5; ARCHITECTURE.md, "Invariants"): within each
//! workspace crate, the graph of top-level modules (an edge `a → b` where a file of `a` names
//! `crate::b`, `use crate::{b, …}` groups included; test-only code left out: each `#[cfg(test)]`
//! item, and the file of a `#[cfg(test)] mod x;`) has no
//! circle, except the circles listed in [`KNOWN`], which were there when the check was written
//! and may only go away. The list is exact: a new circle fails, and so does a listed circle that
//! is gone (delete its line). rlvr-train's finer layering is `crates/rlvr-train/tests/it/module_graph.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The circles present when this check was written (crate, modules sorted), to be broken. Empty
/// since rlvr-model's (kernels, layers, lora, model, recompute) was broken; a circle that cannot
/// be broken at once would be listed here.
const KNOWN: &[(&str, &[&str])] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The first path segments a file names after `crate::` (groups expanded at depth 0).
fn crate_names(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| is_ident(c) || c == ':' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.insert(first_segment(&item));
        } else {
            out.insert(rest.chars().take_while(|&c| is_ident(c)).collect());
        }
    }
    out.remove("");
    out
}

fn first_segment(item: &str) -> String {
    item.trim().chars().take_while(|&c| is_ident(c)).collect()
}

/// The crate's module graph: top-level module → the top-level modules its files name.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top = |p: &Path| -> String {
        let rel = p.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let tops: BTreeSet<String> = files
        .iter()
        .map(|p| top(p))
        .filter(|t| t != "lib" && t != "main")
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> =
        tops.iter().map(|t| (t.clone(), BTreeSet::new())).collect();
    let mut bodies: BTreeMap<&PathBuf, String> = BTreeMap::new();
    let mut test_dirs: Vec<PathBuf> = Vec::new();
    for p in &files {
        let text = std::fs::read_to_string(p).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let (body, test_mods) = without_test_items(&code);
        // `#[cfg(test)] mod x;` in `a.rs` (or `a/mod.rs`, `lib.rs`) is `a/x.rs` or `a/x/…`.
        let name = p.file_name().unwrap();
        let dir = if name == "mod.rs" || name == "lib.rs" || name == "main.rs" {
            p.parent().unwrap().to_path_buf()
        } else {
            p.with_extension("")
        };
        test_dirs.extend(test_mods.iter().map(|m| dir.join(m)));
        bodies.insert(p, body);
    }
    let test_only = |p: &Path| {
        test_dirs
            .iter()
            .any(|d| p == d.with_extension("rs") || p.starts_with(d))
    };
    for (p, body) in &bodies {
        let from = top(p);
        if !tops.contains(&from) || test_only(p) {
            continue;
        }
        for m in crate_names(body) {
            if m != from && tops.contains(&m) {
                g.get_mut(&from).unwrap().insert(m);
            }
        }
    }
    g
}

/// `code` without its `#[cfg(test)]` items (the attribute, any attributes after it, and the item:
/// up to its `;` or through its `{ … }` block, brackets, strings and character literals
/// skipped), and the names of the modules declared test-only out of line (`mod x;`).
fn without_test_items(code: &str) -> (String, Vec<String>) {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut mods = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(ATTR) {
        out.push_str(&rest[..i]);
        rest = &rest[i + ATTR.len()..];
        let end = item_end(rest);
        let item = rest[..end].trim();
        let words: Vec<&str> = item
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        if item.ends_with(';') {
            if let Some(k) = words.iter().position(|w| *w == "mod") {
                if let Some(name) = words.get(k + 1) {
                    mods.push(name.to_string());
                }
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    (out, mods)
}

/// The length of the item at the start of `code` (after an attribute): leading attributes, then
/// through the first `;` outside brackets or the `}` closing the first block.
fn item_end(code: &str) -> usize {
    let chars: Vec<(usize, char)> = code.char_indices().collect();
    let mut depth = 0usize;
    let mut k = 0;
    while k < chars.len() {
        let (at, c) = chars[k];
        match c {
            '"' => {
                // A string literal (raw strings hold no `"` before their end in practice here).
                k += 1;
                while k < chars.len() && chars[k].1 != '"' {
                    k += if chars[k].1 == '\\' { 2 } else { 1 };
                }
            }
            '\'' => {
                // A character literal ('x', '\n', '{'), not a lifetime ('a).
                if chars.get(k + 1).is_some_and(|&(_, n)| n == '\\') {
                    k += 2;
                    while k < chars.len() && chars[k].1 != '\'' {
                        k += 1;
                    }
                } else if chars.get(k + 2).is_some_and(|&(_, n)| n == '\'') {
                    k += 2;
                }
            }
            '(' | '[' | '{' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return at + 1;
                }
            }
            ';' if depth == 0 => return at + 1,
            _ => {}
        }
        k += 1;
    }
    code.len()
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: BTreeSet<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        for w in &t.g[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.stack.contains(&w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.insert(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: BTreeSet::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_crate_has_a_module_circle_beyond_the_known_ones() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found: BTreeSet<(String, Vec<String>)> = BTreeSet::new();
    let mut crates_seen = 0;
    for e in std::fs::read_dir(&crates).unwrap() {
        let dir = e.unwrap().path();
        if !dir.join("Cargo.toml").exists() {
            continue;
        }
        crates_seen += 1;
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for c in circles(&graph(&dir.join("src"))) {
            found.insert((name.clone(), c));
        }
    }
    assert!(crates_seen >= 15, "only {crates_seen} crates found");
    let known: BTreeSet<(String, Vec<String>)> = KNOWN
        .iter()
        .map(|(c, ms)| (c.to_string(), ms.iter().map(|m| m.to_string()).collect()))
        .collect();
    let new: Vec<_> = found.difference(&known).collect();
    let gone: Vec<_> = known.difference(&found).collect();
    assert!(
        new.is_empty(),
        "module circles (a file of each module names the next through crate::): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "circles listed in KNOWN (tests/it/module_circles.rs) are gone: delete their lines: {gone:?}"
    );
}

#[test]
fn the_circle_finder_finds_circles_and_reads_groups() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
        ("e", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    let c = circles(&g);
    assert_eq!(c.len(), 1);
    assert_eq!(c.first().unwrap(), &["a", "b", "c"]);
    let names =
        crate_names("use crate::{x::Y, z};\nlet a = crate::w::f(); rlvr_crate::q; $crate::r");
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["w", "x", "z"]);
}

#[test]
fn test_only_items_are_left_out_and_the_rest_of_the_file_is_read() {
    let code = r#"use crate::a;
#[cfg(test)]
mod tests;
#[cfg(test)]
#[allow(dead_code)]
fn helper() -> &'static str { let _ = crate::t1::x; let c = '}'; "}" }
pub fn f() { crate::b::g(); }
#[cfg(test)]
mod inner {
    use crate::t2::{y, z};
    fn w() { if true { crate::t3::q(); } }
}
#[cfg(test)]
use crate::t4;
pub struct S<'a>(&'a [u8; 2]);
fn late() { crate::c::h(); }
"#;
    let (body, mods) = without_test_items(code);
    assert_eq!(mods, ["tests"]);
    assert_eq!(
        crate_names(&body).into_iter().collect::<Vec<_>>(),
        ["a", "b", "c"],
        "{body}"
    );
    // Before, everything after the first `#[cfg(test)]` was dropped: `b` and `c` were missed.
    let old = code.split("#[cfg(test)]").next().unwrap();
    assert_eq!(crate_names(old).into_iter().collect::<Vec<_>>(), ["a"]);
}

#[test]
fn the_graph_leaves_out_test_only_files() {
    let dir = std::env::temp_dir().join(format!("rlvr-module-circles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\n");
    write("a.rs", "#[cfg(test)]\nmod tests;\nmod real;\n");
    write("a/tests.rs", "use crate::c::X;\n");
    write("a/real.rs", "use crate::b::Y;\n");
    write(
        "b.rs",
        "#[cfg(test)]\nmod t { use crate::a::Z; }\npub fn f() {}\n",
    );
    write("c.rs", "pub struct X;\n");
    let g = graph(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(g["a"].iter().collect::<Vec<_>>(), ["b"], "{g:?}");
    assert!(g["b"].is_empty() && g["c"].is_empty(), "{g:?}");
}
