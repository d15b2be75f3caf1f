use candle_core::{DType, Device};

use super::*;
use crate::{Arch, Model, ModelConfig, PromptGroup, SharedPrefixBatch};

/// A small Qwen2-shaped model the kernels cover: hidden 128 (a multiple of 16), head dim 64,
/// GQA 2 (2 query heads over 1 kv head), 2 layers.
fn small() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: 48,
        hidden_size: 128,
        intermediate_size: 160,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 64,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: None,
        max_position_embeddings: 128,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        stored_dtype: None,
        bos_token_id: None,
        eos_token_ids: vec![],
    }
}

fn attention_on() -> KernelSwitches {
    KernelSwitches {
        attention: Switch::On,
        ..KernelSwitches::default()
    }
}

#[test]
fn switches_parse_default_and_list() {
    let k: KernelSwitches = serde_json::from_str(r#"{"attention": "on", "adamw": "off"}"#).unwrap();
    assert_eq!(k.attention, Switch::On);
    assert_eq!(k.adamw, Switch::Off);
    assert_eq!(k.rms_norm, Switch::Auto);
    assert!(serde_json::from_str::<KernelSwitches>(r#"{"attention": "yes"}"#).is_err());
    assert!(serde_json::from_str::<KernelSwitches>(r#"{"flash": "on"}"#).is_err());
    assert_eq!(KernelSwitches::default(), KernelSwitches::all(Switch::Auto));
    let l = KernelSwitches::from_fused_list("attention, rms_norm").unwrap();
    assert_eq!(
        l.summary(),
        "attention=on rms_norm=on rotary=off swiglu=off logprob_head=off adamw=off decode=off \
         cuda_graphs=off"
    );
    assert_eq!(
        KernelSwitches::from_fused_list("all").unwrap(),
        KernelSwitches::all(Switch::On)
    );
    assert_eq!(
        KernelSwitches::from_fused_list("none").unwrap(),
        KernelSwitches::all(Switch::Off)
    );
    let e = KernelSwitches::from_fused_list("attention,flash").unwrap_err();
    assert!(
        e.to_string().contains("--fused flash: not a fused op"),
        "{e}"
    );
    // Every key has a documented row.
    let rows = reference_rows();
    for op in FusedOp::ALL {
        assert!(
            rows.contains(&format!("| `kernels.{}` | ", op.key())),
            "{rows}"
        );
    }
    assert_eq!(rows.lines().count(), 8);
}

#[test]
fn nothing_is_on_by_default_and_on_is_a_no_op_on_the_cpu() {
    // No kernel has passed the GPU check: `auto` is off everywhere.
    assert!(rlvr_kernels::triton::GPU_VERIFIED.is_empty());
    let cfg = small();
    for op in FusedOp::ALL {
        assert!(!KernelSwitches::default().resolve(op, &cfg, DType::BF16, &Device::Cpu));
        assert!(!KernelSwitches::all(Switch::On).resolve(op, &cfg, DType::F32, &Device::Cpu));
    }
    // Shapes the kernels do not cover.
    let mut odd = cfg.clone();
    odd.head_dim = 32;
    assert!(uncovered(FusedOp::Attention, &odd, DType::F32).is_some());
    assert!(uncovered(FusedOp::Attention, &cfg, DType::F16).is_some());
    odd.hidden_size = 9000;
    assert!(uncovered(FusedOp::RmsNorm, &odd, DType::F32).is_some());
    assert!(uncovered(FusedOp::Attention, &cfg, DType::BF16).is_none());
    // The decode step: head dims 64/128, at most 16 query heads per kv head.
    assert!(uncovered(FusedOp::Decode, &cfg, DType::BF16).is_none());
    let mut wide = cfg.clone();
    (wide.num_attention_heads, wide.num_key_value_heads) = (34, 2);
    let why = uncovered(FusedOp::Decode, &wide, DType::BF16).unwrap();
    assert!(why.contains("up to 16 per kv head"), "{why}");
    wide.num_attention_heads = 32;
    assert!(uncovered(FusedOp::CudaGraphs, &wide, DType::F32).is_none());
    let mut d96 = cfg.clone();
    d96.head_dim = 96;
    assert!(uncovered(FusedOp::Decode, &d96, DType::F32).is_some());
}

#[test]
fn dense_layout_from_a_causal_padding_bias() {
    let m = Model::random(small(), 0.3, 1, DType::F32, &Device::Cpu).unwrap();
    // Row 0 right-padded (3 real), row 1 left-padded (2 real), row 2 full.
    let mask = vec![vec![1, 1, 1, 0], vec![0, 0, 1, 1], vec![1, 1, 1, 1]];
    let bias = m.attention_bias(&mask, 0, 4).unwrap();
    let host = bias.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let seqs = dense_seqs(&host, 3, 4).unwrap();
    let s = |start, len| Seq {
        start,
        len,
        prefix_start: 0,
        prefix_len: 0,
    };
    assert_eq!(seqs, vec![s(0, 3), s(6, 2), s(8, 4)]);
    assert_eq!(mask_seqs(&mask, 4), Some(seqs));
    assert_eq!(mask_seqs(&[vec![1, 0, 1, 0]], 4), None);
    // A bias that is not causal: no layout.
    let full = vec![0f32; 16];
    assert!(dense_seqs(&full, 1, 4).is_none());
}

fn rows() -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let ids = vec![
        vec![3, 9, 4, 17, 5, 22, 8, 0, 0],
        vec![0, 0, 11, 2, 30, 7, 1, 40, 13],
    ];
    let mask = vec![
        vec![1, 1, 1, 1, 1, 1, 1, 0, 0],
        vec![0, 0, 1, 1, 1, 1, 1, 1, 1],
    ];
    (ids, mask)
}

fn batch() -> SharedPrefixBatch {
    SharedPrefixBatch {
        groups: vec![
            PromptGroup {
                prompt: vec![3, 9, 4, 17, 5],
                completions: vec![vec![6, 7, 8, 9], vec![10], vec![11, 12, 13, 14, 15, 16]],
            },
            PromptGroup {
                prompt: vec![20, 21],
                completions: vec![vec![22, 23, 24]],
            },
        ],
    }
}

/// Log-probs and every gradient of a dense and a shared-prefix forward.
fn run(m: &Model) -> Vec<Vec<f32>> {
    let (ids, mask) = rows();
    let lp = m.token_logprobs(&ids, &mask, 1, 1.0, false, true).unwrap();
    let sp = m
        .shared_prefix_logprobs(&batch(), 1.0, false, true)
        .unwrap();
    let loss = (lp.logprobs.sum_all().unwrap() + sp.logprobs.sum_all().unwrap()).unwrap();
    let grads = crate::recompute::backward(&loss).unwrap();
    let mut out = vec![
        lp.logprobs.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        sp.logprobs.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    ];
    for (_, v) in m.named_vars() {
        let g = grads
            .get(v.as_tensor())
            .expect("every weight has a gradient");
        out.push(g.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    out
}

#[test]
fn attention_on_leaves_the_cpu_path_bit_identical() {
    let off = Model::random(small(), 0.3, 7, DType::F32, &Device::Cpu).unwrap();
    let mut on = off.try_clone().unwrap();
    on.set_kernels(attention_on());
    assert!(on.fused_attention(), "flagged for the recorder");
    assert_eq!(on.kernels().attention, Switch::On);
    assert_eq!(run(&off), run(&on));
}

/// The model-level launch recorder: the fused attention path of a real forward and backward
/// (dense padded rows and the shared-prefix layout, with and without activation checkpointing)
/// writes its launch plans with the real q, k, v, dO and the candle composition's outputs and
/// gradients; the results are those of the plain model, bit for bit. Under `RLVR_KERNEL_RECORD`
/// (CI) the records go there and `scripts/ci_kernels.sh` replays them under Triton's interpreter.
#[test]
fn model_level_launch_records_of_fused_attention() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => tmp.path().to_path_buf(),
    };
    let plain = Model::random(small(), 0.3, 11, DType::F32, &Device::Cpu).unwrap();
    let want = run(&plain);
    for checkpointing in [false, true] {
        let mut m = plain.try_clone().unwrap();
        m.set_kernels(attention_on());
        m.set_gradient_checkpointing(checkpointing);
        let got = {
            let _guard = record_launches(&dir).unwrap();
            run(&m)
        };
        assert_eq!(got, want, "checkpointing {checkpointing}");
    }
    for kind in ["dense", "shared"] {
        for kernel in ["fwd", "bwd_pre", "bwd_dkdv", "bwd_dq"] {
            let rec = dir.join(format!(
                "model_attn_{kind}_attn_{kernel}_f32_d64/record.json"
            ));
            let text =
                std::fs::read_to_string(&rec).unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(json["name"], format!("attn_{kernel}_f32_d64"));
        }
    }
    // The shared layout's descriptors: 2 prompts, then the completion rows that have a position
    // (the one-token completion has none), each seeing its prompt as a prefix.
    let seqs: Vec<i32> = std::fs::read(dir.join("model_attn_shared_attn_fwd_f32_d64/seqs.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    // P = 5, C = 5: prompts at 0 and 5; rows at 10, 15 (empty), 20, 25.
    assert_eq!(
        seqs,
        vec![0, 5, 0, 0, 5, 2, 0, 0, 10, 3, 0, 5, 20, 5, 0, 5, 25, 2, 5, 2]
    );
    drop(tmp);
}

// ---------------------------------------------------------------------------------------------
// One-pass AdamW (`kernels.adamw`).

fn adamw_on() -> KernelSwitches {
    KernelSwitches {
        adamw: Switch::On,
        ..KernelSwitches::default()
    }
}

/// The gradients of one forward and backward of `m` (log-probs and entropies).
fn grads_of(m: &Model) -> candle_core::backprop::GradStore {
    let (ids, mask) = rows();
    let lp = m.token_logprobs(&ids, &mask, 1, 1.0, true, true).unwrap();
    let loss = (lp.logprobs.sum_all().unwrap()
        + lp.entropy
            .unwrap()
            .sum_all()
            .unwrap()
            .affine(0.1, 0.0)
            .unwrap())
    .unwrap();
    crate::recompute::backward(&loss).unwrap()
}

/// Two optimizer steps of `m` (the second clipped by 0.8, and recorded under `record` when
/// given) with its gradients in f32 (as the trainer's accumulator gives them) or as candle's
/// backward left them (`f32_grads` false):
/// ‖g‖² of each step, then every parameter, moment and master after them, as bits.
fn two_steps(
    m: &Model,
    fused: bool,
    f32_grads: bool,
    record: Option<&std::path::Path>,
) -> (Vec<f64>, Vec<Vec<u32>>) {
    let vars: Vec<candle_core::Var> = m.named_vars().into_iter().map(|(_, v)| v.clone()).collect();
    let mut opt =
        crate::optim::AdamW::new(vars.clone(), crate::optim::AdamWConfig::default()).unwrap();
    opt.set_fused(fused);
    let mut norms = Vec::new();
    for (i, scale) in [1.0, 0.8].into_iter().enumerate() {
        // The second step is recorded: non-zero moments, a clipping factor.
        let _guard = record
            .filter(|_| i == 1)
            .map(|d| record_launches(d).unwrap());
        let raw = grads_of(m);
        let mut store = candle_core::backprop::GradStore::default();
        let mut list = Vec::new();
        for v in &vars {
            let g = raw.get(v.as_tensor()).unwrap();
            let g = if f32_grads {
                g.to_dtype(DType::F32).unwrap()
            } else {
                g.clone()
            };
            list.push(g.clone());
            store.insert(v.as_tensor(), g);
        }
        let refs: Vec<&Tensor> = list.iter().collect();
        norms.push(crate::optim::grad_sumsq(&refs, fused).unwrap());
        opt.step_scaled(&store, 1e-2 * (i + 1) as f64, scale)
            .unwrap();
    }
    let bits = |t: &Tensor| -> Vec<u32> {
        (t.flatten_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap())
        .iter()
        .map(|x| x.to_bits())
        .collect()
    };
    let mut out: Vec<Vec<u32>> = vars.iter().map(|v| bits(v.as_tensor())).collect();
    let (mo, vo) = opt.moments();
    out.extend(mo.iter().chain(vo).map(bits));
    out.extend(opt.masters().iter().flatten().map(bits));
    (norms, out)
}

#[test]
fn adamw_on_leaves_the_cpu_step_bit_identical() {
    assert!(FusedOp::Adamw.wired());
    for dtype in [DType::F32, DType::BF16] {
        let base = Model::random(small(), 0.3, 5, dtype, &Device::Cpu).unwrap();
        let mut on = base.try_clone().unwrap();
        on.set_kernels(adamw_on());
        assert!(on.fused_adamw(), "flagged for the recorder");
        let off = base.try_clone().unwrap();
        assert!(!off.fused_adamw());
        let f32_grads = dtype == DType::F32;
        let (n_off, s_off) = two_steps(&off, false, f32_grads, None);
        let (n_on, s_on) = two_steps(&on, true, f32_grads, None);
        assert_eq!(n_off, n_on, "{dtype:?}");
        assert!(n_on.iter().all(|n| *n > 0.0 && n.is_finite()));
        assert_eq!(s_off, s_on, "{dtype:?}");
        // The steps moved the weights (the embedding, first).
        let e0: Vec<u32> = (base.named_vars()[0].1.as_tensor())
            .flatten_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_ne!(s_on[0], e0);
    }
}

/// The launch recorder on a real optimizer step: every AdamW and gradient-norm kernel recorded
/// from the real parameters, gradients and moments (an f32 model with f32 gradients; a bf16
/// model through its masters with f32 sums and with candle's bf16 gradients), expecting the CPU
/// passes' results; the step itself is the plain one, bit for bit. Under `RLVR_KERNEL_RECORD`
/// (CI) the records go there and `scripts/ci_kernels.sh` replays them under Triton's interpreter.
#[test]
fn model_level_launch_records_of_fused_adamw() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => tmp.path().to_path_buf(),
    };
    for (dtype, f32_grads) in [
        (DType::F32, true),
        (DType::BF16, true),
        (DType::BF16, false),
    ] {
        let base = Model::random(small(), 0.3, 9, dtype, &Device::Cpu).unwrap();
        let want = two_steps(&base.try_clone().unwrap(), false, f32_grads, None);
        let mut m = base.try_clone().unwrap();
        m.set_kernels(adamw_on());
        let got = two_steps(&m, true, f32_grads, Some(&dir));
        assert_eq!(got, want, "{dtype:?} f32 grads {f32_grads}");
    }
    let read = |label: &str| -> serde_json::Value {
        let rec = dir.join(format!("{label}/record.json"));
        let text =
            std::fs::read_to_string(&rec).unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
        serde_json::from_str(&text).unwrap()
    };
    for name in [
        "adamw_f32",
        "adamw_master_bf16",
        "adamw_master_bf16_gbf16",
        "grad_sumsq_f32",
        "grad_sumsq_bf16",
    ] {
        for n in [name.to_string(), format!("{name}_a16")] {
            assert_eq!(read(&format!("model_{n}"))["name"], n);
        }
    }
    // The recorded step is the clipped second one, with the moments of the first.
    let step = read("model_adamw_f32");
    let scale = (step["args"].as_array().unwrap().iter())
        .find(|a| a["param"] == "grad_scale")
        .map(|a| a["value"].as_f64().unwrap() as f32);
    assert_eq!(scale, Some(0.8f32));
    let m0 = std::fs::read(dir.join("model_adamw_f32/exp_avg.bin")).unwrap();
    assert!(m0.iter().any(|b| *b != 0), "the moments of the first step");
    let total = read("model_grad_sumsq_total");
    assert_eq!(total["name"], "grad_sumsq_total");
    drop(tmp);
}

// ---------------------------------------------------------------------------------------------
// The log-prob head's chunk kernels (`kernels.logprob_head`).

fn head_on() -> KernelSwitches {
    KernelSwitches {
        logprob_head: Switch::On,
        ..KernelSwitches::default()
    }
}

/// Log-probs and entropies at temperature 0.7 (with and without entropy) and every gradient.
fn run_head(m: &Model) -> Vec<Vec<f32>> {
    let (ids, mask) = rows();
    let a = m.token_logprobs(&ids, &mask, 1, 0.7, true, true).unwrap();
    let b = m.token_logprobs(&ids, &mask, 2, 1.3, false, true).unwrap();
    let ent = a.entropy.unwrap();
    let loss = (a.logprobs.sum_all().unwrap()
        + ent.affine(0.3, 0.0).unwrap().sum_all().unwrap()
        + b.logprobs.affine(-0.5, 0.0).unwrap().sum_all().unwrap())
    .unwrap();
    let grads = crate::recompute::backward(&loss).unwrap();
    let flat = |t: &Tensor| -> Vec<f32> {
        (t.flatten_all().unwrap().to_dtype(DType::F32).unwrap())
            .to_vec1::<f32>()
            .unwrap()
    };
    let mut out = vec![flat(&a.logprobs), flat(&ent), flat(&b.logprobs)];
    for (_, v) in m.named_vars() {
        out.push(flat(
            grads
                .get(v.as_tensor())
                .expect("every weight has a gradient"),
        ));
    }
    out
}

#[test]
fn logprob_head_on_leaves_the_cpu_path_bit_identical() {
    assert!(FusedOp::LogprobHead.wired());
    for dtype in [DType::F32, DType::BF16] {
        let off = Model::random(small(), 0.3, 13, dtype, &Device::Cpu).unwrap();
        let mut on = off.try_clone().unwrap();
        on.set_kernels(head_on());
        assert!(on.fused_head(), "flagged for the recorder");
        assert_eq!(run_head(&off), run_head(&on), "{dtype:?}");
    }
}

/// The launch recorder on a real head forward and backward (f32: the CPU op's path; bf16: the
/// chunked path), with entropy and a temperature: the forward chunks (first, second, last) with
/// the float64 state of the real logits, `logprob_finish` expecting the head's real output, the
/// backward chunks expecting the candle composition's logits gradient for the real upstream
/// gradient; the results are the plain model's, bit for bit. Under `RLVR_KERNEL_RECORD` (CI)
/// the records go there and `scripts/ci_kernels.sh` replays them under Triton's interpreter.
#[test]
fn model_level_launch_records_of_fused_head() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => tmp.path().to_path_buf(),
    };
    for dtype in [DType::F32, DType::BF16] {
        let plain = Model::random(small(), 0.3, 17, dtype, &Device::Cpu).unwrap();
        let want = run_head(&plain);
        let mut m = plain.try_clone().unwrap();
        m.set_kernels(head_on());
        let got = {
            let _guard = record_launches(&dir).unwrap();
            run_head(&m)
        };
        assert_eq!(got, want, "{dtype:?}");
    }
    let read = |label: &str| -> serde_json::Value {
        let rec = dir.join(format!("{label}/record.json"));
        let text =
            std::fs::read_to_string(&rec).unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
        serde_json::from_str(&text).unwrap()
    };
    for dt in ["f32", "bf16"] {
        for k in ["fwd", "bwd"] {
            for sfx in ["_first", "", "_last"] {
                let name = format!("logprob_{k}_{dt}");
                assert_eq!(read(&format!("model_{name}{sfx}"))["name"], name);
                let twin = format!("{name}_a16");
                assert_eq!(read(&format!("model_{name}{sfx}_a16"))["name"], twin);
            }
        }
    }
    assert_eq!(read("model_logprob_finish")["name"], "logprob_finish");
    drop(tmp);
}
