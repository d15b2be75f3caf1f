//! `rlvr generate` end to end on a random model directory with the Qwen2.5 tokenizer.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use clap::Parser;
use rlvr_model::checkpoint::{tokenizer_for_init, write_tokenizer_files};
use rlvr_model::{Model, ModelConfig, TokenizerBundle};
use rlvr_rollout::cli::{run, GenerateArgs};
use serde_json::Value;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: GenerateArgs,
}

/// Writes a random Qwen2 model (hidden 16) with the Qwen2.5 tokenizer and a ChatML template.
fn model_dir(dir: &Path) -> TokenizerBundle {
    let tok_json = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/tokenizers/qwen2.5/tokenizer.json");
    let bundle = tokenizer_for_init(&tok_json).unwrap();
    let vocab = bundle.vocab_size().div_ceil(64) * 64;
    let config = ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": vocab, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 512,
            "tie_word_embeddings": true}),
        "inline".as_ref(),
    )
    .unwrap();
    // Large init: peaked distributions, so greedy runs and stop strings are interesting.
    let model = Model::random(config, 0.3, 1, DType::F32, &Device::Cpu).unwrap();
    model.save(dir, DType::F32).unwrap();
    write_tokenizer_files(dir, &bundle).unwrap();
    bundle
}

fn generate(argv: &[&str]) -> anyhow::Result<Vec<Value>> {
    let cli = Cli::try_parse_from(std::iter::once("generate").chain(argv.iter().copied()))?;
    let mut out = Vec::new();
    run(&cli.args, &mut out)?;
    Ok(String::from_utf8(out)?
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect())
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn generate_prints_one_object_per_completion() {
    let dir = tempfile::tempdir().unwrap();
    let tok = model_dir(dir.path());
    let m = dir.path().to_str().unwrap();
    let rows = generate(&[
        "--model",
        m,
        "--prompt",
        "What is 2+3?",
        "-n",
        "3",
        "--max-new-tokens",
        "12",
        "--seed",
        "4",
    ])
    .unwrap();
    assert_eq!(rows.len(), 3);
    for (j, r) in rows.iter().enumerate() {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        for k in [
            "prompt_index",
            "sample_index",
            "text",
            "token_ids",
            "behaviour_logprobs",
            "finish_reason",
        ] {
            assert!(keys.contains(&k), "missing {k}: {r}");
        }
        assert_eq!(r["prompt_index"], 0);
        assert_eq!(r["sample_index"], j);
        let t = ids(&r["token_ids"]);
        assert_eq!(t.len(), r["behaviour_logprobs"].as_array().unwrap().len());
        assert!(t.len() <= 12);
        assert_eq!(r["text"], tok.decode(&t, true).unwrap());
        let fr = r["finish_reason"].as_str().unwrap();
        assert!(fr == "eos" || fr == "length");
        assert_eq!(
            fr == "length",
            t.len() == 12 && !tok.eos_ids.contains(t.last().unwrap())
        );
    }
    // Same seed, other batching: same output.
    let again = generate(&[
        "--model",
        m,
        "--prompt",
        "What is 2+3?",
        "-n",
        "3",
        "--max-new-tokens",
        "12",
        "--seed",
        "4",
        "--max-batch-rows",
        "1",
    ])
    .unwrap();
    for (a, b) in rows.iter().zip(&again) {
        assert_eq!(a["token_ids"], b["token_ids"]);
    }
}

#[test]
fn generate_prompts_file_chat_and_experiences() {
    let dir = tempfile::tempdir().unwrap();
    let tok = model_dir(dir.path());
    let m = dir.path().to_str().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"one\"}\n\n{\"prompt\": \"two\\u2028lines\"}\n",
    )
    .unwrap();
    let exp = dir.path().join("exp.jsonl");
    let rows = generate(&[
        "--model",
        m,
        "--prompts",
        prompts.to_str().unwrap(),
        "--chat",
        "-n",
        "2",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--top-k",
        "50",
        "--max-new-tokens",
        "6",
        "--out",
        exp.to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(rows.len(), 4);
    let order: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["prompt_index"].as_u64().unwrap(),
                r["sample_index"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(order, [(0, 0), (0, 1), (1, 0), (1, 1)]);
    let lines: Vec<Value> = std::fs::read_to_string(&exp)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (e, r) in lines.iter().zip(&rows) {
        assert_eq!(e["completion_ids"], r["token_ids"]);
        assert_eq!(e["behaviour_logprobs"], r["behaviour_logprobs"]);
        assert_eq!(e["reward"], Value::Null);
        assert_eq!(e["group_id"], r["prompt_index"]);
        assert_eq!(e["version"], 0);
        assert_eq!(e["finish_reason"], r["finish_reason"]);
        let text = if r["prompt_index"] == 0 {
            "one"
        } else {
            "two\u{2028}lines"
        };
        let want = rlvr_rollout::cli::encode_prompt(&tok, text, true).unwrap();
        assert_eq!(ids(&e["prompt_ids"]), want);
        let rendered = tok.decode(&want, false).unwrap();
        assert!(
            rendered.starts_with("<|im_start|>user\n")
                && rendered.ends_with("<|im_start|>assistant\n")
        );
    }
}

#[test]
fn generate_stop_string_ends_early() {
    let dir = tempfile::tempdir().unwrap();
    let tok = model_dir(dir.path());
    let m = dir.path().to_str().unwrap();
    let base = [
        "--model",
        m,
        "--prompt",
        "Hi",
        "--temperature",
        "0",
        "--max-new-tokens",
        "20",
    ];
    let free = generate(&base).unwrap();
    let t = ids(&free[0]["token_ids"]);
    assert!(
        t.len() >= 8,
        "the seeded model now ends early; pick another prompt: {t:?}"
    );
    let stop = tok.decode(&t[5..7], false).unwrap();
    let mut argv = base.to_vec();
    argv.extend(["--stop", &stop]);
    let cut = generate(&argv).unwrap();
    let c = ids(&cut[0]["token_ids"]);
    assert!(
        c.len() <= 7 && c.len() < t.len(),
        "{} vs {}",
        c.len(),
        t.len()
    );
    assert_eq!(c, t[..c.len()]);
    assert_eq!(cut[0]["finish_reason"], "eos");
}

#[test]
fn generate_reports_bad_input_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    model_dir(dir.path());
    let m = dir.path().to_str().unwrap();
    let prompts = dir.path().join("bad.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"ok\"}\n{\"question\": \"no\"}\n").unwrap();
    let e = generate(&["--model", m, "--prompts", prompts.to_str().unwrap()]).unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("bad.jsonl:2"), "{msg}");
    std::fs::write(&prompts, "{\"prompt\": \"ok\"}\nnot json\n").unwrap();
    let msg = format!(
        "{:#}",
        generate(&["--model", m, "--prompts", prompts.to_str().unwrap()]).unwrap_err()
    );
    assert!(msg.contains("bad.jsonl:2"), "{msg}");
    // Exactly one prompt source.
    assert!(generate(&["--model", m]).is_err());
    assert!(generate(&["--model", m, "--prompt", "a", "--prompts", "x.jsonl"]).is_err());
    // Parameter errors name the parameter.
    let msg = format!(
        "{:#}",
        generate(&["--model", m, "--prompt", "a", "--top-p", "1.5"]).unwrap_err()
    );
    assert!(msg.contains("top_p"), "{msg}");
    let msg = format!(
        "{:#}",
        generate(&["--model", "/nonexistent", "--prompt", "a"]).unwrap_err()
    );
    assert!(msg.contains("/nonexistent"), "{msg}");
}
