//! rlvr-train's integration tests in one test binary (`it`), so that the crate's dependency stack is
//! linked once, not once per file. Each module was a `tests/<module>.rs` binary of its own; its
//! tests are named `<module>::<test>`, and
//! `cargo test --workspace --locked --test it -- <module>::` runs one module's (the filter goes to
//! every crate's `it`; `-p rlvr-train` would re-resolve features and rebuild most dependencies).
//! ARCHITECTURE.md, "Testing", says how tests that need a process of their own are run here.

mod common;

mod checkpoint_format;
mod cli;
mod config;
mod corrections;
mod data_parallel_run;
mod data_parallel_step;
mod data_parallel_trainer;
mod determinism;
mod env_data;
mod episodes;
mod eval;
mod export;
mod generate_env;
mod job;
mod learning;
mod live_data_parallel;
mod lora;
mod module_graph;
mod offline;
mod part_metrics;
mod parts;
mod plan;
mod plan_lora;
mod plan_prompts;
mod plot;
mod preflight;
mod readme;
mod resume;
mod resume_bf16;
mod resume_exactness;
mod resume_model;
mod reward_extra;
mod run_v1;
mod sft;
mod shared_prompt;
mod shared_servers;
mod stop_message;
mod train;
