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

/// Issue 49 item 5: `[lab].sets = ["output.dir=..."]` silently sent every run elsewhere (the
/// summary then found "0 runs"). A `--set` of a key the lab sets itself (the run directory, the seeds, an
/// arm's preset, interval and offset) is refused at parse time, naming the sweep key to use.
#[test]
fn sets_of_keys_the_lab_owns_are_refused_naming_the_sweep_key() {
    let with = |lab_sets: &str, arm_sets: &str| {
        let text = WARM
            .replace("steps = 2\n", &format!("steps = 2\nsets = [{lab_sets}]\n"))
            .replace(
                "preset = \"grpo\"\n",
                &format!("preset = \"grpo\"\nsets = [{arm_sets}]\n"),
            );
        Sweep::parse(&text).map(|_| ()).map_err(|e| e.to_string())
    };
    assert_eq!(with("", ""), Ok(()));
    assert_eq!(
        with("\"train.lr=2e-5\"", "\"algorithm.clip_high=0.28\""),
        Ok(())
    );
    assert_eq!(
        with("\"output.dir=/tmp/elsewhere\"", ""),
        Err(
            "[lab].sets: `output.dir=/tmp/elsewhere` sets output.dir, which the lab sets itself; \
             use the sweep's --out (each run is OUT/ARM/seed-N)"
                .to_string()
        )
    );
    assert_eq!(
        with("", "\"train.seed=9\""),
        Err(
            "[[arm]] `a` sets: `train.seed=9` sets train.seed, which the lab sets itself; use \
             [lab].seeds"
                .to_string()
        )
    );
    assert_eq!(
        with("", "\"sync.interval = 4\""),
        Err(
            "[[arm]] `a` sets: `sync.interval = 4` sets sync.interval, which the lab sets \
             itself; use the arm's interval"
                .to_string()
        )
    );
    assert_eq!(
        with("\"algorithm.preset='dapo'\"", ""),
        Err(
            "[lab].sets: `algorithm.preset='dapo'` sets algorithm.preset, which the lab sets \
             itself; use the arm's preset"
                .to_string()
        )
    );
    // An arm may run longer than the others.
    assert_eq!(with("", "\"train.steps=9\""), Ok(()));
}
