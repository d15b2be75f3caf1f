//! The crate graph's invariants (ARCHITECTURE.md, "Invariants"), checked from the manifests and
//! crate roots so that a change that breaks a boundary fails here rather than in review:
//!
//! 1. Layers: a workspace crate depends only on workspace crates of a strictly lower layer.
//! 2. Light crates (the font, the run directory's protocol, verifiers, data, environments, the lab) never depend on candle: `rlvr reward` and the data
//!    loaders build and test without the tensor stack.
//! 3. `unsafe` lives in rlvr-kernels (SIMD, raw pointers) and rlvr-model (mmap, mallopt, the template worker's
//!    setrlimit/prctl); every
//!    other crate root says `#![forbid(unsafe_code)]`, except rlvr-lab's two audited process-control
//!    calls, rlvr-reward's one (`pre_exec` setting `PR_SET_PDEATHSIG` for an external verifier) and
//!    rlvr-dist's `unsafe impl Send` for the MPI communicator, each under
//!    `#![deny(unsafe_code)]` with a scoped `allow`.
//! 4. Tests: a crate's integration tests are the modules of one binary, `tests/it/main.rs`
//!    (ARCHITECTURE.md, "Testing").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layer of each workspace crate (lower = more basic). A new crate must be added here.
const LAYERS: &[(&str, u32)] = &[
    ("rlvr-fonts", 0),
    ("rlvr-rundir", 0),
    ("rlvr-chart", 1),
    ("rlvr-kernels", 0),
    ("rlvr-reward", 0),
    ("rlvr-template", 0),
    ("rlvr-algo", 1),
    ("rlvr-env", 1),
    ("rlvr-data", 1),
    ("rlvr-model", 1),
    ("rlvr-rollout", 2),
    ("rlvr-dist", 2),
    ("rlvr-vllm", 3),
    ("rlvr-train", 4),
    ("rlvr-lab", 5),
    ("rlvr", 6),
];

const LIGHT: &[&str] = &[
    "rlvr-fonts",
    "rlvr-rundir",
    "rlvr-chart",
    "rlvr-reward",
    "rlvr-template",
    "rlvr-data",
    "rlvr-env",
    "rlvr-lab",
];
const UNSAFE_ALLOWED: &[&str] = &["rlvr-kernels", "rlvr-model"];
const UNSAFE_DENIED: &[&str] = &["rlvr-lab", "rlvr-dist", "rlvr-reward"];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Non-dev dependency names of a manifest: every `[dependencies]` and
/// `[target.'…'.dependencies]` table (build-dependencies too), not `[dev-dependencies]`.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t.ends_with("dependencies]") && !t.contains("dev-dependencies");
            continue;
        }
        if inside && !t.is_empty() && !t.starts_with('#') {
            if let Some((name, _)) = t.split_once('=') {
                // `clap.workspace = true` names `clap`.
                let name = name.trim().split('.').next().unwrap_or_default();
                out.push(name.trim_matches('"').to_string());
            }
        }
    }
    out
}

fn workspace_crates() -> BTreeMap<String, (PathBuf, Vec<String>)> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(crates_dir()).unwrap() {
        let dir = e.unwrap().path();
        let manifest = dir.join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = "))
            .unwrap_or_else(|| panic!("{}: no package name", manifest.display()))
            .trim_matches('"')
            .to_string();
        m.insert(name, (dir, dependencies(&text)));
    }
    m
}

fn layer(name: &str) -> u32 {
    LAYERS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("crate `{name}` has no layer in crate_graph.rs LAYERS"))
        .1
}

#[test]
fn crates_depend_only_on_lower_layers() {
    let crates = workspace_crates();
    assert!(crates.len() >= 9, "found only {:?}", crates.keys());
    let mut bad = Vec::new();
    for (name, (_, deps)) in &crates {
        for d in deps.iter().filter(|d| crates.contains_key(*d)) {
            if layer(d) >= layer(name) {
                bad.push(format!(
                    "{name} (layer {}) -> {d} (layer {})",
                    layer(name),
                    layer(d)
                ));
            }
        }
    }
    assert!(bad.is_empty(), "layering broken: {bad:?}");
}

#[test]
fn light_crates_do_not_pull_candle() {
    let crates = workspace_crates();
    // Transitively: a light crate may depend only on light workspace crates.
    for light in LIGHT {
        let (_, deps) = &crates[*light];
        for d in deps {
            assert!(!d.starts_with("candle"), "{light} depends on {d}");
            if crates.contains_key(d) {
                assert!(
                    LIGHT.contains(&d.as_str()),
                    "{light} depends on heavy crate {d}"
                );
            }
        }
    }
}

#[test]
fn unsafe_code_is_confined() {
    for (name, (dir, _)) in workspace_crates() {
        let root = if dir.join("src/lib.rs").exists() {
            dir.join("src/lib.rs")
        } else {
            dir.join("src/main.rs")
        };
        let text = std::fs::read_to_string(&root).unwrap();
        let forbids = text.lines().any(|l| l.trim() == "#![forbid(unsafe_code)]");
        let denies = text
            .lines()
            .any(|l| l.trim().starts_with("#![deny(unsafe_code)]"));
        if UNSAFE_ALLOWED.contains(&name.as_str()) {
            continue;
        } else if UNSAFE_DENIED.contains(&name.as_str()) {
            assert!(denies, "{}: expected #![deny(unsafe_code)]", root.display());
        } else {
            assert!(
                forbids,
                "{}: expected #![forbid(unsafe_code)]",
                root.display()
            );
        }
        // A binary crate's other roots (src/bin/*.rs) would escape the check: there are none.
        assert!(
            !dir.join("src/bin").exists(),
            "{name} has src/bin: extend this test"
        );
        // Explicit `[[bin]]` targets elsewhere (rlvr-dist's MPI check program) are roots too,
        // and forbid unsafe code in every crate outside UNSAFE_ALLOWED.
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        for path in bin_paths(&manifest) {
            let file = dir.join(&path);
            if file == root || UNSAFE_ALLOWED.contains(&name.as_str()) {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(
                text.lines().any(|l| l.trim() == "#![forbid(unsafe_code)]"),
                "{}: expected #![forbid(unsafe_code)]",
                file.display()
            );
        }
    }
}

/// The `path`s of a manifest's `[[bin]]` tables.
fn bin_paths(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t == "[[bin]]";
            continue;
        }
        if let Some(v) = t.strip_prefix("path").map(str::trim_start) {
            if let (true, Some(v)) = (inside, v.strip_prefix('=')) {
                out.push(v.trim().trim_matches('"').to_string());
            }
        }
    }
    out
}

#[test]
fn manifest_parser_reads_target_tables_and_skips_dev() {
    let m = "[package]\nname = \"x\"\n[dependencies]\na = \"1\"\nd.workspace = true\n[dev-dependencies]\nb = \"1\"\n\
             [target.'cfg(unix)'.dependencies]\nc = { version = \"1\" }\n";
    assert_eq!(dependencies(m), ["a", "d", "c"]);
    let m = "[package]\nname = \"x\"\n[[bin]]\nname = \"c\"\npath = \"check/c.rs\"\n[[test]]\npath = \"tests/t.rs\"\n";
    assert_eq!(bin_paths(m), ["check/c.rs"]);
}

/// The integration tests that are binaries of their own: built only with the `mpi` feature, and run
/// by scripts/ci_mpi.sh (ARCHITECTURE.md, "Testing").
const OWN_BINARY: &[&str] = &["rlvr-dist/tests/mpi.rs", "rlvr/tests/mpi_train.rs"];

/// A `tests/NAME.rs` file is a test binary of its own, which links the crate's whole dependency
/// stack again (about 90 of them made most of a fresh `cargo test`'s time and ~20 GB of target/),
/// and a file in `tests/it/` without its `mod` line in `tests/it/main.rs` is never compiled.
#[test]
fn integration_tests_are_modules_of_one_binary_per_crate() {
    let mut modules = 0;
    for e in std::fs::read_dir(crates_dir()).unwrap() {
        let dir = e.unwrap().path();
        let krate = dir.file_name().unwrap().to_string_lossy().to_string();
        let Ok(entries) = std::fs::read_dir(dir.join("tests")) else {
            continue;
        };
        for f in entries {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|x| x == "rs") {
                let rel = format!("{krate}/tests/{}", f.file_name().unwrap().to_string_lossy());
                assert!(
                    OWN_BINARY.contains(&rel.as_str()),
                    "crates/{rel} is a test binary of its own: move it to tests/it/ and add its \
                     `mod` line to tests/it/main.rs"
                );
            }
        }
        let it = dir.join("tests/it");
        let Ok(main) = std::fs::read_to_string(it.join("main.rs")) else {
            continue;
        };
        for f in std::fs::read_dir(&it).unwrap() {
            let f = f.unwrap().path();
            let stem = f.file_stem().unwrap().to_string_lossy().to_string();
            if f.extension().is_some_and(|x| x == "rs") && stem != "main" {
                let line = format!("mod {stem};");
                assert!(
                    main.lines().any(|l| l.trim() == line),
                    "crates/{krate}/tests/it/main.rs lacks `{line}`: {} is never compiled",
                    f.display()
                );
                modules += 1;
            }
        }
    }
    assert!(modules > 50, "only {modules} test modules found");
}

/// A live test (`tests/it/live_*.rs`: needs a vLLM or reward-model server) is `#[ignore]`d, so
/// that a plain `cargo test` counts it as ignored rather than passed, and scripts/ci_vllm.sh runs
/// it with `--include-ignored` (where a missing server fails it).
#[test]
fn live_tests_are_ignored_by_a_plain_cargo_test() {
    let mut live = 0;
    for e in std::fs::read_dir(crates_dir()).unwrap() {
        let it = e.unwrap().path().join("tests/it");
        let Ok(files) = std::fs::read_dir(&it) else {
            continue;
        };
        for f in files {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            if !(name.starts_with("live_") && name.ends_with(".rs")) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                if l.trim() == "#[test]" {
                    live += 1;
                    assert!(
                        lines
                            .get(i + 1)
                            .is_some_and(|n| n.trim_start().starts_with("#[ignore = \"live: ")),
                        "{}:{}: a live test without `#[ignore = \"live: ...\"]` on the next line",
                        f.display(),
                        i + 2
                    );
                }
            }
        }
    }
    assert!(live >= 19, "only {live} live tests found");
}

/// The `"…"` string literals of a crate's sources (unit tests at a file's end and `//` lines left
/// out; an escaped character kept as the character after the backslash), with the file each came
/// from.
fn string_literals(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let body = text.split("#[cfg(test)]").next().unwrap_or_default();
        for line in body.lines().filter(|l| !l.trim_start().starts_with("//")) {
            let mut rest = line;
            while let Some(i) = rest.find('"') {
                rest = &rest[i + 1..];
                let mut lit = String::new();
                let mut chars = rest.char_indices();
                let mut end = rest.len();
                while let Some((j, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, e)) = chars.next() {
                                lit.push(e);
                            }
                        }
                        '"' => {
                            end = j + 1;
                            break;
                        }
                        c => lit.push(c),
                    }
                }
                out.push((f.clone(), lit));
                rest = &rest[end.min(rest.len())..];
            }
        }
    }
    out
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

#[test]
fn string_literals_are_read_with_escapes() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("a.rs"),
        "// \"comment\"\nlet a = (\"one\", \"t\\\"wo\");\n#[cfg(test)]\nlet b = \"test\";\n",
    )
    .unwrap();
    let lits: Vec<String> = string_literals(tmp.path())
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    assert_eq!(lits, ["one", "t\"wo"]);
}

/// rlvr-rundir (ARCHITECTURE.md, "rlvr-rundir"): the lab reads runs through it and names no metric
/// key or run-directory file name of its own, so that a renamed key or file cannot leave the lab
/// reading a name no run writes. Every metric key (`Metric`, `Eval`) and file name of rlvr-rundir
/// is searched for among rlvr-lab's string literals.
#[test]
fn the_lab_names_no_metric_key_or_run_file_of_its_own() {
    use rlvr_rundir::files;
    use rlvr_rundir::key::{Eval, Metric};
    // `step` is every line's index and a word the lab prints ("8 steps"), not a key to misspell.
    let mut names: Vec<&str> = Metric::ALL
        .iter()
        .filter(|m| **m != Metric::Step)
        .map(|m| m.key())
        .collect();
    names.extend(Eval::ALL.iter().map(|e| e.key()));
    names.extend([
        files::METRICS,
        files::EVAL,
        files::DIAGNOSTICS,
        files::ROLLOUTS,
        files::CONFIG,
        files::RUN_JSON,
        files::LOCK,
        files::CHECKPOINTS,
    ]);
    assert!(names.len() > 30, "{names:?}");
    let lab = crates_dir().join("rlvr-lab/src");
    let bad: Vec<String> = string_literals(&lab)
        .into_iter()
        .filter(|(_, s)| names.contains(&s.as_str()))
        .map(|(f, s)| format!("{}: \"{s}\"", f.display()))
        .collect();
    assert!(
        bad.is_empty(),
        "rlvr-lab names run-directory keys or files itself (take them from rlvr_rundir): {bad:?}"
    );
}

/// rlvr-fonts (ARCHITECTURE.md): no crate reads a file out of another crate's folder, so that
/// crates share files through a crate of their own (rlvr-fonts for the plotters' font), not by
/// path. Every `include_str!`/`include_bytes!` of every crate's `src/` resolves inside its own
/// crate or to the repository's shared folders (configs/, examples/, data/), never into
/// `crates/OTHER/`.
#[test]
fn no_crate_includes_a_file_from_another_crates_folder() {
    let crates = crates_dir().canonicalize().unwrap();
    let mut includes = 0;
    let mut bad = Vec::new();
    for e in std::fs::read_dir(&crates).unwrap() {
        let dir = e.unwrap().path();
        if !dir.join("Cargo.toml").exists() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (i, line) in text.lines().enumerate() {
                for mac in ["include_str!(\"", "include_bytes!(\""] {
                    let Some(k) = line.find(mac) else { continue };
                    let rel = &line[k + mac.len()..];
                    let rel = &rel[..rel.find('"').unwrap_or(rel.len())];
                    let target = f.parent().unwrap().join(rel);
                    let Ok(target) = target.canonicalize() else {
                        continue; // a doc example's path (checked by rustdoc, not here)
                    };
                    includes += 1;
                    if target.starts_with(&crates) && !target.starts_with(&dir) {
                        bad.push(format!("{}:{}: {rel}", f.display(), i + 1));
                    }
                }
            }
        }
    }
    assert!(includes >= 5, "only {includes} includes found");
    assert!(
        bad.is_empty(),
        "files included from another crate's folder: {bad:?}"
    );
}

/// rlvr-env and rlvr-data (ARCHITECTURE.md) take no tokenizer: the bridge and chat rendering take
/// a callback, so the crates build and test with the light crates (a tokenizer may be a
/// dev-dependency of their tests).
#[test]
fn environments_and_data_take_no_tokenizer() {
    let crates = workspace_crates();
    for name in ["rlvr-env", "rlvr-data"] {
        let (_, deps) = &crates[name];
        assert!(
            !deps.iter().any(|d| d == "tokenizers"),
            "{name} depends on tokenizers: {deps:?}"
        );
    }
}

/// The `rlvr` crate's sources (ARCHITECTURE.md, "rlvr"): only glue lives there, and the few
/// subcommands without a crate of their own, each file with its reason. A new file is a
/// subcommand implemented in the binary's crate instead of the crate that owns its concept: move
/// it there, or list it here.
const GLUE: &[(&str, &str)] = &[
    ("main.rs", "argument parsing and dispatch"),
    ("lib.rs", "the command line as a value (Cli), for its tests"),
    (
        "init.rs",
        "rlvr init: a project skeleton, no crate's concept",
    ),
    (
        "convert.rs",
        "rlvr convert: checkpoint formats across crates",
    ),
    ("logprobs.rs", "rlvr logprobs: a model and data together"),
    ("bench.rs", "rlvr bench: times pieces of several crates"),
    (
        "quickstart.rs",
        "rlvr quickstart: a whole job of several commands",
    ),
    (
        "kernels.rs",
        "rlvr kernels list|record: the kernels' manifest with model-shaped records",
    ),
];

#[test]
fn the_binary_crate_holds_glue_and_the_listed_subcommands_only() {
    let src = crates_dir().join("rlvr/src");
    let mut found: Vec<String> = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            !p.is_dir(),
            "crates/rlvr/src/{name}/: a folder of code in the binary's crate"
        );
        found.push(name);
    }
    found.sort();
    let mut listed: Vec<String> = GLUE.iter().map(|(f, _)| f.to_string()).collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "crates/rlvr/src holds other files than the listed glue (implement a subcommand in the \
         crate that owns its concept, or list the file in GLUE with the reason)"
    );
}

/// rlvr-model's `unsafe` (ARCHITECTURE.md, "rlvr-model"), file by file with the reason; a new
/// `unsafe` block, function or impl elsewhere in the crate fails here.
const MODEL_UNSAFE: &[(&str, usize, &str)] = &[
    ("weights.rs", 1, "the mmap of a safetensors file"),
    ("lib.rs", 2, "glibc's mallinfo2 and mallopt"),
    (
        "device.rs",
        1,
        "cudarc's per-buffer events off on the one CUDA stream every thread shares",
    ),
    (
        "template_sandbox.rs",
        1,
        "the template worker's setrlimit and prctl in pre_exec",
    ),
];

#[test]
fn rlvr_model_uses_unsafe_only_where_listed() {
    let src = crates_dir().join("rlvr-model/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let n = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| {
                ["unsafe {", "unsafe fn", "unsafe impl"]
                    .iter()
                    .map(|w| l.matches(w).count())
                    .sum::<usize>()
            })
            .sum::<usize>();
        if n > 0 {
            let rel = f.strip_prefix(&src).unwrap().to_string_lossy().to_string();
            found.push((rel, n));
        }
    }
    found.sort();
    let mut listed: Vec<(String, usize)> = MODEL_UNSAFE
        .iter()
        .map(|(f, n, _)| (f.to_string(), *n))
        .collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "rlvr-model's unsafe code (file, count) differs from MODEL_UNSAFE: list a new use with its \
         reason, or remove it"
    );
}

/// What a crate must not know (ARCHITECTURE.md, "Code map"), beyond what its layer already rules
/// out: the model and the sampling engine know nothing of RL (rewards, datasets, losses,
/// environments, servers). Checked on the crate's dependencies, transitively.
const KNOWS_NOT: &[(&str, &[&str])] = &[
    (
        "rlvr-model",
        &["rlvr-reward", "rlvr-data", "rlvr-algo", "rlvr-env"],
    ),
    (
        "rlvr-rollout",
        &[
            "rlvr-reward",
            "rlvr-data",
            "rlvr-algo",
            "rlvr-env",
            "rlvr-vllm",
        ],
    ),
];

#[test]
fn the_model_and_the_sampler_know_nothing_of_rl() {
    let crates = workspace_crates();
    for (name, forbidden) in KNOWS_NOT {
        let mut seen = std::collections::BTreeSet::new();
        let mut todo = vec![name.to_string()];
        while let Some(c) = todo.pop() {
            for d in &crates[&c].1 {
                if crates.contains_key(d) && seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        for f in *forbidden {
            assert!(
                !seen.contains(*f),
                "{name} depends on {f} (through {seen:?})"
            );
        }
    }
}
