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
