//! rlvr's integration tests in one test binary (`it`), so that the crate's dependency stack is
//! linked once, not once per file. Each module was a `tests/<module>.rs` binary of its own; its
//! tests are named `<module>::<test>`, and
//! `cargo test --workspace --locked --test it -- <module>::` runs one module's (the filter goes to
//! every crate's `it`; `-p rlvr` would re-resolve features and rebuild most dependencies).
//! ARCHITECTURE.md, "Testing", says how tests that need a process of their own are run here.

mod common;

mod bench_scripts;
mod cli_model;
mod configs;
mod crate_graph;
mod data_layouts;
mod design_refs;
mod docs;
mod extreme_values;
mod gguf;
mod gsm8k_real_input;
mod guard;
mod limits;
mod module_circles;
mod quickstart;
mod run_dir;
mod templates;
mod watch;
