//! The module graph of rlvr-train (lib.rs and ARCHITECTURE.md, "rlvr-train"), checked from the
//! sources so that a change that breaks a boundary fails here rather than in review:
//!
//! 1. Layers: a module imports only modules of a strictly lower layer (or itself). The stages
//!    (feed, update, eval, lora, plot) share a layer, so none imports another: the composition
//!    root hands each the parts it needs.
//! 2. Only `run/`, `config/` and `cli.rs` name the whole config (`RawConfig`, `ResolvedConfig`) or
//!    a type that holds one (found here by following definitions), aliases and re-exports included.
//! 3. Only the backend chooser (`feed/backend.rs`) names the vLLM crate.
//! 4. Every source file belongs to a module of the table: a new top-level module must be placed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layer of each top-level module (lower = more basic). A new module must be added here.
const LAYERS: &[(&str, u32)] = &[
    ("log", 0),
    ("store", 1),
    ("pack", 2),
    ("score", 3),
    ("job", 3),
    ("feed", 4),
    ("update", 4),
    ("eval", 4),
    ("lora", 4),
    ("plot", 4),
    ("config", 5),
    ("run", 6),
    ("sft", 6),
    ("cli", 7),
];

/// Where the whole config may be named.
const CONFIG_ALLOWED: &[&str] = &["run", "config", "cli"];

/// The one file that may name rlvr-vllm.
const VLLM_ALLOWED: &str = "feed/backend.rs";

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A source file: its path relative to src/, its top-level module (None for lib.rs) and its code
/// with comment lines removed.
struct Source {
    rel: String,
    top: Option<String>,
    code: String,
}

fn sources() -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(src_dir())
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let first = rel.split('/').next().unwrap().trim_end_matches(".rs");
            let top = (first != "lib").then(|| first.to_string());
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            Source { rel, top, code }
        })
        .collect()
}

fn layer(top: &str) -> u32 {
    LAYERS
        .iter()
        .find(|(n, _)| *n == top)
        .unwrap_or_else(|| panic!("module `{top}` is not in LAYERS (tests/it/module_graph.rs)"))
        .1
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The top-level modules a file names through `crate::` paths, with `use crate::{a, b::c}`
/// groups expanded.
fn crate_imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue; // `rlvr_crate::` or `$crate::`-like: not this crate's root
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split on commas at brace depth 0.
            let (mut depth, mut name, mut at_start) = (0, String::new(), true);
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        at_start = true;
                        if !name.is_empty() {
                            out.insert(std::mem::take(&mut name));
                        }
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 && at_start {
                    if is_ident(c) {
                        name.push(c);
                    } else if !name.is_empty() {
                        at_start = false;
                    }
                }
            }
            if !name.is_empty() {
                out.insert(name);
            }
        } else {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// Whether `word` occurs in `code` as a whole identifier.
fn names(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The names of the types defined in `code` (`struct`, `enum`, `type`, `trait`) whose definition
/// names one of `holders`.
fn definitions_naming(code: &str, holders: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for kw in ["struct ", "enum ", "type ", "trait "] {
        for (i, _) in code.match_indices(kw) {
            if code[..i].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let after = &code[i + kw.len()..];
            let name: String = after.chars().take_while(|&c| is_ident(c)).collect();
            if name.is_empty() {
                continue;
            }
            // The definition's text: up to the end of its body (`;` or the matching `}`).
            let mut depth = 0i32;
            let mut end = after.len();
            for (j, c) in after.char_indices() {
                match c {
                    '{' | '(' => depth += 1,
                    '}' | ')' => {
                        depth -= 1;
                        if depth == 0 && c == '}' {
                            end = j + 1;
                            break;
                        }
                    }
                    ';' if depth == 0 => {
                        end = j;
                        break;
                    }
                    _ => {}
                }
            }
            let body = &after[name.len()..end];
            if holders.iter().any(|h| names(body, h)) {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn every_import_points_down_and_stages_do_not_import_each_other() {
    let mut bad = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources() {
        let Some(top) = &s.top else { continue };
        let l = layer(top);
        for m in crate_imports(&s.code) {
            if &m == top {
                continue;
            }
            let lm = layer(&m);
            if lm >= l {
                bad.push(format!(
                    "{} (module `{top}`, layer {l}) imports `{m}` (layer {lm})",
                    s.rel
                ));
            }
            edges.entry(top.clone()).or_default().insert(m);
        }
        // `super::` reaches the parent module: inside a folder that is the folder itself; in a
        // top-level file it is the crate root, which must be named `crate::`.
        let depth = s.rel.matches('/').count();
        if s.code.contains("super::super::") {
            bad.push(format!(
                "{}: `super::super::` (name the module by crate::)",
                s.rel
            ));
        }
        // A file's unit tests (`#[cfg(test)] mod tests`, at its end) are its own child module.
        let body = s.code.split("#[cfg(test)]").next().unwrap_or_default();
        if depth == 0 && body.contains("super::") {
            bad.push(format!("{}: `super::` in a top-level file", s.rel));
        }
    }
    assert!(
        bad.is_empty(),
        "imports that break the layers:\n{}",
        bad.join("\n")
    );
    // The graph the table promises exists: the loop reaches every stage.
    for m in ["feed", "update", "eval", "store", "config"] {
        assert!(
            edges["run"].contains(m),
            "run does not import {m}: {edges:?}"
        );
    }
}

#[test]
fn only_run_config_and_cli_name_the_whole_config() {
    let srcs = sources();
    // Types holding the whole config, to a fixed point.
    let mut holders: BTreeSet<String> = ["RawConfig", "ResolvedConfig"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    loop {
        let mut grown = holders.clone();
        for s in &srcs {
            grown.extend(definitions_naming(&s.code, &holders));
        }
        if grown == holders {
            break;
        }
        holders = grown;
    }
    let mut bad = Vec::new();
    for s in &srcs {
        let Some(top) = &s.top else { continue };
        if CONFIG_ALLOWED.contains(&top.as_str()) {
            continue;
        }
        for h in &holders {
            if names(&s.code, h) {
                bad.push(format!("{} names `{h}`", s.rel));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "only run/, config/ and cli.rs may name the whole config (or a type holding it: {holders:?}):\n{}",
        bad.join("\n")
    );
    // The check sees the config where it is: the composition root names it.
    assert!(srcs
        .iter()
        .any(|s| s.rel == "run/setup.rs" && names(&s.code, "ResolvedConfig")));
}

#[test]
fn only_the_backend_chooser_names_vllm() {
    let bad: Vec<String> = sources()
        .into_iter()
        .filter(|s| s.rel != VLLM_ALLOWED && names(&s.code, "rlvr_vllm"))
        .map(|s| s.rel)
        .collect();
    assert!(
        bad.is_empty(),
        "rlvr_vllm is named outside {VLLM_ALLOWED}: {bad:?}"
    );
    let chooser = std::fs::read_to_string(src_dir().join(VLLM_ALLOWED)).unwrap();
    assert!(names(&chooser, "rlvr_vllm"));
}

#[test]
fn the_import_scanner_reads_groups_and_paths() {
    let code = "use crate::{feed::Feed, store::{a, b}, log};\nlet x = crate::update::lr::at(1);\nfoo::crate::x";
    let got: Vec<String> = crate_imports(code).into_iter().collect();
    assert_eq!(got, ["feed", "log", "store", "update"]);
    let holders: BTreeSet<String> = ["ResolvedConfig".to_string()].into();
    let defs = definitions_naming(
        "pub struct Run<'a> { cfg: &'a ResolvedConfig, n: u32 }\nstruct Other { x: u32 }\ntype A = ResolvedConfig;",
        &holders,
    );
    assert_eq!(defs.into_iter().collect::<Vec<_>>(), ["A", "Run"]);
    assert!(names("a ResolvedConfig b", "ResolvedConfig"));
    assert!(!names("MyResolvedConfigX", "ResolvedConfig"));
}

/// The files outside `store/` that open a file for writing themselves, and why (ARCHITECTURE.md,
/// the `store/` invariant). Every other write of a run goes through `store/` (rlvr-rundir's
/// `append_line`, `truncate_after`, `atomic_write`; the checkpoint's save).
const RAW_WRITES: &[(&str, &str)] = &[
    (
        "run/guard.rs",
        "train.log and ranks/rank-r.log, opened for appending",
    ),
    (
        "run/signals.rs",
        "/dev/null over the standard streams after SIGHUP",
    ),
    (
        "cli.rs",
        "the --out file of rlvr eval / generate, and its writability probe",
    ),
];

#[test]
fn only_store_and_the_listed_files_open_files_for_writing() {
    let mut found = BTreeSet::new();
    for s in sources() {
        if s.rel.starts_with("store/") {
            continue;
        }
        let body = s.code.split("#[cfg(test)]").next().unwrap_or_default();
        if ["fs::write(", "OpenOptions::new()", "File::create("]
            .iter()
            .any(|w| body.contains(w))
        {
            found.insert(s.rel.clone());
        }
    }
    let listed: BTreeSet<String> = RAW_WRITES.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(
        found, listed,
        "files outside store/ that write a file themselves (write through store/, or list the \
         file in RAW_WRITES with the reason)"
    );
}

/// `Run::steps` (run/mod.rs), the loop, stays one screen: at most this many lines, signature and
/// closing brace included, with one labelled comment per stage.
const LOOP_LINES: usize = 60;

#[test]
fn the_loop_is_one_screen_with_a_labelled_line_per_stage() {
    let text = std::fs::read_to_string(src_dir().join("run/mod.rs")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with("fn steps("))
        .expect("run/mod.rs has no `fn steps(`");
    let indent = lines[start].len() - lines[start].trim_start().len();
    let end = (start + 1..lines.len())
        .find(|&i| lines[i].trim_end() == format!("{}}}", " ".repeat(indent)))
        .expect("the end of `fn steps`");
    let n = end - start + 1;
    assert!(
        n <= LOOP_LINES,
        "Run::steps is {n} lines (at most {LOOP_LINES}: one screen); move mechanics into the stages"
    );
    let body = lines[start..=end].join("\n");
    for label in [
        "// explorer:",
        "// staleness:",
        "// trainer update:",
        "// evaluator",
        "// sync:",
        "// checkpoint:",
    ] {
        assert!(
            body.contains(label),
            "Run::steps lacks the stage label `{label}`"
        );
    }
}

/// Stage state (ARCHITECTURE.md, "stage state"): `run/` composes the stages' records and hands
/// each stage its own back, so it names none of the optimizer's internals (its `OptimizerStep`, the
/// AdamW state with its moments and update count): the trainer saves and restores them itself
/// (`Stateful`, `update::TrainerRecord`).
#[test]
fn run_reaches_into_no_stages_internals() {
    let mut bad = Vec::new();
    for s in sources() {
        if !s.rel.starts_with("run/") {
            continue;
        }
        let body = s.code.split("#[cfg(test)]").next().unwrap_or_default();
        for (i, line) in body.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for w in ["OptimizerStep", ".adamw", "AdamW", "optimizer.vars"] {
                if line.contains(w) {
                    bad.push(format!("{}:{}: {w}", s.rel, i + 1));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "run/ reaches into a stage's internals (take the stage's record instead): {bad:?}"
    );
}
