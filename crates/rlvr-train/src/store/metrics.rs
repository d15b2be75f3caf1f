//! The JSONL files of a run directory: metrics.jsonl (DESIGN.md section 10: one JSON object per
//! step with exactly the listed keys, null where undefined, plus `eval/*` at evaluation steps),
//! and the appending, reading and resume cut-back that rollouts.jsonl, eval.jsonl and
//! diagnostics.jsonl share with it. The code is rlvr-rundir's (shared with `rlvr plot` and the
//! lab); this module names it where the trainer's stages look for it.

pub use rlvr_rundir::jsonl::{append_line, read_metrics, truncate_after, MetricsLine};
pub use rlvr_rundir::key::{Eval, Metric, METRIC_KEYS, TIME_KEYS};
