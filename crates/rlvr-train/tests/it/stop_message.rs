//! What a stop (the first Ctrl-C or SIGTERM) says in train.log when it comes before a step's
//! batch from the explorer thread (`sync.offset` ≥ 1) is handed out: waiting for the explorer
//! only when the step waited.

use std::path::Path;
use std::time::{Duration, Instant};

use rlvr_train::config::RawConfig;
use rlvr_train::run::{train, RunOptions};

use crate::common;

/// An external verifier (`data.verifier`, as a `--set`) that scores a completion starting with a
/// digit below 5 as correct; it creates `dir/scored` after scoring a train batch (16 items), and
/// holds an evaluation's answer (8 items) until `dir/go` exists (at most 30 s).
fn verifier_holding_eval(dir: &Path) -> String {
    common::scripted_verifier(
        dir,
        r#"if [ "$n" = 16 ]; then
  touch "$DIR/scored"
elif [ "$n" = 8 ]; then
  i=0
  while [ ! -e "$DIR/go" ] && [ "$i" -lt 600 ]; do sleep 0.05; i=$((i+1)); done
fi"#,
        &[],
        Some(60),
    )
}

/// A stop set while the initial evaluation runs, after the explorer thread has finished step 1's
/// batch: the loop finds the stop with the batch ready in the channel, so train.log says that
/// the batch was ready and not trained on. It used to say "step 1 was waiting for the explorer",
/// though nothing waited.
#[test]
fn a_stop_with_the_batch_ready_does_not_say_it_waited() {
    use std::sync::atomic::Ordering;
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let run = tmp.path().join("run");
    let vdir = tmp.path().join("v");
    let mut s = common::arithmetic_sets(&model, &run);
    s.extend([
        "train.steps=3".to_string(),
        "train.eval_every=2".into(),
        "sync.offset=1".into(),
        verifier_holding_eval(&vdir),
    ]);
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    let opts = RunOptions::default();
    let stop = opts.stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(train(&cfg, &opts).map_err(|e| format!("{e:#}")));
    });
    let t0 = Instant::now();
    while !vdir.join("scored").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no train batch scored"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The explorer hands the scored batch over at once; the evaluation is still held.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    std::fs::write(vdir.join("go"), "").unwrap();
    let sum = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the run did not stop")
        .unwrap();
    assert!(sum.interrupted && sum.steps == 0, "{sum:?}");
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains(
            "stop: stopping after step 0; the batch of step 1 was already sampled and is not \
             trained on"
        ),
        "{log}"
    );
    assert!(!log.contains("waiting for the explorer"), "{log}");
}
