//! `rlvr plot` (work in progress).
use std::io::Write;

/// `rlvr plot`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PlotArgs {}

/// Runs `rlvr plot`.
///
/// # Errors
/// Not implemented yet.
pub fn run_plot(_a: &PlotArgs, _out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::bail!("rlvr plot is not implemented yet")
}
