//! `rlvr quickstart --fast` end to end through the binary: every phase runs, and the summary,
//! the plot and both run directories are written.

use std::process::Command;

#[test]
fn quickstart_fast_runs_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("qs");
    let out = Command::new(env!("CARGO_BIN_EXE_rlvr"))
        .args(["quickstart", "--fast", "--seed", "1", "--out"])
        .arg(&out_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for phase in ["init", "sft", "on_policy", "off_policy", "eval"] {
        assert!(
            stderr.contains(&format!("quickstart: {phase}")),
            "{phase}: {stderr}"
        );
    }
    assert!(stdout.contains("on-policy GRPO (v=1)"), "{stdout}");
    // Its own preset change for the off-policy run is not warned about (it was, mid-output).
    assert!(!stderr.contains("algorithm.preset changes"), "{stderr}");
    assert!(stdout.contains("off-policy GRPO (v=4)"), "{stdout}");
    // Both RL runs start from the SFT warm start; a run that never solves a held-out problem (0
    // at step 0 and at the end; both do at this size on x86-64) is told to warm-start longer, not
    // to warm-start (it was, right after the quickstart's own warm start).
    let never = stderr
        .matches("the model never solved a held-out problem")
        .count();
    let longer = "or warm-start longer: model.path is an `rlvr sft` model";
    assert_eq!(stderr.matches(longer).count(), never, "{stderr}");
    assert!(
        !stderr.contains("or warm-start with `rlvr sft`"),
        "{stderr}"
    );

    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    for k in ["sft_accuracy", "on_policy_accuracy", "off_policy_accuracy"] {
        let v = s[k].as_f64().unwrap_or_else(|| panic!("{k}: {s}"));
        assert!((0.0..=1.0).contains(&v), "{k} = {v}");
    }
    let wall = &s["wall_s"];
    for k in ["init", "sft", "on_policy", "off_policy", "eval", "total"] {
        assert!(wall[k].as_f64().unwrap() >= 0.0, "wall_s.{k}: {s}");
    }
    assert!(wall["total"].as_f64().unwrap() >= wall["sft"].as_f64().unwrap());

    let svg = std::fs::read_to_string(out_dir.join("comparison.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("on_policy") && svg.contains("off_policy"));
    // Same steps and prompts in both runs; the sync interval differs.
    for (run, v) in [("on_policy", 1), ("off_policy", 4)] {
        let d = out_dir.join(run);
        let cfg = std::fs::read_to_string(d.join("config.toml")).unwrap();
        assert!(cfg.contains(&format!("interval = {v}")), "{run}: {cfg}");
        let metrics = std::fs::read_to_string(d.join("metrics.jsonl")).unwrap();
        assert!(metrics.contains("\"eval/accuracy\""), "{run}");
        assert!(d.join("checkpoints/latest").exists(), "{run}");
    }
    let prompts = |run: &str| -> Vec<String> {
        std::fs::read_to_string(out_dir.join(run).join("rollouts.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                format!("{}:{}", v["step"], v["prompt"])
            })
            .collect()
    };
    assert_eq!(prompts("on_policy"), prompts("off_policy"));

    // OUT/quickstart.toml names the warm start and the data beside it, so it runs as it is from
    // another working directory (one step here; output.dir relative to that directory).
    let out_abs = out_dir.canonicalize().unwrap();
    let copy = std::fs::read_to_string(out_dir.join("quickstart.toml")).unwrap();
    for line in [
        "path = \"sft\"",
        "train = \"data/train.jsonl\"",
        "test = \"data/test.jsonl\"",
    ] {
        assert!(copy.lines().any(|l| l == line), "{line}:\n{copy}");
    }
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rlvr"))
        .current_dir(&elsewhere)
        .args(["train", "--no-progress", "--config"])
        .arg(out_abs.join("quickstart.toml"))
        .args(["--set", "train.steps=1", "--set", "train.eval_every=0"])
        .args([
            "--set",
            "data.prompts_per_step=2",
            "--set",
            "output.dir=again",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cfg = std::fs::read_to_string(elsewhere.join("again/config.toml")).unwrap();
    for line in [
        format!("path = \"{}\"", out_abs.join("sft").display()),
        format!("train = \"{}\"", out_abs.join("data/train.jsonl").display()),
        "dir = \"again\"".to_string(),
    ] {
        assert!(cfg.lines().any(|l| l == line), "{line}:\n{cfg}");
    }
}
