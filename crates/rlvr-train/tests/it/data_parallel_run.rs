//! The whole run loop data-parallel (`rlvr_train::run::train_on`): 2 and 3 ranks, each a thread
//! of this process over `ThreadComm` (the real processes under `mpirun` are
//! `crates/rlvr/tests/mpi_train.rs`, run by scripts/ci_mpi.sh), against one process on the same
//! config. Every rank draws the same prompts and samples its share of the groups, so the batch,
//! the evaluation and every metric are the one-process ones: loss and gradient norm within 1e-5
//! relative (1e-7 absolute near zero; the gradient is summed in another order), counts, rewards,
//! evaluation and rollouts exactly; weights within 1e-2 × lr; rank 0 alone writes the run
//! directory.

use crate::common;

use std::path::{Path, PathBuf};

use rlvr_dist::comm::Communicator;
use rlvr_dist::{SharedComm, ThreadComm};
use rlvr_train::config::RawConfig;
use rlvr_train::job::Job;
use rlvr_train::run::{train_on, RunOptions, RunSummary};
use rlvr_train::store::metrics::{read_metrics, TIME_KEYS};

type Line = serde_json::Map<String, serde_json::Value>;

/// A task a tiny random model gets right now and then: every answer is 5 (two new tokens), so
/// most groups of 8 have reward variance and the weights move from the first step.
fn five(dir: &Path) -> PathBuf {
    let data = dir.join("five.jsonl");
    let rows: Vec<String> = (0..40)
        .map(|i| {
            serde_json::json!({"question": format!("{}+{}=", i % 10, (i + 3) % 10), "answer": "5"})
                .to_string()
        })
        .collect();
    std::fs::write(&data, rows.join("\n")).unwrap();
    data
}

fn sets(model: &Path, run: &Path, extra: &[&str]) -> Vec<String> {
    let data = five(model.parent().unwrap());
    let mut s = common::arithmetic_sets(model, run);
    s.extend([
        format!("data.train={}", data.display()),
        format!("data.test={}", data.display()),
        "data.task=\"jsonl\"".into(),
        "data.verifier={ kind = \"arithmetic\" }".into(),
        "eval.limit=9".into(),
        // Sampled (temperature 1, 4 per problem), so that some are right and the sums mean something.
        "eval.samples=4".into(),
    ]);
    s.extend(
        [
            "train.steps=3",
            "train.eval_every=2",
            "train.save_every=2",
            "data.prompts_per_step=5",
            "rollout.group_size=8",
            "rollout.max_new_tokens=2",
            "train.lr=3e-3",
            "train.log_rollouts=6",
        ]
        .map(String::from),
    );
    s.extend(extra.iter().map(|x| x.to_string()));
    s
}

/// Runs `sets` on `world` ranks (1: one process, no communicator).
fn run(sets: &[String], world: usize, resume: bool) -> Vec<RunSummary> {
    let cfg = RawConfig::load(None, sets).unwrap().resolve().unwrap();
    let opts = RunOptions {
        resume,
        ..Default::default()
    };
    if world == 1 {
        return vec![train_on(&cfg, &opts, Job::single()).unwrap()];
    }
    ThreadComm::run(world, |c| {
        train_on(&cfg, &opts, Job::over(SharedComm::new(Box::new(c)))).unwrap()
    })
}

fn lines(run: &Path, file: &str) -> Vec<Line> {
    read_metrics(&run.join(file)).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()) + 1e-7
}

/// metrics.jsonl of `b` equals `a`'s: the same steps and keys, every number within the bound
/// (time keys excepted), everything else exactly.
fn same_metrics(a: &Path, b: &Path) {
    let (la, lb) = (lines(a, "metrics.jsonl"), lines(b, "metrics.jsonl"));
    assert_eq!(la.len(), lb.len(), "{} vs {}", a.display(), b.display());
    for (x, y) in la.iter().zip(&lb) {
        assert_eq!(
            x.keys().collect::<Vec<_>>(),
            y.keys().collect::<Vec<_>>(),
            "keys at step {}",
            x["step"]
        );
        for (k, va) in x {
            if TIME_KEYS.contains(&k.as_str()) {
                continue;
            }
            let vb = &y[k];
            match (va.as_f64(), vb.as_f64()) {
                (Some(p), Some(q)) => assert!(
                    close(p, q),
                    "step {} {k}: one process {p}, data parallel {q}",
                    x["step"]
                ),
                _ => assert_eq!(va, vb, "step {} {k}", x["step"]),
            }
        }
    }
}

/// Files that must be equal line for line (sampling and evaluation do not depend on the split).
fn same_files(a: &Path, b: &Path, files: &[&str]) {
    for f in files {
        let (x, y) = (
            std::fs::read_to_string(a.join(f)).unwrap(),
            std::fs::read_to_string(b.join(f)).unwrap(),
        );
        assert_eq!(x, y, "{f} differs");
    }
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    // A LoRA checkpoint keeps its adapters (PEFT's files), a full one the model.
    let file = match dir.join("model.safetensors") {
        f if f.exists() => f,
        _ => dir.join("adapter/adapter_model.safetensors"),
    };
    let data = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&data).unwrap();
    let mut out: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            let v = match t.dtype() {
                // bf16 is the top half of an f32.
                safetensors::Dtype::BF16 => t
                    .data()
                    .chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
                _ => t
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            };
            (n, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn same_weights(a: &Path, b: &Path, lr: f64) {
    for ((n, x), (_, y)) in weights(a).iter().zip(weights(b)) {
        let d = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!((d as f64) <= 1e-2 * lr, "{n}: max |Δ| = {d:e} > 1e-2 × lr");
    }
}

fn checkpoint(run: &Path, step: u64) -> PathBuf {
    run.join("checkpoints").join(format!("step-{step}"))
}

/// Runs `extra` on 1 process and on each world size of `worlds`, and compares.
fn check(extra: &[&str], worlds: &[usize]) {
    check_and(extra, worlds, |_, _| {});
}

/// [`check`], then `more` on the one-process run's directory and each data-parallel one's.
fn check_and(extra: &[&str], worlds: &[usize], more: impl Fn(&Path, &Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let one = tmp.path().join("one");
    run(&sets(&model, &one, extra), 1, false);
    // The comparison means something: rewards vary and the weights move.
    let m = lines(&one, "metrics.jsonl");
    assert!(
        m.iter()
            .any(|l| l["grad_norm"].as_f64().is_some_and(|g| g > 0.0))
            && m.iter()
                .any(|l| l["zero_std_frac"].as_f64().is_some_and(|z| z < 1.0)),
        "no learning signal: {m:?}"
    );
    let evals = lines(&one, "eval.jsonl");
    assert!(
        evals
            .iter()
            .any(|e| e["accuracy"].as_f64().is_some_and(|a| a > 0.0)),
        "no problem ever solved: {evals:?}"
    );
    for &w in worlds {
        let dp = tmp.path().join(format!("w{w}"));
        let summaries = run(&sets(&model, &dp, extra), w, false);
        assert!(summaries.iter().all(|s| s.steps == 3));
        same_metrics(&one, &dp);
        same_files(&one, &dp, &["eval.jsonl"]);
        // rollouts.jsonl: the same completions (rewards, versions, texts), in the same order.
        let strip = |p: &Path| -> Vec<Line> { lines(p, "rollouts.jsonl") };
        assert_eq!(strip(&one), strip(&dp), "rollouts.jsonl at {w} ranks");
        same_weights(&checkpoint(&one, 3), &checkpoint(&dp, 3), 3e-3);
        // Rank 0 alone writes the run directory; rank r its own log.
        for r in 1..w {
            let log =
                std::fs::read_to_string(dp.join("ranks").join(format!("rank-{r}.log"))).unwrap();
            assert!(log.contains(&format!("rank {r} of {w}")), "{log}");
            assert!(
                log.contains("step 3/3"),
                "rank {r}'s log has its step lines:\n{log}"
            );
        }
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(checkpoint(&dp, 3).join("trainer_state/state.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(state["world_size"], w as u64);
        more(&one, &dp);
    }
}

#[test]
fn two_and_three_ranks_give_the_one_process_run() {
    // 5 groups: 3 + 2 on 2 ranks, 2 + 2 + 1 on 3; mini-batches × epochs; the token-TIS correction.
    check(
        &[
            "train.mini_batches=2",
            "train.epochs=2",
            "algorithm.mismatch_correction=\"token-truncate\"",
            "algorithm.mismatch_cap=2.0",
        ],
        &[2, 3],
    );
}

#[test]
fn dapo_dynamic_sampling_and_recompute_decide_on_the_gathered_groups() {
    // DAPO drops zero-variance groups and refills from later draws; the kept groups are the
    // one-process ones whichever rank sampled them.
    check(
        &[
            "algorithm.preset=\"dapo\"",
            "train.dynamic_sampling_max_rounds=2",
            "train.recompute_behaviour=true",
        ],
        &[2],
    );
}

/// The dynamic-sampling numbers of diagnostics.jsonl, step by step: (dropped, short) groups.
fn dynamic_sampling_counts(run: &Path) -> Vec<(u64, u64)> {
    lines(run, "diagnostics.jsonl")
        .iter()
        .map(|l| {
            (
                l["dynamic_sampling/dropped_groups"].as_u64().unwrap(),
                l["dynamic_sampling/short_groups"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn dapo_with_an_explorer_thread_decides_on_the_gathered_rounds() {
    // sync.offset = 1: the explorer thread samples its share of each round and the run's thread
    // gathers it for the keep decision (feed::share::RoundLink). One refill round at most, so
    // that some steps end short (trained short: train.dynamic_sampling_short_batch = "train"):
    // the kept groups, the rounds and the short counts are the one process's at 2 and 3 ranks.
    let extra = [
        "algorithm.preset=\"dapo\"",
        "train.dynamic_sampling_max_rounds=1",
        "sync.interval=1",
        "sync.offset=1",
    ];
    check_and(&extra, &[2, 3], |one, dp| {
        let counts = dynamic_sampling_counts(one);
        assert!(
            counts.iter().any(|c| c.0 > 0),
            "no group dropped: {counts:?}"
        );
        assert_eq!(counts, dynamic_sampling_counts(dp), "{}", dp.display());
    });
}

#[test]
fn an_explorer_thread_and_lora_with_dropout_keep_their_meaning() {
    // sync.offset = 1: the explorer samples its share on its own thread, the run's thread gathers.
    // LoRA dropout's masks are keyed by each token's context, not by the rank or the rows beside
    // it: every rank draws, for its rows, the masks the one process draws.
    check(
        &[
            "sync.interval=2",
            "sync.offset=1",
            "model.lora_rank=4",
            "model.lora_dropout=0.2",
        ],
        &[3],
    );
}

#[test]
fn a_run_saved_at_two_ranks_resumes_at_two_and_at_one_as_if_uninterrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 5);
    let extra = ["train.steps=4", "sync.interval=2"];
    let whole = tmp.path().join("whole");
    run(&sets(&model, &whole, &extra), 2, false);
    for resume_world in [2, 1] {
        let part = tmp.path().join(format!("part{resume_world}"));
        // Steps 1-2 at two ranks (the step-2 checkpoint), then steps 3-4 resumed.
        let mut first = sets(&model, &part, &extra);
        first.push("train.steps=2".into());
        run(&first, 2, false);
        let s = run(&sets(&model, &part, &extra), resume_world, true);
        assert_eq!(s[0].steps, 4);
        same_metrics(&whole, &part);
        same_files(&whole, &part, &["eval.jsonl"]);
        same_weights(&checkpoint(&whole, 4), &checkpoint(&part, 4), 3e-3);
    }
}

#[test]
fn bf16_with_f32_masters_stays_within_bf16_rounding_of_one_process() {
    // bf16 weights with f32 masters: each rank's forward runs in bf16 on its own rows, and the
    // sum of the ranks' f32 gradients is added in another order, so bf16 weights may land one
    // rounding apart. Bound: metrics within 2e-2 relative, weights within one bf16 step (2^-8
    // relative, 4e-3) of the one-process run.
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let extra = ["model.dtype=\"bf16\""];
    let one = tmp.path().join("one");
    run(&sets(&model, &one, &extra), 1, false);
    let dp = tmp.path().join("dp");
    run(&sets(&model, &dp, &extra), 2, false);
    let (la, lb) = (lines(&one, "metrics.jsonl"), lines(&dp, "metrics.jsonl"));
    assert_eq!(la.len(), lb.len());
    let mut worst = 0f64;
    for (x, y) in la.iter().zip(&lb) {
        for (k, va) in x {
            if TIME_KEYS.contains(&k.as_str()) {
                continue;
            }
            if let (Some(p), Some(q)) = (va.as_f64(), y[k].as_f64()) {
                let r = (p - q).abs() / (p.abs().max(q.abs()) + 1e-3);
                worst = worst.max(r);
                assert!(r <= 2e-2, "step {} {k}: {p} vs {q}", x["step"]);
            } else {
                assert_eq!(va, &y[k], "step {} {k}", x["step"]);
            }
        }
    }
    assert!(la
        .iter()
        .any(|l| l["grad_norm"].as_f64().is_some_and(|g| g > 0.0)));
    let (wa, wb) = (weights(&checkpoint(&one, 3)), weights(&checkpoint(&dp, 3)));
    // Moved by training: step 3 against step 2's checkpoint, both bf16.
    let w0 = weights(&checkpoint(&one, 2));
    let (mut moved, mut differ, mut total) = (0usize, 0usize, 0usize);
    for (((n, a), (_, b)), (_, z)) in wa.iter().zip(&wb).zip(&w0) {
        for ((x, y), z0) in a.iter().zip(b).zip(z) {
            total += 1;
            moved += usize::from(x != z0);
            differ += usize::from(x != y);
            assert!(
                (x - y).abs() <= 4e-3 * x.abs().max(y.abs()) + 1e-6,
                "{n}: {x} vs {y}"
            );
        }
    }
    assert!(moved > 0, "the bf16 weights never moved");
    eprintln!(
        "bf16: worst relative metric difference {worst:e}; {moved} of {total} weights moved, \
         {differ} differ from one process"
    );
}

#[test]
fn zero_1_gives_the_one_process_run_and_its_checkpoints_resume_at_any_world_size() {
    // ZeRO-1 at 2 and 3 ranks (bf16 weights with sharded f32 masters at 2): the same run as one
    // process, and the checkpoint (gathered to rank 0) the same files.
    check(&["distributed.zero=1", "train.mini_batches=2"], &[2, 3]);
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 5);
    let extra = ["train.steps=4", "sync.interval=2", "distributed.zero=1"];
    let whole = tmp.path().join("whole");
    run(&sets(&model, &whole, &extra), 1, false);
    // Saved at 2 ranks (sharded), resumed at 3 and at 1.
    for resume_world in [3, 1] {
        let part = tmp.path().join(format!("part{resume_world}"));
        let mut first = sets(&model, &part, &extra);
        first.push("train.steps=2".into());
        run(&first, 2, false);
        run(&sets(&model, &part, &extra), resume_world, true);
        same_metrics(&whole, &part);
        same_weights(&checkpoint(&whole, 4), &checkpoint(&part, 4), 3e-3);
        // The optimizer state on disk is the whole one: the same moments as one process's.
        let (a, b) = (
            std::fs::read(checkpoint(&whole, 4).join("trainer_state/optimizer.safetensors"))
                .unwrap(),
            std::fs::read(checkpoint(&part, 4).join("trainer_state/optimizer.safetensors"))
                .unwrap(),
        );
        let (a, b) = (
            safetensors::SafeTensors::deserialize(&a).unwrap(),
            safetensors::SafeTensors::deserialize(&b).unwrap(),
        );
        let mut names = a.names();
        names.sort();
        let mut bn = b.names();
        bn.sort();
        assert_eq!(names, bn);
        for n in names {
            let (x, y) = (a.tensor(n).unwrap(), b.tensor(n).unwrap());
            assert_eq!(x.shape(), y.shape(), "{n}");
            let f = |d: &[u8]| -> Vec<f32> {
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            };
            // Rounding in a sum scales with its terms, not with the result: an element whose
            // gradients nearly cancel differs by more than 1e-4 of itself (seen: 7e-4 on an m
            // of 4e-6), so the bound is relative to the tensor's largest value.
            let (xs, ys) = (f(x.data()), f(y.data()));
            let scale = xs.iter().chain(&ys).fold(0f32, |m, v| m.max(v.abs()));
            for (p, q) in xs.iter().zip(&ys) {
                assert!(
                    (p - q).abs() <= 1e-4 * scale + 1e-9,
                    "{n}: {p} vs {q} (largest |value| {scale})"
                );
            }
        }
    }
}

#[test]
fn zero_1_with_bf16_masters() {
    check(&["distributed.zero=1", "model.dtype=\"bf16\""], &[2]);
}

/// Issue 49 item 6a: ranks launched with different settings used to train silently, each on its
/// own problem. Rank 1 here has another learning rate, then another seed: every rank stops before
/// the run directory is made, rank 1 naming the key and both values.
#[test]
fn ranks_that_run_different_configs_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 5);
    let rd = tmp.path().join("run");
    let cfg = |extra: &[&str]| {
        RawConfig::load(None, &sets(&model, &rd, extra))
            .unwrap()
            .resolve()
            .unwrap()
    };
    let base = cfg(&[]);
    for (extra, want) in [
        ("train.lr=2e-2", "train.lr is 0.02 here and 0.003 on rank 0"),
        ("train.seed=9", "train.seed is 9 here and"),
    ] {
        let rank1 = cfg(&[extra]);
        let errs = ThreadComm::run(2, |c| {
            let mine = if c.rank() == 0 { &base } else { &rank1 };
            train_on(
                mine,
                &RunOptions::default(),
                Job::over(SharedComm::new(Box::new(c))),
            )
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
        });
        let e1 = errs[1].as_ref().unwrap_err();
        assert!(
            e1.contains(&format!("rank 1 does not run rank 0's config: {want}")),
            "{e1}"
        );
        let e0 = errs[0].as_ref().unwrap_err();
        assert!(e0.contains("another rank does not run this config"), "{e0}");
        assert!(!rd.exists(), "the run directory was made");
    }
    // The same config on both ranks runs.
    let ok = ThreadComm::run(2, |c| {
        train_on(
            &base,
            &RunOptions::default(),
            Job::over(SharedComm::new(Box::new(c))),
        )
        .is_ok()
    });
    assert_eq!(ok, [true, true]);
}

/// A program environment for the "five" task (Python, the §14 protocol): a turn is right when its
/// text is the row's answer (reward 1, done), else the user is told to try again; every episode
/// of a group whose draw is a multiple of 3 fails at `reset` (reward null), so the ranks' shares
/// hold different numbers of failed episodes.
const FIVE_ENV: &str = r#"
import json, sys
refs = {}
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        eps = []
        for e in req["episodes"]:
            refs[e["id"]] = e["row"]["answer"]
            if int(e["group"]) % 3 == 0:
                eps.append({"id": e["id"], "error": "group %s: no such game" % e["group"]})
            else:
                eps.append({"id": e["id"], "messages": None, "tools": None})
        out = {"episodes": eps}
    elif t == "step":
        eps = []
        for e in req["episodes"]:
            ok = e["text"].strip() == refs[e["id"]]
            r = {"id": e["id"], "reward": 1.0 if ok else 0.0, "done": ok,
                 "messages": [] if ok else [{"role": "user", "content": "again"}]}
            if ok:
                r["metrics"] = {"chars": len(e["text"]) / 3, "turn": e["turn"]}
            eps.append(r)
        out = {"episodes": eps}
    else:
        out = {"episodes": [{"id": e["id"], "metrics": {"gave_up": 1, "sample": int(e["id"].split(":")[1]) / 7}}
                            for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

#[test]
fn env_metrics_are_the_whole_batchs_at_two_ranks() {
    // Issue 45: each rank runs its share of the episodes; env/error_frac and the other env
    // counts are reduced over the ranks, so they equal the one-process run's (5 groups: 3 + 2
    // on 2 ranks, the failed groups of draws 0, 3, 6, … split unevenly between them).
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("five_env.py");
    std::fs::write(&script, FIVE_ENV).unwrap();
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
         {% endfor %}{% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let cmd = format!("env.command=[\"python3\", \"{}\"]", script.display());
    let tpl = format!("env.chat_template=\"{}\"", tpl.display());
    let extra = [
        cmd.as_str(),
        tpl.as_str(),
        "env.max_turns=2",
        "env.max_episode_tokens=16",
        "env.max_error_frac=0.9",
    ];
    check(&extra, &[2]);
    // What the comparison covered: failed episodes on every step, at rates a rank's share
    // alone would not give.
    let model = common::tiny_model(&tmp.path().join("m"), 3);
    let one = tmp.path().join("again");
    run(&sets(&model, &one, &extra), 1, false);
    let fracs: Vec<f64> = lines(&one, "metrics.jsonl")
        .iter()
        .filter(|l| l["step"].as_u64() > Some(0))
        .map(|l| {
            l.get("env/error_frac")
                .and_then(|v| v.as_f64())
                .unwrap_or_else(|| panic!("{l:?}"))
        })
        .collect();
    // Draws 0..5, 5..10, 10..15: groups 0 and 3, 6 and 9, 12 of 5 failed.
    assert_eq!(fracs, [0.4, 0.4, 0.2], "{fracs:?}");
    // The environment's metrics (env/metrics/<name>/mean, over the episodes that carry each
    // name: `done` ones carry chars and turn, finished ones gave_up and sample) are the whole
    // batch's, bit for bit, at 2 and 3 ranks: the episodes' rows cross the ranks with them and
    // every rank averages the gathered batch in its order.
    let metrics = |run: &Path| -> Vec<Vec<(String, f64)>> {
        lines(run, "metrics.jsonl")
            .iter()
            .map(|l| {
                l.iter()
                    .filter(|(k, _)| k.starts_with("env/metrics/"))
                    .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
                    .collect()
            })
            .collect()
    };
    let want = metrics(&one);
    let names: std::collections::BTreeSet<&str> =
        want.iter().flatten().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "env/metrics/chars/mean",
            "env/metrics/gave_up/mean",
            "env/metrics/sample/mean",
            "env/metrics/turn/mean"
        ],
        "{want:?}"
    );
    for w in [2, 3] {
        let dp = tmp.path().join(format!("metrics-w{w}"));
        // At 3 ranks one rank's share of step 2 is the failed group 9 alone (all its episodes),
        // but env.max_error_frac = 0.9 is checked on the whole step's (40%): the run goes on.
        run(&sets(&model, &dp, &extra), w, false);
        let got = metrics(&dp);
        assert_eq!(got.len(), want.len());
        for (a, b) in want.iter().zip(&got) {
            let bits = |v: &[(String, f64)]| -> Vec<(String, u64)> {
                v.iter().map(|(k, x)| (k.clone(), x.to_bits())).collect()
            };
            assert_eq!(bits(a), bits(b), "{w} ranks");
        }
    }
    // An explorer thread (sync.offset = 1) saving every step: the env counts of a batch are the
    // whole batch's once, whether gathered by a step or by a checkpoint for its buffer.
    let o1: Vec<&str> = extra
        .iter()
        .copied()
        .chain(["sync.offset=1", "train.save_every=1"])
        .collect();
    check(&o1, &[2]);
    // And resumed from a checkpoint (a stop after step 1) whose buffer holds step 2's batch,
    // gathered: the same metrics, env/* included, bit for bit.
    let whole = tmp.path().join("o1-whole");
    run(&sets(&model, &whole, &o1), 2, false);
    let part = tmp.path().join("o1-part");
    let cfg = RawConfig::load(None, &sets(&model, &part, &o1))
        .unwrap()
        .resolve()
        .unwrap();
    let stop = RunOptions::default();
    stop.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let s = ThreadComm::run(2, |c| {
        train_on(&cfg, &stop, Job::over(SharedComm::new(Box::new(c)))).unwrap()
    });
    assert_eq!(s[0].steps, 1);
    run(&sets(&model, &part, &o1), 2, true);
    let (a, b) = (
        lines(&whole, "metrics.jsonl"),
        lines(&part, "metrics.jsonl"),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        // Step 0 is the initial evaluation's line.
        assert!(x["step"] == 0 || x.contains_key("env/error_frac"), "{x:?}");
        for (k, v) in x {
            if !TIME_KEYS.contains(&k.as_str()) {
                assert_eq!(v, &y[k], "step {} {k}", x["step"]);
            }
        }
    }
}

/// A program environment for the "five" task whose `reset` fails every episode of the groups
/// whose draw index is listed in the file named by its first argument (comma-separated, read at
/// every `reset`, so a test can fix the cause before a resume); other episodes are as in
/// [`FIVE_ENV`].
const FAIL_LISTED_ENV: &str = r#"
import json, sys
refs = {}
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        listed = {int(x) for x in open(sys.argv[1]).read().split(",") if x.strip()}
        eps = []
        for e in req["episodes"]:
            refs[e["id"]] = e["row"]["answer"]
            if int(e["group"]) in listed:
                eps.append({"id": e["id"], "error": "group %s: no such game" % e["group"]})
            else:
                eps.append({"id": e["id"], "messages": None, "tools": None})
        out = {"episodes": eps}
    elif t == "step":
        eps = []
        for e in req["episodes"]:
            ok = e["text"].strip() == refs[e["id"]]
            eps.append({"id": e["id"], "reward": 1.0 if ok else 0.0, "done": ok,
                        "messages": [] if ok else [{"role": "user", "content": "again"}]})
        out = {"episodes": eps}
    else:
        out = {"episodes": [{"id": e["id"]} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// `--set`s of a "five" run with [`FAIL_LISTED_ENV`] reading `fail` (written by the caller).
fn fail_listed(dir: &Path, fail: &Path) -> Vec<String> {
    let script = dir.join("fail_listed.py");
    std::fs::write(&script, FAIL_LISTED_ENV).unwrap();
    let tpl = dir.join("chat.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
         {% endfor %}{% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    vec![
        format!(
            "env.command=[\"python3\", \"{}\", \"{}\"]",
            script.display(),
            fail.display()
        ),
        format!("env.chat_template=\"{}\"", tpl.display()),
        "env.max_turns=2".into(),
        "env.max_episode_tokens=16".into(),
    ]
}

/// Runs `sets` on `world` ranks (1: one process) with a collective timeout of 120 s, each rank's
/// result as text (the error as `rlvr` prints it), within `limit`: a rank that stops while the
/// others go on (a hang until the timeout) fails the test instead of hanging it.
fn run_each(sets: &[String], world: usize, resume: bool) -> Vec<Result<u64, String>> {
    let opts = RunOptions {
        resume,
        ..Default::default()
    };
    run_each_with(sets, world, opts)
}

/// [`run_each`] with `opts`.
fn run_each_with(sets: &[String], world: usize, opts: RunOptions) -> Vec<Result<u64, String>> {
    let limit = std::time::Duration::from_secs(600);
    let cfg = RawConfig::load(None, sets).unwrap().resolve().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let show = |r: anyhow::Result<RunSummary>| r.map(|s| s.steps).map_err(|e| format!("{e:#}"));
        let out = match world {
            1 => vec![show(train_on(&cfg, &opts, Job::single()))],
            _ => ThreadComm::run_with_timeout(
                world,
                Some(std::time::Duration::from_secs(120)),
                |c| {
                    show(train_on(
                        &cfg,
                        &opts,
                        Job::over(SharedComm::new(Box::new(c))),
                    ))
                },
            ),
        };
        let _ = tx.send(out);
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{world} ranks did not end within {limit:?}"))
}

/// `env.max_error_frac` is checked on the whole step's episodes at every world size (the counts
/// summed over the ranks before the check): groups 7 and 8 of step 2's draws 5..10 fail, 40% of
/// the step, but 1/3 and 1/2 of the two shares at 2 ranks and 0, 1 and 0 of the three at 3
/// (uneven shares: 2 + 2 + 1 groups). With the limit at 0.45 every world size trains the three
/// steps, with the one-process metrics; at 0.35 every rank of every world size stops at step 2
/// with the one-process error (no rank goes on alone), and rank 0 saves step 1, whose resume
/// once the cause is fixed equals an uninterrupted run; likewise with an explorer thread
/// (`sync.offset = 1`, checked where the run's thread gathers the shares) and with ZeRO-1 (the
/// ranks gather the optimizer's shards for the save, as they can for an error they all meet).
#[test]
fn the_environment_error_budget_is_the_whole_steps_at_every_world_size() {
    let tmp = tempfile::tempdir().unwrap();
    let fail = tmp.path().join("fail.txt");
    std::fs::write(&fail, "7,8").unwrap();
    let env = fail_listed(tmp.path(), &fail);
    let with = |extra: &[&str]| -> Vec<String> {
        env.iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .map(String::from)
            .collect()
    };
    // Continues at every world size, with the one-process metrics.
    let go = with(&["env.max_error_frac=0.45"]);
    let go: Vec<&str> = go.iter().map(String::as_str).collect();
    check(&go, &[2, 3]);

    let model = common::tiny_model(&tmp.path().join("m"), 3);
    let want = "16 of 40 episodes failed in the environment (40%, above env.max_error_frac = \
                0.35); the first: episode 7:0: reset: group 7: no such game";
    // The reference for the resumes: the run uninterrupted, nothing failing.
    std::fs::write(&fail, "").unwrap();
    let whole = tmp.path().join("whole");
    let stop = with(&["env.max_error_frac=0.35"]);
    let stop_o1 = with(&["env.max_error_frac=0.35", "sync.offset=1"]);
    let whole_o1 = tmp.path().join("whole-o1");
    for (extra, dir) in [(&stop, &whole), (&stop_o1, &whole_o1)] {
        let v: Vec<&str> = extra.iter().map(String::as_str).collect();
        run(&sets(&model, dir, &v), 1, false);
    }
    let cases: [(&[String], usize, &str); 7] = [
        (&stop, 1, "one"),
        (&stop, 2, "w2"),
        (&stop, 3, "w3"),
        (&stop_o1, 1, "o1-one"),
        (&stop_o1, 2, "o1-w2"),
        (&stop_o1, 3, "o1-w3"),
        (&stop, 2, "zero1-w2"),
    ];
    for (extra, w, name) in cases {
        std::fs::write(&fail, "7,8").unwrap();
        let dir = tmp.path().join(name);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let mut s = sets(&model, &dir, &extra);
        if name.starts_with("zero1") {
            s.push("distributed.zero=1".into());
        }
        let out = run_each(&s, w, false);
        assert_eq!(out.len(), w);
        for (r, o) in out.iter().enumerate() {
            let e = o.as_ref().expect_err(&format!("{name}: rank {r} went on"));
            assert!(e.ends_with(want), "{name}: rank {r}: {e}");
            if r == 0 {
                let saved = format!(
                    "stopped by an error after step 1; its state was saved to {}",
                    checkpoint(&dir, 1).display()
                );
                assert!(e.contains(&saved), "{name}: {e}");
            }
        }
        // The cause fixed, the resume gives the uninterrupted run's metrics (the one-process
        // run's within the data-parallel bound: same_metrics).
        std::fs::write(&fail, "").unwrap();
        let out = run_each(&s, w, true);
        assert!(out.iter().all(|o| o == &Ok(3)), "{name}: {out:?}");
        let steps = |p: &Path| -> Vec<u64> {
            lines(p, "metrics.jsonl")
                .iter()
                .map(|l| l["step"].as_u64().unwrap())
                .collect()
        };
        assert_eq!(steps(&dir), [0, 1, 2, 3], "{name}");
        let log = std::fs::read_to_string(dir.join("train.log")).unwrap();
        assert!(!log.contains("not exact"), "{name}: {log}");
        if name.starts_with("o1") {
            // Step 2's batch was sampled by version 0 (sync.offset = 1): the save kept the
            // explorer's own weights, still version 0's.
            let kept = match w {
                1 => "keeps the batches it finished and its weights (version 0)",
                _ => "keeps the explorer's weights (version 0)",
            };
            assert!(log.contains(kept), "{name}: {log}");
            same_metrics(&whole_o1, &dir);
        } else {
            same_metrics(&whole, &dir);
        }
    }
}

/// An evaluation that fails on one rank's share alone (the verifier fails on held-out problem 7
/// at its second evaluation, step 2's: rank 1's share at 2 ranks, rank 2's at 3) ends every rank
/// at step 2 with an error, none waiting for the failed rank's counts, as one process stops
/// there; rank 0 saves step 2 (complete), also with ZeRO-1 (the ranks gather the shards, as
/// for any error they all meet), and the resume once the cause is fixed trains step 3.
#[test]
fn an_evaluation_that_fails_on_one_rank_stops_every_rank_at_that_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&tmp.path().join("m"), 3);
    let test = tmp.path().join("test.jsonl");
    let rows: Vec<String> = (0..9)
        .map(|i| {
            let answer = if i == 7 { "7" } else { "5" };
            serde_json::json!({"question": format!("{}+{}=", i % 10, (i + 3) % 10), "answer": answer})
                .to_string()
        })
        .collect();
    std::fs::write(&test, rows.join("\n")).unwrap();
    // Scores as the arithmetic verifier would not matter here: a completion starting with 5 is
    // right. A batch holding problem 7 counts itself in $DIR/sevens and fails at the second.
    let vdir = tmp.path().join("verifier");
    std::fs::create_dir_all(&vdir).unwrap();
    let script = vdir.join("verify.sh");
    std::fs::write(
        &script,
        r#"DIR=$1
out=""
seven=0
while IFS= read -r line; do
  case "$line" in *'"reference":"7"'*) seven=1;; esac
  comp=$(printf '%s' "$line" | sed 's/.*"completion":"\([^"]*\)".*/\1/')
  case "$comp" in 5*) r=1;; *) r=0;; esac
  out="$out{\"reward\":$r}
"
done
if [ $seven = 1 ]; then
  echo x >> "$DIR/sevens"
  if [ ! -e "$DIR/fixed" ] && [ $(wc -l < "$DIR/sevens") -ge 2 ]; then
    echo "problem 7 again" >&2; exit 3
  fi
fi
printf '%s' "$out"
"#,
    )
    .unwrap();
    let verifier = format!(
        "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\", \"{}\"] }}",
        script.display(),
        vdir.display()
    );
    let test_set = format!("data.test={}", test.display());
    for (w, name) in [(1, "one"), (2, "w2"), (3, "w3"), (2, "zero1-w2")] {
        let _ = std::fs::remove_file(vdir.join("sevens"));
        let _ = std::fs::remove_file(vdir.join("fixed"));
        let dir = tmp.path().join(name);
        let mut s = sets(&model, &dir, &[test_set.as_str(), verifier.as_str()]);
        if name.starts_with("zero1") {
            s.push("distributed.zero=1".into());
        }
        let out = run_each(&s, w, false);
        for (r, o) in out.iter().enumerate() {
            let e = o.as_ref().expect_err(&format!("{name}: rank {r} went on"));
            assert!(e.contains("evaluating step 2"), "{name}: rank {r}: {e}");
            // Every rank stopped there on its own: none found its peers gone in a collective.
            assert!(!e.contains("collective"), "{name}: rank {r}: {e}");
            if r == 0 {
                let saved = format!(
                    "stopped by an error after step 2; its state was saved to {}",
                    checkpoint(&dir, 2).display()
                );
                assert!(e.contains(&saved), "{name}: {e}");
            }
        }
        std::fs::write(vdir.join("fixed"), "").unwrap();
        let out = run_each(&s, w, true);
        assert!(out.iter().all(|o| o == &Ok(3)), "{name}: {out:?}");
    }
}

/// An evaluation error of one rank alone after the counts were summed (the
/// [`RunOptions::fail_eval_at`] hook, as a failed write of rank 0's eval.jsonl) is every rank's:
/// each stops at step 2 with an error of its own, none failing in a collective its peer left,
/// and rank 0 saves step 2 (complete), whichever rank failed.
#[test]
fn an_evaluation_error_of_one_rank_alone_stops_every_rank() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&tmp.path().join("m"), 3);
    for (w, failing) in [(1, 0), (2, 0), (2, 1), (3, 2)] {
        let dir = tmp.path().join(format!("w{w}-r{failing}"));
        let opts = RunOptions {
            fail_eval_at: Some((failing, 2)),
            ..Default::default()
        };
        let out = run_each_with(&sets(&model, &dir, &[]), w, opts);
        for (r, o) in out.iter().enumerate() {
            let e = o
                .as_ref()
                .expect_err(&format!("{w} ranks: rank {r} went on"));
            assert!(!e.contains("collective"), "{w} ranks: rank {r}: {e}");
            let own = format!("rank {failing}: a deliberate error after the evaluation of step 2");
            match r == failing {
                true => assert!(e.contains(&own), "{w} ranks: {e}"),
                false => assert!(
                    e.contains("another rank's evaluation of step 2 failed"),
                    "{w} ranks: rank {r}: {e}"
                ),
            }
            if r == 0 {
                let saved = format!(
                    "stopped by an error after step 2; its state was saved to {}",
                    checkpoint(&dir, 2).display()
                );
                assert!(e.contains(&saved), "{w} ranks: {e}");
            }
        }
    }
}

/// A program environment for the "five" task whose rewards do not depend on the completion: one
/// turn (a `step`, or a `finish` when the turn is cut), sample k of a group gets k mod 2 (every group has reward variance whatever the model
/// writes), except the groups whose draw index is listed in the file named by its first
/// argument (comma-separated, read at every `reset`, so a test can fix the cause before a
/// resume), whose every sample gets 0 (a zero-variance group, which DAPO's dynamic sampling drops).
const CONSTANT_LISTED_ENV: &str = r#"
import json, sys
listed = set()
def reward(e):
    group, sample = (int(x) for x in e["id"].split(":"))
    return 0.0 if group in listed else float(sample % 2)
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        listed = {int(x) for x in open(sys.argv[1]).read().split(",") if x.strip()}
        out = {"episodes": [{"id": e["id"], "messages": None, "tools": None}
                            for e in req["episodes"]]}
    elif t == "step":
        out = {"episodes": [{"id": e["id"], "reward": reward(e), "done": True, "messages": []}
                            for e in req["episodes"]]}
    else:
        # finish (a turn cut by length or the budget): the same reward
        out = {"episodes": [{"id": e["id"], "reward": reward(e)} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// DAPO dynamic sampling with `train.dynamic_sampling_short_batch = "error"` that comes up short
/// (group 7 of step 2's draws 5..10 has a constant reward, [`CONSTANT_LISTED_ENV`], and no refill
/// round is allowed: 4 of 5 groups) stops every rank before step 2 with the one-process message,
/// at 1 and 2 ranks with ZeRO-1: the ranks decided it on the same gathered groups, so they gather
/// the optimizer's shards and rank 0 saves step 1 (before, the stop was not known to be every
/// rank's, and under ZeRO-1 the save was not made). With the group's rewards varying again, the
/// resume equals the uninterrupted run. Likewise with an explorer thread (`sync.offset = 1`),
/// whose rounds the run's thread gathers: the checkpoint keeps the explorer's weights of the
/// short batch, with which the resume samples it again.
#[test]
fn a_short_dapo_batch_stops_every_rank_together_and_saves_under_zero_1() {
    let tmp = tempfile::tempdir().unwrap();
    let listed = tmp.path().join("constant.txt");
    let script = tmp.path().join("constant_listed.py");
    std::fs::write(&script, CONSTANT_LISTED_ENV).unwrap();
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
         {% endfor %}{% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let cmd = format!(
        "env.command=[\"python3\", \"{}\", \"{}\"]",
        script.display(),
        listed.display()
    );
    let tpl = format!("env.chat_template=\"{}\"", tpl.display());
    let model = common::tiny_model(&tmp.path().join("m"), 3);
    for offset in ["sync.offset=0", "sync.offset=1"] {
        let extra = [
            cmd.as_str(),
            tpl.as_str(),
            "env.max_turns=1",
            "env.max_episode_tokens=16",
            "algorithm.preset=\"dapo\"",
            "algorithm.overlong=\"none\"",
            "train.dynamic_sampling_max_rounds=0",
            "train.dynamic_sampling_short_batch=\"error\"",
            "distributed.zero=1",
            offset,
        ];
        // The reference: nothing listed, three steps of 5 groups, none dropped.
        std::fs::write(&listed, "").unwrap();
        let whole = tmp.path().join(format!("whole-{offset}"));
        run(&sets(&model, &whole, &extra), 1, false);
        let m = lines(&whole, "metrics.jsonl");
        assert_eq!(m.len(), 4, "{m:?}");
        assert!(
            m.iter()
                .any(|l| l["grad_norm"].as_f64().is_some_and(|g| g > 0.0)),
            "no learning signal: {m:?}"
        );
        let want =
            "step 2: DAPO dynamic sampling found only 4 of 5 groups with reward variance in 1 \
                sampling rounds (1 zero-variance groups dropped); \
                train.dynamic_sampling_short_batch = \"error\" stops here. Raise \
                train.dynamic_sampling_max_rounds, or set it to \"train\" to train on the short \
                batch";
        for w in [1, 2] {
            std::fs::write(&listed, "7").unwrap();
            let dir = tmp.path().join(format!("w{w}-{offset}"));
            let s = sets(&model, &dir, &extra);
            let out = run_each(&s, w, false);
            assert_eq!(out.len(), w);
            for (r, o) in out.iter().enumerate() {
                let e = o
                    .as_ref()
                    .expect_err(&format!("{w} ranks: rank {r} went on"));
                assert!(e.ends_with(want), "{w} ranks: rank {r}: {e}");
                if r == 0 {
                    let saved = format!(
                        "stopped by an error after step 1; its state was saved to {}",
                        checkpoint(&dir, 1).display()
                    );
                    assert!(e.contains(&saved), "{w} ranks: {e}");
                }
            }
            // The save holds the whole optimizer state (the shards gathered).
            let state = checkpoint(&dir, 1).join("trainer_state");
            assert!(state.join("optimizer.safetensors").exists(), "{w} ranks");
            std::fs::write(&listed, "").unwrap();
            let out = run_each(&s, w, true);
            assert!(out.iter().all(|o| o == &Ok(3)), "{w} ranks: {out:?}");
            let steps: Vec<u64> = lines(&dir, "metrics.jsonl")
                .iter()
                .map(|l| l["step"].as_u64().unwrap())
                .collect();
            assert_eq!(steps, [0, 1, 2, 3], "{w} ranks");
            let log = std::fs::read_to_string(dir.join("train.log")).unwrap();
            assert!(!log.contains("not exact"), "{w} ranks: {log}");
            same_metrics(&whole, &dir);
            same_weights(&checkpoint(&whole, 3), &checkpoint(&dir, 3), 3e-3);
        }
    }
}
