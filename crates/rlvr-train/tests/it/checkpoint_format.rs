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
