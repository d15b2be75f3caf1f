//! The MPI checks with real processes: `check/mpi_check.rs` under
//! `mpirun --allow-run-as-root --oversubscribe -np N` (N = 2, and 3 for an uneven split).
//! Built only with the `mpi` feature (`scripts/ci_mpi.sh`); needs `mpirun` on PATH, or `MPIRUN`.

use std::process::{Command, Output};
use std::time::Duration;

/// The collective timeout the failure cases run with, in seconds.
const TIMEOUT_S: u64 = 4;

/// Runs the check under mpirun: its output, how long the job took, and whether mpirun outlived
/// its ranks and was ended by the watch.
fn mpirun(np: usize, case: &str, timeout_s: Option<u64>) -> (Output, Duration, bool) {
    let launcher = std::env::var("MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(&launcher);
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
    ])
    .arg(np.to_string())
    .arg(env!("CARGO_BIN_EXE_rlvr-dist-check"))
    .args(["--case", case])
    // A stray override in the caller's environment would contradict mpirun's variables.
    .env_remove("RLVR_RANK")
    .env_remove("RLVR_WORLD_SIZE");
    match timeout_s {
        Some(t) => cmd.env("RLVR_DIST_TIMEOUT_S", t.to_string()),
        None => cmd.env_remove("RLVR_DIST_TIMEOUT_S"),
    };
    // Every case ends well within this; Open MPI's mpirun that outlives its ranks is ended
    // earlier (rlvr_dist::watch), with the ranks' own exit statuses.
    let w =
        rlvr_dist::watch::output_watched(&mut cmd, Duration::from_secs(180)).unwrap_or_else(|e| {
            panic!("cannot run {launcher} (install openmpi-bin, or set MPIRUN): {e}")
        });
    assert!(
        !w.timed_out,
        "mpirun -np {np} --case {case} hung: {}",
        text(&w.output)
    );
    if let Some(codes) = &w.hung {
        eprintln!("np {np} {case}: mpirun outlived its ranks (wait statuses {codes:?}); ended");
    }
    let hung = w.hung.is_some();
    (w.output, w.took, hung)
}

/// The bound on a job that mpirun should end at once: [`TIMEOUT_S`]; where mpirun hung (the
/// watch ended it) the other ranks may have had to time out themselves and report first.
fn ended_within(hung: bool) -> u64 {
    if hung {
        TIMEOUT_S + rlvr_dist::comm::REPORT_GRACE.as_secs() + 20
    } else {
        TIMEOUT_S
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn collectives(np: usize) {
    let (out, took, _) = mpirun(np, "collectives", Some(60));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for r in 0..np {
        assert!(
            t.contains(&format!("rank {r}: ok (")),
            "rank {r} did not report: {t}"
        );
    }
    eprintln!("np {np}: collectives in {:.1} s", took.as_secs_f64());
}

#[test]
fn collectives_on_two_ranks() {
    collectives(2);
}

#[test]
fn collectives_on_three_ranks() {
    collectives(3);
}

#[test]
fn init_picks_mpi_under_mpirun_and_local_without() {
    let (out, _, _) = mpirun(2, "init", None);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("rank 1: ok (init: rank 1 of 2, local rank 1 (from OMPI_COMM_WORLD_RANK))"),
        "{t}"
    );
    // Without a launcher: a world of 1, no MPI initialised.
    let out = Command::new(env!("CARGO_BIN_EXE_rlvr-dist-check"))
        .args(["--case", "init"])
        .env_remove("RLVR_RANK")
        .env_remove("RLVR_WORLD_SIZE")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(
        out.status.success() && t.contains("rank 0: ok (init: rank 0 of 1, local rank 0)"),
        "{t}"
    );
}

#[test]
fn a_layout_mismatch_is_an_error_on_every_rank() {
    let (out, _, _) = mpirun(2, "mismatch", Some(30));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches("mismatch detected").count(), 2, "{t}");
}

#[test]
fn a_rank_that_hangs_makes_the_others_abort_naming_it() {
    for np in [2, 3] {
        let (out, took, _) = mpirun(np, "hang", Some(TIMEOUT_S));
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        let last = np - 1;
        assert!(
            t.contains(&format!("did not complete within {TIMEOUT_S} s"))
                && t.contains(&format!("waiting for rank(s) {last} (no answer")),
            "np {np}: {t}"
        );
        // The other ranks know each other are in the same collective.
        if np == 3 {
            assert!(t.contains("in this collective: rank(s) 0, 1"), "{t}");
        }
        let bound = TIMEOUT_S + rlvr_dist::comm::REPORT_GRACE.as_secs() + 20;
        assert!(
            took >= Duration::from_secs(TIMEOUT_S) && took < Duration::from_secs(bound),
            "np {np}: took {took:?}, expected between {TIMEOUT_S} and {bound} s: {t}"
        );
        eprintln!("np {np}: hang detected in {:.1} s", took.as_secs_f64());
    }
}

#[test]
fn a_rank_that_exits_early_ends_the_job_naming_it() {
    for np in [2, 3] {
        let last = np - 1;
        // exit(3): mpirun ends the job at once; its report names the process as [[job,1],rank].
        let (out, took, hung) = mpirun(np, "exit-early", Some(TIMEOUT_S));
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        // mpirun's report, unless mpirun hung (then the watch names the ranks' statuses, the
        // last rank's exit code 3 among them).
        assert!(
            if hung {
                t.contains(&format!("{}", 3 << 8))
            } else {
                t.lines().any(|l| {
                    let l = l.trim();
                    l.starts_with("Process name: [[") && l.ends_with(&format!(",1],{last}]"))
                }) && t.contains("Exit code:    3")
            },
            "np {np}: mpirun's report does not name rank {last}: {t}"
        );
        assert!(
            took < Duration::from_secs(ended_within(hung)),
            "exit-early took {took:?}: {t}"
        );
        eprintln!(
            "np {np}: exit-early ended the job in {:.1} s",
            took.as_secs_f64()
        );
        // A panic: that rank aborts the job itself, naming itself.
        let (out, took, hung) = mpirun(np, "panic", Some(TIMEOUT_S));
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(
            t.contains(&format!("rlvr-dist: rank {last} of {np} panicked")),
            "np {np}: {t}"
        );
        assert!(
            took < Duration::from_secs(ended_within(hung)),
            "panic took {took:?}: {t}"
        );
        eprintln!(
            "np {np}: panic ended the job in {:.1} s",
            took.as_secs_f64()
        );
        // MPI_Finalize and exit 0: mpirun waits for the others, whose timeout names the rank.
        let (out, took, _) = mpirun(np, "finalize-early", Some(TIMEOUT_S));
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(
            t.contains(&format!("waiting for rank(s) {last} (no answer")),
            "np {np}: {t}"
        );
        let bound = TIMEOUT_S + rlvr_dist::comm::REPORT_GRACE.as_secs() + 20;
        assert!(
            took < Duration::from_secs(bound),
            "finalize-early took {took:?}: {t}"
        );
        eprintln!(
            "np {np}: finalize-early ended the job in {:.1} s",
            took.as_secs_f64()
        );
    }
}
