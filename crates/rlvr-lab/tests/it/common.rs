//! Helpers shared by the lab's tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The file's text; a missing file panics naming it.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Held shared by the tests that start child processes, alone by those that hold a flock in this
/// process (one_writer.rs). A flock is released only when every copy of its file description is
/// closed, and a child forked by another test thread holds a copy of the lock's descriptor until
/// it execs (close-on-exec): under load a dropped lock could still be held when the lab looks
/// again (seen once in a full `cargo test` at load 6, when one_writer.rs was a binary of its own).
static FORKS: RwLock<()> = RwLock::new(());

/// For a test that starts child processes.
pub fn forks() -> RwLockReadGuard<'static, ()> {
    FORKS.read().unwrap_or_else(|e| e.into_inner())
}

/// For a test that holds a flock in this process: no other test starts a child meanwhile.
pub fn no_forks() -> RwLockWriteGuard<'static, ()> {
    FORKS.write().unwrap_or_else(|e| e.into_inner())
}
