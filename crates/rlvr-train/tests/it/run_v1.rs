//! `--resume` of a run directory written before the typed configuration (fixture `run_v1`, made by
//! `rlvr train` at commit dcd9a64: see tests/fixtures/README.md). Its `config.toml` holds every
//! `[algorithm]` knob, REC's among them, for a PPO loss; resuming it must work, and rewrite
//! `config.toml` with the knobs that apply only.

use std::path::{Path, PathBuf};

use rlvr_algo::AlgorithmConfig;
use rlvr_train::config::ResolvedConfig;
use rlvr_train::run::{train, RunOptions};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/run_v1")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// A copy of the fixture run directory in a temporary directory.
fn run_copy(tmp: &Path) -> PathBuf {
    let rd = tmp.join("run_v1");
    copy_dir(&fixture(), &rd);
    rd
}

#[test]
fn a_run_written_before_the_typed_config_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_copy(tmp.path());
    let old = std::fs::read_to_string(rd.join("config.toml")).unwrap();
    assert!(old.contains("keep_mask = \"none\"") && old.contains("loss = \"ppo\""));

    let mut cfg = ResolvedConfig::from_run_dir(&rd, &["train.steps=3".into()]).unwrap();
    // The algorithm the old run trained with: the grpo preset, untouched.
    assert_eq!(
        cfg.algorithm,
        AlgorithmConfig::empty("grpo").resolve().unwrap()
    );
    cfg.raw.output.dir = rd.clone();
    let s = train(
        &cfg,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.steps, 3);
    let metrics = std::fs::read_to_string(rd.join("metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, [0, 1, 2, 3]);
    assert!(rd.join("checkpoints/step-3/model.safetensors").exists());

    // The rewritten config.toml holds PPO's knobs only, and resumes again to the same algorithm.
    let new = std::fs::read_to_string(rd.join("config.toml")).unwrap();
    let t: toml::Table = new.parse().unwrap();
    let alg = t["algorithm"].as_table().unwrap();
    for k in [
        "keep_mask",
        "rec_weight",
        "clip_low_prime",
        "clip_high_prime",
        "adv_temperature",
    ] {
        assert!(!alg.contains_key(k), "{k} still written:\n{new}");
    }
    assert_eq!(alg["clip_low"].as_float(), Some(0.2));
    let again = ResolvedConfig::from_run_dir(&rd, &[]).unwrap();
    assert_eq!(again.algorithm, cfg.algorithm);
    assert_eq!(again.raw.train.steps, 3);
}

/// The old file's REC knobs are dropped because the resolver wrote them; a `--set` of one on resume
/// is the user's and is refused, naming the key and the loss.
#[test]
fn a_set_of_another_loss_knob_on_resume_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_copy(tmp.path());
    let err =
        ResolvedConfig::from_run_dir(&rd, &["algorithm.keep_mask=\"ring\"".into()]).unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("algorithm.keep_mask") && err.contains("\"ppo\""),
        "{err}"
    );
    // Switching the loss to REC on resume makes the file's REC knobs apply again: kept, not dropped.
    // (With a step left to train: on the finished run the change would apply to no step.)
    let sets = ["algorithm.loss=\"rec\"".into(), "train.steps=3".into()];
    let cfg = ResolvedConfig::from_run_dir(&rd, &sets).unwrap();
    assert_eq!(cfg.algorithm.policy.loss(), rlvr_algo::PolicyLoss::Rec);
    assert_eq!(cfg.raw.algorithm.clip_low_prime, Some(0.6));
}

/// `--resume --set train.steps=N` below the step the run reached would do nothing but rewrite
/// config.toml: refused, naming the step.
#[test]
fn resume_cannot_shorten_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let rd = run_copy(tmp.path());
    let before = std::fs::read_to_string(rd.join("config.toml")).unwrap();
    let err = ResolvedConfig::from_run_dir(&rd, &["train.steps=1".into()]).unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("train.steps = 1") && err.contains("step 2"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(rd.join("config.toml")).unwrap(),
        before
    );
    // Equal to the reached step (a finished run) or above it: accepted.
    assert!(ResolvedConfig::from_run_dir(&rd, &["train.steps=2".into()]).is_ok());
    assert!(ResolvedConfig::from_run_dir(&rd, &[]).is_ok());
}
