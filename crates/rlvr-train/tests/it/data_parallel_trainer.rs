//! The whole trainer step data-parallel (`Trainer::data_parallel`): W ranks (threads of one
//! process over rlvr-dist's `ThreadComm`, each with its own replica) holding consecutive whole
//! groups of the step batch give the step one process gives for the whole batch, for each
//! aggregation and normaliser mode: the reported loss, gradient norm and statistics within 1e-5
//! relative (1e-7 absolute near zero), weights within 1e-2 × lr per 3 AdamW updates (AdamW
//! magnifies rounding where gradients are near zero), replicas bitwise equal, rows and tokens counted
//! exactly. Covered: zero-variance groups, groups that do not divide evenly over the ranks (5
//! groups on 2 and 3 ranks), a rank with no rows at all (2 groups on 3 ranks), two mini-batches ×
//! two epochs, RED-Drop's seeded choice, the mismatch correction, a group split over two ranks
//! refused.

use candle_core::{DType, Device};
use rlvr_dist::{Communicator, SharedComm, ThreadComm};
use rlvr_model::{Model, ModelConfig};
use rlvr_train::config::TrainSection;
use rlvr_train::job::Job;
use rlvr_train::store::experience::Experience;
use rlvr_train::update::{StepReport, Trainer, TrainerSettings};

const LR: f64 = 1e-3;

fn model() -> Model {
    let config = ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": 32, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 64,
            "tie_word_embeddings": true}),
        "inline".as_ref(),
    )
    .unwrap();
    Model::random(config, 0.3, 5, DType::F32, &Device::Cpu).unwrap()
}

/// `groups` groups of K = 4 (prompts 2-5 tokens, completions 1-6), the second zero-variance.
fn batch(groups: usize) -> Vec<Experience> {
    let mut s = 3u64;
    let mut next = |m: u64| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) % m) as u32
    };
    let mut out = Vec::new();
    for g in 0..groups {
        let prompt: Vec<u32> = (0..2 + next(4)).map(|_| 1 + next(30)).collect();
        for k in 0..4 {
            let c: Vec<u32> = (0..1 + next(6)).map(|_| 1 + next(30)).collect();
            out.push(Experience {
                prompt_ids: prompt.clone(),
                behaviour_logprobs: c.iter().map(|_| -3.0 + next(200) as f32 / 100.0).collect(),
                completion_ids: c,
                reward: Some(if g == 1 { 1.0 } else { ((g + k) % 3) as f64 }),
                correct: None,
                group_id: format!("g{g}"),
                version: Some(0),
                components: Vec::new(),
                truncated: k == 3 && g == 0,
                ..Default::default()
            });
        }
    }
    out
}

/// The preset's trainer with `fix` applied to its `[algorithm]` table.
fn trainer(preset: &str, train: &TrainSection, fix: Fix) -> Trainer {
    let mut alg = rlvr_algo::AlgorithmConfig::empty(preset);
    alg.kl_coef = None;
    fix(&mut alg);
    let settings = TrainerSettings {
        algorithm: alg.resolve().unwrap(),
        train: train.into(),
        temperature: 0.8,
        max_new_tokens: 6,
        pad_id: 0,
    };
    Trainer::new(model(), None, settings).unwrap()
}

fn weights(t: &Trainer) -> Vec<f32> {
    t.model
        .named_vars()
        .iter()
        .flat_map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// Three steps; the reports and the final weights.
fn steps(t: &mut Trainer, rows: &[Experience]) -> (Vec<StepReport>, Vec<f32>) {
    let reps = (1..=3).map(|s| t.step(rows, s, LR, 7).unwrap()).collect();
    (reps, weights(t))
}

/// Rank r's consecutive share of the groups of `b` (groups of 4 rows), as even as it goes.
fn share(b: &[Experience], world: usize, rank: usize) -> Vec<Experience> {
    let groups = b.len() / 4;
    let (per, extra) = (groups / world, groups % world);
    let start = rank * per + rank.min(extra);
    let n = per + usize::from(rank < extra);
    b[start * 4..(start + n) * 4].to_vec()
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-5 * a.abs().max(b.abs()) + 1e-7,
        "{what}: {a} vs {b}"
    );
}

type Fix = fn(&mut rlvr_algo::AlgorithmConfig);

/// No change to the preset.
fn plain(_: &mut rlvr_algo::AlgorithmConfig) {}

/// verl's truncated token IS.
fn token_truncate(a: &mut rlvr_algo::AlgorithmConfig) {
    a.mismatch_correction = Some(rlvr_algo::MismatchCorrection::TokenTruncate);
}

/// IcePop with its authors' bounds and OPSM: masked counts, histograms.
fn icepop_opsm(a: &mut rlvr_algo::AlgorithmConfig) {
    a.mismatch_correction = Some(rlvr_algo::MismatchCorrection::Icepop);
    a.mismatch_low = Some(0.5);
    a.mismatch_cap = Some(5.0);
    a.opsm_delta = Some(0.05);
}

fn check(preset: &str, train: TrainSection, groups: usize, world: usize, mismatch: Fix) {
    let what = format!("{preset} {groups} groups on {world} ranks");
    let b = batch(groups);
    let (one, w1) = steps(&mut trainer(preset, &train, mismatch), &b);
    let ranks = ThreadComm::run(world, |comm| {
        let rank = comm.rank();
        let comm = SharedComm::new(Box::new(comm));
        let mut t = trainer(preset, &train, mismatch)
            .data_parallel(Job::over(comm))
            .unwrap();
        steps(&mut t, &share(&b, world, rank))
    });
    for (r, (_, w)) in ranks.iter().enumerate() {
        assert!(
            w == &ranks[0].1,
            "{what}: replica {r} differs from rank 0's"
        );
    }
    for (r, (reps, _)) in ranks.iter().enumerate() {
        for (s, (a, b)) in one.iter().zip(reps).enumerate() {
            let w = format!("{what}, rank {r}, step {}", s + 1);
            assert_eq!(a.updates, b.updates, "{w}");
            assert_eq!(
                (a.tokens, a.rows_skipped),
                (b.tokens, b.rows_skipped),
                "{w}"
            );
            assert_eq!(a.skipped, b.skipped, "{w}");
            assert_eq!(format!("{:?}", a.adv), format!("{:?}", b.adv), "{w}");
            close(
                a.grad_norm.unwrap(),
                b.grad_norm.unwrap(),
                &format!("{w} grad norm"),
            );
            let (la, lb) = (a.loss.as_ref().unwrap(), b.loss.as_ref().unwrap());
            close(la.loss, lb.loss, &format!("{w} loss"));
            let fields = |m: &rlvr_algo::LossMetrics| {
                [
                    m.clip_frac,
                    m.clip_frac_low,
                    m.clip_frac_high,
                    m.clip_frac_adv_pos,
                    m.clip_frac_adv_neg,
                    m.ratio_mean,
                    m.ratio_min,
                    m.ratio_max,
                    m.kl_behaviour,
                    m.kl_ref,
                    m.entropy,
                    m.ess,
                    m.masked_frac,
                    m.zero_std_frac,
                ]
            };
            for (k, (x, y)) in fields(la).into_iter().zip(fields(lb)).enumerate() {
                match (x, y) {
                    (Some(x), Some(y)) => close(x, y, &format!("{w} metric {k}")),
                    _ => assert_eq!(x, y, "{w} metric {k}"),
                }
            }
            match (a.logprob_diff_s0, b.logprob_diff_s0) {
                (Some(x), Some(y)) => close(x, y, &format!("{w} logprob_diff_s0")),
                (x, y) => assert_eq!(x, y, "{w}"),
            }
            // Counts (histogram buckets, masked and truncated tokens and rows) are sums of
            // integers: exact.
            assert_eq!(la.ratio_hist, lb.ratio_hist, "{w} hist/ratio");
            assert_eq!(la.mismatch, lb.mismatch, "{w} mismatch counts");
            assert_eq!(la.opsm, lb.opsm, "{w} opsm counts");
            assert_eq!(a.mismatch_hist, b.mismatch_hist, "{w} hist/mismatch");
            assert_eq!(a.dropped_frac, b.dropped_frac, "{w} red_drop/dropped_frac");
            let hist: f64 = la.ratio_hist.iter().sum();
            assert_eq!(
                hist, a.tokens as f64,
                "{w}: the histogram counts every trained token"
            );
        }
    }
    assert!(
        one[0].loss.as_ref().unwrap().loss != 0.0,
        "{what}: zero loss"
    );
    let worst = w1
        .iter()
        .zip(&ranks[0].1)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    // 1e-2·lr per three AdamW updates: each update can turn a rounding difference in a near-zero
    // gradient into up to lr of weight (Adam divides by the gradient's own scale), so the bound
    // grows with the number of updates (3 at one update per step; 12 with 2 mini-batches × 2
    // epochs, where grpo_verl at 3 ranks differs by 1.1e-2·lr).
    let updates: usize = one.iter().map(|r| r.updates).sum();
    let bound = 1e-2 * LR as f32 * (updates as f32 / 3.0).max(1.0);
    assert!(
        worst <= bound,
        "{what}: weights differ by {worst} (bound {bound} for {updates} updates)"
    );
}

fn base() -> TrainSection {
    TrainSection {
        micro_batch_size: 3,
        grad_clip: 1.0,
        weight_decay: 0.01,
        ..Default::default()
    }
}

#[test]
fn each_normaliser_gives_the_one_process_step_on_two_and_three_ranks() {
    // token mean (dapo), sequence mean of token means (grpo), a constant (dr_grpo), REINFORCE,
    // REC's keep-mask, OPMD's regulariser.
    for preset in [
        "grpo",
        "dapo",
        "dr_grpo",
        "reinforce",
        "rec_oneside_is",
        "opmd",
    ] {
        check(preset, base(), 5, 2, plain);
    }
    check("grpo", base(), 5, 3, plain);
    check("dapo", base(), 5, 3, plain);
}

#[test]
fn a_rank_without_rows_still_runs_every_update() {
    check("grpo", base(), 2, 3, plain);
}

#[test]
fn mini_batches_epochs_red_drop_and_the_mismatch_correction_keep_their_meaning() {
    let more = TrainSection {
        mini_batches: 2,
        epochs: 2,
        ..base()
    };
    check("grpo", more.clone(), 5, 2, plain);
    check("red_drop", base(), 5, 2, plain);
    check("red_drop_bernoulli", base(), 5, 2, plain);
    check("grpo", base(), 4, 2, token_truncate);
    check("grpo_verl", more.clone(), 5, 3, icepop_opsm);
    // That case is not vacuous: IcePop and OPSM both masked something in one process.
    let rep = trainer("grpo_verl", &more, icepop_opsm)
        .step(&batch(5), 1, LR, 7)
        .unwrap();
    let l = rep.loss.unwrap();
    assert!(l.mismatch.masked_tokens > 0.0 && l.mismatch.masked_tokens < l.mismatch.tokens);
    assert!(l.opsm.masked_rows > 0.0, "{:?}", l.opsm);
    let no_skip = TrainSection {
        skip_zero_gradient_rows: false,
        share_prompt: false,
        ..base()
    };
    check("dapo", no_skip, 5, 3, plain);
}

#[test]
fn a_group_on_two_ranks_is_refused() {
    let b = batch(2);
    let errs = ThreadComm::run(2, |comm| {
        let rank = comm.rank();
        let mut t = trainer("grpo", &base(), plain)
            .data_parallel(Job::over(SharedComm::new(Box::new(comm))))
            .unwrap();
        // Rows 0-5 and 6-7: group g1 is on both.
        let rows = if rank == 0 { &b[..6] } else { &b[6..] };
        t.step(rows, 1, LR, 0).unwrap_err().to_string()
    });
    for e in errs {
        assert!(e.contains("\"g1\"") && e.contains("one rank"), "{e}");
    }
}

/// ZeRO-1 (`data_parallel_with(comm, 1)`): each rank keeps the moments of the parameters it
/// owns only (the owners partition the parameters), and three steps give the replicas the same
/// weights as each other and, within 1e-2 × lr, as one process, with the same gradient norms.
#[test]
fn zero_1_shards_the_moments_and_takes_the_same_steps() {
    let b = batch(5);
    let train = base();
    let (one, w1) = steps(&mut trainer("grpo", &train, plain), &b);
    for world in [2usize, 3] {
        let ranks = ThreadComm::run(world, |comm| {
            let rank = comm.rank();
            let comm = SharedComm::new(Box::new(comm));
            let mut t = trainer("grpo", &train, plain)
                .data_parallel_with(Job::over(comm), 1)
                .unwrap();
            assert!(t.optimizer.is_sharded());
            let (reps, w) = steps(&mut t, &share(&b, world, rank));
            let kept: Vec<usize> = t
                .optimizer
                .adamw
                .moments()
                .0
                .iter()
                .map(|m| m.elem_count())
                .collect();
            (reps, w, kept)
        });
        let sizes: Vec<usize> = model()
            .named_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .collect();
        for (i, &n) in sizes.iter().enumerate() {
            let holders: Vec<usize> = (0..world).filter(|&r| ranks[r].2[i] > 0).collect();
            assert_eq!(
                holders.len(),
                1,
                "parameter {i} ({n} elements): held by {holders:?}"
            );
            assert_eq!(ranks[holders[0]].2[i], n);
        }
        let per_rank: Vec<usize> = ranks.iter().map(|r| r.2.iter().sum()).collect();
        assert!(
            per_rank.iter().all(|&k| k < sizes.iter().sum::<usize>()),
            "no rank holds every moment: {per_rank:?}"
        );
        for (r, (reps, w, _)) in ranks.iter().enumerate() {
            assert!(w == &ranks[0].1, "replica {r} differs from rank 0's");
            for (a, b) in one.iter().zip(reps) {
                close(a.grad_norm.unwrap(), b.grad_norm.unwrap(), "grad norm");
                close(
                    a.loss.as_ref().unwrap().loss,
                    b.loss.as_ref().unwrap().loss,
                    "loss",
                );
            }
        }
        let worst = w1
            .iter()
            .zip(&ranks[0].1)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-2 * LR as f32,
            "{world} ranks: weights differ by {worst}"
        );
    }
}

/// ZeRO-2 (`data_parallel_with(comm, 2)`): each micro-batch's gradients reduced to their owners.
/// Per case, three steps at ZeRO-1 and ZeRO-2 on the same ranks; one process for the whole batch.
/// `micro_batch_size` 3 with groups of 4 gives the ranks different numbers of micro-batches
/// (the last part of a split group shares a micro-batch with the next group), and 2 groups on 3
/// ranks a rank with no rows, so the agreed count (the largest) and the empty micro-batches are
/// exercised. Checked: replicas bitwise equal; a rerun bitwise equal (reports and weights);
/// the moments sharded as ZeRO-1's; gradient norms and losses within 1e-5 of ZeRO-1's and one
/// process's; weights within 1e-2 × lr of both (the sums' order differs: Σ over micro-batches of
/// Σ over ranks). With one micro-batch per rank (`micro_batch_size` 64) the order is ZeRO-1's and
/// the two stages agree bit for bit.
#[test]
fn zero_2_reduces_each_micro_batch_to_its_owner_and_takes_the_same_steps() {
    type Ranks = Vec<(Vec<StepReport>, Vec<f32>, usize)>;
    let run = |train: &TrainSection, b: &[Experience], world: usize, zero: u8, lora: bool| {
        ThreadComm::run(world, |comm| {
            let rank = comm.rank();
            let comm = SharedComm::new(Box::new(comm));
            let t = match lora {
                true => lora_trainer(train),
                false => trainer("grpo", train, plain),
            };
            let mut t = t.data_parallel_with(Job::over(comm), zero).unwrap();
            assert!(t.optimizer.is_sharded());
            let (reps, w) = steps(&mut t, &share(b, world, rank));
            let kept: usize = (t.optimizer.adamw.moments().0.iter())
                .map(|m| m.elem_count())
                .sum();
            (reps, w, kept)
        })
    };
    let worst = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let cases: [(usize, usize, bool); 4] =
        [(5, 2, false), (5, 3, false), (2, 3, false), (5, 3, true)];
    for (groups, world, lora) in cases {
        let what = format!("{groups} groups on {world} ranks, lora {lora}");
        let b = batch(groups);
        let train = base();
        let mut one_t = match lora {
            true => lora_trainer(&train),
            false => trainer("grpo", &train, plain),
        };
        let (one, w1) = steps(&mut one_t, &b);
        let z1: Ranks = run(&train, &b, world, 1, lora);
        let z2: Ranks = run(&train, &b, world, 2, lora);
        let again: Ranks = run(&train, &b, world, 2, lora);
        for (r, (reps, w, kept)) in z2.iter().enumerate() {
            assert!(w == &z2[0].1, "{what}: replica {r} differs from rank 0's");
            assert_eq!(*kept, z1[r].2, "{what}: rank {r}'s moments");
            assert!(
                w == &again[r].1 && format!("{reps:?}") == format!("{:?}", again[r].0),
                "{what}: a rerun differs on rank {r}"
            );
            for (s, ((a, b), c)) in one.iter().zip(reps).zip(&z1[r].0).enumerate() {
                let w = format!("{what}, rank {r}, step {}", s + 1);
                assert_eq!((a.updates, a.tokens), (b.updates, b.tokens), "{w}");
                let n2 = b.grad_norm.unwrap();
                close(a.grad_norm.unwrap(), n2, &format!("{w} grad norm vs one"));
                close(
                    c.grad_norm.unwrap(),
                    n2,
                    &format!("{w} grad norm vs zero 1"),
                );
                close(
                    a.loss.as_ref().unwrap().loss,
                    b.loss.as_ref().unwrap().loss,
                    &format!("{w} loss"),
                );
            }
        }
        let total: usize = z2.iter().map(|r| r.2).sum();
        assert_eq!(
            total,
            w1.len(),
            "{what}: the moments partition the parameters"
        );
        let (d1, d0) = (worst(&z1[0].1, &z2[0].1), worst(&w1, &z2[0].1));
        assert!(
            d1 <= 1e-2 * LR as f32 && d0 <= 1e-2 * LR as f32,
            "{what}: weights differ from zero 1 by {d1}, from one process by {d0}"
        );
        assert!(
            worst(&w1, &one_t_initial(lora)) > 0.0,
            "{what}: nothing trained"
        );
    }
    // One micro-batch per rank: ZeRO-1's order, bit for bit.
    let big = TrainSection {
        micro_batch_size: 64,
        ..base()
    };
    for world in [2usize, 3] {
        let b = batch(5);
        let (z1, z2): (Ranks, Ranks) = (
            run(&big, &b, world, 1, false),
            run(&big, &b, world, 2, false),
        );
        for r in 0..world {
            assert!(
                z1[r].1 == z2[r].1,
                "{world} ranks: weights differ on rank {r}"
            );
            assert_eq!(format!("{:?}", z1[r].0), format!("{:?}", z2[r].0));
        }
    }
}

/// The grpo trainer over [`model`] with LoRA adapters of rank 2 on every projection (few
/// trainable parameters: some ranks own one or two small tensors).
fn lora_trainer(train: &TrainSection) -> Trainer {
    let mut t = trainer("grpo", train, plain);
    let c = rlvr_model::LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: rlvr_model::LoraTarget::ALL.to_vec(),
        dropout: 0.0,
    };
    let mut m = model();
    m.add_lora(&c, 3).unwrap();
    let settings = t.settings.clone();
    t = Trainer::new(m, None, settings).unwrap();
    t
}

/// The trained parameters before any step (to check a case trained at all).
fn one_t_initial(lora: bool) -> Vec<f32> {
    match lora {
        true => weights(&lora_trainer(&base())),
        false => weights(&trainer("grpo", &base(), plain)),
    }
}
