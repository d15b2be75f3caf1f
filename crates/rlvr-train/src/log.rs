//! What a run tells its user while it works: the lines of `RUN_DIR/train.log` and the labels of the
//! progress bar.
//!
//! Every layer may call [`say`], [`phase`] and [`log_only`]; this module imports nothing of the
//! crate, so calling it never ties a low layer to a high one. The run's guard opens the log
//! ([`open`]) when it takes the run directory and closes it ([`close`]) when it lets go; while no
//! run is open the messages go to stderr only.
//!
//! The log and the bar are per thread, not per process: `rlvr train` runs on one thread, while the
//! tests run several runs at once on different threads.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;

thread_local! {
    static TRAIN_LOG: RefCell<Option<File>> = const { RefCell::new(None) };
    static BAR: RefCell<Option<indicatif::ProgressBar>> = const { RefCell::new(None) };
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `n` and `noun`, pluralised with an `s` unless `n` is 1: `1 step`, `2 steps`, `0 steps`.
pub fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Makes this thread's messages go to its log only, never to stderr: data-parallel ranks above 0,
/// whose console would repeat rank 0's (cleared by [`close`]).
pub(crate) fn set_quiet(quiet: bool) {
    QUIET.with(|q| q.set(quiet));
}

fn quiet() -> bool {
    QUIET.with(|q| q.get())
}

/// Makes `file` the train.log of the run open on this thread.
pub(crate) fn open(file: File) {
    TRAIN_LOG.with(|l| *l.borrow_mut() = Some(file));
}

/// Closes this thread's train.log (the run ended).
pub(crate) fn close() {
    TRAIN_LOG.with(|l| *l.borrow_mut() = None);
    set_quiet(false);
}

/// Appends `msg` to the open run's `train.log` (nothing when no run is open on this thread).
pub(crate) fn log_only(msg: &str) {
    TRAIN_LOG.with(|l| {
        if let Some(f) = l.borrow_mut().as_mut() {
            // The log must never stop a run: a write error here is dropped.
            let _ = writeln!(f, "{msg}");
        }
    });
}

/// A progress bar over `steps` trainer steps standing at `start`, or `None` when disabled or when
/// stderr is not a terminal (a bar written into a file is noise).
pub(crate) fn progress_bar(
    enabled: bool,
    start: u64,
    steps: u64,
) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(steps);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {pos}/{len} [{elapsed_precise}<{eta}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b.set_position(start);
    Some(b)
}

/// Makes `bar` the progress bar that [`phase`] labels (`None` when the run ends).
pub(crate) fn set_bar(bar: Option<&indicatif::ProgressBar>) {
    BAR.with(|b| *b.borrow_mut() = bar.cloned());
}

/// Labels a long phase (loading, evaluating, saving) before it starts, so a silent minute has a
/// name: on the progress bar's message while one is drawn, else as a line on stderr; always in
/// `train.log`.
pub(crate) fn phase(msg: &str) {
    let drawn = BAR.with(|b| {
        b.borrow().as_ref().map(|bar| {
            bar.set_message(format!("{msg}…"));
        })
    });
    if drawn.is_none() && !quiet() {
        eprintln!("{msg}…");
    }
    log_only(&format!("{msg}…"));
}

/// Prints `msg` on stderr and appends it to `train.log`.
pub(crate) fn say(msg: &str) {
    if !quiet() {
        eprintln!("{msg}");
    }
    log_only(msg);
}

/// Whether a progress bar is drawn on this thread (then step lines stay out of stderr).
pub(crate) fn bar_drawn() -> bool {
    BAR.with(|b| b.borrow().is_some())
}

/// A step or evaluation line: always in `train.log`; on stderr too when `console` is true and no
/// progress bar is drawn (off a terminal, or with `--no-progress`).
pub(crate) fn line(msg: &str, console: bool) {
    if console && !bar_drawn() && !quiet() {
        eprintln!("{msg}");
    }
    log_only(msg);
}

/// Seconds as `M:SS` or `H:MM:SS` (`?` when not finite).
pub(crate) fn clock(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "?".into();
    }
    let s = secs.round() as u64;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// The `decimals` of [`fields`] that ask for [`small`]'s format (a loss, which GRPO keeps near 0).
pub(crate) const SMALL: usize = usize::MAX;

/// `x` with 4 places, or in scientific notation with 3 decimals when 0 < |x| < 1e-3, so that a
/// small nonzero value (a GRPO loss of 2e-5) does not print as `0.0000`.
pub(crate) fn small(x: f64) -> String {
    if x != 0.0 && x.abs() < 1e-3 {
        format!("{x:.3e}")
    } else {
        format!("{x:.4}")
    }
}

/// `name value` pairs joined by spaces, each value with `decimals` places ([`SMALL`]: as
/// [`small`]); `None` values are left out (a quantity that is off or undefined at this step).
pub(crate) fn fields(parts: &[(&str, Option<f64>, usize)]) -> String {
    parts
        .iter()
        .filter_map(|(name, v, d)| {
            v.map(|x| match *d {
                SMALL => format!("{name} {}", small(x)),
                d => format!("{name} {x:.d$}"),
            })
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn clock_and_fields() {
        assert_eq!(super::clock(0.4), "0:00");
        assert_eq!(super::clock(75.0), "1:15");
        assert_eq!(super::clock(3723.0), "1:02:03");
        assert_eq!(super::clock(f64::NAN), "?");
        assert_eq!(
            super::fields(&[
                ("loss", Some(0.123456), 4),
                ("kl", None, 4),
                ("n", Some(3.0), 0)
            ]),
            "loss 0.1235 n 3"
        );
        assert_eq!(
            super::fields(&[
                ("loss", Some(-2.3456e-5), super::SMALL),
                ("a", Some(0.0), super::SMALL),
                ("b", Some(0.0123456), super::SMALL),
            ]),
            "loss -2.346e-5 a 0.0000 b 0.0123"
        );
    }
}
