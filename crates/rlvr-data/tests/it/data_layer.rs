//! The data layer end to end: real GSM8K / MATH-500 files, Parquet, field names, errors naming file,
//! line and field, templates, `max_prompt_len` filtering, generators, config parsing.

use rlvr_data::config::{DataConfig, FewShotExample, PromptStyle, TaskKind};
use rlvr_data::dataset::{build_prompts, load_split, Dataset};
use rlvr_data::generate::Split;
use rlvr_data::sampler::PromptSampler;
use rlvr_data::template::PromptBuilder;
use rlvr_data::{ChatMessage, DataError};
use rlvr_reward::combine::VerifierConfig;
use rlvr_reward::Sample;
use std::io::Write;
use std::path::{Path, PathBuf};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/");

fn shared(rel: &str) -> PathBuf {
    PathBuf::from(format!("{DATA}{rel}"))
}

fn jsonl_file(lines: &[&str]) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
    f
}

/// Scores every problem's own reference through the configured verifier.
fn self_scores(
    cfg: &DataConfig,
    ds: &Dataset,
    completion: impl Fn(&rlvr_data::dataset::Problem) -> String,
) -> Vec<f64> {
    let v = cfg.verifier().unwrap().build().unwrap();
    let completions: Vec<String> = ds.problems.iter().map(&completion).collect();
    let samples: Vec<Sample> = ds
        .problems
        .iter()
        .zip(&completions)
        .map(|(p, c)| Sample::new(c, &p.reference))
        .collect();
    v.score_batch(&samples)
        .unwrap()
        .into_iter()
        .map(|s| s.reward)
        .collect()
}

#[test]
fn gsm8k_files_load_with_u2028_and_score_their_own_solutions() {
    let cfg = DataConfig {
        task: TaskKind::Gsm8k,
        train: Some(shared("gsm8k/train.jsonl")),
        test: Some(shared("gsm8k/test.jsonl")),
        ..DataConfig::default()
    };
    cfg.validate().unwrap();
    let train = load_split(&cfg, Split::Train).unwrap();
    let test = load_split(&cfg, Split::Test).unwrap();
    assert_eq!((train.problems.len(), test.problems.len()), (7473, 1319));
    assert!(train.problems[2381].question().contains('\u{2028}'));
    assert!(train.problems[2381].source.ends_with(":2382"));
    let rewards = self_scores(&cfg, &test, |p| p.reference.clone());
    assert!(rewards.iter().all(|&r| r == 1.0));
    let prompts =
        build_prompts(&test, &PromptBuilder::from_config(&cfg), None, None, None).unwrap();
    assert!(prompts.prompts[0].text.starts_with("Janet"));
    assert!(prompts.prompts[0].text.ends_with("after \"####\"."));
}

#[test]
fn math500_loads_with_default_fields() {
    let cfg = DataConfig {
        task: TaskKind::Math500,
        test: Some(shared("math500/test.jsonl")),
        ..DataConfig::default()
    };
    let test = load_split(&cfg, Split::Test).unwrap();
    assert_eq!(test.problems.len(), 500);
    assert_eq!(
        test.problems[0].reference,
        "\\left( 3, \\frac{\\pi}{2} \\right)"
    );
    let rewards = self_scores(&cfg, &test, |p| format!("so \\boxed{{{}}}", p.reference));
    assert!(rewards.iter().all(|&r| r == 1.0));
    let text = &build_prompts(&test, &PromptBuilder::from_config(&cfg), None, None, None)
        .unwrap()
        .prompts[0]
        .text;
    assert!(text.ends_with("within \\boxed{}."), "{text}");
}

fn err_of(cfg: &DataConfig) -> String {
    load_split(cfg, Split::Train).unwrap_err().to_string()
}

#[test]
fn malformed_lines_and_missing_fields_name_file_line_and_field() {
    let f = jsonl_file(&[
        r#"{"question": "a", "answer": "1"}"#,
        "",
        r#"{"question": "b""#,
    ]);
    let cfg = DataConfig {
        train: Some(f.path().into()),
        ..DataConfig::default()
    };
    let e = err_of(&cfg);
    assert!(
        e.contains(&format!("{}:3: malformed record", f.path().display())),
        "{e}"
    );
    let f = jsonl_file(&[
        r#"{"question": "a", "answer": "1"}"#,
        r#"{"prompt": "b", "answer": "2"}"#,
    ]);
    let cfg = DataConfig {
        train: Some(f.path().into()),
        ..DataConfig::default()
    };
    let e = err_of(&cfg);
    assert!(
        e.contains(&format!(
            "{}:2: missing field `question`",
            f.path().display()
        )) && e.contains("data.question_field"),
        "{e}"
    );
    let f = jsonl_file(&[r#"{"question": ["x"], "answer": "1"}"#]);
    let cfg = DataConfig {
        train: Some(f.path().into()),
        ..DataConfig::default()
    };
    // A list is read as chat messages (docs/data.md, "Chat messages in the rows").
    assert!(err_of(&cfg).contains(":1: field `question[0]` is a string: a list in the question field is read as chat messages"));
    let f = jsonl_file(&[r#"{"question": {"x": 1}, "answer": "1"}"#]);
    let cfg = DataConfig {
        train: Some(f.path().into()),
        ..DataConfig::default()
    };
    assert!(err_of(&cfg).contains(
        ":1: field `question` must be a string or a list of chat messages, found an object"
    ));
    let f = jsonl_file(&["[1, 2]"]);
    let cfg = DataConfig {
        train: Some(f.path().into()),
        ..DataConfig::default()
    };
    assert!(err_of(&cfg).contains("expected a JSON object, found an array"));
    let cfg = DataConfig {
        train: Some("/no/such/file.jsonl".into()),
        ..DataConfig::default()
    };
    assert!(err_of(&cfg).contains("/no/such/file.jsonl"));
}

#[test]
fn custom_field_names_and_jsonl_task_with_its_verifier() {
    let f = jsonl_file(&[
        r#"{"q": "What is \\frac{1}{2} as a decimal?", "sol": "0.5", "topic": "fractions"}"#,
        r#"{"q": "Two plus two?", "sol": "4", "topic": "sums"}"#,
    ]);
    let mut cfg = DataConfig {
        task: TaskKind::Jsonl,
        train: Some(f.path().into()),
        question_field: Some("q".into()),
        answer_field: Some("sol".into()),
        template: Some("[{topic}] {question}".into()),
        ..DataConfig::default()
    };
    assert!(cfg
        .validate()
        .unwrap_err()
        .to_string()
        .contains("data.verifier"));
    cfg.verifier = Some(VerifierConfig::Math {});
    cfg.validate().unwrap();
    let ds = load_split(&cfg, Split::Train).unwrap();
    let rewards = self_scores(&cfg, &ds, |_| "\\boxed{\\frac12}".into());
    assert_eq!(rewards, [1.0, 0.0]);
    let p = build_prompts(&ds, &PromptBuilder::from_config(&cfg), None, None, None).unwrap();
    assert_eq!(p.prompts[1].text, "[sums] Two plus two?");
}

#[test]
fn jsonl_columns_keep_their_json_types_for_external_verifiers() {
    // A TRL-style conversational row with list, boolean, object and null columns.
    let f = jsonl_file(&[
        r#"{"prompt": [{"role": "user", "content": "2+2?"}], "solution": "4", "points": 2, "tags": ["a", "b"], "strict": true, "meta": {"level": 3}, "none": null}"#,
        r#"{"prompt": "Plain?", "solution": "5"}"#,
    ]);
    let cfg = DataConfig {
        task: TaskKind::Jsonl,
        train: Some(f.path().into()),
        question_field: Some("prompt".into()),
        answer_field: Some("solution".into()),
        verifier: Some(VerifierConfig::Math {}),
        style: PromptStyle::Chat,
        ..DataConfig::default()
    };
    let ds = load_split(&cfg, Split::Train).unwrap();
    let typed = rlvr_reward::typed_columns(&ds.problems[0].vars);
    let want = serde_json::json!({
        "question": "2+2?", "solution": "4", "points": 2, "tags": ["a", "b"], "strict": true,
        "meta": {"level": 3}, "none": null, "prompt": [{"role": "user", "content": "2+2?"}],
    });
    assert_eq!(serde_json::Value::Object(typed), want);
    // The item an external program receives: `row` as before (strings), `columns` typed.
    let item = rlvr_reward::external::item_json(&Sample {
        columns: &ds.problems[0].vars,
        ..Sample::default()
    });
    assert_eq!(item["row"]["points"], "2");
    assert!(item["row"].get("tags").is_none() && item["row"].get("{typed}").is_none());
    assert_eq!(item["columns"]["tags"], serde_json::json!(["a", "b"]));
    // A row of strings only carries no hidden column; a template cannot name it.
    let plain = &ds.problems[1].vars;
    assert!(plain.iter().all(|(k, _)| k != rlvr_reward::TYPED_COLUMNS));
    let e = rlvr_data::template::fill("{typed}", &ds.problems[0].vars).unwrap_err();
    assert!(!e.to_string().contains("{typed}\""), "{e}");
}

#[test]
fn countdown_from_file_and_generated() {
    let f = jsonl_file(&[
        r#"{"nums": [3, 4, 2], "target": 6}"#,
        r#"{"nums": "[1, 2]", "target": "3"}"#,
    ]);
    let cfg = DataConfig {
        task: TaskKind::Countdown,
        train: Some(f.path().into()),
        ..DataConfig::default()
    };
    let ds = load_split(&cfg, Split::Train).unwrap();
    let rewards = self_scores(&cfg, &ds, |p| {
        if p.reference.contains("[3,4,2]") {
            "<answer>3*4/2</answer>".into()
        } else {
            "<answer>1+2</answer>".into()
        }
    });
    assert_eq!(rewards, [1.0, 1.0]);
    let text = &build_prompts(&ds, &PromptBuilder::from_config(&cfg), None, None, None)
        .unwrap()
        .prompts[0]
        .text;
    assert!(
        text.starts_with("Using the numbers [3, 4, 2], create an equation that equals 6."),
        "{text}"
    );

    let mut gen = DataConfig {
        task: TaskKind::Countdown,
        seed: 5,
        ..DataConfig::default()
    };
    gen.countdown.train_size = 300;
    gen.countdown.test_size = 50;
    gen.countdown.numbers = 4;
    let train = load_split(&gen, Split::Train).unwrap();
    let test = load_split(&gen, Split::Test).unwrap();
    assert_eq!((train.problems.len(), test.problems.len()), (300, 50));
    assert!(test
        .problems
        .iter()
        .all(|t| train.problems.iter().all(|p| p.reference != t.reference)));
    // Seeded: the same config gives the same problems, a bigger set extends a smaller one.
    gen.countdown.train_size = 400;
    assert_eq!(
        load_split(&gen, Split::Train).unwrap().problems[..300],
        train.problems[..]
    );
}

#[test]
fn arithmetic_generated_matches_the_quickstart_shape() {
    let cfg = DataConfig {
        task: TaskKind::Arithmetic,
        ..DataConfig::default()
    };
    let train = load_split(&cfg, Split::Train).unwrap();
    assert_eq!(train.problems.len(), 10_000);
    for p in &train.problems[..100] {
        let q = p.question();
        assert_eq!(q.len(), 8, "{q}");
        let (a, b) = q.trim_end_matches('=').split_once('+').unwrap();
        let (a, b): (u32, u32) = (a.parse().unwrap(), b.parse().unwrap());
        assert!((10..=999).contains(&a) && (10..=999).contains(&b));
        assert_eq!(p.reference, (a + b).to_string());
    }
    let rewards = self_scores(
        &cfg,
        &Dataset {
            task: cfg.task,
            problems: train.problems[..50].to_vec(),
        },
        |p| p.reference.clone(),
    );
    assert!(rewards.iter().all(|&r| r == 1.0));
}

#[test]
fn max_prompt_len_filters_and_reports() {
    let f = jsonl_file(&[
        r#"{"question": "short", "answer": "1"}"#,
        r#"{"question": "a much much longer question here", "answer": "2"}"#,
        r#"{"question": "tiny", "answer": "3"}"#,
    ]);
    let cfg = DataConfig {
        task: TaskKind::Arithmetic,
        train: Some(f.path().into()),
        max_prompt_len: Some(2),
        ..DataConfig::default()
    };
    let ds = load_split(&cfg, Split::Train).unwrap();
    let words = |s: &str| -> anyhow::Result<usize> { Ok(s.split_whitespace().count()) };
    let set = build_prompts(
        &ds,
        &PromptBuilder::from_config(&cfg),
        None,
        cfg.max_prompt_len,
        Some(&words),
    )
    .unwrap();
    assert_eq!(set.dropped, 1);
    let prepared =
        rlvr_data::dataset::prepare_split(&cfg, Split::Train, None, Some(&words)).unwrap();
    assert_eq!(prepared.prompts, set);
    assert_eq!(
        set.prompts.iter().map(|p| p.problem).collect::<Vec<_>>(),
        [0, 2]
    );
    assert_eq!(set.max_len, 1);
    let e = build_prompts(
        &ds,
        &PromptBuilder::from_config(&cfg),
        None,
        Some(0),
        Some(&words),
    )
    .unwrap_err();
    assert!(e.to_string().contains("all 3 prompts"), "{e}");
    assert!(build_prompts(&ds, &PromptBuilder::from_config(&cfg), None, Some(5), None).is_err());
    // The sampler then indexes the kept prompts.
    let mut s = PromptSampler::new(set.prompts.len(), cfg.seed).unwrap();
    let mut b = s.next_batch(2);
    b.sort_unstable();
    assert_eq!(b, [0, 1]);
}

#[test]
fn chat_style_with_system_prompt_and_few_shot() {
    let f = jsonl_file(&[r#"{"question": "2+2=", "answer": "4"}"#]);
    let cfg = DataConfig {
        task: TaskKind::Arithmetic,
        train: Some(f.path().into()),
        style: PromptStyle::Chat,
        system_prompt: Some("Answer with a number.".into()),
        few_shot: vec![FewShotExample {
            question: "1+1=".into(),
            answer: "2".into(),
        }],
        ..DataConfig::default()
    };
    let ds = load_split(&cfg, Split::Train).unwrap();
    let seen = std::cell::RefCell::new(Vec::new());
    let render = |m: &[ChatMessage], gen: bool| -> anyhow::Result<String> {
        seen.borrow_mut().push((m.to_vec(), gen));
        Ok(format!("{} messages", m.len()))
    };
    let set = build_prompts(
        &ds,
        &PromptBuilder::from_config(&cfg),
        Some(&render),
        None,
        None,
    )
    .unwrap();
    assert_eq!(set.prompts[0].text, "4 messages");
    let (msgs, gen) = &seen.borrow()[0];
    assert!(gen);
    let roles: Vec<&str> = msgs.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(msgs[3].content, "2+2=");
    assert!(build_prompts(&ds, &PromptBuilder::from_config(&cfg), None, None, None).is_err());
}

#[test]
fn data_config_parses_from_toml_and_rejects_unknown_keys() {
    #[derive(serde::Deserialize, serde::Serialize)]
    struct Root {
        data: DataConfig,
    }
    let text = r#"
        [data]
        task = "countdown"
        prompts_per_step = 8
        seed = 3
        experiences = "exp.jsonl"
        template = "{numbers} -> {target}"
        [data.countdown]
        numbers = 4
        operators = ["+", "-"]
    "#;
    let root: Root = toml::from_str(text).unwrap();
    assert_eq!(root.data.task, TaskKind::Countdown);
    assert_eq!(root.data.countdown.numbers, 4);
    assert_eq!(
        root.data.experiences.as_deref(),
        Some(Path::new("exp.jsonl"))
    );
    root.data.validate().unwrap();
    let back: Root = toml::from_str(&toml::to_string(&root).unwrap()).unwrap();
    assert_eq!(back.data, root.data);
    let e = toml::from_str::<Root>("[data]\ntask = \"gsm8k\"\nprompt_per_step = 3\n")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("prompt_per_step"), "{e}");
    let e = toml::from_str::<Root>("[data]\ntask = \"gsm9k\"\n")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("gsm9k") && e.contains("math500"), "{e}");
    let e = toml::from_str::<Root>("[data]\nverifier = { kind = \"external\", command = [\"./v\"], timeout_s = 5 }\ntask = \"jsonl\"\n").unwrap();
    e.data.validate().unwrap();
    let bad = DataConfig {
        template: Some("{question".into()),
        ..DataConfig::default()
    };
    assert!(matches!(bad.validate(), Err(DataError::Template(_))));
}

#[cfg(feature = "parquet")]
#[test]
fn parquet_with_custom_fields() {
    use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("train.parquet");
    let schema = Arc::new(
        parquet::schema::parser::parse_message_type(
            "message m { required binary prompt (UTF8); optional binary gold (UTF8); required int64 id; }",
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
    let mut rg = w.next_row_group().unwrap();
    let mut k = 0;
    while let Some(mut col) = rg.next_column().unwrap() {
        match k {
            0 => {
                let v: Vec<ByteArray> = ["1+1=", "2+3=", "4+4="]
                    .iter()
                    .map(|s| ByteArray::from(*s))
                    .collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&v, None, None)
                    .unwrap();
            }
            1 => {
                // Row 3's gold is null.
                let v: Vec<ByteArray> = ["2", "5"].iter().map(|s| ByteArray::from(*s)).collect();
                col.typed::<ByteArrayType>()
                    .write_batch(&v, Some(&[1, 1, 0]), None)
                    .unwrap();
            }
            _ => {
                col.typed::<Int64Type>()
                    .write_batch(&[7, 8, 9], None, None)
                    .unwrap();
            }
        }
        col.close().unwrap();
        k += 1;
    }
    rg.close().unwrap();
    w.close().unwrap();

    let cfg = DataConfig {
        task: TaskKind::Arithmetic,
        train: Some(path.clone()),
        question_field: Some("prompt".into()),
        answer_field: Some("gold".into()),
        ..DataConfig::default()
    };
    let e = err_of(&cfg);
    assert!(
        e.contains(&format!("{}:3: missing field `gold`", path.display())),
        "{e}"
    );
    let records = rlvr_data::read::read_records(&path).unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(records[1].fields["prompt"], "2+3=");
    assert_eq!(records[1].fields["id"], 8);
    let cfg = DataConfig {
        answer_field: Some("id".into()),
        ..cfg
    };
    let ds = load_split(&cfg, Split::Train).unwrap();
    assert_eq!(ds.problems[2].question(), "4+4=");
    assert_eq!(ds.problems[2].reference, "9");
}

/// An empty data file is an error naming the file, and an empty or blank question one naming
/// file, line and field, when the file is loaded (they used to surface as "the dataset has no
/// prompts" without a file, or train on the template alone).
#[test]
fn an_empty_file_or_question_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n\n").unwrap();
    let cfg = DataConfig {
        task: TaskKind::Gsm8k,
        train: Some(empty.clone()),
        ..Default::default()
    };
    let err = load_split(&cfg, Split::Train).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{}: the file has no records", empty.display())),
        "{err}"
    );
    let blank = dir.path().join("blank.jsonl");
    std::fs::write(
        &blank,
        "{\"question\": \"2+2?\", \"answer\": \"#### 4\"}\n{\"question\": \" \\n\", \"answer\": \"#### 1\"}\n",
    )
    .unwrap();
    let cfg = DataConfig {
        train: Some(blank.clone()),
        ..cfg
    };
    let err = load_split(&cfg, Split::Train).unwrap_err().to_string();
    assert!(
        err.contains(&format!("{}:2: field `question` is empty", blank.display())),
        "{err}"
    );
}
