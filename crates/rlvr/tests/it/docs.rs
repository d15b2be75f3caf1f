//! What users are pointed to exists in the repository, so no link or help text sends them nowhere:
//! every relative link of every Markdown file (README.md, CHANGELOG.md, docs/, the crates' READMEs)
//! names a file of the repository and, with an `#anchor`, a heading of it, `rlvr train --help` points to
//! docs/DESIGN.md (which holds the config interface, section 10), and `rlvr reward --help` states
//! the `--input` line format.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `[text](target)` links of `md` outside fenced code blocks whose target is not a URL, as
/// (line, path, anchor): `[x](docs/data.md#chat-prompts)` is (n, "docs/data.md", "chat-prompts"),
/// `[x](#status)` is (n, "", "status").
fn relative_links(md: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in md.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].trim();
            if !target.contains("://") && !target.starts_with("mailto:") {
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                out.push((n + 1, path.to_string(), anchor.to_string()));
            }
        }
    }
    out
}

/// The anchors GitHub gives the headings of `md` (outside fenced code blocks): lower case, only
/// letters, digits, `-` and `_` kept, spaces made `-`, a repeated heading suffixed `-1`, `-2`, ...
fn heading_anchors(md: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(h) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let h = h.trim_start_matches('#');
        if !h.starts_with(' ') {
            continue;
        }
        let slug: String = h
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut k = 0;
        while out.contains(&anchor) {
            k += 1;
            anchor = format!("{slug}-{k}");
        }
        out.push(anchor);
    }
    out
}

/// Every Markdown file of the repository a user may read: READMEs at every level, the docs
/// folders, CHANGELOG.md, ARCHITECTURE.md, BENCHMARKS.md (build outputs, run directories and
/// hidden folders such as virtual environments left out).
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "runs" {
                markdown_files(&p, out);
            }
        } else if name.ends_with(".md") {
            out.push(p);
        }
    }
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rlvr"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "rlvr {args:?}: {}", out.status);
    String::from_utf8(out.stdout).unwrap()
}

/// Every relative link of every Markdown file (README.md, CHANGELOG.md, docs/, configs/, the
/// crates' READMEs and docs) names a file or folder of the repository, and a link's `#anchor` names
/// a heading of the file it points to, so no link sends a reader nowhere after text moves.
#[test]
fn every_relative_link_of_the_markdown_docs_names_a_file_and_heading_of_the_repository() {
    let root = root().canonicalize().unwrap();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    for want in [
        "README.md",
        "CHANGELOG.md",
        "configs/README.md",
        "docs/data.md",
        "docs/lab/README.md",
        "crates/rlvr-vllm/README.md",
    ] {
        assert!(files.contains(&root.join(want)), "{want} not found");
    }
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in &files {
        let dir: &Path = f.parent().unwrap();
        let name = f.strip_prefix(&root).unwrap().display();
        let text = std::fs::read_to_string(f).unwrap();
        for (line, path, anchor) in relative_links(&text) {
            checked += 1;
            let target = if path.is_empty() {
                f.clone()
            } else {
                dir.join(&path)
            };
            if !target.exists() {
                bad.push(format!(
                    "{name}:{line}: links to {path}, which is not in the repository"
                ));
                continue;
            }
            if !anchor.is_empty() && target.extension().is_some_and(|x| x == "md") {
                let anchors = heading_anchors(&std::fs::read_to_string(&target).unwrap());
                if !anchors.contains(&anchor) {
                    bad.push(format!(
                        "{name}:{line}: links to {path}#{anchor}, a heading that file does not have"
                    ));
                }
            }
        }
    }
    // README links docs/DESIGN.md, docs/data.md, docs/lab/README.md and more.
    assert!(checked >= 50, "{checked} links");
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// The link checker's own parts: links in code blocks are not links, anchors are GitHub's.
#[test]
fn the_link_checker_reads_links_and_anchors_as_github_does() {
    let md = "# Limitations (honest)\n```sh\n# not a heading\nx[0](y)\n```\n## Scaling out with vLLM\n\
              ## Scaling out with vLLM\nsee [a](docs/a.md#b), [c](#scaling-out-with-vllm-1) and [d](https://x.org/y)\n";
    assert_eq!(
        heading_anchors(md),
        [
            "limitations-honest",
            "scaling-out-with-vllm",
            "scaling-out-with-vllm-1"
        ]
    );
    assert_eq!(
        relative_links(md),
        [
            (8, "docs/a.md".to_string(), "b".to_string()),
            (8, String::new(), "scaling-out-with-vllm-1".to_string())
        ]
    );
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

/// The README is for the user first: its first code block is exactly the two commands CI and the
/// project rules rely on (`.ci/run` runs the second), and its sections come in the order a new
/// user needs them (what it is, own checkpoint and dataset, configuration, rewards, scaling out,
/// reproducing the papers, limitations) before the reference material.
#[test]
fn the_readme_starts_with_the_two_commands_and_keeps_the_user_first_order() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("```sh\n").expect("a sh block") + 6;
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo run --release -p rlvr -- quickstart",
            "cargo test --workspace --locked"
        ],
        "{block}"
    );
    let headings: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect();
    let order = [
        "Your own checkpoint and dataset",
        "Configuration",
        "Rewards",
        "Multi-turn episodes and tools",
        "Scaling out",
        "Reproducing the papers",
        "Limitations (honest)",
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|h| {
            headings
                .iter()
                .position(|x| x == h)
                .unwrap_or_else(|| panic!("no section {h:?} in {headings:?}"))
        })
        .collect();
    assert_eq!(at, (0..order.len()).collect::<Vec<_>>(), "{headings:?}");
    // Messages of the binary point to this section by name ("how to start one").
    assert!(readme.contains("### Scaling out with vLLM\n"));
    assert!(
        readme[..start].matches("\n## ").count() == 0,
        "a section before the two commands"
    );
}
