//! `rlvr quickstart`: a run that visibly learns on a laptop CPU, with no download and no GPU
//! (issue 8, DESIGN.md section 11).
//!
//! Phases, each timed and shown with a progress bar:
//! 1. **init**: a character-level tokenizer made here with the `tokenizers` crate, the seeded
//!    addition problems (`042+317=` → `359`: a training pool and a disjoint held-out set of 500),
//!    and a tiny Qwen2-shaped model written by the same code as `rlvr init`.
//! 2. **sft**: a supervised warm start (token-mean cross-entropy on the answer and its EOS, as
//!    `rlvr sft`), evaluated greedily on the held-out set every few steps and stopped at the first
//!    evaluation whose accuracy lies in [10%, 50%], so that RL has room to show a gain.
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

use anyhow::{bail, Context};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Var};
use rlvr_data::generate::{ArithmeticGenConfig, Split};
use rlvr_data::sampler::PromptSampler;
use rlvr_model::checkpoint::{write_tokenizer_files, Policy};
use rlvr_model::optim::{AdamW, AdamWConfig};
use rlvr_model::{Model, TokenizerBundle};
use rlvr_reward::combine::RewardFunction;
use rlvr_train::config::{RawConfig, ResolvedConfig};
use rlvr_train::eval::{evaluate, EvalSettings};
use rlvr_train::run::{prepare_prompts, train, RunOptions};
use rlvr_train::sft::{completion_logprob_sum, read_pairs};
use serde_json::json;

use crate::init;

/// The RL config both runs start from (shipped as `configs/quickstart.toml`).
const CONFIG: &str = include_str!("../../../configs/quickstart.toml");

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

/// The fixed held-out set and how it is scored.
struct HeldOut {
    texts: Vec<String>,
    references: Vec<String>,
    reward: RewardFunction,
    settings: EvalSettings,
    task: &'static str,
}

impl HeldOut {
    fn new(cfg: &ResolvedConfig, tok: &TokenizerBundle) -> anyhow::Result<HeldOut> {
        let c = &cfg.raw;
        let p = prepare_prompts(&c.data, Split::Test, tok)?;
        Ok(HeldOut {
            texts: p.texts,
            references: p.references,
            reward: RewardFunction::from_config(&c.reward, &c.data.verifier()?)?,
            settings: EvalSettings {
                samples: 1,
                max_new_tokens: c.rollout.max_new_tokens,
                seed: 0,
                max_batch_rows: c.rollout.max_batch_rows,
                stop: c.rollout.stop.clone(),
                add_special_tokens: true,
            },
            task: c.data.task.name(),
        })
    }

    /// Greedy accuracy of `model`.
    fn accuracy(&self, model: &Model, tok: &TokenizerBundle) -> anyhow::Result<f64> {
        let (r, _) = evaluate(
            model,
            tok,
            self.task,
            &self.texts,
            &self.references,
            &self.reward,
            &self.settings,
        )?;
        Ok(r.accuracy)
    }
}

/// What the warm start reached.
struct WarmStart {
    accuracy: f64,
    steps: u64,
}

/// Supervised warm start from `init_dir` into `out_dir`: AdamW on the token-mean cross-entropy of
/// the answers (rlvr-train's SFT loss), a held-out evaluation every `plan.sft_eval_every` steps,
/// stopping at the first one inside `plan.sft_range` (or at `plan.sft_max_steps`).
fn warm_start(
    plan: &Plan,
    seed: u64,
    init_dir: &Path,
    sft_data: &Path,
    out_dir: &Path,
    held_out: &HeldOut,
) -> anyhow::Result<WarmStart> {
    let policy = Policy::load(init_dir, DType::F32, &Device::Cpu)?;
    let tok = &policy.tokenizer;
    let pairs = read_pairs(sft_data, tok, false, None)?;
    let model = policy.model;
    let vars: Vec<Var> = model
        .named_vars()
        .into_iter()
        .map(|(_, v)| v.clone())
        .collect();
    let mut opt = AdamW::new(
        vars.clone(),
        AdamWConfig {
            lr: plan.sft_lr,
            weight_decay: 0.0,
            ..AdamWConfig::default()
        },
    )?;
    let mut sampler = PromptSampler::new(pairs.len(), seed)?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let metrics = out_dir.join("metrics.jsonl");
    let mut log = String::new();
    let pb = bar(plan.sft_max_steps, "sft");
    let mut accuracy = f64::NAN;
    let mut steps = 0;
    let t0 = Instant::now();
    for step in 1..=plan.sft_max_steps {
        // Loss: −Σ ℓ / (completion tokens of the batch), one backward.
        let batch = sampler.next_batch(plan.sft_batch);
        let (sum, n) = completion_logprob_sum(&model, &pairs, &batch, tok.pad_id)?;
        let loss = (sum.neg()? / n as f64)?;
        let loss_v = loss.to_scalar::<f32>()? as f64;
        if !loss_v.is_finite() {
            bail!("warm start step {step}: non-finite loss");
        }
        let grads = loss.backward()?;
        opt.step(&clip_grads(&vars, grads, 1.0)?, plan.sft_lr)?;
        steps = step;
        pb.set_position(step);
        let mut line = json!({"step": step, "loss": loss_v});
        if step % plan.sft_eval_every == 0 || step == plan.sft_max_steps {
            accuracy = held_out.accuracy(&model, tok)?;
            line["eval/accuracy"] = json!(accuracy);
            let msg = format!("loss {loss_v:.3} held-out {:.1}%", 100.0 * accuracy);
            if pb.is_hidden() {
                eprintln!(
                    "  sft step {step}: {msg} ({:.1} s)",
                    t0.elapsed().as_secs_f64()
                );
            }
            pb.set_message(msg);
            if plan
                .sft_range
                .is_some_and(|(lo, hi)| (lo..=hi).contains(&accuracy))
            {
                log.push_str(&format!("{line}\n"));
                break;
            }
        }
        log.push_str(&format!("{line}\n"));
    }
    pb.finish();
    std::fs::write(&metrics, log).with_context(|| format!("writing {}", metrics.display()))?;
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
    model.save(out_dir, DType::F32)?;
    write_tokenizer_files(out_dir, tok)?;
    Ok(WarmStart { accuracy, steps })
}

/// Scales the gradients so their global L2 norm is at most `max_norm`.
fn clip_grads(vars: &[Var], mut grads: GradStore, max_norm: f64) -> anyhow::Result<GradStore> {
    let mut sq = 0.0;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
    }
    let norm = sq.sqrt();
    if norm > max_norm {
        let scale = max_norm / (norm + 1e-6);
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * scale)?);
            }
        }
    }
    Ok(grads)
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
    let pb = bar(3, "init");
    let data_dir = dir.join("data");
    let tok_path = dir.join("tokenizer").join("tokenizer.json");
    write_char_tokenizer(&tok_path)?;
    pb.inc(1);
    write_data(&data_dir, &plan)?;
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
        },
        &mut std::io::sink(),
    )
    .context("quickstart init")?;
    pb.inc(1);
    pb.finish();
    let cfg_path = dir.join("quickstart.toml");
    std::fs::write(&cfg_path, CONFIG).with_context(|| format!("writing {}", cfg_path.display()))?;
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
    let off_cfg = resolve(&sets(
        "off_policy",
        &["algorithm.preset=\"off_policy_grpo\"", "sync.interval=4"],
    ))?;
    let tok = TokenizerBundle::load(&init_dir)?;
    let held_out = HeldOut::new(&on_cfg, &tok)?;
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
    let rl = |cfg: &ResolvedConfig, name: &str| -> anyhow::Result<(f64, PathBuf)> {
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
            },
        )
        .with_context(|| format!("quickstart {name} run"))?;
        let ckpt = s
            .last_checkpoint
            .with_context(|| format!("the {name} run wrote no checkpoint"))?;
        Ok((t.elapsed().as_secs_f64(), ckpt))
    };
    let (s, on_ckpt) = rl(&on_cfg, "on_policy")?;
    w.on_policy = s;
    let (s, off_ckpt) = rl(&off_cfg, "off_policy")?;
    w.off_policy = s;

    // 4. eval: both final checkpoints on the held-out set.
    let t = Instant::now();
    let pb = bar(2, "eval");
    let mut final_acc = Vec::new();
    for ckpt in [&on_ckpt, &off_ckpt] {
        let p = Policy::load(ckpt, DType::F32, &Device::Cpu)?;
        final_acc.push(held_out.accuracy(&p.model, &p.tokenizer)?);
        pb.inc(1);
    }
    pb.finish();
    w.eval = t.elapsed().as_secs_f64();

    // Plot, summary, table.
    let plot_path = dir.join("comparison.svg");
    rlvr_train::plot::plot(&rlvr_train::plot::PlotArgs {
        runs: vec![dir.join("on_policy"), dir.join("off_policy")],
        metrics: vec!["eval/accuracy".into(), "reward/mean".into()],
        out: plot_path.clone(),
        width: 800,
        panel_height: 300,
    })
    .context("quickstart plot")?;
    let total = t_total.elapsed().as_secs_f64();
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
        "rl_steps": on_cfg.raw.train.steps,
        "held_out_n": held_out.texts.len(),
        "loadavg": {"start": load_start, "end": load_avg()},
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
        held_out.texts.len(),
        a.seed,
        "model",
        "accuracy",
        "gain",
        "wall s"
    );
    table.push_str(&row(
        &format!("warm start ({} steps)", ws.steps),
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
