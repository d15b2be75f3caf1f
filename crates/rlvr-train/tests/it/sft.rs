//! `rlvr sft`: token-mean cross-entropy over completion tokens (EOS included), checked by hand, and
//! the loss goes down.

use crate::common;

use candle_core::{DType, Device};
use clap::Parser;
use rlvr_model::checkpoint::Policy;
use rlvr_train::cli::{run_sft, SftArgs};
use rlvr_train::score::completion_logprobs;
use rlvr_train::sft::read_pairs;
use rlvr_train::store::experience::Experience;

#[derive(Parser)]
struct W {
    #[command(flatten)]
    a: SftArgs,
}

fn args(extra: &[&str]) -> SftArgs {
    let mut v = vec!["x"];
    v.extend_from_slice(extra);
    W::parse_from(v).a
}

#[test]
fn sft_loss_is_token_mean_ce_with_eos_and_decreases() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 6);
    let data = tmp.path().join("pairs.jsonl");
    let mut lines = Vec::new();
    for a in 0..4 {
        for b in 0..4 {
            lines.push(serde_json::json!({"prompt": format!("{a}+{b}="), "completion": format!("{}", a + b)}).to_string());
        }
    }
    std::fs::write(&data, lines.join("\n")).unwrap();
    let out = tmp.path().join("sft");
    let (m, d, o) = (
        model.to_str().unwrap(),
        data.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let a = args(&[
        "--model",
        m,
        "--data",
        d,
        "--out",
        o,
        "--batch-size",
        "16",
        "--micro-batch-size",
        "5",
        "--steps",
        "40",
        "--lr",
        "1e-2",
        "--seed",
        "1",
    ]);
    let mut buf = Vec::new();
    run_sft(&a, &mut buf).unwrap();

    // Hand value of the first step's loss: all 16 pairs, −Σℓ/Σn over completion + EOS tokens.
    let p = Policy::load(&model, DType::F32, &Device::Cpu).unwrap();
    let pairs = read_pairs(&data, &p.tokenizer, false, None).unwrap();
    assert!(pairs
        .iter()
        .all(|x| x.completion.last() == p.tokenizer.eos_ids.first()));
    let exps: Vec<Experience> = pairs
        .iter()
        .map(|x| Experience {
            prompt_ids: x.prompt.clone(),
            completion_ids: x.completion.clone(),
            behaviour_logprobs: vec![0.0; x.completion.len()],
            reward: None,
            correct: None,
            group_id: "g".into(),
            version: None,
            truncated: false,
            components: Vec::new(),
            ..Default::default()
        })
        .collect();
    let rows: Vec<usize> = (0..exps.len()).collect();
    let lp = completion_logprobs(&p.model, &exps, &rows, 1.0, p.tokenizer.pad_id, false).unwrap();
    let n: usize = lp.iter().map(|r| r.len()).sum();
    assert_eq!(n, 16 * 2, "one answer digit + EOS per pair");
    let want = -lp.iter().flatten().map(|&x| x as f64).sum::<f64>() / n as f64;
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let ls: Vec<f64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert!(
        (ls[0] - want).abs() < 1e-5,
        "step-1 loss {} vs hand value {want}",
        ls[0]
    );
    assert!(
        ls[39] < 0.5 * ls[0],
        "loss did not go down: {} -> {}",
        ls[0],
        ls[39]
    );
    // The output is a loadable model directory.
    Policy::load(&out, DType::F32, &Device::Cpu).unwrap();

    // The micro-batch size does not change the result.
    let out2 = tmp.path().join("sft2");
    let a = args(&[
        "--model",
        m,
        "--data",
        d,
        "--out",
        out2.to_str().unwrap(),
        "--batch-size",
        "16",
        "--micro-batch-size",
        "16",
        "--steps",
        "3",
        "--lr",
        "1e-2",
        "--seed",
        "1",
    ]);
    run_sft(&a, &mut buf).unwrap();
    let text2 = std::fs::read_to_string(out2.join("metrics.jsonl")).unwrap();
    let l2: Vec<f64> = text2
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect();
    for k in 0..3 {
        assert!(
            (l2[k] - ls[k]).abs() < 1e-5,
            "step {k}: {} vs {}",
            l2[k],
            ls[k]
        );
    }
}

#[test]
fn sft_bad_line_names_file_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 6);
    let p = Policy::load(&model, DType::F32, &Device::Cpu).unwrap();
    let data = tmp.path().join("pairs.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n{\"prompt\": \"1+2=\"}\n",
    )
    .unwrap();
    let err = read_pairs(&data, &p.tokenizer, false, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("pairs.jsonl:2") && err.contains("`completion`"),
        "{err}"
    );
}

/// Without `--data` the pairs come from the config's train split; `--eval-every` writes `eval/*` and
/// `--stop-at-accuracy` stops at the first evaluation that reaches it.
#[test]
fn sft_from_task_with_eval_and_early_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 6);
    let out = tmp.path().join("sft");
    let mut argv: Vec<String> = vec![
        "--model".into(),
        model.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--steps".into(),
        "10".into(),
        "--batch-size".into(),
        "8".into(),
        "--eval-every".into(),
        "2".into(),
        "--stop-at-accuracy".into(),
        "0".into(),
    ];
    for s in [
        "data.task=\"arithmetic\"",
        "data.arithmetic.min_digits=1",
        "data.arithmetic.max_digits=1",
        "data.arithmetic.train_size=32",
        "data.arithmetic.test_size=4",
        "rollout.max_new_tokens=3",
    ] {
        argv.extend(["--set".to_string(), s.to_string()]);
    }
    let a = args(&argv.iter().map(String::as_str).collect::<Vec<_>>());
    let mut buf = Vec::new();
    run_sft(&a, &mut buf).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    assert_eq!(v["steps"], 2, "stopped at the first evaluation");
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[1]["eval/accuracy"].is_number() && lines[0].get("eval/accuracy").is_none());
    assert_eq!(lines[1]["eval/n"], 4);
    assert!(out.join("eval.jsonl").exists() && out.join("model.safetensors").exists());
}

/// Issue 49 item 6a for `rlvr sft`: ranks launched with other flags (here `--lr`, then another
/// `--data` file; a file of the same name with other contents differs in `inputs.--data`, its
/// size and CRC-32C) would train another problem silently; every rank stops before `--out` is
/// made, rank 1 naming the flag and both values. The same flags on both ranks run.
#[test]
fn sft_ranks_with_different_flags_or_data_are_refused_naming_them() {
    use rlvr_dist::comm::Communicator;
    use rlvr_dist::{SharedComm, ThreadComm};
    use rlvr_train::job::Job;
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 6);
    let write = |name: &str, n: u32| {
        let p = tmp.path().join(name);
        let lines: Vec<String> = (0..n)
            .map(|a| {
                serde_json::json!({"prompt": format!("{a}+1="), "completion": format!("{}", a + 1)})
                    .to_string()
            })
            .collect();
        std::fs::write(&p, lines.join("\n")).unwrap();
        p
    };
    let (data, other) = (write("pairs.jsonl", 8), write("other.jsonl", 7));
    let out = tmp.path().join("sft");
    let flags = |data: &std::path::Path, lr: &str| {
        args(&[
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--steps",
            "1",
            "--batch-size",
            "4",
            "--lr",
            lr,
            "--no-progress",
        ])
    };
    let raw = rlvr_train::config::RawConfig::default();
    let base = flags(&data, "1e-3");
    for (rank1, want) in [
        (
            flags(&data, "2e-3"),
            "--lr is 0.002 here and 0.001 on rank 0",
        ),
        (flags(&other, "1e-3"), "--data is \""),
    ] {
        let errs = ThreadComm::run(2, |c| {
            let a = if c.rank() == 0 { &base } else { &rank1 };
            let mut sink = Vec::new();
            rlvr_train::cli::run_sft_on(a, &mut sink, &raw, Job::over(SharedComm::new(Box::new(c))))
                .map_err(|e| format!("{e:#}"))
        });
        let e1 = errs[1].as_ref().unwrap_err();
        assert!(
            e1.contains("rank 1 does not run rank 0's sft flags, config and inputs: ")
                && e1.contains(want),
            "{e1}"
        );
        let e0 = errs[0].as_ref().unwrap_err();
        assert!(
            e0.contains("another rank does not run this sft flags"),
            "{e0}"
        );
        assert!(!out.exists(), "--out was made");
    }
    let ok = ThreadComm::run(2, |c| {
        let mut sink = Vec::new();
        rlvr_train::cli::run_sft_on(
            &base,
            &mut sink,
            &raw,
            Job::over(SharedComm::new(Box::new(c))),
        )
        .map_err(|e| format!("{e:#}"))
    });
    assert!(ok.iter().all(Result::is_ok), "{ok:?}");
}

/// A PID that no process holds: a child that exited and was waited for.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A `rlvr sft` killed inside an atomic write leaves `.NAME.tmp-PID` in `--out` (as large as the
/// weights for model.safetensors); the next `rlvr sft` into it removes them (it refused the
/// directory as not empty), and loads nothing from them. The same for a training run's directory and its unfinished
/// checkpoint folders (`checkpoints/.tmp-step-N`) on `--resume`.
#[test]
fn temporaries_left_by_a_killed_writer_are_removed_on_the_next_start() {
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 6);
    let data = tmp.path().join("pairs.jsonl");
    std::fs::write(&data, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n").unwrap();
    let out = tmp.path().join("sft");
    std::fs::create_dir_all(&out).unwrap();
    let dead = dead_pid();
    let left = [
        format!(".tokenizer.json.tmp-{dead}"),
        format!(".model.safetensors.tmp-{dead}"),
    ];
    for n in &left {
        // Not even JSON or safetensors: a leftover read as real would fail the load.
        std::fs::write(out.join(n), "half").unwrap();
    }
    let a = args(&[
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "1",
    ]);
    run_sft(&a, &mut Vec::new()).unwrap();
    for n in &left {
        assert!(!out.join(n).exists(), "{n} left in {}", out.display());
    }
    Policy::load(&out, DType::F32, &Device::Cpu).unwrap();

    // A training run: a temporary in the run directory and an unfinished checkpoint.
    use rlvr_train::config::{RawConfig, ResolvedConfig};
    use rlvr_train::run::{train, RunOptions};
    let run = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend(["train.steps=2".to_string(), "train.save_every=1".into()]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    std::fs::remove_dir_all(run.join("checkpoints/step-2")).unwrap();
    std::fs::write(run.join("checkpoints/latest"), "step-1\n").unwrap();
    let unfinished = run.join("checkpoints/.tmp-step-2");
    std::fs::create_dir_all(unfinished.join("trainer_state")).unwrap();
    std::fs::write(unfinished.join("model.safetensors"), "half").unwrap();
    let stale = run.join(format!(".run.json.tmp-{dead}"));
    std::fs::write(&stale, "half").unwrap();
    let mut cfg = ResolvedConfig::from_run_dir(&run, &[]).unwrap();
    cfg.raw.output.dir = run.clone();
    let opts = RunOptions {
        resume: true,
        ..Default::default()
    };
    assert_eq!(train(&cfg, &opts).unwrap().steps, 2);
    assert!(!stale.exists() && !unfinished.exists());
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains(&format!("removed {}", unfinished.display())),
        "{log}"
    );
}

/// A tokenizer directory with Qwen2.5's tokenizer, chat template and EOS (`<|im_end|>`), the
/// files of a Qwen2.5-Instruct checkpoint that SFT reads.
fn qwen_chat_tokenizer(dir: &std::path::Path) -> rlvr_model::TokenizerBundle {
    let repo = common::repo();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        repo.join("data/tokenizers/qwen2.5/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::copy(
        repo.join("data/chat_templates/qwen2_5.jinja"),
        dir.join("chat_template.jinja"),
    )
    .unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}"#,
    )
    .unwrap();
    rlvr_model::TokenizerBundle::load(dir).unwrap()
}

/// TRL's conversational SFT rows (`{"prompt": [...], "completion": [...]}` and `{"messages":
/// [...]}`) are read: the prompt is the template's rendering with the generation prompt, the
/// completion the assistant's text and the end-of-turn token `<|im_end|>` (151645), nothing after
/// it, nothing appended; a string on one side is one message.
#[test]
fn sft_reads_trl_conversational_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = qwen_chat_tokenizer(&tmp.path().join("tok"));
    assert_eq!(tok.eos_ids, [151645]);
    let data = tmp.path().join("chat.jsonl");
    let rows = [
        r#"{"prompt": [{"role": "user", "content": "What is 2+2?"}], "completion": [{"role": "assistant", "content": "4"}]}"#,
        r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]}"#,
        r#"{"prompt": [{"role": "user", "content": "What is 2+2?"}], "completion": "4"}"#,
    ];
    std::fs::write(&data, rows.join("\n")).unwrap();
    let pairs = read_pairs(&data, &tok, false, None).unwrap();
    assert_eq!(pairs.len(), 3);
    let qwen_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    let user_prompt = format!(
        "<|im_start|>system\n{qwen_system}<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let four = tok.encode("4", false).unwrap();
    assert_eq!(four.len(), 1);
    let completion = vec![four[0], 151645];
    assert_eq!(pairs[0].prompt, tok.encode(&user_prompt, false).unwrap());
    assert_eq!(pairs[0].completion, completion);
    let system_prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n\
                         What is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(pairs[1].prompt, tok.encode(system_prompt, false).unwrap());
    assert_eq!(pairs[1].completion, completion);
    assert_eq!(pairs[2], pairs[0]);
    // The plain pair with --chat gives the same tokens but for the EOS appended after "4".
    let plain = tmp.path().join("plain.jsonl");
    std::fs::write(&plain, r#"{"prompt": "What is 2+2?", "completion": "4"}"#).unwrap();
    let p = read_pairs(&plain, &tok, true, None).unwrap();
    assert_eq!(p[0].prompt, pairs[0].prompt);
    assert_eq!(p[0].completion, completion);
}

/// A malformed conversational row is an error naming the file, the line and the message's field.
#[test]
fn sft_conversational_row_errors_name_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = qwen_chat_tokenizer(&tmp.path().join("tok"));
    let err = |line: &str| {
        let data = tmp.path().join("bad.jsonl");
        let good = r#"{"prompt": "1+1=", "completion": "2"}"#;
        std::fs::write(&data, format!("{good}\n{line}\n")).unwrap();
        read_pairs(&data, &tok, false, None)
            .unwrap_err()
            .to_string()
    };
    let e = err(
        r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "hi"}]}"#,
    );
    assert!(
        e.contains("bad.jsonl:2: field `messages[1].role`") && e.contains("assistant"),
        "{e}"
    );
    let e = err(r#"{"messages": [{"role": "assistant", "content": "4"}]}"#);
    assert!(
        e.contains("bad.jsonl:2: field `messages`") && e.contains("at least one"),
        "{e}"
    );
    let e = err(r#"{"prompt": [{"role": "user", "content": 4}], "completion": "4"}"#);
    assert!(
        e.contains("bad.jsonl:2: field `prompt[0].content` must be a string, found a number"),
        "{e}"
    );
    let e = err(r#"{"prompt": [{"role": "tool", "content": "4"}], "completion": "4"}"#);
    assert!(e.contains("bad.jsonl:2: field `prompt[0].role`"), "{e}");
    let e = err(r#"{"prompt": 4, "completion": "4"}"#);
    assert!(e.contains("bad.jsonl:2: field `prompt` must be a string or a list of chat messages, found a number"), "{e}");
    let e = err(r#"{"question": "1+1=", "answer": "2"}"#);
    assert!(
        e.contains("bad.jsonl:2: field `prompt` is missing") && e.contains("messages"),
        "{e}"
    );
}
