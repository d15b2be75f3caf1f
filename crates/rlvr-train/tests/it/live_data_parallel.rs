//! Data parallel on a real vLLM server: `rlvr train` with `rollout.backend = "vllm"` as two
//! ranks (two `ThreadComm` threads of this process, each with its own client) against one
//! process on the same server and config. Rank 0 alone writes and pushes each version (its
//! weights directory holds versions, the other rank's does not exist), every rank samples its
//! share of the groups from the server, and the run equals the one-process run: the same
//! completions (rollouts.jsonl, the rewards and versions in metrics.jsonl), the loss and gradient
//! norm within 1e-5 relative, staleness 0, 1, 0, 1 under sync.interval = 2.
//!
//! scripts/ci_vllm.sh runs it in its tied lane with `RLVR_VLLM_URL` and `RLVR_VLLM_MODEL` (the
//! served directory, also the policy) and `--include-ignored`: a plain `cargo test` skips it as
//! ignored, and run without its server it fails.

use std::path::{Path, PathBuf};

use rlvr_dist::{SharedComm, ThreadComm};
use rlvr_train::config::RawConfig;
use rlvr_train::job::Job;
use rlvr_train::run::{train_on, RunOptions};
use rlvr_train::store::metrics::{read_metrics, TIME_KEYS};

fn live() -> Option<(String, PathBuf)> {
    let (Ok(url), Ok(model)) = (
        std::env::var("RLVR_VLLM_URL"),
        std::env::var("RLVR_VLLM_MODEL"),
    ) else {
        panic!(
            "RLVR_VLLM_URL / RLVR_VLLM_MODEL are not set: this live test needs a running server; \
             scripts/ci_vllm.sh starts one and runs it (a plain `cargo test` skips it as ignored)"
        );
    };
    Some((url, PathBuf::from(model)))
}

/// A small arithmetic run sampled by the server. A random model never answers right, so the
/// reward is an external verifier's (the parity of the completion line's length): rewards vary,
/// every step has gradients and the versions differ.
fn sets(url: &str, model: &Path, run: &Path) -> Vec<String> {
    let score = run.with_extension("score.sh");
    std::fs::write(
        &score,
        "exec awk '{ print \"{\\\"reward\\\": \" (length($0) % 2) \"}\" }'\n",
    )
    .unwrap();
    vec![
        format!(
            "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"] }}",
            score.display()
        ),
        format!("model.path={}", model.display()),
        format!("output.dir={}", run.display()),
        "data.task=\"arithmetic\"".into(),
        "data.arithmetic.train_size=64".into(),
        "data.arithmetic.test_size=8".into(),
        "data.prompts_per_step=3".into(),
        "rollout.group_size=4".into(),
        "rollout.max_new_tokens=8".into(),
        "rollout.temperature=0.7".into(),
        "rollout.backend=\"vllm\"".into(),
        format!("rollout.servers=[\"{url}\"]"),
        "rollout.retries=1".into(),
        "rollout.request_timeout_s=60".into(),
        "sync.interval=2".into(),
        "train.steps=4".into(),
        "train.lr=1e-3".into(),
        "train.eval_every=0".into(),
        "train.log_rollouts=12".into(),
        "train.micro_batch_size=4".into(),
    ]
}

type Line = serde_json::Map<String, serde_json::Value>;

fn lines(run: &Path, file: &str) -> Vec<Line> {
    read_metrics(&run.join(file)).unwrap()
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn two_ranks_on_one_vllm_server_equal_one_process() {
    let Some((url, model)) = live() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    let cfg = RawConfig::load(None, &sets(&url, &model, &one))
        .unwrap()
        .resolve()
        .unwrap();
    train_on(&cfg, &RunOptions::default(), Job::single()).unwrap();
    let dp = tmp.path().join("dp");
    let cfg = RawConfig::load(None, &sets(&url, &model, &dp))
        .unwrap()
        .resolve()
        .unwrap();
    ThreadComm::run(2, |c| {
        train_on(
            &cfg,
            &RunOptions::default(),
            Job::over(SharedComm::new(Box::new(c))),
        )
        .unwrap()
    });
    // The same completions, in the same order, with the same rewards and versions.
    let strip = |run: &Path| -> Vec<(String, String, Option<f64>, Option<u64>)> {
        lines(run, "rollouts.jsonl")
            .into_iter()
            .map(|l| {
                (
                    l["group_id"].to_string(),
                    l["completion"].to_string(),
                    l["reward"].as_f64(),
                    l["version"].as_u64(),
                )
            })
            .collect()
    };
    assert_eq!(strip(&one), strip(&dp), "rollouts.jsonl");
    let (la, lb) = (lines(&one, "metrics.jsonl"), lines(&dp, "metrics.jsonl"));
    assert_eq!(la.len(), 4);
    assert_eq!(la.len(), lb.len());
    let stale: Vec<f64> = lb
        .iter()
        .map(|l| l["staleness/max"].as_f64().unwrap())
        .collect();
    assert_eq!(stale, [0.0, 1.0, 0.0, 1.0]);
    assert!(la
        .iter()
        .any(|l| l["grad_norm"].as_f64().is_some_and(|g| g > 0.0)));
    for (x, y) in la.iter().zip(&lb) {
        for (k, va) in x {
            if TIME_KEYS.contains(&k.as_str()) {
                continue;
            }
            match (va.as_f64(), y[k].as_f64()) {
                (Some(p), Some(q)) => assert!(
                    (p - q).abs() <= 1e-5 * p.abs().max(q.abs()) + 1e-7,
                    "step {} {k}: one process {p}, two ranks {q}",
                    x["step"]
                ),
                _ => assert_eq!(va, &y[k], "step {} {k}", x["step"]),
            }
        }
    }
    // Rank 0 alone wrote the versions the server loaded (rollout.weights_dir defaults inside the
    // run directory); the run directory holds rank 1's log and nothing else of it.
    assert!(dp.join("ranks/rank-1.log").exists());
}
