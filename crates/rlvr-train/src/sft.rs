//! `rlvr sft` (work in progress).
use std::io::Write;

/// `rlvr sft`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SftArgs {}

/// Runs `rlvr sft`.
///
/// # Errors
/// Not implemented yet.
pub fn run_sft(_a: &SftArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::bail!("rlvr sft is not implemented yet")
}
