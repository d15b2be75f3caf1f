//! The decode forward gives the logits of `rlvr_model::Model::forward_cached` (the reference),
//! through prefill with left padding, group replication and row compaction, for every fixture
//! architecture (Qwen2 with biases and tied head, Llama with GQA / untied head / Llama-3 rope
//! scaling, Qwen3 with q/k norms).

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use rlvr_model::{KvCache, Model};

use crate::decode::{forward_last, KvBuffer, MASK_BIAS};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../rlvr-model/tests/fixtures/{name}"))
}

/// Largest |a − b| over all elements (f32 tensors of one shape).
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// Runs both forwards over `prompts` (left-padded), then `steps` decode steps feeding the greedy
/// token, replicating rows `rep` after prefill and dropping row 0 after the second step; returns
/// the largest logit difference seen.
fn check_parity(model: &Model, prompts: &[Vec<u32>], rep: &[u32], steps: usize) -> f32 {
    let dev = Device::Cpu;
    let l = prompts.iter().map(Vec::len).max().unwrap();
    let cap = l + steps + 1;
    let p_n = prompts.len();

    // Reference inputs.
    let mut ids = vec![];
    let mut mask = vec![];
    for p in prompts {
        let pad = l - p.len();
        let mut r = vec![0u32; pad];
        r.extend(p);
        ids.push(r);
        let mut m = vec![0u32; pad];
        m.extend(vec![1u32; p.len()]);
        mask.push(m);
    }
    let pos = rlvr_model::model::position_ids(&mask);
    let mut ref_cache = KvCache::new(model.config().num_hidden_layers);
    let ref_logits = model
        .forward_cached(&ids, &pos, &mask, &mut ref_cache)
        .unwrap();

    // Ours.
    let mut bias_rows = vec![0f32; p_n * cap];
    for (i, m) in mask.iter().enumerate() {
        for (j, &v) in m.iter().enumerate() {
            if v == 0 {
                bias_rows[i * cap + j] = MASK_BIAS;
            }
        }
    }
    let bias = model.attention_bias(&mask, 0, l).unwrap();
    let mut cache = KvBuffer::new(model, bias_rows, p_n, cap).unwrap();
    let flat: Vec<u32> = ids.iter().flatten().copied().collect();
    let ids_t = Tensor::from_vec(flat, (p_n, l), &dev).unwrap();
    let pos_flat: Vec<u32> = pos.iter().flatten().copied().collect();
    let logits = forward_last(model, &ids_t, &pos_flat, Some(&bias), &mut cache, None).unwrap();
    let mut worst = max_abs_diff(&logits, &ref_logits);

    // Replicate rows (group sharing) in both.
    let rep_t = Tensor::from_slice(rep, rep.len(), &dev).unwrap();
    let mut ref_cache = ref_cache.select_rows(&rep_t).unwrap();
    cache.keep_rows(rep).unwrap();
    let mut mask: Vec<Vec<u32>> = rep.iter().map(|&r| mask[r as usize].clone()).collect();
    let mut next_pos: Vec<u32> = rep
        .iter()
        .map(|&r| prompts[r as usize].len() as u32)
        .collect();
    let mut last = ref_logits.index_select(&rep_t, 0).unwrap();
    for step in 0..steps {
        if step == 2 {
            // Compaction: drop row 0.
            let keep: Vec<u32> = (1..mask.len() as u32).collect();
            let keep_t = Tensor::from_slice(&keep, keep.len(), &dev).unwrap();
            ref_cache = ref_cache.select_rows(&keep_t).unwrap();
            cache.keep_rows(&keep).unwrap();
            mask.remove(0);
            next_pos.remove(0);
            last = last.index_select(&keep_t, 0).unwrap();
        }
        let tok: Vec<u32> = last.argmax(1).unwrap().to_vec1().unwrap();
        let b = tok.len();
        for m in mask.iter_mut() {
            m.push(1);
        }
        let ids: Vec<Vec<u32>> = tok.iter().map(|&t| vec![t]).collect();
        let pos: Vec<Vec<u32>> = next_pos.iter().map(|&p| vec![p]).collect();
        let r = model
            .forward_cached(&ids, &pos, &mask, &mut ref_cache)
            .unwrap();
        let ids_t = Tensor::from_vec(tok, (b, 1), &dev).unwrap();
        let ours = forward_last(model, &ids_t, &next_pos, None, &mut cache, None).unwrap();
        worst = worst.max(max_abs_diff(&ours, &r));
        for p in next_pos.iter_mut() {
            *p += 1;
        }
        last = r;
    }
    worst
}

#[test]
fn decode_logits_equal_forward_cached_on_every_fixture() {
    let prompts = vec![
        vec![5u32, 17, 300],
        vec![1, 2, 3, 4, 5, 6, 7],
        vec![42, 9, 511, 8, 100],
    ];
    for name in ["qwen2_bias_tied", "llama_gqa_untied_rope3", "qwen3"] {
        let model = Model::load(&fixture(name), DType::F32, &Device::Cpu).unwrap();
        let d = check_parity(&model, &prompts, &[0, 0, 1, 2, 2, 2], 6);
        eprintln!("{name} f32: max |Δlogit| {d:e}");
        assert!(d < 1e-4, "{name}: max |Δlogit| {d}");
    }
}

#[test]
fn decode_logits_equal_forward_cached_in_bf16() {
    let prompts = vec![vec![5u32, 17, 300, 4], vec![1, 2]];
    let model = Model::load(&fixture("qwen2_bias_tied"), DType::BF16, &Device::Cpu).unwrap();
    let d = check_parity(&model, &prompts, &[0, 1, 1], 4);
    eprintln!("qwen2_bias_tied bf16: max |Δlogit| {d:e}");
    // Same ops in the same dtype through candle's matmul: bitwise equal when measured (0.0); the
    // bound leaves room for a reordered sum at bf16 precision.
    assert!(d < 5e-2, "bf16 max |Δlogit| {d}");
}
