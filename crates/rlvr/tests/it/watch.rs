//! A run a person can watch (issue 32), through the real binary with stderr piped (not a
//! terminal): the console's step and evaluation lines carry metrics.jsonl's values, the
//! TensorBoard event file carries every scalar of the JSONL files (also after SIGKILL and on
//! resume), per-component rewards are logged, the last step is evaluated, a run without learning
//! signal says so, and `--model RUN` / `RUN/checkpoints/latest` name the latest checkpoint.
#![cfg(unix)]

use crate::common::{ok, rlvr, tiny_model};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlvr_train::store::tensorboard::{read_events, EventWhat};
use serde_json::{Map, Value};

/// A verifier script printing `{"reward": R}` per input line, R from `awk_expr` (over NR).
fn script(dir: &Path, name: &str, awk_expr: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!("awk '{{ print \"{{\\\"reward\\\": \" ({awk_expr}) \"}}\" }}'\n"),
    )
    .unwrap();
    p
}

/// `--set` overrides of a small arithmetic run with two reward components: `alt` (weight 1,
/// alternating 1, 0, 1, …) and `half` (weight 0.5, always 1).
fn sets(dir: &Path, model: &Path, run: &Path, steps: u64) -> Vec<String> {
    let alt = script(dir, "alt.sh", "NR % 2");
    let one = script(dir, "one.sh", "1");
    vec![
        format!("model.path=\"{}\"", model.display()),
        format!("output.dir=\"{}\"", run.display()),
        "model.device=\"cpu\"".into(),
        "model.dtype=\"f32\"".into(),
        "data.task=\"arithmetic\"".into(),
        "data.arithmetic.min_digits=1".into(),
        "data.arithmetic.max_digits=1".into(),
        "data.arithmetic.train_size=64".into(),
        "data.arithmetic.test_size=4".into(),
        "data.prompts_per_step=2".into(),
        "rollout.group_size=4".into(),
        "rollout.max_new_tokens=3".into(),
        "train.lr=1e-2".into(),
        format!(
            "reward.components=[{{ name = \"alt\", weight = 1.0, verifier = {{ kind = \"external\", \
             command = [\"sh\", \"{}\"] }} }}, {{ name = \"half\", weight = 0.5, verifier = \
             {{ kind = \"external\", command = [\"sh\", \"{}\"] }} }}]",
            alt.display(),
            one.display()
        ),
        format!("train.steps={steps}"),
    ]
}

fn train(sets: &[String], extra: &[&str]) -> Command {
    let mut c = rlvr();
    c.args(["train"]).args(extra);
    for s in sets {
        c.arg("--set").arg(s);
    }
    c
}

fn jsonl(path: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The run's event file: every scalar as (tag, step) → value, every histogram's bucket counts
/// as (tag, step) → counts, and the config text's presence.
type Events = (
    BTreeMap<(String, i64), f32>,
    BTreeMap<(String, i64), Vec<f64>>,
    bool,
);

fn events(run: &Path) -> Events {
    let dir = run.join("tensorboard");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "one event file in {}: {files:?}",
        dir.display()
    );
    let mut out = BTreeMap::new();
    let mut hists = BTreeMap::new();
    let mut config = false;
    for e in read_events(&files[0]).unwrap() {
        if let Some(EventWhat::Summary(s)) = e.what {
            for v in s.value {
                if v.tag == "config" {
                    let text = String::from_utf8(v.tensor.unwrap().string_val[0].clone()).unwrap();
                    config = text.contains("[train]");
                    continue;
                }
                if let Some(h) = v.histo {
                    assert_eq!(h.num, h.bucket.iter().sum::<f64>(), "{}", v.tag);
                    assert_eq!(h.bucket_limit.len(), h.bucket.len(), "{}", v.tag);
                    let old = hists.insert((v.tag.clone(), e.step), h.bucket);
                    assert!(old.is_none(), "{} at step {} written twice", v.tag, e.step);
                    continue;
                }
                let old = out.insert((v.tag.clone(), e.step), v.simple_value.unwrap());
                assert!(old.is_none(), "{} at step {} written twice", v.tag, e.step);
            }
        }
    }
    (out, hists, config)
}

/// The event file holds exactly the scalars of metrics.jsonl (`eval/*` from eval.jsonl),
/// eval.jsonl (`eval/<field>`) and diagnostics.jsonl (`diagnostics/<key>`), each equal as f32,
/// and diagnostics.jsonl's `hist/*` arrays with counts as histograms with the same counts.
fn check_events_equal_jsonl(run: &Path) {
    let (ev, hists, config) = events(run);
    assert!(config, "the config text is in the event file");
    let mut want = BTreeMap::new();
    let mut want_hists = BTreeMap::new();
    for (file, prefix) in [
        ("metrics.jsonl", ""),
        ("eval.jsonl", "eval/"),
        ("diagnostics.jsonl", "diagnostics/"),
    ] {
        for rec in jsonl(&run.join(file)) {
            let step = rec["step"].as_i64().unwrap();
            for (k, v) in &rec {
                if k == "step" || (file == "metrics.jsonl" && k.starts_with("eval/")) {
                    continue;
                }
                if file == "diagnostics.jsonl" && k.starts_with("hist/") {
                    let counts: Vec<f64> = v
                        .as_array()
                        .map(|a| a.iter().map(|c| c.as_f64().unwrap()).collect())
                        .unwrap_or_default();
                    if counts.iter().sum::<f64>() > 0.0 {
                        want_hists.insert((format!("diagnostics/{k}"), step), counts);
                    }
                    continue;
                }
                let x = match v {
                    Value::Number(n) => n.as_f64().unwrap(),
                    Value::Bool(b) => f64::from(u8::from(*b)),
                    _ => continue,
                };
                let tag = if k.starts_with(prefix) {
                    k.clone()
                } else {
                    format!("{prefix}{k}")
                };
                want.insert((tag, step), x as f32);
            }
        }
    }
    assert!(want.len() > 100, "{}", want.len());
    assert_eq!(ev, want);
    assert_eq!(hists, want_hists);
}

/// The `step T/N ...` lines of stderr as step → (name → value).
fn console_steps(err: &str) -> BTreeMap<u64, BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for l in err.lines() {
        let Some(rest) = l.strip_prefix("step ") else {
            continue;
        };
        let mut tok = rest.split_whitespace();
        let t: u64 = tok
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let mut m = BTreeMap::new();
        let mut last_component = String::new();
        let toks: Vec<&str> = tok.collect();
        let mut i = 0;
        while i < toks.len() {
            match toks[i] {
                "elapsed" | "eta" => i += 2,
                "skipped" => {
                    m.insert("skipped".into(), 1.0);
                    i += 1
                }
                name => {
                    let v: f64 = toks[i + 1].parse().unwrap();
                    let key = match name {
                        "staleness" => "staleness/mean".to_string(),
                        "reward" => "reward/mean".into(),
                        "tokens/s" => "tokens_per_s".into(),
                        "share" => format!("{last_component}/share"),
                        n if n.starts_with("reward/") => {
                            last_component = n.to_string();
                            format!("{n}/mean")
                        }
                        n => n.into(),
                    };
                    m.insert(key, v);
                    i += 2;
                }
            }
        }
        out.insert(t, m);
    }
    out
}

#[test]
fn console_lines_tensorboard_and_components_carry_the_jsonl_values() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let run = tmp.path().join("run");
    let mut s = sets(tmp.path(), &model, &run, 5);
    // eval_every = 2 does not divide 5: steps 0, 2, 4 and the last, 5, are evaluated.
    s.push("train.eval_every=2".into());
    s.push("output.log_every=2".into());
    // Not a terminal: the bar is not drawn, the lines come instead (no --no-progress needed).
    let out = train(&s, &[]).stdin(Stdio::null()).output().unwrap();
    ok(&out, "train");
    let err = String::from_utf8_lossy(&out.stderr);
    let metrics = jsonl(&run.join("metrics.jsonl"));
    let eval_steps: Vec<i64> = jsonl(&run.join("eval.jsonl"))
        .iter()
        .map(|r| r["step"].as_i64().unwrap())
        .collect();
    assert_eq!(eval_steps, [0, 2, 4, 5]);
    // One line per evaluation, with eval.jsonl's accuracy.
    for r in jsonl(&run.join("eval.jsonl")) {
        let line = format!(
            "eval step {} accuracy {:.4}",
            r["step"],
            r["accuracy"].as_f64().unwrap()
        );
        assert!(err.contains(&line), "{line} in\n{err}");
    }
    // log_every = 2: steps 2, 4 and the last.
    let console = console_steps(&err);
    assert_eq!(
        console.keys().copied().collect::<Vec<_>>(),
        [2, 4, 5],
        "{err}"
    );
    let decimals = |k: &str| match k {
        "staleness/mean" => 2,
        "tokens_per_s" => 1,
        _ => 4,
    };
    for (t, vals) in &console {
        let m = metrics.iter().find(|r| r["step"] == *t).unwrap();
        for (k, v) in vals {
            let want = m[k.as_str()]
                .as_f64()
                .unwrap_or_else(|| panic!("{k} at {t}"));
            let tol = 0.5 * 10f64.powi(-decimals(k)) + 1e-9;
            assert!(
                (v - want).abs() <= tol,
                "step {t} {k}: console {v}, metrics {want}"
            );
        }
        // Every value the line shows when defined is there.
        for k in [
            "reward/mean",
            "accuracy",
            "loss",
            "staleness/mean",
            "tokens_per_s",
            "reward/alt/mean",
            "reward/alt/share",
            "reward/half/mean",
            "reward/half/share",
        ] {
            assert_eq!(vals.contains_key(k), !m[k].is_null(), "step {t} {k}: {err}");
        }
    }
    // The components: 8 completions per batch, alt = 1, 0, 1, … (mean 0.5), half = 1 with
    // weight 0.5: the reward is 1 on average and each component has half of it.
    for m in metrics.iter().filter(|m| m["step"] != 0) {
        assert_eq!(m["reward/alt/mean"], 0.5, "{m:?}");
        assert_eq!(m["reward/half/mean"], 1.0, "{m:?}");
        assert_eq!(m["reward/mean"], 1.0, "{m:?}");
        assert_eq!(m["reward/alt/share"], 0.5, "{m:?}");
        assert_eq!(m["reward/half/share"], 0.5, "{m:?}");
    }
    check_events_equal_jsonl(&run);
    check_model_paths(&run);
    // train.log has a line for every step.
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    for t in 1..=5 {
        assert!(log.contains(&format!("\nstep {t}/5 ")), "{log}");
    }
}

#[test]
fn a_killed_run_leaves_readable_events_and_resume_rebuilds_them() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let run = tmp.path().join("run");
    let mut s = sets(tmp.path(), &model, &run, 6);
    s.push("train.save_every=2".into());
    let mut child = train(&s, &["--no-progress"])
        .env("RLVR_DEBUG_HANG_AFTER_STEP", "3")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while jsonl(&run.join("metrics.jsonl")).len() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(300), "step 3 never came");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The events are flushed with each step's lines; give the hung process a moment.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let (ev, _, _) = events(&run);
    for t in 1..=3 {
        assert!(
            ev.contains_key(&("loss".to_string(), t)),
            "step {t}: {ev:?}"
        );
    }
    check_events_equal_jsonl(&run);
    // Resume from step 2's checkpoint: step 3 is cut from the JSONL files and the events.
    let out = train(&[], &["--no-progress", "--resume"])
        .arg(&run)
        .output()
        .unwrap();
    ok(&out, "resume");
    assert_eq!(jsonl(&run.join("metrics.jsonl")).len(), 6);
    check_events_equal_jsonl(&run);
}

#[test]
fn a_run_without_learning_signal_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let run = tmp.path().join("run");
    let zero = script(tmp.path(), "zero.sh", "0");
    let mut s = sets(tmp.path(), &model, &run, 4);
    s.pop();
    s.retain(|x| !x.starts_with("reward.components"));
    s.push(format!(
        "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"] }}",
        zero.display()
    ));
    s.push("train.steps=4".into());
    s.push("train.eval_every=3".into());
    s.push("output.warn_no_signal_steps=3".into());
    let out = train(&s, &["--no-progress"]).output().unwrap();
    ok(&out, "train");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: steps 1-3: every completion of the batch got the same reward (0)"),
        "{err}"
    );
    assert!(
        err.contains("warning: the held-out accuracy was exactly 0 at step 0 and at step 4"),
        "{err}"
    );
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("warning: steps 1-3"), "{log}");
    // Once per streak: no second warning at step 4.
    assert_eq!(err.matches("warning: steps").count(), 1, "{err}");
}

/// `--model RUN` and `--model RUN/checkpoints/latest` give what the checkpoint `latest` names
/// gives; a `latest` naming a path outside `checkpoints/` is refused.
fn check_model_paths(run: &Path) {
    let logprobs = |model: &Path| {
        let out = rlvr()
            .args([
                "logprobs",
                "--prompt",
                "1+2=",
                "--completion",
                "3",
                "--model",
            ])
            .arg(model)
            .output()
            .unwrap();
        ok(&out, &format!("logprobs --model {}", model.display()));
        String::from_utf8(out.stdout).unwrap()
    };
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "step-5");
    let want = logprobs(&run.join("checkpoints/step-5"));
    assert!(want.contains("\"logprobs\""), "{want}");
    assert_eq!(logprobs(run), want);
    assert_eq!(logprobs(&run.join("checkpoints/latest")), want);
    // Also through `rlvr generate` (the same resolution): it loads and samples.
    let prompts = run.join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"1+2=\"}\n").unwrap();
    let out = rlvr()
        .args(["generate", "-n", "1", "--max-new-tokens", "2", "--model"])
        .arg(run)
        .arg("--prompts")
        .arg(&prompts)
        .output()
        .unwrap();
    ok(&out, "generate --model RUN");
    std::fs::write(run.join("checkpoints/latest"), "../../model\n").unwrap();
    let out = rlvr()
        .args(["logprobs", "--prompt", "1", "--completion", "2", "--model"])
        .arg(run)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("names `../../model`, which is not a checkpoint folder beside it"),
        "{err}"
    );
    std::fs::write(run.join("checkpoints/latest"), "step-5\n").unwrap();
}

#[test]
fn sft_prints_step_lines_off_a_terminal_with_metrics_jsonl_values() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let pairs = tmp.path().join("pairs.jsonl");
    std::fs::write(
        &pairs,
        "{\"prompt\": \"1+2=\", \"completion\": \"3\"}\n{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n",
    )
    .unwrap();
    let out_dir = tmp.path().join("sft");
    let out = rlvr()
        .args([
            "sft",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--log-every",
            "2",
            "--model",
        ])
        .arg(&model)
        .arg("--data")
        .arg(&pairs)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    ok(&out, "sft");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("sft step ")).collect();
    assert_eq!(lines.len(), 2, "steps 2 and 3 (the last): {err}");
    let metrics = jsonl(&out_dir.join("metrics.jsonl"));
    for (l, t) in lines.iter().zip([2u64, 3]) {
        assert!(l.starts_with(&format!("sft step {t}/3 loss ")), "{l}");
        let loss: f64 = l.split_whitespace().nth(4).unwrap().parse().unwrap();
        let m = metrics.iter().find(|r| r["step"] == t).unwrap();
        let want = m["loss"].as_f64().unwrap();
        assert!((loss - want).abs() <= 5e-5 + 1e-12, "{loss} vs {want}");
    }
}
