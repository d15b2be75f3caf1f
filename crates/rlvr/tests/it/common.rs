//! Helpers shared by the tests that run the real `rlvr` binary: the binary itself, the repository's
//! root, a tiny character-level tokenizer and a tiny random checkpoint made with it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `rlvr` binary cargo built for these tests.
pub fn rlvr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rlvr"))
}

/// The repository's root (the shipped configs and data are relative to it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Asserts that the command succeeded, printing `what`, its status and its stderr when not.
pub fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A character-level WordLevel tokenizer (digits, operators, space, newline; `<|endoftext|>`).
pub fn tokenizer_json() -> String {
    let chars = "0123456789+-*= #\n";
    let mut vocab = serde_json::Map::new();
    for (i, ch) in chars.chars().enumerate() {
        vocab.insert(ch.to_string(), i.into());
    }
    let unk = chars.chars().count();
    vocab.insert("<unk>".into(), unk.into());
    vocab.insert("<|endoftext|>".into(), (unk + 1).into());
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": unk + 1, "content": "<|endoftext|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?s)."}, "behavior": "Isolated", "invert": false},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}

/// `rlvr init` of a tiny model (1 layer, width 16) with the char tokenizer into `dir/model`.
pub fn tiny_model(dir: &Path) -> PathBuf {
    let tok = dir.join("tokenizer.json");
    std::fs::write(&tok, tokenizer_json()).unwrap();
    let model = dir.join("model");
    let out = rlvr()
        .args(["init", "--hidden", "16", "--layers", "1", "--heads", "2"])
        .args(["--kv-heads", "1", "--intermediate", "32"])
        .args(["--max-position-embeddings", "128", "--tokenizer"])
        .arg(&tok)
        .arg("--out")
        .arg(&model)
        .output()
        .unwrap();
    ok(&out, "init");
    model
}

/// Whether process `pid` is alive (a zombie, killed but not yet reaped, counts as gone; Linux).
pub fn alive(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: `PID (COMM) S ...`.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Waits up to `secs` seconds for every process of `pids` to be gone; returns those still alive
/// then, after killing them (a test does not leave behind the processes it started).
pub fn left_after(pids: &[String], secs: u64) -> Vec<String> {
    let t0 = std::time::Instant::now();
    while pids.iter().any(|p| alive(p)) && t0.elapsed() < std::time::Duration::from_secs(secs) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left: Vec<String> = pids.iter().filter(|p| alive(p)).cloned().collect();
    for pid in &left {
        let _ = Command::new("kill").args(["-9", pid.as_str()]).status();
    }
    left
}
