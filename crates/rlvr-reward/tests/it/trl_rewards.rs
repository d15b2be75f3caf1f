//! `examples/trl_rewards.py`: reward functions written for TRL's GRPOTrainer (`tests/it/trl/
//! my_rewards.py`, in the shape of TRL's docs examples) run unchanged in a persistent verifier:
//! typed columns (lists, booleans, nested objects) reach them, conversational prompts give
//! conversational completions, several functions are summed with weights, None means "not
//! applicable", and an error names the function and the row.
#![cfg(unix)]

use std::path::PathBuf;
use std::time::Duration;

use rlvr_reward::persistent::PersistentVerifier;
use rlvr_reward::{Sample, Verifier, TYPED_COLUMNS};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
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

/// A verifier running the adapter on `funcs` (names in my_rewards.py) with `weights`.
fn adapter(funcs: &[&str], weights: &[f64]) -> PersistentVerifier {
    let rewards = root().join("crates/rlvr-reward/tests/it/trl/my_rewards.py");
    let mut cmd = vec![
        "python3".to_string(),
        root().join("examples/trl_rewards.py").display().to_string(),
    ];
    for f in funcs {
        cmd.push(format!("{}:{f}", rewards.display()));
    }
    if !weights.is_empty() {
        cmd.push("--weights".into());
        cmd.extend(weights.iter().map(|w| w.to_string()));
    }
    PersistentVerifier::new(cmd, Duration::from_secs(60), 0)
}

fn cols(solution: Option<&str>, typed: &str) -> Vec<(String, String)> {
    let mut c = vec![("question".to_string(), "2+2?".to_string())];
    if let Some(s) = solution {
        c.push(("solution".into(), s.into()));
    }
    c.push((TYPED_COLUMNS.into(), typed.into()));
    c
}

const CONV: &str = r#"{"prompt": [{"role": "system", "content": "Think."}, {"role": "user", "content": "2+2?"}],
  "allowed_lengths": [10, 40], "strict": true, "meta": {"level": 3, "tags": ["a"]}}"#;
const PLAIN: &str =
    r#"{"allowed_lengths": [1, 5], "strict": false, "meta": {"level": 0.5, "tags": []}}"#;

fn sample<'a>(completion: &'a str, columns: &'a [(String, String)], index: usize) -> Sample<'a> {
    Sample {
        prompt: "<rendered prompt>",
        completion,
        reference: "4",
        columns,
        index: Some(index),
    }
}

#[test]
fn typed_columns_and_conversational_completions_reach_the_functions() {
    if !python() {
        return;
    }
    let (conv, plain) = (cols(Some("4"), CONV), cols(Some("4"), PLAIN));
    let s = [sample("the answer is 4", &conv, 0), sample("4", &plain, 1)];
    let v = adapter(&["shapes"], &[]);
    let got: Vec<f64> = v
        .score_batch(&s)
        .unwrap()
        .iter()
        .map(|x| x.reward)
        .collect();
    // Row 0: a conversational prompt (list column) → conversational completion, + level 3.
    // Row 1: no prompt column → strings, + level 0.5 (a nested object's number).
    assert_eq!(got, [4.0, 10.5]);
}

#[test]
fn a_string_prompt_column_is_passed_as_the_dataset_holds_it() {
    if !python() {
        return;
    }
    let with = vec![("prompt".to_string(), "What is 2+2?".to_string())];
    let s = [sample("4", &with, 0), sample("4", &[], 1)];
    let v = adapter(&["prompt_length"], &[]);
    let got: Vec<f64> = v
        .score_batch(&s)
        .unwrap()
        .iter()
        .map(|x| x.reward)
        .collect();
    // The column's 12 characters, not the rendered prompt's; without it, the rendered one (17).
    assert_eq!(got, [12.0, "<rendered prompt>".len() as f64]);
}

#[test]
fn weighted_sum_of_accuracy_format_and_a_list_column_length_penalty() {
    if !python() {
        return;
    }
    let good = "<think>2 and 2</think> <answer>4</answer>"; // 41 characters
    assert_eq!(good.len(), 41);
    let (conv, plain, none) = (
        cols(Some("4"), CONV),
        cols(Some("5"), PLAIN),
        cols(None, PLAIN),
    );
    let s = [
        sample(good, &conv, 0),   // right, formatted, 1 over 40, strict: -2
        sample("4", &plain, 1),   // wrong (5), unformatted, within [1, 5]
        sample("so 4", &none, 2), // no solution: accuracy None
    ];
    let v = adapter(
        &["accuracy_reward", "format_reward", "length_penalty"],
        &[1.0, 0.5, 0.25],
    );
    let got = v.score_batch(&s).unwrap();
    let r: Vec<f64> = got.iter().map(|x| x.reward).collect();
    assert_eq!(r, [1.0 + 0.5 - 0.25 * 2.0, 0.0, 0.0]);
    assert!(got[0].correct && !got[1].correct);
    // The same batch twice: one process.
    assert_eq!(v.score_batch(&s).unwrap(), got);
    assert_eq!(v.starts(), 1);
}

#[test]
fn none_from_every_function_is_zero_and_default_weights_are_one() {
    if !python() {
        return;
    }
    let none = cols(None, PLAIN);
    let s = [sample("x", &none, 0)];
    let v = adapter(&["accuracy_reward"], &[]);
    assert_eq!(v.score_batch(&s).unwrap()[0].reward, 0.0);
    let with = cols(Some("x"), PLAIN);
    let s = [sample("x", &with, 0), sample("x", &none, 1)];
    let v = adapter(&["accuracy_reward", "accuracy_reward"], &[]);
    let r: Vec<f64> = v
        .score_batch(&s)
        .unwrap()
        .iter()
        .map(|x| x.reward)
        .collect();
    assert_eq!(r, [2.0, 0.0]);
}

#[test]
fn errors_name_the_function_and_the_row() {
    if !python() {
        return;
    }
    let c = cols(Some("4"), PLAIN);
    let s = [sample("fine", &c, 7), sample("boom", &c, 8)];
    let e = adapter(&["format_reward", "explode"], &[])
        .score_batch(&s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("explode") && e.contains("row 8") && e.contains("cannot score this one"),
        "{e}"
    );
    // The failing row's traceback alone: not chained to the batch call's ("During handling of
    // the above exception, another exception occurred", the same frames twice), and the
    // program's end is rlvr's doing, not a crash.
    assert_eq!(e.matches("Traceback").count(), 1, "{e}");
    assert!(!e.contains("During handling"), "{e}");
    assert!(
        e.contains("(rlvr then stopped the program: ") && !e.contains("it was killed"),
        "{e}"
    );
    let e = adapter(&["nan_reward"], &[])
        .score_batch(&s[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("nan_reward") && e.contains("row 7"), "{e}");
    // A missing function or a weight count that does not match: the program exits at start-up.
    let e = adapter(&["no_such_function"], &[])
        .score_batch(&s[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("no function 'no_such_function'"), "{e}");
    let e = adapter(&["format_reward"], &[1.0, 2.0])
        .score_batch(&s[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 weights for 1 functions"), "{e}");
}

/// `kind = "python"` is the adapter as a persistent external program, one function per component
/// with the components' weights: the rewards equal the adapter's own weighted sum above
/// (`weighted_sum_of_accuracy_format_and_a_list_column_length_penalty`), with the adapter run
/// from the copy rlvr carries and writes out (`rlvr_reward::trl::ADAPTER`).
#[test]
fn kind_python_components_equal_the_adapter_with_weights() {
    use rlvr_reward::combine::{ComponentConfig, RewardConfig, RewardFunction, VerifierConfig};
    if !python() {
        return;
    }
    let file = root().join("crates/rlvr-reward/tests/it/trl/my_rewards.py");
    let component = |name: &str, weight: f64| {
        let v: VerifierConfig = serde_json::from_value(serde_json::json!({
            "kind": "python", "function": format!("{}:{name}", file.display())
        }))
        .unwrap();
        ComponentConfig {
            name: Some(name.into()),
            weight,
            verifier: v,
        }
    };
    let cfg = RewardConfig {
        components: vec![
            component("accuracy_reward", 1.0),
            component("format_reward", 0.5),
            component("length_penalty", 0.25),
        ],
        format: None,
    };
    let f = RewardFunction::from_config(&cfg, &VerifierConfig::Math {}).unwrap();
    let good = "<think>2 and 2</think> <answer>4</answer>";
    let (conv, plain, none) = (
        cols(Some("4"), CONV),
        cols(Some("5"), PLAIN),
        cols(None, PLAIN),
    );
    let s = [
        sample(good, &conv, 0),
        sample("4", &plain, 1),
        sample("so 4", &none, 2),
    ];
    let got = f.score_batch(&s).unwrap();
    let r: Vec<f64> = got.iter().map(|x| x.reward).collect();
    assert_eq!(r, [1.0 + 0.5 - 0.25 * 2.0, 0.0, 0.0]);
    assert_eq!(
        got[0].components,
        [
            ("accuracy_reward".to_string(), 1.0),
            ("format_reward".to_string(), 1.0),
            ("length_penalty".to_string(), -2.0)
        ]
    );
    // The carried adapter is the example's, byte for byte.
    assert_eq!(
        rlvr_reward::trl::ADAPTER,
        std::fs::read_to_string(root().join("examples/trl_rewards.py")).unwrap()
    );
    let written = rlvr_reward::trl::adapter_path().unwrap();
    assert_eq!(
        std::fs::read_to_string(&written).unwrap(),
        rlvr_reward::trl::ADAPTER
    );
    // A function that is not FILE:NAME is refused naming the key.
    let bad: VerifierConfig =
        serde_json::from_value(serde_json::json!({"kind": "python", "function": "my_rewards.py"}))
            .unwrap();
    let e = bad
        .check("reward.components[0].verifier")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("reward.components[0].verifier.function") && e.contains("FILE.py:NAME"),
        "{e}"
    );
}
