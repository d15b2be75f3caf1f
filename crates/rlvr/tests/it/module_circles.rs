//! No file circle, in every crate (issue 43, item 5; ARCHITECTURE.md, "Invariants"): within each
//! workspace crate, the graph of top-level modules (an edge `a → b` where a file of `a` names
//! `crate::b`, `use crate::{b, …}` groups included; unit tests at a file's end left out) has no
//! circle, except the circles listed in [`KNOWN`], which were there when the check was written
//! and may only go away. The list is exact: a new circle fails, and so does a listed circle that
//! is gone (delete its line). rlvr-train's finer layering is `crates/rlvr-train/tests/it/module_graph.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The circles present when this check was written (crate, modules sorted), to be broken.
const KNOWN: &[(&str, &[&str])] = &[(
    "rlvr-model",
    &["kernels", "layers", "lora", "model", "recompute"],
)];

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
    for p in &files {
        let from = top(p);
        if !tops.contains(&from) {
            continue;
        }
        let text = std::fs::read_to_string(p).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let body = code.split("#[cfg(test)]").next().unwrap_or_default();
        for m in crate_names(body) {
            if m != from && tops.contains(&m) {
                g.get_mut(&from).unwrap().insert(m);
            }
        }
    }
    g
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
