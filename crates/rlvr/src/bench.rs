//! `rlvr bench`: throughput of the sampler and of a training step on any device, one JSON line per
//! measurement (the rlvr side of `bench/gpu.sh`; PyTorch's side is `bench/gpu_torch.py`).
//!
//! - `rlvr bench sample`: `--batch` distinct random prompts of `--prompt-len` ids, one completion
//!   each, exactly `--new-tokens` new tokens (EOS never ends a completion), T = 1, top-p 1. Reports
//!   generated tokens per second over the whole `Sampler::sample` call and the per-decode-step
//!   breakdown from [`rlvr_rollout::DecodeTimings`] (forward, copy of the logits to the host, token
//!   selection, KV-cache compaction; the device is synchronised after each forward). The
//!   forward is split into the host's part (until every kernel is queued: the dispatch) and the
//!   wait for the device after it, so a launch-bound step (host ≈ forward, wait ≈ 0) tells
//!   itself from a device-bound one; `decode_path` (`candle`, `fused`, `fused+graphs`: the
//!   `[kernels]` switches `decode` and `cuda_graphs` resolved) and the Triton launches per step
//!   say which step ran.
//! - `rlvr bench turns`: multi-turn episodes (docs/DESIGN.md section 14) with and without the
//!   keys and values kept between turns (`rlvr_rollout::TurnCache`), side by side in one process:
//!   `--batch` episodes of a random `--prompt-len` prompt, `--turns` assistant turns of exactly
//!   `--new-tokens` each and a random bridge of `--bridge-len` ids between turns. Reports each
//!   path's median wall time, their ratio, whether the two sampled the same tokens and log-probs
//!   bit for bit (else the largest log-prob difference) and the cache's counts.
//! - `rlvr bench train`: `--rows` × `--seq-len` random tokens, log-probs of every next token
//!   (`Model::token_logprobs` with gradient), loss = −mean, backward, AdamW. Reports tokens per
//!   second and TFLOP/s counted as 6 × parameters (tied embedding once) × tokens / s, the
//!   convention PyTorch's side (bench/gpu_torch.py) uses too.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use rand::{Rng, SeedableRng};
use rlvr_model::optim::{AdamW, AdamWConfig};
use rlvr_model::Model;
use rlvr_rollout::{Sampler, SamplingParams};

/// `rlvr bench` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Sampling throughput: random prompts, fixed-length completions, per-step breakdown.
    Sample(SampleArgs),
    /// Training-step throughput: forward + backward + AdamW on random tokens.
    Train(TrainArgs),
    /// Multi-turn episodes: later turns with kept keys/values against whole-context prefills.
    Turns(TurnsArgs),
}

/// Arguments of `rlvr bench turns`.
#[derive(clap::Args, Debug)]
pub struct TurnsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Episodes sampled together.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    /// Assistant turns per episode.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// New tokens per turn (EOS disabled).
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// Bridge ids between turns (random; at least 1, as an environment's reply renders).
    #[arg(long, default_value_t = 16)]
    pub bridge_len: usize,
    /// Timed runs of each path, alternating, after one untimed warm-up run of each.
    #[arg(long, default_value_t = 2)]
    pub runs: usize,
}

/// Model and device options shared by both benchmarks.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// Model directory (e.g. written by `rlvr init`).
    #[arg(long)]
    pub model: PathBuf,
    /// Device: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Seed of the random prompts or tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Arguments of `rlvr bench sample`.
#[derive(clap::Args, Debug)]
pub struct SampleArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Rows decoded together; repeat for several (e.g. --batch 64 --batch 256).
    #[arg(long = "batch", default_values_t = [64usize])]
    pub batch: Vec<usize>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    /// New tokens per completion (EOS disabled).
    #[arg(long, default_value_t = 256)]
    pub new_tokens: usize,
    /// Timed runs per batch size, after one untimed warm-up run.
    #[arg(long, default_value_t = 2)]
    pub runs: usize,
    /// The fused GPU kernels to use, for A/B runs (as `bench train --fused`; the decode step's are
    /// `decode` and `cuda_graphs`): `all`, `none`, or a comma-separated list. Default: each
    /// `auto`. On the CPU a no-op.
    #[arg(long, value_name = "LIST")]
    pub fused: Option<String>,
}

/// Arguments of `rlvr bench train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    pub rows: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    /// Timed steps, after two untimed warm-up steps.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// The fused GPU kernels to use, for A/B runs: `all`, `none`, or a comma-separated list of
    /// `attention`, `rms_norm`, `rotary`, `swiglu`, `logprob_head`, `adamw` (those on, the rest
    /// off). Default: each `auto` (on only once verified on a GPU: none is yet). On the CPU the
    /// fused kernels are a no-op.
    #[arg(long, value_name = "LIST")]
    pub fused: Option<String>,
}

fn load(a: &ModelArgs) -> anyhow::Result<Model> {
    let dtype = rlvr_model::parse_dtype(&a.dtype)
        .with_context(|| format!("--dtype {:?}: expected f32 or bf16", a.dtype))?;
    let device = rlvr_model::parse_device(&a.device)?;
    rlvr_train::store::manifest::load_model(&a.model, dtype, &device)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `rlvr bench`.
pub fn run(cmd: &BenchCommand, out: &mut dyn Write) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Sample(a) => sample(a, out),
        BenchCommand::Train(a) => train(a, out),
        BenchCommand::Turns(a) => turns(a, out),
    }
}

/// The most rows of a benchmark batch (`--batch`, `--rows`).
pub const MAX_BENCH_ROWS: usize = 65536;

/// The most timed repetitions (`bench sample --runs`, `bench train --steps`).
pub const MAX_BENCH_REPEATS: usize = 100_000;

/// Refuses `value` of `flag` outside `1..=max`, naming both.
fn in_range(flag: &str, value: usize, max: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=max).contains(&value),
        "{flag} {value} is out of range: expected 1 to {max}"
    );
    Ok(())
}

/// Refuses `positions` (prompt and new tokens, or a row's length) beyond the model's
/// `max_position_embeddings`, naming `flags`.
fn fits(model: &Model, flags: &str, positions: usize) -> anyhow::Result<()> {
    let max = model.config().max_position_embeddings;
    anyhow::ensure!(
        positions <= max,
        "{flags} = {positions} positions is out of range: at most the model's \
         max_position_embeddings = {max}"
    );
    Ok(())
}

fn sample(a: &SampleArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.prompt_len > 0 && a.new_tokens > 0,
        "--prompt-len and --new-tokens must be > 0"
    );
    in_range("--runs", a.runs, MAX_BENCH_REPEATS)?;
    for &batch in &a.batch {
        in_range("--batch", batch, MAX_BENCH_ROWS)?;
    }
    let mut model = load(&a.model)?;
    if let Some(list) = &a.fused {
        model.set_kernels(rlvr_model::KernelSwitches::from_fused_list(list)?);
    }
    fits(
        &model,
        "--prompt-len + --new-tokens",
        a.prompt_len.saturating_add(a.new_tokens),
    )?;
    let vocab = model.config().vocab_size as u32;
    for &batch in &a.batch {
        anyhow::ensure!(batch > 0, "--batch must be at least 1");
        let mut rng = rand::rngs::StdRng::seed_from_u64(a.model.seed);
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|_| {
                (0..a.prompt_len)
                    .map(|_| rng.random_range(0..vocab))
                    .collect()
            })
            .collect();
        let params = SamplingParams {
            group_size: 1,
            max_new_tokens: a.new_tokens,
            min_new_tokens: a.new_tokens,
            max_batch_rows: batch,
            ..Default::default()
        };
        Sampler::new(&model, 0).sample(&prompts, 0, &params, a.model.seed)?; // warm-up
        let sampler = Sampler::new(&model, 0).with_timings();
        let mut walls = Vec::with_capacity(a.runs);
        for r in 0..a.runs {
            let t = Instant::now();
            let seed = a.model.seed.wrapping_add(1 + r as u64);
            let c = sampler.sample(&prompts, 0, &params, seed)?;
            walls.push(t.elapsed().as_secs_f64());
            let n: usize = c.iter().map(|c| c.token_ids.len()).sum();
            anyhow::ensure!(
                n == batch * a.new_tokens,
                "generated {n} tokens, expected {}",
                batch * a.new_tokens
            );
        }
        let d = sampler.timings().expect("timings are on");
        let steps = d.steps.max(1) as f64;
        let runs = a.runs as f64;
        let wall = median(walls);
        writeln!(
            out,
            "{}",
            serde_json::json!({
                "impl": "rlvr", "what": "sample", "device": a.model.device, "dtype": a.model.dtype,
                "batch": batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
                "wall_s": wall,
                "tok_per_s": (batch * a.new_tokens) as f64 / wall,
                "prefill_s": d.prefill_s / runs,
                "pack_s": d.pack_s / runs,
                "decode_path": sampler.decode_path().name(),
                "triton_launches_per_step": d.triton_launches as f64 / steps,
                "fused_builds_per_run": d.fused_builds as f64 / runs,
                "step_ms": {
                    "total": (d.forward_s + d.to_host_s + d.select_s + d.compact_s) / steps * 1e3,
                    "forward": d.forward_s / steps * 1e3,
                    "forward_host": d.forward_host_s / steps * 1e3,
                    "forward_device_wait": (d.forward_s - d.forward_host_s).max(0.0) / steps * 1e3,
                    "to_host": d.to_host_s / steps * 1e3,
                    "select": d.select_s / steps * 1e3,
                    "compact": d.compact_s / steps * 1e3,
                },
            })
        )?;
    }
    Ok(())
}

/// One batch of `a`'s episodes: every turn's completions in order; with `cache`, the keys and
/// values kept between turns.
fn episodes(
    sampler: &Sampler,
    a: &TurnsArgs,
    prompts: &[Vec<u32>],
    bridges: &[Vec<u32>],
    seed: u64,
    mut cache: Option<&mut rlvr_rollout::TurnCache>,
) -> anyhow::Result<Vec<rlvr_rollout::Completion>> {
    let params = SamplingParams {
        group_size: 1,
        max_new_tokens: a.new_tokens,
        min_new_tokens: a.new_tokens,
        max_batch_rows: a.batch,
        ..Default::default()
    };
    let mut last = match cache.as_deref_mut() {
        Some(c) => sampler.sample_keeping(prompts, 0, &params, seed, c)?,
        None => sampler.sample(prompts, 0, &params, seed)?,
    };
    let mut contexts: Vec<Vec<u32>> = prompts.to_vec();
    let mut all = last.clone();
    for turn in 2..=a.turns as u64 {
        let rows: Vec<rlvr_rollout::TurnRow> = contexts
            .iter_mut()
            .zip(&last)
            .enumerate()
            .map(|(i, (ctx, c))| {
                ctx.extend(&c.token_ids);
                ctx.extend(&bridges[i]);
                rlvr_rollout::TurnRow {
                    context: ctx.clone(),
                    prompt_index: i,
                    sample_index: 0,
                    turn,
                }
            })
            .collect();
        last = match cache.as_deref_mut() {
            Some(c) => sampler.sample_each_kept(&rows, &params, seed, c)?,
            None => sampler.sample_each(&rows, &params, seed)?,
        };
        all.extend(last.iter().cloned());
    }
    Ok(all)
}

fn turns(a: &TurnsArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.prompt_len > 0 && a.new_tokens > 0 && a.turns > 0 && a.bridge_len > 0,
        "--prompt-len, --new-tokens, --turns and --bridge-len must be > 0"
    );
    in_range("--runs", a.runs, MAX_BENCH_REPEATS)?;
    in_range("--batch", a.batch, MAX_BENCH_ROWS)?;
    in_range("--turns", a.turns, 1024)?;
    let model = load(&a.model)?;
    let per_turn = a.new_tokens.saturating_add(a.bridge_len);
    fits(
        &model,
        "--prompt-len + --turns × (--new-tokens + --bridge-len)",
        a.prompt_len
            .saturating_add(per_turn.saturating_mul(a.turns)),
    )?;
    let vocab = model.config().vocab_size as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.model.seed);
    let mut random =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..vocab)).collect() };
    let prompts: Vec<Vec<u32>> = (0..a.batch).map(|_| random(a.prompt_len)).collect();
    let bridges: Vec<Vec<u32>> = (0..a.batch).map(|_| random(a.bridge_len)).collect();
    let sampler = Sampler::new(&model, 0);
    let seed = a.model.seed;
    let mut cache = rlvr_rollout::TurnCache::new(rlvr_rollout::DEFAULT_TURN_CACHE_BYTES);
    // Warm-up, and the two paths' samples compared.
    let plain = episodes(&sampler, a, &prompts, &bridges, seed, None)?;
    let kept = episodes(&sampler, a, &prompts, &bridges, seed, Some(&mut cache))?;
    let same_tokens = plain
        .iter()
        .zip(&kept)
        .all(|(p, k)| p.token_ids == k.token_ids);
    let same_bits = same_tokens && plain == kept;
    let max_diff = plain
        .iter()
        .zip(&kept)
        .take_while(|(p, k)| p.token_ids == k.token_ids)
        .flat_map(|(p, k)| p.behaviour_logprobs.iter().zip(&k.behaviour_logprobs))
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let stats = cache.stats();
    let (mut w_plain, mut w_kept) = (Vec::new(), Vec::new());
    for _ in 0..a.runs {
        let t = Instant::now();
        episodes(&sampler, a, &prompts, &bridges, seed, None)?;
        w_plain.push(t.elapsed().as_secs_f64());
        let mut c = rlvr_rollout::TurnCache::new(rlvr_rollout::DEFAULT_TURN_CACHE_BYTES);
        let t = Instant::now();
        episodes(&sampler, a, &prompts, &bridges, seed, Some(&mut c))?;
        w_kept.push(t.elapsed().as_secs_f64());
    }
    let (plain_s, kept_s) = (median(w_plain), median(w_kept));
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "impl": "rlvr", "what": "turns", "device": a.model.device, "dtype": a.model.dtype,
            "batch": a.batch, "prompt_len": a.prompt_len, "turns": a.turns,
            "new_tokens": a.new_tokens, "bridge_len": a.bridge_len, "runs": a.runs,
            "re_prefill_s": plain_s, "kept_s": kept_s, "speedup": plain_s / kept_s,
            "same_tokens": same_tokens, "same_bits": same_bits,
            "max_abs_logprob_diff": max_diff,
            "cache": stats,
        })
    )?;
    Ok(())
}

fn train(a: &TrainArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.rows > 0 && a.seq_len > 1,
        "--rows must be > 0 and --seq-len > 1"
    );
    in_range("--rows", a.rows, MAX_BENCH_ROWS)?;
    in_range("--steps", a.steps, MAX_BENCH_REPEATS)?;
    let mut model = load(&a.model)?;
    let kernels = match &a.fused {
        Some(list) => rlvr_model::KernelSwitches::from_fused_list(list)?,
        None => rlvr_model::KernelSwitches::default(),
    };
    model.set_kernels(kernels);
    fits(&model, "--seq-len", a.seq_len)?;
    let dev = model.device().clone();
    let vars: Vec<_> = model
        .named_vars()
        .into_iter()
        .map(|(_, v)| v.clone())
        .collect();
    let params: usize = vars.iter().map(|v| v.elem_count()).sum();
    let mut opt = AdamW::new(
        vars,
        AdamWConfig {
            lr: 1e-5,
            ..Default::default()
        },
    )?;
    // `--fused adamw` (or `all`): one launch per parameter tensor.
    opt.set_fused(model.fused_adamw());
    let vocab = model.config().vocab_size as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.model.seed);
    let ids: Vec<Vec<u32>> = (0..a.rows)
        .map(|_| (0..a.seq_len).map(|_| rng.random_range(0..vocab)).collect())
        .collect();
    let mask = vec![vec![1u32; a.seq_len]; a.rows];
    let (mut steps, mut fwds, mut bwds, mut opts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..a.steps + 2 {
        dev.synchronize()?;
        let t0 = Instant::now();
        let lp = model.token_logprobs(&ids, &mask, 0, 1.0, false, true)?;
        let loss = lp.logprobs.mean_all()?.neg()?;
        dev.synchronize()?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        dev.synchronize()?;
        let t2 = Instant::now();
        opt.step(&grads, 1e-5)?;
        dev.synchronize()?;
        if i >= 2 {
            steps.push(t0.elapsed().as_secs_f64());
            fwds.push((t1 - t0).as_secs_f64());
            bwds.push((t2 - t1).as_secs_f64());
            opts.push(t2.elapsed().as_secs_f64());
        }
    }
    let step = median(steps);
    let tokens = (a.rows * a.seq_len) as f64;
    // `rlvr plan`'s estimate of this step, to set beside the peak measured outside
    // (`bench/gpu.sh` polls the GPU's memory).
    let cfg = model.config();
    let attention = match dev.is_cuda()
        && kernels.runs_on_gpu(rlvr_model::FusedOp::Attention, cfg, model.dtype())
    {
        true => rlvr_train::config::plan::AttentionPath::Fused,
        false => rlvr_train::config::plan::AttentionPath::Eager,
    };
    let plan_bytes = rlvr_train::config::plan::step_bytes(
        cfg,
        model.dtype(),
        dev.is_cuda(),
        a.rows as u64,
        a.seq_len as u64,
        attention,
    );
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "impl": "rlvr", "what": "train", "device": a.model.device, "dtype": a.model.dtype,
            "rows": a.rows, "seq_len": a.seq_len, "params": params,
            "kernels": kernels.summary(),
            "attention": attention,
            "plan_peak_mib": plan_bytes as f64 / 1048576.0,
            "step_s": step, "forward_s": median(fwds), "backward_s": median(bwds),
            "optimizer_s": median(opts),
            "tok_per_s": tokens / step,
            "tflop_per_s": 6.0 * params as f64 * tokens / step / 1e12,
        })
    )?;
    Ok(())
}
