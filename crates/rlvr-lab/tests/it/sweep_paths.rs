//! A sweep file's `[warm_start]` paths are relative to the sweep file, as a train config's input
//! paths are to the config (configs/README.md "Paths"), not to the working directory of `rlvr lab`.

use std::path::Path;

use rlvr_lab::sweep::Sweep;

const WARM: &str = r#"
[lab]
seeds = [0]
steps = 2

[warm_start]
model = "models/seed-{seed}/sft"
config = "../base.toml"

[[arm]]
name = "a"
preset = "grpo"
"#;

/// The value after `flag` in `args`, e.g. the `--config`.
fn after<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args.iter().position(|a| a == flag).unwrap();
    &args[i + 1]
}

/// `[warm_start]`'s relative `model` and `config` are relative to the sweep file's directory
/// (the child runs get them absolute), not to the working directory; an absolute path is kept;
/// the text parsed without a file (the built-in sweep) keeps them as written.
#[test]
fn warm_start_paths_are_relative_to_the_sweep_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("sweeps")).unwrap();
    let file = root.join("sweeps/lab.toml");
    std::fs::write(&file, WARM).unwrap();
    let s = Sweep::load(Some(&file)).unwrap();
    let model = root.join("sweeps/models/seed-{seed}/sft");
    assert_eq!(s.warm_start.model.as_deref(), model.to_str());
    assert_eq!(
        s.warm_start.config.as_deref(),
        root.join("base.toml").to_str()
    );
    let args = s.train_args(Path::new("out"), &s.runs()[0]);
    assert_eq!(
        after(&args, "--config"),
        root.join("base.toml").to_str().unwrap()
    );
    let set = format!(
        "model.path={}",
        root.join("sweeps/models/seed-0/sft").display()
    );
    assert!(args.contains(&set), "{args:?}");

    // The same file named by a path with `..` in it.
    let s = Sweep::load(Some(&root.join("sweeps/../sweeps/lab.toml"))).unwrap();
    assert_eq!(
        s.warm_start.config.as_deref(),
        root.join("base.toml").to_str()
    );

    let abs = WARM
        .replace("models/seed-{seed}/sft", "/m/{seed}")
        .replace("../base.toml", "/c/base.toml");
    let s = Sweep::parse_file(&abs, &file).unwrap();
    assert_eq!(s.warm_start.model.as_deref(), Some("/m/{seed}"));
    assert_eq!(s.warm_start.config.as_deref(), Some("/c/base.toml"));

    let s = Sweep::parse(WARM).unwrap();
    assert_eq!(
        s.warm_start.model.as_deref(),
        Some("models/seed-{seed}/sft")
    );
}

/// `--only` without `--fast` on the built-in sweep: its `[fast].arms` names arms that `--only`
/// left out, which is no error (it was: "[fast].arms names `grpo_v16`, which is no [[arm]]").
#[test]
fn only_without_fast_on_the_built_in_sweep_keeps_the_named_arms() {
    let s = Sweep::load(None)
        .unwrap()
        .select(false, &["grpo_v1".into()])
        .unwrap();
    let names: Vec<&str> = s.arms.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["grpo_v1"]);
    let s = Sweep::load(None)
        .unwrap()
        .select(true, &["grpo_v16".into()])
        .unwrap();
    assert_eq!(s.arms.len(), 1);
    assert!(Sweep::load(None)
        .unwrap()
        .select(false, &["no_such_arm".into()])
        .is_err());
}
