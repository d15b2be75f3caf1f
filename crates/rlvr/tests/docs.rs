//! What users are pointed to exists in the repository (issue 13, item 12): every relative link of
//! README.md and docs/*.md names a file of the repository, `rlvr train --help` points to
//! docs/DESIGN.md (which holds the config interface, section 10), and `rlvr reward --help` states
//! the `--input` line format.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The targets of `[text](target)` links in `md` that are not URLs or anchors (anchor stripped).
fn relative_links(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = md;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or("").trim();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target.to_string());
        }
    }
    out
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rlvr"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "rlvr {args:?}: {}", out.status);
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_relative_link_of_the_readme_and_docs_names_a_file_of_the_repository() {
    let root = root();
    let mut files = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            files.push(p);
        }
    }
    let mut checked = 0;
    for f in &files {
        let dir: &Path = f.parent().unwrap();
        for link in relative_links(&std::fs::read_to_string(f).unwrap()) {
            assert!(
                dir.join(&link).exists(),
                "{} links to {link}, which is not in the repository",
                f.display()
            );
            checked += 1;
        }
    }
    // README links docs/DESIGN.md and docs/external-verifier.md at least.
    assert!(checked >= 2, "{checked} links");
}

#[test]
fn train_help_points_to_the_repositorys_design_and_reward_help_states_the_input_format() {
    let train = help(&["train", "--help"]);
    assert!(train.contains("docs/DESIGN.md"), "{train}");
    let design = std::fs::read_to_string(root().join("docs/DESIGN.md")).unwrap();
    assert!(design.contains("## 10. Interfaces"));
    let reward = help(&["reward", "--help"]);
    for want in [
        "--input <FILE.jsonl>",
        r#"{"completion": str, "reference": str"#,
        "One output line per input line",
    ] {
        assert!(reward.contains(want), "no {want:?} in:\n{reward}");
    }
}

#[test]
fn help_of_help_prints_the_top_level_help() {
    let h = help(&["help", "--help"]);
    assert!(
        h.starts_with("Reinforcement learning with verifiable rewards"),
        "{h}"
    );
    assert!(
        h.contains("Usage: rlvr <COMMAND>") && h.contains("train"),
        "{h}"
    );
}
