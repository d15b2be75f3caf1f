//! `env.verifiers`: environments written with Prime Intellect's `verifiers` library, run unchanged
//! by the adapter `examples/verifiers_env.py`, which the binary carries (as `kind = "verl"`
//! carries `examples/verl_rewards.py`) and writes out to run it. The adapter detects the installed
//! release: verifiers 0.3.1's classic API (`load_environment`, `MultiTurnEnv`, `ToolEnv`, a
//! `Rubric`), or verifiers 0.4.0's `verifiers.v1` stack (a taskset, a harness whose model calls
//! reach an OpenAI-compatible endpoint the adapter serves, one rlvr turn per call; the task's
//! `@reward` functions). The adapter speaks this crate's protocol ([`crate::protocol`]);
//! docs/coming-from-prime-rl.md says what maps to what and what is refused.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The adapter's source, `examples/verifiers_env.py` as the binary was built with it.
pub const ADAPTER: &str = include_str!("../../../examples/verifiers_env.py");

/// The verifiers release whose classic API the adapter is written and checked against
/// (`scripts/check_verifiers_env.py`).
pub const SUPPORTED_VERSION: &str = "0.3.1";

/// The verifiers release whose `verifiers.v1` stack the adapter is written and checked against
/// (`scripts/check_verifiers_env.py`).
pub const SUPPORTED_V1_VERSION: &str = "0.4.0";

/// The adapter written out once per process: `$TMPDIR/rlvr-verifiers-PID-N/verifiers_env.py`, in
/// a directory of its own (mode 0700, created new), left for the restarts that run it again.
///
/// # Errors
/// The message of a directory that cannot be made or a file that cannot be written.
pub fn adapter_path() -> Result<PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        rlvr_reward::trl::write_adapter(
            "verifiers",
            "verifiers_env.py",
            ADAPTER,
            "verifiers environment",
        )
    })
    .clone()
}

/// The program that runs verifiers environment `env_id` with `python` (the interpreter that has
/// verifiers installed): `[python, ADAPTER_PATH]`, the adapter written out by [`adapter_path`].
/// Its `hello` options are [`hello_options`].
///
/// # Errors
/// As [`adapter_path`].
pub fn command(python: &str) -> Result<Vec<String>, String> {
    Ok(vec![
        python.to_string(),
        adapter_path()?.display().to_string(),
    ])
}

/// The adapter's `hello` options: `options` (the user's `env.options`, e.g. a v1 environment's
/// `env_config`) with `env_id` and `env_args` (0.3.1: the keyword arguments of the environment's
/// `load_environment`; v1: its taskset's config) added.
pub fn hello_options(
    options: crate::json::Json,
    env_id: &str,
    env_args: crate::json::Json,
) -> crate::json::Json {
    use crate::json::Json;
    let mut kv = match options {
        Json::Object(kv) => kv,
        _ => Vec::new(),
    };
    kv.retain(|(k, _)| k != "env_id" && k != "env_args");
    kv.push(("env_id".into(), Json::from(env_id)));
    kv.push(("env_args".into(), env_args));
    Json::Object(kv)
}
