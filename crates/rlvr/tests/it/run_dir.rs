//! Run directories and output directories through the real `rlvr` binary, several processes at once
//! (the ways a run is interrupted, reused or misconfigured): one writer per run directory, SIGKILL-resume, SIGTERM, an error that
//! saves the last good step, train.log; `--force` on init/sft; zero sizes refused.
#![cfg(unix)]

use crate::common::{alive, left_after, ok, rlvr, tiny_model, tokenizer_json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A scratch directory with a tiny model in it (`tiny_model`) and the path of a run directory
/// there (`run`, not created).
fn tiny_run() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let run = tmp.path().join("run");
    (tmp, model, run)
}

/// `--set` overrides of a small arithmetic run.
fn sets(model: &Path, run: &Path, steps: u64) -> Vec<String> {
    vec![
        format!("model.path=\"{}\"", model.display()),
        format!("output.dir=\"{}\"", run.display()),
        "model.device=\"cpu\"".into(),
        "model.dtype=\"f32\"".into(),
        "data.task=\"arithmetic\"".into(),
        "data.arithmetic.min_digits=1".into(),
        "data.arithmetic.max_digits=1".into(),
        "data.arithmetic.train_size=64".into(),
        "data.arithmetic.test_size=8".into(),
        "data.prompts_per_step=2".into(),
        "rollout.group_size=4".into(),
        "rollout.max_new_tokens=3".into(),
        "train.lr=1e-2".into(),
        "train.eval_every=0".into(),
        format!("train.steps={steps}"),
    ]
}

fn train_cmd(sets: &[String]) -> Command {
    let mut c = rlvr();
    c.args(["train", "--no-progress"]);
    for s in sets {
        c.arg("--set").arg(s);
    }
    c
}

/// `rlvr train --no-progress --resume RUN`.
fn resume(run: &Path) -> Command {
    let mut c = rlvr();
    c.args(["train", "--no-progress", "--resume"]).arg(run);
    c
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The last step of RUN_DIR/metrics.jsonl (0 when absent).
fn last_step(run: &Path) -> u64 {
    steps(run).last().copied().unwrap_or(0)
}

fn steps(run: &Path) -> Vec<u64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .collect()
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn latest(run: &Path) -> String {
    std::fs::read_to_string(run.join("checkpoints/latest"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn a_second_writer_is_refused_naming_the_holder_and_sigkill_resume_still_works() {
    let (_tmp, model, run) = tiny_run();
    let mut s = sets(&model, &run, 5);
    s.push("train.save_every=1".into());
    // A: stops making progress after step 2 (its checkpoint written), holding the directory.
    let mut c = train_cmd(&s);
    c.env("RLVR_DEBUG_HANG_AFTER_STEP", "2");
    let mut a = spawn(c);
    wait_for("A reaches step 2", 120, || {
        last_step(&run) == 2 && latest(&run) == "step-2"
    });
    let config_before = std::fs::read(run.join("config.toml")).unwrap();
    let metrics_before = std::fs::read(run.join("metrics.jsonl")).unwrap();
    let holder = format!("pid {}", a.id());

    // B: --resume on the busy directory; C: a fresh start on it (with another lr).
    let b = resume(&run).output().unwrap();
    let mut s2 = s.clone();
    s2.push("train.lr=5e-2".into());
    let c2 = train_cmd(&s2).output().unwrap();
    for (name, out) in [("--resume", &b), ("fresh", &c2)] {
        assert!(!out.status.success(), "{name} was not refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("in use by another rlvr process") && err.contains(&holder),
            "{name}: {err}"
        );
    }
    assert_eq!(
        std::fs::read(run.join("config.toml")).unwrap(),
        config_before
    );
    assert_eq!(
        std::fs::read(run.join("metrics.jsonl")).unwrap(),
        metrics_before
    );
    let lock = std::fs::read_to_string(run.join(".lock")).unwrap();
    assert!(lock.contains(&holder) && lock.contains("host ") && lock.contains("started "));

    // SIGKILL A: the OS releases its lock, and the run resumes to the end.
    a.kill().unwrap();
    a.wait().unwrap();
    assert!(run.join(".lock").exists(), "a killed holder's .lock stays");
    let d = resume(&run).output().unwrap();
    ok(&d, "resume after SIGKILL");
    assert_eq!(steps(&run), [1, 2, 3, 4, 5]);
    assert_eq!(latest(&run), "step-5");
    // The run that ended removed the lock file (the killed holder's included, taken over).
    assert!(
        !run.join(".lock").exists(),
        "RUN/.lock stayed after a clean exit"
    );
}

/// Issue 49 item 5: deleting `RUN/.lock` during a run used to let a second writer in (both
/// exited 0, their metrics interleaved), since the lock was the file's. The lock is now the run
/// directory's own, so a second start is refused however the file fares; and a `checkpoints/`
/// that is a symbolic link into another run is refused (a resume would continue that run and
/// delete its checkpoints).
#[test]
fn a_deleted_lock_file_lets_no_second_writer_in_and_foreign_checkpoints_are_refused() {
    let (tmp, model, run) = tiny_run();
    let s = sets(&model, &run, 5);
    let mut c = train_cmd(&s);
    c.env("RLVR_DEBUG_HANG_AFTER_STEP", "2");
    let mut a = spawn(c);
    wait_for("A reaches step 2", 120, || last_step(&run) == 2);
    std::fs::remove_file(run.join(".lock")).unwrap();
    let b = train_cmd(&s).output().unwrap();
    let err = String::from_utf8_lossy(&b.stderr);
    assert!(!b.status.success(), "a second writer ran: {err}");
    assert!(
        err.contains("is in use by another rlvr process") && err.contains(".lock was removed"),
        "{err}"
    );
    assert_eq!(steps(&run), [1, 2]);
    a.kill().unwrap();
    a.wait().unwrap();

    // Another run whose checkpoints/ is a link to the first run's.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    ok(
        &train_cmd(&sets(&model, &other, 1)).output().unwrap(),
        "other run",
    );
    std::fs::create_dir_all(run.join("checkpoints")).unwrap();
    std::fs::remove_dir_all(other.join("checkpoints")).unwrap();
    std::os::unix::fs::symlink(run.join("checkpoints"), other.join("checkpoints")).unwrap();
    let r = resume(&other).output().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success(), "{err}");
    assert!(
        err.contains("is a symbolic link to") && err.contains("the checkpoints of another run"),
        "{err}"
    );
}

/// Issue 49 item 5: two `rlvr sft --force --out X` at once shared one staging directory (X ended
/// with both runs' metrics interleaved). `--out` has one writer: while another process holds its
/// lock, `sft`, `init` and `merge` are refused naming the holder, and X is untouched.
#[test]
fn an_output_directory_being_written_is_refused_to_a_second_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let pairs = tmp.path().join("pairs.jsonl");
    std::fs::write(&pairs, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n").unwrap();
    let out = tmp.path().join("out");
    // Hold out's lock as a running `rlvr sft` does (its pid line in the lock file).
    let lock = tmp.path().join(".out.lock");
    std::fs::write(&lock, "pid 4242\nhost testhost\nstarted now\n").unwrap();
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lock)
        .unwrap();
    assert!(rlvr_rundir::lock::try_flock(&held).unwrap());
    let sft = rlvr()
        .args(["sft", "--steps", "1", "--force", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(&pairs)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&sft.stderr);
    assert!(!sft.status.success(), "{err}");
    assert!(
        err.contains("--out") && err.contains("is being written by another rlvr process (pid 4242"),
        "{err}"
    );
    assert!(!out.exists());
    drop(held);
    let sft = rlvr()
        .args(["sft", "--steps", "1", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(&pairs)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    ok(&sft, "sft once the lock is free");
    assert!(out.join("model.safetensors").exists());
    // The lock file (the earlier holder's, taken over) went when sft ended.
    assert!(!lock.exists(), "{} stayed", lock.display());
}

#[test]
fn of_two_fresh_starts_at_once_exactly_one_runs_and_config_toml_is_its_own() {
    let (_tmp, model, run) = tiny_run();
    let lrs = ["0.011", "0.022"];
    let mut kids: Vec<Child> = lrs
        .iter()
        .map(|lr| {
            let mut s = sets(&model, &run, 5);
            s.push(format!("train.lr={lr}"));
            let mut c = train_cmd(&s);
            c.env("RLVR_DEBUG_HANG_AFTER_STEP", "1");
            spawn(c)
        })
        .collect();
    // The loser exits (non-zero); the winner hangs after step 1.
    let mut loser = None;
    wait_for("one start to fail", 120, || {
        for (k, child) in kids.iter_mut().enumerate() {
            if let Some(st) = child.try_wait().unwrap() {
                loser = Some((k, st));
                return true;
            }
        }
        false
    });
    let (k, st) = loser.unwrap();
    let winner = 1 - k;
    assert!(!st.success(), "the second start succeeded");
    let out = kids.remove(k).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("in use by another rlvr process") || err.contains("already holds a run"),
        "{err}"
    );
    wait_for("the winner's step 1", 120, || last_step(&run) == 1);
    let cfg = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let has_lr = |lr: &str| cfg.lines().any(|l| l.trim() == format!("lr = {lr}"));
    assert!(has_lr(lrs[winner]) && !has_lr(lrs[k]), "{cfg}");
    let mut w = kids.pop().unwrap();
    assert!(w.try_wait().unwrap().is_none(), "the winner stopped");
    w.kill().unwrap();
    w.wait().unwrap();
    assert_eq!(steps(&run), [1]);
}

/// SIGTERM during start-up (here: rendering thousands of prompts with a slow chat template, which
/// takes tens of seconds) ends the process within seconds, exit 143, saying that no step ran;
/// before, it waited for the end of start-up and the first step.
#[test]
fn sigterm_during_start_up_exits_within_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let cfg_path = model.join("tokenizer_config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    // About 10 ms a prompt, within the template's fuel.
    cfg["chat_template"] = "{% for i in range(50000) %}{% endfor %}{% for m in messages %}\
                            {{ m['content'] }}{% endfor %}"
        .into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let run = tmp.path().join("run");
    let mut s = sets(&model, &run, 2);
    s.extend([
        "data.style=\"chat\"".to_string(),
        "data.arithmetic.train_size=5000".into(),
    ]);
    let child = spawn(train_cmd(&s));
    // The run directory is open: the signal handler is in place and start-up is under way.
    wait_for("train.log", 60, || run.join("train.log").exists());
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let waited = t0.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(
        waited < Duration::from_secs(5),
        "exited {waited:?} after SIGTERM: {err}"
    );
    assert!(
        err.contains("SIGTERM: stopping during start-up") && err.contains("nothing to save"),
        "{err}"
    );
    assert_eq!(last_step(&run), 0, "{err}");
}

#[test]
fn sigterm_saves_a_checkpoint_exits_143_and_train_log_keeps_the_story() {
    let (tmp, model, run) = tiny_run();
    // Run outside the repository: run.json's git_commit must still be the binary's commit.
    let mut c = train_cmd(&sets(&model, &run, 100_000));
    c.current_dir(tmp.path());
    let child = spawn(c);
    wait_for("step 2", 120, || last_step(&run) >= 2);
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["interrupted"], true);
    let n = v["steps"].as_u64().unwrap();
    assert!(n >= 2);
    assert_eq!(latest(&run), format!("step-{n}"));
    assert_eq!(last_step(&run), n);
    let rj: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    assert_eq!(rj["git_commit"].as_str().map(str::to_string), head);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains("started (pid "), "{log}");
    for t in 1..=n {
        assert!(log.contains(&format!("\nstep {t}/100000")), "{log}");
    }
    assert!(
        log.contains(&format!("interrupted by SIGTERM after step {n}")),
        "{log}"
    );
}

#[test]
fn a_failing_verifier_after_step_4_saves_step_4_and_the_run_resumes() {
    let (tmp, model, run) = tiny_run();
    // Fails on its 6th call (step 5's batch: the start-up probe before the model loads is the
    // 1st, then one call per step), succeeds before and after.
    let script = tmp.path().join("score.sh");
    let counter = tmp.path().join("calls");
    std::fs::write(
        &script,
        format!(
            "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}\n\
             if [ $n -eq 6 ]; then echo 'verifier broke' >&2; exit 1; fi\n\
             awk '{{ print \"{{\\\"reward\\\": \" (NR % 2) \"}}\" }}'\n",
            c = counter.display()
        ),
    )
    .unwrap();
    let mut s = sets(&model, &run, 7);
    s.push(format!(
        "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"], timeout_s = 60 }}",
        script.display()
    ));
    let out = train_cmd(&s).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("verifier broke"), "{err}");
    assert!(err.contains("after step 4; its state was saved"), "{err}");
    // save_every = 0: without the error save, no checkpoint would exist.
    assert_eq!(latest(&run), "step-4");
    assert_eq!(steps(&run), [1, 2, 3, 4]);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("error: ") && log.contains("verifier broke"),
        "{log}"
    );
    let r = resume(&run).output().unwrap();
    ok(&r, "resume");
    assert_eq!(steps(&run), [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(latest(&run), "step-7");
}

/// A per-batch verifier script for the evaluation tests: batches of 5 rows are the evaluation's
/// (`data.arithmetic.test_size = 5`; training batches have 2 prompts x 4 completions); on the
/// second evaluation (step 3's, after step 0's) it runs `on_second_eval`, else it scores
/// alternately 0 and 1. Each call writes its rows to `seen` first.
fn eval_verifier(dir: &Path, on_second_eval: &str) -> PathBuf {
    let script = dir.join("score.sh");
    std::fs::write(
        &script,
        format!(
            "cat > {seen}; n=$(wc -l < {seen})\n\
             if [ $n -eq 5 ]; then e=$(cat {evals} 2>/dev/null || echo 0); e=$((e+1)); echo $e > {evals}\n\
               if [ $e -eq 2 ]; then {on_second_eval}; fi; fi\n\
             awk '{{ print \"{{\\\"reward\\\": \" (NR % 2) \"}}\" }}' {seen}\n",
            seen = dir.join("seen").display(),
            evals = dir.join("evals").display(),
        ),
    )
    .unwrap();
    script
}

/// The settings of a 6-step run evaluated at steps 0, 3 and 6 by `script`, never checkpointing
/// on its own (`train.save_every = 0`, the default).
fn eval_sets(model: &Path, run: &Path, script: &Path, timeout_s: u64) -> Vec<String> {
    let mut s = sets(model, run, 6);
    s.retain(|k| !k.starts_with("train.eval_every") && !k.starts_with("data.arithmetic.test_size"));
    s.extend([
        "train.eval_every=3".into(),
        "data.arithmetic.test_size=5".into(),
        format!(
            "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"], timeout_s = {timeout_s} }}",
            script.display()
        ),
    ]);
    s
}

/// The `eval/accuracy` of step `t` in RUN/metrics.jsonl (`Some(Null)` when recorded as null).
fn eval_accuracy(run: &Path, t: u64) -> Option<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["step"].as_u64() == Some(t))
        .and_then(|v| v.get("eval/accuracy").cloned())
}

/// Issue 49 item 1: an evaluation that fails (here step 3's: the verifier exits 1) used to lose
/// every step since the last checkpoint (none with the default `save_every = 0`), because a step
/// counted as complete only after its evaluation. Now step 3, whose update is complete, is saved,
/// its `eval/accuracy` is null in metrics.jsonl, and `--resume` goes on from it.
#[test]
fn a_failing_evaluation_saves_its_step_and_the_run_resumes() {
    let (tmp, model, run) = tiny_run();
    let script = eval_verifier(tmp.path(), "echo 'reward model: 503' >&2; exit 1");
    let out = train_cmd(&eval_sets(&model, &run, &script, 60))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("reward model: 503"), "{err}");
    assert!(err.contains("evaluating step 3"), "{err}");
    assert!(err.contains("after step 3; its state was saved"), "{err}");
    assert_eq!(latest(&run), "step-3");
    assert_eq!(steps(&run), [0, 1, 2, 3]);
    assert_eq!(eval_accuracy(&run, 3), Some(serde_json::Value::Null));
    let r = resume(&run).output().unwrap();
    ok(&r, "resume");
    assert_eq!(steps(&run), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(latest(&run), "step-6");
    assert!(eval_accuracy(&run, 6).is_some_and(|v| v.is_number()));
}

/// Issue 49 items 1 and 2: SIGTERM while an evaluation hangs (a verifier that stops answering)
/// used to exit 1 with no checkpoint. The evaluation ends by the verifier's timeout, and the run
/// stops as an interruption: step 3 saved, its evaluation null, exit 143, then resumes.
#[test]
fn sigterm_during_a_hung_evaluation_saves_the_step_and_exits_143() {
    let (tmp, model, run) = tiny_run();
    let hung = tmp.path().join("hung");
    let script = eval_verifier(tmp.path(), &format!("touch {}; sleep 600", hung.display()));
    let child = spawn(train_cmd(&eval_sets(&model, &run, &script, 4)));
    wait_for("the hung evaluation", 120, || hung.exists());
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(
        err.contains("the evaluation of step 3 ended with an error"),
        "{err}"
    );
    assert_eq!(latest(&run), "step-3");
    assert_eq!(steps(&run), [0, 1, 2, 3]);
    assert_eq!(eval_accuracy(&run, 3), Some(serde_json::Value::Null));
    ok(&resume(&run).output().unwrap(), "resume");
    assert_eq!(steps(&run), [0, 1, 2, 3, 4, 5, 6]);
}

/// A run asked to stop whose last step then fails (here the training verifier exits 1 in the
/// step under way when SIGTERM arrives) used to exit 1, as for any error, so `rlvr train ... &&
/// next` could not tell an interruption: it exits 143, the error said first, and the steps before
/// it are saved.
#[test]
fn sigterm_then_an_error_in_the_last_step_exits_143_saying_the_error() {
    let (tmp, model, run) = tiny_run();
    let (armed, hung) = (tmp.path().join("armed"), tmp.path().join("hung"));
    let script = tmp.path().join("score.sh");
    std::fs::write(
        &script,
        format!(
            "if [ -e {armed} ]; then touch {hung}; sleep 3; echo 'the verifier failed' >&2; exit 1; fi\n\
             awk '{{ print \"{{\\\"reward\\\": \" (NR % 2) \"}}\" }}'\n",
            armed = armed.display(),
            hung = hung.display(),
        ),
    )
    .unwrap();
    let mut s = sets(&model, &run, 100_000);
    s.push(format!(
        "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"], timeout_s = 60 }}",
        script.display()
    ));
    s.push("train.save_every=1".into());
    let child = spawn(train_cmd(&s));
    wait_for("step 2", 120, || last_step(&run) >= 2);
    std::fs::write(&armed, "").unwrap();
    wait_for("the failing verifier", 120, || hung.exists());
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(
        err.contains("error: ") && err.contains("the verifier failed"),
        "{err}"
    );
    assert!(last_step(&run) >= 2, "{err}");
}

/// Issue 49 item 2: SIGHUP (a dropped SSH session without nohup) used to kill `rlvr train` at
/// once (exit 129, every step since the last checkpoint lost). It now saves like SIGTERM.
#[test]
fn sighup_saves_a_checkpoint_like_sigterm_and_exits_129() {
    let (_tmp, model, run) = tiny_run();
    let child = spawn(train_cmd(&sets(&model, &run, 100_000)));
    wait_for("step 2", 120, || last_step(&run) >= 2);
    let st = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(129), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(v["interrupted"], true);
    let n = v["steps"].as_u64().unwrap();
    assert_eq!(latest(&run), format!("step-{n}"));
    assert_eq!(last_step(&run), n);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains(&format!("interrupted by SIGHUP after step {n}")),
        "{log}"
    );
}

/// A persistent Python verifier (examples/reward_persistent.py) trains a run with evaluations:
/// it is started once, sees each row's index and columns, and each step's scoring time is logged.
#[test]
fn a_persistent_python_verifier_is_started_once_per_run() {
    let python = Command::new("python3").arg("--version").output();
    if !python.map(|o| o.status.success()).unwrap_or(false) {
        panic!("python3 is needed by this test and was not found (Debian: apt-get install python3); a test does not pass without running");
    }
    let (tmp, model, run) = tiny_run();
    let (starts, items) = (tmp.path().join("starts"), tmp.path().join("items"));
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/reward_persistent.py");
    let script = format!(
        "echo start >> {}; tee -a {} | python3 {}",
        starts.display(),
        items.display(),
        example.display()
    );
    let mut s = sets(&model, &run, 4);
    s.push("train.eval_every=2".into());
    s.push(format!(
        "data.verifier={{ kind = \"external\", mode = \"persistent\", command = [\"sh\", \"-c\", \"{script}\"] }}"
    ));
    ok(&train_cmd(&s).output().unwrap(), "train");
    assert_eq!(
        steps(&run),
        [0, 1, 2, 3, 4],
        "metrics lines (step 0: the first evaluation)"
    );
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), "start\n");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&items)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // 4 training batches and the evaluations at steps 0, 2 and 4.
    assert!(lines.len() >= 7, "{} batches", lines.len());
    let first = &lines[0];
    assert_eq!(first["version"], 1);
    assert!(!first["items"].as_array().unwrap().is_empty());
    for it in first["items"].as_array().unwrap() {
        assert!(it["index"].as_u64().is_some_and(|i| i < 64), "{it}");
        assert!(!it["row"]["question"].as_str().unwrap().is_empty(), "{it}");
    }
    let diag = std::fs::read_to_string(run.join("diagnostics.jsonl")).unwrap();
    for l in diag.lines() {
        let d: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(d["time/score_s"].as_f64().is_some_and(|t| t >= 0.0), "{l}");
        // The process's memory over the update (Linux: read from /proc).
        if cfg!(target_os = "linux") {
            assert!(d["memory/rss_mib"].as_f64().is_some_and(|m| m > 1.0), "{l}");
            assert!(
                d["memory/heap_mib"].as_f64().is_some_and(|m| m > 0.0),
                "{l}"
            );
            assert!(
                d["memory/update_peak_mib"]
                    .as_f64()
                    .is_some_and(|m| m >= 0.0),
                "{l}"
            );
        }
    }
}

#[test]
fn init_and_sft_refuse_a_non_empty_output_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let tok = tmp.path().join("tokenizer.json");
    let init = |out: &Path, extra: &[&str]| {
        rlvr()
            .args(["init", "--hidden", "16", "--layers", "1", "--heads", "2"])
            .arg("--tokenizer")
            .arg(&tok)
            .arg("--out")
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    // A sharded HuggingFace directory: refused; with --force, the stale shards go.
    let hf = tmp.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    for f in [
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
    ] {
        std::fs::write(hf.join(f), "old").unwrap();
    }
    let out = init(&hf, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not empty") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(hf.join("config.json")).unwrap(),
        "old"
    );
    ok(&init(&hf, &["--force"]), "init --force");
    assert!(!hf.join("model-00001-of-00002.safetensors").exists());
    assert!(!hf.join("model.safetensors.index.json").exists());
    assert!(hf.join("model.safetensors").exists());

    // sft: --out = --model is refused even with --force; a non-empty --out without it.
    let pairs = tmp.path().join("pairs.jsonl");
    std::fs::write(&pairs, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n").unwrap();
    let sft = |out: &Path, extra: &[&str]| {
        rlvr()
            .args(["sft", "--steps", "1", "--model"])
            .arg(&model)
            .arg("--data")
            .arg(&pairs)
            .arg("--out")
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    let before = std::fs::read(model.join("model.safetensors")).unwrap();
    let out = sft(&model, &["--force"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is the --model directory"), "{err}");
    assert_eq!(
        std::fs::read(model.join("model.safetensors")).unwrap(),
        before
    );
    let out = sft(&hf, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
    ok(&sft(&hf, &["--force"]), "sft --force");
    ok(
        &sft(&tmp.path().join("new"), &[]),
        "sft into a new directory",
    );
}

#[test]
fn zero_sizes_are_refused_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer.json");
    std::fs::write(&tok, tokenizer_json()).unwrap();
    for (flag, extra) in [
        ("--hidden", &["--hidden", "0"][..]),
        ("--layers", &["--layers", "0"]),
        ("--intermediate", &["--intermediate", "0"]),
        (
            "--max-position-embeddings",
            &["--max-position-embeddings", "0"],
        ),
        ("--vocab-size", &["--vocab-size", "0"]),
    ] {
        let out = rlvr()
            .args(["init", "--tokenizer"])
            .arg(&tok)
            .arg("--out")
            .arg(tmp.path().join("m"))
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flag} 0 accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{flag} 0")), "{flag}: {err}");
        assert!(!tmp.path().join("m").exists(), "{flag}: wrote a model");
    }
    let model = tiny_model(tmp.path());
    for (flag, v) in [("--n", "0"), ("--limit", "0"), ("--max-new-tokens", "0")] {
        let out = rlvr()
            .args(["eval", "--task", "arithmetic", "--model"])
            .arg(&model)
            .args([flag, v])
            .output()
            .unwrap();
        assert!(!out.status.success(), "eval {flag} 0 accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{flag} 0")), "{flag}: {err}");
    }
}

#[test]
fn weights_that_turn_non_finite_are_never_checkpointed_and_latest_keeps_the_last_good_one() {
    let (_tmp, model, run) = tiny_run();
    let mut s = sets(&model, &run, 2);
    s.push("train.save_every=1".into());
    ok(&train_cmd(&s).output().unwrap(), "2 good steps");
    assert_eq!(latest(&run), "step-2");
    let good = std::fs::read(run.join("checkpoints/step-2/model.safetensors")).unwrap();
    // lr = 1e39 is a finite f64 but infinite as the f32 the optimizer applies: step 3's update
    // leaves every weight ±inf or NaN while its loss and gradient (taken before it) are finite.
    let out = resume(&run)
        .args(["--set", "train.steps=3", "--set", "train.lr=1e39"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // The trainer's check after the update stops the run there (before, step 3 completed and
    // logged, and its save then refused the weights with "holds a non-finite value").
    assert!(
        err.contains("the training diverged at step 3")
            && err.contains("step 3 is not saved")
            && err.contains("holds step 2's weights"),
        "{err}"
    );
    // Nothing of step 3 is logged or reached the disk as a checkpoint.
    assert_eq!(steps(&run), [1, 2]);
    assert_eq!(latest(&run), "step-2");
    // No step-3 directory, not even a half-written temporary one.
    let mut names: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "latest")
        .collect();
    names.sort();
    assert_eq!(names, ["step-1", "step-2"]);
    assert_eq!(
        std::fs::read(run.join("checkpoints/step-2/model.safetensors")).unwrap(),
        good
    );
}

#[test]
fn a_prompt_longer_than_the_model_positions_is_refused_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path()); // max_position_embeddings 128
    let run = tmp.path().join("run");
    let data = tmp.path().join("train.jsonl");
    let row = |q: &str| serde_json::json!({"question": q, "answer": "#### 2"}).to_string();
    // The report's input: a 5 MB prompt line with data.max_prompt_len unset (it aborted the process
    // asking for a 6 TB attention bias).
    std::fs::write(
        &data,
        format!("{}\n{}\n", row("1+1"), row(&"7".repeat(5 << 20))),
    )
    .unwrap();
    let mut s = sets(&model, &run, 2);
    s.retain(|x| !x.starts_with("data."));
    s.extend([
        "data.task=\"gsm8k\"".to_string(),
        format!("data.train=\"{}\"", data.display()),
        format!("data.test=\"{}\"", data.display()),
        "data.prompts_per_step=1".into(),
    ]);
    let out = train_cmd(&s).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    assert!(
        err.contains(&format!("{}:2: the prompt has ", data.display()))
            && err.contains("max_position_embeddings = 128")
            && err.contains("data.max_prompt_len"),
        "{err}"
    );
    assert!(!run.join("metrics.jsonl").exists());

    // Prompts that fit, but not with max_new_tokens on top: refused at start-up, naming the
    // prompt's source, the key and the model's positions, before anything is trained.
    let run2 = tmp.path().join("run2");
    let mut s = sets(&model, &run2, 2);
    s.push("rollout.max_new_tokens=200".into());
    let out = train_cmd(&s).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    assert!(
        err.contains("[data] Train split: generated:train:")
            && err.contains(
                "+ rollout.max_new_tokens = 200 is more than the model's \
                 max_position_embeddings = 128"
            ),
        "{err}"
    );
    assert!(steps(&run2).is_empty());
}

/// Overwrites element 0 of the first F32 tensor of `dir/model.safetensors` (in name order) with
/// `v`, in place: the format is an 8-byte little-endian header length, a JSON header of
/// `{name: {dtype, shape, data_offsets}}`, then the data. Returns the tensor's name.
fn poison_weight(dir: &Path, v: f32) -> String {
    let p = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut names: Vec<&String> = header
        .keys()
        .filter(|k| header[*k]["dtype"] == "F32")
        .collect();
    names.sort();
    let name = names[0].clone();
    let at = 8 + n + header[&name]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    std::fs::write(&p, bytes).unwrap();
    name
}

#[test]
fn a_policy_with_a_nan_weight_is_refused_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let name = poison_weight(&model, f32::NAN);
    let run = tmp.path().join("run");
    let out = train_cmd(&sets(&model, &run, 2)).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "holds a non-finite value (NaN or inf) in weight {name}"
        )) && err.contains(&model.display().to_string()),
        "{err}"
    );
    assert!(steps(&run).is_empty());
    assert!(!run.join("checkpoints").exists());
}

#[test]
fn resume_without_a_checkpoint_says_it_starts_over() {
    let (_tmp, model, run) = tiny_run();
    // save_every = 0: killed after step 1, the run has metrics but no checkpoint.
    let mut c = train_cmd(&sets(&model, &run, 2));
    c.env("RLVR_DEBUG_HANG_AFTER_STEP", "1");
    let mut a = spawn(c);
    wait_for("step 1", 120, || last_step(&run) == 1);
    a.kill().unwrap();
    a.wait().unwrap();
    assert_eq!(latest(&run), "");
    let out = resume(&run).output().unwrap();
    ok(&out, "resume without a checkpoint");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds no checkpoint yet: --resume starts the run over from step 0"),
        "{err}"
    );
    assert_eq!(steps(&run), [1, 2]);
    assert_eq!(latest(&run), "step-2");
}

#[test]
fn relative_input_paths_are_stored_resolved_so_resume_works_from_another_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let row = |q: &str, a: &str| serde_json::json!({"question": q, "answer": a}).to_string();
    let rows: Vec<String> = (1..=8)
        .map(|i| row(&format!("{i}+1"), &format!("#### {}", i + 1)))
        .collect();
    std::fs::write(tmp.path().join("train.jsonl"), rows.join("\n") + "\n").unwrap();
    // Typed relative to tmp (the current directory of the first command).
    let mut s = sets(Path::new("model"), Path::new("run"), 4);
    s.retain(|x| !x.starts_with("data."));
    s.extend([
        "data.task=\"gsm8k\"".to_string(),
        "data.train=\"train.jsonl\"".into(),
        "data.test=\"train.jsonl\"".into(),
        "data.prompts_per_step=2".into(),
        "train.save_every=1".into(),
    ]);
    let mut c = train_cmd(&s);
    c.current_dir(tmp.path())
        .env("RLVR_DEBUG_HANG_AFTER_STEP", "2");
    let mut a = spawn(c);
    let run = tmp.path().join("run");
    wait_for("step 2", 120, || latest(&run) == "step-2");
    a.kill().unwrap();
    a.wait().unwrap();
    let cfg = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let abs = |p: &Path| format!("\"{}\"", p.display());
    assert!(cfg.contains(&abs(&model)), "{cfg}");
    assert!(cfg.contains(&abs(&tmp.path().join("train.jsonl"))), "{cfg}");
    // Resumed from another directory: the same files are read.
    let elsewhere = tempfile::tempdir().unwrap();
    let r = resume(&run).current_dir(elsewhere.path()).output().unwrap();
    ok(&r, "resume from another directory");
    assert_eq!(steps(&run), [1, 2, 3, 4]);
}

/// The steps of RUN_DIR/rollouts.jsonl, one per line, read as bytes (lines that do not parse
/// are skipped).
fn rollout_steps(run: &Path) -> Vec<u64> {
    std::fs::read(run.join("rollouts.jsonl"))
        .unwrap_or_default()
        .split(|&b| b == b'\n')
        .filter_map(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .collect()
}

/// metrics.jsonl's line of `step` without the wall-clock keys.
fn metrics_at(run: &Path, step: u64) -> serde_json::Value {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let mut v: serde_json::Value = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["step"] == step)
        .unwrap();
    for k in ["time/sample_s", "time/train_s", "tokens_per_s"] {
        v.as_object_mut().unwrap().remove(k);
    }
    v
}

#[test]
fn a_lost_or_torn_latest_resumes_from_the_newest_complete_checkpoint() {
    let (_tmp, model, run) = tiny_run();
    let mut s = sets(&model, &run, 3);
    s.push("train.save_every=1".into());
    s.push("train.keep_last=0".into());
    ok(&train_cmd(&s).output().unwrap(), "train");
    assert_eq!(steps(&run), [1, 2, 3]);
    let step3 = metrics_at(&run, 3);
    // step-3 torn (its optimizer state cut short) while latest names it, and a rollouts line
    // torn inside a two-byte character.
    let ckpts = run.join("checkpoints");
    let opt = ckpts.join("step-3/trainer_state/optimizer.safetensors");
    let bytes = std::fs::read(&opt).unwrap();
    std::fs::write(&opt, &bytes[..bytes.len() / 2]).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(run.join("rollouts.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"step\":4,\"completion\":\"\xC3").unwrap();
    let resume = |steps: u64| {
        rlvr()
            .args(["train", "--no-progress", "--resume"])
            .arg(&run)
            .args(["--set", &format!("train.steps={steps}")])
            .output()
            .unwrap()
    };
    let out = resume(4);
    ok(&out, "resume past a torn step-3");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "names {}, which is incomplete",
            ckpts.join("step-3").display()
        )) && err.contains(&format!(
            "resuming from the newest complete checkpoint, {}",
            ckpts.join("step-2").display()
        )),
        "{err}"
    );
    assert_eq!(steps(&run), [1, 2, 3, 4]);
    // Step 3 was trained again from step 2's state: the same values (o = 0 resumes exactly).
    assert_eq!(metrics_at(&run, 3), step3);
    let per_step = |r: Vec<u64>| {
        (1..=4)
            .map(|t| r.iter().filter(|&&s| s == t).count())
            .collect::<Vec<_>>()
    };
    assert_eq!(per_step(rollout_steps(&run)), [4, 4, 4, 4]);
    assert_eq!(latest(&run), "step-4");
    // latest lost: the newest complete checkpoint (step-4), not a start over from step 0.
    std::fs::remove_file(ckpts.join("latest")).unwrap();
    let out = resume(5);
    ok(&out, "resume without latest");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("latest is missing: resuming from the newest complete checkpoint")
            && err.contains(&ckpts.join("step-4").display().to_string()),
        "{err}"
    );
    assert_eq!(steps(&run), [1, 2, 3, 4, 5]);
    assert!(ckpts.join("step-1").is_dir());
}

#[test]
fn sft_refuses_a_non_finite_lr_and_a_failed_force_keeps_the_old_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let pairs = tmp.path().join("pairs.jsonl");
    std::fs::write(&pairs, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n").unwrap();
    let sft = |out: &Path, data: &Path, extra: &[&str]| {
        rlvr()
            .args(["sft", "--no-progress", "--model"])
            .arg(&model)
            .arg("--data")
            .arg(data)
            .arg("--out")
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    let fresh = tmp.path().join("fresh");
    for (flag, value, range) in [
        ("--lr", "nan", "a finite number > 0"),
        ("--lr", "inf", "a finite number > 0"),
        ("--lr", "-1e-3", "a finite number > 0"),
        ("--lr", "0", "a finite number > 0"),
        ("--weight-decay", "-0.1", "a finite number in [0, 1000]"),
        ("--grad-clip", "nan", "a finite number >= 0 (0 = off)"),
    ] {
        let out = sft(&fresh, &pairs, &[&format!("{flag}={value}")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}: {err}");
        assert!(
            err.contains(&format!("{flag} = ")) && err.contains(range),
            "{flag} {value}: {err}"
        );
        assert!(!fresh.exists(), "{flag} {value}");
    }
    // A model in --out; --force runs that fail (bad data, weights that blow up after a save)
    // leave it whole.
    let out_dir = tmp.path().join("out");
    ok(&sft(&out_dir, &pairs, &["--steps", "1"]), "first sft");
    let old = std::fs::read(out_dir.join("model.safetensors")).unwrap();
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"1+1=\"}\n").unwrap();
    let staging = tmp.path().join(".out.staging");
    for (data, extra) in [
        (&bad, &["--steps", "1"][..]),
        (
            &pairs,
            &["--steps", "4", "--save-every", "1", "--lr", "1e30"][..],
        ),
    ] {
        let out = sft(&out_dir, data, &[&["--force"][..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(
            err.contains(&format!("--out {} is unchanged", out_dir.display())),
            "{extra:?}: {err}"
        );
        assert_eq!(
            std::fs::read(out_dir.join("model.safetensors")).unwrap(),
            old,
            "{extra:?}"
        );
        assert!(staging.is_dir());
    }
    // A --force run that succeeds replaces the model and removes the staging directory.
    ok(
        &sft(
            &out_dir,
            &pairs,
            &["--force", "--steps", "2", "--lr", "1e-2"],
        ),
        "sft --force",
    );
    assert_ne!(
        std::fs::read(out_dir.join("model.safetensors")).unwrap(),
        old
    );
    assert!(out_dir.join("config.json").is_file() && out_dir.join("metrics.jsonl").is_file());
    assert!(!staging.exists());
}

#[cfg(target_os = "linux")]
#[test]
fn a_sigkilled_rlvr_takes_its_persistent_verifier_with_it() {
    let (tmp, model, run) = tiny_run();
    let pidfile = tmp.path().join("verifier.pid");
    // The verifier writes its pid and then never answers nor reads stdin (so the closed pipe of a
    // dead rlvr would not end it either): only the kernel's parent-death signal stops it.
    let script = format!(
        "echo $$ > {}.tmp; mv {0}.tmp {0}; exec sleep 1000",
        pidfile.display()
    );
    let mut s = sets(&model, &run, 2);
    s.push(format!(
        "data.verifier={{ kind = \"external\", mode = \"persistent\", timeout_s = 600, command = [\"sh\", \"-c\", \"{script}\"] }}"
    ));
    let mut child = spawn(train_cmd(&s));
    wait_for("the verifier's pid", 120, || pidfile.exists());
    let pid = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .to_string();
    assert!(alive(&pid), "verifier {pid} is not running");
    child.kill().unwrap(); // SIGKILL: no code of rlvr runs after it
    child.wait().unwrap();
    let orphaned = !left_after(std::slice::from_ref(&pid), 5).is_empty();
    assert!(
        !orphaned,
        "verifier {pid} outlived the SIGKILLed rlvr by 5 s"
    );
}

/// A verifier's own children die with a SIGKILLed rlvr too (issue 49, item 3): the kernel's
/// parent-death signal reaches only a direct child, so rlvr starts each program through a guard
/// process that kills the program's whole process group when rlvr dies. Here a persistent
/// verifier leaves one child in the background (as a verifier that runs code in a subprocess
/// does) and one in the foreground; both must be gone after `kill -9` of rlvr.
#[cfg(target_os = "linux")]
#[test]
fn a_sigkilled_rlvr_takes_its_verifiers_children_with_it() {
    let (tmp, model, run) = tiny_run();
    let pidfile = tmp.path().join("pids");
    let script = format!(
        "sleep 1001 & echo $! $$ > {0}.tmp; mv {0}.tmp {0}; sleep 1002",
        pidfile.display()
    );
    let mut s = sets(&model, &run, 2);
    s.push(format!(
        "data.verifier={{ kind = \"external\", mode = \"persistent\", timeout_s = 600, command = [\"sh\", \"-c\", \"{script}\"] }}"
    ));
    let mut child = spawn(train_cmd(&s));
    wait_for("the verifier's pids", 120, || pidfile.exists());
    let pids: Vec<String> = std::fs::read_to_string(&pidfile)
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in &pids {
        assert!(alive(pid), "{pid} is not running");
    }
    child.kill().unwrap(); // SIGKILL: no code of rlvr runs after it
    child.wait().unwrap();
    let left = left_after(&pids, 5);
    assert!(
        left.is_empty(),
        "{left:?} (of the verifier's child {} and the verifier {}) outlived the SIGKILLed rlvr by 5 s",
        pids[0],
        pids[1]
    );
}

/// The parent-death signal follows the *thread* that forked: a persistent verifier first started
/// by the explorer thread (o = 1, a resumed run: no step-0 evaluation on the main thread) must
/// outlive that thread, which ends after the last batch, for the final evaluation.
#[test]
fn a_persistent_verifier_started_by_the_explorer_thread_survives_its_end() {
    let python = Command::new("python3").arg("--version").output();
    if !python.map(|o| o.status.success()).unwrap_or(false) {
        panic!("python3 is needed by this test and was not found (Debian: apt-get install python3); a test does not pass without running");
    }
    let (tmp, model, run) = tiny_run();
    let starts = tmp.path().join("starts");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/reward_persistent.py");
    let script = format!(
        "echo start >> {}; exec python3 {}",
        starts.display(),
        example.display()
    );
    let mut s = sets(&model, &run, 2);
    s.push("sync.offset=1".into());
    s.push("train.eval_every=4".into());
    s.push(format!(
        "data.verifier={{ kind = \"external\", mode = \"persistent\", command = [\"sh\", \"-c\", \"{script}\"] }}"
    ));
    ok(&train_cmd(&s).output().unwrap(), "train to step 2");
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), "start\n");
    let out = resume(&run)
        .args(["--set", "train.steps=4"])
        .output()
        .unwrap();
    ok(&out, "resume to step 4");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(steps(&run), [0, 1, 2, 3, 4], "{err}");
    // One start per run: the final evaluation found the explorer thread's program alive.
    assert_eq!(
        std::fs::read_to_string(&starts).unwrap(),
        "start\nstart\n",
        "{err}"
    );
}

#[test]
fn merge_force_that_fails_keeps_the_old_model() {
    // `rlvr merge --force` over a model writes into a staging sibling: a merge that fails after
    // the output was accepted (an adapter that does not load) leaves the old weights whole (the
    // old code removed *.safetensors from --out first).
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let out_dir = tmp.path().join("merged");
    std::fs::create_dir_all(&out_dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(model.join(f), out_dir.join(f)).unwrap();
    }
    let old = std::fs::read(out_dir.join("model.safetensors")).unwrap();
    let ckpt = tmp.path().join("ckpt");
    std::fs::create_dir_all(ckpt.join("adapter")).unwrap();
    for e in std::fs::read_dir(&model).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), ckpt.join(e.file_name())).unwrap();
        }
    }
    std::fs::write(
        ckpt.join("adapter/adapter_config.json"),
        r#"{"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "peft_type": "LORA"}"#,
    )
    .unwrap();
    std::fs::write(
        ckpt.join("adapter/adapter_model.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    let out = rlvr()
        .args(["merge", "--force", "--checkpoint"])
        .arg(&ckpt)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the broken adapter merged");
    assert_eq!(
        std::fs::read(out_dir.join("model.safetensors")).unwrap(),
        old,
        "the old weights were removed or changed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn resume_names_the_external_command_it_runs() {
    let (tmp, model, run) = tiny_run();
    let script = tmp.path().join("score.sh");
    std::fs::write(
        &script,
        "awk '{ print \"{\\\"reward\\\": \" (NR % 2) \"}\" }'\n",
    )
    .unwrap();
    let mut s = sets(&model, &run, 2);
    s.push(format!(
        "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"] }}",
        script.display()
    ));
    let out = train_cmd(&s).output().unwrap();
    ok(&out, "train");
    // A fresh start runs the command the user just gave: no note.
    assert!(!String::from_utf8_lossy(&out.stderr).contains("--resume runs"));
    // A resume says which program of the run directory's config it runs, before running it.
    let out = resume(&run)
        .args(["--set", "train.steps=3"])
        .output()
        .unwrap();
    ok(&out, "resume to 3");
    let note = format!(
        "note: --resume runs the external verifier command of {}/config.toml (data.verifier): sh {}",
        run.display(),
        script.display()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&note), "{note}\nnot in\n{err}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(log.contains(&note), "{log}");
    assert_eq!(steps(&run), [1, 2, 3]);
}

/// Sets `state.json` of checkpoint `dir` with `edit` and removes the checkpoint's manifest (as a
/// checkpoint written before manifests, whose edits no checksum catches).
fn edit_state(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("trainer_state/state.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    std::fs::remove_file(dir.join("manifest.json")).unwrap();
}

#[test]
fn resume_refuses_to_shorten_and_names_an_edited_state_file_and_field() {
    let (_tmp, model, run) = tiny_run();
    let mut s = sets(&model, &run, 3);
    s.push("train.save_every=1".into());
    s.push("train.keep_last=0".into());
    ok(&train_cmd(&s).output().unwrap(), "train");
    let resume = |steps: u64| {
        rlvr()
            .args(["train", "--no-progress", "--resume"])
            .arg(&run)
            .args(["--set", &format!("train.steps={steps}")])
            .output()
            .unwrap()
    };
    // A resume cannot shorten the run: said in terms of steps trained.
    let out = resume(1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let ckpts = run.join("checkpoints");
    let want = format!(
        "train.steps = 1 is fewer than the 3 steps the run in {} has already trained (its \
         checkpoint to resume from, {}, holds step 3)",
        run.display(),
        ckpts.join("step-3").display()
    );
    assert!(err.contains(&want), "{want}\nnot in\n{err}");
    // step-3's state.json edited to step 100 (an old checkpoint: no manifest to catch it). It said
    // "already at step 100 (its latest checkpoint, .../step-3)" and resumed at step 100; now the
    // checkpoint is incomplete and the resume takes step-2.
    edit_state(&ckpts.join("step-3"), |v| v["step"] = 100.into());
    let out = resume(4);
    ok(&out, "resume past an edited step-3");
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        format!(
            "{}: field `step` is 100, but the directory is step-3",
            ckpts.join("step-3/trainer_state/state.json").display()
        ),
        format!(
            "resuming from the newest complete checkpoint, {}",
            ckpts.join("step-2").display()
        ),
    ] {
        assert!(err.contains(&want), "{want}\nnot in\n{err}");
    }
    assert_eq!(steps(&run), [1, 2, 3, 4]);
    // A data cursor past the end of the epoch: an error naming the file, the field and the data
    // (it was "invalid data config: data cursor position ... is past the dataset length ...").
    edit_state(&ckpts.join("step-4"), |v| {
        v["cursor"]["cursor"]["position"] = 1_000_000.into()
    });
    let out = resume(5);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let want = format!(
        "{}: field `cursor`: the data cursor stands at position 1000000 of an epoch of 64 \
         prompts, past its end (the train split: data.task = \"arithmetic\"'s generated problems)",
        ckpts.join("step-4/trainer_state/state.json").display()
    );
    assert!(err.contains(&want), "{want}\nnot in\n{err}");
    assert!(!err.contains("invalid data config"), "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_second_sigterm_kills_the_verifiers_whole_process_group() {
    let (tmp, model, run) = tiny_run();
    let pidfile = tmp.path().join("child.pid");
    // The verifier starts a background child (same process group) and never answers: the first
    // SIGTERM waits for the step, the second quits at once. The program itself dies by its
    // parent-death signal; its child only if rlvr kills the group on the way out.
    let script = format!(
        "sleep 1000 & echo $! > {p}.tmp; mv {p}.tmp {p}; exec sleep 1000",
        p = pidfile.display()
    );
    let mut s = sets(&model, &run, 2);
    s.push(format!(
        "data.verifier={{ kind = \"external\", mode = \"persistent\", timeout_s = 600, command = [\"sh\", \"-c\", \"{script}\"] }}"
    ));
    let child = spawn(train_cmd(&s));
    wait_for("the verifier's child", 120, || pidfile.exists());
    let pid = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .to_string();
    assert!(alive(&pid), "the verifier's child {pid} is not running");
    for _ in 0..2 {
        let st = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        std::thread::sleep(Duration::from_millis(300));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let orphaned = !left_after(std::slice::from_ref(&pid), 5).is_empty();
    assert!(
        !orphaned,
        "the verifier's child {pid} outlived rlvr's second SIGTERM"
    );
}

/// Issue 49 item 14: every command that loads a model directory checks an rlvr checkpoint against
/// its manifest first. A checkpoint with one byte of its weights flipped (size unchanged) is
/// refused by `train` (as `model.path` and as `model.reference`), `sft`, `generate` and
/// `logprobs`, each naming the file and both CRC-32Cs; the intact checkpoint loads in all of them,
/// and a directory without a manifest (a HuggingFace-style model) still loads.
#[test]
fn every_command_refuses_a_checkpoint_that_differs_from_its_manifest() {
    let (tmp, model, run) = tiny_run();
    ok(
        &train_cmd(&sets(&model, &run, 1)).output().unwrap(),
        "train",
    );
    let ckpt = run.join("checkpoints/step-1");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("manifest.json")).unwrap())
            .unwrap();
    let want = m["files"]["model.safetensors"]["crc32c"]
        .as_str()
        .unwrap()
        .to_string();
    let pairs = tmp.path().join("pairs.jsonl");
    std::fs::write(&pairs, "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n").unwrap();
    let mut n = 0;
    // Each command on `dir`, with fresh output paths on every call.
    let mut commands = |dir: &Path| -> Vec<(&'static str, Command)> {
        n += 1;
        let train_with = |key: &str, n: u32| {
            let mut s = sets(&model, &tmp.path().join(format!("run-{key}-{n}")), 1);
            s.push(format!("model.{key}=\"{}\"", dir.display()));
            if key == "reference" {
                s.push("algorithm.kl_coef=0.1".into());
            }
            train_cmd(&s)
        };
        let mut sft = rlvr();
        sft.args(["sft", "--steps", "1", "--model"])
            .arg(dir)
            .arg("--data")
            .arg(&pairs)
            .arg("--out")
            .arg(tmp.path().join(format!("sft-{n}")));
        let mut generate = rlvr();
        generate.args(["generate", "--model"]).arg(dir).args([
            "--prompt",
            "1+1=",
            "--max-new-tokens",
            "2",
        ]);
        let mut logprobs = rlvr();
        logprobs.args(["logprobs", "--model"]).arg(dir).args([
            "--prompt",
            "1+1=",
            "--completion",
            "2",
        ]);
        vec![
            ("train model.path", train_with("path", n)),
            ("train model.reference", train_with("reference", n)),
            ("sft", sft),
            ("generate", generate),
            ("logprobs", logprobs),
        ]
    };
    // The intact checkpoint loads everywhere.
    for (what, mut c) in commands(&ckpt) {
        ok(&c.output().unwrap(), what);
    }
    // One byte of the weights flipped, size unchanged: refused, naming the file and both sums.
    let p = ckpt.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let k = bytes.len() - 3;
    bytes[k] ^= 0x40;
    std::fs::write(&p, &bytes).unwrap();
    let got = format!("{:08x}", crc32c_of(&bytes));
    assert_ne!(got, want);
    for (what, mut c) in commands(&ckpt) {
        let out = c.output().unwrap();
        assert!(!out.status.success(), "{what} loaded a corrupt checkpoint");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("differs from its checkpoint manifest")
                && err.contains(&format!(
                    "{} has CRC-32C {got}, its manifest says {want}",
                    p.display()
                )),
            "{what}: {err}"
        );
    }
    // Without a manifest (a HuggingFace-style directory) the same bytes load unchecked.
    std::fs::remove_file(ckpt.join("manifest.json")).unwrap();
    let (what, mut c) = commands(&ckpt).pop().unwrap();
    assert_eq!(what, "logprobs");
    ok(&c.output().unwrap(), what);
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `bytes`, bit by bit: the checksum
/// the manifest records, computed independently of the crate that writes it.
fn crc32c_of(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
