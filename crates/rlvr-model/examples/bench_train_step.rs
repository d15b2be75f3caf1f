//! rlvr side of the policy-model train-step benchmark (BENCHMARKS.md; run both sides with
//! `bench/model_step.sh`). Work per step, identical to `bench/torch_model_step.py`: a
//! Qwen2-shaped decoder (vocab 32000, hidden 256, intermediate 704, 4 layers, 8 heads / 2 KV
//! heads, tied, f32), 8 × 128 random tokens without padding, log-probs of the next token at all
//! 127 positions, loss = −mean, backward, AdamW (lr 1e-5). Two warm-up steps, then `--steps`.
//! Prints one JSON line like the PyTorch side.
//!
//! `--arch gemma2`: the same sizes as a Gemma 2 model (transformers' defaults: final-logit
//! softcapping 30, attention softcapping 50, (1 + weight) norms, GeGLU, no biases), to time the
//! log-prob head through the softcap; `--chunked` forces the device-generic chunked head
//! (`rlvr_model::chunked::force_on_cpu`) instead of the fused CPU op, for an A/B in one binary.

use std::time::Instant;

use candle_core::{DType, Device};
use rand::{Rng, SeedableRng};
use rlvr_model::optim::{AdamW, AdamWConfig};
use rlvr_model::{Arch, Model, ModelConfig};

fn peak_rss_mb() -> f64 {
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

/// User + system CPU time of this process so far, in seconds (/proc/self/stat, clock ticks of
/// 1/100 s); NaN where unavailable.
fn cpu_time_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str, d: usize| -> usize {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (steps, batch, seq) = (arg("--steps", 5), arg("--batch", 8), arg("--seq", 128));
    let flag = |k: &str| args.iter().any(|a| a == k);
    let opt_of = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let gemma2 = match opt_of("--arch").as_deref() {
        None | Some("qwen2") => false,
        Some("gemma2") => true,
        Some(other) => anyhow::bail!("--arch {other}: qwen2 or gemma2"),
    };
    if flag("--chunked") {
        rlvr_model::chunked::force_on_cpu(true);
    }
    let mut config = ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: 32000,
        hidden_size: 256,
        intermediate_size: 704,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
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
    if gemma2 {
        config.arch = Arch::Gemma2;
        config.qkv_bias = false;
        config.gemma = rlvr_model::GemmaConfig::defaults_for(Arch::Gemma2, config.head_dim);
    }
    let model = Model::random(config, 0.02, 0, DType::F32, &Device::Cpu)?;
    let vars = model
        .named_vars()
        .into_iter()
        .map(|(_, v)| v.clone())
        .collect();
    let mut opt = AdamW::new(
        vars,
        AdamWConfig {
            lr: 1e-5,
            ..Default::default()
        },
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let ids: Vec<Vec<u32>> = (0..batch)
        .map(|_| (0..seq).map(|_| rng.random_range(0..32000)).collect())
        .collect();
    let mask = vec![vec![1u32; seq]; batch];
    let mut times = vec![];
    let mut fwd = vec![];
    let mut cpu0 = 0.0;
    for i in 0..steps + 2 {
        if i == 2 {
            cpu0 = cpu_time_s();
        }
        let t0 = Instant::now();
        let out = model.token_logprobs(&ids, &mask, 0, 1.0, false, true)?;
        let loss = out.logprobs.mean_all()?.neg()?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        opt.step(&grads, 1e-5)?;
        let dt = t0.elapsed().as_secs_f64();
        if i >= 2 {
            times.push(dt);
            fwd.push((t1 - t0).as_secs_f64());
        }
    }
    let cpu_per_step = (cpu_time_s() - cpu0) / steps as f64;
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mut fs = fwd.clone();
    fs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{}",
        serde_json::json!({
            "impl": "rlvr",
            "arch": if gemma2 { "gemma2" } else { "qwen2" },
            "head": if flag("--chunked") { "chunked" } else { "fused" },
            "step_s_median": sorted[sorted.len() / 2],
            "forward_s_median": fs[fs.len() / 2],
            "step_s_all": times,
            "cpu_s_per_step": cpu_per_step,
            "peak_rss_mb": peak_rss_mb(),
            "tokens": batch * seq,
            "threads": candle_core::utils::get_num_threads(),
            "CANDLE_NUM_THREADS": std::env::var("CANDLE_NUM_THREADS").ok(),
        })
    );
    Ok(())
}
