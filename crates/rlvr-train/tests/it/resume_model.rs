//! `--resume` and the run's model (`model.path`): the checkpoint holds the policy's weights, but
//! the reference policy (KL), a LoRA run's base and the model's config and tokenizer come from
//! `model.path`. run.json records the model's identity at the start; a resume accepts another
//! path only when it holds the same model (a moved or copied directory), whether the new path
//! comes from a `--set` or from an edited RUN_DIR/config.toml. The KL reference
//! (`model.reference`) is recorded and checked the same way, a `--set` aside (a change on
//! purpose, warned about and recorded in `resume_changes`).

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

/// The KL reference (`model.reference`, `algorithm.kl_coef` ≠ 0): run.json records its identity
/// as it does `model.path`'s, and a resume refuses another reference that no `--set` asked for:
/// an edited config.toml naming another model, another model placed at the reference's path, a
/// reference removed from config.toml or added to a run that had none. A moved copy goes on
/// (with a note; run.json then records its path), and `--set model.reference=...` changes it on
/// purpose (warned about and recorded in `resume_changes`; run.json then records the new one).
/// Before this, each of the refused cases resumed without a word.
#[test]
fn a_resume_checks_the_reference_as_it_checks_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&tmp.path().join("a"), 1);
    let reference = common::tiny_model(&tmp.path().join("r"), 2);
    let other = common::tiny_model(&tmp.path().join("o"), 3);
    let run = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend([
        "train.steps=1".to_string(),
        "train.eval_every=0".into(),
        "algorithm.kl_coef=0.1".into(),
        format!("model.reference={:?}", reference.display().to_string()),
    ]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let meta = run_json(&run);
    assert_eq!(
        meta["reference"]["path"],
        reference.display().to_string(),
        "{meta}"
    );
    let files: Vec<&String> = meta["reference"]["files"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert!(
        files.contains(&&"config.json".to_string())
            && files.contains(&&"model.safetensors".to_string()),
        "{files:?}"
    );
    assert_ne!(
        meta["reference"]["files"]["model.safetensors"],
        meta["model"]["files"]["model.safetensors"],
        "two seeds, two identities"
    );
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let quoted = |p: &Path| format!("{:?}", p.display().to_string());
    assert!(text.contains(&quoted(&reference)), "{text}");
    let steps = |n: u64| vec![format!("train.steps={n}")];
    let on_purpose = "or change the reference on purpose with --set model.reference=PATH";

    // Another model written into config.toml.
    std::fs::write(&config, text.replace(&quoted(&reference), &quoted(&other))).unwrap();
    let e = err(&run, &steps(2));
    assert!(
        e.starts_with(&format!(
            "model.reference changes from {} (the run's reference, recorded in {}) to {} ({}), \
             another model: model.safetensors differs (",
            reference.display(),
            run.join("run.json").display(),
            other.display(),
            config.display()
        )) && e.contains(on_purpose),
        "{e}"
    );
    // Removed from config.toml: the KL term would be taken against model.path's model.
    let without: String = text
        .lines()
        .filter(|l| !l.contains(&quoted(&reference)))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&config, &without).unwrap();
    let e = err(&run, &steps(2));
    assert!(
        e.starts_with(&format!(
            "model.reference is not set ({}), but the run's KL reference was {}",
            config.display(),
            reference.display()
        )),
        "{e}"
    );
    std::fs::write(&config, &text).unwrap();
    // Another model placed at the reference's path.
    let held = tmp.path().join("held");
    std::fs::rename(&reference, &held).unwrap();
    copy_dir(&other, &reference);
    let e = err(&run, &steps(2));
    assert!(
        e.starts_with(&format!(
            "model.reference {} ({}) no longer holds the model the run's KL reference was",
            reference.display(),
            config.display()
        )),
        "{e}"
    );
    std::fs::remove_dir_all(&reference).unwrap();
    std::fs::rename(&held, &reference).unwrap();

    // A moved copy, written into config.toml: a note, and run.json records where it is now.
    let moved = tmp.path().join("moved");
    copy_dir(&reference, &moved);
    std::fs::write(&config, text.replace(&quoted(&reference), &quoted(&moved))).unwrap();
    let mut cfg = ResolvedConfig::from_run_dir(&run, &steps(2)).unwrap();
    let note = format!(
        "model.reference is {} ({}), the run's reference was at {} ({}): the same model",
        moved.display(),
        config.display(),
        reference.display(),
        run.join("run.json").display()
    );
    assert!(
        cfg.warnings.iter().any(|w| w.starts_with(&note)),
        "{:?}",
        cfg.warnings
    );
    cfg.raw.output.dir = run.clone();
    let resume = RunOptions {
        resume: true,
        ..Default::default()
    };
    assert_eq!(train(&cfg, &resume).unwrap().steps, 2);
    assert_eq!(
        run_json(&run)["reference"]["path"],
        moved.display().to_string()
    );

    // A --set changes it on purpose: warned about, recorded, and checked from then on.
    let mut sets = steps(3);
    sets.push(format!("model.reference={}", other.display()));
    let mut cfg = ResolvedConfig::from_run_dir(&run, &sets).unwrap();
    assert!(
        cfg.warnings
            .iter()
            .any(|w| w.starts_with("--resume changes model.reference from")),
        "{:?}",
        cfg.warnings
    );
    cfg.raw.output.dir = run.clone();
    assert_eq!(train(&cfg, &resume).unwrap().steps, 3);
    let meta = run_json(&run);
    assert_eq!(meta["reference"]["path"], other.display().to_string());
    assert_eq!(
        meta["resume_changes"][0]["key"], "model.reference",
        "{meta}"
    );
    // config.toml now names `other`; the first reference, written back, is another model.
    let now = std::fs::read_to_string(&config).unwrap();
    assert!(now.contains(&quoted(&other)), "{now}");
    std::fs::write(&config, now.replace(&quoted(&other), &quoted(&reference))).unwrap();
    let e = err(&run, &steps(4));
    assert!(
        e.contains("another model: model.safetensors differs ("),
        "{e}"
    );
}

/// A run without `model.reference` (its KL reference is `model.path`'s model) records
/// `"reference": null`, and a resume whose config.toml adds one is refused; a `--set` may.
#[test]
fn a_reference_added_to_a_run_without_one_is_refused_unless_set() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&tmp.path().join("a"), 1);
    let other = common::tiny_model(&tmp.path().join("o"), 3);
    let run = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend([
        "train.steps=1".to_string(),
        "train.eval_every=0".into(),
        "algorithm.kl_coef=0.1".into(),
    ]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let meta = run_json(&run);
    assert!(
        meta["reference"].is_null() && meta.get("reference").is_some(),
        "{meta}"
    );
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let added = text.replacen(
        "[model]\n",
        &format!("[model]\nreference = {:?}\n", other.display().to_string()),
        1,
    );
    assert_ne!(added, text, "{text}");
    std::fs::write(&config, &added).unwrap();
    let e = err(&run, &["train.steps=2".into()]);
    assert!(
        e.starts_with(&format!(
            "model.reference is {} ({}), but the run started without one",
            other.display(),
            config.display()
        )),
        "{e}"
    );
    std::fs::write(&config, &text).unwrap();
    let sets = vec![
        "train.steps=2".to_string(),
        format!("model.reference={}", other.display()),
    ];
    let cfg = ResolvedConfig::from_run_dir(&run, &sets).unwrap();
    assert!(
        cfg.warnings
            .iter()
            .any(|w| w.starts_with("--resume changes model.reference from")),
        "{:?}",
        cfg.warnings
    );
}
