//! Resume exactness where an explorer thread (`sync.offset` ≥ 1) had batches in flight (helper
//! W's audit of `Feed::state`'s fallback, docs/runs.md "Resume exactness"). The cases the audit
//! found now resume exactly (every metric but the time keys bit for bit as the uninterrupted
//! run's, without the warning): a data-parallel checkpoint (the ranks' in-flight shares gathered
//! into its buffer), a save after the explorer failed (its own weights kept) and a save after an
//! error while training a step (its batch kept). A run extended past its last step cannot: the
//! resume warns and its re-sampled step differs. The single-process cases with v > 1 and o ≥ v
//! are tests/it/resume.rs's.

use std::path::Path;

use rlvr_dist::{SharedComm, ThreadComm};
use rlvr_train::config::{RawConfig, ResolvedConfig};
use rlvr_train::job::Job;
use rlvr_train::run::{train, train_on, RunOptions};
use rlvr_train::store::metrics::{read_metrics, TIME_KEYS};

use crate::common;

/// `staleness/mean` of `step` in `run`'s metrics.jsonl.
fn staleness(run: &Path, step: u64) -> f64 {
    read_metrics(&run.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .find(|l| l["step"] == step)
        .and_then(|l| l["staleness/mean"].as_f64())
        .unwrap()
}

fn sets(model: &Path, run: &Path, steps: u64) -> Vec<String> {
    sets_o(model, run, steps, 1)
}

/// [`sets`] at sync offset `o`.
fn sets_o(model: &Path, run: &Path, steps: u64, o: u64) -> Vec<String> {
    let mut s = common::arithmetic_sets(model, run);
    s.extend([
        format!("train.steps={steps}"),
        "train.eval_every=0".into(),
        "sync.interval=1".into(),
        format!("sync.offset={o}"),
    ]);
    s
}

/// `part`'s metrics.jsonl is `whole`'s: the same lines and keys, every value but the time keys
/// bit for bit (as tests/it/resume.rs's `check_resume` compares them).
fn same_metrics(whole: &Path, part: &Path, what: &str) {
    let ma = read_metrics(&whole.join("metrics.jsonl")).unwrap();
    let mb = read_metrics(&part.join("metrics.jsonl")).unwrap();
    assert_eq!(ma.len(), mb.len(), "{what}: metrics lines differ in number");
    for (la, lb) in ma.iter().zip(&mb) {
        assert_eq!(
            la.keys().collect::<Vec<_>>(),
            lb.keys().collect::<Vec<_>>(),
            "{what}: keys of step {}",
            la["step"]
        );
        for (k, va) in la {
            if !TIME_KEYS.contains(&k.as_str()) {
                assert_eq!(va, &lb[k], "{what}: step {} {k}", la["step"]);
            }
        }
    }
}

/// The steps of checkpoint `step-N`'s `trainer_state/buffer.jsonl`, in order.
fn buffer_steps(run: &Path, n: u64) -> Vec<u64> {
    let p = run.join(format!("checkpoints/step-{n}/trainer_state/buffer.jsonl"));
    std::fs::read_to_string(&p)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// checkpoint `step-N`'s `trainer_state/state.json`.
fn state(run: &Path, n: u64) -> serde_json::Value {
    let p = run.join(format!("checkpoints/step-{n}/trainer_state/state.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn resumed(run: &Path, sets: &[String]) -> ResolvedConfig {
    let mut cfg = ResolvedConfig::from_run_dir(run, sets).unwrap();
    cfg.raw.output.dir = run.to_path_buf();
    cfg
}

fn resume() -> RunOptions {
    RunOptions {
        resume: true,
        ..Default::default()
    }
}

/// train.log of `run`, and whether it holds a resume's "not exact" warning.
fn log_warns(run: &Path) -> (String, bool) {
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let warns = log.contains("this resume is not exact");
    (log, warns)
}

/// The warning a resume from the checkpoint of step `t` gives when step t+1, which version
/// t − 1 sampled (v = 1, o = 1), is sampled with version t.
fn warning(t: u64) -> String {
    format!(
        "warning: this resume is not exact: an uninterrupted run sampled step {} with version {} \
         of the policy, whose weights (and those batches) the checkpoint of step {t} does not \
         keep; the explorer samples it with version {t}",
        t + 1,
        t - 1
    )
}

/// A finished run extended by `--resume --set train.steps=N`: its explorer never sampled past the
/// old last step, so step 3 (version 1's in a 4-step run) is sampled with version 2. Not
/// fixable without keeping o older weight copies; the resume says so.
#[test]
fn a_run_extended_past_its_steps_resamples_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let (whole, part) = (tmp.path().join("whole"), tmp.path().join("part"));
    let cfg = |run: &Path, n| {
        RawConfig::load(None, &sets(&model, run, n))
            .unwrap()
            .resolve()
            .unwrap()
    };
    train(&cfg(&whole, 4), &RunOptions::default()).unwrap();
    train(&cfg(&part, 2), &RunOptions::default()).unwrap();
    train(&resumed(&part, &["train.steps=4".into()]), &resume()).unwrap();
    let log = std::fs::read_to_string(part.join("train.log")).unwrap();
    assert_eq!(log.matches(&warning(2)).count(), 1, "{log}");
    assert_eq!((staleness(&whole, 3), staleness(&part, 3)), (1.0, 0.0));
    // The steps after it are the resumed run's own (its syncs): as sampled uninterrupted.
    assert_eq!(staleness(&part, 4), 1.0);
}

/// Data parallel (`world` ≥ 2 ranks of one process, [`ThreadComm`]; one process is
/// tests/it/resume.rs's `check_resume`) with offset `o`: a stop after step 1 keeps the batches in flight, each rank's share gathered
/// into the checkpoint's buffer (steps 2..=1+o), and the resume trains on them: every metric as
/// the uninterrupted run's, no warning. A run that checkpoints every step (gathering its in-flight
/// batches and going on with them) is the uninterrupted run too.
fn data_parallel_resumes_exactly(world: usize, o: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let (whole, part, every) = (
        tmp.path().join("whole"),
        tmp.path().join("part"),
        tmp.path().join("every"),
    );
    let dp = |cfg: &ResolvedConfig, opts: &RunOptions| {
        ThreadComm::run(world, |c| {
            train_on(cfg, opts, Job::over(SharedComm::new(Box::new(c)))).unwrap()
        })
    };
    let cfg = |run: &Path, extra: &[&str]| {
        let mut s = sets_o(&model, run, 4, o);
        s.extend(extra.iter().map(|x| x.to_string()));
        RawConfig::load(None, &s).unwrap().resolve().unwrap()
    };
    dp(&cfg(&whole, &[]), &RunOptions::default());
    // Asked to stop before it starts: the ranks stop together after step 1, saving it.
    let stop = RunOptions::default();
    stop.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let s = dp(&cfg(&part, &[]), &stop);
    assert!(s[0].interrupted && s[0].steps == 1, "{:?}", s[0]);
    assert_eq!(buffer_steps(&part, 1), (2..=1 + o).collect::<Vec<_>>());
    assert_eq!(state(&part, 1)["explorer_version"], 1);
    dp(&resumed(&part, &[]), &resume());
    let (log, warns) = log_warns(&part);
    assert!(!warns, "{log}");
    same_metrics(&whole, &part, &format!("world {world}, o = {o}"));
    dp(
        &cfg(&every, &["train.save_every=1"]),
        &RunOptions::default(),
    );
    // The last two checkpoints are kept: step 3's holds step 4's batch.
    assert_eq!(buffer_steps(&every, 3), [4]);
    same_metrics(
        &whole,
        &every,
        &format!("world {world}, o = {o}, saving every step"),
    );
}

/// Data parallel: a checkpoint keeps the in-flight batches (the ranks' shares gathered into its
/// buffer), 2 ranks, o = 1 (the audit's case: the resume used to sample step 2 with version 1
/// instead of 0, and warn).
#[test]
fn a_data_parallel_checkpoint_keeps_its_batches_in_flight() {
    data_parallel_resumes_exactly(2, 1);
}

/// As above with three ranks (one of which samples no group: 2 prompts a step), and two ranks
/// at o = 2 (two batches in flight).
#[test]
fn a_data_parallel_checkpoint_keeps_them_at_other_world_sizes_and_offsets() {
    data_parallel_resumes_exactly(3, 1);
    data_parallel_resumes_exactly(2, 2);
}

/// An external verifier scoring as tests/it/resume.rs's do, failing (exit 1) on the 4th train
/// batch (16 items) while `dir/fail` exists.
fn verifier_failing_at_4(dir: &Path) -> String {
    common::scripted_verifier(
        dir,
        r#"if [ "$n" = 16 ]; then
  echo x >> "$DIR/batches"
  if [ -e "$DIR/fail" ] && [ "$(wc -l < "$DIR/batches")" -eq 4 ]; then echo broken >&2; exit 1; fi
fi"#,
        &[],
        Some(30),
    )
}

/// The explorer fails (its verifier, on step 4's batch, the trainer at step 3): the explorer
/// thread's own weights are still version 2, the failed batch's, so the save after the error
/// keeps them (and its explorer version) as a stop does, and the resume (verifier mended)
/// samples step 4 with version 2: every metric as the uninterrupted run's, no warning.
#[test]
fn a_save_after_an_explorer_error_keeps_its_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let (whole, part) = (tmp.path().join("whole"), tmp.path().join("part"));
    let cfg = |run: &Path, v: &Path| {
        let mut s = sets(&model, run, 5);
        s.push(verifier_failing_at_4(v));
        RawConfig::load(None, &s).unwrap().resolve().unwrap()
    };
    train(&cfg(&whole, &tmp.path().join("vw")), &RunOptions::default()).unwrap();
    let vp = tmp.path().join("vp");
    let c = cfg(&part, &vp);
    std::fs::write(vp.join("fail"), "").unwrap();
    let e = format!("{:#}", train(&c, &RunOptions::default()).unwrap_err());
    assert!(e.contains("after step 3"), "{e}");
    let st = state(&part, 3);
    assert_eq!(
        (&st["explorer_version"], &st["explorer_weights"]),
        (&2.into(), &true.into()),
        "{st}"
    );
    assert_eq!(buffer_steps(&part, 3), Vec::<u64>::new());
    let (log, _) = log_warns(&part);
    assert!(
        log.contains("keeps the batches it finished and its weights (version 2)"),
        "{log}"
    );
    std::fs::remove_file(vp.join("fail")).unwrap();
    train(&resumed(&part, &[]), &resume()).unwrap();
    let (log, warns) = log_warns(&part);
    assert!(!warns, "{log}");
    assert_eq!((staleness(&whole, 4), staleness(&part, 4)), (1.0, 1.0));
    same_metrics(&whole, &part, "explorer error");
}

/// An error while training step 4 (the [`RunOptions::fail_update_at_step`] hook, before any
/// weight changed, as an out-of-memory forward) at offset `o`: the save of step 3 keeps step
/// 4's batch, already handed out, in its buffer with those in flight after it (o ≥ 1), and the
/// resume trains on them: every metric as the uninterrupted run's, no warning. At o = 0 (the
/// inline explorer) the buffer is empty and the resume samples step 4 again, as it was.
fn an_update_error_resumes_exactly(o: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let (whole, part) = (tmp.path().join("whole"), tmp.path().join("part"));
    let cfg = |run: &Path| {
        RawConfig::load(None, &sets_o(&model, run, 6, o))
            .unwrap()
            .resolve()
            .unwrap()
    };
    train(&cfg(&whole), &RunOptions::default()).unwrap();
    let failing = RunOptions {
        fail_update_at_step: Some(4),
        ..Default::default()
    };
    let e = format!("{:#}", train(&cfg(&part), &failing).unwrap_err());
    assert!(
        e.contains("after step 3") && e.contains("a deliberate error while training step 4"),
        "{e}"
    );
    assert_eq!(buffer_steps(&part, 3), (4..=3 + o).collect::<Vec<_>>());
    train(&resumed(&part, &[]), &resume()).unwrap();
    let (log, warns) = log_warns(&part);
    assert!(!warns, "{log}");
    same_metrics(&whole, &part, &format!("update error, o = {o}"));
}

/// The audit's case: o = 1, step 4's batch (version 2's) was dropped and re-sampled with
/// version 3.
#[test]
fn a_save_after_an_error_while_training_keeps_that_steps_batch() {
    an_update_error_resumes_exactly(1);
}

/// As above with two batches in flight (o = 2) and none (o = 0).
#[test]
fn a_save_after_an_update_error_at_other_offsets_resumes_exactly() {
    an_update_error_resumes_exactly(2);
    an_update_error_resumes_exactly(0);
}

/// Data parallel (2 ranks of one process) at offset 1, `extra` set, with an error while training
/// step 4 on every rank ([`RunOptions::fail_update_at_step`], before any weight changed) in a
/// run that checkpoints every 2 steps; `failed` checks rank 0's error (as text) and the failed
/// run's directory, which is then resumed (`--resume`, no hook) to its end. Returns the
/// uninterrupted run's directory and the resumed one's.
fn data_parallel_update_error(
    tmp: &Path,
    extra: &[&str],
    failed: impl FnOnce(&str, &Path),
) -> (std::path::PathBuf, std::path::PathBuf) {
    let model = common::tiny_model(tmp, 1);
    let (whole, part) = (tmp.join("whole"), tmp.join("part"));
    let cfg = |run: &Path| {
        let mut s = sets_o(&model, run, 6, 1);
        s.push("train.save_every=2".into());
        s.extend(extra.iter().map(|x| x.to_string()));
        RawConfig::load(None, &s).unwrap().resolve().unwrap()
    };
    let dp = |cfg: &ResolvedConfig, opts: &RunOptions| {
        ThreadComm::run(2, |c| {
            train_on(cfg, opts, Job::over(SharedComm::new(Box::new(c))))
                .map_err(|e| format!("{e:#}"))
        })
    };
    for r in dp(&cfg(&whole), &RunOptions::default()) {
        r.unwrap();
    }
    let failing = RunOptions {
        fail_update_at_step: Some(4),
        ..Default::default()
    };
    let r = dp(&cfg(&part), &failing);
    let e = r[0].as_ref().unwrap_err().clone();
    assert!(r[1].is_err(), "rank 1 failed too");
    assert!(
        e.contains("a deliberate error while training step 4"),
        "{e}"
    );
    failed(&e, &part);
    for r in dp(&resumed(&part, &[]), &resume()) {
        r.unwrap();
    }
    (whole, part)
}

/// ZeRO-1 (`distributed.zero = 1`): rank 0 holds only its shard of the optimizer state, and
/// gathering the others needs every rank, so the save after the error is not tried (it used to
/// fail with "saving its state failed too: ... was not gathered"); the error says the resume
/// starts from checkpoint step-2, which it does: steps 3-6 again, every metric as the
/// uninterrupted run's.
#[test]
fn zero_1_a_save_after_an_update_error_is_not_tried_and_names_the_resume_point() {
    let tmp = tempfile::tempdir().unwrap();
    let failed = |e: &str, part: &Path| {
        assert!(!e.contains("failed too"), "{e}");
        assert!(
            e.contains(
                "stopped by an error after step 3; its state is not saved (distributed.zero = 1 \
                 shards the optimizer state over the ranks"
            ) && e.contains(
                "`rlvr train --resume` starts from the last checkpoint, step-2, and trains step \
                 3 again"
            ),
            "{e}"
        );
        assert!(!part.join("checkpoints/step-3").exists());
        assert_eq!(state(part, 2)["step"], 2);
    };
    let (whole, part) = data_parallel_update_error(tmp.path(), &["distributed.zero=1"], failed);
    let (log, warns) = log_warns(&part);
    assert!(!warns, "{log}");
    assert!(log.contains("its state is not saved"), "{log}");
    same_metrics(&whole, &part, "ZeRO-1, update error at step 4");
}

/// Unsharded data parallel: rank 0 holds the whole state and saves step 3 alone, with step 4's
/// batch (handed out whole, gathered) in its buffer, which at o = 1 is every batch in flight:
/// the resume is exact.
#[test]
fn data_parallel_a_save_after_an_update_error_keeps_that_steps_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let failed = |e: &str, part: &Path| {
        assert!(e.contains("after step 3; its state was saved to"), "{e}");
        assert_eq!(buffer_steps(part, 3), [4]);
    };
    let (whole, part) = data_parallel_update_error(tmp.path(), &[], failed);
    let (log, warns) = log_warns(&part);
    assert!(!warns, "{log}");
    same_metrics(&whole, &part, "data parallel, update error at step 4");
}

/// An error every rank meets at the same point (`train.max_skipped_in_row`: a huge learning rate
/// makes the steps non-finite, and the step's report is the whole batch's) under ZeRO-1: the
/// ranks gather the optimizer's shards together, so rank 0's save after the error is the
/// checkpoint one process writes (the same step, state, explorer version and cursor, the whole
/// optimizer state) instead of "not saved" (or, before, "saving its state failed too"). Inline
/// (o = 0): at o = 1 the diverged weights fail the explorer's sampling (one rank's error) before
/// two steps in a row are skipped.
#[test]
fn zero_1_an_error_every_rank_meets_is_saved_with_the_gathered_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let (one, dp) = (tmp.path().join("one"), tmp.path().join("dp"));
    let cfg = |run: &Path| {
        let mut s = sets_o(&model, run, 8, 0);
        s.extend([
            "train.lr=1e30".to_string(),
            "train.grad_clip=0".into(),
            "train.max_skipped_in_row=2".into(),
            "distributed.zero=1".into(),
        ]);
        RawConfig::load(None, &s).unwrap().resolve().unwrap()
    };
    let e1 = format!(
        "{:#}",
        train(&cfg(&one), &RunOptions::default()).unwrap_err()
    );
    let c = cfg(&dp);
    let r = ThreadComm::run(2, |comm| {
        train_on(
            &c,
            &RunOptions::default(),
            Job::over(SharedComm::new(Box::new(comm))),
        )
        .map_err(|e| format!("{e:#}"))
    });
    let e = r[0].as_ref().unwrap_err();
    assert!(r[1].is_err());
    let step = |e: &str| -> u64 {
        let at = e.find("stopped by an error after step ").unwrap() + 31;
        e[at..].split(';').next().unwrap().parse().unwrap()
    };
    assert!(
        e.contains("2 steps in a row") && e.contains("its state was saved to"),
        "{e}"
    );
    assert!(e1.contains("its state was saved to"), "{e1}");
    let n = step(e);
    assert_eq!(n, step(&e1), "{e}\n{e1}");
    let (mut s1, mut s2) = (state(&one, n), state(&dp, n));
    assert_eq!(
        (&s1["world_size"], &s2["world_size"]),
        (&1.into(), &2.into())
    );
    s1["world_size"] = 0.into();
    s2["world_size"] = 0.into();
    assert_eq!(s1, s2);
    // Written only when false.
    assert!(s2.get("optimizer_saved").is_none(), "{s2}");
    let opt = |run: &Path| {
        std::fs::read(run.join(format!(
            "checkpoints/step-{n}/trainer_state/optimizer.safetensors"
        )))
        .unwrap()
    };
    assert_eq!(opt(&one).len(), opt(&dp).len());
}

/// A weight made NaN or infinite by an update under data parallel with ZeRO-1 (each rank updates
/// its shard of the parameters, then every rank holds the whole model): every rank stops at the
/// same step with the same short "diverged" error (none waits in a collective for another), and
/// nothing is saved. Before, the ranks went on to sample with NaN weights.
#[test]
fn zero_1_a_diverged_update_stops_every_rank_with_the_same_error() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 2);
    let dp = tmp.path().join("dp");
    let mut s = sets_o(&model, &dp, 3, 0);
    s.extend(["train.lr=1e45".to_string(), "distributed.zero=1".into()]);
    let c = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    let r = ThreadComm::run(2, |comm| {
        train_on(
            &c,
            &RunOptions::default(),
            Job::over(SharedComm::new(Box::new(comm))),
        )
        .map_err(|e| format!("{e:#}"))
    });
    let errors: Vec<&String> = r.iter().map(|e| e.as_ref().unwrap_err()).collect();
    for e in &errors {
        assert!(
            e.starts_with("the training diverged at step 1: its update made weight ")
                && e.contains("no checkpoint was written yet"),
            "{e}"
        );
    }
    assert_eq!(errors[0], errors[1]);
    assert!(!dp.join("checkpoints/step-1").exists());
}
