//! docs/external-verifier.md stays true, so a user who copies it gets a working verifier: its example `score.py`, run by
//! [`ExternalVerifier`] exactly as the guide's configuration does, gives the outputs the guide shows.
#![cfg(unix)]

use std::path::PathBuf;
use std::time::Duration;

use rlvr_reward::external::ExternalVerifier;
use rlvr_reward::{Sample, Verifier};

fn guide() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/external-verifier.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The body of the first fenced block in `text` that opens with ```` ```lang ````.
fn block(text: &str, lang: &str) -> String {
    let open = format!("```{lang}\n");
    let start = text.find(&open).expect("no such block") + open.len();
    let len = text[start..].find("```").expect("unclosed block");
    text[start..start + len].to_string()
}

#[test]
fn the_guides_example_verifier_scores_as_the_guide_says() {
    let text = guide();
    // The protocol's field names as the guide states them.
    for key in [
        r#""prompt""#,
        r#""completion""#,
        r#""reference""#,
        r#""reward""#,
    ] {
        assert!(text.contains(key), "the guide does not name {key}");
    }
    let python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !python {
        panic!("python3 is needed by this test and was not found (Debian: apt-get install python3); a test does not pass without running");
    }
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("score.py");
    std::fs::write(&script, block(&text, "python")).unwrap();
    let v = ExternalVerifier {
        command: vec!["python3".into(), script.display().to_string()],
        timeout: Duration::from_secs(60),
        env: Vec::new(),
        max_stdout: rlvr_reward::external::MAX_STDOUT_BYTES,
    };
    let samples = [
        Sample {
            prompt: "2+2=",
            completion: "4",
            reference: "4",
            ..Default::default()
        },
        Sample {
            prompt: "2+3=",
            completion: "6",
            reference: "5",
            ..Default::default()
        },
    ];
    let got = v.score_batch(&samples).unwrap();
    // The guide's "Try it by hand" output lines.
    let shown: Vec<serde_json::Value> = block(&text, "sh")
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(shown.len(), 2);
    for (s, want) in got.iter().zip(&shown) {
        assert_eq!(s.reward, want["reward"].as_f64().unwrap());
        assert_eq!(s.correct, want["correct"].as_bool().unwrap());
        assert_eq!(s.extracted.as_deref(), want["extracted"].as_str());
        assert_eq!(s.gold.as_deref(), want["gold"].as_str());
    }
}
