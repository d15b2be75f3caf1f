//! `kind = "verl"` verifiers: the adapter that runs reward functions written for verl's
//! `custom_reward_function` (`compute_score(data_source, solution_str, ground_truth,
//! extra_info=None)`; `examples/verl_rewards.py`, carried in the binary) and the file it is run
//! from.

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
