//! rlvr-reward's integration tests in one test binary (`it`), so that the crate's dependency stack is
//! linked once, not once per file. Each module was a `tests/<module>.rs` binary of its own; its
//! tests are named `<module>::<test>`, and
//! `cargo test --workspace --locked --test it -- <module>::` runs one module's (the filter goes to
//! every crate's `it`; `-p rlvr-reward` would re-resolve features and rebuild most dependencies).
//! ARCHITECTURE.md, "Testing", says how tests that need a process of their own are run here.

mod common;

mod cli_and_combine;
mod explain;
mod external_doc;
mod external_env;
mod external_group;
mod gold_solutions;
mod judge;
mod live_judge;
mod live_reward_model;
mod math_forms;
mod math_verify_set;
mod no_panic;
mod persistent;
mod reward_model;
mod stderr_log;
mod trl_rewards;
mod verifier_cases;
mod verl_rewards;
