//! Extreme sizes and values through the real `rlvr` binary: each is refused at start-up with an
//! error naming its key or flag and the limit, never a panic, an overflow or an abort.
#![cfg(unix)]

mod common;

use common::{rlvr, tokenizer_json};
use std::path::Path;
use std::process::Command;

/// `rlvr train` of a small arithmetic run on `model` with `extra` overrides.
fn train(model: &Path, run: &Path, extra: &[&str]) -> Command {
    let mut c = rlvr();
    c.args(["train", "--no-progress"]);
    let mut sets = vec![
        format!("model.path=\"{}\"", model.display()),
        format!("output.dir=\"{}\"", run.display()),
        "data.task=\"arithmetic\"".into(),
        "data.prompts_per_step=2".into(),
        "rollout.group_size=4".into(),
        "rollout.max_new_tokens=3".into(),
        "train.steps=2".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    for s in sets {
        c.arg("--set").arg(s);
    }
    c
}

#[test]
fn extreme_values_are_errors_naming_the_key_and_the_limit_never_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer.json");
    std::fs::write(&tok, tokenizer_json()).unwrap();
    let model = tmp.path().join("model");
    let out = rlvr()
        .args(["init", "--hidden", "16", "--layers", "1", "--heads", "2"])
        .args(["--kv-heads", "1", "--intermediate", "32", "--tokenizer"])
        .arg(&tok)
        .arg("--out")
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = tmp.path().join("run");
    let init = |extra: &[&str]| {
        let mut c = rlvr();
        c.args(["init", "--tokenizer"])
            .arg(&tok)
            .arg("--out")
            .arg(tmp.path().join("big"))
            .args(extra);
        c
    };
    let with_model = |cmd: &str, extra: &[&str]| {
        let mut c = rlvr();
        c.arg(cmd).arg("--model").arg(&model).args(extra);
        c
    };
    let mut sft = with_model(
        "sft",
        &["--data", "pairs.jsonl", "--batch-size", "100000000000"],
    );
    sft.arg("--out").arg(tmp.path().join("sft"));
    let huge_verifier =
        "data.verifier={ kind = \"external\", command = [\"true\"], timeout_s = 1e300 }";
    // (command, what the error names: the key or flag and the limit)
    let cases: Vec<(Command, &[&str])> = vec![
        (
            train(&model, &run, &["rollout.group_size=1000000000000000000"]),
            &["rollout.group_size = 1000000000000000000", "at most 4096"],
        ),
        (
            train(&model, &run, &["sync.offset=1000000000000000000"]),
            &[
                "sync.offset = 1000000000000000000",
                "at most train.steps = 2",
            ],
        ),
        (
            train(&model, &run, &["sync.offset=3"]),
            &["sync.offset = 3", "at most train.steps = 2"],
        ),
        (
            train(&model, &run, &[huge_verifier]),
            &["data.verifier.timeout_s = 1e300", "(0, 1e6]"],
        ),
        (
            train(&model, &run, &["data.prompts_per_step=1000000000000"]),
            &["data.prompts_per_step = 1000000000000", "at most 1048576"],
        ),
        (
            train(&model, &run, &["data.prompts_per_step=500000"]),
            &[
                "data.prompts_per_step × rollout.group_size",
                "at most 1048576",
            ],
        ),
        (
            train(&model, &run, &["eval.samples=1000000"]),
            &["eval.samples = 1000000", "at most 4096"],
        ),
        (
            train(&model, &run, &["model.lora_rank=1000000"]),
            &["model.lora_rank = 1000000", "at most 65536"],
        ),
        (
            // Above the model's width (16), found once config.json is read.
            train(&model, &run, &["model.lora_rank=17"]),
            &["model.lora_rank = 17", "at most the hidden size", ", 16"],
        ),
        (
            train(&model, &run, &["distributed.timeout_s=1e300"]),
            &["distributed.timeout_s = 1e300", "[0, 1e6]"],
        ),
        (
            train(
                &model,
                &run,
                &["reward.format={ bonus = nan, penalty = -0.1 }"],
            ),
            &["reward.format.bonus = NaN", "a finite number"],
        ),
        (
            train(&model, &run, &["eval.limit=0"]),
            &["eval.limit = 0", "≥ 1"],
        ),
        (
            with_model("generate", &["--prompt", "1+1=", "-n", "1000000000"]),
            &["-n 1000000000", "1 to 4096"],
        ),
        (
            with_model("eval", &["--task", "arithmetic", "--n", "1000000000"]),
            &["--n 1000000000", "at most 4096"],
        ),
        (sft, &["--batch-size 100000000000", "at most 1048576"]),
        (
            init(&["--hidden", "100000", "--layers", "1000000"]),
            &["--hidden 100000", "--layers 1000000", "at most 1e11"],
        ),
        (
            init(&["--vocab-size", "1000000000000"]),
            &["--vocab-size 1000000000000", "at most 1e11"],
        ),
        (
            init(&["--hidden", "16", "--vocab-size", "18446744073709551615"]),
            &["--vocab-size 18446744073709551615", "at most 1e11"],
        ),
    ];
    for (mut cmd, names) in cases {
        let shown = format!("{:?}", cmd.get_args().collect::<Vec<_>>());
        let t0 = std::time::Instant::now();
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(c) if c != 0),
            "{shown}: exit {:?} (a signal when None)\n{err}",
            out.status
        );
        for bad in ["panicked", "overflow", "abort"] {
            assert!(!err.contains(bad), "{shown}: `{bad}` in\n{err}");
        }
        for n in names {
            assert!(err.contains(n), "{shown}: `{n}` not in\n{err}");
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "{shown}: took {:?}",
            t0.elapsed()
        );
        assert!(!run.join("metrics.jsonl").exists(), "{shown}: trained");
        assert!(!tmp.path().join("big").exists(), "{shown}: wrote a model");
    }
}
