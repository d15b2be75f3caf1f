//! rlvr-train's optimizer step over rlvr-dist's reduction: two ranks (threads of one process, each
//! with its own replica of the model) that each accumulate half the rows give the update one
//! process gives for all rows, the replicas stay bitwise equal, and a non-finite part on one rank
//! skips the update on both (the flag travels with the gradient sums).

use candle_core::{DType, Device, Tensor};
use rlvr_dist::{Communicator, DistReduce, ThreadComm};
use rlvr_model::optim::AdamWConfig;
use rlvr_model::{Model, ModelConfig};
use rlvr_train::update::OptimizerStep;

const LR: f64 = 1e-2;

fn tiny() -> Model {
    let config = ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 16}),
        "inline".as_ref(),
    )
    .unwrap();
    Model::random(config, 0.02, 7, DType::F32, &Device::Cpu).unwrap()
}

/// The rows of the batch: the sum of their log-probs is the (unnormalised) loss.
const ROWS: [[u32; 5]; 4] = [
    [1, 2, 3, 4, 5],
    [6, 7, 8, 9, 10],
    [11, 12, 13, 14, 15],
    [2, 4, 6, 8, 10],
];

/// −Σ ℓ over `rows`, divided by the global token count (the normaliser is global, as the trainer's).
fn loss(m: &Model, rows: &[usize]) -> Tensor {
    let ids: Vec<Vec<u32>> = rows.iter().map(|&r| ROWS[r].to_vec()).collect();
    let mask = vec![vec![1u32; 5]; rows.len()];
    let out = m.token_logprobs(&ids, &mask, 0, 1.0, false, true).unwrap();
    let total = (ROWS.len() * 4) as f64;
    (out.logprobs.sum_all().unwrap().neg().unwrap() / total).unwrap()
}

fn weights(m: &Model) -> Vec<Vec<f32>> {
    m.named_vars()
        .iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

fn params(m: &Model) -> Vec<Tensor> {
    m.named_vars()
        .iter()
        .map(|(_, v)| v.as_tensor().clone())
        .collect()
}

/// One process, all rows: `steps` updates; returns the norms and the final weights.
fn single(steps: usize) -> (Vec<f64>, Vec<Vec<f32>>) {
    let m = tiny();
    let mut opt = OptimizerStep::new(&m, AdamWConfig::default(), 1.0).unwrap();
    let mut norms = Vec::new();
    for _ in 0..steps {
        let mut g = opt.gradients();
        opt.accumulate(&mut g, &loss(&m, &[0, 1, 2, 3])).unwrap();
        norms.push(opt.apply(g, LR).unwrap().unwrap());
    }
    (norms, weights(&m))
}

/// Rank r of 2 takes rows r and r + 2; `poison` marks rank 1's part of update `poison` non-finite.
/// Per rank: each update's gradient norm (None = skipped) and the final weights.
type RankOutcome = (Vec<Option<f64>>, Vec<Vec<f32>>);

fn ranked(steps: usize, poison: Option<usize>) -> Vec<RankOutcome> {
    ThreadComm::run(2, |comm| {
        let m = tiny();
        let rank = comm.rank();
        let reduce = DistReduce::new(Box::new(comm), &params(&m)).unwrap();
        let mut opt = OptimizerStep::new(&m, AdamWConfig::default(), 1.0)
            .unwrap()
            .with_reduce(Box::new(reduce))
            .unwrap();
        let mut norms = Vec::new();
        for step in 0..steps {
            let mut g = opt.gradients();
            opt.accumulate(&mut g, &loss(&m, &[rank, rank + 2]))
                .unwrap();
            if rank == 1 && poison == Some(step) {
                g.mark_non_finite();
            }
            norms.push(opt.apply(g, LR).unwrap());
        }
        (norms, weights(&m))
    })
}

#[test]
fn two_ranks_with_half_the_rows_each_update_as_one_process_with_all() {
    let (n1, w1) = single(3);
    let ranks = ranked(3, None);
    assert_eq!(ranks[0], ranks[1], "the replicas differ");
    let (n2, w2) = &ranks[0];
    for (a, b) in n1.iter().zip(n2) {
        let b = b.expect("no update was skipped");
        assert!((a - b).abs() <= 1e-5 * a, "grad norm {a} vs {b}");
    }
    // AdamW magnifies rounding where a gradient is near zero: within 1e-2 × lr after 3 steps.
    let worst = w1
        .iter()
        .flatten()
        .zip(w2.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-2 * LR as f32,
        "largest weight difference {worst}"
    );
    assert!(n1[0] > 0.0);
}

#[test]
fn a_non_finite_part_on_one_rank_skips_the_update_on_both() {
    let clean = ranked(2, None);
    let ranks = ranked(2, Some(1));
    assert_eq!(ranks[0], ranks[1], "the replicas diverged");
    for (norms, _) in &ranks {
        assert!(norms[0].is_some(), "the first update is applied");
        assert_eq!(norms[1], None, "the poisoned update is skipped");
    }
    // The skipped update left the weights of the first one.
    let one = ranked(1, None);
    assert_eq!(ranks[0].1, one[0].1);
    assert_ne!(ranks[0].1, clean[0].1);
}
