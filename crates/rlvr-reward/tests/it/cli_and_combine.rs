//! `rlvr reward` (called through `cli::run`), external verifiers, weighted sums and the format reward.

use clap::Parser;
use rlvr_reward::cli::{run, RewardArgs};
use rlvr_reward::combine::{
    component_means, ComponentConfig, ExternalMode, RewardConfig, RewardFunction, VerifierConfig,
};
use rlvr_reward::format::FormatReward;
use rlvr_reward::gsm8k::Gsm8kMode;
use rlvr_reward::Sample;
use std::io::Write;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: RewardArgs,
}

/// Runs `rlvr reward ARGS` and returns its stdout lines parsed as JSON.
fn check_cli(argv: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let cli = Cli::try_parse_from(std::iter::once("reward").chain(argv.iter().copied()))?;
    let mut out = Vec::new();
    run(&cli.args, &mut out)?;
    Ok(String::from_utf8(out)?
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect())
}

#[test]
fn cli_single_completion() {
    let v = check_cli(&[
        "--completion",
        "so **$1,000**.",
        "--reference",
        "blah\n#### 1000",
    ])
    .unwrap();
    assert_eq!(
        v,
        [serde_json::json!({"reward": 1.0, "extracted": "1000", "gold": "1000"})]
    );
    let v = check_cli(&[
        "--completion",
        "the answer is 7",
        "--reference",
        "7",
        "--mode",
        "strict",
    ])
    .unwrap();
    assert_eq!(
        v[0],
        serde_json::json!({"reward": 0.0, "extracted": null, "gold": "7"})
    );
    let v = check_cli(&[
        "--task",
        "math",
        "--completion",
        "\\boxed{\\dfrac12}",
        "--reference",
        "0.5",
    ])
    .unwrap();
    assert_eq!(v[0]["reward"], 1.0);
    let v = check_cli(&[
        "--task",
        "countdown",
        "--numbers",
        "1,2,3",
        "--target",
        "9",
        "--completion",
        "<answer>(1+2)*3</answer>",
    ])
    .unwrap();
    assert_eq!(
        v[0],
        serde_json::json!({"reward": 1.0, "extracted": "(1+2)*3", "gold": "9"})
    );
    let v = check_cli(&[
        "--task",
        "countdown",
        "--numbers",
        "1,2,3",
        "--target",
        "9",
        "--completion",
        "<answer>(1+2)/(3-3)</answer>",
    ])
    .unwrap();
    assert_eq!(v[0]["reward"], 0.0);
    assert!(check_cli(&["--completion", "5"])
        .unwrap_err()
        .to_string()
        .contains("reference"));
    assert!(check_cli(&["--task", "countdown", "--completion", "1"]).is_err());
}

#[test]
fn cli_input_file_one_line_per_input_in_order() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    // U+2028 inside a string must not split the line.
    writeln!(
        f,
        r#####"{{"completion": "a\u2028b #### 5", "reference": "5"}}"#####
    )
    .unwrap();
    writeln!(f, r#####"{{"completion": "#### 6", "reference": "5"}}"#####).unwrap();
    writeln!(
        f,
        "{{\"completion\": \"7 \u{2028} 8\", \"reference\": \"8\"}}"
    )
    .unwrap();
    let path_buf = f.path().to_path_buf();
    let path = path_buf.to_str().unwrap();
    let v = check_cli(&["--input", path]).unwrap();
    let rewards: Vec<f64> = v.iter().map(|x| x["reward"].as_f64().unwrap()).collect();
    assert_eq!(rewards, [1.0, 0.0, 1.0]);
    // A malformed line is an error naming the file and line.
    writeln!(f, r#"{{"reference": "5"}}"#).unwrap();
    let err = format!("{:#}", check_cli(&["--input", path]).unwrap_err());
    assert!(
        err.contains(&format!("{path}:4")) && err.contains("completion"),
        "{err}"
    );
}

fn sh(script: &str, timeout_s: f64) -> VerifierConfig {
    VerifierConfig::External {
        command: vec!["sh".into(), "-c".into(), script.into()],
        timeout_s,
        mode: ExternalMode::PerBatch,
        restarts: 3,
        env: Vec::new(),
    }
}

fn score(
    cfg: RewardConfig,
    samples: &[Sample<'_>],
) -> Result<Vec<rlvr_reward::combine::RewardBreakdown>, String> {
    let f =
        RewardFunction::from_config(&cfg, &VerifierConfig::Math {}).map_err(|e| e.to_string())?;
    f.score_batch(samples).map_err(|e| e.to_string())
}

#[test]
fn external_verifier_protocol_and_failures() {
    let samples = [Sample::new("a", "1"), Sample::new("bb", "2")];
    let one = |v: VerifierConfig| RewardConfig {
        components: vec![ComponentConfig {
            name: None,
            weight: 1.0,
            verifier: v,
        }],
        format: None,
    };
    // Reward = length of the completion field, computed by a real child process reading JSON lines.
    let ok = sh(
        r#"while IFS= read -r l; do n=$(printf '%s' "$l" | sed 's/.*"completion":"\([^"]*\)".*/\1/' | tr -d '\n' | wc -c); echo "{\"reward\": $n}"; done"#,
        10.0,
    );
    let r = score(one(ok), &samples).unwrap();
    assert_eq!(r.iter().map(|b| b.reward).collect::<Vec<_>>(), [1.0, 2.0]);
    let e = score(one(sh("sleep 5", 0.3)), &samples).unwrap_err();
    assert!(e.contains("timed out after 0.3 s"), "{e}");
    let e = score(one(sh("echo boom >&2; exit 3", 10.0)), &samples).unwrap_err();
    assert!(e.contains("exit status: 3") && e.contains("boom"), "{e}");
    let e = score(
        one(sh("cat >/dev/null; echo '{\"reward\": 1}'", 10.0)),
        &samples,
    )
    .unwrap_err();
    assert!(e.contains("1 reply lines for 2 inputs"), "{e}");
    let e = score(
        one(sh(
            "cat >/dev/null; echo '{\"reward\": 1}'; echo nope",
            10.0,
        )),
        &samples,
    )
    .unwrap_err();
    assert!(e.contains("stdout line 2"), "{e}");
    let e = score(
        one(VerifierConfig::External {
            command: vec!["/no/such/verifier".into()],
            timeout_s: 1.0,
            mode: ExternalMode::PerBatch,
            restarts: 3,
            env: Vec::new(),
        }),
        &samples,
    )
    .unwrap_err();
    assert!(e.contains("could not start"), "{e}");
}

#[test]
fn weighted_sum_and_format_reported_separately() {
    let cfg: RewardConfig = serde_json::from_value(serde_json::json!({
        "components": [
            {"name": "strict", "weight": 0.5, "verifier": {"kind": "gsm8k", "mode": "strict"}},
            {"name": "flex", "weight": 1.0, "verifier": {"kind": "gsm8k"}},
        ],
        "format": {"bonus": 0.1, "penalty": -0.1},
    }))
    .unwrap();
    assert_eq!(
        cfg.components[1].verifier,
        VerifierConfig::Gsm8k {
            mode: Gsm8kMode::Flexible
        }
    );
    let samples = [
        Sample::new("<think>2+3</think><answer>#### 5</answer>", "5"),
        Sample::new("the answer is 5", "5"),
        Sample::new("<think>x</think><answer>4</answer>", "5"),
    ];
    let r = score(cfg, &samples).unwrap();
    let rewards: Vec<f64> = r
        .iter()
        .map(|b| (b.reward * 1000.0).round() / 1000.0)
        .collect();
    assert_eq!(rewards, [1.6, 0.9, 0.1]);
    assert_eq!(
        r.iter().map(|b| b.correct).collect::<Vec<_>>(),
        [true, false, false]
    );
    assert_eq!(
        r[1].components,
        [("strict".to_string(), 0.0), ("flex".to_string(), 1.0)]
    );
    assert_eq!(r[0].format, Some(0.1));
    let means = component_means(&r);
    assert_eq!(means[0].0, "reward/strict");
    assert_eq!(means[2].0, "reward/format");
    // Unknown keys and duplicate names are rejected.
    assert!(serde_json::from_value::<RewardConfig>(
        serde_json::json!({"components": [], "bogus": 1})
    )
    .is_err());
    let dup = RewardConfig {
        components: vec![
            ComponentConfig {
                name: None,
                weight: 1.0,
                verifier: VerifierConfig::Math {},
            },
            ComponentConfig {
                name: None,
                weight: 1.0,
                verifier: VerifierConfig::Math {},
            },
        ],
        format: Some(FormatReward::default()),
    };
    assert!(score(dup, &samples)
        .unwrap_err()
        .contains("two components are named `math` (by default, the verifier's kind)"));
}

/// Two `python` components (TRL's reward functions, as docs/coming-from-trl.md writes them) are
/// named after their functions by default, as TRL names its reward columns; they were both
/// `python`, and the config of the docs was refused as naming two components alike.
#[test]
fn python_components_are_named_after_their_functions() {
    let python = |function: &str| {
        serde_json::from_value::<VerifierConfig>(
            serde_json::json!({"kind": "python", "function": function}),
        )
        .unwrap()
    };
    let c = |name: Option<&str>, function: &str| ComponentConfig {
        name: name.map(String::from),
        weight: 1.0,
        verifier: python(function),
    };
    let cfg = RewardConfig {
        components: vec![
            c(None, "my_rewards.py:accuracy_reward"),
            c(None, "my_rewards.py:format_reward"),
            c(Some("mine"), "my_rewards.py:format_reward"),
        ],
        format: None,
    };
    cfg.check().unwrap();
    let names: Vec<String> = cfg.components.iter().map(|c| c.resolved_name()).collect();
    assert_eq!(names, ["accuracy_reward", "format_reward", "mine"]);
    let dup = RewardConfig {
        components: vec![c(None, "a.py:f"), c(None, "b.py:f")],
        format: None,
    };
    let e = dup.check().unwrap_err().to_string();
    assert!(
        e.contains("two components are named `f` (by default, its function's name)"),
        "{e}"
    );
}

/// A verifier that returns the number in the completion as the reward.
struct Echo;

impl rlvr_reward::Verifier for Echo {
    fn score(&self, s: &Sample<'_>) -> Result<rlvr_reward::Score, rlvr_reward::RewardError> {
        Ok(rlvr_reward::Score {
            reward: s.completion.parse().unwrap(),
            correct: false,
            extracted: None,
            gold: None,
            extra: Default::default(),
        })
    }
}

#[test]
fn a_non_finite_or_huge_reward_is_warned_about_once_naming_the_verifier() {
    let f = RewardFunction::new(
        vec![
            ("echo".into(), 1.0, Box::new(Echo)),
            ("tame".into(), 1.0, Box::new(Echo)),
        ],
        None,
    );
    let batch = |xs: &[&str]| {
        let samples: Vec<Sample> = xs.iter().map(|x| Sample::new(x, "")).collect();
        f.score_batch(&samples).unwrap()
    };
    batch(&["1", "-1e6"]);
    assert!(f.warnings().is_empty());
    let b = batch(&["NaN", "2e6"]);
    assert!(b[0].reward.is_nan() && b[1].reward == 4e6);
    batch(&["inf"]);
    let w = f.warnings();
    // One per verifier, the first value each saw.
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].contains("verifier `echo`") && w[0].contains("NaN"),
        "{w:?}"
    );
    assert!(
        w[1].contains("verifier `tame`") && w[1].contains("NaN"),
        "{w:?}"
    );
}

#[test]
fn reward_weights_and_verifier_timeouts_out_of_range_are_named() {
    let with = |weight: f64, format: Option<FormatReward>, timeout_s: f64| RewardConfig {
        components: vec![ComponentConfig {
            name: None,
            weight,
            verifier: sh("true", timeout_s),
        }],
        format,
    };
    for (cfg, key) in [
        (
            with(f64::NAN, None, 1.0),
            "reward.components[0].weight = NaN",
        ),
        (
            with(1e7, None, 1.0),
            "reward.components[0].weight = 10000000",
        ),
        (
            with(
                1.0,
                Some(FormatReward {
                    bonus: f64::NAN,
                    penalty: -0.1,
                }),
                1.0,
            ),
            "reward.format.bonus = NaN",
        ),
        (
            with(
                1.0,
                Some(FormatReward {
                    bonus: 0.1,
                    penalty: f64::NEG_INFINITY,
                }),
                1.0,
            ),
            "reward.format.penalty = -inf",
        ),
        (
            with(1.0, None, 1e300),
            "reward.components[0].verifier.timeout_s = 1e300",
        ),
        (
            with(1.0, None, 0.0),
            "reward.components[0].verifier.timeout_s = 0",
        ),
    ] {
        let e = cfg.check().unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("out of range"), "{key}: {e}");
        // Building refuses it too (the format bonus and the timeout without a panic).
        let sample = VerifierConfig::Math {};
        assert!(RewardFunction::from_config(&cfg, &sample).is_err(), "{key}");
    }
    with(
        -1e6,
        Some(FormatReward {
            bonus: 1e6,
            penalty: -1e6,
        }),
        1e6,
    )
    .check()
    .unwrap();
}

/// A verifier kind without keys (`math`, `countdown`) refuses any other key by name instead of
/// ignoring it (serde ignores the keys of an internally tagged unit variant), and its table
/// round-trips as `{ kind = "math" }`.
#[test]
fn a_key_set_on_a_verifier_kind_without_keys_is_refused() {
    for kind in ["math", "countdown"] {
        let e = serde_json::from_value::<VerifierConfig>(
            serde_json::json!({"kind": kind, "mode": "strict"}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `mode`"), "{kind}: {e}");
        let v: VerifierConfig =
            serde_json::from_value(serde_json::json!({ "kind": kind })).unwrap();
        assert_eq!(
            serde_json::to_value(&v).unwrap(),
            serde_json::json!({ "kind": kind })
        );
    }
}

#[test]
fn persistent_restarts_past_the_bound_are_refused_naming_the_key() {
    // Issue 49, item 12: `restarts = 4294967295` would restart a program that dies on every batch
    // for ever.
    let with = |restarts: u32| VerifierConfig::External {
        command: vec!["sh".into(), "-c".into(), "true".into()],
        timeout_s: 1.0,
        mode: ExternalMode::Persistent,
        restarts,
        env: Vec::new(),
    };
    let e = with(u32::MAX)
        .check("data.verifier")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.verifier.restarts = 4294967295 is out of range: at most 1000"),
        "{e}"
    );
    assert!(with(1001).build().is_err());
    with(1000).check("data.verifier").unwrap();
}
