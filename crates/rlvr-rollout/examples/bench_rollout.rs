//! Rust side of the rollout benchmark (see `bench/rollout.sh`, which runs it next to
//! `bench/rollout_torch.py`, and `crates/rlvr-rollout/BENCH.md`).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p rlvr-rollout --example bench_rollout -- \
//!     [--runs 3] [--temperature 1] [--top-p 0.9] [--top-k 0]
//! ```
//!
//! Model: Qwen2-shaped, vocab 32000, hidden 256, intermediate 704, 4 layers, 8 heads / 2 KV
//! heads, tied, f32, random init std 0.02 (the shape of the policy-model train-step benchmark). Work: 8 prompts × 1
//! and 2 prompts × 4 (one prefill per group), prompts of 32 random tokens, 128 new tokens, EOS
//! disabled. One warm-up call per scenario, then `--runs` timed calls of `Sampler::sample`; prints
//! one JSON line per scenario with the median (and best) generated tok/s, prefill included in the
//! time.

use std::time::Instant;

use candle_core::{DType, Device};
use rand::{Rng, SeedableRng};
use rlvr_model::{Model, ModelConfig};
use rlvr_rollout::{Sampler, SamplingParams};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().ok().expect("bad argument value"))
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = arg(&args, "--runs", 3);
    let temperature: f64 = arg(&args, "--temperature", 1.0);
    let top_p: f64 = arg(&args, "--top-p", 0.9);
    let top_k: usize = arg(&args, "--top-k", 0);
    let config = ModelConfig::from_json(
        &serde_json::json!({
            "model_type": "qwen2", "vocab_size": 32000, "hidden_size": 256,
            "intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "max_position_embeddings": 2048,
            "tie_word_embeddings": true, "rope_theta": 10000.0
        }),
        "bench".as_ref(),
    )?;
    let model = Model::random(config, 0.02, 0, DType::F32, &Device::Cpu)?;
    let sampler = Sampler::new(&model, 0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for (n_prompts, k) in [(8usize, 1usize), (2, 4)] {
        let prompts: Vec<Vec<u32>> = (0..n_prompts)
            .map(|_| (0..32).map(|_| rng.random_range(0..32000u32)).collect())
            .collect();
        let params = SamplingParams {
            group_size: k,
            temperature,
            top_p,
            top_k: (top_k > 0).then_some(top_k),
            max_new_tokens: 128,
            min_new_tokens: 0,
            ..Default::default()
        };
        sampler.sample(&prompts, 0, &params, 0)?; // warm-up
        let mut times = Vec::with_capacity(runs);
        let mut tokens = 0;
        for r in 0..runs {
            let t0 = Instant::now();
            let out = sampler.sample(&prompts, 0, &params, r as u64 + 1)?;
            times.push(t0.elapsed().as_secs_f64());
            tokens = out.iter().map(|c| c.token_ids.len()).sum::<usize>();
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let med = sorted[sorted.len() / 2];
        println!(
            "{}",
            serde_json::json!({
                "impl": "rlvr", "prompts": n_prompts, "group_size": k, "new_tokens": 128,
                "tok_per_s": tokens as f64 / med, "tok_per_s_best": tokens as f64 / sorted[0],
                "s_all": times,
                "threads": candle_core::utils::get_num_threads(),
                "temperature": temperature, "top_p": top_p, "top_k": top_k,
            })
        );
    }
    Ok(())
}
