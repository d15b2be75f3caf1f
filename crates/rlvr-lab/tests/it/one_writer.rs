//! One writer per run directory, for the lab too (issue 34): a run whose lock (`RUN/.lock`) another
//! process holds is neither moved aside as stale nor resumed; it is reported as a failure naming
//! the holder. The `rlvr` binary is replaced by a shell script that answers `--print-config` with
//! a fixed config and records every other start, so the test runs in milliseconds.

use std::fs::File;
use std::path::{Path, PathBuf};

use rlvr_lab::runner::run_sweep;
use rlvr_lab::sweep::Sweep;

use crate::common::no_forks;

const SWEEP: &str = r#"
[lab]
seeds = [0]
steps = 2
[warm_start]
model = "/nonexistent/model"
config = "/nonexistent/base.toml"
[[arm]]
name = "a"
preset = "grpo"
"#;

/// A fake `rlvr`: `--print-config` prints `lr = 2.0`; any other call appends its arguments to
/// `starts` and exits 0.
fn fake_rlvr(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let starts = dir.join("starts.txt");
    let exe = dir.join("fake-rlvr");
    std::fs::write(
        &exe,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --print-config ] && {{ printf '[train]\\nlr = 2.0\\n'; exit 0; }}; done\necho \"$*\" >> {}\nexit 0\n",
            starts.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    (exe, starts)
}

/// Holds `run`'s lock as a running `rlvr train` would: an `flock` on the directory, and its pid
/// line in `run/.lock`.
fn hold(run: &Path) -> File {
    std::fs::write(run.join(".lock"), "pid 4242\nhost testhost\nstarted now\n").unwrap();
    let f = File::open(run).unwrap();
    assert!(rlvr_rundir::lock::try_flock(&f).unwrap());
    f
}

fn setup(lr: &str) -> (tempfile::TempDir, Sweep, PathBuf, PathBuf, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (exe, starts) = fake_rlvr(tmp.path());
    let out = tmp.path().join("lab");
    let run = out.join("a/seed-0");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("config.toml"), format!("[train]\nlr = {lr}\n")).unwrap();
    let sweep = Sweep::parse(SWEEP).unwrap();
    (tmp, sweep, out, run, exe, starts)
}

#[test]
fn a_held_stale_run_is_not_moved_aside() {
    let _alone = no_forks(); // no test forks while this one holds a flock
                             // lr 1.0 on disk, 2.0 today: stale. Unheld, the lab moves it aside (checked below).
    let (_tmp, sweep, out, run, exe, starts) = setup("1.0");
    let lock = hold(&run);
    let o = run_sweep(&sweep, &out, &exe, 1).unwrap();
    assert_eq!((o.busy, o.stale, o.started), (1, 0, 0), "{o:?}");
    assert_eq!(o.failures.len(), 1, "{o:?}");
    let f = &o.failures[0];
    assert!(
        f.contains("is in use by another rlvr process")
            && f.contains("pid 4242")
            && f.contains(&run.display().to_string()),
        "{f}"
    );
    assert!(run.join("config.toml").is_file(), "the held run was moved");
    assert!(!starts.exists(), "a child was started on a held run");
    // Released: the same lab moves it aside and reruns it.
    drop(lock);
    let o = run_sweep(&sweep, &out, &exe, 1).unwrap();
    assert_eq!((o.busy, o.stale, o.started), (0, 1, 1), "{o:?}");
    assert!(o.failures.is_empty(), "{o:?}");
    assert!(!run.join("config.toml").exists());
}

#[test]
fn a_held_unfinished_run_is_not_resumed() {
    let _alone = no_forks(); // no test forks while this one holds a flock
                             // Not stale: unheld, the lab resumes it (checked below).
    let (_tmp, sweep, out, run, exe, starts) = setup("2.0");
    let lock = hold(&run);
    let o = run_sweep(&sweep, &out, &exe, 1).unwrap();
    assert_eq!((o.busy, o.started), (1, 0), "{o:?}");
    assert!(!starts.exists(), "a child was started on a held run");
    drop(lock);
    let o = run_sweep(&sweep, &out, &exe, 1).unwrap();
    assert_eq!((o.busy, o.started), (0, 1), "{o:?}");
    let s = std::fs::read_to_string(&starts).unwrap();
    assert!(s.contains("--resume"), "{s}");
}
