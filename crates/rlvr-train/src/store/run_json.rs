//! `RUN_DIR/run.json`: where a run comes from (git commit, seed, host, start time, rlvr version,
//! the resume times) and which rollout backend sampled it. Written atomically.

use std::path::Path;

use serde_json::json;

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The commit this binary was built from (build.rs embeds `git rev-parse HEAD`), `None` when the
/// build had no git repository.
pub(crate) fn git_commit() -> Option<String> {
    Some(env!("RLVR_GIT_COMMIT"))
        .filter(|c| !c.is_empty())
        .map(str::to_string)
}

/// This machine's host name.
pub(crate) fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

fn read(path: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
}

/// Writes RUN_DIR/run.json (git commit, seed, host, start time, rlvr version); on resume, adds the
/// resume time to `resumed_at`.
///
/// # Errors
/// I/O errors naming the file.
pub(crate) fn write_run_json(run_dir: &Path, seed: u64, resume: bool) -> anyhow::Result<()> {
    let path = run_dir.join("run.json");
    let mut v = if resume {
        read(&path).unwrap_or_else(|| json!({}))
    } else {
        json!({})
    };
    if !resume || v.get("start_time").is_none() {
        v = json!({
            "git_commit": git_commit(),
            "seed": seed,
            "host": host(),
            "start_time": now_rfc3339(),
            "version": env!("CARGO_PKG_VERSION"),
            "resumed_at": [],
        });
    } else if let Some(a) = v.get_mut("resumed_at").and_then(|a| a.as_array_mut()) {
        a.push(json!(now_rfc3339()));
    }
    rlvr_model::weights::atomic_write(&path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    Ok(())
}

/// Sets `key` of RUN_DIR/run.json to `value`, keeping the other keys (e.g. `rollout_backend`).
///
/// # Errors
/// I/O errors naming the file.
pub(crate) fn record(run_dir: &Path, key: &str, value: serde_json::Value) -> anyhow::Result<()> {
    let path = run_dir.join("run.json");
    let mut v = read(&path).unwrap_or_else(|| json!({}));
    v[key] = value;
    rlvr_model::weights::atomic_write(&path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    Ok(())
}
