//! Real input end to end, so that the shipped config and data work together: a tiny random Qwen2 with the real Qwen2.5 tokenizer is
//! trained for 3 steps with the shipped GSM8K off-policy GRPO config on real GSM8K prompts rendered
//! by the chat template; the run writes metrics and a checkpoint that `rlvr eval` loads.
//!
//! The training run starts in a directory outside the repository: the config's `../data/...`
//! paths are relative to the config file, not to where the run starts. The config's device and
//! dtype are `auto`: on this CPU build the run computes on the CPU in f32 with only size
//! overrides, and says so once at start.

use crate::common::repo_root;
use std::path::Path;
use std::process::{Command, Output};

const CONFIG: &str = "configs/gsm8k_off_policy_grpo_qwen2.5-0.5b.toml";

fn rlvr(args: &[&str]) -> Output {
    rlvr_in(&repo_root(), args)
}

/// `rlvr ARGS` run in `cwd`, which must succeed.
fn rlvr_in(cwd: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_rlvr"))
        .current_dir(cwd)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rlvr {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn gsm8k_off_policy_grpo_on_real_prompts_then_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    let run = tmp.path().join("run");
    let (model_s, run_s) = (model.to_str().unwrap(), run.to_str().unwrap());
    rlvr(&[
        "init",
        "--arch",
        "qwen2",
        "--hidden",
        "64",
        "--layers",
        "2",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--intermediate",
        "128",
        "--tokenizer",
        "data/tokenizers/qwen2.5/tokenizer.json",
        "--out",
        model_s,
    ]);
    let set_model = format!("model.path={model_s}");
    let set_out = format!("output.dir={run_s}");
    let config = repo_root().join(CONFIG);
    let out = rlvr_in(
        tmp.path(),
        &[
            "train",
            "--config",
            config.to_str().unwrap(),
            "--set",
            &set_model,
            "--set",
            "train.steps=3",
            "--set",
            "data.prompts_per_step=2",
            "--set",
            "rollout.group_size=2",
            "--set",
            "rollout.max_new_tokens=16",
            "--set",
            &set_out,
            "--set",
            "eval.limit=4",
            "--no-progress",
        ],
    );
    // `auto` said once, at start.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = if cfg!(feature = "cuda") {
        "model.device = \"auto\" is "
    } else {
        "model.device = \"auto\" is cpu (this rlvr was built without CUDA); model.dtype = \"auto\" \
         is f32 on the CPU"
    };
    assert_eq!(
        stderr.lines().filter(|l| l.contains(said)).count(),
        1,
        "{said}:\n{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["steps"], 3, "{summary}");

    // Metrics: the step-0 evaluation, then one line per step with the DESIGN.md section 10 keys.
    let m = lines(&run.join("metrics.jsonl"));
    let steps: Vec<u64> = m.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [0, 1, 2, 3]);
    for l in &m[1..] {
        for k in [
            "loss",
            "reward/mean",
            "accuracy",
            "staleness/max",
            "grad_norm",
            "lr",
        ] {
            assert!(l.get(k).is_some(), "{k} missing: {l}");
        }
        // sync.interval = 4: steps 1..3 are all sampled by version 0.
        assert_eq!(
            l["staleness/max"].as_f64(),
            Some(l["step"].as_f64().unwrap() - 1.0)
        );
    }
    // Real GSM8K questions rendered by the Qwen2.5 chat template.
    let r = lines(&run.join("rollouts.jsonl"));
    assert!(!r.is_empty());
    for l in &r {
        let p = l["prompt"].as_str().unwrap();
        assert!(p.contains("<|im_start|>user\n"), "{p}");
        assert!(p.trim_end().ends_with("<|im_start|>assistant"), "{p}");
        assert!(p.contains("####"), "{p}");
    }
    let cfg = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(cfg.contains("preset = \"off_policy_grpo\""), "{cfg}");
    // What auto chose is recorded, and the data paths are absolute.
    if !cfg!(feature = "cuda") {
        let lines: Vec<&str> = cfg.lines().collect();
        assert!(
            lines.contains(&"dtype = \"f32\"") && lines.contains(&"device = \"cpu\""),
            "{cfg}"
        );
    }
    let train = repo_root().join("data/gsm8k/train.jsonl");
    assert!(
        cfg.contains(&format!("train = \"{}\"", train.display())),
        "{cfg}"
    );

    // The last checkpoint is a model directory `rlvr eval` loads.
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let ckpt = run.join("checkpoints").join(latest.trim());
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(ckpt.join(f).exists(), "{f} missing in {}", ckpt.display());
    }
    let out = rlvr(&[
        "eval",
        "--model",
        ckpt.to_str().unwrap(),
        "--config",
        CONFIG,
        "--limit",
        "3",
        "--max-new-tokens",
        "8",
    ]);
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["task"], "gsm8k", "{e}");
    assert_eq!(e["n"], 3, "{e}");
    assert!(
        (0.0..=1.0).contains(&e["accuracy"].as_f64().unwrap()),
        "{e}"
    );
}
