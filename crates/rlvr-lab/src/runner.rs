//! Runs a sweep's warm starts and runs as child processes of the same `rlvr` binary.
//!
//! - At most `jobs` children at once, each with `RAYON_NUM_THREADS = [lab].threads`, so a run's
//!   numbers do not depend on `--jobs`.
//! - Children die with the lab: they stay in the lab's process group (a terminal's Ctrl-C and
//!   `kill -- -PGID` reach every one), each asks the kernel for `SIGKILL` when the lab dies
//!   (`prctl(PR_SET_PDEATHSIG)`, Linux; it covers `kill -9` of the lab), and on `SIGINT`, `SIGTERM`
//!   or `SIGHUP` the lab sends its runs SIGTERM (each saves its current step and exits, as `rlvr
//!   train` does), kills the ones left after [`STOP_GRACE`] or a second signal, and exits with
//!   128 + the signal (130, 143, 129).
//! - Resume: a run is finished when RUN/lab.json says `"done": true` (written after `rlvr train`
//!   exits 0) and is then never rerun; an unfinished run with a RUN/config.toml continues with
//!   `rlvr train --resume RUN` from its latest checkpoint (`[lab].save_every`); a warm start is
//!   finished when its `warm_start.json` exists.
//! - Stale runs: before keeping or resuming a run that has a RUN/config.toml, the lab asks the
//!   binary it will use what the sweep resolves to today (`rlvr train ... --print-config`) and
//!   compares it with that file (as TOML values). A run whose config differs (a preset or a default
//!   changed, the sweep file was edited, its warm start is gone) is moved aside to
//!   `seed-N.stale-UNIXSECS` (nothing is deleted) and rerun from scratch.
//! - One writer: a run directory whose lock (an `flock` on the directory, which every `rlvr train` holds for
//!   its whole life) is held by another process (an `rlvr train` started by hand, or another lab
//!   on the same directory) is left alone: it is neither moved aside nor resumed, and it is listed
//!   in [`Outcome::failures`] with the holder's pid, so the lab exits non-zero. The lab holds the
//!   lock itself while it checks and moves a run aside, and releases it just before it starts the
//!   run's child (which then takes it, waiting up to two seconds for a busy lock).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rlvr_rundir::lock::RunLock;

use crate::sweep::{RunSpec, Sweep};

static SIGNALLED: AtomicI32 = AtomicI32::new(0);
/// Signals received (a second one stops the children at once).
static SIGNALS: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    let _ = SIGNALLED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// How long the lab waits, after a signal, for its runs to save their current step and exit (as
/// `rlvr train` does on SIGTERM) before it kills them.
pub const STOP_GRACE: Duration = Duration::from_secs(300);

/// The lab stopped because of a signal, after its runs saved and exited (or were killed after
/// [`STOP_GRACE`] or a second signal): `rlvr` exits with 128 + `signal` (130 for SIGINT, 143 for
/// SIGTERM, 129 for SIGHUP).
#[derive(Debug)]
pub struct Interrupted {
    /// The signal's number.
    pub signal: i32,
    /// What happened to the runs.
    pub message: String,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Interrupted {}

/// Sends SIGTERM to `child` (an `rlvr train` saves its current step and exits 143).
fn terminate(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on the pid of a child this process has not reaped yet (so the pid is
        // still ours), with a valid signal number.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores into an atomic (async-signal-safe).
        #[allow(unsafe_code)]
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// A run's lab record, RUN/lab.json.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// `rlvr train` exited 0: the run is complete and is never rerun.
    pub done: bool,
    /// Wall seconds over every attempt (a resumed run adds up).
    pub wall_s: f64,
    /// Children started for this run (1 + resumes).
    pub attempts: u32,
    /// Exit status of the last finished attempt.
    pub exit: Option<i32>,
}

impl RunRecord {
    /// Reads RUN/lab.json (a missing or unreadable file is a fresh record).
    pub fn read(run_dir: &Path) -> RunRecord {
        std::fs::read_to_string(run_dir.join("lab.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }

    fn write(&self, run_dir: &Path) -> anyhow::Result<()> {
        let path = run_dir.join("lab.json");
        let tmp = run_dir.join(".lab.json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)? + "\n")?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }
}

/// One unit of work.
#[derive(Debug, Clone)]
enum Task {
    Warm(u64),
    Run(RunSpec),
}

struct Running {
    task: Task,
    child: Child,
    started: Instant,
    prev_wall: f64,
    record: RunRecord,
    last_write: Instant,
}

/// What [`run_sweep`] did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Tasks that failed, with the reason (the sweep went on without them).
    pub failures: Vec<String>,
    /// Runs skipped because they were already finished.
    pub kept: usize,
    /// Children started.
    pub started: usize,
    /// Runs whose config.toml no longer matched the sweep: moved aside and rerun.
    pub stale: usize,
    /// Runs left alone because another process held their lock (also in `failures`).
    pub busy: usize,
}

/// The lab's hold on a run directory's lock (rlvr-rundir's [`RunLock`], the one `rlvr train`
/// takes); released when dropped.
pub type RunHold = RunLock;

/// Takes the lock of the existing run directory `dir` without waiting ([`RunLock::try_hold`]):
/// `Ok(Ok(hold))` when it was free, `Ok(Err(holder))` when another process holds it (`holder`:
/// what that process wrote in `RUN/.lock`, e.g. `pid 123, host h, started …`).
///
/// # Errors
/// Opening the directory, or a locking error other than "held".
pub fn try_hold(dir: &Path) -> anyhow::Result<Result<RunHold, String>> {
    RunLock::try_hold(dir)
}

/// The failure line of a run left alone because `holder` holds its lock.
fn busy_line(name: &str, dir: &Path, holder: &str) -> String {
    format!(
        "{name}: {} is in use by another rlvr process ({holder}); left alone (not moved aside, not \
         resumed): wait for that process to finish or stop it, then rerun the lab",
        dir.display()
    )
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Why the run `r` under `out` no longer matches what `sweep` resolves to with `exe` today, or
/// `None` when it matches or has no RUN/config.toml yet (a new run).
///
/// The comparison is between RUN/config.toml and `exe train <the run's arguments> --print-config`,
/// both parsed as TOML, so formatting does not matter; a run that cannot be resolved today (its
/// warm start is missing) is stale too.
///
/// # Errors
/// Starting `exe`, or reading a config.toml that exists.
pub fn stale(sweep: &Sweep, out: &Path, exe: &Path, r: &RunSpec) -> anyhow::Result<Option<String>> {
    let dir = sweep.run_dir(out, r);
    let path = dir.join(rlvr_rundir::files::CONFIG);
    if !path.exists() {
        return Ok(None);
    }
    let old_text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut args = sweep.train_args(out, r);
    args.push("--print-config".into());
    let o = Command::new(exe)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {} {}", exe.display(), args.join(" ")))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Ok(Some(format!(
            "its config cannot be resolved today ({})",
            first.trim()
        )));
    }
    let new_text = String::from_utf8_lossy(&o.stdout);
    let old: toml::Value = match toml::from_str(&old_text) {
        Ok(v) => v,
        Err(e) => return Ok(Some(format!("{} does not parse: {e}", path.display()))),
    };
    let new: toml::Value = toml::from_str(&new_text)
        .with_context(|| format!("parsing the output of {} --print-config", exe.display()))?;
    let unread: Vec<&str> = new_text
        .lines()
        .filter_map(|l| l.strip_prefix(UNREAD_COMMENT))
        .flat_map(|keys| keys.split(", "))
        .collect();
    Ok(first_difference(
        "",
        &old,
        &new,
        &out.display().to_string(),
        &unread,
    ))
}

/// The start of the comment line of `rlvr train --print-config` that lists the knobs it left
/// out because nothing reads them with the run's options (rlvr-train's
/// `config::gates::UNREAD_COMMENT`). A config.toml written before such knobs were left out holds
/// them; they are no difference.
pub const UNREAD_COMMENT: &str = "# Not read with these options, so left out: ";

/// The first key (dotted path, in sorted order) whose value differs between `old` and `new`,
/// described as `config key K was A, is now B`. A path inside the lab directory `lab` (the warm
/// start's model and data, the run's own directory) matches an old path with the same ending, so
/// a lab directory that was moved or copied is not rerun. A key of `unread` (dotted) that only
/// `old` holds is no difference: today's config leaves it out because nothing reads it.
fn first_difference(
    prefix: &str,
    old: &toml::Value,
    new: &toml::Value,
    lab: &str,
    unread: &[&str],
) -> Option<String> {
    use toml::Value::{String as S, Table};
    match (old, new) {
        (S(a), S(b)) if b.starts_with(lab) && a.ends_with(&b[lab.len()..]) => None,
        (Table(a), Table(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => first_difference(&key, x, y, lab, unread),
                    (Some(_), None) if unread.contains(&key.as_str()) => None,
                    (x, y) => Some(format!(
                        "config key {key} was {}, is now {}",
                        x.map_or("unset".into(), |v| v.to_string()),
                        y.map_or("unset".into(), |v| v.to_string())
                    )),
                }
            })
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!("config key {prefix} was {a}, is now {b}")),
    }
}

fn warm_done(out: &Path, seed: u64) -> bool {
    Sweep::warm_dir(out, seed).join("warm_start.json").exists()
}

fn log_file(path: &Path) -> anyhow::Result<(Stdio, Stdio)> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok((Stdio::from(f.try_clone()?), Stdio::from(f)))
}

/// Spawns `exe args` with the pinned thread count, its output appended to `log`, and the
/// parent-death signal set.
fn spawn(exe: &Path, args: &[String], threads: usize, log: &Path) -> anyhow::Result<Child> {
    use std::os::unix::process::CommandExt;
    let (o, e) = log_file(log)?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .stdin(Stdio::null())
        .stdout(o)
        .stderr(e);
    let lab_pid = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The lab died between fork and prctl: no signal will come, so go now.
            if libc::getppid() != lab_pid {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {} {}", exe.display(), args.join(" ")))
}

/// Steps a run directory's metrics.jsonl has reached (its last line's `step`), 0 if none.
pub fn steps_reached(run_dir: &Path) -> u64 {
    rlvr_rundir::jsonl::last_step(run_dir)
}

fn task_name(sweep: &Sweep, t: &Task) -> String {
    match t {
        Task::Warm(s) => format!("warm start seed {s}"),
        Task::Run(r) => format!("{} seed {}", sweep.arms[r.arm].name, r.seed),
    }
}

fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// Runs every unfinished warm start and run of `sweep` under `out` with `exe` (the `rlvr` binary),
/// at most `jobs` at once, with a progress display on stderr.
///
/// # Errors
/// I/O errors of the lab itself, and an interruption by a signal (after the children are killed;
/// rerunning the same command resumes). A failing child is not an error here: it is listed in
/// [`Outcome::failures`].
// One function: the scheduler's event loop (signals, starts, reaping, progress), whose steps all
// read and change the same queue and running set.
pub fn run_sweep(sweep: &Sweep, out: &Path, exe: &Path, jobs: usize) -> anyhow::Result<Outcome> {
    install_signal_handlers();
    let mut outcome = Outcome::default();
    let mut queue: Vec<Task> = Vec::new();
    if sweep.uses_quickstart() {
        for &s in &sweep.lab.seeds {
            if !warm_done(out, s) {
                queue.push(Task::Warm(s));
            }
        }
    }
    let all = sweep.runs();
    for r in &all {
        let dir = sweep.run_dir(out, r);
        // One writer: hold the run's lock while deciding (and moving it aside); a held one is
        // another process's run and is left alone.
        let _hold = if dir.is_dir() {
            match try_hold(&dir)? {
                Ok(h) => Some(h),
                Err(holder) => {
                    let name = task_name(sweep, &Task::Run(r.clone()));
                    eprintln!("lab: {}", busy_line(&name, &dir, &holder));
                    outcome.failures.push(busy_line(&name, &dir, &holder));
                    outcome.busy += 1;
                    continue;
                }
            }
        } else {
            None
        };
        if let Some(why) = stale(sweep, out, exe, r)? {
            let aside = dir.with_extension(format!("stale-{}", unix_secs()));
            std::fs::rename(&dir, &aside)
                .with_context(|| format!("moving the stale run {} aside", dir.display()))?;
            eprintln!(
                "lab: rerunning {} seed {} from scratch: {why}; the old run is now {}",
                sweep.arms[r.arm].name,
                r.seed,
                aside.display()
            );
            outcome.stale += 1;
        }
        if RunRecord::read(&dir).done {
            outcome.kept += 1;
        } else {
            queue.push(Task::Run(r.clone()));
        }
    }
    let total = queue.len();
    let pb = Display::new(total as u64);
    let mut failed_seeds: Vec<u64> = Vec::new();
    let mut running: Vec<Running> = Vec::new();
    let mut done = 0usize;
    let mut rate = sweep.lab.seconds_per_step;
    let (mut measured_s, mut measured_steps) = (0.0, 0u64);
    loop {
        if let sig @ 1.. = SIGNALLED.load(Ordering::SeqCst) {
            // Each run saves its current step and exits, as `rlvr train` does on SIGTERM (the
            // lab used to SIGKILL them, mid-save); a second signal, or STOP_GRACE, kills the rest.
            let signals = SIGNALS.load(Ordering::SeqCst);
            for r in &running {
                terminate(&r.child);
            }
            let t0 = Instant::now();
            let mut killed = 0usize;
            while running
                .iter_mut()
                .any(|r| matches!(r.child.try_wait(), Ok(None)))
            {
                if t0.elapsed() > STOP_GRACE || SIGNALS.load(Ordering::SeqCst) > signals {
                    for r in &mut running {
                        if matches!(r.child.try_wait(), Ok(None)) {
                            let _ = r.child.kill();
                            killed += 1;
                        }
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            for mut r in running.drain(..) {
                let _ = r.child.wait();
                if let Task::Run(spec) = &r.task {
                    r.record.wall_s = r.prev_wall + r.started.elapsed().as_secs_f64();
                    let _ = r.record.write(&sweep.run_dir(out, spec));
                }
            }
            pb.bar.abandon();
            let how = match killed {
                0 => "the runs saved their current step and stopped".to_string(),
                n => format!(
                    "{n} run(s) did not stop within {} s or a second signal came, and were killed \
                     (they resume from their last checkpoint)",
                    STOP_GRACE.as_secs()
                ),
            };
            return Err(Interrupted {
                signal: sig,
                message: format!(
                    "interrupted by signal {sig}: {how}; rerun the same command to resume"
                ),
            }
            .into());
        }
        // Start what may start: runs wait for their seed's warm start.
        let mut i = 0;
        while running.len() < jobs && i < queue.len() {
            let ready = match &queue[i] {
                Task::Warm(_) => true,
                Task::Run(r) => !sweep.uses_quickstart() || warm_done(out, r.seed),
            };
            let blocked = match &queue[i] {
                Task::Run(r) => failed_seeds.contains(&r.seed),
                Task::Warm(_) => false,
            };
            if blocked {
                let t = queue.remove(i);
                outcome
                    .failures
                    .push(format!("{}: its warm start failed", task_name(sweep, &t)));
                done += 1;
                continue;
            }
            if !ready {
                i += 1;
                continue;
            }
            let task = queue.remove(i);
            if let Task::Run(spec) = &task {
                let dir = sweep.run_dir(out, spec);
                if dir.is_dir() {
                    if let Err(holder) = try_hold(&dir)? {
                        // Taken since the plan was made: leave it to its holder.
                        let line = busy_line(&task_name(sweep, &task), &dir, &holder);
                        pb.println(line.clone());
                        outcome.failures.push(line);
                        outcome.busy += 1;
                        done += 1;
                        continue;
                    }
                }
            }
            running.push(start(sweep, out, exe, task)?);
            outcome.started += 1;
            let r = running.last().expect("just pushed");
            pb.println(format!("start {}", task_name(sweep, &r.task)));
        }
        if running.is_empty() && queue.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        // Reap finished children.
        let mut k = 0;
        while k < running.len() {
            let status = running[k].child.try_wait()?;
            let Some(status) = status else {
                let r = &mut running[k];
                if let Task::Run(spec) = &r.task {
                    if r.last_write.elapsed() > Duration::from_secs(5) {
                        r.record.wall_s = r.prev_wall + r.started.elapsed().as_secs_f64();
                        r.record.write(&sweep.run_dir(out, spec))?;
                        r.last_write = Instant::now();
                    }
                }
                k += 1;
                continue;
            };
            let mut r = running.remove(k);
            let secs = r.started.elapsed().as_secs_f64();
            done += 1;
            let name = task_name(sweep, &r.task);
            match &r.task {
                Task::Run(spec) => {
                    let dir = sweep.run_dir(out, spec);
                    r.record.wall_s = r.prev_wall + secs;
                    r.record.exit = status.code();
                    r.record.done = status.success();
                    r.record.write(&dir)?;
                    if status.success() {
                        measured_s += secs;
                        measured_steps += sweep.lab.steps;
                        rate = measured_s / measured_steps as f64;
                    } else {
                        outcome.failures.push(format!(
                            "{name}: rlvr train exited with {status}; see {}",
                            dir.join("lab.log").display()
                        ));
                    }
                }
                Task::Warm(seed) => {
                    if !status.success() || !warm_done(out, *seed) {
                        failed_seeds.push(*seed);
                        outcome.failures.push(format!(
                            "{name}: rlvr quickstart exited with {status}; see {}",
                            Sweep::warm_dir(out, *seed).with_extension("log").display()
                        ));
                    }
                }
            }
            pb.println(format!("done  {name} ({secs:.0} s, {status})"));
        }
        // Progress: done / running / left, and the time left at the measured rate.
        let mut steps_left = 0u64;
        for t in &queue {
            if let Task::Run(r) = t {
                steps_left +=
                    sweep.lab.steps - steps_reached(&sweep.run_dir(out, r)).min(sweep.lab.steps);
            }
        }
        let mut warm_left = queue.iter().filter(|t| matches!(t, Task::Warm(_))).count();
        for r in &running {
            match &r.task {
                Task::Run(s) => {
                    steps_left +=
                        sweep.lab.steps - steps_reached(&sweep.run_dir(out, s)).min(sweep.lab.steps)
                }
                Task::Warm(_) => warm_left += 1,
            }
        }
        let left_s = (steps_left as f64 * rate + warm_left as f64 * sweep.warm_start.seconds)
            / jobs.max(1) as f64;
        pb.status(
            done as u64,
            format!(
                "done {done}, running {}, left {} (+{} kept) ~{} left",
                running.len(),
                queue.len(),
                outcome.kept,
                fmt_secs(left_s)
            ),
        );
    }
    pb.bar.finish();
    Ok(outcome)
}

/// The progress display: an indicatif bar on a terminal, plain `lab:` lines otherwise.
struct Display {
    bar: indicatif::ProgressBar,
    terminal: bool,
}

impl Display {
    fn new(len: u64) -> Display {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        let bar = if terminal {
            let b = indicatif::ProgressBar::new(len);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "lab {bar:30} {pos}/{len} [{elapsed_precise}] {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b.enable_steady_tick(Duration::from_millis(500));
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        Display { bar, terminal }
    }

    fn println(&self, line: String) {
        if self.terminal {
            self.bar.println(line);
        } else {
            eprintln!("lab: {line}");
        }
    }

    /// Updates the bar; off a terminal, prints the status when a task has finished.
    fn status(&self, done: u64, msg: String) {
        if !self.terminal && done != self.bar.position() {
            eprintln!("lab: {msg}");
        }
        self.bar.set_position(done);
        self.bar.set_message(msg);
    }
}

fn start(sweep: &Sweep, out: &Path, exe: &Path, task: Task) -> anyhow::Result<Running> {
    let threads = sweep.lab.threads;
    match &task {
        Task::Warm(seed) => {
            let dir = Sweep::warm_dir(out, *seed);
            std::fs::create_dir_all(&dir)?;
            let mut args: Vec<String> = vec![
                "quickstart".into(),
                "--warm-start-only".into(),
                "--seed".into(),
                seed.to_string(),
                "--out".into(),
                dir.display().to_string(),
            ];
            args.extend(sweep.warm_start.quickstart_args.iter().cloned());
            let child = spawn(exe, &args, threads, &dir.with_extension("log"))?;
            Ok(Running {
                task,
                child,
                started: Instant::now(),
                prev_wall: 0.0,
                record: RunRecord::default(),
                last_write: Instant::now(),
            })
        }
        Task::Run(spec) => {
            let dir = sweep.run_dir(out, spec);
            std::fs::create_dir_all(&dir)?;
            let mut record = RunRecord::read(&dir);
            let args: Vec<String> = if dir.join(rlvr_rundir::files::CONFIG).exists() {
                vec![
                    "train".into(),
                    "--no-progress".into(),
                    "--resume".into(),
                    dir.display().to_string(),
                ]
            } else {
                sweep.train_args(out, spec)
            };
            record.attempts += 1;
            record.done = false;
            record.write(&dir)?;
            let child = spawn(exe, &args, threads, &dir.join("lab.log"))?;
            Ok(Running {
                task,
                child,
                started: Instant::now(),
                prev_wall: record.wall_s,
                record,
                last_write: Instant::now(),
            })
        }
    }
}

/// The run directories of `sweep` under `out`, in [`Sweep::runs`] order.
pub fn run_dirs(sweep: &Sweep, out: &Path) -> Vec<PathBuf> {
    sweep.runs().iter().map(|r| sweep.run_dir(out, r)).collect()
}

#[cfg(test)]
mod tests {
    use super::first_difference;

    fn t(s: &str) -> toml::Value {
        toml::from_str(s).unwrap()
    }

    #[test]
    fn first_difference_names_the_key_and_ignores_a_moved_lab_directory() {
        let old = t(
            "[model]\npath = \"/old/lab/warm_start/seed-0/sft\"\n[train]\nlr = 1e-5\nseed = 0\n",
        );
        let same_moved = t(
            "[model]\npath = \"/new/lab/warm_start/seed-0/sft\"\n[train]\nlr = 1e-5\nseed = 0\n",
        );
        assert_eq!(
            first_difference("", &old, &same_moved, "/new/lab", &[]),
            None
        );
        let lr = t(
            "[model]\npath = \"/new/lab/warm_start/seed-0/sft\"\n[train]\nlr = 3e-5\nseed = 0\n",
        );
        assert_eq!(
            first_difference("", &old, &lr, "/new/lab", &[]).as_deref(),
            Some("config key train.lr was 0.00001, is now 0.00003")
        );
        // A path outside the lab directory must match exactly; a key only one side has is named.
        let other = t(
            "[model]\npath = \"/elsewhere/warm_start/seed-0/sft\"\n[train]\nlr = 1e-5\nseed = 0\n",
        );
        assert!(first_difference("", &old, &other, "/new/lab", &[])
            .unwrap()
            .starts_with("config key model.path was"));
        let added = t("[model]\npath = \"/new/lab/warm_start/seed-0/sft\"\n[train]\nlr = 1e-5\nseed = 0\nsteps = 9\n");
        assert_eq!(
            first_difference("", &old, &added, "/new/lab", &[]).as_deref(),
            Some("config key train.steps was unset, is now 9")
        );
        // A knob an older config.toml holds and today's leaves out as unread is no difference;
        // any other key only the old side has is.
        let old_all = t("[algorithm]\ntau = 0.1\nkl_coef = 0.0\n[eval]\nlimit = 20\n");
        let new_read = t("[algorithm]\nkl_coef = 0.0\n[eval]\n");
        assert_eq!(
            first_difference("", &old_all, &new_read, "/new/lab", &["algorithm.tau"]).as_deref(),
            Some("config key eval.limit was 20, is now unset")
        );
        let new_limit = t("[algorithm]\nkl_coef = 0.0\n[eval]\nlimit = 20\n");
        assert_eq!(
            first_difference("", &old_all, &new_limit, "/new/lab", &["algorithm.tau"]),
            None
        );
    }
}
