//! Shared test fixtures: a character-level tokenizer and a tiny random Qwen2 checkpoint.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlvr_model::checkpoint::{tokenizer_for_init, write_tokenizer_files};
use rlvr_model::{Model, ModelConfig};

/// Characters of the tokenizer (ids 0..), then `<unk>`, then `<|endoftext|>` (special).
pub const CHARS: &str = "0123456789+-*= #\n";

fn tokenizer_json() -> String {
    let mut vocab = serde_json::Map::new();
    for (i, ch) in CHARS.chars().enumerate() {
        vocab.insert(ch.to_string(), i.into());
    }
    let unk = CHARS.chars().count();
    vocab.insert("<unk>".into(), unk.into());
    vocab.insert("<|endoftext|>".into(), (unk + 1).into());
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
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

/// Writes a tiny random checkpoint (2 layers, width 16, vocab 24) with the char tokenizer into `dir`.
pub fn tiny_model(dir: &Path, seed: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let tok_dir = dir.join("tok-src");
    std::fs::create_dir_all(&tok_dir).unwrap();
    std::fs::write(tok_dir.join("tokenizer.json"), tokenizer_json()).unwrap();
    let tok = tokenizer_for_init(&tok_dir.join("tokenizer.json")).unwrap();
    let config = ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": 24, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 128, "tie_word_embeddings": true,
            "eos_token_id": tok.eos_ids[0]}),
        "inline".as_ref(),
    )
    .unwrap();
    let model = Model::random(config, 0.05, seed, DType::F32, &Device::Cpu).unwrap();
    let out = dir.join("model");
    model.save(&out, DType::F32).unwrap();
    write_tokenizer_files(&out, &tok).unwrap();
    out
}

/// `--set` overrides for a small arithmetic RL run on `model` writing to `run`.
pub fn arithmetic_sets(model: &Path, run: &Path) -> Vec<String> {
    [
        format!("model.path={}", model.display()),
        format!("output.dir={}", run.display()),
        "data.task=\"arithmetic\"".into(),
        "data.arithmetic.min_digits=1".into(),
        "data.arithmetic.max_digits=1".into(),
        "data.arithmetic.train_size=64".into(),
        "data.arithmetic.test_size=8".into(),
        "data.prompts_per_step=2".into(),
        "rollout.group_size=8".into(),
        "rollout.max_new_tokens=4".into(),
        "train.lr=1e-2".into(),
        "train.micro_batch_size=3".into(),
        "train.log_rollouts=2".into(),
    ]
    .into_iter()
    .collect()
}

/// The repository's root.
pub fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// A `data.verifier` `--set` for an external verifier script written to `dir/verify.sh` that
/// scores a completion starting with a digit below 5 as correct (reward 1, else 0), as the
/// quickstart's task verifier would for these tests' tiny model, and then runs `then`: shell lines
/// that see `$n` (the batch's item count: 16 for a train batch of these tests, 8 for an
/// evaluation), `$DIR` (= `dir`) and the script's further arguments from `$2` (`args`), before the
/// rewards are printed; `then` may exit non-zero or wait, to make the verifier fail or hang at a
/// chosen batch. `timeout_s`: the verifier's timeout, or the default when `None`.
pub fn scripted_verifier(dir: &Path, then: &str, args: &[&str], timeout_s: Option<u32>) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let script = dir.join("verify.sh");
    std::fs::write(
        &script,
        format!(
            r#"DIR=$1
n=0
out=""
while IFS= read -r line; do
  n=$((n+1))
  comp=$(printf '%s' "$line" | sed 's/.*"completion":"\([^"]*\)".*/\1/')
  case "$comp" in [01234]*) r=1;; *) r=0;; esac
  out="$out{{\"reward\":$r}}
"
done
{then}
printf '%s' "$out"
"#
        ),
    )
    .unwrap();
    let mut command = vec![
        "\"sh\"".to_string(),
        format!("\"{}\"", script.display()),
        format!("\"{}\"", dir.display()),
    ];
    command.extend(args.iter().map(|a| format!("\"{a}\"")));
    let timeout = timeout_s
        .map(|t| format!(", timeout_s = {t}"))
        .unwrap_or_default();
    format!(
        "data.verifier={{ kind = \"external\", command = [{}]{timeout} }}",
        command.join(", ")
    )
}

/// A chat template in the tiny model's characters (`<|endoftext|>` ends a turn, `=` is the
/// generation prompt).
pub const TINY_CHAT_TEMPLATE: &str = "{% for m in messages %}{{ m.content }}<|endoftext|>\n\
                                      {% endfor %}{% if add_generation_prompt %}={% endif %}";
