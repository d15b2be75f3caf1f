//! Config precedence (defaults < preset < file < --set) and errors naming the offending key.

use rlvr_train::config::{apply_override, lr_at, parse_value, RawConfig, Schedule, TrainSection};

fn check_load(file: &str, sets: &[&str]) -> anyhow::Result<rlvr_train::config::ResolvedConfig> {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("c.toml");
    std::fs::write(&p, file).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    RawConfig::load(Some(&p), &sets)?.resolve()
}

#[test]
fn precedence_defaults_preset_file_set() {
    // Default: preset grpo → aggregation seq-mean-token-mean; train.lr default 1e-6.
    let c = check_load("", &[]).unwrap();
    assert_eq!(c.algorithm.preset, "grpo");
    assert_eq!(
        c.algorithm.aggregation,
        rlvr_algo::Aggregation::SeqMeanTokenMean
    );
    assert_eq!(c.raw.train.lr, 1e-6);
    // Preset over defaults: dapo sets clip_high 0.28 and token-mean.
    let c = check_load("[algorithm]\npreset = \"dapo\"\n", &[]).unwrap();
    assert_eq!(c.algorithm.clip_high, 0.28);
    assert_eq!(c.algorithm.aggregation, rlvr_algo::Aggregation::TokenMean);
    // File over preset; --set over file.
    let file = "[algorithm]\npreset = \"dapo\"\nclip_high = 0.3\n[train]\nlr = 1e-5\n";
    let c = check_load(file, &[]).unwrap();
    assert_eq!(c.algorithm.clip_high, 0.3);
    assert_eq!(c.raw.train.lr, 1e-5);
    let c = check_load(file, &["algorithm.clip_high=0.35", "train.lr=2e-5"]).unwrap();
    assert_eq!(c.algorithm.clip_high, 0.35);
    assert_eq!(c.raw.train.lr, 2e-5);
    // Later --set wins over earlier.
    let c = check_load("", &["train.steps=5", "train.steps=7"]).unwrap();
    assert_eq!(c.raw.train.steps, 7);
    // Strings fall back: a path without quotes.
    let c = check_load("", &["model.path=/models/q"]).unwrap();
    assert_eq!(c.raw.model.path.to_str(), Some("/models/q"));
}

#[test]
fn resolved_config_round_trips() {
    let c = check_load(
        "[algorithm]\npreset = \"rec_ring_is\"\n",
        &["sync.interval=4"],
    )
    .unwrap();
    let text = c.to_toml().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("config.toml");
    std::fs::write(&p, &text).unwrap();
    let again = RawConfig::load(Some(&p), &[]).unwrap().resolve().unwrap();
    assert_eq!(again.algorithm, c.algorithm);
    assert_eq!(again.raw, c.raw);
}

#[test]
fn unknown_keys_are_named() {
    for (file, sets, key) in [
        ("[train]\nlr_max = 1\n", vec![], "lr_max"),
        ("", vec!["train.lrr=1"], "lrr"),
        ("", vec!["sync.intervall=2"], "intervall"),
        ("[algorithmm]\n", vec![], "algorithmm"),
        ("", vec!["algorithm.clip_hi=0.3"], "clip_hi"),
        ("", vec!["data.promts_per_step=3"], "promts_per_step"),
    ] {
        let err = format!("{:#}", check_load(file, &sets).unwrap_err());
        assert!(
            err.contains(key),
            "error for `{key}` does not name it: {err}"
        );
    }
    // The dotted path of the enclosing table is given too.
    let err = format!("{:#}", check_load("", &["train.lrr=1"]).unwrap_err());
    assert!(err.contains("train"), "{err}");
}

#[test]
fn bad_values_are_named() {
    for (sets, key) in [
        (vec!["train.schedule=\"cosin\""], "schedule"),
        (vec!["rollout.temperature=0"], "rollout.temperature"),
        (vec!["sync.interval=0"], "sync.interval"),
        (vec!["algorithm.preset=\"nope\""], "nope"),
        (vec!["train.lr=\"fast\""], "lr"),
    ] {
        let err = format!("{:#}", check_load("", &sets).unwrap_err());
        assert!(
            err.contains(key),
            "error for {sets:?} does not name `{key}`: {err}"
        );
    }
}

#[test]
fn set_values_parse_as_toml_then_string() {
    assert_eq!(parse_value("1e-6"), toml::Value::Float(1e-6));
    assert_eq!(parse_value("3"), toml::Value::Integer(3));
    assert_eq!(parse_value("true"), toml::Value::Boolean(true));
    assert_eq!(parse_value("\"x\""), toml::Value::String("x".into()));
    assert_eq!(parse_value("gsm8k"), toml::Value::String("gsm8k".into()));
    assert_eq!(parse_value("a/b c"), toml::Value::String("a/b c".into()));
    let mut t = toml::Table::new();
    apply_override(&mut t, "data.verifier={ kind = \"math\" }").unwrap();
    assert!(t["data"]["verifier"].is_table());
    assert!(apply_override(&mut t, "novalue").is_err());
    assert!(apply_override(&mut t, "a..b=1").is_err());
}

#[test]
fn lr_schedules() {
    let base = TrainSection {
        lr: 1.0,
        min_lr: 0.0,
        steps: 10,
        warmup_steps: 2,
        ..Default::default()
    };
    let c = TrainSection {
        schedule: Schedule::Constant,
        ..base.clone()
    };
    assert_eq!(
        [lr_at(&c, 1), lr_at(&c, 2), lr_at(&c, 3), lr_at(&c, 10)],
        [0.5, 1.0, 1.0, 1.0]
    );
    let l = TrainSection {
        schedule: Schedule::Linear,
        ..base.clone()
    };
    // After warm-up: 1 − (t−2)/8.
    assert!((lr_at(&l, 6) - 0.5).abs() < 1e-12);
    assert!(lr_at(&l, 10).abs() < 1e-12);
    let k = TrainSection {
        schedule: Schedule::Cosine,
        ..base
    };
    assert!((lr_at(&k, 6) - 0.5).abs() < 1e-12); // half-way: cos(π/2) = 0
    assert!((lr_at(&k, 4) - 0.5 * (1.0 + (std::f64::consts::PI / 4.0).cos())).abs() < 1e-12);
    assert!(lr_at(&k, 10).abs() < 1e-12);
}
