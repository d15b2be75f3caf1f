//! Every config shipped in `configs/` loads and resolves as `rlvr train --config FILE` does
//! (unknown keys rejected), and the data files it names exist (paths are relative to the
//! repository root, where the repository carries `data/`).

use std::path::{Path, PathBuf};

use rlvr_train::config::RawConfig;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shipped_configs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo_root().join("configs"))
        .expect("configs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        // configs/lab.toml is a sweep for `rlvr lab`, not a train config (rlvr-lab's tests read it).
        .filter(|p| p.file_name().is_some_and(|n| n != "lab.toml"))
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
        // Shipped data paths (not the quickstart's generated files) exist from the repo root.
        for p in [&cfg.raw.data.train, &cfg.raw.data.test]
            .into_iter()
            .flatten()
        {
            if p.starts_with("data/") {
                assert!(
                    repo_root().join(p).exists(),
                    "{}: {} missing",
                    f.display(),
                    p.display()
                );
            }
        }
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
