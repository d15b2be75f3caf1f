//! Running a launcher (`mpirun`) with a deadline, for tests and benchmarks.
//!
//! Open MPI 4.1.4's `mpirun` sometimes never exits after a job ends by `MPI_Abort` while a rank
//! had already finalised: every rank process has exited (a zombie, never reaped) and `mpirun`
//! sleeps. Seen here in 1 of 36 such jobs on a loaded 2-core machine, and in CI, where it held
//! the run until CI's own limit. [`output_watched`] runs the command in its own process group and
//! ends it after a deadline; when `mpirun` outlives all its ranks it is ended early, and the
//! result carries the ranks' own exit statuses, read from `/proc/PID/stat` (Linux), so that a
//! caller still sees how each rank ended.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long every child of the launcher must have been a zombie before the launcher counts as
/// hung (a healthy `mpirun` reaps its ranks and exits within a second or two).
pub const ZOMBIE_GRACE: Duration = Duration::from_secs(10);

/// What [`output_watched`] saw.
#[derive(Debug)]
pub struct Watched {
    /// The launcher's output. When it hung (below), `status` is the first failing rank's exit
    /// status (a success when every rank exited 0) and stderr ends with a line that says so.
    pub output: Output,
    /// Wall time from spawn to the end of the job: the launcher's exit or, when it hung, the first
    /// poll (every 100 ms) that saw all its processes exited.
    pub took: Duration,
    /// `Some(statuses)` when the launcher outlived all its ranks by [`ZOMBIE_GRACE`] and was
    /// killed: each rank's raw wait status (as `waitpid` reports it), in process-id order.
    pub hung: Option<Vec<i32>>,
    /// The deadline passed with a rank still running: the whole process group was killed.
    pub timed_out: bool,
}

/// Spawns `cmd` (stdout and stderr captured, stdin closed) in a new process group and waits for it
/// for at most `limit`; then, or when the launcher outlived its ranks by [`ZOMBIE_GRACE`], kills
/// the process group with SIGKILL.
///
/// # Errors
/// The command cannot be spawned.
pub fn output_watched(cmd: &mut Command, limit: Duration) -> std::io::Result<Watched> {
    let t0 = Instant::now();
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let reader = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = reader(child.stdout.take().map(|s| Box::new(s) as _));
    let err = reader(child.stderr.take().map(|s| Box::new(s) as _));
    let mut all_zombies_since: Option<Instant> = None;
    let mut hung = None;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let kids = children(pid);
        if !kids.is_empty() && kids.iter().all(|k| k.zombie) {
            let since = *all_zombies_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= ZOMBIE_GRACE {
                hung = Some(kids.iter().map(|k| k.exit_code).collect::<Vec<_>>());
            }
        } else {
            all_zombies_since = None;
        }
        if t0.elapsed() >= limit {
            timed_out = true;
        }
        if hung.is_some() || timed_out {
            kill_group(pid);
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = match (&hung, all_zombies_since) {
        (Some(_), Some(since)) => since - t0,
        _ => t0.elapsed(),
    };
    // A rank that outlived a killed group could hold the pipes open; the group is gone here.
    let stdout = out.join().unwrap_or_default();
    let mut stderr = err.join().unwrap_or_default();
    let status = match &hung {
        Some(codes) => {
            stderr.extend_from_slice(
                format!(
                    "\nrlvr-dist watch: the launcher did not exit {} s after its {} processes \
                     had (wait statuses {codes:?}); killed it\n",
                    ZOMBIE_GRACE.as_secs(),
                    codes.len()
                )
                .as_bytes(),
            );
            ExitStatus::from_raw(codes.iter().copied().find(|&c| c != 0).unwrap_or(0))
        }
        None => status,
    };
    if timed_out {
        stderr.extend_from_slice(
            format!(
                "\nrlvr-dist watch: still running after {} s; killed its process group\n",
                limit.as_secs()
            )
            .as_bytes(),
        );
    }
    Ok(Watched {
        output: Output {
            status,
            stdout,
            stderr,
        },
        took,
        hung,
        timed_out,
    })
}

struct Kid {
    zombie: bool,
    exit_code: i32,
}

/// The direct children of `parent`, in process-id order (empty where /proc cannot be read).
fn children(parent: u32) -> Vec<Kid> {
    let mut kids: Vec<(u32, Kid)> = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((ppid, kid)) = parse_stat(&stat) {
            if ppid == parent {
                kids.push((pid, kid));
            }
        }
    }
    kids.sort_by_key(|(p, _)| *p);
    kids.into_iter().map(|(_, k)| k).collect()
}

/// `/proc/PID/stat` (proc(5)): after the command name in parentheses, field 3 is the state,
/// field 4 the parent's id and field 52 the exit status (Linux ≥ 3.5; 0 where absent).
fn parse_stat(stat: &str) -> Option<(u32, Kid)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let exit_code = f.get(49).and_then(|s| s.parse().ok()).unwrap_or(0);
    Some((
        ppid,
        Kid {
            zombie: *f.first()? == "Z",
            exit_code,
        },
    ))
}

fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_with_spaces_in_the_name() {
        let mut s = String::from("4242 (rlvr dist) check) Z 4200");
        for i in 5..=51 {
            s.push_str(&format!(" {i}"));
        }
        s.push_str(" 768");
        let (ppid, k) = parse_stat(&s).unwrap();
        assert_eq!(ppid, 4200);
        assert!(k.zombie);
        assert_eq!(k.exit_code, 768);
    }

    #[test]
    fn a_launcher_that_outlives_its_children_is_ended_with_their_statuses() {
        // A shell that starts two children exiting 0 and 3, never reaps them, and sleeps: the
        // children become zombies (exec replaces the shell with sleep, which never waits).
        let mut c = Command::new("sh");
        c.args(["-c", "sh -c 'exit 0' & sh -c 'exit 3' & exec sleep 60"]);
        let w = output_watched(&mut c, Duration::from_secs(40)).unwrap();
        let codes = w.hung.expect("the launcher must count as hung");
        assert_eq!(codes.len(), 2, "{codes:?}");
        assert!(codes.contains(&(3 << 8)) && codes.contains(&0), "{codes:?}");
        assert_eq!(w.output.status.code(), Some(3));
        assert!(!w.timed_out);
        assert!(w.took < Duration::from_secs(5), "{:?}", w.took);
        assert!(String::from_utf8_lossy(&w.output.stderr).contains("did not exit"));
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_and_a_normal_one_is_not() {
        let w = output_watched(
            Command::new("sh").args(["-c", "echo hi; sleep 30"]),
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(w.timed_out && w.hung.is_none() && !w.output.status.success());
        assert_eq!(String::from_utf8_lossy(&w.output.stdout), "hi\n");
        assert!(w.took < Duration::from_secs(10));
        let w = output_watched(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 5"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(!w.timed_out && w.hung.is_none());
        assert_eq!(w.output.status.code(), Some(5));
        assert_eq!(String::from_utf8_lossy(&w.output.stdout), "out\n");
        assert_eq!(String::from_utf8_lossy(&w.output.stderr), "err\n");
    }
}
