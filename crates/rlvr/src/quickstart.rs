//! `rlvr quickstart`: a run that visibly learns on a laptop CPU, with no download and no GPU
//! (DESIGN.md section 11).
//!
//! Phases, each timed and shown with a progress bar:
//! 1. **init**: a character-level tokenizer made here with the `tokenizers` crate, the seeded
//!    addition problems (`042+317=` → `359`: a training pool and a disjoint held-out set of 500),
//!    and a tiny Qwen2-shaped model written by the same code as `rlvr init`.
//! 2. **sft**: a supervised warm start (rlvr-train's SFT, as `rlvr sft`: token-mean cross-entropy
//!    on the answer and its EOS), evaluated greedily on the held-out set every few steps and
//!    stopped at the first evaluation whose accuracy lies in [10%, 50%]
//!    ([`StopRule::AccuracyWithin`]), so that RL has room to show a gain.
//! 3. **on_policy** and **off_policy**: two `rlvr train` runs of `configs/quickstart.toml` from that
//!    warm start with the same steps, prompts and seed: GRPO with sync interval v = 1, and off-policy
//!    GRPO (arXiv 2505.22257) with v = 4.
//! 4. **eval**: both final checkpoints, greedily, on the same held-out set.
//!
//! Output in `--out` (default `runs/quickstart`): `summary.json`
//! (`sft_accuracy`, `on_policy_accuracy`, `off_policy_accuracy` as fractions, `wall_s` per phase),
//! `comparison.svg` (held-out accuracy and mean reward against step, both runs), the run
//! directories `on_policy/` and `off_policy/`, the warm start `sft/`, and the data in `data/`.
//! `--fast` shrinks every size to a smoke run for CI (seconds; its accuracies mean nothing).

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device};
use rlvr_data::generate::{ArithmeticGenConfig, Split};
use rlvr_model::checkpoint::Policy;
use rlvr_model::optim::AdamWConfig;
use rlvr_model::TokenizerBundle;
use rlvr_train::config::{settings, RawConfig, ResolvedConfig};
use rlvr_train::eval::{EvalSettings, Evaluator};
use rlvr_train::run::{train, RunOptions};
use rlvr_train::sft::{read_pairs, train_sft, SftSettings, StopRule};
use rlvr_train::update::LrSchedule;
use serde_json::json;

use crate::init;

/// The RL config both runs start from (shipped as `configs/quickstart.toml`).
const CONFIG: &str = include_str!("../../../configs/quickstart.toml");

/// The prefix of the input paths of `configs/quickstart.toml` (relative to `configs/`, naming the
/// default `--out`): the copy written to OUT/quickstart.toml drops it, so that its paths name
/// OUT/sft and OUT/data/*.jsonl, beside the copy, whatever OUT is.
const CONFIG_PATH_PREFIX: &str = "\"../runs/quickstart/";

/// `configs/quickstart.toml` as written to OUT/quickstart.toml: input paths relative to OUT.
pub fn config_copy() -> String {
    CONFIG.replace(CONFIG_PATH_PREFIX, "\"")
}

/// Seed of the problem pool: the held-out set is the same for every `--seed`.
const DATA_SEED: u64 = 0;

/// The EOS (and padding) token of the character tokenizer.
const EOS: &str = "<|endoftext|>";

/// Arguments of `rlvr quickstart`.
#[derive(clap::Args, Debug, Clone)]
pub struct QuickstartArgs {
    /// Seed of the model init, the SFT batches, the RL prompt order and the sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A smoke run for CI: tiny model, few steps, small held-out set (seconds; numbers mean nothing).
    #[arg(long)]
    pub fast: bool,
    /// Output directory (its phase subdirectories are replaced).
    #[arg(long, default_value = "runs/quickstart")]
    pub out: PathBuf,
    /// Stop after the SFT warm start: OUT/sft, OUT/data, OUT/quickstart.toml and
    /// OUT/warm_start.json (`sft_accuracy`, `sft_steps`, `seed`); `rlvr lab` runs this once per seed.
    #[arg(long)]
    pub warm_start_only: bool,
}

/// Every size of one quickstart (full or `--fast`), worked out once.
struct Plan {
    hidden: usize,
    layers: usize,
    heads: usize,
    intermediate: usize,
    train_size: usize,
    test_size: usize,
    sft_lr: f64,
    sft_batch: usize,
    sft_eval_every: u64,
    sft_max_steps: u64,
    /// Held-out accuracy range that ends the warm start (checked at each SFT evaluation).
    sft_range: Option<(f64, f64)>,
    /// `--set` overrides of the RL runs on top of `configs/quickstart.toml`.
    rl_sets: Vec<String>,
}

impl Plan {
    fn new(fast: bool) -> Plan {
        if fast {
            Plan {
                hidden: 32,
                layers: 1,
                heads: 2,
                intermediate: 64,
                train_size: 256,
                test_size: 32,
                sft_lr: 1e-3,
                sft_batch: 16,
                sft_eval_every: 4,
                sft_max_steps: 8,
                sft_range: None,
                rl_sets: vec![
                    "train.steps=4".into(),
                    "train.eval_every=2".into(),
                    "data.prompts_per_step=4".into(),
                    "rollout.group_size=4".into(),
                ],
            }
        } else {
            Plan {
                hidden: 128,
                layers: 2,
                heads: 4,
                intermediate: 384,
                train_size: 20_000,
                test_size: 500,
                sft_lr: 1e-3,
                sft_batch: 64,
                sft_eval_every: 25,
                sft_max_steps: 4000,
                sft_range: Some((0.10, 0.50)),
                rl_sets: Vec::new(),
            }
        }
    }
}

/// A progress bar on a terminal, plain lines otherwise.
fn bar(len: u64, phase: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        eprintln!("quickstart: {phase}");
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(len);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>10} {bar:30} {pos}/{len} [{elapsed_precise}] {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b.set_prefix(phase.to_string());
    b
}

/// Writes the character-level tokenizer: one token per character of the task (digits, operators,
/// `=`, space) plus the special EOS/padding token, built with the `tokenizers` crate
/// (WordLevel model, one-character pre-tokenizer, fusing decoder).
///
/// # Errors
/// I/O and tokenizer errors.
pub fn write_char_tokenizer(path: &Path) -> anyhow::Result<()> {
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::fixed_length::FixedLength;
    use tokenizers::{AddedToken, Tokenizer};
    let mut tokens: Vec<String> = vec![EOS.into(), "<unk>".into()];
    tokens.extend("0123456789+-*/=(). ".chars().map(String::from));
    let vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("<unk>".into())
        .build()
        .map_err(|e| anyhow::anyhow!("character tokenizer: {e}"))?;
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(FixedLength::new(1)));
    tok.with_decoder(Some(Fuse::new()));
    tok.add_special_tokens([AddedToken::from(EOS, true)])
        .map_err(|e| anyhow::anyhow!("character tokenizer: {e}"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    tok.save(path, true)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(())
}

fn write_lines(path: &Path, lines: &[serde_json::Value]) -> anyhow::Result<()> {
    let mut s = String::new();
    for l in lines {
        s.push_str(&l.to_string());
        s.push('\n');
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

/// Writes `data/train.jsonl` and `data/test.jsonl` (`{"question", "answer"}`, the test questions
/// disjoint from the training ones) and `data/sft.jsonl` (`{"prompt", "completion"}` of the training
/// problems).
fn write_data(dir: &Path, plan: &Plan) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let g = ArithmeticGenConfig::default();
    let mut seen = HashSet::new();
    let (mut train, mut sft) = (Vec::new(), Vec::new());
    for i in 0..plan.train_size as u64 {
        let (q, a) = g.generate(DATA_SEED, Split::Train, i)?;
        seen.insert(q.clone());
        sft.push(json!({"prompt": q, "completion": a}));
        train.push(json!({"question": q, "answer": a}));
    }
    let mut test = Vec::new();
    let mut i = 0;
    while test.len() < plan.test_size {
        let (q, a) = g.generate(DATA_SEED, Split::Test, i)?;
        i += 1;
        if seen.insert(q.clone()) {
            test.push(json!({"question": q, "answer": a}));
        }
    }
    write_lines(&dir.join("train.jsonl"), &train)?;
    write_lines(&dir.join("test.jsonl"), &test)?;
    write_lines(&dir.join("sft.jsonl"), &sft)
}

/// The fixed held-out set: the test split of `cfg`, greedy, one sample, seed 0, plain prompts
/// encoded with the tokenizer's special tokens, at most `rollout.max_new_tokens` new tokens.
fn held_out_set(cfg: &ResolvedConfig, tok: &TokenizerBundle) -> anyhow::Result<Evaluator> {
    let c = &cfg.raw;
    let reward = std::sync::Arc::new(settings::reward_function(c)?);
    let mut ev = settings::evaluator(c, tok, reward)?;
    ev.settings = EvalSettings {
        samples: 1,
        max_new_tokens: c.rollout.max_new_tokens,
        seed: 0,
        max_batch_rows: c.rollout.max_batch_rows,
        stop: c.rollout.stop.clone(),
        add_special_tokens: true,
    };
    Ok(ev)
}

/// What the warm start reached.
struct WarmStart {
    accuracy: f64,
    steps: u64,
}

/// Supervised warm start from `init_dir` into `out_dir` with rlvr-train's SFT: constant learning
/// rate `plan.sft_lr`, batches of `plan.sft_batch` in one micro-batch, clip 1, a held-out
/// evaluation every `plan.sft_eval_every` steps, stopping at the first one inside
/// `plan.sft_range` (or after `plan.sft_max_steps`).
fn warm_start(
    plan: &Plan,
    seed: u64,
    init_dir: &Path,
    sft_data: &Path,
    out_dir: &Path,
    held_out: &Evaluator,
) -> anyhow::Result<WarmStart> {
    let policy = Policy::load(init_dir, DType::F32, &Device::Cpu)?;
    let tok = &policy.tokenizer;
    let pairs = read_pairs(sft_data, tok, false, None)?;
    let settings = SftSettings {
        batch_size: plan.sft_batch,
        micro_batch_size: plan.sft_batch,
        schedule: LrSchedule::constant(plan.sft_lr, plan.sft_max_steps),
        adamw: AdamWConfig {
            lr: plan.sft_lr,
            weight_decay: 0.0,
            ..AdamWConfig::default()
        },
        grad_clip: 1.0,
        seed,
        eval_every: plan.sft_eval_every,
        stop: match plan.sft_range {
            Some((lo, hi)) => StopRule::AccuracyWithin(lo, hi),
            None => StopRule::Never,
        },
        save_every: 0,
        save_dtype: DType::F32,
    };
    let pb = bar(plan.sft_max_steps, "sft");
    let t0 = Instant::now();
    let done = train_sft(
        &policy.model,
        tok,
        &pairs,
        &settings,
        Some(held_out),
        out_dir,
        &mut |st| {
            pb.set_position(st.step);
            if let Some(r) = st.eval {
                let msg = format!("loss {:.3} held-out {:.1}%", st.loss, 100.0 * r.accuracy);
                if pb.is_hidden() {
                    eprintln!(
                        "  sft step {}: {msg} ({:.1} s)",
                        st.step,
                        t0.elapsed().as_secs_f64()
                    );
                }
                pb.set_message(msg);
            }
        },
    )?;
    pb.finish();
    let accuracy = done.accuracy.unwrap_or(f64::NAN);
    if let Some((lo, hi)) = plan.sft_range {
        if !(lo..=hi).contains(&accuracy) {
            eprintln!(
                "warning: the warm start ended at {:.1}% held-out accuracy, outside [{:.0}%, {:.0}%]",
                100.0 * accuracy,
                100.0 * lo,
                100.0 * hi
            );
        }
    }
    Ok(WarmStart {
        accuracy,
        steps: done.steps,
    })
}

/// Wall-clock seconds of each phase.
#[derive(Default)]
struct Walls {
    init: f64,
    sft: f64,
    on_policy: f64,
    off_policy: f64,
    eval: f64,
}

fn load_avg() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// Runs `rlvr quickstart`: prints the result table, writes `summary.json` and the plot.
///
/// # Errors
/// I/O, model and training errors, with the phase that failed.
pub fn run(a: &QuickstartArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let t_total = Instant::now();
    let plan = Plan::new(a.fast);
    let dir = &a.out;
    let load_start = load_avg();
    for sub in ["data", "init", "sft", "on_policy", "off_policy"] {
        let p = dir.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("clearing {}", p.display()))?;
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut w = Walls::default();

    // 1. init: tokenizer, data, random model (the `rlvr init` path).
    let t = Instant::now();
    let (data_dir, init_dir) = init_phase(a, &plan)?;
    let cfg_path = dir.join("quickstart.toml");
    std::fs::write(&cfg_path, config_copy())
        .with_context(|| format!("writing {}", cfg_path.display()))?;
    let sft_dir = dir.join("sft");
    let sets = |run: &str, extra: &[&str]| -> Vec<String> {
        let p = |x: &Path| x.display().to_string();
        let mut s = vec![
            format!("model.path={}", p(&sft_dir)),
            format!("data.train={}", p(&data_dir.join("train.jsonl"))),
            format!("data.test={}", p(&data_dir.join("test.jsonl"))),
            format!("data.seed={}", a.seed),
            format!("train.seed={}", a.seed),
            format!("output.dir={}", p(&dir.join(run))),
        ];
        s.extend(plan.rl_sets.iter().cloned());
        s.extend(extra.iter().map(|x| x.to_string()));
        s
    };
    let resolve = |s: &[String]| -> anyhow::Result<ResolvedConfig> {
        RawConfig::load(Some(&cfg_path), s)?.resolve()
    };
    let on_cfg = resolve(&sets("on_policy", &["sync.interval=1"]))?;
    let mut off_cfg = resolve(&sets(
        "off_policy",
        &["algorithm.preset=\"off_policy_grpo\"", "sync.interval=4"],
    ))?;
    // The preset change over quickstart.toml's `grpo` is the quickstart's own design (its knobs
    // are all preset values), not a user's override to warn about in the middle of its output.
    off_cfg
        .warnings
        .retain(|w| !w.starts_with("algorithm.preset changes from"));
    let tok = TokenizerBundle::load(&init_dir)?;
    let held_out = held_out_set(&on_cfg, &tok)?;
    w.init = t.elapsed().as_secs_f64();

    // 2. sft: warm start until the held-out accuracy is in range.
    let t = Instant::now();
    let ws = warm_start(
        &plan,
        a.seed,
        &init_dir,
        &data_dir.join("sft.jsonl"),
        &sft_dir,
        &held_out,
    )
    .context("quickstart warm start")?;
    w.sft = t.elapsed().as_secs_f64();
    if a.warm_start_only {
        let s = json!({"sft_accuracy": ws.accuracy, "sft_steps": ws.steps, "seed": a.seed,
            "fast": a.fast, "wall_s": {"init": w.init, "sft": w.sft}});
        std::fs::write(dir.join("warm_start.json"), format!("{s}\n"))?;
        writeln!(out, "{s}")?;
        return Ok(());
    }

    // 3. the two RL runs, same warm start, steps, prompts and seed.
    let (s, on_ckpt) = rl_run(&on_cfg, "on_policy")?;
    w.on_policy = s;
    let (s, off_ckpt) = rl_run(&off_cfg, "off_policy")?;
    w.off_policy = s;

    // 4. eval: both final checkpoints on the held-out set.
    let t = Instant::now();
    let pb = bar(2, "eval");
    let mut final_acc = Vec::new();
    for ckpt in [&on_ckpt, &off_ckpt] {
        let p = rlvr_train::store::manifest::load_policy(ckpt, DType::F32, &Device::Cpu)?;
        final_acc.push(held_out.run_model(&p.model, &p.tokenizer)?.0.accuracy);
        pb.inc(1);
    }
    pb.finish();
    w.eval = t.elapsed().as_secs_f64();

    // Plot, summary, table.
    let phases = Phases {
        warm: &ws,
        final_acc: [final_acc[0], final_acc[1]],
        walls: &w,
        rl_steps: on_cfg.raw.train.steps,
        held_out_n: held_out.texts.len(),
        load_start,
        t_total,
    };
    report(a, &phases, out)
}

/// Phase 1: the character tokenizer, the data files and the random model (the `rlvr init` path).
/// Returns the data directory and the model directory.
fn init_phase(a: &QuickstartArgs, plan: &Plan) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = &a.out;
    let pb = bar(3, "init");
    let data_dir = dir.join("data");
    let tok_path = dir.join("tokenizer").join("tokenizer.json");
    write_char_tokenizer(&tok_path)?;
    pb.inc(1);
    write_data(&data_dir, plan)?;
    pb.inc(1);
    let init_dir = dir.join("init");
    init::run(
        &init::InitArgs {
            arch: "qwen2".into(),
            hidden: plan.hidden,
            layers: plan.layers,
            heads: plan.heads,
            kv_heads: None,
            intermediate: Some(plan.intermediate),
            head_dim: None,
            tokenizer: tok_path,
            vocab_size: None,
            tie_embeddings: None,
            rope_theta: 10000.0,
            max_position_embeddings: 64,
            init_std: 0.02,
            seed: a.seed,
            dtype: "f32".into(),
            out: init_dir.clone(),
            force: false,
        },
        &mut std::io::sink(),
    )
    .context("quickstart init")?;
    pb.inc(1);
    pb.finish();
    Ok((data_dir, init_dir))
}

/// Phases 3a/3b: one `rlvr train` run; returns its wall time and last checkpoint.
fn rl_run(cfg: &ResolvedConfig, name: &str) -> anyhow::Result<(f64, PathBuf)> {
    if !std::io::stderr().is_terminal() {
        eprintln!("quickstart: {name}");
    } else {
        eprintln!("{name:>10} (sync.interval = {})", cfg.raw.sync.interval);
    }
    let t = Instant::now();
    let s = train(
        cfg,
        &RunOptions {
            resume: false,
            progress: true,
            stop: Arc::new(AtomicBool::new(false)),
            hang_after_step: None,
            fail_update_at_step: None,
            fail_eval_at: None,
        },
    )
    .with_context(|| format!("quickstart {name} run"))?;
    let ckpt = s
        .last_checkpoint
        .with_context(|| format!("the {name} run wrote no checkpoint"))?;
    Ok((t.elapsed().as_secs_f64(), ckpt))
}

/// What the phases measured, for the report.
struct Phases<'a> {
    warm: &'a WarmStart,
    final_acc: [f64; 2],
    walls: &'a Walls,
    rl_steps: u64,
    held_out_n: usize,
    load_start: Option<String>,
    t_total: Instant,
}

/// The plot, `summary.json` and the result table on `out`.
fn report(a: &QuickstartArgs, ph: &Phases, out: &mut dyn Write) -> anyhow::Result<()> {
    let dir = &a.out;
    let (ws, w, final_acc) = (ph.warm, ph.walls, &ph.final_acc);
    let plot_path = dir.join("comparison.svg");
    rlvr_train::plot::plot(&rlvr_train::plot::PlotArgs {
        runs: vec![dir.join("on_policy"), dir.join("off_policy")],
        metrics: vec!["eval/accuracy".into(), "reward/mean".into()],
        out: plot_path.clone(),
        width: 800,
        panel_height: 300,
        labels: vec!["on_policy (v = 1)".into(), "off_policy (v = 4)".into()],
        smooth: None,
        title: Some("quickstart, on- vs off-policy GRPO (same warm start and seed)".into()),
        facet: false,
        heatmap: false,
        mean_over_seeds: false,
        ignore_keys: vec![],
    })
    .context("quickstart plot")?;
    let total = ph.t_total.elapsed().as_secs_f64();
    let summary = json!({
        "sft_accuracy": ws.accuracy,
        "on_policy_accuracy": final_acc[0],
        "off_policy_accuracy": final_acc[1],
        "wall_s": {
            "init": w.init,
            "sft": w.sft,
            "on_policy": w.on_policy,
            "off_policy": w.off_policy,
            "eval": w.eval,
            "total": total,
        },
        "seed": a.seed,
        "fast": a.fast,
        "sft_steps": ws.steps,
        "rl_steps": ph.rl_steps,
        "held_out_n": ph.held_out_n,
        "loadavg": {"start": ph.load_start, "end": load_avg()},
        "plot": plot_path,
    });
    let path = dir.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let row = |name: &str, acc: f64, secs: f64| {
        format!(
            "{name:<24} {:>9.1}% {:>+8.1} {:>9.1}\n",
            100.0 * acc,
            100.0 * (acc - ws.accuracy),
            secs
        )
    };
    let mut table = format!(
        "\nheld-out: {} problems, greedy; seed {}\n{:<24} {:>10} {:>8} {:>9}\n",
        ph.held_out_n, a.seed, "model", "accuracy", "gain", "wall s"
    );
    table.push_str(&row(
        &format!("warm start ({})", rlvr_train::counted(ws.steps, "step")),
        ws.accuracy,
        w.sft,
    ));
    table.push_str(&row("on-policy GRPO (v=1)", final_acc[0], w.on_policy));
    table.push_str(&row("off-policy GRPO (v=4)", final_acc[1], w.off_policy));
    table.push_str(&format!(
        "total {total:.1} s; {} and {}\n",
        path.display(),
        plot_path.display()
    ));
    write!(out, "{table}")?;
    Ok(())
}
