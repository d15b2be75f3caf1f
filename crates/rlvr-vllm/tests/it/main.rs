//! rlvr-vllm's integration tests in one test binary (`it`), so that the crate's dependency stack is
//! linked once, not once per file. Each module was a `tests/<module>.rs` binary of its own; its
//! tests are named `<module>::<test>`, and
//! `cargo test --workspace --locked --test it -- <module>::` runs one module's (the filter goes to
//! every crate's `it`; `-p rlvr-vllm` would re-resolve features and rebuild most dependencies).
//! ARCHITECTURE.md, "Testing", says how tests that need a process of their own are run here.

mod common;

mod answer_memory;
mod cache_salt;
mod checks_refresh;
mod faults;
mod live_arch;
mod live_killed;
mod live_lora;
mod live_server;
mod live_train;
mod lora_refresh;
mod served_names;
mod turns;
