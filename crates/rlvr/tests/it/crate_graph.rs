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
