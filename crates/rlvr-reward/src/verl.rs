//! `kind = "verl"` verifiers: the adapter that runs reward functions written for verl's
//! `custom_reward_function` (`compute_score(data_source, solution_str, ground_truth,
//! extra_info=None)`; `examples/verl_rewards.py`, carried in the binary) and the file it is run
//! from, and the check of its `kwargs`.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::RewardError;

/// The adapter's source, `examples/verl_rewards.py` as the binary was built with it.
pub const ADAPTER: &str = include_str!("../../../examples/verl_rewards.py");

/// The function name used when `function` gives a file alone, as verl's
/// `custom_reward_function.name` defaults to it.
pub const DEFAULT_FUNCTION: &str = "compute_score";

/// The adapter written out once per process, as [`crate::trl::adapter_path`] writes TRL's:
/// `$TMPDIR/rlvr-verl-PID-N/verl_rewards.py` in a directory of its own (mode 0700, created new),
/// left for the processes that may restart from it.
///
/// # Errors
/// [`RewardError::Config`] when no such directory can be made or the file cannot be written.
pub fn adapter_path() -> Result<PathBuf, RewardError> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        crate::trl::write_adapter("verl", "verl_rewards.py", ADAPTER, "verl reward")
    })
    .clone()
    .map_err(RewardError::Config)
}

/// `function`'s file and function name: `FILE.py:NAME`, or `FILE.py` alone for
/// [`DEFAULT_FUNCTION`] (verl's `custom_reward_function.path` and `.name`). `None` when the file
/// or, after a `:`, the name is empty.
pub fn split_function(function: &str) -> Option<(&str, &str)> {
    let (file, name) = match function.rsplit_once(':') {
        // A `:` inside a directory name (`runs/a:b/reward.py`) is not a function name.
        Some((f, n)) if !n.contains('/') => (f, n),
        _ => (function, DEFAULT_FUNCTION),
    };
    (!file.is_empty() && !name.is_empty()).then_some((file, name))
}

/// The keyword arguments the adapter passes itself (verl's reward manager's): a `kwargs` entry
/// may not name them.
pub const PASSED_ARGUMENTS: [&str; 4] =
    ["data_source", "solution_str", "ground_truth", "extra_info"];

/// Checks a verl verifier's `kwargs` (verl's `custom_reward_function.reward_kwargs`) at `key`:
/// no entry names one of [`PASSED_ARGUMENTS`], and every value, however deep, is one Python
/// receives as written: not a TOML date or time (read from TOML as a table with a private key)
/// and not a NaN or an infinity (read as null, which TOML cannot hold).
///
/// # Errors
/// [`RewardError::Config`] naming the entry (`data.verifier.kwargs.when`) and what to write.
pub fn check_kwargs(
    key: &str,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), RewardError> {
    if let Some(name) = kwargs
        .keys()
        .find(|k| PASSED_ARGUMENTS.contains(&k.as_str()))
    {
        return Err(RewardError::Config(format!(
            "{key}.{name}: rlvr passes `{name}` itself, from the row (as verl's reward manager \
             does); give the function's other arguments here"
        )));
    }
    for (name, v) in kwargs {
        check_kwarg(&format!("{key}.{name}"), v)?;
    }
    Ok(())
}

fn check_kwarg(at: &str, v: &serde_json::Value) -> Result<(), RewardError> {
    use serde_json::Value;
    match v {
        Value::Null => Err(RewardError::Config(format!(
            "{at} is not a finite number (nan or inf): JSON, and so the adapter's arguments, \
             cannot carry it; write it as a string and convert it in the function"
        ))),
        Value::Object(m) if m.keys().any(|k| k.starts_with("$__toml_private")) => {
            Err(RewardError::Config(format!(
                "{at} is a TOML date or time: write it as a string (\"2024-01-01\")"
            )))
        }
        Value::Object(m) => m
            .iter()
            .try_for_each(|(k, x)| check_kwarg(&format!("{at}.{k}"), x)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| check_kwarg(&format!("{at}[{i}]"), x)),
        _ => Ok(()),
    }
}
