//! The checkpoint format is unchanged by the stages' own records (issue 43): `trainer_state/`
//! files written by rlvr before the change (`tests/fixtures/checkpoint-2026-12-05/`, from
//! `bench/same_runs.sh`'s interval-4 offset-1 run at its step-4 checkpoint, with one in-flight
//! batch) are read by today's readers into typed records, and today's writers give them back byte
//! for byte. (The end-to-end check, a resume of a whole checkpoint of the old binary, is
//! `bench/same_runs.sh resume`.)

use std::path::PathBuf;

use rlvr_train::feed::explorer::Batch;
use rlvr_train::store::checkpoint::{buffer_text, load_state, read_buffer, SourceCursor};

fn old() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/checkpoint-2026-12-05")
}

#[test]
fn an_old_state_json_reads_and_writes_back_byte_for_byte() {
    let st = load_state(&old()).unwrap();
    assert_eq!((st.step, st.optimizer_step, st.explorer_version), (4, 4, 4));
    assert_eq!(st.best, Some((0.14, 4)));
    assert_eq!(st.world_size, 1);
    let SourceCursor::Online { cursor } = st.cursor else {
        panic!("{:?}", st.cursor)
    };
    assert_eq!(serde_json::to_value(cursor).unwrap()["position"], 80);
    let bytes = std::fs::read_to_string(old().join("trainer_state/state.json")).unwrap();
    assert_eq!(serde_json::to_string_pretty(&st).unwrap(), bytes);
}

#[test]
fn an_old_buffer_reads_as_typed_batches_and_writes_back_byte_for_byte() {
    let batches: Vec<Batch> = read_buffer(&old()).unwrap();
    assert_eq!(batches.len(), 1);
    let b = &batches[0];
    assert_eq!(b.step, 5);
    assert_eq!(b.experiences.len(), 16 * 8);
    assert!(b.experiences.iter().all(|e| e.version == Some(0)));
    let lp = b.experiences[0].behaviour_logprobs[0];
    assert!(lp < 0.0 && lp.is_finite());
    let bytes = std::fs::read_to_string(old().join("trainer_state/buffer.jsonl")).unwrap();
    assert_eq!(buffer_text(&batches).unwrap(), bytes);
    // A line that is not a batch is an error naming the file and line.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("trainer_state")).unwrap();
    std::fs::write(
        dir.path().join("trainer_state/buffer.jsonl"),
        "\n{\"step\": 1}\n",
    )
    .unwrap();
    let e = format!("{:#}", read_buffer::<Batch>(dir.path()).unwrap_err());
    assert!(e.contains("buffer.jsonl:2"), "{e}");
}

/// A checkpoint being read (`rlvr eval --model RUN` holds [`resolve_and_hold`]'s shared lock) is
/// not removed by the run's rotation (issue 49, item 2: an evaluation during training reported
/// files missing or corrupt that were being rotated away); the next rotation after the reader is
/// done removes it. A `latest` naming a checkpoint that is gone is an error after the retries.
#[test]
fn rotation_leaves_a_checkpoint_that_is_being_read() {
    use rlvr_train::store::checkpoint::{resolve_and_hold, rotate};
    let run = tempfile::tempdir().unwrap();
    let ck = run.path().join("checkpoints");
    let step = |n: u64| {
        let d = ck.join(format!("step-{n}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.json"), "{}").unwrap();
        std::fs::write(ck.join("latest"), format!("step-{n}")).unwrap();
    };
    let steps = || {
        let mut v: Vec<String> = std::fs::read_dir(&ck)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("step-"))
            .collect();
        v.sort();
        v
    };
    step(1);
    step(2);
    let (dir, hold) = resolve_and_hold(run.path()).unwrap();
    assert_eq!(dir, ck.join("step-2"));
    assert!(hold.is_some(), "a run's checkpoint is held");
    step(3);
    step(4);
    rotate(run.path(), 1, None).unwrap();
    assert_eq!(steps(), ["step-2", "step-4"], "step-2 is being read");
    drop(hold);
    rotate(run.path(), 1, None).unwrap();
    assert_eq!(steps(), ["step-4"]);
    // A model directory outside a run's checkpoints/ is not locked.
    let (_, none) = resolve_and_hold(&ck.join("step-4"))
        .map(|(d, h)| (d, h.is_none()))
        .unwrap();
    assert!(!none, "step-4 is in checkpoints/: held");
    let plain = tempfile::tempdir().unwrap();
    std::fs::write(plain.path().join("config.json"), "{}").unwrap();
    assert!(resolve_and_hold(plain.path()).unwrap().1.is_none());
    // `latest` naming a removed checkpoint: an error naming it, after the retries.
    std::fs::write(ck.join("latest"), "step-9").unwrap();
    let e = resolve_and_hold(run.path()).unwrap_err().to_string();
    assert!(e.contains("step-9"), "{e}");
}
