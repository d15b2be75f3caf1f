//! The dataset layouts TRL and verl users bring (issue 35): a question field holding chat
//! messages (TRL GRPOTrainer's conversational `prompt`, verl's `prompt` column) and dotted field
//! paths into nested objects (verl's `reward_model.ground_truth`, `extra_info.answer`), from JSONL
//! and from a verl-shaped Parquet file written here; every refusal names file, line and field.

use rlvr_data::config::{DataConfig, FewShotExample, PromptStyle, TaskKind};
use rlvr_data::dataset::{build_prompts, load_split, Dataset};
use rlvr_data::generate::Split;
use rlvr_data::template::PromptBuilder;
use rlvr_data::ChatMessage;
use rlvr_reward::combine::VerifierConfig;
use std::path::Path;

/// A data file `name` in `dir` holding `lines`.
fn file(dir: &Path, name: &str, lines: &[&str]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// A `jsonl` task with the GSM8K verifier reading `train`, its question in `prompt`.
fn cfg(train: &Path) -> DataConfig {
    DataConfig {
        task: TaskKind::Jsonl,
        train: Some(train.into()),
        question_field: Some("prompt".into()),
        verifier: Some(VerifierConfig::Gsm8k {
            mode: rlvr_reward::gsm8k::Gsm8kMode::Flexible,
        }),
        style: PromptStyle::Chat,
        ..DataConfig::default()
    }
}

/// A chat template for tests: each message as `<|role|>content\n`, then `<|assistant|>`.
fn render(msgs: &[ChatMessage], generation: bool) -> anyhow::Result<String> {
    let mut s: String = msgs
        .iter()
        .map(|m| format!("<|{}|>{}\n", m.role, m.content))
        .collect();
    if generation {
        s.push_str("<|assistant|>");
    }
    Ok(s)
}

/// The prompt texts of `cfg`'s train split, rendered with [`render`].
fn prompts(cfg: &DataConfig) -> (Dataset, Vec<String>) {
    let ds = load_split(cfg, Split::Train).unwrap();
    let set = build_prompts(
        &ds,
        &PromptBuilder::from_config(cfg),
        Some(&render),
        None,
        None,
    )
    .unwrap();
    let texts = set.prompts.into_iter().map(|p| p.text).collect();
    (ds, texts)
}

/// Loading `cfg`'s train split fails with a message holding every one of `want`.
fn check_refused(cfg: &DataConfig, want: &[&str]) {
    let e = load_split(cfg, Split::Train).unwrap_err().to_string();
    for w in want {
        assert!(e.contains(w), "{w:?} not in: {e}");
    }
}

#[test]
fn a_messages_row_renders_as_the_same_messages_built_from_a_question() {
    let dir = tempfile::tempdir().unwrap();
    let system = "You are a careful math tutor.";
    let question = "Ann has 4 pens and gives away 1. How many are left?";
    // rlvr builds the messages: the system prompt, then the question as the user's message.
    let built = file(
        dir.path(),
        "qa.jsonl",
        &[&serde_json::json!({"prompt": question, "answer": "3"}).to_string()],
    );
    let built_cfg = DataConfig {
        system_prompt: Some(system.into()),
        ..cfg(&built)
    };
    // The row carries the same messages itself (TRL's conversational `prompt`).
    let row = serde_json::json!({
        "prompt": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "answer": "3",
    });
    let own = file(dir.path(), "messages.jsonl", &[&row.to_string()]);
    let (ds_built, built_text) = prompts(&built_cfg);
    let (ds_own, own_text) = prompts(&cfg(&own));
    let want = format!("<|system|>{system}\n<|user|>{question}\n<|assistant|>");
    assert_eq!(built_text, own_text);
    assert_eq!(own_text, [want]);
    // The problem keeps the messages; its `question` is the user's text, its reference the answer.
    let p = &ds_own.problems[0];
    assert_eq!(
        p.messages.as_deref(),
        Some(
            &[
                ChatMessage::new("system", system),
                ChatMessage::new("user", question)
            ][..]
        )
    );
    assert_eq!(p.question(), question);
    assert_eq!(p.reference, "3");
    assert_eq!(ds_built.problems[0].messages, None);
}

#[test]
fn a_messages_row_takes_no_task_template_and_keeps_earlier_turns() {
    let dir = tempfile::tempdir().unwrap();
    // verl's gsm8k.py layout: the instruction is already in the user's message, the full
    // solution in `extra_info.answer` (GSM8K's `#### N`), the bare number in `reward_model`.
    let row = serde_json::json!({
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "user", "content": "1 + 1?"},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "2 + 2? Let's think step by step and output the final answer after \"####\"."},
        ],
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 0, "answer": "2 + 2 = 4\n#### 4"},
    });
    let path = file(dir.path(), "verl.jsonl", &[&row.to_string()]);
    let gsm8k = DataConfig {
        task: TaskKind::Gsm8k,
        answer_field: Some("extra_info.answer".into()),
        verifier: None,
        ..cfg(&path)
    };
    let (ds, texts) = prompts(&gsm8k);
    // The gsm8k task's template (its "Let's think step by step" line) is not added again.
    assert_eq!(
        texts,
        [
            "<|user|>1 + 1?\n<|assistant|>2\n<|user|>2 + 2? Let's think step by step and output \
          the final answer after \"####\".\n<|assistant|>"
        ]
    );
    assert_eq!(ds.problems[0].reference, "2 + 2 = 4\n#### 4");
    let jsonl = DataConfig {
        answer_field: Some("reward_model.ground_truth".into()),
        ..cfg(&path)
    };
    let (ds, _) = prompts(&jsonl);
    assert_eq!(ds.problems[0].reference, "4");
    // A `jsonl` row's top-level strings stay template variables (for the verifier's columns).
    assert!(ds.problems[0]
        .vars
        .contains(&("data_source".into(), "openai/gsm8k".into())));
}

#[test]
fn messages_rows_are_refused_where_the_config_would_change_them() {
    let dir = tempfile::tempdir().unwrap();
    let row = r#"{"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}"#;
    let path = file(
        dir.path(),
        "m.jsonl",
        &[r#"{"prompt": "1 + 1?", "answer": "2"}"#, row],
    );
    // A file may mix rows of text and rows of messages.
    let (_, texts) = prompts(&cfg(&path));
    assert_eq!(
        texts,
        [
            "<|user|>1 + 1?\n<|assistant|>",
            "<|user|>2 + 2?\n<|assistant|>"
        ]
    );
    let at = format!("{}:2: field `prompt`", path.display());
    check_refused(
        &DataConfig {
            style: PromptStyle::Plain,
            ..cfg(&path)
        },
        &[&at, "holds chat messages", "need data.style = \"chat\""],
    );
    check_refused(
        &DataConfig {
            system_prompt: Some("Be brief.".into()),
            ..cfg(&path)
        },
        &[
            &at,
            "data.system_prompt would add to or rewrite them",
            "unset it",
        ],
    );
    let few_shot = vec![FewShotExample {
        question: "1 + 1?".into(),
        answer: "2".into(),
    }];
    check_refused(
        &DataConfig {
            few_shot: few_shot.clone(),
            ..cfg(&path)
        },
        &[&at, "data.few_shot would"],
    );
    check_refused(
        &DataConfig {
            system_prompt: Some("Be brief.".into()),
            few_shot,
            template: Some("Q: {question}".into()),
            ..cfg(&path)
        },
        &[
            &at,
            "data.system_prompt and data.few_shot and data.template would",
            "unset them",
        ],
    );
}

#[test]
fn malformed_messages_are_refused_naming_file_line_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        (r#"[]"#, "field `prompt`", "is an empty list"),
        (
            r#"["hi"]"#,
            "field `prompt[0]`",
            "is a string: a list in the question field is read as chat messages",
        ),
        (
            r#"[{"role": "tool", "content": "42"}, {"role": "user", "content": "?"}]"#,
            "field `prompt[0].role`",
            "is \"tool\": rlvr reads the roles system, user and assistant",
        ),
        (
            r#"[{"content": "2 + 2?"}]"#,
            "field `prompt[0].role`",
            "is missing",
        ),
        (
            r#"[{"role": "system", "content": "Be brief."}, {"role": "user"}]"#,
            "field `prompt[1].content`",
            "is missing (a chat message needs its text as a string)",
        ),
        (
            r#"[{"role": "user", "content": null}]"#,
            "field `prompt[0].content`",
            "is missing",
        ),
        (
            r#"[{"role": "user", "content": [{"type": "text", "text": "2 + 2?"}]}]"#,
            "field `prompt[0].content`",
            "must be a string, found an array",
        ),
        (
            r#"[{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]"#,
            "field `prompt[1].role`",
            "is \"assistant\": the last message must be the user's",
        ),
        (
            r#"[{"role": "user", "content": "  "}]"#,
            "field `prompt[0].content`",
            "is empty (a prompt needs a question)",
        ),
    ];
    for (k, (messages, field, reason)) in cases.iter().enumerate() {
        let row = format!(r#"{{"prompt": {messages}, "answer": "4"}}"#);
        let path = file(dir.path(), &format!("bad{k}.jsonl"), &[&row]);
        check_refused(
            &cfg(&path),
            &[&format!("{}:1: {field} {reason}", path.display())],
        );
    }
}

#[test]
fn dotted_fields_read_nested_objects_after_an_exact_top_level_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        dir.path(),
        "nested.jsonl",
        &[
            // A top-level key holding a dot is read as it is, before the path.
            r#"{"prompt": "a", "a.b": "top", "a": {"b": "nested"}}"#,
            r#"{"prompt": "b", "a": {"b": "nested"}}"#,
            r#"{"prompt": "c", "a": {"b": 7}}"#,
        ],
    );
    let c = DataConfig {
        answer_field: Some("a.b".into()),
        ..cfg(&path)
    };
    let (ds, _) = prompts(&c);
    let refs: Vec<&str> = ds.problems.iter().map(|p| p.reference.as_str()).collect();
    assert_eq!(refs, ["top", "nested", "7"]);
    // Three levels.
    let path = file(
        dir.path(),
        "deep.jsonl",
        &[r#"{"q": {"text": {"en": "2 + 2?"}}, "answer": "4"}"#],
    );
    let c = DataConfig {
        question_field: Some("q.text.en".into()),
        ..cfg(&path)
    };
    let (ds, texts) = prompts(&c);
    assert_eq!(ds.problems[0].question(), "2 + 2?");
    assert_eq!(texts, ["<|user|>2 + 2?\n<|assistant|>"]);
}

#[test]
fn a_dotted_path_that_misses_says_which_part() {
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        dir.path(),
        "verl.jsonl",
        &[
            r#"{"prompt": "a", "reward_model": {"style": "rule", "ground_truth": "1"}}"#,
            r#"{"prompt": "b", "reward_model": {"style": "rule"}}"#,
            r#"{"prompt": "c", "reward_model": "rule"}"#,
            r#"{"prompt": "d", "reward_model": {"style": "rule", "ground_truth": null}}"#,
            r#"{"prompt": "e"}"#,
        ],
    );
    let lines = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = lines.lines().collect();
    let field = "reward_model.ground_truth";
    let cases: &[(usize, &str)] = &[
        (
            2,
            "`reward_model` has no `ground_truth` (its keys: [\"style\"])",
        ),
        (
            3,
            "`reward_model` is a string, not an object holding `ground_truth`",
        ),
        (4, "`reward_model.ground_truth` is null"),
        (5, "the record has no `reward_model`"),
    ];
    for &(line, reason) in cases {
        let one = file(dir.path(), "one.jsonl", &[lines[0], lines[line - 1]]);
        let c = DataConfig {
            answer_field: Some(field.into()),
            ..cfg(&one)
        };
        check_refused(
            &c,
            &[
                &format!("{}:2: missing field `{field}`: {reason}", one.display()),
                "(set data.answer_field to the field that holds it)",
            ],
        );
    }
    // A name without a dot is a missing top-level field, listed with the row's fields.
    let c = DataConfig {
        answer_field: Some("ground_truth".into()),
        ..cfg(&path)
    };
    check_refused(
        &c,
        &[&format!(
            "{}:1: missing field `ground_truth` (the row's fields: [\"prompt\", \"reward_model\"]; \
             set data.answer_field",
            path.display()
        )],
    );
}

/// One leaf column of a Parquet file written by [`write_parquet`]: its non-null values and its
/// definition and repetition levels (`None` where the column has none).
#[cfg(feature = "parquet")]
enum Leaf<'a> {
    Text(&'a [&'a str], Option<&'a [i16]>, Option<&'a [i16]>),
    Int(&'a [i64], Option<&'a [i16]>),
    /// Raw bytes, for binary columns that need not hold UTF-8.
    Bytes(&'a [&'a [u8]], Option<&'a [i16]>),
}

/// Writes one row group of `schema` (Snappy) with `leaves` in the schema's leaf order.
#[cfg(feature = "parquet")]
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
                    .write_batch(&v, *def, *rep)
                    .unwrap();
            }
            Leaf::Int(v, def) => {
                col.typed::<Int64Type>().write_batch(v, *def, None).unwrap();
            }
            Leaf::Bytes(v, def) => {
                let v: Vec<ByteArray> = v.iter().map(|b| ByteArray::from(b.to_vec())).collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&v, *def, None)
                    .unwrap();
            }
        }
        col.close().unwrap();
    }
    assert!(rg.next_column().unwrap().is_none(), "a leaf left unwritten");
    rg.close().unwrap();
    w.close().unwrap();
}

/// verl's `examples/data_preprocess/gsm8k.py` layout as pyarrow writes it: `prompt` a list of
/// `{role, content}` structs, `reward_model` a `{style, ground_truth}` struct, `extra_info` a
/// struct with the full solution. Two rows: a user message alone, and a system and a user one.
#[cfg(feature = "parquet")]
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

#[cfg(feature = "parquet")]
#[test]
fn a_verl_parquet_file_reads_messages_and_nested_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.parquet");
    // Leaf levels: `prompt.list.element.*` have definition level 4 (prompt, list, element, the
    // leaf) and repetition level 1 on a row's second message; struct members level 2.
    let (msg_def, msg_rep): (&[i16], &[i16]) = (&[4, 4, 4], &[0, 0, 1]);
    write_parquet(
        &path,
        VERL_SCHEMA,
        &[
            Leaf::Text(&["openai/gsm8k", "openai/gsm8k"], Some(&[1, 1]), None),
            Leaf::Text(
                &["What is 12 + 30?", "Be brief.", "What is 7 * 8?"],
                Some(msg_def),
                Some(msg_rep),
            ),
            Leaf::Text(&["user", "system", "user"], Some(msg_def), Some(msg_rep)),
            Leaf::Text(&["42", "56"], Some(&[2, 2]), None),
            Leaf::Text(&["rule", "rule"], Some(&[2, 2]), None),
            Leaf::Text(
                &["12 + 30 = 42\n#### 42", "7 * 8 = 56\n#### 56"],
                Some(&[2, 2]),
                None,
            ),
            Leaf::Int(&[0, 1], Some(&[2, 2])),
        ],
    );
    // The rows as the reader sees them: nested objects and arrays.
    let records = rlvr_data::read::read_records(&path).unwrap();
    assert_eq!(
        serde_json::Value::Object(records[1].fields.clone()),
        serde_json::json!({
            "data_source": "openai/gsm8k",
            "prompt": [{"content": "Be brief.", "role": "system"},
                       {"content": "What is 7 * 8?", "role": "user"}],
            "reward_model": {"ground_truth": "56", "style": "rule"},
            "extra_info": {"answer": "7 * 8 = 56\n#### 56", "index": 1},
        })
    );
    let c = DataConfig {
        answer_field: Some("reward_model.ground_truth".into()),
        ..cfg(&path)
    };
    let (ds, texts) = prompts(&c);
    assert_eq!(
        texts,
        [
            "<|user|>What is 12 + 30?\n<|assistant|>",
            "<|system|>Be brief.\n<|user|>What is 7 * 8?\n<|assistant|>",
        ]
    );
    let refs: Vec<&str> = ds.problems.iter().map(|p| p.reference.as_str()).collect();
    assert_eq!(refs, ["42", "56"]);
    assert_eq!(
        ds.problems[1].source,
        format!("{}:2", path.display()),
        "a Parquet row is its line"
    );
    // GSM8K's full solutions are in `extra_info.answer`.
    let c = DataConfig {
        task: TaskKind::Gsm8k,
        answer_field: Some("extra_info.answer".into()),
        verifier: None,
        ..c
    };
    let (ds, _) = prompts(&c);
    assert_eq!(ds.problems[0].reference, "12 + 30 = 42\n#### 42");
    // A path that misses in a struct column names the row, the path and the part.
    let c = DataConfig {
        answer_field: Some("reward_model.answer".into()),
        ..c
    };
    check_refused(
        &c,
        &[&format!(
            "{}:1: missing field `reward_model.answer`: `reward_model` has no `answer` (its keys: \
             [\"ground_truth\", \"style\"])",
            path.display()
        )],
    );
    // With the plain style the messages are refused, naming the row.
    let c = DataConfig {
        style: PromptStyle::Plain,
        ..c
    };
    check_refused(
        &c,
        &[&format!(
            "{}:1: field `prompt` holds chat messages",
            path.display()
        )],
    );
}

#[cfg(feature = "parquet")]
#[test]
fn a_null_message_member_in_parquet_is_a_missing_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("null.parquet");
    // One row, one message whose content is null (definition level 3: the element is there).
    write_parquet(
        &path,
        VERL_SCHEMA,
        &[
            Leaf::Text(&["x"], Some(&[1]), None),
            Leaf::Text(&[], Some(&[3]), Some(&[0])),
            Leaf::Text(&["user"], Some(&[4]), Some(&[0])),
            Leaf::Text(&["4"], Some(&[2]), None),
            Leaf::Text(&["rule"], Some(&[2]), None),
            Leaf::Text(&["#### 4"], Some(&[2]), None),
            Leaf::Int(&[0], Some(&[2])),
        ],
    );
    check_refused(
        &DataConfig {
            answer_field: Some("reward_model.ground_truth".into()),
            ..cfg(&path)
        },
        &[&format!(
            "{}:1: field `prompt[0].content` is missing",
            path.display()
        )],
    );
}

#[test]
fn a_trl_row_without_question_field_lists_the_rows_fields() {
    // TRL's conversational rows name their prompt `prompt`; the jsonl task's default question
    // field is `question`. The refusal lists the row's fields, so the fix is in the message.
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        dir.path(),
        "trl.jsonl",
        &[r#"{"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"}"#],
    );
    let c = DataConfig {
        question_field: None,
        ..cfg(&path)
    };
    check_refused(
        &c,
        &[&format!(
            "{}:1: missing field `question` (the row's fields: [\"answer\", \"prompt\"]; set \
             data.question_field to the field that holds it)",
            path.display()
        )],
    );
    // A null value is there but empty: no list of fields.
    let path = file(
        dir.path(),
        "null.jsonl",
        &[r#"{"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": null}"#],
    );
    check_refused(
        &cfg(&path),
        &[&format!(
            "{}:1: missing field `answer` (set data.answer_field",
            path.display()
        )],
    );
}

#[test]
fn a_single_message_object_is_refused_as_not_a_list() {
    // One message written without the list's brackets.
    let dir = tempfile::tempdir().unwrap();
    let path = file(
        dir.path(),
        "one.jsonl",
        &[r#"{"prompt": {"role": "user", "content": "2 + 2?"}, "answer": "4"}"#],
    );
    check_refused(
        &cfg(&path),
        &[&format!(
            "{}:1: field `prompt` must be a string or a list of chat messages, found an object \
             (write one message as a list: [{{\"role\": \"user\", \"content\": \"...\"}}])",
            path.display()
        )],
    );
}

#[cfg(feature = "parquet")]
#[test]
fn a_parquet_codec_not_compiled_in_is_named_with_the_fix() {
    // tests/fixtures/zstd.parquet: pyarrow 26, `pq.write_table(pa.table({"question": ["What is
    // 2 + 2?"], "answer": ["4"]}), path, compression="zstd")`; zstd is polars' default codec.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zstd.parquet");
    let c = DataConfig {
        question_field: Some("question".into()),
        style: PromptStyle::Plain,
        ..cfg(&path)
    };
    check_refused(
        &c,
        &[&format!(
            "{}: column `question` is compressed with ZSTD, which rlvr does not read (it reads \
             Snappy-compressed and uncompressed Parquet): rewrite the file with Snappy (pyarrow: \
             pq.write_table(table, path, compression=\"snappy\"); polars: \
             df.write_parquet(path, compression=\"snappy\"))",
            path.display()
        )],
    );
}

/// Spark and Hive write text columns as `binary` without the UTF8/STRING annotation (issue 49,
/// item 13): the parquet crate's JSON form base64-encodes them.
#[cfg(feature = "parquet")]
const SPARK_SCHEMA: &str = "message spark_schema {
    required binary question;
    required binary answer;
}";

#[cfg(feature = "parquet")]
#[test]
fn unannotated_binary_parquet_columns_read_as_text_not_base64() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spark.parquet");
    write_parquet(
        &path,
        SPARK_SCHEMA,
        &[
            Leaf::Bytes(
                &["What is 2 + 2?".as_bytes(), "Café: 3 × 3?".as_bytes()],
                None,
            ),
            Leaf::Bytes(&[b"4", "9 €".as_bytes()], None),
        ],
    );
    let records = rlvr_data::read::read_records(&path).unwrap();
    let rows: Vec<(usize, &str, &str)> = records
        .iter()
        .map(|r| {
            (
                r.line,
                r.fields["question"].as_str().unwrap(),
                r.fields["answer"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [(1, "What is 2 + 2?", "4"), (2, "Café: 3 × 3?", "9 €")]
    );
    // Through the loader: the prompt holds the question, not its base64 (`V2hhdCBpcyAy...`).
    let c = DataConfig {
        question_field: Some("question".into()),
        style: PromptStyle::Plain,
        ..cfg(&path)
    };
    let ds = load_split(&c, Split::Train).unwrap();
    let got: Vec<(&str, &str)> = ds
        .problems
        .iter()
        .map(|p| (p.question(), p.reference.as_str()))
        .collect();
    assert_eq!(got, [("What is 2 + 2?", "4"), ("Café: 3 × 3?", "9 €")]);
}

#[cfg(feature = "parquet")]
#[test]
fn unannotated_binary_parquet_column_with_invalid_utf8_names_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.parquet");
    // Row 2's answer is Latin-1 ("caf\xe9"), not UTF-8.
    write_parquet(
        &path,
        SPARK_SCHEMA,
        &[
            Leaf::Bytes(&[b"What is 2 + 2?", b"Spell it"], None),
            Leaf::Bytes(&[b"4", b"caf\xe9"], None),
        ],
    );
    let e = rlvr_data::read::read_records(&path)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "{}:2: malformed record: column `answer` is binary without the UTF8/STRING annotation \
             and this value is not valid UTF-8 (byte 3 of 4): rlvr reads such columns as text \
             and does not guess an encoding; re-encode the column as UTF-8 strings",
            path.display()
        )
    );
    let c = DataConfig {
        question_field: Some("question".into()),
        style: PromptStyle::Plain,
        ..cfg(&path)
    };
    check_refused(&c, &[&e]);
}

/// Issue 49 item 11: a Parquet file's size does not bound its rows. A file of 10,000,001 rows of
/// one repeated value (dictionary and run-length encoded: a few KB on disk; the audit's 147 KB
/// file of 30 million rows aborted the loader at 5.6 GB) is refused from its footer, naming the
/// count and the limit, before a row is decoded.
#[cfg(feature = "parquet")]
#[test]
fn a_parquet_file_of_more_rows_than_the_limit_is_refused_from_its_footer() {
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.parquet");
    let schema = Arc::new(
        parquet::schema::parser::parse_message_type(
            "message m { required binary question (STRING); required binary answer (STRING); }",
        )
        .unwrap(),
    );
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(parquet::basic::Compression::SNAPPY)
            .build(),
    );
    let mut w =
        SerializedFileWriter::new(std::fs::File::create(&path).unwrap(), schema, props).unwrap();
    let rows = rlvr_data::read::MAX_PARQUET_ROWS + 1;
    let mut rg = w.next_row_group().unwrap();
    for text in ["What is 2 + 2?", "4"] {
        let mut col = rg.next_column().unwrap().unwrap();
        let chunk = vec![ByteArray::from(text); 1 << 20];
        let mut left = rows as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            col.typed::<ByteArrayType>()
                .write_batch(&chunk[..n], None, None)
                .unwrap();
            left -= n;
        }
        col.close().unwrap();
    }
    rg.close().unwrap();
    w.close().unwrap();
    let bytes = std::fs::metadata(&path).unwrap().len();
    assert!(bytes < 1 << 20, "{bytes} bytes on disk");
    let e = rlvr_data::read::read_records(&path)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "{}: 10000001 rows, more than rlvr reads from one Parquet file (10000000); split it \
             into files of at most that many rows, or sample it (pyarrow: \
             pq.write_table(table.slice(0, N), path, compression=\"snappy\"))",
            path.display()
        )
    );
}

/// Issue 49 item 11: one cell of 65 MiB (the audit's 200 MB cell aborted the loader) is an error
/// naming the row and the column, as a JSONL line over 64 MiB is; the row before it reads.
#[cfg(feature = "parquet")]
#[test]
fn a_parquet_cell_larger_than_a_jsonl_line_is_refused_naming_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob.parquet");
    let big = "x".repeat(rlvr_data::read::MAX_LINE_BYTES + (1 << 20));
    write_parquet(
        &path,
        "message m { required binary question (STRING); required binary answer (STRING); }",
        &[
            Leaf::Text(&["What is 2 + 2?", &big], None, None),
            Leaf::Text(&["4", "5"], None, None),
        ],
    );
    let mut seen = Vec::new();
    let e = rlvr_data::read::for_each_record(&path, |r| {
        seen.push(r.line);
        Ok(())
    })
    .unwrap_err()
    .to_string();
    assert_eq!(seen, [1]);
    assert!(
        e.starts_with(&format!("{}:2: ", path.display()))
            && e.contains("larger than 67108864 bytes")
            && e.contains("column `question` (a value of 68157440 bytes)"),
        "{e}"
    );
}
