//! Peak memory and time of one training step (BENCHMARKS.md "Memory"), next to what
//! `rlvr plan`'s model predicts for the same work.
//!
//! `--mode step` (default): a random Qwen2-shaped model (`--hidden --layers --heads --kv-heads
//! --inter --vocab`, tied), `--rows` × `--seq` random tokens, log-probs of every next token with
//! entropy, loss = −mean log-prob − 0.01·mean entropy, backward, one AdamW step (f32 masters for
//! bf16). `--head chunked` forces the chunked head on the CPU (default: the model's choice).
//!
//! `--mode head`: only the head, `h` `[rows·seq, hidden]` and `W` `[vocab, hidden]` as trainable
//! tensors: `--head unfused` (h·Wᵀ, then `Model::logprobs_unfused`) or `chunked` (the CPU's fused
//! head is measured by `--mode step`, whose default head it is in f32).
//!
//! `--mode check`: the post-update weight check (`rlvr_train::update::optimizer::first_non_finite`)
//! over the model's parameters, `--reps` times (default 20): its median seconds per call, beside
//! one AdamW step's for scale.
//!
//! Prints one JSON line: peak RSS (VmHWM, MiB), seconds of the measured step, and the estimate.

use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rlvr_model::optim::{AdamW, AdamWConfig};
use rlvr_model::{Arch, Model, ModelConfig, PromptGroup, SharedPrefixBatch};
use rlvr_train::config::plan::{Shape, CPU_OVERHEAD};

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let num = |k: &str, d: usize| get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let mode = get("--mode").unwrap_or_else(|| "step".into());
    let head = get("--head").unwrap_or_else(|| "auto".into());
    let dtype = match get("--dtype").as_deref() {
        Some("bf16") => DType::BF16,
        _ => DType::F32,
    };
    let (rows, seq) = (num("--rows", 2), num("--seq", 64));
    // `--share K --prompt P`: the shared-prefix forward (`train.share_prompt`), rows/K prompts of P
    // tokens, each continued by K of the `--seq`-token rows.
    let (share, prompt) = (num("--share", 0), num("--prompt", 0));
    let config = ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: num("--vocab", 151_936),
        hidden_size: num("--hidden", 512),
        intermediate_size: num("--inter", 2048),
        num_hidden_layers: num("--layers", 8),
        num_attention_heads: num("--heads", 8),
        num_key_value_heads: num("--kv-heads", 2),
        head_dim: num("--hidden", 512) / num("--heads", 8),
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        rope_scaling: None,
        max_position_embeddings: 4096,
        sliding_window: None,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        stored_dtype: None,
        bos_token_id: None,
        eos_token_ids: vec![],
        gemma: None,
        partial_rotary_factor: 1.0,
    };
    let shape = Shape::of(&config);
    let dev = Device::Cpu;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let b = if dtype == DType::BF16 { 2u64 } else { 4 };
    if mode == "head" {
        let n = rows * seq;
        let (v, h) = (config.vocab_size, config.hidden_size);
        let rand_t = |len: usize, rng: &mut rand::rngs::StdRng| -> anyhow::Result<Var> {
            let d: Vec<f32> = (0..len).map(|_| rng.random_range(-0.1f32..0.1)).collect();
            Ok(Var::from_tensor(
                &Tensor::from_vec(d, len, &dev)?.to_dtype(dtype)?,
            )?)
        };
        let hv = rand_t(n * h, &mut rng)?;
        let wv = rand_t(v * h, &mut rng)?;
        let (hh, ww) = (
            hv.as_tensor().reshape((n, h))?,
            wv.as_tensor().reshape((v, h))?,
        );
        let targets: Vec<u32> = (0..n).map(|_| rng.random_range(0..v as u32)).collect();
        let base = peak_rss_mib();
        let t0 = Instant::now();
        let (lp, ent) = match head.as_str() {
            "unfused" => {
                let logits = rlvr_model::ops::linear(&hh.unsqueeze(0)?, &ww, None)?
                    .to_dtype(rlvr_model::ops::upcast(dtype))?;
                let tt = Tensor::from_vec(targets.clone(), (1, n), &dev)?;
                let (lp, e) = Model::logprobs_unfused(&logits, &tt, 1.0, true)?;
                (lp, e.unwrap())
            }
            _ => {
                let c = rlvr_model::chunked::chunk_width(n, v, rlvr_model::chunked::CHUNK_ELEMS);
                let (lp, e) =
                    rlvr_model::chunked::chunked_logprobs(&hh, &ww, &targets, 1.0, true, c, true)?;
                (lp, e.unwrap())
            }
        };
        let loss = (lp.sum_all()? + (ent.sum_all()? * 0.01)?)?;
        let g = loss.backward()?;
        let gw = g.get(wv.as_tensor()).map(|t| t.elem_count()).unwrap_or(0);
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{}",
            serde_json::json!({"mode": "head", "head": head, "dtype": format!("{dtype:?}"),
                "rows": n, "vocab": v, "hidden": h, "grad_w_elems": gw,
                "inputs_mib": ((n + v) * h) as f64 * b as f64 / 1048576.0,
                "rss_before_mib": base, "peak_rss_mib": peak_rss_mib(), "seconds": secs})
        );
        return Ok(());
    }
    let model = Model::random(config.clone(), 0.02, 1, dtype, &dev)?;
    let vars: Vec<Var> = model
        .named_vars()
        .into_iter()
        .map(|(_, v)| v.clone())
        .collect();
    if mode == "check" {
        return check_cost(&vars, num("--reps", 20), shape.params);
    }
    let mut opt = AdamW::new(vars, AdamWConfig::default())?;
    let ids: Vec<Vec<u32>> = (0..rows)
        .map(|_| {
            (0..seq)
                .map(|_| rng.random_range(0..config.vocab_size as u32))
                .collect()
        })
        .collect();
    let mask = vec![vec![1u32; seq]; rows];
    let after_load = peak_rss_mib();
    if head == "chunked" {
        rlvr_model::chunked::force_on_cpu(true);
    }
    let t0 = Instant::now();
    let out = match share {
        0 => model.token_logprobs(&ids, &mask, 0, 1.0, true, true)?,
        k => {
            // `rows / k` prompts of `--prompt` tokens, each with k completions of `--seq` tokens.
            let groups = (0..rows.div_ceil(k))
                .map(|g| PromptGroup {
                    prompt: (0..prompt)
                        .map(|j| ((g * 7919 + j * 104_729) % config.vocab_size) as u32)
                        .collect(),
                    completions: ids[g * k..(g * k + k).min(rows)].to_vec(),
                })
                .collect();
            model.shared_prefix_logprobs(&SharedPrefixBatch { groups }, 1.0, true, true)?
        }
    };
    let ent = out.entropy.expect("asked for entropy");
    let loss = (out.logprobs.mean_all()?.neg()? - (ent.mean_all()? * 0.01)?)?;
    let after_forward = peak_rss_mib();
    let grads = loss.backward()?;
    // What candle's backward leaves in its store besides the weights' gradients.
    let weight_ids: std::collections::HashSet<_> = model
        .named_vars()
        .into_iter()
        .map(|(_, v)| v.as_tensor().id())
        .collect();
    let (mut stored, mut others) = (0usize, 0usize);
    for id in grads.get_ids() {
        let n = grads
            .get_id(*id)
            .map_or(0, |g| g.elem_count() * g.dtype().size_in_bytes());
        stored += n;
        if !weight_ids.contains(id) {
            others += n;
        }
    }
    drop(loss);
    opt.step(&grads, 1e-6)?;
    let secs = t0.elapsed().as_secs_f64();
    // The estimate of `rlvr plan` for this work (no explorer, no reference, no KV cache; the
    // gradients are one GradStore in the compute dtype here, not the trainer's f32 sum).
    let p = shape.params;
    let t = (prompt + seq) as u64;
    let layer = shape.layer_bytes_per_token(b, t);
    let outside = shape.hidden * (b + 4 * b.max(4));
    let per_position = layer * (shape.layers + 1) + outside;
    let act = match share {
        0 => rows as u64 * t * per_position,
        k => {
            let positions = (rows.div_ceil(k) * prompt + rows * seq) as u64;
            positions * per_position
                + rows as u64
                    * shape.shared_kv_bytes_per_row_layer(b, prompt as u64, seq as u64)
                    * (shape.layers + 1)
        }
    };
    let n = match share {
        0 => (rows * (seq - 1)) as u64,
        _ => (rows * seq) as u64,
    };
    let logits = if head != "chunked" && dtype == DType::F32 {
        (n * shape.vocab * 4).min(rlvr_model::STASH_MAX_BYTES as u64)
    } else {
        6 * rlvr_model::chunked::CHUNK_ELEMS as u64 * 4 + shape.vocab * shape.hidden * b
    };
    let masters = if b == 2 { 4 * p } else { 0 };
    let est = p * b + masters + p * b + 8 * p + act + logits + CPU_OVERHEAD;
    let mib = |x: u64| x as f64 / 1048576.0;
    println!(
        "{}",
        serde_json::json!({"mode": "step", "head": head, "dtype": format!("{dtype:?}"),
            "params": p, "rows": rows, "seq": seq, "share": share, "prompt": prompt,
            "peak_rss_mib": peak_rss_mib(),
            "rss_after_load_mib": after_load, "peak_after_forward_mib": after_forward,
            "grad_store_mib": stored as f64 / 1048576.0,
            "grad_store_not_weights_mib": others as f64 / 1048576.0,
            "seconds": secs,
            "estimate_mib": mib(est), "estimate_without_overhead_mib": mib(est - CPU_OVERHEAD),
            "activations_mib": mib(act), "logits_mib": mib(logits)})
    );
    Ok(())
}

/// `--mode check`: the median seconds of the weight check over `vars` (all finite: the cheap
/// path every applied update takes) and of one AdamW step on zero gradients, `reps` each.
fn check_cost(vars: &[Var], reps: usize, params: u64) -> anyhow::Result<()> {
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let mut check = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        let bad = rlvr_train::update::optimizer::first_non_finite(vars)?;
        check.push(t0.elapsed().as_secs_f64());
        anyhow::ensure!(bad.is_none(), "a random model holds a non-finite weight");
    }
    let mut opt = AdamW::new(vars.to_vec(), AdamWConfig::default())?;
    let mut grads = candle_core::backprop::GradStore::default();
    for v in vars {
        grads.insert(v.as_tensor(), v.as_tensor().zeros_like()?);
    }
    let mut step = Vec::new();
    for _ in 0..reps.clamp(1, 5) {
        let t0 = Instant::now();
        opt.step(&grads, 1e-6)?;
        step.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "{}",
        serde_json::json!({"mode": "check", "params": params, "reps": reps,
            "check_median_s": median(check), "adamw_step_median_s": median(step)})
    );
    Ok(())
}
