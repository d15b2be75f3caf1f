//! The on-disk records of a run, knowing no stage and no config: experiences and rollout records,
//! the JSONL metrics files, the checkpoint format with its rotation, run.json and the
//! run-directory lock, and the binary serialisation of rows between ranks ([`wire`]).
//!
//! Architecture invariant: every file a run writes goes through here (the JSONL and lock code is
//! rlvr-rundir's), except the logs `run/guard.rs` appends to (`tests/it/module_graph.rs` lists
//! the exceptions), and every write that replaces a file is atomic (written beside it, synced,
//! renamed) except the JSONL appends, which a resume cuts back to the checkpoint's step. Nothing here imports a stage, the config, or the run loop:
//! the records are plain data that the stages fill in.

pub mod checkpoint;
pub mod experience;
pub mod hub;
pub mod lock;
pub mod manifest;
pub mod metrics;
pub mod model_identity;
pub mod rollouts;
pub(crate) mod run_json;
pub mod state;
pub mod tensorboard;
pub mod wire;
