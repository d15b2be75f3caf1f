//! A run killed by SIGKILL and resumed from its last checkpoint gives, at every later step, the same
//! non-time metrics as an uninterrupted run (o = 0: v = 1 and v = 4; o = 1, v = 1 and v = 4, and
//! o ≥ v > 1: bit-identical, from the checkpoint's buffer of in-flight batches and explorer
//! weights). The killed run is this test
//! binary re-executed on `child_entry` with `RLVR_TRAIN_CHILD` set; it hangs after step 3 (test hook
//! `RLVR_DEBUG_HANG_AFTER_STEP`), after the step-2 checkpoint, and is killed there.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use rlvr_train::config::{RawConfig, ResolvedConfig};
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::{read_metrics, TIME_KEYS};

fn sets(model: &Path, run: &Path, v: u64, o: u64) -> Vec<String> {
    let mut s = common::arithmetic_sets(model, run);
    s.extend([
        "train.steps=6".to_string(),
        "train.save_every=2".into(),
        "train.eval_every=2".into(),
        "train.mini_batches=2".into(),
        "train.epochs=2".into(),
        format!("sync.interval={v}"),
        format!("sync.offset={o}"),
    ]);
    s
}

/// Entry point of the killed child process (a no-op in a normal test run).
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var("RLVR_TRAIN_CHILD") else {
        return;
    };
    let sets: Vec<String> = serde_json::from_str(&spec).unwrap();
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
}

fn last_step(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .max()
        .unwrap_or(0)
}

/// Kills a run (interval `v`, offset `o`) after step 3, resumes it from step 2, and compares its
/// metrics with an uninterrupted run's: within 1e-6 relative, or bit for bit when `exact`.
fn check_resume(v: u64, o: u64, exact: bool) {
    check_resume_with(v, o, exact, &[]);
}

/// [`check_resume`] with more `--set`s (`{tmp}` in them is the test's temporary directory).
fn check_resume_with(v: u64, o: u64, exact: bool, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let extra: Vec<String> = extra
        .iter()
        .map(|s| s.replace("{tmp}", &tmp.path().display().to_string()))
        .collect();
    let sets = |model: &Path, run: &Path, v: u64, o: u64| {
        let mut s = sets(model, run, v, o);
        s.extend(extra.iter().cloned());
        s
    };
    // Uninterrupted reference run.
    let ra = tmp.path().join("a");
    let cfg = RawConfig::load(None, &sets(&model, &ra, v, o))
        .unwrap()
        .resolve()
        .unwrap();
    train(&cfg, &RunOptions::default()).unwrap();

    // Killed run.
    let rb = tmp.path().join("b");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "resume::child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "RLVR_TRAIN_CHILD",
            serde_json::to_string(&sets(&model, &rb, v, o)).unwrap(),
        )
        .env("RLVR_DEBUG_HANG_AFTER_STEP", "3")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while last_step(&rb.join("metrics.jsonl")) < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "child never reached step 3"
        );
        if let Some(st) = child.try_wait().unwrap() {
            panic!("child exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(
        std::fs::read_to_string(rb.join("checkpoints/latest"))
            .unwrap()
            .trim(),
        "step-2"
    );

    if o > 0 {
        // The in-flight batch of step 3 is in the step-2 checkpoint's buffer.
        let buf = std::fs::read_to_string(rb.join("checkpoints/step-2/trainer_state/buffer.jsonl"))
            .unwrap();
        let lines: Vec<serde_json::Value> = buf
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len() as u64, o, "{buf}");
        assert_eq!(lines[0]["step"], 3);
        // The explorer after them samples step 2 + o + 1 with version s(2 + o + 1): the policy's
        // (2) or, between two syncs, the last sync's, whose weights the checkpoint keeps.
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(rb.join("checkpoints/step-2/trainer_state/state.json"))
                .unwrap(),
        )
        .unwrap();
        let need = rlvr_train::feed::behaviour_version(3 + o, v, o);
        assert_eq!(state["explorer_version"], need, "{state}");
        assert_eq!(state["explorer_weights"], need != 2, "{state}");
        assert_eq!(
            rb.join("checkpoints/step-2/trainer_state/explorer/model.safetensors")
                .is_file(),
            need != 2
        );
    }
    // Resume.
    let mut cfg = ResolvedConfig::from_run_dir(&rb, &[]).unwrap();
    cfg.raw.output.dir = rb.clone();
    let s = train(
        &cfg,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.steps, 6);

    let ma = read_metrics(&ra.join("metrics.jsonl")).unwrap();
    let mb = read_metrics(&rb.join("metrics.jsonl")).unwrap();
    assert_eq!(ma.len(), mb.len(), "metrics lines differ in number");
    for (la, lb) in ma.iter().zip(&mb) {
        assert_eq!(la.keys().collect::<Vec<_>>(), lb.keys().collect::<Vec<_>>());
        for (k, va) in la {
            if TIME_KEYS.contains(&k.as_str()) {
                continue;
            }
            let vb = &lb[k];
            if exact {
                assert_eq!(va, vb, "v={v} o={o} step {}: {k}", la["step"]);
                continue;
            }
            match (va.as_f64(), vb.as_f64()) {
                (Some(x), Some(y)) => assert!(
                    (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                    "v={v} step {}: {k} {x} vs {y}",
                    la["step"]
                ),
                _ => assert_eq!(va, vb, "v={v} step {}: {k}", la["step"]),
            }
        }
    }
    // The comparison is not vacuous: later steps trained (non-zero gradients).
    assert!(
        mb[4..]
            .iter()
            .any(|l| l["grad_norm"].as_f64().unwrap_or(0.0) > 0.0),
        "no step after the kill had a gradient: the test would prove nothing"
    );
    // The staleness pattern of v survives the resume.
    let st: Vec<f64> = mb[1..]
        .iter()
        .map(|l| l["staleness/max"].as_f64().unwrap())
        .collect();
    let want: Vec<f64> = (1..=6u64)
        .map(|t| ((t - 1) - rlvr_train::feed::behaviour_version(t, v, o)) as f64)
        .collect();
    assert_eq!(st, want);
}

/// Multi-turn episodes (the `retry` environment, up to 3 turns) with the explorer one step
/// ahead: the killed run's in-flight episodes come back from the checkpoint's buffer, masks and
/// turn rewards included, and the resumed run's metrics (`env/*` among them) are the
/// uninterrupted run's.
#[test]
fn sigkill_resume_with_episodes_in_flight_matches_uninterrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n{% endfor %}\
         {% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let tpl = format!("env.chat_template=\"{}\"", tpl.display());
    check_resume_with(
        1,
        1,
        false,
        &[
            "env.builtin=\"retry\"",
            "env.max_turns=3",
            "env.max_episode_tokens=100",
            &tpl,
        ],
    );
}

/// A stateful program environment (the shipped guess-the-number example, which keeps each
/// episode's secret and answers an id it never reset with an episode error) through a SIGKILL
/// and `--resume`, the explorer one step ahead: no episode spans the resume (the checkpoint's
/// buffer holds finished episodes, and the new program resets every episode it is sent), so the
/// resumed run's metrics, `env/error_frac` among them, are the uninterrupted run's.
#[test]
fn sigkill_resume_with_a_stateful_program_environment_matches_uninterrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n{% endfor %}\
         {% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let tpl = format!("env.chat_template=\"{}\"", tpl.display());
    let script = common::repo().join("examples/env_guess_number.py");
    let cmd = format!("env.command=[\"python3\", \"{}\"]", script.display());
    check_resume_with(
        1,
        1,
        false,
        &[
            &cmd,
            "env.max_turns=3",
            "env.max_episode_tokens=40",
            "env.options={ low = 1, high = 9 }",
            &tpl,
        ],
    );
}

#[test]
fn sigkill_resume_matches_uninterrupted_v1() {
    check_resume(1, 0, false);
}

/// One-step-off-policy (o = 1): the batch of step 3 was sampled (by version 1) before the kill;
/// the checkpoint of step 2 keeps it in trainer_state/buffer.jsonl, so the resumed run trains on
/// it instead of re-sampling it with version 2's weights, and every metric is bit-identical.
#[test]
fn sigkill_resume_matches_uninterrupted_offset_1() {
    check_resume(1, 1, true);
}

/// Off-policy with an explorer thread between syncs (v = 4, o = 1): the step-2 checkpoint keeps
/// the in-flight batch of step 3 and the weights of version 0, with which the explorer samples
/// steps 4 and 5; the resumed run is bit-identical (it once re-sampled them with version 2's
/// weights, and its staleness pattern broke).
#[test]
fn sigkill_resume_matches_uninterrupted_v4_offset_1() {
    check_resume(4, 1, true);
}

#[test]
fn sigkill_resume_matches_uninterrupted_v4() {
    check_resume(4, 0, false);
}

/// Entry point of the Ctrl-C child: `rlvr train` through its CLI function (which installs the
/// handler), printing its summary line.
#[test]
fn cli_child_entry() {
    let Ok(spec) = std::env::var("RLVR_TRAIN_CLI_CHILD") else {
        return;
    };
    let sets: Vec<String> = serde_json::from_str(&spec).unwrap();
    let a = rlvr_train::cli::TrainArgs {
        set: sets,
        no_progress: true,
        ..Default::default()
    };
    let mut out = std::io::stdout();
    rlvr_train::cli::run_train(&a, &mut out).unwrap();
}

/// A real SIGINT (Ctrl-C) makes `rlvr train` save a checkpoint after the current step and exit 130
/// (128 + SIGINT, so `rlvr train ... && rlvr eval ...` stops).
#[test]
fn sigint_saves_a_checkpoint_and_exits_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let rd = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &rd);
    s.push("train.steps=100000".into());
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "resume::cli_child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RLVR_TRAIN_CLI_CHILD", serde_json::to_string(&s).unwrap())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while last_step(&rd.join("metrics.jsonl")) < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "child never reached step 2"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: sends SIGINT to the child this test spawned (its pid is live: it was not waited on).
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "child exited with {}",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("\"interrupted\""))
        .unwrap_or_else(|| panic!("no summary in {text}"));
    let v: serde_json::Value = serde_json::from_str(&line[line.find('{').unwrap()..]).unwrap();
    assert_eq!(v["interrupted"], true);
    let steps = v["steps"].as_u64().unwrap();
    assert!((2..100000).contains(&steps));
    let latest = std::fs::read_to_string(rd.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), format!("step-{steps}"));
    assert_eq!(last_step(&rd.join("metrics.jsonl")), steps);
}

/// Every checkpoint carries manifest.json (sizes and CRC-32C of its files, the dataset files'
/// identity); a checkpoint whose weights changed afterwards (same size, one byte flipped) is named
/// and skipped by the resume, refused by `rlvr eval`, and one without a manifest still loads.
#[test]
fn a_checkpoint_that_differs_from_its_manifest_is_named_and_skipped() {
    use rlvr_train::store::{checkpoint, manifest};
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let run = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend(["train.steps=4".to_string(), "train.save_every=2".into()]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let (s2, s4) = (
        run.join("checkpoints/step-2"),
        run.join("checkpoints/step-4"),
    );
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s4.join("manifest.json")).unwrap()).unwrap();
    let w = &m["files"]["model.safetensors"];
    assert_eq!(
        w["bytes"].as_u64().unwrap(),
        std::fs::metadata(s4.join("model.safetensors"))
            .unwrap()
            .len()
    );
    assert!(m["files"]["trainer_state/optimizer.safetensors"]["crc32c"].is_string());
    assert!(manifest::verify(&s4).unwrap());
    // One byte of the weights flipped, size unchanged.
    let p = s4.join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let k = bytes.len() - 3;
    bytes[k] ^= 0x40;
    std::fs::write(&p, &bytes).unwrap();
    let e = format!("{:#}", manifest::verify(&s4).unwrap_err());
    assert!(
        e.contains("model.safetensors has CRC-32C") && e.contains("its manifest says"),
        "{e}"
    );
    let point = checkpoint::resume_point(&run).unwrap().unwrap();
    assert_eq!(point.dir, s2);
    let note = point.note.unwrap();
    assert!(
        note.contains("step-4") && note.contains("model.safetensors"),
        "{note}"
    );
    // rlvr eval refuses it, naming the file.
    let args = rlvr_train::cli::EvalArgs {
        model: s4.clone(),
        task: Some("arithmetic".into()),
        n: None,
        limit: Some(1),
        ..Default::default()
    };
    let e = format!(
        "{:#}",
        rlvr_train::cli::run_eval(&args, &mut Vec::new()).unwrap_err()
    );
    assert!(
        e.contains("refusing to evaluate") && e.contains("model.safetensors"),
        "{e}"
    );
    // A file added after the save is named too.
    std::fs::write(s2.join("extra.safetensors"), b"x").unwrap();
    let e = format!("{:#}", manifest::verify(&s2).unwrap_err());
    assert!(
        e.contains("extra.safetensors is not in the checkpoint's manifest"),
        "{e}"
    );
    std::fs::remove_file(s2.join("extra.safetensors")).unwrap();
    // An old checkpoint without a manifest still verifies as "unchecked".
    std::fs::remove_file(s2.join("manifest.json")).unwrap();
    assert!(!manifest::verify(&s2).unwrap());
    assert!(checkpoint::incomplete(&s2).is_none());
}

/// A stop (Ctrl-C, SIGTERM: the run's stop flag, set here while the verifier holds the batch of
/// step 2, so the run stops after step 1) with an explorer thread (o = 1) acts within seconds and
/// resumes bit for bit as the uninterrupted run. With v = 4 the checkpoint keeps version 0's
/// weights (the feed's copy of the last sync's); with v = 1 the feed keeps no copy, and the stop
/// used to wait for the in-flight batch of step 2, sampled by version 0, for as long as the
/// verifier took (here until its 30 s timeout): the checkpoint now saves the explorer's own
/// weights (version 0, held still while saved) instead. The resume re-samples step 2 with them.
#[test]
fn a_stop_with_an_explorer_thread_resumes_exactly() {
    for v in [1u64, 4] {
        let tmp = tempfile::tempdir().unwrap();
        let model = common::tiny_model(tmp.path(), 1);
        let config = |dir: &Path, verifier: &Path| {
            let mut s = sets(&model, dir, v, 1);
            s.push(verifier_hanging_at(verifier));
            RawConfig::load(None, &s).unwrap().resolve().unwrap()
        };
        let ra = tmp.path().join("a");
        train(&config(&ra, &tmp.path().join("va")), &RunOptions::default()).unwrap();
        let rb = tmp.path().join("b");
        let vb = tmp.path().join("vb");
        std::fs::create_dir_all(&vb).unwrap();
        std::fs::write(vb.join("hang-at"), "2").unwrap();
        let (s, secs) = stop_once_hung(config(&rb, &vb), false, &vb.join("hung"), 1);
        // The hung verifier answers now (its explorer thread, left behind, then ends).
        std::fs::write(vb.join("go"), "").unwrap();
        assert!(s.interrupted && s.steps == 1, "v={v}: {s:?}");
        assert!(secs < 10.0, "v={v}: the stop took {secs:.1} s");
        let ck = rb.join("checkpoints/step-1/trainer_state");
        let buffer = std::fs::read_to_string(ck.join("buffer.jsonl")).unwrap();
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(ck.join("state.json")).unwrap()).unwrap();
        assert_eq!(buffer.lines().count(), 0, "v={v}");
        assert_eq!(state["explorer_version"], 0, "v={v}");
        assert_eq!(state["explorer_weights"], true, "v={v}");
        let mut cfg = ResolvedConfig::from_run_dir(&rb, &[]).unwrap();
        cfg.raw.output.dir = rb.clone();
        let s = train(
            &cfg,
            &RunOptions {
                resume: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(s.steps, 6);
        let ma = read_metrics(&ra.join("metrics.jsonl")).unwrap();
        let mb = read_metrics(&rb.join("metrics.jsonl")).unwrap();
        assert_eq!(ma.len(), mb.len(), "v={v}");
        for (la, lb) in ma.iter().zip(&mb) {
            for (k, va) in la {
                if !TIME_KEYS.contains(&k.as_str()) {
                    assert_eq!(va, &lb[k], "v={v} step {}: {k}", la["step"]);
                }
            }
        }
        assert!(
            mb[2..]
                .iter()
                .any(|l| l["grad_norm"].as_f64().unwrap_or(0.0) > 0.0),
            "v={v}: no step after the stop had a gradient: the test would prove nothing"
        );
    }
}

/// An external verifier for the tests below (`data.verifier`, as a `--set`): reward 1 when a
/// completion starts with a digit 0 to 4 (so that groups have reward variance and steps train),
/// and the `k`-th evaluation batch (the only batches of 8 items: `data.arithmetic.test_size`;
/// the first is step 0's) creates `dir/eval-failing`, waits 2 s, and fails.
fn verifier_failing_eval(dir: &Path, k: u32) -> String {
    let k = k.to_string();
    common::scripted_verifier(
        dir,
        r#"if [ "$n" = 8 ]; then
  echo x >> "$DIR/evals"
  if [ "$(wc -l < "$DIR/evals")" -eq "$2" ]; then
    touch "$DIR/eval-failing"
    sleep 2
    echo "a deliberate evaluation failure" >&2
    exit 1
  fi
fi"#,
        &[&k],
        None,
    )
}

/// `ma` and `mb` agree bit for bit outside the time keys, but for the evaluation keys of step
/// `failed` (whose evaluation failed in the run of `mb`).
fn assert_same_metrics(ma: &Path, mb: &Path, failed: u64, what: &str) {
    let ma = read_metrics(ma).unwrap();
    let mb = read_metrics(mb).unwrap();
    assert_eq!(ma.len(), mb.len(), "{what}: metrics lines differ in number");
    for (la, lb) in ma.iter().zip(&mb) {
        let step = la["step"].as_u64().unwrap();
        for (k, va) in la {
            if TIME_KEYS.contains(&k.as_str()) || (step == failed && k.starts_with("eval/")) {
                continue;
            }
            assert_eq!(Some(va), lb.get(k), "{what} step {step}: {k}");
        }
    }
    assert!(
        mb[(failed as usize + 1)..]
            .iter()
            .any(|l| l["grad_norm"].as_f64().unwrap_or(0.0) > 0.0),
        "{what}: no step after step {failed} had a gradient: the test would prove nothing"
    );
}

/// Resumes the run in `dir` to its end on a thread of its own, failing the test when it has not
/// finished within 120 s (a resumed explorer waiting for weights no step sends hangs forever).
fn resume_within_a_deadline(dir: &Path, what: &str) -> rlvr_train::run::RunSummary {
    let mut cfg = ResolvedConfig::from_run_dir(dir, &[]).unwrap();
    cfg.raw.output.dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let opts = RunOptions {
            resume: true,
            ..Default::default()
        };
        let _ = tx.send(train(&cfg, &opts).map_err(|e| format!("{e:#}")));
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("{what}: the resumed run hung"))
        .unwrap()
}

/// A stop (Ctrl-C, SIGTERM) during the evaluation of a step t that v divides, which then fails
/// (a hung reward model the stop cut short), saves step t before t's sync. The resume makes that
/// sync and equals the uninterrupted run bit for bit: inline (o = 0) it sampled steps t+1.. with
/// the last sync's weights; with an explorer thread (o = 1, v = 2 and 4) it waited forever for
/// version t, which no step of the resumed run sends.
#[test]
fn a_stop_during_the_evaluation_of_a_sync_step_resumes_exactly() {
    use std::sync::atomic::Ordering;
    for (v, o) in [(4u64, 0u64), (2, 1), (4, 1)] {
        let what = format!("v={v} o={o}");
        let tmp = tempfile::tempdir().unwrap();
        let model = common::tiny_model(tmp.path(), 1);
        let ra = tmp.path().join("a");
        let mut s = sets(&model, &ra, v, o);
        s.push(verifier_failing_eval(&tmp.path().join("va"), 0));
        let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
        train(&cfg, &RunOptions::default()).unwrap();

        // Evaluations at steps 0, 2, 4: the one of step v is the (v/2 + 1)-th.
        let rb = tmp.path().join("b");
        let mut s = sets(&model, &rb, v, o);
        let vb = tmp.path().join("vb");
        s.push(verifier_failing_eval(&vb, v as u32 / 2 + 1));
        let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
        let opts = RunOptions::default();
        let (stop, flag) = (opts.stop.clone(), vb.join("eval-failing"));
        let watcher = std::thread::spawn(move || {
            let t0 = Instant::now();
            while !flag.exists() && t0.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.store(true, Ordering::SeqCst);
        });
        let sum = train(&cfg, &opts).unwrap();
        watcher.join().unwrap();
        assert!(sum.interrupted && sum.steps == v, "{what}: {sum:?}");
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                rb.join(format!("checkpoints/step-{v}/trainer_state/state.json")),
            )
            .unwrap(),
        )
        .unwrap();
        // Saved before the sync of step v: the explorer is still the last sync's.
        assert_eq!(state["explorer_version"], 0, "{what}: {state}");
        let s = resume_within_a_deadline(&rb, &what);
        assert_eq!(s.steps, 6, "{what}");
        assert_same_metrics(
            &ra.join("metrics.jsonl"),
            &rb.join("metrics.jsonl"),
            v,
            &what,
        );
    }
}

/// An error after step t's update (here its evaluation fails, with no stop) saves step t; with
/// an explorer thread (v = 1, o = 1) that checkpoint now keeps the in-flight batch of step t+1,
/// sampled by version t−1, and the resume equals the uninterrupted run (it re-sampled that batch
/// with version t's weights).
#[test]
fn a_save_after_an_error_keeps_the_in_flight_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let ra = tmp.path().join("a");
    let mut s = sets(&model, &ra, 1, 1);
    s.push(verifier_failing_eval(&tmp.path().join("va"), 0));
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();

    let rb = tmp.path().join("b");
    let mut s = sets(&model, &rb, 1, 1);
    s.push(verifier_failing_eval(&tmp.path().join("vb"), 2)); // step 2's evaluation
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    let e = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    assert!(
        e.contains("stopped by an error after step 2") && e.contains("evaluating step 2"),
        "{e}"
    );
    let buffer =
        std::fs::read_to_string(rb.join("checkpoints/step-2/trainer_state/buffer.jsonl")).unwrap();
    assert_eq!(buffer.lines().count(), 1, "{buffer}");
    let s = resume_within_a_deadline(&rb, "v=1 o=1");
    assert_eq!(s.steps, 6);
    assert_same_metrics(
        &ra.join("metrics.jsonl"),
        &rb.join("metrics.jsonl"),
        2,
        "v=1 o=1",
    );
}

/// `--resume --set` of a key the checkpoint was written for (`sync.interval`, `sync.offset`,
/// `data.seed`) is refused, naming the key, the saved value and the `--set`; one that changes
/// what the run means (`train.seed`, `rollout.group_size`, `algorithm.*`, `data.*`) is warned
/// about once in train.log and recorded in run.json's `resume_changes`; the same value, or a key
/// outside these (`train.steps`), is neither.
#[test]
fn a_resume_that_changes_what_the_run_means_is_refused_or_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let run = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend([
        "train.steps=1".to_string(),
        "sync.interval=2".into(),
        "sync.offset=1".into(),
    ]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let config = run.join("config.toml");
    for (set, key, was) in [
        ("sync.interval=4", "sync.interval = 4", "sync.interval = 2"),
        ("sync.offset=0", "sync.offset = 0", "sync.offset = 1"),
        ("data.seed=5", "data.seed = 5", "data.seed = 0"),
    ] {
        let e = format!(
            "{:#}",
            ResolvedConfig::from_run_dir(&run, &[set.to_string()]).unwrap_err()
        );
        assert!(
            e.contains(&format!(
                "{key} cannot change on --resume (--set {set}): {} has {was};",
                config.display()
            )),
            "{e}"
        );
    }
    let same = ResolvedConfig::from_run_dir(
        &run,
        &[
            "sync.interval=2".into(),
            "train.steps=2".into(),
            "data.seed=0".into(),
        ],
    )
    .unwrap();
    assert!(same.resume_changes.is_empty(), "{:?}", same.resume_changes);
    // The learning rate and the sampling temperature change what the steps after the checkpoint
    // do too: recorded (they used to pass without a word).
    let lr = ResolvedConfig::from_run_dir(
        &run,
        &[
            "train.steps=2".into(),
            "train.lr=0.5".into(),
            "rollout.temperature=0.7".into(),
            "algorithm.kl_coef=0.01".into(),
            format!("model.reference={}", model.display()),
        ],
    )
    .unwrap();
    let keys: Vec<&str> = lr.resume_changes.iter().map(|c| c.key.as_str()).collect();
    // A new KL term and its reference policy change the loss of every later step.
    assert_eq!(
        keys,
        [
            "train.lr",
            "rollout.temperature",
            "algorithm.kl_coef",
            "model.reference"
        ],
        "{:?}",
        lr.resume_changes
    );
    let mut cfg = ResolvedConfig::from_run_dir(
        &run,
        &[
            "train.steps=2".into(),
            "train.seed=7".into(),
            "rollout.group_size=4".into(),
        ],
    )
    .unwrap();
    let keys: Vec<(&str, &str, &str)> = cfg
        .resume_changes
        .iter()
        .map(|c| (c.key.as_str(), c.was.as_str(), c.now.as_str()))
        .collect();
    assert_eq!(
        keys,
        [("train.seed", "0", "7"), ("rollout.group_size", "8", "4")]
    );
    cfg.raw.output.dir = run.clone();
    let opts = RunOptions {
        resume: true,
        ..Default::default()
    };
    assert_eq!(train(&cfg, &opts).unwrap().steps, 2);
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let warned = format!(
        "warning: --resume changes train.seed from 0 ({}) to 7 (--set train.seed=7)",
        config.display()
    );
    assert_eq!(log.matches(&warned).count(), 1, "{log}");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    let changes = meta["resume_changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2, "{meta}");
    assert_eq!(changes[1]["key"], "rollout.group_size");
    assert_eq!(changes[1]["was"], "8");
    assert_eq!(changes[1]["now"], "4");
    assert_eq!(changes[1]["set"], "--set rollout.group_size=4");
    assert!(changes[1]["at"].is_string());
}

/// An external verifier (`data.verifier`, as a `--set`) scoring as [`verifier_failing_eval`]'s
/// does, whose train batches (16 items) are counted in `dir/batches`: the one whose number is in
/// `dir/hang-at` creates `dir/hung` and waits for `dir/go` before it answers (a hung reward model
/// or vLLM server until the verifier's 30 s timeout, when nothing creates it).
fn verifier_hanging_at(dir: &Path) -> String {
    common::scripted_verifier(
        dir,
        r#"if [ "$n" = 16 ]; then
  echo x >> "$DIR/batches"
  if [ "$(wc -l < "$DIR/batches")" -eq "$(cat "$DIR/hang-at" 2>/dev/null || echo 0)" ]; then
    touch "$DIR/hung"
    while [ ! -e "$DIR/go" ]; do sleep 0.05; done
  fi
fi"#,
        &[],
        Some(30),
    )
}

/// Runs `cfg` on a thread, setting the stop flag (as the first Ctrl-C or SIGTERM does) once
/// `hung` exists and metrics.jsonl holds step `after`; returns the run's summary and the seconds
/// from the stop to the return, failing the test when it has not returned within 60 s of the stop.
fn stop_once_hung(
    cfg: ResolvedConfig,
    resume: bool,
    hung: &Path,
    after: u64,
) -> (rlvr_train::run::RunSummary, f64) {
    use std::sync::atomic::Ordering;
    let opts = RunOptions {
        resume,
        ..Default::default()
    };
    let stop = opts.stop.clone();
    let metrics = cfg.raw.output.dir.join("metrics.jsonl");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(train(&cfg, &opts).map_err(|e| format!("{e:#}")));
    });
    let t0 = Instant::now();
    while !hung.exists() || last_step(&metrics) < after {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the verifier never hung"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The run is now waiting for the explorer's batch (the verifier scores it forever).
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let t1 = Instant::now();
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the run did not stop within 60 s of the stop"));
    (r.unwrap(), t1.elapsed().as_secs_f64())
}

/// A stop (the first Ctrl-C or SIGTERM) while the run waits for the explorer thread (o = 1,
/// v = 4) whose verifier hangs stops at once, without the batch, three times: (1) in step 2's
/// checkpoint, which waited for the in-flight batch of step 3 (not needed: version 0's weights
/// are kept, with which the resume samples it again); (2) in the resumed run, whose first step
/// waits for that batch again (its checkpoint is the one resumed from: nothing is saved); (3) in
/// the run resumed again, after step 3, waiting for step 4's batch (step 3 is saved). The run then
/// resumed to its end equals the uninterrupted one bit for bit. Every stop used to wait for the
/// hung batch (here the verifier's 30 s timeout; a hung server's for ever).
#[test]
fn a_stop_while_waiting_for_the_explorer_stops_at_once_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let ra = tmp.path().join("a");
    let mut s = sets(&model, &ra, 4, 1);
    s.push(verifier_hanging_at(&tmp.path().join("va")));
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();

    let rb = tmp.path().join("b");
    let vb = tmp.path().join("vb");
    let mut s = sets(&model, &rb, 4, 1);
    s.push(verifier_hanging_at(&vb));
    let latest = || std::fs::read_to_string(rb.join("checkpoints/latest")).unwrap();
    let resumed = || {
        let mut cfg = ResolvedConfig::from_run_dir(&rb, &[]).unwrap();
        cfg.raw.output.dir = rb.clone();
        cfg
    };
    // (hang at the n-th train batch scored, whether resumed, the steps done, the checkpoint)
    let legs = [
        (3, false, 2, "step-2"),
        (4, true, 2, "step-2"),
        (6, true, 3, "step-3"),
    ];
    for (i, (hang_at, resume, steps, ckpt)) in legs.into_iter().enumerate() {
        let _ = std::fs::remove_file(vb.join("hung"));
        std::fs::write(vb.join("hang-at"), hang_at.to_string()).unwrap();
        let cfg = match resume {
            false => RawConfig::load(None, &s).unwrap().resolve().unwrap(),
            true => resumed(),
        };
        let (sum, secs) = stop_once_hung(cfg, resume, &vb.join("hung"), 2);
        assert!(
            sum.interrupted && sum.steps == steps,
            "stop {}: {sum:?}",
            i + 1
        );
        assert!(secs < 10.0, "stop {} took {secs:.1} s", i + 1);
        assert_eq!(
            last_step(&rb.join("metrics.jsonl")),
            steps,
            "stop {}",
            i + 1
        );
        assert_eq!(latest().trim(), ckpt, "stop {}", i + 1);
        let ck = rb.join(format!("checkpoints/{ckpt}/trainer_state"));
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(ck.join("state.json")).unwrap()).unwrap();
        assert_eq!(state["explorer_version"], 0, "stop {}: {state}", i + 1);
        let buffer = std::fs::read_to_string(ck.join("buffer.jsonl")).unwrap_or_default();
        assert_eq!(buffer.lines().count(), 0, "stop {}", i + 1);
    }
    std::fs::write(vb.join("hang-at"), "0").unwrap();
    let s = resume_within_a_deadline(&rb, "the last resume");
    assert_eq!(s.steps, 6);
    assert_same_metrics(
        &ra.join("metrics.jsonl"),
        &rb.join("metrics.jsonl"),
        0,
        "v=4 o=1",
    );
}

/// `--resume` of a run that has trained all its `train.steps` says so, and how to train on (it
/// loaded the model and printed the summary without a word).
#[test]
fn resuming_a_finished_run_says_there_is_nothing_to_train() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let run = tmp.path().join("run");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend(["train.steps=1".to_string(), "train.eval_every=0".into()]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let cfg = ResolvedConfig::from_run_dir(&run, &[]).unwrap();
    assert!(
        cfg.warnings.iter().any(|w| w.contains(&format!(
            "the run in {} has already trained all its train.steps = 1",
            run.display()
        )) && w.contains("--set train.steps=N, N > 1")),
        "{:?}",
        cfg.warnings
    );
    let more = ResolvedConfig::from_run_dir(&run, &["train.steps=2".into()]).unwrap();
    assert!(
        !more
            .warnings
            .iter()
            .any(|w| w.contains("already trained all")),
        "{:?}",
        more.warnings
    );
    // A `--set` that changes the run, with nothing left to train, is refused: it used to be
    // written into config.toml (and run.json's resume_changes) though no step followed it. The
    // same value again, or train.steps alone, is not a change.
    let before = std::fs::read(run.join("config.toml")).unwrap();
    let sets = [
        "rollout.group_size=4".to_string(),
        "train.lr=0.5".into(),
        "train.steps=1".into(),
    ];
    let e = format!(
        "{:#}",
        ResolvedConfig::from_run_dir(&run, &sets).unwrap_err()
    );
    assert!(
        e.contains("so --set rollout.group_size=4, --set train.lr=0.5 would apply to no step")
            && e.contains("add --set train.steps=N with N > 1"),
        "{e}"
    );
    assert_eq!(std::fs::read(run.join("config.toml")).unwrap(), before);
    let group = format!("rollout.group_size={}", cfg.raw.rollout.group_size);
    ResolvedConfig::from_run_dir(&run, &[group, "train.steps=1".into()]).unwrap();
}

/// Offsets of one interval or more (o ≥ v > 1): the step-2 checkpoint's buffer holds o batches,
/// sampled by versions below the last sync's, and the explorer after them needs the last sync's.
#[test]
fn sigkill_resume_matches_uninterrupted_v2_offset_2() {
    check_resume(2, 2, true);
}

#[test]
fn sigkill_resume_matches_uninterrupted_v2_offset_3() {
    check_resume(2, 3, true);
}

#[test]
fn sigkill_resume_matches_uninterrupted_v3_offset_3() {
    check_resume(3, 3, true);
}
