//! The `rlvr` command-line tool.
fn main() {}
