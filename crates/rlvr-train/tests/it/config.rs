//! Config precedence (defaults < preset < file < --set), typed dtype and device, loss options, and
//! errors naming the offending key, where it came from and the fix.

use crate::common;

use rlvr_model::{ComputeDtype, DeviceSpec};
use rlvr_train::cli::{run_train, TrainArgs};
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
    assert_eq!(c.raw.algorithm.clip_high, Some(0.28));
    assert_eq!(c.algorithm.aggregation, rlvr_algo::Aggregation::TokenMean);
    // File over preset; --set over file.
    let file = "[algorithm]\npreset = \"dapo\"\nclip_high = 0.3\n[train]\nlr = 1e-5\n";
    let c = check_load(file, &[]).unwrap();
    assert_eq!(c.raw.algorithm.clip_high, Some(0.3));
    assert_eq!(c.raw.train.lr, 1e-5);
    let c = check_load(file, &["algorithm.clip_high=0.35", "train.lr=2e-5"]).unwrap();
    assert_eq!(c.raw.algorithm.clip_high, Some(0.35));
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

/// Issue 49 item 4: a run's config.toml holds every knob its preset resolved to, so `--resume RUN
/// --set algorithm.preset="dapo"` (or `--config RUN/config.toml --set ...`) used to record the
/// new preset while the old preset's values, written out as if by hand, kept the run on GRPO. Now
/// the knobs holding the old preset's values take the new preset's, a knob written by hand (here
/// std_eps) stays, and a start-up line names both.
#[test]
fn a_preset_changed_over_a_resolved_config_applies_in_full() {
    let written = check_load("", &["algorithm.std_eps=1e-3", "algorithm.preset=\"grpo\""]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.toml"), written.to_toml().unwrap()).unwrap();
    let want = check_load("", &["algorithm.std_eps=1e-3", "algorithm.preset=\"dapo\""])
        .unwrap()
        .algorithm;
    assert_ne!(want.policy, written.algorithm.policy);
    assert_ne!(want.aggregation, written.algorithm.aggregation);
    let sets = vec!["algorithm.preset=\"dapo\"".to_string()];
    let resumed = rlvr_train::config::ResolvedConfig::from_run_dir(tmp.path(), &sets).unwrap();
    let copied = RawConfig::load(Some(&tmp.path().join("config.toml")), &sets)
        .unwrap()
        .resolve()
        .unwrap();
    for (how, c) in [("--resume", &resumed), ("--config", &copied)] {
        assert_eq!(c.algorithm, want, "{how}");
        let note = c
            .warnings
            .iter()
            .find(|w| w.starts_with("algorithm.preset changes from \"grpo\""))
            .unwrap_or_else(|| panic!("{how}: no line about the preset: {:?}", c.warnings));
        assert!(note.contains("to \"dapo\" (--set)"), "{note}");
        assert!(
            note.contains("clip_high") && note.contains("aggregation"),
            "{note}"
        );
        assert!(
            note.contains("kept as written, as they differ from grpo's: std_eps"),
            "{note}"
        );
    }
    // The same preset again changes nothing and says nothing.
    let same = vec!["algorithm.preset=\"grpo\"".to_string()];
    let c = rlvr_train::config::ResolvedConfig::from_run_dir(tmp.path(), &same).unwrap();
    assert_eq!(c.algorithm, written.algorithm);
    assert!(!c
        .warnings
        .iter()
        .any(|w| w.contains("algorithm.preset changes")));
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
fn optimizer_keys_out_of_range_are_named_with_their_range() {
    for (set, key, range) in [
        ("train.beta1=1.0", "train.beta1 = 1", "[0, 1)"),
        ("train.beta1=-0.1", "train.beta1 = -0.1", "[0, 1)"),
        ("train.beta1=nan", "train.beta1 = NaN", "[0, 1)"),
        ("train.beta2=1.5", "train.beta2 = 1.5", "[0, 1)"),
        (
            "train.adam_eps=0.0",
            "train.adam_eps = 0",
            "a finite number in (0, 1]",
        ),
        (
            "train.adam_eps=inf",
            "train.adam_eps = inf",
            "a finite number in (0, 1]",
        ),
        (
            "train.weight_decay=-0.01",
            "train.weight_decay = -0.01",
            "[0, 1000]",
        ),
        (
            "train.weight_decay=nan",
            "train.weight_decay = NaN",
            "[0, 1000]",
        ),
        ("train.lr=nan", "train.lr = NaN", "a finite number > 0"),
        ("train.lr=0.0", "train.lr = 0", "a finite number > 0"),
        (
            "train.lr=-1e-6",
            "train.lr = -0.000001",
            "a finite number > 0",
        ),
        ("train.grad_clip=inf", "train.grad_clip = inf", "(0 = off)"),
        ("train.grad_clip=-1.0", "train.grad_clip = -1", "(0 = off)"),
        (
            "train.min_lr=1.0",
            "train.min_lr = 1",
            "[0, train.lr = 0.000001]",
        ),
    ] {
        let err = format!("{:#}", check_load("", &[set]).unwrap_err());
        assert!(
            err.contains(key) && err.contains(range),
            "{set}: expected `{key}` and `{range}` in: {err}"
        );
    }
    // The edges that are allowed.
    check_load(
        "",
        &[
            "train.beta1=0.0",
            "train.beta2=0.0",
            "train.weight_decay=0.0",
            "train.grad_clip=0.0",
        ],
    )
    .unwrap();
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

/// `model.dtype` and `model.device` are parsed once, at load, into enums; an unknown name fails
/// there with the key and the accepted names; the resolved config writes the canonical names.
#[test]
fn dtype_and_device_are_enums_with_the_accepted_values_listed() {
    let c = check_load("[model]\ndtype = \"bfloat16\"\ndevice = \"cuda\"\n", &[]).unwrap();
    assert_eq!(c.raw.model.dtype, ComputeDtype::Bf16);
    // `cuda` alone stays the local rank's GPU (cuda:0 in one process, cuda:{local rank} under a
    // data-parallel launcher).
    assert_eq!(c.raw.model.device, DeviceSpec::CudaLocal);
    let text = c.to_toml().unwrap();
    assert!(
        text.contains("dtype = \"bf16\"") && text.contains("device = \"cuda\""),
        "{text}"
    );
    let c = check_load("", &["model.device=\"cuda:3\""]).unwrap();
    assert_eq!(c.raw.model.device, DeviceSpec::Cuda(3));
    let err = format!("{:#}", check_load("", &["model.dtype=\"f8\""]).unwrap_err());
    for want in ["model.dtype", "\"f8\"", "f32", "bf16"] {
        assert!(err.contains(want), "{want}: {err}");
    }
    for bad in ["gpu", "cuda:x", "cuda0"] {
        let err = format!(
            "{:#}",
            check_load("", &[&format!("model.device=\"{bad}\"")]).unwrap_err()
        );
        assert!(
            err.contains("model.device") && err.contains(bad) && err.contains("cpu or cuda:N"),
            "{err}"
        );
    }
}

/// f16 without loss scaling is unsafe for training: refused with the alternatives named (inference
/// keeps it: `ComputeDtype::F16` parses).
#[test]
fn f16_is_refused_for_training() {
    let err = format!(
        "{:#}",
        check_load("", &["model.dtype=\"f16\""]).unwrap_err()
    );
    assert!(
        err.contains("model.dtype") && err.contains("f16") && err.contains("bf16"),
        "{err}"
    );
    assert_eq!("f16".parse::<ComputeDtype>().unwrap(), ComputeDtype::F16);
    assert!(check_load("", &["model.dtype=\"f64\""]).is_ok());
}

/// A CUDA device on a binary built without CUDA: the error names the override that runs on the CPU,
/// and through `rlvr train` (`cuda:0` and `cuda`, with `model.dtype = "auto"`) it comes before
/// anything else: the run directory is not created, so no config.toml, no train.log and no
/// resolved-`auto` line (it used to print `model.dtype = "auto" is bf16 on the GPU` first and
/// leave a run directory holding a config.toml).
#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_on_a_cpu_build_names_the_cpu_override() {
    let c = check_load("", &["model.device=\"cuda:0\""]).unwrap();
    let err = format!("{:#}", c.raw.model.open_device().unwrap_err());
    assert!(err.contains("--set model.device=\"cpu\""), "{err}");
    // Through `rlvr train`, with a model that loads.
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    for device in ["cuda:0", "cuda"] {
        let run = tmp.path().join(format!("run-{device}"));
        let mut set = common::arithmetic_sets(&model, &run);
        set.push(format!("model.device=\"{device}\""));
        set.push("model.dtype=\"auto\"".into());
        let args = TrainArgs {
            set,
            no_progress: true,
            ..Default::default()
        };
        let err = format!("{:#}", run_train(&args, &mut Vec::new()).unwrap_err());
        assert!(
            err.contains("--set model.device=\"cpu\""),
            "{device}: {err}"
        );
        assert!(err.contains("model.device"), "{device}: {err}");
        assert!(!run.exists(), "{device}: the run directory was created");
    }
}

/// An option of another loss that the user set (file or `--set`) is an error naming the key and the
/// loss; the preset's values for other losses are not.
#[test]
fn loss_options_of_another_loss_are_rejected() {
    for (file, sets, key, loss) in [
        (
            "",
            vec!["algorithm.preset=\"reinforce\"", "algorithm.clip_low=0.1"],
            "clip_low",
            "reinforce",
        ),
        (
            "[algorithm]\nloss = \"ppo\"\nkeep_mask = \"ring\"\n",
            vec![],
            "keep_mask",
            "ppo",
        ),
        ("", vec!["algorithm.rec_weight=\"is\""], "rec_weight", "ppo"),
        (
            "",
            vec!["algorithm.preset=\"cispo\"", "algorithm.dual_clip=3"],
            "dual_clip",
            "cispo",
        ),
        (
            "",
            vec!["algorithm.preset=\"dapo\"", "algorithm.adv_temperature=0.5"],
            "adv_temperature",
            "ppo",
        ),
    ] {
        let err = format!("{:#}", check_load(file, &sets).unwrap_err());
        assert!(
            err.contains(&format!("algorithm.{key}")) && err.contains(&format!("\"{loss}\"")),
            "{sets:?}: {err}"
        );
    }
    // The rec_ring_is preset sets the keep-mask, weight and ring ranges; with loss = ppo they are
    // preset values, not the user's: accepted.
    let c = check_load(
        "",
        &["algorithm.preset=\"rec_ring_is\"", "algorithm.loss=\"ppo\""],
    )
    .unwrap();
    assert_eq!(c.algorithm.policy.loss(), rlvr_algo::PolicyLoss::Ppo);
    // The same knob with a loss that reads it is fine.
    let c = check_load("", &["algorithm.preset=\"cispo\"", "algorithm.is_cap=2"]).unwrap();
    assert_eq!(
        c.algorithm.policy,
        rlvr_algo::Policy::Cispo(rlvr_algo::config::Cispo {
            clip_high: 0.28,
            is_cap: Some(2.0)
        })
    );
}

/// `config.toml` holds the knobs of the chosen loss only, and of those only the ones whose option
/// is on (a knob of `gates::GATES` whose option is off is left out: `adv_temperature` without
/// `rec_weight = "advantage-exp"`, `tau` without a regulariser), and still resolves to the same
/// algorithm.
#[test]
fn resolved_config_holds_only_the_keys_that_apply() {
    let algorithm_table = |text: &str| -> toml::Table {
        let t: toml::Table = text.parse().unwrap();
        t["algorithm"].as_table().unwrap().clone()
    };
    for (preset, present, absent) in [
        (
            "grpo",
            &["clip_low", "clip_high", "baseline", "aggregation"][..],
            &[
                "keep_mask",
                "rec_weight",
                "clip_low_prime",
                "clip_high_prime",
                "adv_temperature",
            ][..],
        ),
        (
            "rec_ring_is",
            &[
                "keep_mask",
                "rec_weight",
                "clip_low_prime",
                "clip_high_prime",
            ],
            &["dual_clip", "adv_temperature"],
        ),
        (
            "reinforce",
            &["baseline", "regulariser"],
            &[
                "clip_low",
                "clip_high",
                "keep_mask",
                "clip_low_prime",
                "tau",
            ],
        ),
        ("opmd", &["regulariser", "tau"], &["clip_low"]),
        ("cispo", &["clip_high"], &["clip_low", "keep_mask"]),
    ] {
        let c = check_load("", &[&format!("algorithm.preset=\"{preset}\"")]).unwrap();
        let text = c.to_toml().unwrap();
        let alg = algorithm_table(&text);
        for k in present {
            assert!(alg.contains_key(*k), "{preset}: {k} missing:\n{text}");
        }
        for k in absent {
            assert!(!alg.contains_key(*k), "{preset}: {k} written:\n{text}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("config.toml");
        std::fs::write(&p, &text).unwrap();
        let again = RawConfig::load(Some(&p), &[]).unwrap().resolve().unwrap();
        assert_eq!(again.algorithm, c.algorithm, "{preset}");
    }
}

/// `rollout.group_size = 1` never learns (every group baseline equals the one reward): an error naming
/// the key and the fix, unless `rollout.allow_group_size_one`; offline runs take groups from the file.
#[test]
fn group_size_one_is_refused_unless_allowed() {
    let err = format!(
        "{:#}",
        check_load("", &["rollout.group_size=1"]).unwrap_err()
    );
    assert!(
        err.contains("rollout.group_size = 1") && err.contains("rollout.allow_group_size_one"),
        "{err}"
    );
    let c = check_load(
        "",
        &["rollout.group_size=1", "rollout.allow_group_size_one=true"],
    )
    .unwrap();
    assert_eq!(c.raw.rollout.group_size, 1);
    assert!(check_load("", &["rollout.group_size=2"]).is_ok());
}

/// An error that a `--set` introduced is said to come from that `--set`, not from the file; one in
/// the file is said to come from the file.
#[test]
fn set_errors_are_blamed_on_the_set() {
    let file = "[train]\nlr = 1e-5\n";
    for (sets, key) in [
        (
            vec!["train.steps=3", "train.lr=\"fast\""],
            "--set train.lr=\"fast\"",
        ),
        (vec!["train.lrr=1", "train.steps=3"], "--set train.lrr=1"),
        (vec!["model.dtype=\"f8\""], "--set model.dtype=\"f8\""),
    ] {
        let err = format!("{:#}", check_load(file, &sets).unwrap_err());
        assert!(err.contains(key), "{err}");
        assert!(!err.contains("c.toml"), "blamed on the file: {err}");
    }
    let err = format!(
        "{:#}",
        check_load("[train]\nlr = \"fast\"\n", &["train.steps=3"]).unwrap_err()
    );
    assert!(err.contains("c.toml") && !err.contains("--set"), "{err}");
    // A --set that fixes the file's error is no error at all.
    let c = check_load("[train]\nlr = \"fast\"\n", &["train.lr=1e-4"]).unwrap();
    assert_eq!(c.raw.train.lr, 1e-4);
}

/// A value the types accept but a check refuses (out of range, contradicting another key) names
/// where the key was written: the file's line, or the `--set`; a key only the defaults set, or a
/// longer key that merely starts with a written one, names no place.
#[test]
fn value_errors_name_the_file_line_or_set_that_wrote_the_key() {
    let file = "[train]\nlr = 1e-5\n\n[env]\nbuiltin = \"retry\"\nmax_turns = 0\n";
    let err = check_load(file, &[]).unwrap_err().to_string();
    assert!(
        err.starts_with("env.max_turns = 0 is out of range: 1 to 1024"),
        "{err}"
    );
    assert!(err.ends_with("c.toml line 6)"), "{err}");
    let err = check_load("[train]\nlr = 1e-5\n", &["sync.interval=0"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("sync.interval"), "{err}");
    assert!(err.ends_with("(in --set sync.interval=0)"), "{err}");
    // rollout.group_size = 1 from the file: its line, not the allow key's (not written).
    let err = check_load("[rollout]\n\ngroup_size = 1\n", &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("group_size"), "{err}");
    assert!(err.ends_with("c.toml line 3)"), "{err}");
    // The written key is `train.lr`; the message names only others: no place is made up.
    let err = check_load("[train]\nlr = 1e-5\n", &["rollout.temperature=0"])
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("(in --set rollout.temperature=0)"), "{err}");
    assert!(!err.contains("c.toml"), "{err}");
}

/// A key the file writes and a `--set` overrides with a value a check refuses: the error names
/// the `--set` (whose value is in force), not the file's line, which holds a good value; of
/// several `--set`s of the key, the last.
#[test]
fn a_refused_value_from_a_set_over_the_files_key_names_the_set() {
    let file = "[train]\nlr = 1e-5\n\n[sync]\ninterval = 2\n";
    let err = check_load(file, &["train.lr=nan"]).unwrap_err().to_string();
    assert!(err.starts_with("train.lr = NaN is out of range"), "{err}");
    assert!(err.ends_with("(in --set train.lr=nan)"), "{err}");
    assert!(!err.contains("c.toml"), "{err}");
    let err = check_load(file, &["sync.interval=3", "sync.interval=0"])
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("(in --set sync.interval=0)"), "{err}");
    // The file's own bad value, overridden by nothing: still its line.
    let err = check_load(
        "[train]\nlr = 1e-5\n\n[sync]\ninterval = 0\n",
        &["train.lr=1e-4"],
    )
    .unwrap_err()
    .to_string();
    assert!(err.ends_with("c.toml line 5)"), "{err}");
}

/// `rlvr train` with no model: says model.path is required (not "loading the policy from :").
#[test]
fn train_without_a_model_says_model_path_is_required() {
    let tmp = tempfile::tempdir().unwrap();
    let args = TrainArgs {
        set: vec![format!("output.dir={}", tmp.path().join("run").display())],
        no_progress: true,
        ..Default::default()
    };
    let err = format!("{:#}", run_train(&args, &mut Vec::new()).unwrap_err());
    assert!(err.contains("model.path is required"), "{err}");
    assert!(!tmp.path().join("run").exists(), "nothing is written");
}

/// `rollout.backend = "vllm"`: servers are required, truncated sampling (top-p < 1,
/// top-k, min new tokens: vLLM renormalises its behaviour log-probs) is refused unless accepted,
/// and the keys round-trip through config.toml.
#[test]
fn vllm_backend_keys_are_checked() {
    let vllm = "rollout.backend=\"vllm\"";
    let err = format!("{:#}", check_load("", &[vllm]).unwrap_err());
    assert!(err.contains("rollout.servers"), "{err}");
    let server = "rollout.servers=[\"http://127.0.0.1:8000\"]";
    let c = check_load("", &[vllm, server]).unwrap();
    assert_eq!(
        c.raw.rollout.backend,
        rlvr_train::config::RolloutBackend::Vllm
    );
    assert_eq!(c.raw.rollout.served_model_name, "rlvr-policy");
    for bad in [
        "rollout.top_p=0.9",
        "rollout.top_k=20",
        "rollout.min_new_tokens=2",
    ] {
        let err = format!("{:#}", check_load("", &[vllm, server, bad]).unwrap_err());
        assert!(
            err.contains("rollout.accept_renormalised_logprobs = true"),
            "{bad}: {err}"
        );
        check_load(
            "",
            &[
                vllm,
                server,
                bad,
                "rollout.accept_renormalised_logprobs=true",
            ],
        )
        .unwrap();
        // The native engine records full-vocabulary log-probs: nothing to accept.
        check_load("", &[bad]).unwrap();
    }
    let err = format!(
        "{:#}",
        check_load("", &[vllm, server, "rollout.in_flight=0"]).unwrap_err()
    );
    assert!(err.contains("rollout.in_flight"), "{err}");
    // Issue 49, item 12: retries without bound would retry a dead server for ever.
    let err = format!(
        "{:#}",
        check_load("", &[vllm, server, "rollout.retries=4294967295"]).unwrap_err()
    );
    assert!(
        err.contains("rollout.retries = 4294967295 is out of range: at most 100"),
        "{err}"
    );
    check_load("", &[vllm, server, "rollout.retries=100"]).unwrap();
    // LoRA adapters are pushed to vLLM by name (no full-weight reload needed): accepted.
    check_load("", &[vllm, server, "model.lora_rank=8"]).unwrap();
    // Multi-turn episodes run on vLLM too (issue 45): later turns are one request per episode.
    let c = check_load("", &[vllm, server, "env.builtin=\"retry\""]).unwrap();
    assert!(c.raw.env.is_on());
    let err = format!(
        "{:#}",
        check_load("", &["rollout.backend=\"sglang\""]).unwrap_err()
    );
    assert!(err.contains("rollout.backend"), "{err}");
    // Round trip through the resolved config.toml.
    let c = check_load(
        "",
        &[
            vllm,
            server,
            "rollout.retries=1",
            "rollout.weights_dir=\"/w\"",
        ],
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("config.toml");
    std::fs::write(&p, c.to_toml().unwrap()).unwrap();
    let again = RawConfig::load(Some(&p), &[]).unwrap().resolve().unwrap();
    assert_eq!(again.raw.rollout, c.raw.rollout);
}

/// A vLLM backend whose server is not there: `rlvr train` stops before training with an error
/// naming the server and what it answered (here: nothing listens on the port).
#[test]
fn vllm_backend_without_a_server_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let run = tmp.path().join("run");
    let mut set = common::arithmetic_sets(&model, &run);
    set.extend([
        "rollout.backend=\"vllm\"".to_string(),
        "rollout.servers=[\"http://127.0.0.1:9\"]".into(),
        "rollout.retries=0".into(),
        "rollout.request_timeout_s=5".into(),
        "train.steps=2".into(),
    ]);
    let args = TrainArgs {
        set,
        no_progress: true,
        ..Default::default()
    };
    let err = format!("{:#}", run_train(&args, &mut Vec::new()).unwrap_err());
    assert!(err.contains("vLLM server http://127.0.0.1:9"), "{err}");
    assert!(err.contains("rollout.backend = \"vllm\""), "{err}");
    let run_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_json["rollout_backend"]["backend"], "vllm");
    assert_eq!(
        run_json["rollout_backend"]["accept_renormalised_logprobs"],
        false
    );
    // The default prefix-cache salt, recorded.
    assert_eq!(run_json["rollout_backend"]["cache_salt"], "version");
    assert!(
        !run.join("metrics.jsonl").exists()
            || std::fs::read_to_string(run.join("metrics.jsonl"))
                .unwrap()
                .is_empty()
    );
}

/// Issue 49 item 15: `rlvr eval --config RUN/config.toml` ignored the run's `[eval]` section (a
/// flag left out meant its own default). A flag left out now keeps the config's value: here 3
/// problems at 2 samples each, as the run evaluated; a flag given still wins.
#[test]
fn eval_keeps_the_configs_eval_section_where_no_flag_is_given() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        "[data]\ntask = \"arithmetic\"\n[data.arithmetic]\nmin_digits = 1\nmax_digits = 1\n\
         train_size = 16\ntest_size = 8\n[eval]\nsamples = 2\nlimit = 3\nmax_new_tokens = 4\n\
         [model]\ndevice = \"cpu\"\ndtype = \"f32\"\n",
    )
    .unwrap();
    let items = tmp.path().join("items.jsonl");
    // (problems, samples written to --out) of one evaluation.
    let run = |n: Option<usize>, limit: Option<usize>| {
        let args = rlvr_train::cli::EvalArgs {
            model: model.clone(),
            config: Some(config.clone()),
            n,
            limit,
            out: Some(items.clone()),
            ..Default::default()
        };
        let mut out = Vec::new();
        rlvr_train::cli::run_eval(&args, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let samples = std::fs::read_to_string(&items).unwrap().lines().count();
        (v["n"].as_u64().unwrap(), samples)
    };
    assert_eq!(run(None, None), (3, 6));
    assert_eq!(run(Some(1), Some(2)), (2, 2));
}

/// `rlvr eval` takes the same rollout keys as `rlvr train`: with `rollout.backend = "vllm"` and no
/// server it stops with an error naming the server.
#[test]
fn eval_with_the_vllm_backend_names_a_missing_server() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let args = rlvr_train::cli::EvalArgs {
        model,
        task: Some("arithmetic".into()),
        n: None,
        limit: Some(2),
        // Within the tiny model's 128 positions (the default 256 is refused at start-up).
        max_new_tokens: Some(4),
        set: vec![
            "rollout.backend=\"vllm\"".into(),
            "rollout.servers=[\"http://127.0.0.1:9\"]".into(),
            "rollout.retries=0".into(),
        ],
        ..Default::default()
    };
    let err = format!(
        "{:#}",
        rlvr_train::cli::run_eval(&args, &mut Vec::new()).unwrap_err()
    );
    assert!(err.contains("vLLM server http://127.0.0.1:9"), "{err}");
}

#[test]
fn eval_refuses_a_server_leased_to_a_training_run_unless_told_to_share() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    // Port 7 is nobody's: the lease is all this test touches (the default lease directory, as
    // `rlvr train` takes it).
    let url = "http://127.0.0.1:7";
    let mut lease = rlvr_vllm::ServerLease::acquire(
        &[url.to_string()],
        rlvr_vllm::LeaseHolder::new("training run /runs/the-other-one", true),
    )
    .unwrap();
    lease.tag(12).unwrap();
    let args = |share: bool| rlvr_train::cli::EvalArgs {
        model: model.clone(),
        task: Some("arithmetic".into()),
        n: None,
        limit: Some(2),
        // Within the tiny model's 128 positions (the default 256 is refused at start-up).
        max_new_tokens: Some(4),
        set: vec![
            "rollout.backend=\"vllm\"".into(),
            format!("rollout.servers=[\"{url}\"]"),
            "rollout.retries=0".into(),
        ],
        share_server: share,
        ..Default::default()
    };
    let err = format!(
        "{:#}",
        rlvr_train::cli::run_eval(&args(false), &mut Vec::new()).unwrap_err()
    );
    assert!(
        err.contains(url)
            && err.contains("is leased to training run /runs/the-other-one")
            && err.contains("weights at version 12")
            && err.contains("--share-server"),
        "{err}"
    );
    // --share-server goes on to the server (which is not there).
    let err = format!(
        "{:#}",
        rlvr_train::cli::run_eval(&args(true), &mut Vec::new()).unwrap_err()
    );
    assert!(
        !err.contains("is leased") && err.contains("vLLM server http://127.0.0.1:7"),
        "{err}"
    );
}

#[test]
fn eval_out_on_an_unwritable_path_fails_before_the_evaluation() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("no-such-dir/items.jsonl");
    // The model does not exist either: the --out check comes first (the old code loaded the
    // model and evaluated before it found the path unwritable).
    let args = rlvr_train::cli::EvalArgs {
        model: tmp.path().join("no-model"),
        task: Some("arithmetic".into()),
        n: None,
        out: Some(bad.clone()),
        ..Default::default()
    };
    let err = format!(
        "{:#}",
        rlvr_train::cli::run_eval(&args, &mut Vec::new()).unwrap_err()
    );
    assert!(
        err.contains(&format!("--out {}", bad.display())) && err.contains("cannot be written"),
        "{err}"
    );
    // A writable path is not left behind by the check alone.
    let good = tmp.path().join("items.jsonl");
    args_with_out(&tmp, &good);
    assert!(!good.exists());
}

fn args_with_out(tmp: &tempfile::TempDir, out: &std::path::Path) {
    let args = rlvr_train::cli::EvalArgs {
        model: tmp.path().join("no-model"),
        task: Some("arithmetic".into()),
        n: None,
        out: Some(out.to_path_buf()),
        ..Default::default()
    };
    assert!(rlvr_train::cli::run_eval(&args, &mut Vec::new()).is_err());
}

/// Every knob of `gates::GATES`, a value for it, the `--set`s that leave its option off (on top of
/// the defaults, preset `grpo`) and those that turn it on. Listed by hand, so that a knob added to
/// `GATES` without a line here fails `every_gated_knob_is_refused_with_its_option_off`.
const GATED: &[(&str, &str, &[&str], &[&str])] = &[
    (
        "algorithm.lme_temperature",
        "2.0",
        &[],
        &["algorithm.baseline=\"log-mean-exp\""],
    ),
    (
        "algorithm.std_eps",
        "1e-4",
        &["algorithm.std_norm=\"none\""],
        &[],
    ),
    (
        "algorithm.std_level",
        "\"batch\"",
        &["algorithm.std_norm=\"none\""],
        &[],
    ),
    (
        "algorithm.red_drop_in_normaliser",
        "true",
        &[],
        &["algorithm.red_drop=true"],
    ),
    (
        "algorithm.red_drop_rule",
        "\"bernoulli\"",
        &[],
        &["algorithm.red_drop=true"],
    ),
    (
        "algorithm.clip_low_prime",
        "0.7",
        &["algorithm.preset=\"rec_oneside_nois\""],
        &["algorithm.preset=\"rec_ring_nois\""],
    ),
    (
        "algorithm.clip_high_prime",
        "3.0",
        &["algorithm.preset=\"rec_oneside_nois\""],
        &["algorithm.preset=\"rec_ring_nois\""],
    ),
    (
        "algorithm.adv_temperature",
        "2.0",
        &["algorithm.preset=\"rec_oneside_nois\""],
        &["algorithm.preset=\"red_weight\""],
    ),
    ("algorithm.tau", "0.2", &[], &["algorithm.preset=\"opmd\""]),
    (
        "algorithm.kl_estimator",
        "\"k2\"",
        &[],
        &["algorithm.kl_coef=0.01"],
    ),
    (
        "algorithm.kl_ratio_weighted",
        "true",
        &[],
        &["algorithm.kl_coef=0.01"],
    ),
    (
        "model.reference",
        "\"/models/ref\"",
        &[],
        &["algorithm.kl_coef=0.01"],
    ),
    (
        "algorithm.mismatch_cap",
        "3.0",
        &[],
        &["algorithm.mismatch_correction=\"token-truncate\""],
    ),
    (
        "algorithm.mismatch_low",
        "0.5",
        &["algorithm.mismatch_correction=\"token-truncate\""],
        &["algorithm.mismatch_correction=\"icepop\""],
    ),
    (
        "algorithm.mismatch_k3_threshold",
        "0.02",
        &["algorithm.mismatch_correction=\"token-mask\""],
        &["algorithm.mismatch_correction=\"sequence-k3-mask\""],
    ),
    (
        "algorithm.overlong_buffer_frac",
        "0.1",
        &[],
        &["algorithm.overlong=\"soft\""],
    ),
    (
        "algorithm.overlong_penalty_factor",
        "0.5",
        &[],
        &["algorithm.overlong=\"soft\""],
    ),
    ("train.min_lr", "1e-7", &[], &["train.schedule=\"cosine\""]),
    (
        "train.dynamic_sampling_max_rounds",
        "2",
        &[],
        &["algorithm.dynamic_sampling=true"],
    ),
    (
        "train.dynamic_sampling_short_batch",
        "\"error\"",
        &[],
        &["algorithm.dynamic_sampling=true"],
    ),
    ("model.lora_alpha", "16.0", &[], &["model.lora_rank=4"]),
    (
        "model.lora_targets",
        "[\"q\", \"v\"]",
        &[],
        &["model.lora_rank=4"],
    ),
    ("model.lora_dropout", "0.1", &[], &["model.lora_rank=4"]),
    (
        "rollout.servers",
        "[\"http://127.0.0.1:8000\"]",
        &[],
        &["rollout.backend=\"vllm\""],
    ),
    ("rollout.served_model_name", "\"m\"", &[], VLLM),
    ("rollout.weights_dir", "\"/tmp/w\"", &[], VLLM),
    ("rollout.api_key_env", "\"KEY\"", &[], VLLM),
    ("rollout.request_timeout_s", "60.0", &[], VLLM),
    ("rollout.retries", "1", &[], VLLM),
    ("rollout.in_flight", "2", &[], VLLM),
    ("rollout.accept_renormalised_logprobs", "true", &[], VLLM),
    ("rollout.refresh_tolerance", "1e-3", &[], VLLM),
    ("rollout.cache_salt", "\"off\"", &[], VLLM),
];

/// The knobs of `GATED` whose option rlvr-algo's own check names first, with its message.
const ALGO_REFUSES: &[(&str, &str)] = &[
    (
        "algorithm.red_drop_rule",
        "resolving [algorithm]: invalid `algorithm.red_drop_rule` = bernoulli: it chooses \
         RED-Drop's dropped rows: set red_drop = true, or remove it",
    ),
    (
        "algorithm.mismatch_low",
        "resolving [algorithm]: invalid `algorithm.mismatch_low` = 0.5: only token-mask, \
         sequence-mask, geometric-mask and icepop have a lower bound; remove it, or choose one of \
         those as mismatch_correction",
    ),
];

/// The vLLM backend with a server.
const VLLM: &[&str] = &[
    "rollout.backend=\"vllm\"",
    "rollout.servers=[\"http://127.0.0.1:8000\"]",
];

/// Each knob read only when another option is on: set with that option off, the error names the
/// knob, the `--set` that wrote it, the option and its value in force, and the values that would
/// read it; set with the option on, it loads and takes the value.
#[test]
fn every_gated_knob_is_refused_with_its_option_off() {
    use rlvr_train::config::gates::GATES;
    let listed: Vec<&str> = GATED.iter().map(|g| g.0).collect();
    let gates: Vec<&str> = GATES.iter().map(|g| g.key).collect();
    assert_eq!(listed, gates, "GATED must list gates::GATES in order");
    for (g, (key, value, off, on)) in GATES.iter().zip(GATED) {
        let set = format!("{key}={value}");
        let mut sets: Vec<&str> = off.to_vec();
        sets.push(&set);
        let err = format!("{:#}", check_load("", &sets).unwrap_err());
        let (table, field) = key.rsplit_once('.').unwrap();
        // Two knobs rlvr-algo refuses first, naming the option too.
        // Its message then says where the knob was written.
        if let Some(want) = ALGO_REFUSES.iter().find(|(k, _)| k == key).map(|(_, m)| m) {
            assert_eq!(err, format!("{want} (in --set {set})"), "{key}");
            continue;
        }
        let head = format!(
            "{key} is set (--set {set}) but nothing reads it: {} = ",
            g.gate
        );
        let tail = format!(
            ", and {field} is read only when {} is {}; remove `{field}` from [{table}], or set {}",
            g.gate, g.when, g.gate
        );
        assert!(
            err.starts_with(&head) && err.ends_with(&tail),
            "{key}:\n{err}\nwant: {head}…{tail}"
        );
        let mut sets: Vec<&str> = on.to_vec();
        sets.push(&set);
        let c = check_load("", &sets).unwrap_or_else(|e| panic!("{key} with {on:?}: {e:#}"));
        // The value was taken: the resolved config holds it.
        let text = c.to_toml().unwrap();
        let resolved: toml::Table = text.parse().unwrap();
        let want = rlvr_train::config::parse_value(value);
        let got = &resolved[table][field];
        assert_eq!(got, &want, "{key}:\n{text}");
    }
}

/// Two gated knobs in full: the value of the option in force and the file line that wrote it.
#[test]
fn a_gated_knob_error_names_its_option_and_where_it_was_written() {
    let err = format!("{:#}", check_load("", &["algorithm.tau=0.2"]).unwrap_err());
    assert_eq!(
        err,
        "algorithm.tau is set (--set algorithm.tau=0.2) but nothing reads it: \
         algorithm.regulariser = \"none\", and tau is read only when algorithm.regulariser is \
         \"opmd\" or \"asymre\"; remove `tau` from [algorithm], or set algorithm.regulariser"
    );
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("c.toml");
    std::fs::write(
        &p,
        "[model]\npath = \"m\"\n\n[algorithm]\nmismatch_cap = 3.0\n",
    )
    .unwrap();
    let err = format!(
        "{:#}",
        RawConfig::load(Some(&p), &[])
            .unwrap()
            .resolve()
            .unwrap_err()
    );
    assert_eq!(
        err,
        format!(
            "algorithm.mismatch_cap is set ({} line 5) but nothing reads it: \
             algorithm.mismatch_correction = \"none\", and mismatch_cap is read only when \
             algorithm.mismatch_correction is a truncation, a mask or \"icepop\"; remove \
             `mismatch_cap` from [algorithm], or set algorithm.mismatch_correction",
            p.display()
        )
    );
}

/// A documented key that says it is read only under another option has a gate.
#[test]
fn every_key_documented_as_conditional_has_a_gate() {
    use rlvr_train::config::gates::GATES;
    let reference = rlvr_train::config::reference_markdown();
    for line in reference.lines() {
        let Some((key, meaning)) = line.strip_prefix("| `").and_then(|l| l.split_once("` | "))
        else {
            continue;
        };
        let conditional = ["vLLM backend:", "Only read with", "Loaded only when"]
            .iter()
            .any(|p| meaning.contains(p))
            || key.starts_with("train.dynamic_sampling_");
        if conditional {
            assert!(
                GATES.iter().any(|g| g.key == key),
                "{key} is documented as read only under another option but has no gate: {meaning}"
            );
        }
    }
}

/// A peer's name (TRL's GRPOConfig, verl's ppo_trainer.yaml) is refused with our key and what
/// differs, whether written in a file or by `--set`.
#[test]
fn a_peers_key_names_ours() {
    let err = format!(
        "{:#}",
        check_load("", &["train.learning_rate=1e-6"]).unwrap_err()
    );
    assert_eq!(
        err,
        "in --set train.learning_rate=1e-6: unknown key: `train.learning_rate` is TRL's name, not \
         rlvr's: write `lr = …` in [train] (or --set train.lr=…) for train.lr (the peak learning \
         rate); rlvr does not accept the peers' names, so that each key has one meaning"
    );
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("c.toml");
    std::fs::write(&p, "[rollout]\ngroup_size = 8\nnum_generations = 8\n").unwrap();
    let err = format!("{:#}", RawConfig::load(Some(&p), &[]).unwrap_err());
    assert_eq!(
        err,
        format!(
            "in {} line 3: unknown key: `rollout.num_generations` is TRL's name, not rlvr's: \
             write `group_size = …` in [rollout] (or --set rollout.group_size=…) for \
             rollout.group_size (K, completions per prompt); rlvr does not accept the peers' \
             names, so that each key has one meaning",
            p.display()
        )
    );
    for (set, ours, peer) in [
        ("algorithm.beta=0.04", "algorithm.kl_coef", "TRL"),
        (
            "actor_rollout_ref.rollout.n=8",
            "rollout.group_size",
            "verl",
        ),
        (
            "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "algorithm.kl_coef",
            "verl",
        ),
        ("actor_rollout_ref.actor.optim.lr=1e-6", "train.lr", "verl"),
        (
            "algorithm.clip_ratio_high=0.28",
            "algorithm.clip_high",
            "verl",
        ),
        ("data.train_batch_size=64", "data.prompts_per_step", "verl"),
        // Warm-up as a fraction of the steps (TRL's TrainingArguments, verl's optim).
        ("train.warmup_ratio=0.1", "train.warmup_steps", "TRL"),
        (
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
            "train.warmup_steps",
            "verl",
        ),
        // verl's reward function file and name: a `kind = "verl"` verifier's `function`.
        (
            "custom_reward_function.path=\"my_reward.py\"",
            "data.verifier.function",
            "verl",
        ),
        (
            "custom_reward_function.name=\"compute_score\"",
            "data.verifier.function",
            "verl",
        ),
        // verl's reward_kwargs entries (`+custom_reward_function.reward_kwargs.format_score=0.1`):
        // the verl verifier's `kwargs` (before: refused as unknown, with no key to write).
        (
            "custom_reward_function.reward_kwargs.format_score=0.1",
            "data.verifier.kwargs",
            "verl",
        ),
    ] {
        let err = format!("{:#}", check_load("", &[set]).unwrap_err());
        let key = set.split_once('=').unwrap().0;
        assert!(
            err.contains(&format!("`{key}` is {peer}'s name, not rlvr's"))
                && err.contains(&format!("(or --set {ours}=…) for {ours} (")),
            "{set}: {err}"
        );
    }
}

/// A TRL user's LoRA settings (peft's `LoraConfig` names, TRL's ModelConfig flags) and the
/// TrainingArguments they write beside GRPOConfig's are refused naming rlvr's key. `model.r` was
/// answered "did you mean `n`? That is verl's name ... rollout.group_size" (one edit from verl's
/// `rollout.n`), sending a LoRA rank to the group size.
#[test]
fn peft_and_trainer_names_name_ours() {
    for (set, ours, peer) in [
        ("model.r=16", "model.lora_rank", "peft"),
        (
            "model.target_modules=\"all-linear\"",
            "model.lora_targets",
            "peft",
        ),
        ("model.lora_r=16", "model.lora_rank", "TRL"),
        ("model.use_peft=true", "model.lora_rank", "TRL"),
        (
            "model.lora_target_modules=[\"q_proj\"]",
            "model.lora_targets",
            "TRL",
        ),
        ("peft_config.r=16", "model.lora_rank", "TRL"),
        ("train.logging_steps=1", "output.log_every", "TRL"),
        ("train.log_completions=true", "train.log_rollouts", "TRL"),
        ("train.num_train_epochs=1", "train.steps", "TRL"),
        ("train.bf16=true", "model.dtype", "TRL"),
        ("train.fp16=true", "model.dtype", "TRL"),
        ("train.report_to=\"wandb\"", "output.tensorboard", "TRL"),
        ("train.steps_per_generation=4", "train.mini_batches", "TRL"),
        (
            "rollout.generation_batch_size=64",
            "data.prompts_per_step",
            "TRL",
        ),
    ] {
        let err = format!("{:#}", check_load("", &[set]).unwrap_err());
        let key = set.split_once('=').unwrap().0;
        assert!(
            err.contains(&format!("`{key}` is {peer}'s name, not rlvr's"))
                && err.contains(&format!("(or --set {ours}=…) for {ours} (")),
            "{set}: {err}"
        );
    }
    let err = format!("{:#}", check_load("", &["model.r=16"]).unwrap_err());
    assert!(!err.contains("group_size"), "{err}");
    // A `[lora]` or `[peft]` table is pointed to [model]'s keys (`r` in it is peft's name, above).
    for (file, set) in [("[lora]\nrank = 16\n", ""), ("", "peft.rank=16")] {
        let sets: Vec<&str> = [set].into_iter().filter(|s| !s.is_empty()).collect();
        let err = format!("{:#}", check_load(file, &sets).unwrap_err());
        assert!(
            err.contains("rlvr's LoRA keys are in [model]: lora_rank (peft's r)"),
            "{err}"
        );
    }
    let err = format!(
        "{:#}",
        check_load("", &["train.num_train_epochs=1"]).unwrap_err()
    );
    assert!(
        err.contains("one pass is the rows ÷ data.prompts_per_step steps"),
        "{err}"
    );
}

/// TRL's `loss_type`, `scale_rewards` and CISPO `epsilon_high` errors map TRL's values to rlvr's
/// presets and keys (issue 47), and a misspelt preset gets "did you mean".
#[test]
fn trl_values_are_mapped_in_errors() {
    let err = |set: &str| format!("{:#}", check_load("", &[set]).unwrap_err());
    let e = err("algorithm.loss_type=dapo");
    assert!(
        e.contains("`algorithm.loss_type` is TRL's name")
            && e.contains("\"dapo\" (TRL's default) is preset \"grpo_trl\"")
            && e.contains("\"bnpo\" is preset \"bnpo\" (token mean per update")
            && e.contains("rlvr's preset \"dapo\" is the DAPO paper's recipe"),
        "{e}"
    );
    let e = err("algorithm.scale_rewards=batch");
    assert!(
        e.contains("\"batch\" is std_level = \"batch\"")
            && e.contains("\"none\" (or false) is std_norm = \"none\"")
            && e.contains("std + 1e-4"),
        "{e}"
    );
    let e = err("algorithm.epsilon_high=5");
    assert!(e.contains("TRL's recommended 5.0 is clip_high = 4"), "{e}");
    let e = err("algorithm.preset=drgrpo");
    assert!(e.contains("did you mean `dr_grpo`?"), "{e}");
    // TRL's recommended CISPO cap is accepted.
    assert!(check_load("", &["algorithm.preset=cispo", "algorithm.clip_high=4"]).is_ok());
}

/// Every alias names a key that exists.
#[test]
fn every_alias_names_a_documented_key() {
    let known = rlvr_train::config::known_keys();
    for a in rlvr_train::config::help::ALIASES {
        assert!(
            known.iter().any(|k| k == a.ours),
            "{} ({}) maps to {}, which is no key",
            a.name,
            a.peer,
            a.ours
        );
        assert!(
            ["TRL", "peft", "verl", "prime-rl"].contains(&a.peer),
            "{}",
            a.name
        );
    }
}

/// A misspelt key gets the nearest key by edit distance, in its table or (same name) in another.
#[test]
fn a_typo_gets_did_you_mean() {
    let err = format!(
        "{:#}",
        check_load("", &["rollout.temprature=0.7"]).unwrap_err()
    );
    assert!(
        err.starts_with(
            "in --set rollout.temprature=0.7: unknown key `rollout.temprature`: did you mean \
             `rollout.temperature`? (unknown field `temprature`, expected one of "
        ),
        "{err}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("c.toml");
    std::fs::write(&p, "[train]\nsteps = 3\nwarmup_step = 2\n").unwrap();
    let err = format!("{:#}", RawConfig::load(Some(&p), &[]).unwrap_err());
    assert!(
        err.starts_with(&format!(
            "in {} line 3: unknown key `train.warmup_step`: did you mean `train.warmup_steps`?",
            p.display()
        )),
        "{err}"
    );
    // The right name in the wrong table.
    let err = format!("{:#}", check_load("", &["train.group_size=4"]).unwrap_err());
    assert!(
        err.starts_with(
            "in --set train.group_size=4: unknown key `train.group_size`: did you mean \
             `rollout.group_size`? (`group_size` is a key of another table)"
        ),
        "{err}"
    );
    // A value: the nearest accepted one.
    let err = format!(
        "{:#}",
        check_load("", &["train.schedule=\"cosin\""]).unwrap_err()
    );
    assert!(err.ends_with("; did you mean \"cosine\"?"), "{err}");
    // A peer's value for an enum key: what to write instead.
    let err = format!(
        "{:#}",
        check_load("", &["algorithm.aggregation=\"dr_grpo\""]).unwrap_err()
    );
    assert!(
        err.ends_with(
            "; TRL's loss_type = \"dr_grpo\" is aggregation = \"constant\" (preset \"dr_grpo\" \
             also drops the std, as Dr. GRPO does)"
        ),
        "{err}"
    );
    let err = format!(
        "{:#}",
        check_load("", &["algorithm.std_norm=\"batch\""]).unwrap_err()
    );
    assert!(err.contains("std_level = \"batch\""), "{err}");
    // A misspelt peer's name: the peer's name it is near, and our key.
    let err = format!(
        "{:#}",
        check_load("", &["train.lerning_rate=1e-6"]).unwrap_err()
    );
    assert!(
        err.starts_with(
            "in --set train.lerning_rate=1e-6: unknown key `train.lerning_rate`: did you mean \
             `learning_rate`? That is TRL's name, not rlvr's: write `lr = …` in [train] (or --set \
             train.lr=…) for train.lr (the peak learning rate) (unknown field `lerning_rate`, \
             expected one of `steps`, `lr`,"
        ),
        "{err}"
    );
    assert!(err.ends_with("`log_rollouts`)"), "{err}");
    // Our key nested under a peer's table (verl's layout).
    let err = format!(
        "{:#}",
        check_load("", &["actor_rollout_ref.rollout.temperature=0.7"]).unwrap_err()
    );
    assert!(
        err.starts_with(
            "in --set actor_rollout_ref.rollout.temperature=0.7: unknown key \
             `actor_rollout_ref.rollout.temperature`: did you mean `rollout.temperature`? \
             (rlvr's tables are top-level, not under `actor_rollout_ref`)"
        ),
        "{err}"
    );
    // Three edits from verl's `test_freq` is too far to be that name.
    let err = format!(
        "{:#}",
        check_load("", &["data.test_file=\"x\""]).unwrap_err()
    );
    assert!(!err.contains("test_freq"), "{err}");
    // Nothing near: no guess.
    let err = format!("{:#}", check_load("", &["train.zzzzzz=1"]).unwrap_err());
    assert!(!err.contains("did you mean"), "{err}");
}

/// `model.device` and `model.dtype` default to `auto`: on a build without CUDA that is the CPU in
/// f32, said in one line and recorded concretely in config.toml; `auto` dtype with a GPU device is
/// bf16; an explicit choice is kept and says nothing.
#[cfg(not(feature = "cuda"))]
#[test]
fn auto_device_and_dtype_resolve_once_and_say_so() {
    let raw = RawConfig::load(None, &[]).unwrap();
    assert_eq!(
        (raw.model.device, raw.model.dtype),
        (DeviceSpec::Auto, ComputeDtype::Auto)
    );
    let c = raw.resolve().unwrap();
    assert_eq!(
        (c.raw.model.device, c.raw.model.dtype),
        (DeviceSpec::Cpu, ComputeDtype::F32)
    );
    assert_eq!(
        c.auto.as_deref(),
        Some(
            "model.device = \"auto\" is cpu (this rlvr was built without CUDA); \
             model.dtype = \"auto\" is f32 on the CPU"
        )
    );
    let text = c.to_toml().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.contains(&"dtype = \"f32\"") && lines.contains(&"device = \"cpu\""),
        "{text}"
    );
    // The recorded values load again as they are: nothing left to resolve.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.toml"), &text).unwrap();
    let again = RawConfig::load(Some(&tmp.path().join("config.toml")), &[])
        .unwrap()
        .resolve()
        .unwrap();
    assert_eq!(again.auto, None);
    // dtype auto on a GPU device: bf16.
    let c = check_load("", &["model.device=\"cuda:1\""]).unwrap();
    assert_eq!(
        (c.raw.model.device, c.raw.model.dtype),
        (DeviceSpec::Cuda(1), ComputeDtype::Bf16)
    );
    assert_eq!(
        c.auto.as_deref(),
        Some("model.dtype = \"auto\" is bf16 on the GPU (f32 master weights and AdamW moments)")
    );
    // Both explicit: nothing to say.
    let c = check_load("", &["model.device=\"cpu\"", "model.dtype=\"bf16\""]).unwrap();
    assert_eq!(c.raw.model.dtype, ComputeDtype::Bf16);
    assert_eq!(c.auto, None);
    // `auto` parses and prints as itself.
    assert_eq!("auto".parse::<DeviceSpec>().unwrap().to_string(), "auto");
    assert_eq!("auto".parse::<ComputeDtype>().unwrap().to_string(), "auto");
    // A command-line dtype has no device to resolve against.
    let err = rlvr_model::parse_dtype("auto").unwrap_err().to_string();
    assert!(err.contains("give f32 or bf16 here"), "{err}");
}

/// Input paths written in a config file are relative to its directory, and so an external
/// verifier's program (a path with a `/`) and the arguments that name files beside the config; a
/// bare program name (`python3`), an option and a word naming no file stay as written; output
/// paths and `--set` paths are relative to the working directory.
#[test]
fn input_paths_are_relative_to_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let dir = root.join("configs");
    std::fs::create_dir_all(dir.join("tools")).unwrap();
    std::fs::write(dir.join("score.py"), "").unwrap();
    let p = dir.join("run.toml");
    std::fs::write(
        &p,
        "[model]\npath = \"../models/m\"\nreference = \"/abs/ref\"\n\n\
         [data]\ntask = \"jsonl\"\ntrain = \"../data/train.jsonl\"\ntest = \"./held_out.jsonl\"\n\
         verifier = { kind = \"external\", command = [\"python3\", \"score.py\", \"--strict\", \"gold\", \"score.py:f\", \"no.py:f\"] }\n\n\
         [[reward.components]]\nname = \"tool\"\nweight = 1.0\n\
         verifier = { kind = \"external\", command = [\"tools/score\", \"-v\"] }\n\n\
         [algorithm]\nkl_coef = 0.01\n\n\
         [output]\ndir = \"runs/x\"\n",
    )
    .unwrap();
    let c = RawConfig::load(Some(&p), &[]).unwrap().resolve().unwrap();
    let m = &c.raw.model;
    assert_eq!(m.path, root.join("models/m"));
    assert_eq!(
        m.reference.as_deref(),
        Some(std::path::Path::new("/abs/ref"))
    );
    assert_eq!(c.raw.data.train, Some(root.join("data/train.jsonl")));
    assert_eq!(c.raw.data.test, Some(dir.join("held_out.jsonl")));
    let command = |v: &rlvr_reward::combine::VerifierConfig| match v {
        rlvr_reward::combine::VerifierConfig::External { command, .. } => command.clone(),
        other => panic!("{other:?}"),
    };
    let script = dir.join("score.py").display().to_string();
    assert_eq!(
        command(c.raw.data.verifier.as_ref().unwrap()),
        [
            "python3",
            script.as_str(),
            "--strict",
            "gold",
            &format!("{script}:f"),
            "no.py:f"
        ]
    );
    let tool = dir.join("tools/score").display().to_string();
    assert_eq!(
        command(&c.raw.reward.components[0].verifier),
        [tool.as_str(), "-v"]
    );
    assert_eq!(c.raw.output.dir, std::path::Path::new("runs/x"));
    // The same keys by --set: the working directory.
    let cwd = std::env::current_dir().unwrap();
    let c = RawConfig::load(
        Some(&p),
        &["data.train=t.jsonl".into(), "model.path=m2".into()],
    )
    .unwrap()
    .resolve()
    .unwrap();
    assert_eq!(c.raw.data.train, Some(cwd.join("t.jsonl")));
    assert_eq!(c.raw.model.path, cwd.join("m2"));
    // What config.toml holds loads again from anywhere to the same paths.
    let copy = root.join("elsewhere.toml");
    std::fs::write(&copy, c.to_toml().unwrap()).unwrap();
    let again = RawConfig::load(Some(&copy), &[])
        .unwrap()
        .resolve()
        .unwrap();
    assert_eq!(again.raw.data.train, Some(cwd.join("t.jsonl")));
    assert_eq!(again.raw.data.test, Some(dir.join("held_out.jsonl")));
    assert_eq!(
        command(again.raw.data.verifier.as_ref().unwrap()),
        [
            "python3",
            script.as_str(),
            "--strict",
            "gold",
            &format!("{script}:f"),
            "no.py:f"
        ]
    );
}

#[test]
fn env_keys_are_typed_checked_and_named() {
    // Off: the defaults, and config.toml holds no [env].
    let c = check_load("", &[]).unwrap();
    assert!(!c.raw.env.is_on());
    assert!(!c.to_toml().unwrap().contains("[env]"));
    // A key without env.command or env.builtin.
    let err = format!("{:#}", check_load("", &["env.max_turns=3"]).unwrap_err());
    assert!(err.contains("neither env.command nor env.builtin"), "{err}");
    // The built-in retry environment with its keys.
    let c = check_load(
        "[env]\nbuiltin = \"retry\"\nmax_turns = 3\nturn_discount = 0.5\n",
        &["rollout.max_new_tokens=8"],
    )
    .unwrap();
    assert!(c.raw.env.is_on());
    assert_eq!(c.raw.env.max_turns, 3);
    assert_eq!(c.raw.env.kv_cache_mib, 1024);
    // Default budget: 3 turns of 8 tokens and 2 bridges of 1024.
    assert_eq!(c.raw.env.episode_tokens(8), 3 * 8 + 2 * 1024);
    assert!(c.to_toml().unwrap().contains("builtin = \"retry\""));
    // A program: relative to the config file, run in its directory.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    std::fs::write(dir.join("game.py"), "").unwrap();
    let p = dir.join("c.toml");
    std::fs::write(&p, "[env]\ncommand = [\"python3\", \"game.py\"]\n").unwrap();
    let c = RawConfig::load(Some(&p), &[]).unwrap().resolve().unwrap();
    assert_eq!(
        c.raw.env.command,
        ["python3", dir.join("game.py").to_str().unwrap()]
    );
    assert_eq!(c.raw.env.dir.as_deref(), Some(dir.as_path()));
    // Each bad value names its key.
    let bad: [(&[&str], &str); 14] = [
        (&["env.builtin=\"maze\""], "env.builtin"),
        // A misspelt builtin on a task without a verifier: the typo, not retry's verifier.
        (
            &["data.task=\"jsonl\"", "env.builtin=\"retyr\""],
            "env.builtin = \"retyr\": the built-in environments are \"retry\"",
        ),
        (
            &["env.builtin=\"retry\"", "env.kv_cache_mib=2000000"],
            "env.kv_cache_mib = 2000000 is out of range",
        ),
        (
            &[
                "env.builtin=\"retry\"",
                "env.kv_cache_mib=0",
                "rollout.backend=\"vllm\"",
                "rollout.servers=[\"http://127.0.0.1:1\"]",
            ],
            "env.kv_cache_mib is read by the native engine only",
        ),
        (
            &["env.builtin=\"retry\"", "env.command=[\"x\"]"],
            "env.command and env.builtin",
        ),
        (
            &["env.builtin=\"retry\"", "env.max_turns=0"],
            "env.max_turns",
        ),
        (
            &["env.builtin=\"retry\"", "env.max_episode_tokens=2"],
            "env.max_episode_tokens",
        ),
        (
            &["env.builtin=\"retry\"", "env.tool_format=\"xml\""],
            "env.tool_format",
        ),
        (
            &["env.builtin=\"retry\"", "env.reward=\"mean\""],
            "env.reward",
        ),
        (
            &["env.builtin=\"retry\"", "env.timeout_s=0"],
            "env.timeout_s",
        ),
        (
            &["env.builtin=\"retry\"", "env.max_error_frac=1.5"],
            "env.max_error_frac",
        ),
        (
            &["env.builtin=\"retry\"", "env.turn_discount=0"],
            "env.turn_discount",
        ),
        (&["env.builtin=\"retry\"", "env.tools=\"{}\""], "env.tools"),
        (
            &["env.builtin=\"retry\"", "env.restarts=5000"],
            "env.restarts",
        ),
    ];
    for (sets, key) in bad {
        let mut all = vec!["rollout.max_new_tokens=4"];
        all.extend_from_slice(sets);
        let err = format!("{:#}", check_load("", &all).unwrap_err());
        assert!(err.contains(key), "{sets:?}: {err}");
    }
    // Named once, not "env.tool_format: env.tool_format = ...".
    for (set, key) in [
        ("env.tool_format=\"xml\"", "env.tool_format"),
        ("env.reward=\"mean\"", "env.reward"),
    ] {
        let all = ["rollout.max_new_tokens=4", "env.builtin=\"retry\"", set];
        let err = format!("{:#}", check_load("", &all).unwrap_err());
        // Then where it was written: `(in --set env.tool_format="xml")`.
        let (message, origin) = err.rsplit_once(" (in ").unwrap();
        assert_eq!(message.matches(key).count(), 1, "{err}");
        assert_eq!(origin, format!("--set {set})"), "{err}");
    }
    let err = format!("{:#}", check_load("", &["env.max_turnz=3"]).unwrap_err());
    assert!(err.contains("env.max_turns"), "{err}");
    // env.env naming a variable rlvr does not have (PATH it has): a warning naming it.
    let c = check_load(
        "",
        &[
            "env.command=[\"python3\", \"game.py\"]",
            "env.env=[\"PATH\", \"RLVR_TEST_NO_SUCH_VAR_5821\"]",
        ],
    )
    .unwrap();
    let named: Vec<&String> = c
        .warnings
        .iter()
        .filter(|w| w.contains("env.env"))
        .collect();
    assert_eq!(named.len(), 1, "{:?}", c.warnings);
    assert!(
        named[0].contains("RLVR_TEST_NO_SUCH_VAR_5821, which is not set here"),
        "{named:?}"
    );
}

/// A `model.path` written like a Hugging Face Hub id that is neither a directory here nor in the
/// local Hugging Face cache: loading it says that rlvr downloads nothing and how to download it
/// (the cache look-up itself: `store::hub`'s unit tests, on a fake cache).
#[test]
fn a_hub_id_as_model_path_says_rlvr_downloads_nothing() {
    use rlvr_train::store::manifest::load_policy;
    let c = check_load("", &["model.path=\"rlvr-test-org/no-such-model-4821\""]).unwrap();
    c.check_runnable().unwrap();
    let cpu = candle_core::Device::Cpu;
    let e = format!(
        "{:#}",
        load_policy(&c.raw.model.path, candle_core::DType::F32, &cpu)
            .err()
            .expect("no such model")
    );
    assert!(
        e.contains("rlvr downloads nothing")
            && e.contains(
                "`huggingface-cli download rlvr-test-org/no-such-model-4821 --local-dir DIR`"
            ),
        "{e}"
    );
    // A missing directory in one that exists is a typo, not an id: the loader's own error.
    let tmp = tempfile::tempdir().unwrap();
    let typo = tmp.path().join("Qwen2.5-0.5B");
    let e = format!(
        "{:#}",
        load_policy(&typo, candle_core::DType::F32, &cpu)
            .err()
            .expect("no such model")
    );
    assert!(!e.contains("downloads nothing"), "{e}");
}

/// A `data.task = "jsonl"` config whose rewards are `[[reward.components]]` needs no
/// `data.verifier` (nothing reads it): the shape docs/coming-from-trl.md gives TRL's reward
/// functions. It was refused ("data.task = \"jsonl\" needs data.verifier"); without components
/// it still is.
#[test]
fn jsonl_rows_scored_by_reward_components_need_no_data_verifier() {
    let tmp = tempfile::tempdir().unwrap();
    let train = tmp.path().join("train.jsonl");
    std::fs::write(&train, "{\"question\": \"1+1=\", \"answer\": \"2\"}\n").unwrap();
    let sets = |components: bool| {
        let mut s = vec![
            "data.task=\"jsonl\"".to_string(),
            format!("data.train=\"{}\"", train.display()),
        ];
        if components {
            s.push(
                "reward.components=[{ verifier = { kind = \"math\" } }, \
                 { name = \"b\", weight = 0.5, verifier = { kind = \"arithmetic\" } }]"
                    .into(),
            );
        }
        s
    };
    let cfg = RawConfig::load(None, &sets(true))
        .unwrap()
        .resolve()
        .unwrap();
    let reward = rlvr_train::config::settings::reward_function(&cfg.raw).unwrap();
    let names: Vec<String> = reward
        .component_weights()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["math", "b"]);
    let e = format!(
        "{:#}",
        RawConfig::load(None, &sets(false))
            .and_then(|r| r.resolve())
            .unwrap_err()
    );
    assert!(
        e.contains("data.task = \"jsonl\" needs data.verifier"),
        "{e}"
    );
}

/// TRL's datasets need only a `prompt` column: with rewards from programs that read the row's
/// columns (`python` or `external` verifiers, every component's or `data.verifier`) and no
/// `data.answer_field`, a `jsonl` row without `answer` loads with an empty reference. It was
/// refused ("missing field `answer`"). A built-in verifier among the components, or an answer
/// field named, still needs it in every row.
#[test]
fn prompt_only_rows_scored_by_reward_programs_need_no_answer_field() {
    use rlvr_data::config::Scoring;
    use rlvr_train::config::settings::scoring;
    let tmp = tempfile::tempdir().unwrap();
    let train = tmp.path().join("train.jsonl");
    std::fs::write(
        &train,
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"Say hi\"}]}\n\
         {\"prompt\": [{\"role\": \"user\", \"content\": \"Say bye\"}], \"answer\": \"bye\"}\n",
    )
    .unwrap();
    let rewards = tmp.path().join("my_rewards.py");
    std::fs::write(
        &rewards,
        "def f(completions, **kwargs):\n    return [1.0] * len(completions)\n",
    )
    .unwrap();
    let python = format!(
        "{{ verifier = {{ kind = \"python\", function = \"{}:f\" }} }}",
        rewards.display()
    );
    let load = |extra: &[String]| {
        let mut s = vec![
            "data.task=\"jsonl\"".to_string(),
            format!("data.train=\"{}\"", train.display()),
            "data.question_field=\"prompt\"".into(),
            "data.style=\"chat\"".into(),
        ];
        s.extend(extra.iter().cloned());
        let raw = RawConfig::load(None, &s).unwrap();
        let got = rlvr_data::dataset::load_file_for(&raw.data, &train, scoring(&raw));
        (raw, got.map_err(|e| e.to_string()))
    };
    let (raw, got) = load(&[format!("reward.components=[{python}]")]);
    assert_eq!(scoring(&raw), Scoring::Programs);
    raw.resolve().unwrap();
    let rows = got.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].reference, "");
    assert_eq!(rows[1].reference, "bye");
    // `data.verifier` of kind external alone (the adapter as a command): the same.
    let (raw, got) = load(&["data.verifier={ kind = \"external\", command = [\"true\"] }".into()]);
    assert_eq!(scoring(&raw), Scoring::Programs);
    assert_eq!(got.unwrap()[0].reference, "");
    // A built-in verifier reads the reference: every row needs it.
    let (raw, got) = load(&[format!(
        "reward.components=[{python}, {{ verifier = {{ kind = \"math\" }} }}]"
    )]);
    assert_eq!(scoring(&raw), Scoring::Components);
    let e = got.unwrap_err();
    assert!(
        e.contains("train.jsonl:1") && e.contains("missing field `answer`"),
        "{e}"
    );
    // An answer field named is required.
    let (_, got) = load(&[
        format!("reward.components=[{python}]"),
        "data.answer_field=\"answer\"".into(),
    ]);
    assert!(got.unwrap_err().contains("missing field `answer`"));
}

/// A number or boolean written in quotes (`lr = "1e-5"`, `--set 'train.share_prompt="true"'`) is
/// a TOML string: the error says to drop the quotes (it said only "invalid type: string").
#[test]
fn a_quoted_number_or_boolean_says_to_drop_the_quotes() {
    for (set, want) in [
        (
            "train.lr=\"1e-5\"",
            "\"1e-5\" is in quotes, so TOML reads a string: write 1e-5 without quotes",
        ),
        ("train.steps=\"12\"", "write 12 without quotes"),
        ("train.share_prompt=\"true\"", "write true without quotes"),
    ] {
        let e = format!(
            "{:#}",
            RawConfig::load(None, &[set.to_string()]).unwrap_err()
        );
        assert!(e.contains(want), "{set}: {e}");
    }
    let e = format!(
        "{:#}",
        RawConfig::load(None, &["train.lr=\"fast\"".to_string()]).unwrap_err()
    );
    assert!(!e.contains("without quotes"), "{e}");
}

/// `env.verifiers`: a verifiers environment's id and `load_environment` arguments become the
/// carried adapter's command and `hello` options; the keys are checked and named, and prime-rl's
/// names are refused with ours.
#[test]
fn env_verifiers_is_the_adapter_with_the_id_and_args_and_prime_rl_names_are_refused() {
    let c = check_load(
        "[env]\nverifiers = \"vf-guess\"\nmax_turns = 3\noptions = { split = \"eval\" }\n\
         [env.env_args]\nmax_turns = 4\nbroken_reward = false\n",
        &[],
    )
    .unwrap();
    let e = &c.raw.env;
    assert!(e.is_on() && e.is_program());
    // A program environment: its rewards are the episodes'.
    assert_eq!(
        rlvr_train::config::settings::scoring(&c.raw),
        rlvr_data::config::Scoring::Environment
    );
    let (command, options) = e.program().unwrap().unwrap();
    assert_eq!(command[0], "python3");
    assert!(command[1].ends_with("/verifiers_env.py"), "{command:?}");
    assert_eq!(
        std::fs::read_to_string(&command[1]).unwrap(),
        rlvr_env::verifiers::ADAPTER
    );
    assert_eq!(
        options.to_compact(),
        "{\"split\":\"eval\",\"env_id\":\"vf-guess\",\"env_args\":{\"broken_reward\":false,\
         \"max_turns\":4}}"
    );
    // The run directory's config.toml keeps the short form, not the adapter's temporary path.
    let toml = c.to_toml().unwrap();
    assert!(toml.contains("verifiers = \"vf-guess\""), "{toml}");
    assert!(!toml.contains("verifiers_env.py"), "{toml}");
    // The program runs in the config file's directory, as env.command's does.
    assert!(e.dir.is_some());
    // env.python: a path with a `/` is the config file's.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    let p = dir.join("c.toml");
    std::fs::write(
        &p,
        "[env]\nverifiers = \"x\"\npython = \".venv/bin/python\"\n",
    )
    .unwrap();
    let c = RawConfig::load(Some(&p), &[]).unwrap().resolve().unwrap();
    assert_eq!(
        c.raw.env.python.as_deref(),
        Some(dir.join(".venv/bin/python").to_str().unwrap())
    );
    assert_eq!(
        c.raw.env.program().unwrap().unwrap().0[0],
        c.raw.env.python.clone().unwrap()
    );

    // Each misuse names its key.
    let bad: [(&[&str], &str); 6] = [
        (
            &["env.verifiers=\"x\"", "env.command=[\"python3\", \"e.py\"]"],
            "env.verifiers and env.command are both set",
        ),
        (
            &["env.verifiers=\"x\"", "env.builtin=\"retry\""],
            "env.verifiers and env.builtin are both set",
        ),
        (&["env.verifiers=\"\""], "env.verifiers is empty"),
        (
            &["env.command=[\"python3\"]", "env.env_args={ a = 1 }"],
            "env.env_args is read with env.verifiers only",
        ),
        (
            &["env.verifiers=\"x\"", "env.options={ env_id = \"y\" }"],
            "env.options.env_id is set by rlvr for env.verifiers",
        ),
        (
            &["env.verifiers=\"x\"", "env.turn_discount=0.5"],
            "env.turn_discount is read by the built-in retry environment only",
        ),
    ];
    for (sets, want) in bad {
        let err = format!("{:#}", check_load("", sets).unwrap_err());
        assert!(err.contains(want), "{sets:?}: {err}");
    }

    // prime-rl's names, refused with ours: its [[orchestrator.env]] table, id and args.
    let err = format!(
        "{:#}",
        check_load(
            "[[orchestrator.env]]\nid = \"reverse-text\"\nargs = { n = 1 }\n",
            &[]
        )
        .unwrap_err()
    );
    assert!(
        err.contains(
            "`orchestrator.env` is prime-rl's name, not rlvr's: write `verifiers = …` in [env]"
        ) && err.contains("env_args = { ... }"),
        "{err}"
    );
    for (set, ours) in [
        ("env.id=\"reverse-text\"", "env.verifiers"),
        ("env.args={ n = 1 }", "env.env_args"),
        ("orchestrator.rollouts_per_example=16", "rollout.group_size"),
        (
            "orchestrator.sampling.max_tokens=128",
            "rollout.max_new_tokens",
        ),
        ("orchestrator.batch_size=128", "data.prompts_per_step"),
    ] {
        let err = format!("{:#}", check_load("", &[set]).unwrap_err());
        assert!(
            err.contains("is prime-rl's name, not rlvr's")
                && err.contains(&format!("--set {ours}=")),
            "{set}: {err}"
        );
    }
}
