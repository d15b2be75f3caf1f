//! Sampling throughput of the native engine and of a vLLM server on the same checkpoint and
//! prompts, and the time of a weight refresh (BENCHMARKS.md, "Native engine vs a vLLM CPU server").
//!
//! ```text
//! cargo run --release -p rlvr-vllm --example bench_sampling -- MODEL_DIR URL SERVED_NAME PROMPTS.jsonl [SHAPES] [REFRESHES]
//! ```
//! SHAPES: comma-separated `BxKxN` (prompts × group size × new tokens, exactly N: min = max new
//! tokens), default `4x8x32,32x8x128`. Prompts: the first B `question`s of PROMPTS.jsonl encoded as
//! plain text. T = 1, top-p 1, top-k off. Prints one JSON line per measurement.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rlvr_model::checkpoint::Policy;
use rlvr_model::Model;
use rlvr_rollout::{Sampler, SamplingParams};
use rlvr_vllm::{trainer_logprobs, ClientConfig, RefreshCheck, VllmClient};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err(
            "usage: bench_sampling MODEL_DIR URL SERVED_NAME PROMPTS.jsonl [SHAPES] [REFRESHES]"
                .into(),
        );
    }
    let policy = Policy::load(a[1].as_ref(), DType::F32, &Device::Cpu)?;
    let mut client = VllmClient::new(ClientConfig {
        servers: vec![a[2].clone()],
        served_model_name: a[3].clone(),
        in_flight: 64,
        // Exactly N new tokens (min = max) bans the stop ids for vLLM too: its log-probs are then
        // renormalised, which a throughput measurement may accept.
        accept_renormalised_logprobs: true,
        ..Default::default()
    })?;
    let questions: Vec<String> = std::fs::read_to_string(&a[4])?
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .map(|v| v["question"].as_str().unwrap_or("").to_string())
        })
        .collect::<Result<_, _>>()?;
    let shapes = a
        .get(5)
        .cloned()
        .unwrap_or_else(|| "4x8x32,32x8x128".into());
    let refreshes: usize = a.get(6).map(|s| s.parse()).transpose()?.unwrap_or(3);
    // Warm-up (first request compiles/allocates on the server).
    let p0 = vec![policy.tokenizer.encode(&questions[0], false)?];
    client.sample(
        &p0,
        0,
        &SamplingParams {
            max_new_tokens: 4,
            ..Default::default()
        },
        0,
    )?;
    for shape in shapes.split(',') {
        let d: Vec<usize> = shape
            .split('x')
            .map(|x| x.parse())
            .collect::<Result<_, _>>()?;
        let (b, k, n) = (d[0], d[1], d[2]);
        let prompts: Vec<Vec<u32>> = questions[..b]
            .iter()
            .map(|q| policy.tokenizer.encode(q, false))
            .collect::<Result<_, _>>()?;
        let params = SamplingParams {
            group_size: k,
            max_new_tokens: n,
            min_new_tokens: n,
            stop_ids: policy.tokenizer.eos_ids.clone(),
            ..Default::default()
        };
        let t = Instant::now();
        let native = Sampler::new(&policy.model, 0).sample(&prompts, 0, &params, 1)?;
        let native_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let vllm = client.sample(&prompts, 0, &params, 1)?;
        let vllm_s = t.elapsed().as_secs_f64();
        let toks =
            |v: &[rlvr_rollout::Completion]| v.iter().map(|c| c.token_ids.len()).sum::<usize>();
        println!(
            "{}",
            json!({"shape": shape, "native_tokens": toks(&native), "native_s": native_s,
                   "native_tok_s": toks(&native) as f64 / native_s, "vllm_tokens": toks(&vllm),
                   "vllm_s": vllm_s, "vllm_tok_s": toks(&vllm) as f64 / vllm_s})
        );
    }
    let weights = tempfile::tempdir()?;
    let other = Model::random(
        policy.model.config().clone(),
        0.02,
        5,
        DType::F32,
        &Device::Cpu,
    )?;
    let prompt = p0[0].clone();
    let completion: Vec<u32> = (0..16u32).map(|i| 1000 + 7 * i).collect();
    for r in 0..refreshes {
        let m = if r % 2 == 0 { &other } else { &policy.model };
        let tensors: Vec<(String, Tensor)> = m
            .named_vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        let expected = trainer_logprobs(m, &prompt, &completion, 1.0)?;
        let check = RefreshCheck {
            prompt: prompt.clone(),
            completion: completion.clone(),
            expected,
            tolerance: 1e-3,
        };
        let t = Instant::now();
        let timings = client.refresh(weights.path(), r as u64 + 1, &tensors, m.config(), &check)?;
        println!(
            "{}",
            json!({"refresh": r + 1, "total_s": t.elapsed().as_secs_f64(), "write_s": timings.write_s,
                   "reload_s": timings.reload_s, "verify_s": timings.verify_s, "max_abs_diff": timings.max_abs_diff})
        );
    }
    Ok(())
}
