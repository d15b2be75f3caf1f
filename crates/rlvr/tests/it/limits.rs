//! Extreme sizes and values through the real `rlvr` binary: each is refused at start-up with an
//! error naming its key or flag and the limit, never a panic, an overflow or an abort.
#![cfg(unix)]

use crate::common::{rlvr, tokenizer_json};
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

/// `rlvr init` of a tiny model (width 16, `layers` layers, 32 positions) with the character
/// tokenizer (vocab_size 64) into `dir/name`.
fn init_model(dir: &Path, name: &str, layers: &str) -> std::path::PathBuf {
    let tok = dir.join("tokenizer.json");
    std::fs::write(&tok, tokenizer_json()).unwrap();
    let model = dir.join(name);
    let out = rlvr()
        .args(["init", "--hidden", "16", "--layers", layers, "--heads", "2"])
        .args(["--kv-heads", "1", "--intermediate", "32"])
        .args(["--max-position-embeddings", "32", "--tokenizer"])
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
    model
}

/// A copy of model directory `from` at `to` with config.json's `key` set to `value`.
fn with_config_field(
    from: &Path,
    to: &Path,
    key: &str,
    value: serde_json::Value,
) -> std::path::PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    let cfg = to.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(&cfg, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    to.to_path_buf()
}

/// The stderr of `cmd`, which must fail (exit code 1, no panic) within 60 s.
fn fails(mut cmd: Command) -> String {
    let shown = format!("{:?}", cmd.get_args().collect::<Vec<_>>());
    let t0 = std::time::Instant::now();
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{shown}\n{err}");
    assert!(!err.contains("panicked"), "{shown}\n{err}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(60),
        "{shown}: took {:?}",
        t0.elapsed()
    );
    err
}

#[test]
fn model_files_that_would_fail_late_are_refused_at_start_up_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let model = init_model(tmp.path(), "model", "2");
    let run = tmp.path().join("run");
    let cfg_of = |m: &Path| m.join("config.json").display().to_string();
    // config.json fields that make every activation NaN (they used to surface as NaN weights or
    // logits at the first step), refused as config.json is read.
    let cases = [
        ("rms_norm_eps", serde_json::json!(-1), "-1"),
        ("rms_norm_eps", serde_json::json!(0.0), "0.0"),
        ("rope_theta", serde_json::json!(0), "0"),
        ("rope_theta", serde_json::json!(-10000.0), "-10000.0"),
        ("rope_theta", serde_json::json!("big"), "\"big\""),
    ];
    for (i, (key, value, shown)) in cases.into_iter().enumerate() {
        let m = with_config_field(&model, &tmp.path().join(format!("bad{i}")), key, value);
        let err = fails(train(&m, &run, &[]));
        let want = format!(
            "{}: field `{key}` = {shown} is out of range: expected a finite number > 0",
            cfg_of(&m)
        );
        assert!(err.contains(&want), "{want}\nnot in\n{err}");
        assert!(!run.join("metrics.jsonl").exists());
    }
    // A tokenizer with ids beyond the model's vocabulary (another model's tokenizer.json):
    // refused at load naming both files (it failed at the first prompt it encoded).
    let other = with_config_field(
        &model,
        &tmp.path().join("other_tok"),
        "vocab_size",
        64.into(),
    );
    let qwen =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/qwen2.5/tokenizer.json");
    std::fs::copy(&qwen, other.join("tokenizer.json")).unwrap();
    let err = fails({
        let mut c = rlvr();
        c.args([
            "generate",
            "--prompt",
            "1+1=",
            "-n",
            "1",
            "--max-new-tokens",
            "2",
            "--model",
        ])
        .arg(&other);
        c
    });
    let want = format!("{}'s `vocab_size` is 64: ids from 64 up", cfg_of(&other));
    assert!(err.contains(&want), "{want}\nnot in\n{err}");
    assert!(
        err.contains(&format!(
            "{}: tokenizer error: token ",
            other.join("tokenizer.json").display()
        )),
        "{err}"
    );
    // A prompt with no room for rollout.max_new_tokens within the model's 32 positions: refused
    // at start-up naming the key and both numbers (it failed when the step sampled it).
    let err = fails(train(&model, &run, &["rollout.max_new_tokens=30"]));
    for want in [
        "[data] Train split: generated:train:",
        "+ rollout.max_new_tokens = 30 is more than the model's max_position_embeddings = 32",
        "set rollout.max_new_tokens to at most",
    ] {
        assert!(err.contains(want), "{want}\nnot in\n{err}");
    }
    assert!(!run.join("metrics.jsonl").exists());
    // The same for the held-out split with eval.max_new_tokens.
    let err = fails(train(
        &model,
        &run,
        &["train.eval_every=1", "eval.max_new_tokens=31"],
    ));
    for want in [
        "[data] Test split: generated:test:",
        "+ eval.max_new_tokens = 31 is more than the model's max_position_embeddings = 32",
    ] {
        assert!(err.contains(want), "{want}\nnot in\n{err}");
    }
    assert!(!run.join("metrics.jsonl").exists());
}

#[test]
fn a_config_json_that_disagrees_with_the_weights_is_refused_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let model = init_model(tmp.path(), "model", "2");
    let cfg_of = |m: &Path| m.join("config.json").display().to_string();
    // config.json edited to fewer layers than the weights hold: refused naming the first tensor
    // it has no place for (it loaded silently, dropping layer 1); to more: the first missing one.
    let fewer = with_config_field(
        &model,
        &tmp.path().join("fewer"),
        "num_hidden_layers",
        1.into(),
    );
    let err = fails({
        let mut c = rlvr();
        c.args(["eval", "--task", "arithmetic", "--limit", "2", "--model"])
            .arg(&fewer);
        c
    });
    let want = format!(
        "{}: tensor `model.layers.1.input_layernorm.weight` is not part of the model {} describes \
         (12 such tensors in all)",
        fewer.join("model.safetensors").display(),
        cfg_of(&fewer)
    );
    assert!(err.contains(&want), "{want}\nnot in\n{err}");
    let more = with_config_field(
        &model,
        &tmp.path().join("more"),
        "num_hidden_layers",
        3.into(),
    );
    let err = fails({
        let mut c = rlvr();
        c.args(["eval", "--task", "arithmetic", "--limit", "2", "--model"])
            .arg(&more);
        c
    });
    let want = format!(
        "{}: missing tensor `model.layers.2.",
        more.join("model.safetensors").display()
    );
    assert!(err.contains(&want), "{want}\nnot in\n{err}");
}

#[test]
fn a_300_digit_value_is_not_echoed_in_full() {
    let digits = format!("1{}", "0".repeat(299));
    let out = rlvr()
        .args(["train", "--no-progress", "--set"])
        .arg(format!("train.steps={digits}"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("train.steps"), "{err}");
    assert!(!err.contains(&digits[..40]), "{err}");
    assert!(err.contains("100000000000… (300 digits)"), "{err}");
}
