//! `rlvr plan`'s prompt length without `data.max_prompt_len`: the train split's longest prompt,
//! rendered and tokenized as the run does, against transformers' count of the fixture's prompts;
//! the bounded scan; the assumption, with its reason, when no prompt can be read.

use std::path::Path;

use crate::common::repo;

use rlvr_train::cli::{run_plan, PlanArgs};
use rlvr_train::config::plan::{prompt_source_text, PromptSource, DEFAULT_PROMPT_TOKENS};
use rlvr_train::config::prompt_scan::{longest_of, MAX_TOKENIZED};

/// A model directory with Qwen2.5-0.5B's config.json (no weights), the Qwen2.5 tokenizer and its
/// official chat template.
fn qwen_dir(dir: &Path) {
    std::fs::copy(
        repo().join("configs/shapes/qwen2.5-0.5b/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    std::fs::copy(
        repo().join("data/tokenizers/qwen2.5/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let template =
        std::fs::read_to_string(repo().join("data/chat_templates/qwen2_5.jinja")).unwrap();
    let tc = serde_json::json!({ "chat_template": template });
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
}

/// `rlvr plan --json` of a `jsonl` run on the fixture, with `sets`.
fn plan_json(model: &Path, sets: &[&str]) -> serde_json::Value {
    let text = plan_text(model, sets, true);
    serde_json::from_str(text.lines().last().unwrap()).unwrap()
}

/// `rlvr plan`'s output (`--json` when `json`) of a `jsonl` run on the fixture, with `sets`.
fn plan_text(model: &Path, sets: &[&str], json: bool) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("run.toml");
    let train = repo().join("crates/rlvr-train/tests/fixtures/plan_prompts/train.jsonl");
    std::fs::write(
        &cfg,
        format!(
            "[model]\npath = {:?}\ndevice = \"cpu\"\ndtype = \"f32\"\n[data]\ntask = \"jsonl\"\n\
             train = {:?}\nverifier = {{ kind = \"math\" }}\nstyle = \"chat\"\n\
             [train]\neval_every = 0\n",
            model.display().to_string(),
            train.display().to_string()
        ),
    )
    .unwrap();
    let args = PlanArgs {
        config: cfg,
        set: sets.iter().map(|s| s.to_string()).collect(),
        gpu_memory: None,
        json,
        world_size: 1,
        zero: None,
    };
    let mut out = Vec::new();
    run_plan(&args, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// The fixture's four prompts (14, 121, 187 and 16 bytes of question): the longest in tokens is
/// line 2 (100 digits, one token each in Qwen2.5's tokenizer), not the longest in bytes (line 3,
/// English prose). Reference counts from transformers 5.24 (`PreTrainedTokenizerFast` on
/// data/tokenizers/qwen2.5/tokenizer.json; chat: `apply_chat_template` with
/// data/chat_templates/qwen2_5.jinja, one user message, `add_generation_prompt=True`, encoded
/// without special tokens): plain 8, 106, 42, 10 tokens; chat 37, 135, 71, 39.
#[test]
fn prompt_length_is_the_fixtures_longest_rendered_prompt() {
    let model = tempfile::tempdir().unwrap();
    qwen_dir(model.path());
    let chat = plan_json(model.path(), &[]);
    assert_eq!(chat["prompt_tokens"], 135, "{chat}");
    let src = &chat["prompt_source"];
    assert_eq!(src["from"], "dataset", "{src}");
    assert_eq!(src["tokens"], 135);
    assert_eq!(src["prompts"], 4);
    assert!(
        src["source"].as_str().unwrap().ends_with("train.jsonl:2"),
        "{src}"
    );
    // The chat template's system prompt makes every rendered prompt over 150 bytes, so the byte
    // bound (at most bytes + 16 tokens) rules none out: all four were tokenized.
    assert_eq!(
        (src["tokenized"].clone(), src["exact"].clone()),
        (4.into(), true.into())
    );
    let plain = plan_json(model.path(), &["data.style=\"plain\""]);
    assert_eq!(plain["prompt_tokens"], 106, "{plain}");
    // Plain: line 3 (the longest in bytes) and line 2 were tokenized; lines 1 and 4 (14 and 16
    // bytes) cannot have 106 tokens.
    let src = &plain["prompt_source"];
    assert_eq!(
        (src["tokenized"].clone(), src["exact"].clone()),
        (2.into(), true.into())
    );
    // The prompt length drives the activations: the same plan with data.max_prompt_len = 135.
    let set = plan_json(model.path(), &["data.max_prompt_len=135"]);
    assert_eq!(set["prompt_source"]["from"], "config");
    for k in [
        "activations_per_row",
        "kv_cache",
        "train_peak",
        "rollout_peak",
    ] {
        assert_eq!(set[k], chat[k], "{k}");
    }
    // The table names the row and says it is exact.
    let table = plan_text(model.path(), &[], false);
    assert!(table.contains("rows of 135 prompt"), "{table}");
    assert!(
        table.contains("prompt tokens: the longest of the 4 train prompts (")
            && table.contains("train.jsonl:2), rendered and tokenized as the run does"),
        "{table}"
    );
    // A config's data.max_prompt_len wins (prompts longer are dropped).
    let capped = plan_json(model.path(), &["data.max_prompt_len=50"]);
    assert_eq!(capped["prompt_tokens"], 50);
}

/// Without a tokenizer in model.path (a shape directory) no prompt can be rendered: 256 tokens
/// assumed, and the reason is named.
#[test]
fn prompt_length_is_assumed_and_said_so_without_a_tokenizer() {
    let v = plan_json(&repo().join("configs/shapes/qwen2.5-0.5b"), &[]);
    assert_eq!(v["prompt_tokens"], DEFAULT_PROMPT_TOKENS as u64);
    assert_eq!(v["prompt_source"]["from"], "assumed");
    let why = v["prompt_source"]["why"].as_str().unwrap();
    assert!(why.contains("tokenizer"), "{why}");
    let table = plan_text(&repo().join("configs/shapes/qwen2.5-0.5b"), &[], false);
    assert!(table.contains("prompt tokens: 256 assumed: data.max_prompt_len is unset and the train prompts could not be read (loading the tokenizer of"), "{table}");
}

/// The scan tokenizes the longest texts by bytes first and stops when the byte bound settles it;
/// past MAX_TOKENIZED prompts it stops and says the result is sampled.
#[test]
fn scan_is_exact_when_bounded_and_says_when_it_samples() {
    let src = |n: usize| (1..=n).map(|i| format!("f:{i}")).collect::<Vec<_>>();
    // One token per digit, one per word otherwise.
    let count = |t: &str| -> anyhow::Result<usize> {
        Ok(t.split(' ')
            .map(|w| w.chars().filter(|c| c.is_ascii_digit()).count().max(1))
            .sum())
    };
    let texts: Vec<String> = vec![
        "a b c".into(),
        "word ".repeat(40),
        "1234567890".repeat(5),
        "x".into(),
    ];
    let l = longest_of(&texts, &src(4), &count).unwrap();
    assert_eq!(
        (l.tokens, l.source.as_str(), l.tokenized, l.exact),
        (50, "f:3", 2, true)
    );
    // Equal lengths never settle: MAX_TOKENIZED of them are counted, then it says it sampled.
    let same: Vec<String> = (0..MAX_TOKENIZED + 10)
        .map(|i| format!("{:08}", i))
        .collect();
    let l = longest_of(&same, &src(same.len()), &count).unwrap();
    assert_eq!(
        (l.tokens, l.tokenized as usize, l.exact),
        (8, MAX_TOKENIZED, false)
    );
    assert_eq!(l.prompts as usize, MAX_TOKENIZED + 10);
    let said = prompt_source_text(&PromptSource::Dataset(l));
    assert!(
        said.contains(&format!(
            "of the {MAX_TOKENIZED} longest in bytes of the {} train prompts",
            MAX_TOKENIZED + 10
        )) && said.contains("sampled"),
        "{said}"
    );
    assert!(longest_of(&[], &[], &count).is_err());
}
