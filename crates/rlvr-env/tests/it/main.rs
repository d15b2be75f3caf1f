//! rlvr-env's integration tests in one test binary (`it`; ARCHITECTURE.md, "Testing").

mod examples;
mod faults;
mod replay;
mod replies;
mod reward;
mod templates;
mod tool_props;
mod verifiers_env;
