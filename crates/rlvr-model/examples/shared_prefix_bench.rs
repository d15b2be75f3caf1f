//! Shared-prefix vs unshared training forward + backward: one group of K completions of
//! one prompt, the loss −Σ ℓ over the completion tokens (with entropy, as the trainer asks),
//! backward; no optimizer step (the same in both). Each mode runs in its own child process so
//! that peak memory is its own: `peak_rss_mb` is the peak resident memory over the warm-up and the
//! measured steps (Linux resets the peak through `/proc/self/clear_refs` once the model is built),
//! `step_peak_mb` that peak above the resident model (`model_rss_mb`), and `activation_peak_mb`
//! that minus the weight gradients (`grad_mb`, the same in both modes): the activations kept for
//! the backward and the temporaries of the step. Prints one JSON line per mode and the ratios.
//!
//! ```sh
//! cargo run --release -p rlvr-model --example shared_prefix_bench -- \
//!     [--hidden 256 --layers 4 --heads 8 --kv-heads 2 --intermediate 704 --vocab 32000] \
//!     [--prompt 110 --k 8 --completion 64 --steps 3 --checkpointing 0]
//! ```
//! Qwen2.5-0.5B's shape: `--hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864
//! --vocab 151936` (fewer `--layers` to fit a small machine).

use std::process::Command;
use std::time::Instant;

use candle_core::{DType, Device};
use rand::{Rng, SeedableRng};
use rlvr_model::{Arch, Model, ModelConfig, PromptGroup, SharedPrefixBatch};

/// A `/proc/self/status` field in MB (`VmHWM`, `VmRSS`); NaN where unavailable.
fn status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// User + system CPU time of this process so far, in seconds (`/proc/self/stat` fields 14 and
/// 15, clock ticks of 1/100 s); NaN where unavailable. On a loaded machine it is the steadier
/// measure of work than wall time.
fn cpu_time_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

/// Resets the process's peak RSS to its current RSS (Linux: `5` to `/proc/self/clear_refs`).
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
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
    let mode = args
        .iter()
        .position(|a| a == "--mode")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let Some(mode) = mode else {
        // Parent: one child per mode, then the ratios.
        let mut lines = vec![];
        for m in ["unshared", "shared"] {
            let out = Command::new(std::env::current_exe()?)
                .args(&args[1..])
                .args(["--mode", m])
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "{m}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8(out.stdout)?.trim().to_string();
            println!("{line}");
            lines.push(serde_json::from_str::<serde_json::Value>(&line)?);
        }
        let ratio = |k: &str| {
            lines[0][k].as_f64().unwrap_or(f64::NAN) / lines[1][k].as_f64().unwrap_or(f64::NAN)
        };
        println!(
            "{}",
            serde_json::json!({
                "speedup_step": ratio("step_s_median"),
                "speedup_step_cpu": ratio("step_cpu_s_median"),
                "ratio_step_peak_mb": ratio("step_peak_mb"),
                "ratio_activation_peak_mb": ratio("activation_peak_mb"),
                "ratio_peak_rss_mb": ratio("peak_rss_mb"),
                "ratio_decoder_positions": ratio("decoder_positions"),
            })
        );
        return Ok(());
    };
    let (hidden, heads) = (arg("--hidden", 256), arg("--heads", 8));
    let config = ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: arg("--vocab", 32000),
        hidden_size: hidden,
        intermediate_size: arg("--intermediate", 704),
        num_hidden_layers: arg("--layers", 4),
        num_attention_heads: heads,
        num_key_value_heads: arg("--kv-heads", 2),
        head_dim: hidden / heads,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        rope_scaling: None,
        max_position_embeddings: 32768,
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
    let vocab = config.vocab_size as u32;
    let (p, k, c, steps) = (
        arg("--prompt", 110),
        arg("--k", 8),
        arg("--completion", 64),
        arg("--steps", 3),
    );
    let mut model = Model::random(config.clone(), 0.02, 0, DType::F32, &Device::Cpu)?;
    model.set_gradient_checkpointing(arg("--checkpointing", 0) != 0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let group = PromptGroup {
        prompt: (0..p).map(|_| rng.random_range(0..vocab)).collect(),
        completions: (0..k)
            .map(|_| (0..c).map(|_| rng.random_range(0..vocab)).collect())
            .collect(),
    };
    let batch = SharedPrefixBatch {
        groups: vec![group.clone()],
    };
    // The unshared rows as rlvr-train packs them: [prompt, completion], scored from P − 1.
    let ids: Vec<Vec<u32>> = group
        .completions
        .iter()
        .map(|x| [&group.prompt[..], x].concat())
        .collect();
    let mask = vec![vec![1u32; p + c]; k];
    let at = vec![(0..c).collect::<Vec<usize>>(); k];
    let step = || -> anyhow::Result<(f64, f64, f64)> {
        let (t0, c0) = (Instant::now(), cpu_time_s());
        let out = match mode.as_str() {
            "shared" => model.shared_prefix_logprobs(&batch, 1.0, true, true)?,
            _ => model.token_logprobs_at(&ids, &mask, p - 1, &at, 1.0, true, true)?,
        };
        let loss = out.logprobs.sum_all()?.neg()?;
        let fwd = t0.elapsed().as_secs_f64();
        let grads = rlvr_model::recompute::backward(&loss)?;
        std::hint::black_box(&grads);
        drop(grads);
        Ok((t0.elapsed().as_secs_f64(), fwd, cpu_time_s() - c0))
    };
    // The peak over the warm-up and the measured steps, above the resident model.
    let before = status_mb("VmRSS:");
    let reset = reset_peak();
    step()?; // warm-up
    let (mut times, mut fwds, mut cpus) = (vec![], vec![], vec![]);
    for _ in 0..steps {
        let (t, f, c) = step()?;
        times.push(t);
        fwds.push(f);
        cpus.push(c);
    }
    let step_peak = status_mb("VmHWM:") - before;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
        v[v.len() / 2]
    };
    let positions = match mode.as_str() {
        "shared" => batch.decoder_positions(),
        _ => batch.unshared_positions(),
    };
    let check = model.shared_prefix_logprobs(&batch, 1.0, false, false)?;
    let lp_sum: f64 = check
        .logprobs
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar()?;
    let grad_mb = model
        .named_vars()
        .iter()
        .map(|(_, v)| v.elem_count() * 4)
        .sum::<usize>() as f64
        / (1 << 20) as f64;
    println!(
        "{}",
        serde_json::json!({
            "mode": mode,
            "step_s_median": median(&mut times.clone()),
            "forward_s_median": median(&mut fwds),
            "step_s_all": times,
            "step_cpu_s_median": median(&mut cpus.clone()),
            "step_cpu_s_all": cpus,
            "step_peak_mb": if reset { step_peak } else { f64::NAN },
            "activation_peak_mb": if reset { step_peak - grad_mb } else { f64::NAN },
            "grad_mb": grad_mb,
            "peak_rss_mb": status_mb("VmHWM:"),
            "model_rss_mb": before,
            "decoder_positions": positions,
            "logprob_sum": lp_sum,
            "layers": config.num_hidden_layers,
            "hidden": hidden,
            "vocab": config.vocab_size,
            "prompt": p, "k": k, "completion": c,
            "checkpointing": model.gradient_checkpointing(),
            "threads": candle_core::utils::get_num_threads(),
        })
    );
    Ok(())
}
