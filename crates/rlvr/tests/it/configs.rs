//! Every config shipped in `configs/` loads and resolves as `rlvr train --config FILE` does
//! (unknown keys rejected), and the data files it names exist (input paths are relative to the
//! config's directory: `../data/...` is the repository's `data/`), from any working directory.

use crate::common::{self, repo_root};

use std::path::{Path, PathBuf};

use rlvr_train::config::RawConfig;

fn shipped_configs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo_root().join("configs"))
        .expect("configs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        // configs/lab*.toml are sweeps for `rlvr lab`, not train configs (rlvr-lab's smoke test
        // loads and dry-runs each of them).
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| !n.to_string_lossy().starts_with("lab"))
        })
        .collect();
    v.sort();
    v
}

/// Loads and resolves `file` with `overrides`, as `rlvr train --config` does before training.
fn check_loads(
    file: &Path,
    overrides: &[&str],
) -> anyhow::Result<rlvr_train::config::ResolvedConfig> {
    let sets: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    RawConfig::load(Some(file), &sets)?.resolve()
}

#[test]
fn every_shipped_config_loads_and_resolves() {
    let files = shipped_configs();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    for want in [
        "quickstart.toml",
        "gsm8k_off_policy_grpo_qwen2.5-0.5b.toml",
        "gsm8k_off_policy_grpo_qwen2.5-1.5b.toml",
        "gsm8k_rec_oneside_nois.toml",
        "math500_eval.toml",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "configs/{want} missing: {names:?}"
        );
    }
    for f in &files {
        let cfg = check_loads(f, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", f.display()));
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.contains("# Hardware:"),
            "{} must say the hardware it expects in a `# Hardware:` comment",
            f.display()
        );
        // Input paths are absolute after loading, relative to configs/; the shipped data (not the
        // files the quickstart and the real-model recipe generate under runs/) exists.
        let root = repo_root();
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let generated = match name.as_str() {
            "quickstart.toml" => Some(("runs/quickstart/data", "runs/quickstart/sft")),
            "real_model.toml" | "real_model_guess.toml" => {
                Some(("runs/real_model/data", "runs/real_model/model"))
            }
            _ => None,
        };
        for p in [&cfg.raw.data.train, &cfg.raw.data.test]
            .into_iter()
            .flatten()
        {
            assert!(p.is_absolute(), "{name}: {}", p.display());
            if let Some((data, _)) = generated {
                assert!(p.starts_with(root.join(data)), "{}", p.display());
            } else {
                // The repository's data/, or a shipped example's own file (examples/: the
                // prompts-only games of the guess-the-number environment).
                assert!(
                    p.starts_with(root.join("data")) || p.starts_with(root.join("examples")),
                    "{name}: {}",
                    p.display()
                );
                assert!(p.exists(), "{name}: {} missing", p.display());
            }
        }
        let model_dir = if let Some((_, model)) = generated {
            root.join(model)
        } else {
            root.join("models")
                .join(cfg.raw.model.path.file_name().unwrap())
        };
        assert_eq!(cfg.raw.model.path, model_dir, "{name}");
        // output.dir stays relative to the working directory.
        assert!(
            cfg.raw.output.dir.is_relative() && cfg.raw.output.dir.starts_with("runs"),
            "{name}: {}",
            cfg.raw.output.dir.display()
        );
        // The resolved config round-trips through RUN_DIR/config.toml.
        let toml = cfg.to_toml().unwrap();
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), toml).unwrap();
        check_loads(tmp.path(), &[])
            .unwrap_or_else(|e| panic!("{} round trip: {e:#}", f.display()));
    }
}

#[test]
fn shipped_configs_match_their_papers() {
    let dir = repo_root().join("configs");
    let a = check_loads(&dir.join("gsm8k_off_policy_grpo_qwen2.5-0.5b.toml"), &[]).unwrap();
    assert_eq!(a.raw.algorithm.preset, "off_policy_grpo");
    assert_eq!(a.raw.sync.interval, 4);
    assert_eq!(a.raw.data.task.name(), "gsm8k");
    let b = check_loads(&dir.join("gsm8k_rec_oneside_nois.toml"), &[]).unwrap();
    assert_eq!(b.raw.algorithm.preset, "rec_oneside_nois");
    assert_eq!(
        (b.raw.data.prompts_per_step, b.raw.rollout.group_size),
        (96, 8)
    );
    assert_eq!((b.raw.train.lr, b.raw.sync.interval), (1e-6, 20));
    let q = check_loads(&dir.join("quickstart.toml"), &[]).unwrap();
    assert_eq!(q.raw.data.task.name(), "arithmetic");
    let m = check_loads(&dir.join("math500_eval.toml"), &[]).unwrap();
    assert_eq!(m.raw.data.task.name(), "math500");
}

#[test]
fn an_unknown_key_is_rejected_by_name() {
    let f = repo_root().join("configs/quickstart.toml");
    let e = check_loads(&f, &["train.lr_max=1e-3"]).unwrap_err();
    assert!(format!("{e:#}").contains("lr_max"), "{e:#}");
}

/// A shipped config names the same files from any working directory: `rlvr train --config
/// ... --print-config` run in a temporary directory (config by absolute path) and in `crates/`
/// (config by relative path) prints the repository's `data/gsm8k/*.jsonl`, absolute, while
/// `output.dir` stays as written (relative to where the run starts).
#[test]
fn a_shipped_config_loads_from_another_working_directory() {
    let root = repo_root();
    let config = root.join("configs/gsm8k_rec_oneside_nois.toml");
    let tmp = tempfile::tempdir().unwrap();
    let crates = root.join("crates");
    for (cwd, arg) in [
        (tmp.path(), config.display().to_string()),
        (
            crates.as_path(),
            "../configs/gsm8k_rec_oneside_nois.toml".to_string(),
        ),
    ] {
        let out = common::rlvr()
            .current_dir(cwd)
            .args(["train", "--print-config", "--config", &arg])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {stderr}", cwd.display());
        let printed = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = printed.lines().collect();
        let has = |line: String| assert!(lines.contains(&line.as_str()), "{line}:\n{printed}");
        for (k, file) in [("train", "train.jsonl"), ("test", "test.jsonl")] {
            let want = root.join("data/gsm8k").join(file);
            has(format!("{k} = \"{}\"", want.display()));
            assert!(want.exists());
        }
        let model = root.join("models/Qwen2.5-1.5B-Instruct");
        has(format!("path = \"{}\"", model.display()));
        has("dir = \"runs/gsm8k-rec-oneside-nois\"".to_string());
        // What --print-config prints loads again, from the other directory, to the same paths.
        let copy = tmp.path().join("printed.toml");
        std::fs::write(&copy, &out.stdout).unwrap();
        let again = RawConfig::load(Some(&copy), &[])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(
            again.raw.data.train,
            Some(root.join("data/gsm8k/train.jsonl"))
        );
    }
    // A `--set` path is relative to the working directory, not to the config.
    let out = common::rlvr()
        .current_dir(tmp.path())
        .args(["train", "--print-config", "--config"])
        .arg(&config)
        .args(["--set", "data.test=held_out.jsonl"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let cwd = tmp.path().canonicalize().unwrap();
    let line = format!("test = \"{}\"", cwd.join("held_out.jsonl").display());
    assert!(printed.lines().any(|l| l == line), "{line}:\n{printed}");
}

/// `--print-config` and config.toml leave out the knobs nothing reads with the run's options and
/// list them in one comment line, which `rlvr lab` reads (its copy of the line's start must match).
#[test]
fn print_config_lists_the_unread_knobs_it_leaves_out() {
    assert_eq!(
        rlvr_lab::runner::UNREAD_COMMENT,
        rlvr_train::config::gates::UNREAD_COMMENT
    );
    let cfg = RawConfig::load(None, &[]).unwrap().resolve().unwrap();
    let text = cfg.to_toml().unwrap();
    let first = text.lines().next().unwrap();
    let keys = first
        .strip_prefix(rlvr_train::config::gates::UNREAD_COMMENT)
        .unwrap_or_else(|| panic!("{text}"));
    // Preset grpo, no regulariser, no KL, no LoRA, the native engine.
    for k in [
        "algorithm.lme_temperature",
        "algorithm.tau",
        "algorithm.kl_estimator",
        "model.lora_targets",
        "rollout.in_flight",
    ] {
        assert!(keys.split(", ").any(|x| x == k), "{k}: {first}");
        let field = k.rsplit_once('.').unwrap().1;
        assert!(
            !text.lines().any(|l| l.starts_with(&format!("{field} = "))),
            "{k} written:\n{text}"
        );
    }
}

/// The base config of configs/lab_multi_turn.toml (a subdirectory, so not a shipped train config
/// of its own) resolves with the `retry` environment, its chat template beside it, and an episode
/// budget that fits the quickstart model's 64 positions after its longest prompt (8 tokens).
#[test]
fn the_multi_turn_sweeps_base_config_resolves() {
    let f = repo_root().join("configs/lab_multi_turn/base.toml");
    let cfg = check_loads(&f, &[]).unwrap();
    let e = &cfg.raw.env;
    assert_eq!(e.builtin.as_deref(), Some("retry"));
    assert_eq!(e.max_turns, 2);
    let tpl = e.chat_template.as_ref().unwrap();
    assert_eq!(tpl, &repo_root().join("configs/lab_multi_turn/chat.jinja"));
    assert!(tpl.exists());
    assert!(8 + e.episode_tokens(cfg.raw.rollout.max_new_tokens) <= 64);
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(text.contains("# Hardware:"));
}
