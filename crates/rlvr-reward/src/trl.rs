//! `kind = "python"` verifiers: the adapter that runs reward functions written for TRL's
//! GRPOTrainer (`examples/trl_rewards.py`, carried in the binary) and the file it is run from.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::RewardError;

/// The adapter's source, `examples/trl_rewards.py` as the binary was built with it.
pub const ADAPTER: &str = include_str!("../../../examples/trl_rewards.py");

/// The adapter written out once per process, in a directory of its own that only this user can
/// read (`$TMPDIR/rlvr-trl-PID-N/trl_rewards.py`, mode 0700, created new: a directory someone
/// else made first is never used). Python runs it from there; the directory (10 kB) is left for
/// the processes that may restart from it and is not removed at exit.
///
/// # Errors
/// [`RewardError::Config`] when no such directory can be made or the file cannot be written.
pub fn adapter_path() -> Result<PathBuf, RewardError> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| write_adapter("trl", "trl_rewards.py", ADAPTER, "TRL reward"))
        .clone()
        .map_err(RewardError::Config)
}

/// Writes `source` to `$TMPDIR/rlvr-TAG-PID-N/FILE` in a directory made new, mode 0700 (see
/// [`adapter_path`]); `peer` names the adapter in errors (`TRL reward`, `verl reward`,
/// `verifiers environment`).
///
/// # Errors
/// The message of a directory that cannot be made (100 names taken) or a file that cannot be
/// written, naming the path.
pub fn write_adapter(tag: &str, file: &str, source: &str, peer: &str) -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    let pid = std::process::id();
    for n in 0..100 {
        let dir = base.join(format!("rlvr-{tag}-{pid}-{n}"));
        let mut b = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        match b.create(&dir) {
            Ok(()) => {
                let file = dir.join(file);
                std::fs::write(&file, source).map_err(|e| {
                    format!("writing the {peer} adapter to {}: {e}", file.display())
                })?;
                return Ok(file);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(format!(
                    "making a directory for the {peer} adapter in {}: {e}",
                    base.display()
                ))
            }
        }
    }
    Err(format!(
        "making a directory for the {peer} adapter in {}: 100 names taken",
        base.display()
    ))
}
