//! `examples/verl_rewards.py`: reward functions written for verl's `custom_reward_function`
//! (`tests/it/verl/my_reward.py`, `compute_score(data_source, solution_str, ground_truth,
//! extra_info=None)`) run unchanged in a persistent verifier: verl's four arguments come from the
//! row (its `data_source`, `reward_model.ground_truth` and `extra_info` columns, with their JSON
//! types) or from rlvr (the task's name, the reference, None), a number or a dict with `score`
//! is the reward, and an error names the function, its file and the row.
#![cfg(unix)]

use std::path::PathBuf;
use std::time::Duration;

use rlvr_reward::combine::{RewardConfig, RewardFunction, VerifierConfig};
use rlvr_reward::persistent::PersistentVerifier;
use rlvr_reward::{Sample, Score, Verifier, TYPED_COLUMNS};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rewards_file() -> PathBuf {
    root().join("crates/rlvr-reward/tests/it/verl/my_reward.py")
}

fn python() -> bool {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "python3 is needed by this test and was not found (Debian: apt-get install python3); a test does not pass without running");
    ok
}

/// A verifier running the adapter (the example file) on `function` of my_reward.py, with
/// `--data-source gsm8k`.
fn adapter(function: &str) -> PersistentVerifier {
    let cmd = vec![
        "python3".to_string(),
        root()
            .join("examples/verl_rewards.py")
            .display()
            .to_string(),
        format!("{}:{function}", rewards_file().display()),
        "--data-source".into(),
        "gsm8k".into(),
    ];
    PersistentVerifier::new(cmd, Duration::from_secs(60), 0)
}

/// A verl Parquet row as rlvr's `jsonl` task passes it: its string columns, and the others
/// (`reward_model`, `extra_info`) with their JSON types in the hidden typed column.
fn verl_row(source: &str, typed: &str) -> Vec<(String, String)> {
    vec![
        ("question".to_string(), "2+2?".to_string()),
        ("data_source".to_string(), source.to_string()),
        (TYPED_COLUMNS.to_string(), typed.to_string()),
    ]
}

fn sample<'a>(
    completion: &'a str,
    reference: &'a str,
    columns: &'a [(String, String)],
    index: usize,
) -> Sample<'a> {
    Sample {
        prompt: "<rendered prompt>",
        completion,
        reference,
        columns,
        index: Some(index),
    }
}

fn rewards(got: &[Score]) -> Vec<f64> {
    got.iter().map(|s| s.reward).collect()
}

#[test]
fn verls_four_arguments_come_from_the_row_or_from_rlvr() {
    if !python() {
        return;
    }
    let row = verl_row(
        "openai/gsm8k",
        r#"{"reward_model": {"style": "rule", "ground_truth": ["4", "four"]},
            "extra_info": {"split": "train", "index": 3}}"#,
    );
    let s = [sample("so 4", "4", &row, 0), sample("4", "#### 4", &[], 1)];
    let got = adapter("echo").score_batch(&s).unwrap();
    assert_eq!(rewards(&got), [0.5, 0.5]);
    let args: Vec<serde_json::Value> = got
        .iter()
        .map(|s| serde_json::from_str(s.extracted.as_deref().unwrap()).unwrap())
        .collect();
    // Row 0: the row's data_source, the completion, reward_model.ground_truth with its type (a
    // list), extra_info as the row holds it.
    assert_eq!(
        args[0],
        serde_json::json!(["openai/gsm8k", "so 4", ["4", "four"], {"split": "train", "index": 3}])
    );
    // Row 1: no columns: --data-source, the reference text, None.
    assert_eq!(args[1], serde_json::json!(["gsm8k", "4", "#### 4", null]));
}

#[test]
fn a_number_or_a_dict_with_score_is_the_reward() {
    if !python() {
        return;
    }
    let plain = verl_row("x", r#"{"reward_model": {"ground_truth": 4}}"#);
    let scaled = verl_row(
        "x",
        r#"{"reward_model": {"ground_truth": 4}, "extra_info": {"scale": 2.5}}"#,
    );
    let s = [
        sample("the answer is 4", "", &plain, 0),
        sample("4 or 5", "", &plain, 1),
        sample("4", "", &scaled, 2),
        sample("no number", "", &scaled, 3),
    ];
    // A float: 1 when the last number is the (integer) ground truth.
    let got = adapter("compute_score").score_batch(&s).unwrap();
    assert_eq!(rewards(&got), [1.0, 0.0, 1.0, 0.0]);
    assert_eq!(
        got.iter().map(|s| s.correct).collect::<Vec<_>>(),
        [true, false, true, false]
    );
    // A dict: `score` (± extra_info's scale), `acc` the correctness, `pred` the extracted
    // answer; the other key (`length`) is not read.
    let got = adapter("with_details").score_batch(&s).unwrap();
    assert_eq!(rewards(&got), [1.0, -1.0, 2.5, -2.5]);
    assert_eq!(
        got.iter().map(|s| s.correct).collect::<Vec<_>>(),
        [true, false, true, false]
    );
    assert_eq!(
        got.iter().map(|s| s.extracted.clone()).collect::<Vec<_>>(),
        [
            Some("4".to_string()),
            Some("5".into()),
            Some("4".into()),
            None
        ]
    );
    // verl's older signature (no extra_info) returning a bool: called without extra_info.
    let got = adapter("older").score_batch(&s).unwrap();
    assert_eq!(rewards(&got), [1.0, 1.0, 1.0, 0.0]);
}

#[test]
fn errors_name_the_function_its_file_and_the_row() {
    if !python() {
        return;
    }
    let c = verl_row("openai/gsm8k", "{}");
    let s = [sample("fine", "4", &c, 7), sample("boom", "4", &c, 8)];
    let file = rewards_file().display().to_string();
    let e = adapter("explode").score_batch(&s).unwrap_err().to_string();
    assert!(
        e.contains(&format!("explode ({file})"))
            && e.contains("raised on row 8")
            && e.contains("data_source 'openai/gsm8k'")
            && e.contains("ValueError: cannot score this one"),
        "{e}"
    );
    let e = adapter("nan_score")
        .score_batch(&s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("nan_score ({file}) returned score nan for row 7"))
            && e.contains("a finite number expected"),
        "{e}"
    );
    let e = adapter("no_score").score_batch(&s).unwrap_err().to_string();
    assert!(
        e.contains("no_score") && e.contains("a dict without 'score' for row 7"),
        "{e}"
    );
    let e = adapter("text_score")
        .score_batch(&s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("text_score") && e.contains("returned '1.0' for row 7"),
        "{e}"
    );
    // A function the file does not define: the program exits at start-up, saying so.
    let e = adapter("no_such_function")
        .score_batch(&s)
        .unwrap_err()
        .to_string();
    assert!(e.contains("defines no function 'no_such_function'"), "{e}");
}

/// `kind = "verl"` runs the copy of the adapter rlvr carries: `function` as a file alone is verl's
/// `compute_score`, `data_source` set by the config (the trainer sets the task's name) reaches the
/// function, and the component is named `verl`.
#[test]
fn kind_verl_runs_the_carried_adapter_on_compute_score() {
    if !python() {
        return;
    }
    let file = rewards_file();
    let mut v: VerifierConfig = serde_json::from_value(serde_json::json!({
        "kind": "verl", "function": file.display().to_string()
    }))
    .unwrap();
    v.default_data_source("jsonl");
    assert_eq!(
        v.command().unwrap()[1..],
        [
            "examples/verl_rewards.py".to_string(),
            file.display().to_string(),
            "--data-source".into(),
            "jsonl".into()
        ]
    );
    // A data_source the config gives is kept.
    let mut given = v.clone();
    if let VerifierConfig::Verl { data_source, .. } = &mut given {
        *data_source = Some("mine".into());
    }
    given.default_data_source("jsonl");
    assert_eq!(given.command().unwrap().last().unwrap(), "mine");

    let f = RewardFunction::from_config(&RewardConfig::default(), &v).unwrap();
    let plain = verl_row("x", r#"{"reward_model": {"ground_truth": "12"}}"#);
    let s = [
        sample("it is 12", "", &plain, 0),
        sample("it is 13", "", &plain, 1),
        sample("it is 9", "9", &[], 2),
    ];
    let got = f.score_batch(&s).unwrap();
    assert_eq!(
        got.iter().map(|b| b.reward).collect::<Vec<_>>(),
        [1.0, 0.0, 1.0]
    );
    assert_eq!(got[0].components, [("verl".to_string(), 1.0)]);

    // The carried adapter is the example's, byte for byte.
    assert_eq!(
        rlvr_reward::verl::ADAPTER,
        std::fs::read_to_string(root().join("examples/verl_rewards.py")).unwrap()
    );
    let written = rlvr_reward::verl::adapter_path().unwrap();
    assert!(
        written.ends_with("verl_rewards.py"),
        "{}",
        written.display()
    );
    assert_eq!(
        std::fs::read_to_string(&written).unwrap(),
        rlvr_reward::verl::ADAPTER
    );
}

#[test]
fn a_verl_function_that_is_not_file_or_file_name_is_refused_naming_the_key() {
    assert_eq!(
        rlvr_reward::verl::split_function("r.py"),
        Some(("r.py", "compute_score"))
    );
    assert_eq!(
        rlvr_reward::verl::split_function("r.py:score_fn"),
        Some(("r.py", "score_fn"))
    );
    assert_eq!(
        rlvr_reward::verl::split_function("runs/a:b/r.py"),
        Some(("runs/a:b/r.py", "compute_score"))
    );
    for bad in ["r.py:", ":compute_score", ""] {
        let v: VerifierConfig =
            serde_json::from_value(serde_json::json!({"kind": "verl", "function": bad})).unwrap();
        let e = v
            .check("reward.components[1].verifier")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("reward.components[1].verifier.function")
                && e.contains("not FILE.py or FILE.py:NAME"),
            "{bad:?}: {e}"
        );
    }
    let v: VerifierConfig = serde_json::from_value(
        serde_json::json!({"kind": "verl", "function": "r.py", "restarts": 1001}),
    )
    .unwrap();
    assert!(v
        .check("data.verifier")
        .unwrap_err()
        .to_string()
        .contains("data.verifier.restarts = 1001"));
}

/// A verl verifier table as a config file writes it (TOML).
fn verl_table(toml_text: &str) -> VerifierConfig {
    toml::from_str(toml_text).unwrap()
}

/// `kwargs` (verl's `custom_reward_function.reward_kwargs`) reach the function on every call
/// with their TOML types as Python's: integers as int, floats as float, booleans as bool,
/// strings as str, arrays as list, tables as dict; `scale` fills a named parameter. Before,
/// `kwargs` was an unknown key of a verl verifier (the docs said to give defaults instead).
#[test]
fn kwargs_reach_the_function_on_every_call_with_their_types() {
    if !python() {
        return;
    }
    let file = rewards_file().display().to_string();
    let v = verl_table(&format!(
        "kind = \"verl\"\nfunction = \"{file}:with_kwargs\"\n\
         kwargs = {{ scale = 3, eps = 0.25, strict = true, name = \"x\", tags = [\"a\", \"b\"], \
         table = {{ k = 1 }} }}\n"
    ));
    v.check("data.verifier").unwrap();
    assert_eq!(
        v.command().unwrap()[3..],
        [
            "--kwargs".to_string(),
            r#"{"eps":0.25,"name":"x","scale":3,"strict":true,"table":{"k":1},"tags":["a","b"]}"#
                .into()
        ]
    );
    let f = RewardFunction::from_config(&RewardConfig::default(), &v).unwrap();
    let s = [sample("a", "1", &[], 0), sample("b", "2", &[], 1)];
    for _ in 0..2 {
        let got = f.score_batch(&s).unwrap();
        assert_eq!(got.iter().map(|b| b.reward).collect::<Vec<_>>(), [3.0, 3.0]);
        let pred: serde_json::Value =
            serde_json::from_str(got[1].extracted.as_deref().unwrap()).unwrap();
        assert_eq!(
            pred,
            serde_json::json!([
                ["eps", "float", 0.25],
                ["name", "str", "x"],
                ["strict", "bool", true],
                ["table", "dict", {"k": 1}],
                ["tags", "list", ["a", "b"]]
            ])
        );
    }
    // The resolved config keeps them (a run directory's config.toml).
    let back: VerifierConfig = toml::from_str(&toml::to_string(&v).unwrap()).unwrap();
    assert_eq!(back, v);
}

/// What `kwargs` cannot hold is refused at the check, naming the entry: verl's own four
/// arguments (rlvr passes them from the row), a NaN or infinity (JSON cannot carry it), a TOML
/// date.
#[test]
fn kwargs_that_python_would_not_get_as_written_are_refused_naming_the_entry() {
    for (table, want) in [
        (
            "kwargs = { ground_truth = \"4\" }",
            "data.verifier.kwargs.ground_truth: rlvr passes `ground_truth` itself",
        ),
        (
            "kwargs = { cap = nan }",
            "data.verifier.kwargs.cap is not a finite number",
        ),
        (
            "kwargs = { caps = [1.0, inf] }",
            "data.verifier.kwargs.caps[1] is not a finite number",
        ),
        (
            "kwargs = { t = { since = 2024-01-01 } }",
            "data.verifier.kwargs.t.since is a TOML date or time",
        ),
    ] {
        let v = verl_table(&format!("kind = \"verl\"\nfunction = \"r.py\"\n{table}\n"));
        let e = v.check("data.verifier").unwrap_err().to_string();
        assert!(e.contains(want), "{table}: {e}");
    }
}

/// A dict's numeric keys besides `score` (verl's `reward_extra_info`) come back as the score's
/// `extra` (`acc` and `length` of with_details), and the reward function keys them by component
/// (one map per component); text, lists, None, NaN and infinity are left out, and a key may be
/// missing on some rows. Before, every key but score, acc and pred was dropped.
#[test]
fn a_dicts_extra_numbers_come_back_keyed_by_component() {
    if !python() {
        return;
    }
    let plain = verl_row("x", r#"{"reward_model": {"ground_truth": 4}}"#);
    let s = [
        sample("the answer is 4", "", &plain, 0),
        sample("4 or 5", "", &plain, 1),
    ];
    let got = adapter("with_details").score_batch(&s).unwrap();
    let extra = |k: usize| got[k].extra.clone().into_iter().collect::<Vec<_>>();
    assert_eq!(extra(0), [("acc".to_string(), 1.0), ("length".into(), 7.0)]);
    assert_eq!(extra(1), [("acc".to_string(), 0.0), ("length".into(), 7.0)]);

    let file = rewards_file().display().to_string();
    let v = verl_table(&format!(
        "kind = \"verl\"\nfunction = \"{file}:changing_extras\"\n"
    ));
    let f = RewardFunction::from_config(&RewardConfig::default(), &v).unwrap();
    let s = [sample("1+2", "", &[], 0), sample("12", "", &[], 1)];
    let got = f.score_batch(&s).unwrap();
    assert_eq!(got[0].components, [("verl".to_string(), 0.0)]);
    let extra = |k: usize| got[k].extra[0].clone().into_iter().collect::<Vec<_>>();
    assert_eq!(extra(0), [("bonus".to_string(), 0.5), ("hits".into(), 3.0)]);
    assert_eq!(extra(1), [("hits".to_string(), 2.0)]);
}
