//! The dataset layouts TRL and verl users bring, end to end (issue 35; docs/data.md, "Chat
//! messages in the rows" and "Nested fields and verl's Parquet files"):
//! - a row whose question field holds chat messages gives the same prompt, text and token ids,
//!   through the Qwen2.5 chat template as the same messages rlvr builds from a question and
//!   `data.system_prompt`;
//! - a verl-shaped Parquet file (`prompt` a list of `{role, content}` structs, `reward_model` a
//!   `{ground_truth, style}` struct), written here, is trained on for 2 steps by `rlvr train`
//!   with `question_field = "prompt"`, `answer_field = "reward_model.ground_truth"`.

use crate::common::{repo_root, rlvr};
use rlvr_data::config::{DataConfig, PromptStyle, TaskKind};
use rlvr_data::generate::Split;
use rlvr_model::{Message, TokenizerBundle};
use rlvr_reward::combine::VerifierConfig;
use rlvr_reward::gsm8k::Gsm8kMode;
use std::path::{Path, PathBuf};

/// A tiny random Qwen2 with the real Qwen2.5 tokenizer and chat template, in `dir/tiny`.
fn tiny_qwen(dir: &Path) -> PathBuf {
    let model = dir.join("tiny");
    let out = rlvr()
        .current_dir(repo_root())
        .args(["init", "--arch", "qwen2", "--hidden", "64", "--layers", "2"])
        .args(["--heads", "2", "--kv-heads", "1", "--intermediate", "128"])
        .args([
            "--tokenizer",
            "data/tokenizers/qwen2.5/tokenizer.json",
            "--out",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    model
}

/// A `jsonl` task scored by the GSM8K verifier, chat style, reading `train`.
fn chat_cfg(train: &Path) -> DataConfig {
    DataConfig {
        task: TaskKind::Jsonl,
        train: Some(train.into()),
        verifier: Some(VerifierConfig::Gsm8k {
            mode: Gsm8kMode::Flexible,
        }),
        style: PromptStyle::Chat,
        ..DataConfig::default()
    }
}

#[test]
fn a_messages_row_gives_the_token_ids_of_the_same_messages_built_by_rlvr() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = TokenizerBundle::load(&tiny_qwen(tmp.path())).unwrap();
    let system = "You are a careful math tutor.";
    let question = "Ann has 4 pens and gives away 1. How many are left?";
    let qa = tmp.path().join("qa.jsonl");
    let row = serde_json::json!({"question": question, "answer": "3"});
    std::fs::write(&qa, format!("{row}\n")).unwrap();
    let messages = tmp.path().join("messages.jsonl");
    let row = serde_json::json!({
        "prompt": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "answer": "3",
    });
    std::fs::write(&messages, format!("{row}\n")).unwrap();
    let built = DataConfig {
        system_prompt: Some(system.into()),
        ..chat_cfg(&qa)
    };
    let own = DataConfig {
        question_field: Some("prompt".into()),
        ..chat_cfg(&messages)
    };
    let prepare = |cfg: &DataConfig| {
        let p = rlvr_train::feed::prompts::prepare_prompts(
            cfg,
            Split::Train,
            &tok,
            rlvr_data::config::Scoring::Verifier,
        )
        .unwrap();
        let ids = p.encode(&tok, false).unwrap();
        (p, ids)
    };
    let (built, built_ids) = prepare(&built);
    let (own, own_ids) = prepare(&own);
    let want = format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert_eq!(built.texts, own.texts);
    assert_eq!(own.texts, std::slice::from_ref(&want));
    assert_eq!(built_ids, own_ids);
    assert_eq!(own_ids[0], tok.encode(&want, false).unwrap());
    assert!(own_ids[0].len() > 20, "{:?}", own_ids[0]);
    // The verifier's columns see the user's text as the question, the reference the answer.
    assert_eq!(own.columns[0][0], ("question".into(), question.into()));
    assert_eq!(own.references, ["3"]);
}

/// One leaf column of a Parquet file: its non-null values and definition and repetition levels.
enum Leaf<'a> {
    Text(&'a [&'a str], &'a [i16], Option<&'a [i16]>),
    Int(&'a [i64], &'a [i16]),
}

/// Writes one Snappy row group of `schema` with `leaves` in the schema's leaf order.
fn write_parquet(path: &Path, schema: &str, leaves: &[Leaf]) {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;
    let schema = Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build(),
    );
    let mut w =
        SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    let mut rg = w.next_row_group().unwrap();
    for leaf in leaves {
        let mut col = rg.next_column().unwrap().expect("a leaf per column");
        match leaf {
            Leaf::Text(v, def, rep) => {
                let v: Vec<ByteArray> = v.iter().map(|s| ByteArray::from(*s)).collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&v, Some(def), *rep)
                    .unwrap();
            }
            Leaf::Int(v, def) => {
                col.typed::<Int64Type>()
                    .write_batch(v, Some(def), None)
                    .unwrap();
            }
        }
        col.close().unwrap();
    }
    assert!(rg.next_column().unwrap().is_none(), "a leaf left unwritten");
    rg.close().unwrap();
    w.close().unwrap();
}

/// verl's `examples/data_preprocess/gsm8k.py` layout as pyarrow writes it.
const VERL_SCHEMA: &str = "message schema {
    optional binary data_source (STRING);
    optional group prompt (LIST) {
        repeated group list {
            optional group element {
                optional binary content (STRING);
                optional binary role (STRING);
            }
        }
    }
    optional group reward_model {
        optional binary ground_truth (STRING);
        optional binary style (STRING);
    }
    optional group extra_info {
        optional binary answer (STRING);
        optional int64 index;
    }
}";

#[test]
fn a_verl_parquet_file_trains_for_two_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_qwen(tmp.path());
    std::fs::create_dir(tmp.path().join("verl")).unwrap();
    let data = tmp.path().join("verl/train.parquet");
    // Four rows; row 2 has a system message before the user's. `prompt.list.element.*` leaves
    // have definition level 4 and repetition level 1 on a row's second message.
    let questions = [
        "What is 12 + 30?",
        "What is 7 * 8?",
        "What is 9 - 4?",
        "What is 6 / 3?",
    ];
    let msg_def: &[i16] = &[4; 5];
    let msg_rep: &[i16] = &[0, 0, 1, 0, 0];
    write_parquet(
        &data,
        VERL_SCHEMA,
        &[
            Leaf::Text(&["openai/gsm8k"; 4], &[1; 4], None),
            Leaf::Text(
                &[
                    questions[0],
                    "Be brief.",
                    questions[1],
                    questions[2],
                    questions[3],
                ],
                msg_def,
                Some(msg_rep),
            ),
            Leaf::Text(
                &["user", "system", "user", "user", "user"],
                msg_def,
                Some(msg_rep),
            ),
            Leaf::Text(&["42", "56", "5", "2"], &[2; 4], None),
            Leaf::Text(&["rule"; 4], &[2; 4], None),
            Leaf::Text(&["#### 42", "#### 56", "#### 5", "#### 2"], &[2; 4], None),
            Leaf::Int(&[0, 1, 2, 3], &[2; 4]),
        ],
    );
    let run = tmp.path().join("run");
    let config = tmp.path().join("verl.toml");
    std::fs::write(
        &config,
        format!(
            r#"[model]
path = "{}"
device = "cpu"
dtype = "f32"

[data]
task = "jsonl"
train = "verl/train.parquet"
test = "verl/train.parquet"
style = "chat"
question_field = "prompt"
answer_field = "reward_model.ground_truth"
verifier = {{ kind = "gsm8k" }}
prompts_per_step = 2

[rollout]
group_size = 2
max_new_tokens = 4

[train]
steps = 2
eval_every = 0

[output]
dir = "{}"
"#,
            model.display(),
            run.display()
        ),
    )
    .unwrap();
    let out = rlvr()
        .current_dir(tmp.path())
        .args(["train", "--no-progress", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rlvr train: {stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["steps"], 2, "{summary}");
    let lines = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(run.join(name))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let steps: Vec<u64> = lines("metrics.jsonl")
        .iter()
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2]);
    // Every rollout's prompt is one row's messages through the Qwen2.5 chat template: the
    // row with a system message renders it, the others get the template's default one.
    let tok = TokenizerBundle::load(&model).unwrap();
    let render = |m: &[Message]| tok.apply_chat_template(m, true).unwrap();
    let mut want: Vec<String> = [0, 2, 3]
        .iter()
        .map(|&i| render(&[Message::new("user", questions[i])]))
        .collect();
    want.push(render(&[
        Message::new("system", "Be brief."),
        Message::new("user", questions[1]),
    ]));
    assert_eq!(
        want[3],
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let rollouts = lines("rollouts.jsonl");
    // 2 steps of 2 prompts with 2 completions each.
    assert_eq!(rollouts.len(), 8);
    for r in &rollouts {
        let p = r["prompt"].as_str().unwrap();
        assert!(want.iter().any(|w| w == p), "{p:?} is no row's prompt");
        assert!(r["reward"].as_f64().is_some(), "{r}");
    }
}
