//! `--resume` and the run's model (`model.path`): the checkpoint holds the policy's weights, but
//! the reference policy (KL), a LoRA run's base and the model's config and tokenizer come from
//! `model.path`. run.json records the model's identity at the start; a resume accepts another
//! path only when it holds the same model (a moved or copied directory), whether the new path
//! comes from a `--set` or from an edited RUN_DIR/config.toml.

use std::path::Path;

use rlvr_train::config::{RawConfig, ResolvedConfig};
use rlvr_train::run::{train, RunOptions};

use crate::common;

fn run_json(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn err(run: &Path, sets: &[String]) -> String {
    format!("{:#}", ResolvedConfig::from_run_dir(run, sets).unwrap_err())
}

/// A run records its model; a resume from a moved copy of it goes on (with a note, and run.json
/// then records the new path); another model of the same architecture (same files, same sizes,
/// other weights) is refused, set by `--set` or written into the run's config.toml, naming both
/// paths and the file that differs; a run dir without the record (started before it existed)
/// warns on a changed path and records the model on its resume. Before this, every such resume
/// was accepted without a word.
#[test]
fn a_resume_accepts_a_moved_model_and_refuses_another() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&tmp.path().join("a"), 1);
    let run = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend(["train.steps=1".to_string(), "train.eval_every=0".into()]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let meta = run_json(&run);
    assert_eq!(meta["model"]["path"], model.display().to_string(), "{meta}");
    let files: Vec<&String> = meta["model"]["files"].as_object().unwrap().keys().collect();
    assert!(
        files.contains(&&"config.json".to_string())
            && files.contains(&&"model.safetensors".to_string())
            && files.contains(&&"tokenizer.json".to_string()),
        "{files:?}"
    );

    // The same model, moved: accepted with a note.
    let moved = tmp.path().join("moved");
    copy_dir(&model, &moved);
    let set = |p: &Path| {
        vec![
            format!("model.path={}", p.display()),
            "train.steps=2".into(),
        ]
    };
    let mut cfg = ResolvedConfig::from_run_dir(&run, &set(&moved)).unwrap();
    let note = format!(
        "model.path is {} (--set model.path={}), the run's model was at {} ({}): the same model",
        moved.display(),
        moved.display(),
        model.display(),
        run.join("run.json").display()
    );
    assert!(
        cfg.warnings.iter().any(|w| w.starts_with(&note)),
        "{:?}",
        cfg.warnings
    );

    // Another model: the tiny model of another seed has the same files and sizes.
    let other = common::tiny_model(&tmp.path().join("b"), 2);
    let e = err(&run, &set(&other));
    let lead = format!(
        "--resume changes model.path from {} (the run's model, recorded in {}) to {} (--set \
         model.path={}), another model: model.safetensors differs (",
        model.display(),
        run.join("run.json").display(),
        other.display(),
        other.display()
    );
    assert!(e.starts_with(&lead), "{e}");
    assert!(
        e.contains("start a new run from a checkpoint's weights"),
        "{e}"
    );
    // The same, written into the run's config.toml instead of a --set.
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let quoted = |p: &Path| format!("{:?}", p.display().to_string());
    assert!(text.contains(&quoted(&model)), "{text}");
    std::fs::write(&config, text.replace(&quoted(&model), &quoted(&other))).unwrap();
    let e = err(&run, &["train.steps=2".into()]);
    assert!(
        e.contains(&format!(
            "to {} ({}), another model: model.safetensors differs (",
            other.display(),
            config.display()
        )),
        "{e}"
    );
    std::fs::write(&config, &text).unwrap();
    // The model at the recorded path replaced by another one.
    let held = tmp.path().join("held");
    std::fs::rename(&model, &held).unwrap();
    copy_dir(&other, &model);
    let e = err(&run, &["train.steps=2".into()]);
    assert!(
        e.starts_with(&format!(
            "model.path {} ({}) no longer holds the model the run started from",
            model.display(),
            config.display()
        )),
        "{e}"
    );
    std::fs::remove_dir_all(&model).unwrap();
    std::fs::rename(&held, &model).unwrap();

    // The moved model trains on; run.json records where it is now.
    cfg.raw.output.dir = run.clone();
    let resume = RunOptions {
        resume: true,
        ..Default::default()
    };
    assert_eq!(train(&cfg, &resume).unwrap().steps, 2);
    assert_eq!(run_json(&run)["model"]["path"], moved.display().to_string());

    // A run.json without the record: a changed path is warned about, and recorded.
    let mut meta = run_json(&run);
    meta.as_object_mut().unwrap().remove("model");
    std::fs::write(run.join("run.json"), meta.to_string()).unwrap();
    let sets = vec![
        format!("model.path={}", other.display()),
        "train.steps=3".into(),
    ];
    let mut cfg = ResolvedConfig::from_run_dir(&run, &sets).unwrap();
    let warned = format!(
        "--resume changes model.path from {} to {} (--set model.path={}), and {} records no \
         identity of the run's model",
        moved.display(),
        other.display(),
        other.display(),
        run.join("run.json").display()
    );
    assert!(
        cfg.warnings.iter().any(|w| w.starts_with(&warned)),
        "{:?}",
        cfg.warnings
    );
    cfg.raw.output.dir = run.clone();
    assert_eq!(train(&cfg, &resume).unwrap().steps, 3);
    let meta = run_json(&run);
    assert_eq!(meta["model"]["path"], other.display().to_string(), "{meta}");
    // From now on the recorded model is checked: the first one is another model.
    let e = err(&run, &set(&model));
    assert!(
        e.contains("another model: model.safetensors differs ("),
        "{e}"
    );
}
