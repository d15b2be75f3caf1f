//! Tests of the fused decode step's program on the CPU (`crate::fused`).

use candle_core::{Device, Tensor};
use rlvr_kernels::triton::{self, DeviceBuffer, Manifest, Recorder, Target};
use rlvr_model::{Model, ModelConfig};

use super::*;
use crate::decode::{forward_last, KvBuffer, MASK_BIAS};

fn config(layers: usize, heads: usize, kv: usize, max_pos: usize) -> ModelConfig {
    ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 64 * heads,
            "intermediate_size": 96, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "max_position_embeddings": max_pos}),
        "inline".as_ref(),
    )
    .unwrap()
}

fn manifest() -> Option<&'static Manifest> {
    let m = Manifest::committed().ok()?;
    m.kernels.iter().any(|k| k.family == "decode").then_some(m)
}

/// What each op is, in order: the kernel variant or `gemm <weight>`.
fn names(p: &StepProgram) -> Vec<String> {
    p.ops
        .iter()
        .map(|o| match o {
            Op::Launch { plan, .. } => plan.name.clone(),
            Op::Gemm { w: Buf::W(w), .. } => match w {
                Weight::Layer(_, n) => format!("gemm {}", n.trim_end_matches(".weight")),
                Weight::Head => "gemm head".into(),
                Weight::FinalNorm => "gemm final_norm".into(),
                Weight::LoraA(_, p) => format!("lora_A {p}"),
                Weight::LoraB(_, p) => format!("lora_B {p}"),
            },
            Op::Gemm { .. } => "gemm ?".into(),
        })
        .collect()
}

/// The op list of a 2-layer Qwen2-shaped model: the order of the layer's launches, the residual
/// stream passed between the two X buffers, the final norm, the counts (6 kernels and 7
/// projections per layer, one kernel and the head besides).
#[test]
fn the_step_program_is_the_layer_list() {
    let Some(m) = manifest() else { return };
    let model = Model::random(config(2, 2, 1, 512), 0.05, 1, DType::F32, &Device::Cpu).unwrap();
    let shape = StepShape::of(&model, 4, 306).unwrap();
    let p = StepProgram::build(shape, m, Target::Sm90a).unwrap();
    let layer = [
        "gemm self_attn.q_proj",
        "gemm self_attn.k_proj",
        "gemm self_attn.v_proj",
        "decode_rope_kv_f32_d64",
        "decode_attn_f32_d64",
        "decode_attn_combine_f32_d64",
        "gemm self_attn.o_proj",
        "rmsnorm_add_fwd_f32_h128",
        "gemm mlp.gate_proj",
        "gemm mlp.up_proj",
        "swiglu_fwd_f32",
        "gemm mlp.down_proj",
        "rmsnorm_add_fwd_f32_h128",
    ];
    let mut want = vec!["rmsnorm_fwd_f32_h128".to_string()];
    for _ in 0..2 {
        want.extend(layer.iter().map(|s| s.to_string()));
    }
    want.push("gemm head".into());
    assert_eq!(names(&p), want);
    assert_eq!(p.counts(), (1 + 6 * 2, 7 * 2 + 1));
    assert_eq!((p.n_splits, p.split.splits(301)), (2, 2));
    // Qwen2: q, k, v carry a bias, the rest do not.
    let biased: Vec<bool> = (p.ops.iter())
        .filter_map(|o| match o {
            Op::Gemm { bias, .. } => Some(bias.is_some()),
            _ => None,
        })
        .take(7)
        .collect();
    assert_eq!(biased, [true, true, true, false, false, false, false]);
    // The residual stream: each add reads the X the previous one wrote and writes the other;
    // the last one's norm is the final norm, the others' the next input norm.
    let adds: Vec<(Buf, Buf, Buf)> = (p.ops.iter())
        .filter_map(|o| match o {
            Op::Launch { plan, bind } if plan.entry == "rmsnorm_add_fwd_kernel" => {
                let get = |n: &str| bind.iter().find(|(k, _)| k == n).unwrap().1;
                Some((get("residual"), get("h_out"), get("w")))
            }
            _ => None,
        })
        .collect();
    let x: Vec<(Buf, Buf)> = adds.iter().map(|a| (a.0, a.1)).collect();
    assert_eq!(
        x,
        [
            (Buf::X(0), Buf::X(1)),
            (Buf::X(1), Buf::X(0)),
            (Buf::X(0), Buf::X(1)),
            (Buf::X(1), Buf::X(0))
        ]
    );
    assert_eq!(
        adds.iter().map(|a| a.2).collect::<Vec<_>>(),
        [
            Buf::W(Weight::Layer(0, "post_attention_layernorm.weight")),
            Buf::W(Weight::Layer(1, "input_layernorm.weight")),
            Buf::W(Weight::Layer(1, "post_attention_layernorm.weight")),
            Buf::W(Weight::FinalNorm),
        ]
    );
    // Every launch's caches are its own layer's.
    for (i, o) in p.ops.iter().enumerate() {
        if let Op::Launch { bind, .. } = o {
            let layer = (i.saturating_sub(1)) / 13;
            for (_, b) in bind {
                if let Buf::KCache(l) | Buf::VCache(l) = b {
                    assert_eq!(*l, layer, "op {i}");
                }
            }
        }
    }
}

/// Every launch resolves against the buffer plan: device buffers of the program's sizes at
/// 256-byte-aligned stand-in addresses give each pointer its buffer, of the right dtype; the
/// grids are the step's (rows, kv heads and splits for the attention); Qwen2, Llama-style GQA
/// and Qwen3 (its head norms).
#[test]
fn every_launch_resolves_against_the_buffer_plan() {
    let Some(m) = manifest() else { return };
    let models = [
        (config(1, 2, 1, 4096), DType::F32, 1),
        (config(1, 14, 2, 4096), DType::BF16, 2),
        (qwen3_config(1, 4096), DType::BF16, 1),
    ];
    for (cfg, dtype, kv) in models {
        let model = Model::random(cfg, 0.05, 1, dtype, &Device::Cpu).unwrap();
        let p =
            StepProgram::build(StepShape::of(&model, 64, 2000).unwrap(), m, Target::Sm90a).unwrap();
        let mut at = 1u64 << 20;
        let dev: std::collections::BTreeMap<Buf, DeviceBuffer> = (p.sizes().into_iter())
            .map(|(b, (dt, len))| {
                let d = DeviceBuffer {
                    ptr: at,
                    dtype: dt,
                    len,
                };
                at += ((len * dt.size()) as u64).div_ceil(256) * 256;
                (b, d)
            })
            .collect();
        for o in &p.ops {
            match o {
                Op::Launch { plan, bind } => {
                    let bufs: Vec<(&str, DeviceBuffer)> =
                        bind.iter().map(|(n, b)| (n.as_str(), dev[b])).collect();
                    plan.resolve(&bufs).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(
                        plan.buffers().len(),
                        bind.len(),
                        "{}: every name bound once",
                        plan.name
                    );
                    if plan.entry == "decode_attn_kernel" {
                        assert_eq!(plan.grid, [64, kv as u32, p.n_splits as u32]);
                    }
                }
                Op::Gemm {
                    x, w, out, m, n, k, ..
                } => {
                    assert!(dev[x].len >= m * k && dev[w].len == n * k && dev[out].len >= m * n);
                }
            }
        }
        assert_eq!(p.n_splits, 8); // 2000 columns: cdiv(2000, 256)
    }
}

/// A Qwen3-shaped config (q/k norms, an explicit head dim).
fn qwen3_config(layers: usize, max_pos: usize) -> ModelConfig {
    ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 128,
            "intermediate_size": 96, "num_hidden_layers": layers, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": max_pos}),
        "inline".as_ref(),
    )
    .unwrap()
}

/// What the fused step refuses (the sampler keeps the candle step for these).
#[test]
fn uncovered_models_are_refused() {
    let m = Model::random(config(1, 2, 1, 64), 0.05, 1, DType::F16, &Device::Cpu).unwrap();
    assert!(StepShape::of(&m, 1, 8)
        .unwrap_err()
        .to_string()
        .contains("F16"));
    let m = Model::random(config(1, 2, 1, 64), 0.05, 1, DType::F32, &Device::Cpu).unwrap();
    assert!(StepShape::of(&m, 0, 8).is_err());
}

fn host(t: &Tensor) -> Vec<f32> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// `model`'s completions of `prompts` on the host fused path ([`HostStep`]), asserting that a
/// fused step ran.
fn host_fused_sample(
    model: &Model,
    prompts: &[Vec<u32>],
    params: &crate::SamplingParams,
    seed: u64,
) -> Vec<crate::Completion> {
    let before = HOST_STEPS.with(std::cell::Cell::get);
    HOST_FUSED.with(|c| c.set(true));
    let got = crate::Sampler::new(model, 0).sample(prompts, 0, params, seed);
    HOST_FUSED.with(|c| c.set(false));
    assert!(
        HOST_STEPS.with(std::cell::Cell::get) > before,
        "no fused step ran"
    );
    got.unwrap()
}

/// The same completions (prompt, sample, tokens, finish reason) with behaviour log-probs within
/// 1e-5.
fn assert_close(got: &[crate::Completion], want: &[crate::Completion]) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        let key = |c: &crate::Completion| {
            (
                c.prompt_index,
                c.sample_index,
                c.token_ids.clone(),
                c.finish_reason,
            )
        };
        assert_eq!(key(a), key(b));
        for (x, y) in a.behaviour_logprobs.iter().zip(&b.behaviour_logprobs) {
            assert!((x - y).abs() <= 1e-5, "{x} vs {y}");
        }
    }
}

/// The host emulation of the program against the candle decode step of the same model on the
/// same cache, over three steps (greedy tokens): two prompts of 300 and 261 tokens (left
/// padding masked by the bias rows, a cache of two splits), three rows per prompt copied from
/// the prefill; the logits agree within 2e-5 and every step's new cache column within 1e-6.
/// With a recorder (`RLVR_KERNEL_RECORD` in CI, else a temporary directory), the first launch of
/// each of the six kernels is written with the emulation's inputs and outputs, which
/// `scripts/ci_kernels.sh` replays under Triton's interpreter.
#[test]
fn the_host_step_equals_the_candle_step_and_records_its_launches() {
    let Some(m) = manifest() else { return };
    let model = Model::random(config(2, 2, 1, 512), 0.05, 5, DType::F32, &Device::Cpu).unwrap();
    let dev = Device::Cpu;
    let prompts: Vec<Vec<u32>> = [300u32, 261]
        .iter()
        .map(|n| (0..*n).map(|i| (i * 7 + n) % 64).collect())
        .collect();
    let (p_n, l, new) = (prompts.len(), 300, 3);
    let cap = l + new;
    let mut ids = Vec::new();
    let mut pos = Vec::new();
    let mut bias = vec![MASK_BIAS; p_n * l * l];
    let mut bias_rows = vec![0f32; p_n * cap];
    for (pi, p) in prompts.iter().enumerate() {
        let pad = l - p.len();
        ids.extend(std::iter::repeat_n(0u32, pad).chain(p.iter().copied()));
        pos.extend(std::iter::repeat_n(0u32, pad).chain(0..p.len() as u32));
        bias_rows[pi * cap..pi * cap + pad].fill(MASK_BIAS);
        for i in pad..l {
            bias[(pi * l + i) * l + pad..=(pi * l + i) * l + i].fill(0.0);
        }
    }
    let ids = Tensor::from_vec(ids, (p_n, l), &dev).unwrap();
    let bias = Tensor::from_vec(bias, (p_n, 1, l, l), &dev).unwrap();
    let mut cache = KvBuffer::new(&model, bias_rows, p_n, cap).unwrap();
    let mut logits = forward_last(&model, &ids, &pos, Some(&bias), &mut cache, None).unwrap();
    let k = 3;
    let rep: Vec<u32> = (0..(p_n * k) as u32).map(|r| r / k as u32).collect();
    cache.keep_rows(&rep).unwrap();
    let rows = p_n * k;
    let lens: Vec<usize> = rep.iter().map(|r| prompts[*r as usize].len()).collect();
    let logits_rows = |lg: &Tensor, r: usize| -> Vec<f32> { host(&lg.narrow(0, r, 1).unwrap()) };

    let p =
        StepProgram::build(StepShape::of(&model, rows, cap).unwrap(), m, Target::Sm90a).unwrap();
    let mut bufs = HostBufs::default();
    bufs.f.extend(host_weights(&model, &p).unwrap());
    let (cos, sin) = rotary_tables(&model).unwrap();
    bufs.f.insert(Buf::Cos, host(&cos));
    bufs.f.insert(Buf::Sin, host(&sin));
    bufs.f.insert(Buf::Bias, host(cache.bias_rows()));
    bufs.f.insert(Buf::Ones, vec![1.0; rows]);
    for (b, (dt, n)) in p.sizes() {
        if dt == triton::DType::I32 {
            bufs.i.insert(b, vec![0; n]);
        } else {
            bufs.f.entry(b).or_insert_with(|| vec![0.0; n]);
        }
    }
    for li in 0..2 {
        let (kc, vc) = cache.layer(li).unwrap();
        bufs.f.insert(Buf::KCache(li), host(kc));
        bufs.f.insert(Buf::VCache(li), host(vc));
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os(triton::record::RECORD_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => tmp.path().to_path_buf(),
    };
    let rec = Recorder::new(&dir).unwrap();
    let embed = model
        .var("model.embed_tokens.weight")
        .unwrap()
        .as_tensor()
        .clone();
    let mut src: Vec<usize> = rep.iter().map(|r| *r as usize).collect();
    for step in 0..new {
        // Greedy tokens from the candle logits (the same for both paths).
        let toks: Vec<u32> = (0..rows)
            .map(|r| {
                let v = logits_rows(&logits, src[r]);
                (0..v.len()).max_by(|a, b| v[*a].total_cmp(&v[*b])).unwrap() as u32
            })
            .collect();
        let positions: Vec<u32> = lens.iter().map(|n| (n + step) as u32).collect();
        let col = cache.len();
        let tok_t = Tensor::from_vec(toks.clone(), toks.len(), &dev).unwrap();
        bufs.f
            .insert(Buf::X(0), host(&embed.index_select(&tok_t, 0).unwrap()));
        bufs.i
            .insert(Buf::Pos, positions.iter().map(|x| *x as i32).collect());
        bufs.i.insert(Buf::Cols, vec![col as i32; rows]);
        bufs.i.insert(Buf::Lens, vec![col as i32 + 1; rows]);
        p.run_host(&mut bufs, (step == 0).then_some(&rec)).unwrap();
        let ids = Tensor::from_vec(toks, (rows, 1), &dev).unwrap();
        logits = forward_last(&model, &ids, &positions, None, &mut cache, None).unwrap();
        let want = host(&logits);
        let got = &bufs.f[&Buf::Logits];
        let worst = want
            .iter()
            .zip(got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 2e-5, "step {step}: logits differ by {worst}");
        for li in 0..2 {
            let (kc, vc) = cache.layer(li).unwrap();
            for (c, b) in [(kc, Buf::KCache(li)), (vc, Buf::VCache(li))] {
                let want = host(&c.narrow(2, col, 1).unwrap());
                let hd = 64;
                let all = &bufs.f[&b];
                for r in 0..rows {
                    let at = (r * cap + col) * hd;
                    for x in 0..hd {
                        let d = (all[at + x] - want[r * hd + x]).abs();
                        assert!(d <= 1e-6, "step {step} layer {li} {b:?} row {r}: {d}");
                    }
                }
            }
        }
        src = (0..rows).collect();
    }
    let mut kernels: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fused_step_"))
        .collect();
    kernels.sort();
    assert_eq!(
        kernels,
        [
            "fused_step_decode_attn_combine_f32_d64",
            "fused_step_decode_attn_f32_d64",
            "fused_step_decode_rope_kv_f32_d64",
            "fused_step_rmsnorm_add_fwd_f32_h128",
            "fused_step_rmsnorm_fwd_f32_h128",
            "fused_step_swiglu_fwd_f32",
        ]
    );
}

/// The sampler's fused path end to end on the CPU (the program run on the host in place of the
/// CUDA one): the same completions as the candle step (tokens and finish reasons equal,
/// behaviour log-probs within 1e-5), with rows finishing at different steps (stop ids), so
/// finished rows stay in the cache as ignored slots while the others decode, until the live rows
/// fit half the slots and the wave moves to a smaller bucket's step; two waves.
#[test]
fn the_sampler_on_the_host_fused_path_samples_what_the_candle_step_samples() {
    if manifest().is_none() {
        return;
    }
    let model = Model::random(config(2, 2, 1, 512), 0.05, 7, DType::F32, &Device::Cpu).unwrap();
    let prompts: Vec<Vec<u32>> = [40u32, 23, 31]
        .iter()
        .map(|n| (0..*n).map(|i| (i * 5 + n) % 64).collect())
        .collect();
    let params = crate::SamplingParams {
        group_size: 3,
        max_new_tokens: 12,
        stop_ids: (0..10).collect(),
        max_batch_rows: 6,
        ..Default::default()
    };
    let want = crate::Sampler::new(&model, 0)
        .sample(&prompts, 4, &params, 11)
        .unwrap();
    let before = HOST_STEPS.with(std::cell::Cell::get);
    HOST_FUSED.with(|c| c.set(true));
    let mut sampler = crate::Sampler::new(&model, 0).with_timings();
    sampler.fused_min_bucket = 1;
    let got = sampler.sample(&prompts, 4, &params, 11);
    HOST_FUSED.with(|c| c.set(false));
    let got = got.unwrap();
    // 11 decode steps per wave at most (the first token comes from the prefill), two waves.
    let steps = HOST_STEPS.with(std::cell::Cell::get) - before;
    assert!((2..=22).contains(&steps), "{steps} fused steps");
    // The buckets: the 6-row wave shrinks to 3 rows once 3 have finished, then to 1 (its
    // last row); the 3-row wave to 1. Each is a step built when the live rows first fit half
    // the slots, which the completions' lengths decide.
    let buckets = |lens: &[usize], min: usize| {
        let mut sorted = lens.to_vec();
        sorted.sort_unstable();
        let (mut slots, mut n) = (lens.len(), 1);
        for (i, _) in sorted.iter().enumerate() {
            let live = lens.len() - i - 1;
            if live > 0 && 2 * live <= slots && slots > min {
                (slots, n) = (live, n + 1);
            }
        }
        n
    };
    let len_of = |c: &crate::Completion| c.token_ids.len();
    let wave1: Vec<usize> = want[..6].iter().map(len_of).collect();
    let wave2: Vec<usize> = want[6..].iter().map(len_of).collect();
    let builds = sampler.timings().unwrap().fused_builds;
    assert_eq!(
        builds as usize,
        buckets(&wave1, 1) + buckets(&wave2, 1),
        "{wave1:?} {wave2:?}"
    );
    assert!(
        builds >= 3,
        "no wave moved to a smaller bucket: {wave1:?} {wave2:?}"
    );
    // At the default smallest bucket (16 rows) these 6- and 3-row waves never shrink, and
    // sample the same completions, bit for bit: a bucket changes which rows a step computes,
    // not a row's arithmetic on the host.
    let default = crate::Sampler::new(&model, 0).with_timings();
    HOST_FUSED.with(|c| c.set(true));
    let unsplit = default.sample(&prompts, 4, &params, 11);
    HOST_FUSED.with(|c| c.set(false));
    assert_eq!(default.timings().unwrap().fused_builds, 2);
    for (a, b) in unsplit.unwrap().iter().zip(&got) {
        assert_eq!(
            (&a.token_ids, a.finish_reason),
            (&b.token_ids, b.finish_reason)
        );
        let bits = |c: &crate::Completion| -> Vec<u32> {
            c.behaviour_logprobs.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(a), bits(b));
    }
    assert_eq!(got.len(), 9);
    let lens: std::collections::BTreeSet<usize> = want.iter().map(|c| c.token_ids.len()).collect();
    assert!(
        lens.len() >= 3,
        "rows should finish at different steps: {lens:?}"
    );
    assert_close(&got, &want);
}

/// A fused step that fails mid-wave (a launch its plan refuses, on a GPU) hands the wave to the
/// candle step at that column: rows compacted out of their slots, the completions the candle
/// path samples (tokens equal, log-probs within 1e-5).
#[test]
fn a_failing_fused_step_hands_the_wave_to_the_candle_step() {
    manifest().expect("the committed manifest holds the decode kernels");
    let model = Model::random(config(2, 2, 1, 512), 0.05, 7, DType::F32, &Device::Cpu).unwrap();
    let prompts: Vec<Vec<u32>> = [40u32, 23, 31]
        .iter()
        .map(|n| (0..*n).map(|i| (i * 5 + n) % 64).collect())
        .collect();
    let params = crate::SamplingParams {
        group_size: 3,
        max_new_tokens: 12,
        stop_ids: (0..10).collect(),
        ..Default::default()
    };
    let want = crate::Sampler::new(&model, 0)
        .sample(&prompts, 4, &params, 11)
        .unwrap();
    // The 9-row wave's rows finish at different steps: fail after some have, so the live rows
    // sit in slots that are not their row order.
    let lens: Vec<usize> = want.iter().map(|c| c.token_ids.len()).collect();
    let shortest = *lens.iter().min().unwrap();
    assert!(shortest + 1 < 12, "no row finishes early: {lens:?}");
    let before = HOST_STEPS.with(std::cell::Cell::get);
    HOST_FAIL_AT.with(|f| f.set(Some(before + shortest as u64)));
    HOST_FUSED.with(|c| c.set(true));
    let got = crate::Sampler::new(&model, 0).sample(&prompts, 4, &params, 11);
    HOST_FUSED.with(|c| c.set(false));
    HOST_FAIL_AT.with(|f| f.set(None));
    let ran = HOST_STEPS.with(std::cell::Cell::get) - before;
    assert_eq!(ran, shortest as u64, "fused steps before the failure");
    assert_close(&got.unwrap(), &want);
}

/// A finished row's keys and values kept for its episode's next turn come from the cache the
/// fused step wrote (`FusedStep::flush`): a first turn on the host fused path, then a kept turn
/// also decoded by the fused step (its cache has a masked gap between each row's kept and new
/// columns), sample the tokens of the candle step's re-prefill path with log-probs within 1e-5
/// (zeros or stale columns in the kept entries, or an unmasked gap, would move them far more).
#[test]
fn turns_kept_from_the_fused_path_continue_as_the_candle_path() {
    manifest().expect("the committed manifest holds the decode kernels");
    let model = Model::random(config(2, 2, 1, 512), 0.05, 9, DType::F32, &Device::Cpu).unwrap();
    let prompts: Vec<Vec<u32>> = vec![(0..21).map(|i| (i * 3 + 1) % 64).collect(), vec![5, 9, 2]];
    let params = crate::SamplingParams {
        group_size: 2,
        max_new_tokens: 10,
        stop_ids: (0..12).collect(),
        max_batch_rows: 4,
        ..Default::default()
    };
    let next = |first: &[crate::Completion]| -> Vec<crate::engine::TurnRow> {
        first
            .iter()
            .map(|c| {
                let mut context = prompts[c.prompt_index].clone();
                context.extend(&c.token_ids);
                context.extend([60, 61 + c.sample_index as u32]);
                crate::engine::TurnRow {
                    context,
                    prompt_index: c.prompt_index,
                    sample_index: c.sample_index,
                    turn: 2,
                }
            })
            .collect()
    };
    let s = crate::Sampler::new(&model, 0);
    let first_want = s.sample(&prompts, 0, &params, 3).unwrap();
    let want = s.sample_each(&next(&first_want), &params, 3).unwrap();
    let mut cache = crate::TurnCache::new(crate::DEFAULT_TURN_CACHE_BYTES);
    HOST_FUSED.with(|c| c.set(true));
    let first = s.sample_keeping(&prompts, 0, &params, 3, &mut cache);
    HOST_FUSED.with(|c| c.set(false));
    let first = first.unwrap();
    let before = HOST_STEPS.with(std::cell::Cell::get);
    HOST_FUSED.with(|c| c.set(true));
    let got = s.sample_each_kept(&next(&first), &params, 3, &mut cache);
    HOST_FUSED.with(|c| c.set(false));
    let got = got.unwrap();
    assert!(
        HOST_STEPS.with(std::cell::Cell::get) > before,
        "the kept turn ran no fused step"
    );
    assert_eq!(cache.stats().hits, 4, "{:?}", cache.stats());
    assert_close(&[first, got].concat(), &[first_want, want].concat());
}

/// Qwen3's q/k norms in the fused step: two `rmsnorm_fwd` launches a layer over rows of one head
/// (8 kernels a layer instead of 6), and the sampler on the host fused path samples what the
/// candle step samples (tokens equal, log-probs within 1e-5), rows finishing at different steps.
#[test]
fn qwen3_runs_the_fused_step_with_its_q_k_norms() {
    let m = manifest().expect("the committed manifest holds the decode kernels");
    let model = Model::random(qwen3_config(2, 512), 0.05, 13, DType::F32, &Device::Cpu).unwrap();
    let p = StepProgram::build(StepShape::of(&model, 4, 64).unwrap(), m, Target::Sm90a).unwrap();
    // Per layer 6 kernels and 2 head norms, one input norm before the first; 7 projections a
    // layer and the head.
    assert_eq!(p.counts(), (2 * 8 + 1, 2 * 7 + 1));
    let head_norms: Vec<&Op> = (p.ops.iter())
        .filter(|o| matches!(o, Op::Launch { bind, .. } if bind.iter().any(|(_, b)| *b == Buf::QRstd || *b == Buf::KRstd)))
        .collect();
    assert_eq!(head_norms.len(), 4);
    let Op::Launch { plan, .. } = head_norms[0] else {
        unreachable!()
    };
    assert_eq!(plan.name, "rmsnorm_fwd_f32_h128");
    assert_eq!(
        plan.grid[0] as usize,
        4 * 2,
        "one program per row and query head"
    );

    let prompts: Vec<Vec<u32>> = [33u32, 17, 26]
        .iter()
        .map(|n| (0..*n).map(|i| (i * 11 + n) % 64).collect())
        .collect();
    let params = crate::SamplingParams {
        group_size: 2,
        max_new_tokens: 10,
        stop_ids: (0..16).collect(),
        ..Default::default()
    };
    let want = crate::Sampler::new(&model, 0)
        .sample(&prompts, 0, &params, 5)
        .unwrap();
    let got = host_fused_sample(&model, &prompts, &params, 5);
    let lens: std::collections::BTreeSet<usize> = want.iter().map(|c| c.token_ids.len()).collect();
    assert!(
        lens.len() >= 2,
        "rows should finish at different steps: {lens:?}"
    );
    assert_close(&got, &want);
}

/// LoRA adapters in the fused step: each adapted projection gets `T = x·Aᵀ` and `out += (α/r)·
/// T·Bᵀ` after its own product (only the targets: here q, v and down), and the sampler on the
/// host fused path samples what the candle step samples with the adapters' B moved off zero
/// (tokens equal, log-probs within 1e-5).
#[test]
fn lora_adapters_run_in_the_fused_step() {
    let m = manifest().expect("the committed manifest holds the decode kernels");
    let mut model =
        Model::random(config(2, 2, 1, 512), 0.05, 17, DType::F32, &Device::Cpu).unwrap();
    use rlvr_model::LoraTarget as T;
    let lora = rlvr_model::LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: vec![T::Q, T::V, T::Down],
        dropout: 0.1,
    };
    model.add_lora(&lora, 5).unwrap();
    // B starts at zero (the adapters change nothing): give it values.
    for l in 0..2 {
        for (i, p) in ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]
            .iter()
            .enumerate()
        {
            let name = format!("base_model.model.model.layers.{l}.{p}.lora_B.weight");
            let var = model.var(&name).unwrap();
            let b = Tensor::randn(0f32, 0.5, var.dims(), &Device::Cpu).unwrap();
            var.set(&(b * (1.0 + i as f64)).unwrap()).unwrap();
        }
    }
    let p = StepProgram::build(StepShape::of(&model, 3, 64).unwrap(), m, Target::Sm90a).unwrap();
    let n = names(&p);
    let at = n.iter().position(|x| x == "gemm self_attn.q_proj").unwrap();
    assert_eq!(
        n[at..at + 6],
        [
            "gemm self_attn.q_proj",
            "lora_A self_attn.q_proj",
            "lora_B self_attn.q_proj",
            "gemm self_attn.k_proj",
            "gemm self_attn.v_proj",
            "lora_A self_attn.v_proj",
        ]
    );
    assert_eq!(p.counts(), (1 + 6 * 2, (7 + 2 * 3) * 2 + 1));
    let b_ops: Vec<(f32, bool, Buf)> = (p.ops.iter())
        .filter_map(|o| match o {
            Op::Gemm {
                w: Buf::W(Weight::LoraB(..)),
                alpha,
                accumulate,
                x,
                ..
            } => Some((*alpha, *accumulate, *x)),
            _ => None,
        })
        .collect();
    assert_eq!(b_ops.len(), 6);
    assert!(
        b_ops.iter().all(|o| *o == (2.0, true, Buf::LoraT)),
        "{b_ops:?}"
    );

    let prompts: Vec<Vec<u32>> = [29u32, 12]
        .iter()
        .map(|n| (0..*n).map(|i| (i * 13 + n) % 64).collect())
        .collect();
    let params = crate::SamplingParams {
        group_size: 3,
        max_new_tokens: 10,
        stop_ids: (0..16).collect(),
        ..Default::default()
    };
    let want = crate::Sampler::new(&model, 0)
        .sample(&prompts, 0, &params, 9)
        .unwrap();
    let plain = crate::Sampler::new(&model.without_adapters(), 0)
        .sample(&prompts, 0, &params, 9)
        .unwrap();
    assert_ne!(
        want.iter().map(|c| &c.token_ids).collect::<Vec<_>>(),
        plain.iter().map(|c| &c.token_ids).collect::<Vec<_>>(),
        "the adapters should change what is sampled"
    );
    let got = host_fused_sample(&model, &prompts, &params, 9);
    assert_close(&got, &want);
}

/// Phi-3's adapters on its fused `qkv_proj` and `gate_up_proj` in the fused step: the split
/// projections q, k, v (gate, up) each take the fused adapter's A and their own rows of its B
/// (`Model::lora_factors`), and the host fused path samples what the candle step samples
/// (tokens equal, log-probs within 1e-5), the adapters' B off zero.
#[test]
fn phi3_fused_module_adapters_run_in_the_fused_step() {
    let m = manifest().expect("the committed manifest holds the decode kernels");
    let cfg = ModelConfig::from_json(
        &serde_json::json!({"model_type": "phi3", "vocab_size": 64, "hidden_size": 128,
            "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 512, "sliding_window": null}),
        "inline".as_ref(),
    )
    .unwrap();
    let mut model = Model::random(cfg, 0.05, 23, DType::F32, &Device::Cpu).unwrap();
    use rlvr_model::LoraTarget as T;
    let lora = rlvr_model::LoraConfig {
        rank: 3,
        alpha: 6.0,
        targets: vec![T::Qkv, T::GateUp],
        dropout: 0.0,
    };
    model.add_lora(&lora, 5).unwrap();
    for l in 0..2 {
        for p in ["self_attn.qkv_proj", "mlp.gate_up_proj"] {
            let name = format!("base_model.model.model.layers.{l}.{p}.lora_B.weight");
            let var = model.var(&name).unwrap();
            let b = Tensor::randn(0f32, 0.5, var.dims(), &Device::Cpu).unwrap();
            var.set(&b).unwrap();
        }
    }
    // q's rows of the fused B are its first 128; v's the last 64.
    let (_, bq) = model.lora_factors(1, "self_attn.q_proj").unwrap().unwrap();
    let (_, bv) = model.lora_factors(1, "self_attn.v_proj").unwrap().unwrap();
    let fused = model
        .var("base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight")
        .unwrap()
        .as_tensor()
        .clone();
    assert_eq!(bq.dims(), [128, 3]);
    assert_eq!(bv.dims(), [64, 3]);
    let rows = |t: &Tensor| t.to_vec2::<f32>().unwrap();
    assert_eq!(rows(&bq), rows(&fused)[..128]);
    assert_eq!(rows(&bv), rows(&fused)[192..]);
    assert!(model.lora_factors(1, "self_attn.o_proj").unwrap().is_none());
    let p = StepProgram::build(StepShape::of(&model, 3, 64).unwrap(), m, Target::Sm90a).unwrap();
    let n = names(&p);
    for proj in ["q", "k", "v", "gate", "up"] {
        let sub = if matches!(proj, "gate" | "up") {
            "mlp"
        } else {
            "self_attn"
        };
        assert!(
            n.contains(&format!("lora_B {sub}.{proj}_proj")),
            "{proj}: {n:?}"
        );
    }
    assert!(!n.iter().any(|x| x.contains("lora_A self_attn.o_proj")));
    let prompts: Vec<Vec<u32>> = [21u32, 9]
        .iter()
        .map(|n| (0..*n).map(|i| (i * 11 + n) % 64).collect())
        .collect();
    let params = crate::SamplingParams {
        group_size: 2,
        max_new_tokens: 8,
        stop_ids: (0..16).collect(),
        ..Default::default()
    };
    let want = crate::Sampler::new(&model, 0)
        .sample(&prompts, 0, &params, 4)
        .unwrap();
    let plain = crate::Sampler::new(&model.without_adapters(), 0)
        .sample(&prompts, 0, &params, 4)
        .unwrap();
    assert_ne!(
        want.iter().map(|c| &c.token_ids).collect::<Vec<_>>(),
        plain.iter().map(|c| &c.token_ids).collect::<Vec<_>>(),
        "the adapters should change what is sampled"
    );
    let got = host_fused_sample(&model, &prompts, &params, 4);
    assert_close(&got, &want);
}
