//! What users are pointed to exists in the repository, so no link or help text sends them nowhere:
//! every relative link of
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

/// The README's Tour block runs as written on a CPU (its train and eval commands used to fail
/// there, the shipped config saying cuda:0 and bf16), from a directory that holds the
/// repository's `data/` and `configs/`, with this build's binary as `$R`.
#[test]
fn the_readme_tour_runs_as_written_on_a_cpu() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let tour = &readme[readme.find("## Tour").expect("a Tour section")..];
    let start = tour.find("```sh\n").expect("a sh block") + 6;
    let block = &tour[start..start + tour[start..].find("```").unwrap()];
    let first = block.lines().next().unwrap();
    assert!(first.starts_with("R=target/release/rlvr"), "{first}");
    let script = block.replacen(
        "R=target/release/rlvr",
        &format!("R={}", env!("CARGO_BIN_EXE_rlvr")),
        1,
    );
    let tmp = tempfile::tempdir().unwrap();
    for d in ["data", "configs"] {
        std::os::unix::fs::symlink(root().join(d), tmp.path().join(d)).unwrap();
    }
    let out = Command::new("bash")
        .args(["-e", "-c", &script])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the tour failed:\n{stderr}");
    let runs = tmp.path().join("runs");
    for f in [
        "a/checkpoints/step-6/config.json",
        "a/metrics.jsonl",
        "sft/config.json",
        "a.svg",
    ] {
        assert!(runs.join(f).is_file(), "{f} missing; stderr:\n{stderr}");
    }
    let exp = std::fs::read_to_string(runs.join("exp.jsonl")).unwrap();
    assert_eq!(exp.lines().count(), 16, "2 prompts × 8 completions");
    // Long phases are labelled, so a silent terminal is never mistaken for a hang: the step-0
    // evaluation and the saves.
    for label in [
        "loading the policy from",
        "evaluating step 0 on 20 held-out problems",
        "saving checkpoint step-3",
    ] {
        assert!(stderr.contains(label), "no {label:?} in:\n{stderr}");
    }
}
