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

/// A kept-turn prefill's layout from its key mask `[B][past + T]`: the new positions' queries,
/// each row's visible past as key-only rows after the `B·T` new ones; a past with a hole, a
/// row without a new token or a mask of another length give none.
#[test]
fn kept_layout_from_the_key_mask() {
    // past 3, T 2: row 0 sees past columns 1..3 and both new; row 1 no past and its last new
    // one; row 2 all of its past and both new.
    let mask = vec![
        vec![0, 1, 1, 1, 1],
        vec![0, 0, 0, 0, 1],
        vec![1, 1, 1, 1, 1],
    ];
    let s = |start, len, prefix_start, prefix_len| Seq {
        start,
        len,
        prefix_start,
        prefix_len,
    };
    assert_eq!(
        kept_seqs(&mask, 3, 2),
        Some(vec![
            s(0, 2, 6 + 1, 2),
            s(3, 1, 6 + 3, 0),
            s(4, 2, 6 + 6, 3)
        ])
    );
    let l = crate::layers::FusedLayout {
        n_tokens: 3 * (2 + 3),
        seqs: kept_seqs(&mask, 3, 2).unwrap(),
        q_heads: 2,
        kv_heads: 1,
        head_dim: 64,
        softmax_scale: 0.125,
        window: 0,
    };
    l.check("t").unwrap();
    assert!(l.has_key_only_prefix());
    assert_eq!(kept_seqs(&[vec![1, 0, 1, 1, 1]], 3, 2), None);
    assert_eq!(kept_seqs(&[vec![1, 1, 1, 0, 0]], 3, 2), None);
    assert_eq!(kept_seqs(&[vec![1, 1, 1, 1]], 3, 2), None);
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

fn f32s(t: &candle_core::Tensor) -> Vec<f32> {
    let t = t.flatten_all().unwrap().to_dtype(DType::F32).unwrap();
    t.to_vec1::<f32>().unwrap()
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
    let mut out = vec![f32s(&lp.logprobs), f32s(&sp.logprobs)];
    for (_, v) in m.named_vars() {
        let g = grads
            .get(v.as_tensor())
            .expect("every weight has a gradient");
        let g = g.flatten_all().unwrap().to_dtype(DType::F32).unwrap();
        out.push(g.to_vec1::<f32>().unwrap());
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

/// A sliding-window model takes the fused attention (its `window` argument) but not the decode
/// kernels (they attend to every cached key): `kernels.attention = "on"` resolves on,
/// `kernels.decode = "on"` off with the reason logged; the CPU path still scores as the
/// composition does, bit for bit, and the launch recorder writes a sliding layer's launches
/// (labels `_w2`, layout `window` 2; every layer sliding here, so that no label is shared with
/// `model_level_launch_records_of_fused_attention`, which may write beside it), which CI replays
/// under Triton's interpreter against the composition's windowed outputs and gradients.
#[test]
fn a_sliding_window_keeps_the_fused_attention_and_turns_decode_off() {
    let mut cfg = small();
    cfg.sliding_window = Some(crate::SlidingWindow {
        size: 2,
        layers: vec![false, true],
    });
    let on = KernelSwitches {
        attention: Switch::On,
        decode: Switch::On,
        rms_norm: Switch::On,
        ..KernelSwitches::default()
    };
    let mut m = Model::random(cfg.clone(), 0.3, 7, DType::F32, &Device::Cpu).unwrap();
    m.set_kernels(on);
    let f = m.fused_flags();
    assert!(f.attention, "the attention kernels take the window");
    assert!(!f.decode, "the decode kernels do not");
    assert!(f.rms_norm, "the other kernels are untouched");
    assert!(uncovered(FusedOp::Attention, &cfg, DType::F32).is_none());
    let why = uncovered(FusedOp::Decode, &cfg, DType::F32).unwrap();
    assert!(why.contains("sliding window of 2 tokens"), "{why}");
    assert!(uncovered(FusedOp::CudaGraphs, &cfg, DType::F32).is_some());
    assert!(uncovered(FusedOp::Rotary, &cfg, DType::F32).is_none());
    // Without the window the same switches flag attention (for the launch recorder).
    let mut plain = Model::random(small(), 0.3, 7, DType::F32, &Device::Cpu).unwrap();
    plain.set_kernels(on);
    assert!(plain.fused_flags().attention);
    // And the window's model still scores as the composition does: its values differ from the
    // model without the window (same weights) on rows longer than the window.
    let base = Model::random(cfg.clone(), 0.3, 7, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(run(&m), run(&base));
    assert_ne!(run(&m), run(&plain));
    // The launch recorder, every layer sliding.
    cfg.sliding_window = Some(crate::SlidingWindow {
        size: 2,
        layers: vec![true, true],
    });
    let base = Model::random(cfg.clone(), 0.3, 7, DType::F32, &Device::Cpu).unwrap();
    let mut m = base.try_clone().unwrap();
    m.set_kernels(on);
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => tmp.path().to_path_buf(),
    };
    let got = {
        let _guard = record_launches(&dir).unwrap();
        run(&m)
    };
    assert_eq!(got, run(&base), "recording changes nothing");
    for kind in ["dense", "shared"] {
        for kernel in ["fwd", "bwd_pre", "bwd_dkdv", "bwd_dq"] {
            let rec = dir.join(format!(
                "model_attn_{kind}_w2_attn_{kernel}_f32_d64/record.json"
            ));
            let text =
                std::fs::read_to_string(&rec).unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(json["name"], format!("attn_{kernel}_f32_d64"));
            if kernel != "bwd_pre" {
                let arg = (json["args"].as_array().unwrap().iter())
                    .find(|a| a["param"] == "window")
                    .unwrap_or_else(|| panic!("{}: no window argument", rec.display()));
                assert_eq!(arg["value"], 2, "{}", rec.display());
            }
        }
    }
    drop(tmp);
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

fn layers_on() -> KernelSwitches {
    KernelSwitches {
        rms_norm: Switch::On,
        swiglu: Switch::On,
        rotary: Switch::On,
        ..KernelSwitches::default()
    }
}

#[test]
fn rmsnorm_rows_per_prog_depends_on_the_shape_alone() {
    // At most RMSNORM_BWD_PROGRAMS programs, each over a fixed run of rows: the weight
    // gradient's partials and their fixed-order sum are the same on every rerun of a shape.
    for (rows, rpp) in [
        (1, 1),
        (18, 1),
        (512, 1),
        (513, 2),
        (1024, 2),
        (8192, 16),
        (8193, 17),
    ] {
        let s = rmsnorm_shape(rows, 896, 1e-6);
        assert_eq!(
            (s.rows, s.cols, s.rows_per_prog),
            (rows, 896, rpp),
            "{rows}"
        );
        assert!(rows.div_ceil(s.rows_per_prog) <= RMSNORM_BWD_PROGRAMS);
    }
    assert_eq!(rmsnorm_shape(7, 128, 1e-5).eps, 1e-5f32);
}

#[test]
fn rms_norm_swiglu_and_rotary_on_leave_the_cpu_path_bit_identical() {
    let cpu = Device::Cpu;
    let assert_flags = |m: &Model| {
        let f = m.fused_flags();
        assert!(
            f.rms_norm && f.swiglu && f.rotary,
            "flagged for the recorder: {f:?}"
        );
    };
    let all = KernelSwitches {
        attention: Switch::On,
        ..layers_on()
    };
    for dtype in [DType::F32, DType::BF16] {
        let plain = Model::random(small(), 0.3, 7, dtype, &cpu).unwrap();
        for (switches, checkpointing) in [(layers_on(), false), (layers_on(), true), (all, false)] {
            let mut off = plain.try_clone().unwrap();
            off.set_gradient_checkpointing(checkpointing);
            let mut on = off.try_clone().unwrap();
            on.set_kernels(switches);
            assert_flags(&on);
            let want = run(&off);
            assert_eq!(run(&on), want, "{dtype:?} checkpointing {checkpointing}");
            // Under the launch recorder too (f32 records; bf16 passes through).
            let tmp = tempfile::tempdir().unwrap();
            let got = {
                let _guard = record_launches(tmp.path()).unwrap();
                run(&on)
            };
            assert_eq!(
                got, want,
                "{dtype:?} checkpointing {checkpointing}, recording"
            );
        }
    }
}

/// Reads `file` (f32, little-endian) of record `label` under `dir`.
fn record_f32(dir: &std::path::Path, label: &str, file: &str) -> Vec<f32> {
    let path = dir.join(label).join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (bytes.chunks_exact(4))
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn record_json(dir: &std::path::Path, label: &str) -> serde_json::Value {
    let rec = dir.join(label).join("record.json");
    let text = std::fs::read_to_string(&rec).unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
    serde_json::from_str(&text).unwrap()
}

fn assert_close(got: &[f64], want: &[f32], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - *w as f64).abs() <= tol * (1.0 + w.abs() as f64),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

/// Checks the records of one directory: each kernel of the fused RMSNorm (plain and with the
/// residual add) and SwiGLU is there, from the model's shapes (hidden 128, intermediate 160),
/// and its expected outputs agree, in float64 from the record's own inputs, with the kernel's
/// definition (what the interpreter replay then checks against the kernel itself).
fn check_layer_records(dir: &std::path::Path) {
    let (h, i) = (128usize, 160usize);
    for (label, name) in [
        ("model_rmsnorm_fwd_f32_h128", "rmsnorm_fwd_f32_h128"),
        ("model_rmsnorm_add_fwd_f32_h128", "rmsnorm_add_fwd_f32_h128"),
        ("model_rmsnorm_bwd_f32_h128", "rmsnorm_bwd_f32_h128"),
        ("model_rmsnorm_add_bwd_f32_h128", "rmsnorm_add_bwd_f32_h128"),
        ("model_rmsnorm_dw_f32", "rmsnorm_dw_f32"),
        // 160 = 16 · 10: the aligned twins, as the GPU takes them.
        ("model_swiglu_fwd_f32", "swiglu_fwd_f32_a16"),
        ("model_swiglu_bwd_f32", "swiglu_bwd_f32_a16"),
        ("model_rotary_fwd_f32_d64", "rotary_fwd_f32_d64_a16"),
        ("model_rotary_bwd_f32_d64", "rotary_bwd_f32_d64_a16"),
    ] {
        assert_eq!(record_json(dir, label)["name"], name, "{label}");
    }
    let rd = |label: &str, file: &str| record_f32(dir, label, file);
    // The add forward: h = x + residual, y = h · rstd · w.
    let l = "model_rmsnorm_add_fwd_f32_h128";
    let (x, res, w) = (rd(l, "x.bin"), rd(l, "residual.bin"), rd(l, "w.bin"));
    let rows = x.len() / h;
    assert_eq!((x.len(), w.len()), (rows * h, h));
    assert_eq!(
        rows, 18,
        "the first forward recorded is the dense one, [2, 9]"
    );
    let hs: Vec<f64> = (0..rows * h).map(|k| x[k] as f64 + res[k] as f64).collect();
    assert_close(&hs, &rd(l, "h_out.expected.bin"), 1e-6, "h_out");
    let rstd: Vec<f64> = (hs.chunks_exact(h))
        .map(|r| 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / h as f64 + 1e-6).sqrt())
        .collect();
    let y: Vec<f64> = (0..rows * h)
        .map(|k| hs[k] * rstd[k / h] * w[k % h] as f64)
        .collect();
    assert_close(&y, &rd(l, "y.expected.bin"), 1e-5, "y");
    assert_close(&rstd, &rd(l, "rstd.expected.bin"), 1e-5, "rstd");
    // The add backward: dx = rstd · (dy·w − n · mean(dy·w·n)) + dres, n = h · rstd, and
    // dw_part = Σ dy · n over each program's rows (one row per program at these shapes).
    let l = "model_rmsnorm_add_bwd_f32_h128";
    let (dy, hb, w, rs, dres) = (
        rd(l, "dy.bin"),
        rd(l, "h.bin"),
        rd(l, "w.bin"),
        rd(l, "rstd.bin"),
        rd(l, "dres.bin"),
    );
    let rows = dy.len() / h; // the dense or the shared-prefix forward's, whichever came first
    let mut dx = vec![0f64; rows * h];
    let mut dw_part = vec![0f64; rows * h];
    for r in 0..rows {
        let n: Vec<f64> = (0..h)
            .map(|c| hb[r * h + c] as f64 * rs[r] as f64)
            .collect();
        let dn: Vec<f64> = (0..h).map(|c| dy[r * h + c] as f64 * w[c] as f64).collect();
        let mean = (0..h).map(|c| dn[c] * n[c]).sum::<f64>() / h as f64;
        for c in 0..h {
            dx[r * h + c] = rs[r] as f64 * (dn[c] - n[c] * mean) + dres[r * h + c] as f64;
            dw_part[r * h + c] = dy[r * h + c] as f64 * n[c];
        }
    }
    assert!(
        dres.iter().any(|v| *v != 0.0),
        "the residual stream's gradient is recorded"
    );
    assert_close(&dx, &rd(l, "dx.expected.bin"), 1e-4, "dx");
    assert_close(&dw_part, &rd(l, "dw_part.expected.bin"), 1e-5, "dw_part");
    // dw: the partials summed.
    let l = "model_rmsnorm_dw_f32";
    let parts = rd(l, "dw_part.bin");
    let p = parts.len() / h;
    let dw: Vec<f64> = (0..h)
        .map(|c| (0..p).map(|q| parts[q * h + c] as f64).sum())
        .collect();
    assert_close(&dw, &rd(l, "dw.expected.bin"), 1e-4, "dw");
    // SwiGLU: a = silu(g) · u; dg = da · u · σ(g)(1 + g(1 − σ(g))), du = da · silu(g).
    let l = "model_swiglu_bwd_f32";
    let (g, u, da) = (rd(l, "g.bin"), rd(l, "u.bin"), rd(l, "da.bin"));
    assert_eq!(g.len() % i, 0);
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let dg: Vec<f64> = (0..g.len())
        .map(|k| {
            let (x, s) = (g[k] as f64, sig(g[k] as f64));
            da[k] as f64 * u[k] as f64 * s * (1.0 + x * (1.0 - s))
        })
        .collect();
    let du: Vec<f64> = (0..g.len())
        .map(|k| da[k] as f64 * g[k] as f64 * sig(g[k] as f64))
        .collect();
    assert_close(&dg, &rd(l, "dg.expected.bin"), 1e-5, "dg");
    assert_close(&du, &rd(l, "du.expected.bin"), 1e-5, "du");
    let l = "model_swiglu_fwd_f32";
    let (g, u) = (rd(l, "g.bin"), rd(l, "u.bin"));
    let a: Vec<f64> = (0..g.len())
        .map(|k| g[k] as f64 * sig(g[k] as f64) * u[k] as f64)
        .collect();
    assert_close(&a, &rd(l, "a.expected.bin"), 1e-5, "a");
    // Rotary: each token's heads rotated by the table row at its position (the tables of
    // `Rotary::table`, angle p·θ^(−2j/d), the half repeated); the backward by the transpose.
    let d = 64usize;
    for (l, names, transpose) in [
        (
            "model_rotary_fwd_f32_d64",
            ["q", "k", "q_out", "k_out"],
            false,
        ),
        (
            "model_rotary_bwd_f32_d64",
            ["dq", "dk", "dq_out", "dk_out"],
            true,
        ),
    ] {
        let (cos, sin) = (rd(l, "cos.bin"), rd(l, "sin.bin"));
        let pos: Vec<i32> = std::fs::read(dir.join(l).join("pos.bin"))
            .unwrap()
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // The table rows are the model's: cos(p · 10000^(−2j/d)).
        let (p, j) = (5usize, 3usize);
        let angle = p as f64 * 10000f64.powf(-2.0 * j as f64 / d as f64);
        assert!((cos[p * d + j] as f64 - angle.cos()).abs() < 1e-6);
        assert!((sin[p * d + j + d / 2] as f64 - angle.sin()).abs() < 1e-6);
        assert!(pos.iter().any(|p| *p > 0), "{pos:?}");
        for (x, y) in [(names[0], names[2]), (names[1], names[3])] {
            let xs = rd(l, &format!("{x}.bin"));
            let n = pos.len();
            let heads = xs.len() / (n * d);
            let mut want = vec![0f64; xs.len()];
            for (t, &p) in pos.iter().enumerate() {
                let row = p as usize * d;
                for h in 0..heads {
                    let o = (t * heads + h) * d;
                    for j in 0..d / 2 {
                        let (x1, x2) = (xs[o + j] as f64, xs[o + j + d / 2] as f64);
                        let (c1, c2) = (cos[row + j] as f64, cos[row + j + d / 2] as f64);
                        let (s1, s2) = (sin[row + j] as f64, sin[row + j + d / 2] as f64);
                        let (y1, y2) = if transpose {
                            (x1 * c1 + x2 * s2, x2 * c2 - x1 * s1)
                        } else {
                            (x1 * c1 - x2 * s1, x2 * c2 + x1 * s2)
                        };
                        want[o + j] = y1;
                        want[o + j + d / 2] = y2;
                    }
                }
            }
            assert_close(&want, &rd(l, &format!("{y}.expected.bin")), 1e-5, y);
        }
    }
}

/// The model-level launch recorder on the fused RMSNorm (the layers' input norms and the final
/// norm plain, the post-attention norm with the residual add), SwiGLU and rotary: a real forward and
/// backward (with and without activation checkpointing, and with LoRA adapters on every
/// projection) writes each kernel's launch with the real tensors and the candle composition's
/// outputs and gradients; the results are the plain model's, bit for bit. Under
/// `RLVR_KERNEL_RECORD` (CI) the records go there and `scripts/ci_kernels.sh` replays them
/// under Triton's interpreter.
#[test]
fn model_level_launch_records_of_fused_norms_swiglu_and_rotary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => tmp.path().to_path_buf(),
    };
    let plain = Model::random(small(), 0.3, 13, DType::F32, &Device::Cpu).unwrap();
    let mut lora = plain.try_clone().unwrap();
    let cfg = crate::LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: crate::LoraTarget::ALL.to_vec(),
        dropout: 0.0,
    };
    lora.add_lora(&cfg, 5).unwrap();
    for (base, sub, checkpointing) in [
        (&lora, "lora", true),
        (&plain, "", true),
        (&plain, "", false),
    ] {
        let want = run(base);
        let mut m = base.try_clone().unwrap();
        m.set_kernels(layers_on());
        m.set_gradient_checkpointing(checkpointing);
        let at = dir.join(sub);
        let got = {
            let _guard = record_launches(&at).unwrap();
            run(&m)
        };
        assert_eq!(got, want, "{sub} checkpointing {checkpointing}");
    }
    check_layer_records(&dir);
    check_layer_records(&dir.join("lora"));
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

/// The same for Gemma 2, whose final-logit softcap (30) sends the head to the `_softcap`
/// variants: their records carry the real logits, the softcapped float64 state and the candle
/// composition's gradient through `cap · tanh(z / cap)`, and the model's results stay the plain
/// model's, bit for bit (f32: the fused CPU op's softcap; bf16: the chunked head's).
#[test]
fn model_level_launch_records_of_the_softcapped_head() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = match std::env::var_os(rlvr_kernels::triton::record::RECORD_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => tmp.path().to_path_buf(),
    };
    for dtype in [DType::F32, DType::BF16] {
        let plain = Model::random(small_gemma(Arch::Gemma2), 0.3, 19, dtype, &Device::Cpu).unwrap();
        assert_eq!(plain.final_logit_softcap(), Some(30.0));
        let want = run_head(&plain);
        let mut m = plain.try_clone().unwrap();
        m.set_kernels(head_on());
        assert!(m.fused_head(), "{dtype:?}: flagged for the recorder");
        let got = {
            let _guard = record_launches(&dir).unwrap();
            run_head(&m)
        };
        assert_eq!(got, want, "{dtype:?}");
    }
    for dt in ["f32", "bf16"] {
        for k in ["fwd", "bwd"] {
            for sfx in ["_first", "", "_last"] {
                let name = format!("logprob_{k}_softcap_{dt}");
                let rec = dir.join(format!("model_{name}{sfx}/record.json"));
                let text = std::fs::read_to_string(&rec)
                    .unwrap_or_else(|e| panic!("{}: {e}", rec.display()));
                let json: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(json["name"], name);
                let cap = (json["args"].as_array().unwrap().iter())
                    .find(|a| a["param"] == "cap")
                    .unwrap();
                assert_eq!(cap["value"], 30.0);
            }
        }
    }
    assert!(dir
        .join("model_logprob_finish_softcap/record.json")
        .exists());
    drop(tmp);
}

// ---------------------------------------------------------------------------------------------
// Gemma: the kernels implement none of its differences from the Llama layout.

/// `small()` as Gemma 2 (softcapped attention and logits) or Gemma 3 (a local rotary base), no
/// window (so that only the Gemma features decide).
fn small_gemma(arch: Arch) -> ModelConfig {
    let mut c = small();
    c.arch = arch;
    c.qkv_bias = false;
    c.gemma = crate::GemmaConfig::defaults_for(arch, c.head_dim);
    c
}

fn all_on() -> KernelSwitches {
    KernelSwitches {
        attention: Switch::On,
        decode: Switch::On,
        rms_norm: Switch::On,
        swiglu: Switch::On,
        rotary: Switch::On,
        adamw: Switch::On,
        logprob_head: Switch::On,
        cuda_graphs: Switch::On,
    }
}

/// Every fused op switched "on" resolves off for a Gemma model with its reason ((1 + weight)
/// norms, GeGLU, the attention scale and softcapping, the local rotary table), except AdamW
/// (parameters only), Gemma 2's rotary (one table) and the log-prob head (Gemma 2's final
/// softcapping has its `_softcap` variants); the model then scores as with every switch off, bit
/// for bit.
#[test]
fn gemma_features_turn_the_fused_kernels_off() {
    for arch in [Arch::Gemma2, Arch::Gemma3] {
        let cfg = small_gemma(arch);
        let why = |op| uncovered(op, &cfg, DType::F32);
        let norm = why(FusedOp::RmsNorm).unwrap();
        assert!(norm.contains("1 + weight"), "{norm}");
        assert!(why(FusedOp::Swiglu).unwrap().contains("GeGLU"));
        for op in [FusedOp::Decode, FusedOp::CudaGraphs] {
            let w = why(op).unwrap();
            assert!(w.contains("query_pre_attn_scalar"), "{w}");
            assert_eq!(
                w.contains("attn_logit_softcapping 50"),
                arch == Arch::Gemma2,
                "{w}"
            );
        }
        // The training attention takes Gemma's scale (and window); Gemma 2's score softcapping
        // keeps it off.
        match arch {
            Arch::Gemma2 => {
                let w = why(FusedOp::Attention).unwrap();
                assert!(w.contains("attn_logit_softcapping 50"), "{w}");
            }
            _ => assert!(why(FusedOp::Attention).is_none()),
        }
        assert!(why(FusedOp::Adamw).is_none());
        // Gemma 2's final-logit softcapping runs in the head's `_softcap` variants.
        assert!(why(FusedOp::LogprobHead).is_none());
        match arch {
            Arch::Gemma2 => assert!(why(FusedOp::Rotary).is_none()),
            _ => {
                assert!(why(FusedOp::Rotary)
                    .unwrap()
                    .contains("rope_local_base_freq"));
            }
        }
        let mut m = Model::random(cfg.clone(), 0.3, 7, DType::F32, &Device::Cpu).unwrap();
        m.set_kernels(all_on());
        let f = m.fused_flags();
        assert!(!f.decode && !f.rms_norm && !f.swiglu, "{arch:?}");
        assert_eq!(f.attention, arch == Arch::Gemma3);
        assert_eq!(f.rotary, arch == Arch::Gemma2);
        assert!(f.logprob_head);
        assert!(f.adamw);
        assert!(!all_on().runs_on_gpu(FusedOp::Decode, &cfg, DType::BF16));
        let plain = Model::random(cfg, 0.3, 7, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(run(&m), run(&plain), "{arch:?}");
    }
}

/// Partial rotary (Phi-4-mini's 0.75) turns off the rotary, decode and graph kernels, which
/// rotate every dimension of a head, with the factor in the reason; LongRoPE at full width turns
/// them off too (one table for every row, LongRoPE's is per row). The other kernels stay on, and a phi3 model with every
/// switch on scores and differentiates as with every switch off, bit for bit.
#[test]
fn partial_rotary_and_longrope_turn_the_rotary_kernels_off() {
    let mut c = small();
    c.arch = Arch::Phi3;
    c.qkv_bias = false;
    c.tie_word_embeddings = false;
    c.partial_rotary_factor = 0.5;
    let why = |cfg: &ModelConfig, op| uncovered(op, cfg, DType::F32);
    for op in [FusedOp::Rotary, FusedOp::Decode, FusedOp::CudaGraphs] {
        let w = why(&c, op).unwrap();
        assert!(
            w.contains("rotates 32 of each head's 64") && w.contains("0.5"),
            "{w}"
        );
    }
    for op in [
        FusedOp::Attention,
        FusedOp::RmsNorm,
        FusedOp::Swiglu,
        FusedOp::Adamw,
        FusedOp::LogprobHead,
    ] {
        assert!(why(&c, op).is_none(), "{op:?}");
    }
    let mut l = c.clone();
    l.partial_rotary_factor = 1.0;
    l.rope_scaling = Some(crate::RopeScaling::LongRope {
        short_factor: vec![1.5; 32],
        long_factor: vec![3.0; 32],
        original_max_position_embeddings: 64.0,
        factor: None,
        attention_factor: None,
    });
    assert!(why(&l, FusedOp::Attention).is_none());
    for op in [FusedOp::Rotary, FusedOp::Decode, FusedOp::CudaGraphs] {
        assert!(why(&l, op).unwrap().contains("LongRoPE"));
    }
    let mut m = Model::random(c.clone(), 0.3, 7, DType::F32, &Device::Cpu).unwrap();
    m.set_kernels(all_on());
    let f = m.fused_flags();
    assert!(!f.rotary && !f.decode && f.rms_norm && f.swiglu && f.adamw);
    let plain = Model::random(c, 0.3, 7, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(run(&m), run(&plain));
}
