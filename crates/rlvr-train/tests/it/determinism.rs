//! Runs of one config are bit-identical whatever the thread count, so a result can be reproduced
//! on a machine with another number of cores: the same
//! 12-step RL run (a small model with the Qwen2.5 tokenizer and its 151936-token vocabulary,
//! sync interval 4) in child processes with RAYON_NUM_THREADS=2 and 4 writes the same
//! metrics.jsonl, every value equal bit for bit except the timings.
//!
//! The vocabulary matters: the fused lm_head splits it into 594 chunks, so an order of summation
//! that depends on work stealing (a rayon fold/reduce) shows up; a tiny vocabulary fits one chunk.
//! Each run is a child process because rayon's global pool (and candle's thread count) are fixed
//! at start from RAYON_NUM_THREADS. A second pair runs multi-turn episodes (the tiny character
//! model on the `retry` environment), whose `env/*` metrics, the per-turn ones included, must
//! agree too.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{DType, Device};
use rlvr_model::checkpoint::{tokenizer_for_init, write_tokenizer_files};
use rlvr_model::{Model, ModelConfig};
use rlvr_train::config::RawConfig;
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::{read_metrics, TIME_KEYS};

/// Set in a child: `MODEL_DIR|RUN_DIR`.
const CHILD_ENV: &str = "RLVR_DETERMINISM_CHILD";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A random Qwen2-shaped checkpoint (2 layers, width 64) with the Qwen2.5 tokenizer.
fn qwen_vocab_model(dir: &Path) -> PathBuf {
    let tok = tokenizer_for_init(&repo().join("data/tokenizers/qwen2.5/tokenizer.json")).unwrap();
    let config = ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": true,
            "eos_token_id": tok.eos_ids[0]}),
        "inline".as_ref(),
    )
    .unwrap();
    let model = Model::random(config, 0.02, 7, DType::F32, &Device::Cpu).unwrap();
    let out = dir.join("model");
    model.save(&out, DType::F32).unwrap();
    write_tokenizer_files(&out, &tok).unwrap();
    out
}

/// The run: GSM8K questions as plain prompts, 2 prompts × 4 completions of up to 8 tokens per
/// step, 12 steps, the explorer synced every 4 steps, AsymRE with an entropy bonus.
fn sets(model: &Path, run: &Path) -> Vec<String> {
    let train = repo().join("data/gsm8k/train.jsonl");
    vec![
        format!("model.path=\"{}\"", model.display()),
        format!("output.dir=\"{}\"", run.display()),
        "model.dtype=\"f32\"".into(),
        "model.device=\"cpu\"".into(),
        "data.task=\"gsm8k\"".into(),
        format!("data.train=\"{}\"", train.display()),
        "data.template=\"{question}\"".into(),
        "data.prompts_per_step=2".into(),
        "data.seed=3".into(),
        "rollout.group_size=4".into(),
        "rollout.max_new_tokens=8".into(),
        "rollout.temperature=1.0".into(),
        "sync.interval=4".into(),
        "train.steps=12".into(),
        "train.lr=1e-3".into(),
        "train.eval_every=0".into(),
        "train.skip_zero_gradient_rows=false".into(),
        // Random weights earn no reward, so every group has zero variance: AsymRE's −τ·ℓ term
        // and an entropy bonus still give every token a gradient (through g_ℓ and g_H).
        "algorithm.preset=\"asymre\"".into(),
        "algorithm.entropy_coef=0.01".into(),
    ]
}

/// The child's work: one run, when the parent asked for it (a no-op otherwise).
#[test]
fn determinism_child() {
    let Ok(arg) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (model, run) = arg.split_once('|').expect("MODEL|RUN");
    let cfg = RawConfig::load(None, &sets(Path::new(model), Path::new(run)))
        .unwrap()
        .resolve()
        .unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
}

#[test]
fn runs_are_bit_identical_at_2_and_4_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let model = qwen_vocab_model(tmp.path());
    let mut runs = Vec::new();
    for threads in [2, 4] {
        let rd = tmp.path().join(format!("run-{threads}"));
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "determinism::determinism_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RAYON_NUM_THREADS", threads.to_string())
            .env(CHILD_ENV, format!("{}|{}", model.display(), rd.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child at {threads} threads failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        runs.push(read_metrics(&rd.join("metrics.jsonl")).unwrap());
    }
    assert_eq!(runs[0].len(), 12, "one metrics line per step");
    assert_eq!(runs[0].len(), runs[1].len());
    for (a, b) in runs[0].iter().zip(&runs[1]) {
        assert_eq!(a.len(), b.len(), "same keys at step {:?}", a.get("step"));
        for (k, v) in a {
            if !TIME_KEYS.contains(&k.as_str()) {
                assert_eq!(v, &b[k], "{k} at step {:?}", a.get("step"));
            }
        }
    }
}

/// Set in a multi-turn child: `MODEL_DIR|RUN_DIR|TEMPLATE`.
const CHILD_ENV_MT: &str = "RLVR_DETERMINISM_CHILD_MT";

/// A multi-turn run: the tiny character model (whose end-of-turn token is sampled often, so
/// episodes go past turn 1) on the built-in `retry` environment, 3 turns, 3 steps.
fn multi_turn_sets(model: &Path, run: &Path, template: &Path) -> Vec<String> {
    let mut s = crate::common::arithmetic_sets(model, run);
    s.extend([
        "rollout.max_new_tokens=6".into(),
        "train.steps=3".into(),
        "env.builtin=\"retry\"".into(),
        "env.max_turns=3".into(),
        "env.max_episode_tokens=60".into(),
        format!("env.chat_template=\"{}\"", template.display()),
    ]);
    s
}

/// The multi-turn child's work: one run, when the parent asked for it (a no-op otherwise).
#[test]
fn determinism_child_multi_turn() {
    let Ok(arg) = std::env::var(CHILD_ENV_MT) else {
        return;
    };
    let parts: Vec<&str> = arg.split('|').collect();
    let [model, run, template] = parts[..] else {
        panic!("MODEL|RUN|TEMPLATE expected, got {arg}");
    };
    let sets = multi_turn_sets(Path::new(model), Path::new(run), Path::new(template));
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
}

#[test]
fn multi_turn_runs_and_their_per_turn_metrics_are_bit_identical_at_2_and_4_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let model = crate::common::tiny_model(&tmp.path().join("m"), 3);
    let template = tmp.path().join("chat.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n{% endfor %}\
         {% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let mut runs = Vec::new();
    for threads in [2, 4] {
        let rd = tmp.path().join(format!("run-{threads}"));
        let arg = format!(
            "{}|{}|{}",
            model.display(),
            rd.display(),
            template.display()
        );
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "determinism::determinism_child_multi_turn",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RAYON_NUM_THREADS", threads.to_string())
            .env(CHILD_ENV_MT, arg)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child at {threads} threads failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        runs.push(read_metrics(&rd.join("metrics.jsonl")).unwrap());
    }
    assert_eq!(runs[0].len(), 3, "one metrics line per step");
    for (a, b) in runs[0].iter().zip(&runs[1]) {
        assert_eq!(a.len(), b.len(), "same keys at step {:?}", a.get("step"));
        for (k, v) in a {
            if !TIME_KEYS.contains(&k.as_str()) {
                assert_eq!(v, &b[k], "{k} at step {:?}", a.get("step"));
            }
        }
    }
    // The per-turn keys are there, and some episode got past turn 1 (what the test covers).
    let past_1 = runs[0]
        .iter()
        .filter_map(|l| l["env/turn_2/reached"].as_f64())
        .any(|x| x > 0.0);
    assert!(past_1, "{:?}", runs[0]);
    assert!(runs[0][0].contains_key("env/turn_3/tokens/mean"));
}
