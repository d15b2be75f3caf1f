//! `rlvr train` with `rollout.backend = "vllm"` against a real vLLM server:
//! a 6-step run with sync.interval = 2 samples every step with the scheduled version (staleness
//! 0, 1, 0, 1, 0, 1) and its behaviour log-probs equal the trainer's at staleness 0; the same
//! seed gives the same completions; the server killed mid-run stops the run with an error naming
//! it and a checkpoint (only the error saves one: `train.save_every = 0`), and `rlvr train
//! --resume` continues once a server is back, pushing the weights first.
//!
//! scripts/ci_vllm.sh runs this first in its untied lane, on a server of an UNTIED model (the
//! tied case is live_server.rs's, in the other lane, on another server), with `RLVR_VLLM_URL`,
//! `RLVR_VLLM_MODEL` (the served directory, also the policy), `RLVR_VLLM_PID` (the server's
//! process group), `RLVR` (the rlvr binary) and `RUN` / `VENV` / `CPU_BIND` / `LORA_RANK` (for
//! `scripts/vllm_server.sh start`, which restarts the server on the same port, as it was started).
//! Ignored by a plain `cargo test` (scripts/ci_vllm.sh passes `--include-ignored`); run without a
//! server it fails.

use crate::common::jsonl;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Live {
    url: String,
    model: PathBuf,
    pid: String,
    rlvr: PathBuf,
}

fn live() -> Option<Live> {
    let (Ok(url), Ok(pid)) = (
        std::env::var("RLVR_VLLM_URL"),
        std::env::var("RLVR_VLLM_PID"),
    ) else {
        panic!(
            "RLVR_VLLM_URL / RLVR_VLLM_PID are not set: this live test needs a running server; \
             scripts/ci_vllm.sh starts one and runs it (a plain `cargo test` skips it as ignored)"
        );
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rlvr = std::env::var("RLVR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/debug/rlvr"));
    assert!(rlvr.exists(), "no rlvr binary at {}", rlvr.display());
    Some(Live {
        url,
        model: PathBuf::from(std::env::var("RLVR_VLLM_MODEL").expect("RLVR_VLLM_MODEL")),
        pid,
        rlvr,
    })
}

/// The `--set`s of a small arithmetic run on the served model, sampled by the server. A random
/// model never answers right, so the reward is an external verifier's: the parity of the input
/// line's length (varied rewards, so every step has gradients and the versions differ).
fn sets(l: &Live, run: &Path, steps: u64) -> Vec<String> {
    let score = run.with_extension("score.sh");
    std::fs::write(
        &score,
        "exec awk '{ print \"{\\\"reward\\\": \" (length($0) % 2) \"}\" }'\n",
    )
    .unwrap();
    [
        format!(
            "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"] }}",
            score.display()
        ),
        format!("model.path={}", l.model.display()),
        format!("output.dir={}", run.display()),
        "data.task=\"arithmetic\"".into(),
        "data.arithmetic.train_size=64".into(),
        "data.arithmetic.test_size=8".into(),
        "data.prompts_per_step=2".into(),
        "rollout.group_size=4".into(),
        "rollout.max_new_tokens=8".into(),
        "rollout.temperature=0.7".into(),
        "rollout.backend=\"vllm\"".into(),
        format!("rollout.servers=[\"{}\"]", l.url),
        "rollout.retries=1".into(),
        "rollout.request_timeout_s=60".into(),
        "rollout.refresh_tolerance=1e-3".into(),
        "sync.interval=2".into(),
        format!("train.steps={steps}"),
        "train.lr=3e-2".into(),
        "train.micro_batch_size=8".into(),
        "train.eval_every=0".into(),
        "train.save_every=0".into(),
        "train.log_rollouts=100".into(),
        "train.seed=5".into(),
    ]
    .into_iter()
    .collect()
}

fn train(l: &Live, sets: &[String], resume: Option<&Path>) -> Command {
    let mut c = Command::new(&l.rlvr);
    c.arg("train").arg("--no-progress");
    if let Some(r) = resume {
        c.arg("--resume").arg(r);
    }
    for s in sets {
        c.arg("--set").arg(s);
    }
    c.stdin(Stdio::null());
    c
}

/// Checks rollouts.jsonl and diagnostics.jsonl of a finished 6-step (or shorter) run with v = 2:
/// every completion of step t carries version 2·⌊(t−1)/2⌋ (staleness 0, 1, 0, 1, …), 8 per step,
/// and the staleness-0 steps' mean |ℓ_vLLM − ℓ_trainer| is below 1e-4 (f32 server). Returns the
/// completions of each step.
fn check_schedule(run: &Path, steps: u64) -> Vec<Vec<String>> {
    let rollouts = jsonl(&run.join("rollouts.jsonl"));
    let mut per_step = vec![Vec::new(); steps as usize];
    for r in &rollouts {
        let t = r["step"].as_u64().unwrap();
        let want = 2 * ((t - 1) / 2);
        assert_eq!(r["version"].as_u64(), Some(want), "step {t}: {r}");
        assert_eq!(r["staleness"].as_u64(), Some((t - 1) % 2), "step {t}: {r}");
        per_step[t as usize - 1].push(r["completion"].as_str().unwrap().to_string());
    }
    assert!(per_step.iter().all(|s| s.len() == 8), "{per_step:?}");
    let diag = jsonl(&run.join("diagnostics.jsonl"));
    assert_eq!(diag.len() as u64, steps);
    for d in &diag {
        let t = d["step"].as_u64().unwrap();
        let gap = d["logprob_diff/staleness0"].as_f64();
        assert_eq!(d["rows_skipped_zero_gradient"], 0, "step {t}: {d}");
        if t % 2 == 1 {
            let gap = gap.unwrap();
            eprintln!("step {t}: mean |ℓ_vLLM − ℓ_trainer| at staleness 0 = {gap:.2e}");
            assert!(gap < 1e-4, "step {t}: {gap}");
            let k3 = d["logprob_k3/staleness0"].as_f64().unwrap();
            assert!((0.0..1e-6).contains(&k3), "step {t}: k3 {k3}");
        } else {
            assert_eq!(gap, None, "step {t} has no staleness-0 row");
        }
    }
    // At staleness 1 the trainer's weights moved on: the behaviour KL is clearly above 0.
    for m in jsonl(&run.join("metrics.jsonl")) {
        let t = m["step"].as_u64().unwrap();
        if t % 2 == 0 {
            let kl = m["kl_behaviour"].as_f64().unwrap();
            assert!(kl > 1e-3, "step {t}: kl_behaviour {kl}");
        }
    }
    per_step
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn six_steps_on_vllm_follow_the_schedule_and_repeat_with_the_seed() {
    let Some(l) = live() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let a = tmp.path().join("a");
    let st = train(&l, &sets(&l, &a, 6), None).status().unwrap();
    assert!(st.success(), "rlvr train failed: see {}", a.display());
    eprintln!("6-step vLLM run: {:.1} s", t0.elapsed().as_secs_f64());
    let got_a = check_schedule(&a, 6);
    // Only the newest version directory is kept.
    let names: Vec<String> = std::fs::read_dir(a.join("vllm-weights"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["version-00000006"]);
    let run_json: Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_json["rollout_backend"]["backend"], "vllm");
    // The same seed: the same completions (three steps, one refresh included).
    let b = tmp.path().join("b");
    let st = train(&l, &sets(&l, &b, 3), None).status().unwrap();
    assert!(st.success());
    let got_b = check_schedule(&b, 3);
    assert_eq!(got_a[..3], got_b[..]);
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn a_killed_server_stops_the_run_with_a_checkpoint_and_resume_continues() {
    let Some(l) = live() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("c");
    let log = std::fs::File::create(tmp.path().join("c.log")).unwrap();
    let mut child = train(&l, &sets(&l, &run, 6), None)
        .stderr(log.try_clone().unwrap())
        .stdout(log)
        .spawn()
        .unwrap();
    // Kill the server once step 3 is written.
    let t0 = Instant::now();
    while jsonl(&run.join("metrics.jsonl")).len() < 3 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before step 3"
        );
        assert!(t0.elapsed() < Duration::from_secs(300), "no step 3");
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", l.pid)])
        .status()
        .unwrap();
    assert!(killed.success());
    let st = child.wait().unwrap();
    assert!(!st.success(), "the run must stop when its server dies");
    let out = std::fs::read_to_string(tmp.path().join("c.log")).unwrap();
    eprintln!(
        "run stopped: {}",
        out.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
    );
    assert!(out.contains(&format!("vLLM server {}", l.url)), "{out}");
    assert!(out.contains("saved to"), "{out}");
    let done = jsonl(&run.join("metrics.jsonl")).len();
    assert!((3..6).contains(&done), "{done}");
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert!(latest.trim().ends_with(&format!("step-{done}")), "{latest}");
    // A server back on the same port (restarted from the original checkpoint: version 0 weights).
    let port = l.url.rsplit(':').next().unwrap();
    let t1 = Instant::now();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/vllm_server.sh");
    let st = Command::new("bash")
        .arg(script)
        .args(["start", l.model.to_str().unwrap(), port])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "restarting the server failed");
    eprintln!("server restarted in {:.1} s", t1.elapsed().as_secs_f64());
    let st = train(&l, &[], Some(&run)).status().unwrap();
    assert!(st.success(), "rlvr train --resume failed");
    // The resumed steps follow the schedule, and staleness-0 log-probs match the trainer's: the
    // resume pushed its weights before sampling (the restarted server held version 0's).
    check_schedule(&run, 6);
    let steps: Vec<u64> = jsonl(&run.join("metrics.jsonl"))
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6]);
}

/// `rlvr eval` with `rollout.backend = "vllm"`: greedy completions sampled by the
/// server equal the native engine's, item by item.
#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn eval_on_vllm_equals_native_greedy() {
    let Some(l) = live() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let eval = |out: &Path, vllm: bool| {
        let mut c = Command::new(&l.rlvr);
        c.args(["eval", "--task", "arithmetic", "--n", "1", "--limit", "6"])
            .args(["--max-new-tokens", "8", "--model"])
            .arg(&l.model)
            .arg("--out")
            .arg(out);
        if vllm {
            c.args(["--set", "rollout.backend=\"vllm\""])
                .arg("--set")
                .arg(format!("rollout.servers=[\"{}\"]", l.url));
        }
        assert!(c.status().unwrap().success());
        jsonl(out)
    };
    let native = eval(&tmp.path().join("native.jsonl"), false);
    let vllm = eval(&tmp.path().join("vllm.jsonl"), true);
    assert_eq!(native.len(), 6);
    assert_eq!(native, vllm);
}

/// A copy of the served model in `dir` that ends a turn on `<|im_end|>` about half the time at
/// T = 1, whatever the context, so episodes take several turns: the embeddings get +10 in
/// dimension 0 (the residual stream's dimension 0 then dominates: after the final norm it is 2.4 to 2.9 on this model, measured with transformers), the final norm
/// keeps dimension 0 only, and the untied head scores `<|im_end|>` by that dimension alone (every
/// other token 0). Any weights serve the log-prob comparison; these make its contexts multi-turn.
fn turn_ending_model(l: &Live, dir: &Path) -> u32 {
    use candle_core::{DType, Device, Tensor};
    let p = rlvr_model::checkpoint::Policy::load(&l.model, DType::F32, &Device::Cpu).unwrap();
    let eot = p.tokenizer.encode("<|im_end|>", false).unwrap()[0];
    let vars = p.model.named_vars();
    let get = |n: &str| {
        vars.iter()
            .find(|(m, _)| m == n)
            .unwrap_or_else(|| panic!("no {n}"))
            .1
            .as_tensor()
            .clone()
    };
    let emb = get("model.embed_tokens.weight");
    let (v, h) = emb.dims2().unwrap();
    let mut e = emb.to_vec2::<f32>().unwrap();
    for row in &mut e {
        row[0] += 10.0;
    }
    let mut norm = vec![0f32; h];
    norm[0] = 1.0;
    let mut head = vec![0f32; v * h];
    head[eot as usize * h] = 4.4;
    let dev = Device::Cpu;
    p.model
        .load_named(&[
            (
                "model.embed_tokens.weight".into(),
                Tensor::from_vec(e.concat(), (v, h), &dev).unwrap(),
            ),
            (
                "model.norm.weight".into(),
                Tensor::from_vec(norm, h, &dev).unwrap(),
            ),
            (
                "lm_head.weight".into(),
                Tensor::from_vec(head, (v, h), &dev).unwrap(),
            ),
        ])
        .unwrap();
    p.save(dir, DType::F32).unwrap();
    eot
}

/// `rlvr train` with `[env]` (the built-in `retry` environment, 3 turns, the model's own Qwen2.5
/// chat template) on vLLM (DESIGN.md section 14; issue 45): later turns are one request each with
/// the stored context as token ids, and the trainer's log-probs of the stored rows equal the
/// server's at every sampled position (staleness 0, mean gap below 1e-4, the same bar as
/// single-turn rows), with episodes of several turns; the same seed repeats the episodes.
#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn episodes_on_vllm_score_as_the_trainer_and_repeat_with_the_seed() {
    let Some(l) = live() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("policy");
    turn_ending_model(&l, &model);
    let run = |name: &str| {
        let dir = tmp.path().join(name);
        let mut s = sets(&l, &dir, 2);
        s.retain(|x| {
            !x.starts_with("model.path=")
                && !x.starts_with("data.verifier=")
                && !x.starts_with("rollout.temperature=")
                && !x.starts_with("sync.interval=")
                && !x.starts_with("train.lr=")
        });
        // Right about one time in five (the input line's length), so most episodes retry and
        // the groups' rewards differ.
        let score = tmp.path().join(format!("{name}.score.sh"));
        std::fs::write(
            &score,
            "exec awk '{ print \"{\\\"reward\\\": \" (length($0) % 5 == 0) \"}\" }'\n",
        )
        .unwrap();
        s.extend([
            format!(
                "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"] }}",
                score.display()
            ),
            format!("model.path={}", model.display()),
            "rollout.temperature=1.0".into(),
            "env.builtin=\"retry\"".into(),
            "env.max_turns=3".into(),
            "env.max_episode_tokens=96".into(),
            "sync.interval=1".into(),
            // Small steps: the crafted head that ends turns survives the updates.
            "train.lr=1e-5".into(),
        ]);
        let t0 = Instant::now();
        let out = train(&l, &s, None).output().unwrap();
        assert!(
            out.status.success(),
            "rlvr train with [env] on vLLM failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "2-step vLLM episode run: {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        dir
    };
    // scripts/ci_vllm.sh starts this lane's server with prefix caching on (block size 32): the
    // run's requests carry its per-version salt, and the checks below hold with the cache on.
    let metrics = metrics_server(&l.url);
    let h0 = prefix_cache_counters(&metrics);
    let a = run("a");
    let h1 = prefix_cache_counters(&metrics);
    eprintln!(
        "prefix cache during run a: {} of {} prompt tokens from the cache",
        h1.0 - h0.0,
        h1.1 - h0.1
    );
    assert!(
        h1.0 > h0.0,
        "no prefix-cache hit in a run of 3-turn episodes: is the server started with \
         PREFIX_CACHING=1 BLOCK_SIZE=32?"
    );
    let diag = jsonl(&a.join("diagnostics.jsonl"));
    assert_eq!(diag.len(), 2);
    for d in &diag {
        let gap = d["logprob_diff/staleness0"]
            .as_f64()
            .unwrap_or_else(|| panic!("no staleness-0 gap: {d}"));
        eprintln!(
            "step {}: mean |ℓ_vLLM − ℓ_trainer| over sampled tokens = {gap:.2e}",
            d["step"]
        );
        assert!(gap < 1e-4, "{d}");
    }
    let metrics = jsonl(&a.join("metrics.jsonl"));
    for m in &metrics {
        let turns = m["env/turns/mean"].as_f64().unwrap();
        eprintln!("step {}: env/turns/mean = {turns}", m["step"]);
        assert!(turns > 1.0, "{m}");
        assert_eq!(m["env/error_frac"].as_f64(), Some(0.0), "{m}");
    }
    let rollouts = jsonl(&a.join("rollouts.jsonl"));
    // rollouts.jsonl's completion is the episode's row as text: turns and the retry bridges.
    let bridges = |r: &Value| {
        r["completion"]
            .as_str()
            .unwrap()
            .matches("That is not correct")
            .count()
    };
    assert!(rollouts.iter().any(|r| bridges(r) == 2), "{rollouts:?}");
    // The same seed: the same episodes.
    let b = run("b");
    let strip = |rows: Vec<Value>| -> Vec<Value> {
        rows.into_iter()
            .map(|mut r| {
                r.as_object_mut().unwrap().remove("time");
                r
            })
            .collect()
    };
    assert_eq!(strip(rollouts), strip(jsonl(&b.join("rollouts.jsonl"))));
}

/// The server at `url`, for its `/metrics`.
fn metrics_server(url: &str) -> rlvr_vllm::Server {
    let policy = rlvr_vllm::RetryPolicy {
        retries: 2,
        backoff: Duration::from_millis(200),
        timeout: Duration::from_secs(30),
    };
    rlvr_vllm::Server::new(url, None, policy).unwrap()
}

/// vLLM's prefix-cache counters from `GET /metrics` (tokens, summed over its engines):
/// (`vllm:prefix_cache_hits`, `vllm:prefix_cache_queries`).
fn prefix_cache_counters(server: &rlvr_vllm::Server) -> (f64, f64) {
    server
        .call_text("GET", "/metrics", None, |text| {
            let sum = |name: &str| {
                text.lines()
                    .filter(|l| {
                        l.starts_with(&format!("{name}_total"))
                            || l.starts_with(&format!("{name}{{"))
                    })
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            };
            Ok((
                sum("vllm:prefix_cache_hits"),
                sum("vllm:prefix_cache_queries"),
            ))
        })
        .unwrap()
}

/// The server was started with prefix caching on (scripts/ci_vllm.sh: `PREFIX_CACHING=1` for
/// this lane): an episode's later turn (one request, its whole context) is
/// served from the blocks its turn 1 left under the same salt, while the same context under
/// another version's salt hits nothing, and both sample the same ids with log-probs within 1e-5.
#[test]
#[ignore = "live: needs a vLLM server with prefix caching on, started by scripts/ci_vllm.sh"]
fn later_turns_hit_the_prefix_cache_only_under_their_versions_salt() {
    use rlvr_rollout::{SamplingParams, TurnRow};
    use rlvr_vllm::{ClientConfig, VllmClient};
    let url = std::env::var("RLVR_VLLM_URL").expect(
        "RLVR_VLLM_URL is not set: this live test needs a running server with prefix caching on; \
         scripts/ci_vllm.sh starts one and runs it",
    );
    let tag = format!("rlvr-live-{}", std::process::id());
    let mut c = VllmClient::new(ClientConfig {
        servers: vec![url.clone()],
        served_model_name: "rlvr-policy".into(),
        in_flight: 1,
        cache_salt: Some(tag.clone()),
        ..Default::default()
    })
    .unwrap();
    let metrics = metrics_server(&url);
    c.set_version(7);
    // A 300-id prompt, one sample of 8 tokens, then the turn-2 context: prompt, completion, a
    // 20-id bridge. Turn 1 leaves the prompt's full blocks cached: 256 ids with vLLM's CPU
    // default of 128 per block, 288 with 32.
    let config = std::env::var("RLVR_VLLM_MODEL").expect("RLVR_VLLM_MODEL: the served model dir");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&config).join("config.json")).unwrap(),
    )
    .unwrap();
    let vocab = config["vocab_size"].as_u64().unwrap() as u32;
    let id = |i: u32| 1 + (i * 7919) % (vocab - 2);
    let prompt: Vec<u32> = (0..300u32).map(id).collect();
    let params = SamplingParams {
        group_size: 1,
        max_new_tokens: 8,
        temperature: 1.0,
        ..Default::default()
    };
    let first = c
        .sample(std::slice::from_ref(&prompt), 0, &params, 3)
        .unwrap();
    let mut context = prompt.clone();
    context.extend(&first[0].token_ids);
    context.extend((300..320u32).map(id));
    let row = vec![TurnRow {
        context: context.clone(),
        prompt_index: 0,
        sample_index: 0,
        turn: 2,
    }];
    let h0 = prefix_cache_counters(&metrics);
    let cached = c.sample_turns(&row, &params, 3).unwrap();
    let h1 = prefix_cache_counters(&metrics);
    let hits = h1.0 - h0.0;
    eprintln!(
        "turn 2 ({} ids) under turn 1's salt {tag}-v7: {hits} of {} prompt tokens from the cache",
        context.len(),
        h1.1 - h0.1
    );
    assert!(
        hits >= 256.0,
        "turn 2 of the episode hit {hits} cached tokens (at least its first 256 were computed by \
         turn 1 under the same salt): is the server started with PREFIX_CACHING=1?"
    );
    // The same context under version 8's salt: no block of version 7 serves it.
    c.set_version(8);
    let fresh = c.sample_turns(&row, &params, 3).unwrap();
    let h2 = prefix_cache_counters(&metrics);
    eprintln!(
        "the same turn under {tag}-v8: {} of {} prompt tokens from the cache",
        h2.0 - h1.0,
        h2.1 - h1.1
    );
    assert_eq!(h2.0 - h1.0, 0.0, "another version's salt hit the cache");
    assert_eq!(cached[0].token_ids, fresh[0].token_ids);
    assert_eq!((cached[0].version, fresh[0].version), (7, 8));
    let gap = cached[0]
        .behaviour_logprobs
        .iter()
        .zip(&fresh[0].behaviour_logprobs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("max |ℓ_cached − ℓ_prefilled| = {gap:.2e}");
    assert!(gap < 1e-5, "{gap}");
}
