//! Boundary tests of `Sampler::sample` against the reference model (`rlvr_model::Model`), on the
//! tiny HF fixtures (vocab 512) and, for stop strings, a random model with the Qwen2.5 tokenizer.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use rlvr_model::{Model, ModelConfig};
use rlvr_rollout::{Completion, FinishReason, RolloutError, Sampler, SamplingParams};

const FIXTURES: [&str; 3] = ["qwen2_bias_tied", "llama_gqa_untied_rope3", "qwen3"];

fn fixture(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../rlvr-model/tests/fixtures/{name}"));
    Model::load(&dir, DType::F32, &Device::Cpu).unwrap()
}

/// Prompts of different lengths (so batches are left-padded).
fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 300],
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9],
        vec![42],
        vec![100, 200, 300, 400, 500],
    ]
}

fn params(k: usize, t: f64, max_new: usize) -> SamplingParams {
    SamplingParams {
        group_size: k,
        temperature: t,
        max_new_tokens: max_new,
        min_new_tokens: 0,
        ..Default::default()
    }
}

/// Logits `[T, vocab]` of every position of one unpadded sequence, by the training forward.
fn full_logits(model: &Model, ids: &[u32]) -> Vec<Vec<f32>> {
    let t = ids.len();
    let mask = vec![vec![1u32; t]];
    let bias = model.attention_bias(&mask, 0, t).unwrap();
    let ids_t = Tensor::from_slice(ids, (1, t), &Device::Cpu).unwrap();
    let pos = rlvr_model::model::position_ids(&mask);
    let h = model
        .forward_hidden(&ids_t, &pos, &bias, None, false)
        .unwrap();
    let l = model.lm_head(&h, false).unwrap().squeeze(0).unwrap();
    l.to_dtype(DType::F32).unwrap().to_vec2().unwrap()
}

#[test]
fn greedy_equals_argmax_of_a_full_forward() {
    for name in FIXTURES {
        let model = fixture(name);
        let out = Sampler::new(&model, 3)
            .sample(&prompts(), 0, &params(2, 0.0, 12), 0)
            .unwrap();
        assert_eq!(out.len(), 8);
        for c in &out {
            let prompt = &prompts()[c.prompt_index];
            let mut seq = prompt.clone();
            seq.extend(&c.token_ids);
            let logits = full_logits(&model, &seq);
            for (i, &tok) in c.token_ids.iter().enumerate() {
                let row = &logits[prompt.len() - 1 + i];
                let (best, _) = rlvr_rollout::select::argmax(row);
                assert_eq!(
                    tok as usize, best,
                    "{name} prompt {} token {i}",
                    c.prompt_index
                );
            }
            assert_eq!(c.version, 3);
            assert_eq!(c.finish_reason, FinishReason::Length);
        }
        // Both samples of a greedy group agree.
        assert_eq!(out[0].token_ids, out[1].token_ids);
    }
}

/// Max |ℓ_old − ℓ_trainer| over all completion tokens, ℓ_trainer from `Model::token_logprobs`.
fn max_logprob_gap(model: &Model, out: &[Completion], t: f64) -> f32 {
    let mut worst = 0f32;
    for c in out {
        let prompt = &prompts()[c.prompt_index];
        let mut seq = prompt.clone();
        seq.extend(&c.token_ids);
        let mask = vec![vec![1u32; seq.len()]];
        let lp = model
            .token_logprobs(&[seq], &mask, prompt.len() - 1, t, false, false)
            .unwrap();
        let trainer: Vec<f32> = lp.logprobs.squeeze(0).unwrap().to_vec1().unwrap();
        assert_eq!(trainer.len(), c.behaviour_logprobs.len());
        for (a, b) in trainer.iter().zip(&c.behaviour_logprobs) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

#[test]
fn behaviour_logprobs_equal_trainer_logprobs_at_staleness_0() {
    for name in FIXTURES {
        let model = fixture(name);
        for t in [1.0, 0.7, 1.6] {
            let out = Sampler::new(&model, 0)
                .sample(&prompts(), 0, &params(3, t, 16), 7)
                .unwrap();
            let gap = max_logprob_gap(&model, &out, t);
            eprintln!("{name} T={t}: max |ℓ_old − ℓ_trainer| {gap:e}");
            assert!(gap < 1e-4, "{name} T={t}: max |Δℓ| {gap}");
        }
    }
}

#[test]
fn bf16_sampling_runs_and_matches_the_bf16_trainer_to_its_precision() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../rlvr-model/tests/fixtures/qwen2_bias_tied");
    let model = Model::load(&dir, DType::BF16, &Device::Cpu).unwrap();
    let out = Sampler::new(&model, 0)
        .sample(&prompts(), 0, &params(2, 1.0, 8), 3)
        .unwrap();
    assert!(out.iter().all(|c| c
        .behaviour_logprobs
        .iter()
        .all(|l| l.is_finite() && *l <= 0.0)));
    let gap = max_logprob_gap(&model, &out, 1.0);
    eprintln!("bf16: max |ℓ_old − ℓ_trainer| {gap:e}");
    // Measured 4.8e-7: both sides round the same bf16 logits to f32 before the log-softmax.
    assert!(gap < 1e-2, "bf16 max |Δℓ| {gap}");
}

#[test]
fn truncated_sampling_records_untruncated_logprobs() {
    // With top-k/top-p the token comes from the truncated distribution, but ℓ_old is still the
    // full-vocabulary log-prob (DESIGN.md section 3), so it equals the trainer's.
    let model = fixture("qwen2_bias_tied");
    let mut p = params(4, 0.8, 16);
    p.top_k = Some(5);
    p.top_p = 0.7;
    let out = Sampler::new(&model, 0)
        .sample(&prompts(), 0, &p, 1)
        .unwrap();
    let gap = max_logprob_gap(&model, &out, 0.8);
    assert!(gap < 1e-4, "max |Δℓ| {gap}");
    // And every token is within the top 5 of its step.
    for c in &out {
        let prompt = &prompts()[c.prompt_index];
        let mut seq = prompt.clone();
        seq.extend(&c.token_ids);
        let logits = full_logits(&model, &seq);
        for (i, &tok) in c.token_ids.iter().enumerate() {
            let row = &logits[prompt.len() - 1 + i];
            let above = row.iter().filter(|&&x| x > row[tok as usize]).count();
            assert!(above < 5, "token {tok} has {above} better tokens");
        }
    }
}

/// Same tokens, finish reasons and indices; log-probs equal up to the float rounding that a
/// different batch shape or padding brings (~1e-6).
fn assert_same(a: &[Completion], b: &[Completion], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (
                x.prompt_index,
                x.sample_index,
                &x.token_ids,
                x.finish_reason
            ),
            (
                y.prompt_index,
                y.sample_index,
                &y.token_ids,
                y.finish_reason
            ),
            "{what}"
        );
        for (p, q) in x.behaviour_logprobs.iter().zip(&y.behaviour_logprobs) {
            assert!((p - q).abs() < 1e-5, "{what}: {p} vs {q}");
        }
    }
}

#[test]
fn same_seed_same_tokens_whatever_the_batching() {
    let model = fixture("llama_gqa_untied_rope3");
    let sampler = Sampler::new(&model, 0);
    let mut p = params(3, 1.0, 20);
    p.top_p = 0.95;
    let reference = sampler.sample(&prompts(), 0, &p, 11).unwrap();
    for rows in [1, 2, 3, 5, 64] {
        p.max_batch_rows = rows;
        let out = sampler.sample(&prompts(), 0, &p, 11).unwrap();
        assert_same(&out, &reference, &format!("max_batch_rows {rows}"));
    }
    // A prompt sampled alone (with its global index) gets the same completions.
    p.max_batch_rows = 64;
    let alone = sampler.sample(&prompts()[2..3], 2, &p, 11).unwrap();
    assert_same(&alone, &reference[6..9], "prompt 2 alone");
    // Another seed gives other tokens; samples of a group differ.
    let other = sampler.sample(&prompts(), 0, &p, 12).unwrap();
    assert_ne!(other, reference);
    assert_ne!(reference[0].token_ids, reference[1].token_ids);
    // Layout: groups contiguous, ordered by (prompt, sample).
    let order: Vec<(usize, usize)> = reference
        .iter()
        .map(|c| (c.prompt_index, c.sample_index))
        .collect();
    let want: Vec<(usize, usize)> = (0..4).flat_map(|p| (0..3).map(move |s| (p, s))).collect();
    assert_eq!(order, want);
}

/// Child half of the thread-count test: samples and writes the completions' tokens to the file
/// named by `RLVR_ROLLOUT_CHILD_OUT` (does nothing when it is unset).
#[test]
fn child_sample_to_file() {
    let Ok(path) = std::env::var("RLVR_ROLLOUT_CHILD_OUT") else {
        return;
    };
    let model = fixture("qwen3");
    let out = Sampler::new(&model, 0)
        .sample(&prompts(), 0, &params(4, 1.0, 24), 5)
        .unwrap();
    let text: Vec<String> = out.iter().map(|c| format!("{:?}", c.token_ids)).collect();
    std::fs::write(path, text.join("\n")).unwrap();
}

#[test]
fn thread_count_does_not_change_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let mut outs = vec![];
    for threads in ["1", "2"] {
        let path = dir.path().join(format!("t{threads}.txt"));
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "sampler::child_sample_to_file",
                "--exact",
                "--test-threads=1",
            ])
            .env("RLVR_ROLLOUT_CHILD_OUT", &path)
            .env("RAYON_NUM_THREADS", threads)
            .status()
            .unwrap();
        assert!(status.success());
        outs.push(std::fs::read_to_string(&path).unwrap());
    }
    assert!(!outs[0].is_empty());
    assert_eq!(outs[0], outs[1]);
}

#[test]
fn stop_ids_end_a_completion_and_are_kept() {
    let model = fixture("qwen2_bias_tied");
    let sampler = Sampler::new(&model, 0);
    let free = sampler
        .sample(&prompts(), 0, &params(1, 0.0, 10), 0)
        .unwrap();
    // Stop on the 4th greedy token of prompt 1: it must end there, with the stop id included.
    let stop = free[1].token_ids[3];
    let mut p = params(1, 0.0, 10);
    p.stop_ids = vec![stop];
    let out = sampler.sample(&prompts(), 0, &p, 0).unwrap();
    for (f, c) in free.iter().zip(&out) {
        match f.token_ids.iter().position(|&t| t == stop) {
            Some(i) => {
                assert_eq!(c.token_ids, f.token_ids[..=i]);
                assert_eq!(c.finish_reason, FinishReason::Eos);
                assert_eq!(c.finish_reason.as_str(), "eos");
            }
            None => {
                assert_eq!(c.token_ids, f.token_ids);
                assert_eq!(c.finish_reason.as_str(), "length");
            }
        }
        assert_eq!(
            c.behaviour_logprobs,
            f.behaviour_logprobs[..c.token_ids.len()]
        );
    }
    assert!(out[1].token_ids.len() <= 4);
}

/// `min_new_tokens`: with the stop id set to a token that sampling draws often, no completion
/// holds it among its first `min_new_tokens` tokens, every completion has at least that many, and
/// ℓ_old is still the trainer's full-distribution log-prob (the ban only shapes the draw).
#[test]
fn min_new_tokens_bans_stop_ids_until_reached() {
    let model = fixture("qwen2_bias_tied");
    let sampler = Sampler::new(&model, 0);
    let free = sampler
        .sample(&prompts(), 0, &params(4, 1.0, 12), 3)
        .unwrap();
    // The most frequent token of the free samples: a stop id that would end many of them early.
    let mut counts = std::collections::HashMap::new();
    for c in &free {
        for &t in &c.token_ids {
            *counts.entry(t).or_insert(0usize) += 1;
        }
    }
    let (&stop, _) = counts.iter().max_by_key(|&(t, n)| (*n, *t)).unwrap();
    let mut p = params(4, 1.0, 12);
    p.stop_ids = vec![stop];
    let early = sampler.sample(&prompts(), 0, &p, 3).unwrap();
    assert!(
        early.iter().any(|c| c.token_ids.len() < 8),
        "the stop id should end some completion early without min_new_tokens"
    );
    for min in [8, 12] {
        p.min_new_tokens = min;
        let out = sampler.sample(&prompts(), 0, &p, 3).unwrap();
        assert_eq!(out.len(), 16);
        for c in &out {
            assert!(c.token_ids.len() >= min, "{c:?}");
            // Like transformers: the first `min` tokens never hold a stop id, so an EOS-ended
            // completion has at least min + 1 tokens.
            assert!(!c.token_ids[..min].contains(&stop), "{c:?}");
            if c.finish_reason == FinishReason::Eos {
                assert!(c.token_ids.len() > min);
            }
        }
        let gap = max_logprob_gap(&model, &out, 1.0);
        assert!(gap < 1e-4, "min_new_tokens {min}: max |Δℓ| {gap}");
    }
}

fn tokenizer_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/qwen2.5/tokenizer.json")
}

#[test]
fn stop_strings_end_a_completion() {
    let tok = tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap();
    let vocab = tok.get_vocab_size(true);
    let config = ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": vocab, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 256}),
        "inline".as_ref(),
    )
    .unwrap();
    let model = Model::random(config, 0.5, 3, DType::F32, &Device::Cpu).unwrap();
    let sampler = Sampler::new(&model, 0).with_tokenizer(tok.clone());
    let prompt = vec![tok.encode("Hello world", false).unwrap().get_ids().to_vec()];
    let free = sampler.sample(&prompt, 0, &params(1, 0.0, 30), 0).unwrap();
    let ids = &free[0].token_ids;
    // Stop string: the text of tokens 10..12 (decoded alone), which first appears at token ≤ 11.
    let stop = tok.decode(&ids[10..12], false).unwrap();
    assert!(!stop.is_empty());
    let mut p = params(1, 0.0, 30);
    p.stop_strings = vec![stop.clone()];
    let out = sampler.sample(&prompt, 0, &p, 0).unwrap();
    let c = &out[0];
    assert_eq!(c.finish_reason, FinishReason::StopString);
    assert_eq!(c.finish_reason.as_str(), "eos");
    assert!(c.token_ids.len() <= 12);
    assert_eq!(c.token_ids, ids[..c.token_ids.len()]);
    let text = tok.decode(&c.token_ids, false).unwrap();
    assert!(text.contains(&stop));
    let before = tok
        .decode(&c.token_ids[..c.token_ids.len() - 1], false)
        .unwrap();
    assert!(!before.contains(&stop), "stopped one token late");
}

#[test]
fn bad_inputs_are_rejected_with_their_name() {
    let model = fixture("qwen3");
    let s = Sampler::new(&model, 0);
    let err = |p: &SamplingParams, prompts: &[Vec<u32>]| s.sample(prompts, 10, p, 0).unwrap_err();
    let mut p = params(0, 1.0, 4);
    assert!(matches!(
        err(&p, &prompts()),
        RolloutError::InvalidParam {
            name: "group_size",
            ..
        }
    ));
    p = params(1, -1.0, 4);
    assert!(matches!(
        err(&p, &prompts()),
        RolloutError::InvalidParam {
            name: "temperature",
            ..
        }
    ));
    p = params(1, 1.0, 4);
    p.top_p = 0.0;
    assert!(matches!(
        err(&p, &prompts()),
        RolloutError::InvalidParam { name: "top_p", .. }
    ));
    p = params(1, 1.0, 0);
    assert!(matches!(
        err(&p, &prompts()),
        RolloutError::InvalidParam {
            name: "max_new_tokens",
            ..
        }
    ));
    p = params(1, 1.0, 4);
    let e = err(&p, &[vec![1], vec![]]);
    assert!(
        matches!(
            e,
            RolloutError::InvalidPrompt {
                prompt_index: 11,
                ..
            }
        ),
        "{e}"
    );
    let e = err(&p, &[vec![512]]);
    assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    p.stop_strings = vec!["x".into()];
    assert!(matches!(err(&p, &prompts()), RolloutError::NoTokenizer));
}

/// Choosing tokens on the device (the GPU path; here forced on the CPU) gives the same completions
/// as the host path: same tokens from the same streams, log-probs within 1e-5, at T = 1, 0.7 and
/// greedy, on the fixtures (vocab 512, one block) and a random model with a 3000-token vocabulary
/// (two full blocks and a partial one). With `min_new_tokens` pending it falls back to the host.
#[test]
fn device_selection_matches_host_selection() {
    let mut models: Vec<(String, Model)> = FIXTURES
        .iter()
        .map(|n| (n.to_string(), fixture(n)))
        .collect();
    let mut cfg: ModelConfig = fixture("qwen2_bias_tied").config().clone();
    cfg.vocab_size = 3000;
    models.push((
        "random-3000".into(),
        Model::random(cfg, 0.5, 1, DType::F32, &Device::Cpu).unwrap(),
    ));
    for (name, model) in &models {
        // Host and device selection on the same prompts and seed; returns the host completions.
        let compare = |p: &SamplingParams, what: &str| -> Vec<Completion> {
            let host = Sampler::new(model, 0).sample(&prompts(), 0, p, 11).unwrap();
            let dev = Sampler::new(model, 0)
                .select_on_device(true)
                .sample(&prompts(), 0, p, 11)
                .unwrap();
            assert_same(&host, &dev, &format!("{name} {what}"));
            host
        };
        for t in [1.0, 0.7, 0.0] {
            let mut p = params(3, t, 10);
            let host = compare(&p, &format!("T={t}"));
            if t > 0.0 {
                p.stop_ids = vec![host[0].token_ids[0]];
                p.min_new_tokens = 4;
                compare(&p, &format!("T={t} min_new_tokens"));
            }
        }
    }
}

/// NaN weights make NaN logits: sampling stops with an error naming the completion and position
/// (greedy and sampled, with and without top-p), never an id past the vocabulary (which NaN
/// logits used to yield, silently).
#[test]
fn non_finite_logits_stop_sampling_with_an_error() {
    let model = fixture("qwen3");
    let v = model.var("model.norm.weight").unwrap();
    v.set(&Tensor::full(f32::NAN, v.shape(), &Device::Cpu).unwrap())
        .unwrap();
    for (t, top_p) in [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)] {
        let p = SamplingParams {
            top_p,
            ..params(2, t, 4)
        };
        let err = Sampler::new(&model, 0)
            .sample(&prompts(), 10, &p, 3)
            .unwrap_err();
        assert!(
            matches!(err, RolloutError::NonFinite { position: 0, .. }),
            "T={t} top_p={top_p}: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("non-finite logits") && msg.contains("of prompt 1"),
            "{msg}"
        ); // draw indices 10..13
    }
}

/// The sliding-window fixtures (`qwen2_yarn_window`: YaRN and a 6-token window on layers 1-2;
/// `mistral_window`: a 5-token window on every layer; `gemma2_softcap`: softcapped attention and
/// logits, a 5-token window on alternate layers; `gemma3_local_global`: local layers with their
/// own rotary base and a 4-token window): the native sampler's prefill and KV-cache
/// decode go past the window and give transformers' greedy `generate` tokens (stored by
/// `scripts/make_model_fixtures.py`), greedy equals the argmax of the full forward with left-padded
/// prompts of 1 to 9 tokens, and sampled tokens' behaviour log-probs equal the trainer's.
#[test]
fn sliding_window_models_sample_as_transformers_generates() {
    #[derive(serde::Deserialize)]
    struct Greedy {
        prompt: Vec<u32>,
        tokens: Vec<u32>,
    }
    #[derive(serde::Deserialize)]
    struct Expected {
        greedy: Greedy,
    }
    for name in [
        "qwen2_yarn_window",
        "mistral_window",
        "gemma2_softcap",
        "gemma3_local_global",
    ] {
        let model = fixture(name);
        let window = model.config().sliding_window.as_ref().unwrap().size;
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../rlvr-model/tests/fixtures/{name}/expected.json"));
        let g: Expected = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let g = g.greedy;
        let n = g.tokens.len();
        assert!(g.prompt.len() + n > 3 * window);
        let out = Sampler::new(&model, 0)
            .sample(std::slice::from_ref(&g.prompt), 0, &params(1, 0.0, n), 0)
            .unwrap();
        assert_eq!(
            out[0].token_ids, g.tokens,
            "{name}: sampler vs transformers generate"
        );
        // Left-padded prompts of different lengths, greedy: the full forward's argmax.
        let out = Sampler::new(&model, 0)
            .sample(&prompts(), 0, &params(1, 0.0, 3 * window), 0)
            .unwrap();
        for c in &out {
            let prompt = &prompts()[c.prompt_index];
            let mut seq = prompt.clone();
            seq.extend(&c.token_ids);
            let logits = full_logits(&model, &seq);
            for (i, &tok) in c.token_ids.iter().enumerate() {
                let (best, _) = rlvr_rollout::select::argmax(&logits[prompt.len() - 1 + i]);
                assert_eq!(
                    tok as usize, best,
                    "{name} prompt {} token {i}",
                    c.prompt_index
                );
            }
        }
        let out = Sampler::new(&model, 0)
            .sample(&prompts(), 0, &params(2, 1.0, 3 * window), 5)
            .unwrap();
        let gap = max_logprob_gap(&model, &out, 1.0);
        eprintln!("{name}: max |ℓ_old − ℓ_trainer| {gap:e}");
        assert!(gap < 1e-4, "{name}: max |Δℓ| {gap}");
    }
}

/// LongRoPE (`phi3_longrope_partial`: the switch to the long factors past 16 positions, a 10-token
/// prompt, 20 new tokens): the sampler's KV decode gives transformers' greedy `generate` tokens
/// (which drops its cache at the switch and goes on from a full forward); in a left-padded batch
/// of prompts of 3 to 16 tokens, sampled at temperature 1 with K = 2, every token's behaviour
/// log-prob equals the log-prob of a full forward of the row's sequence up to that token (the
/// forward alone choosing short or long factors by its own length), before the switch and after.
#[test]
fn longrope_rows_switch_to_the_long_factors_as_transformers_generate() {
    #[derive(serde::Deserialize)]
    struct Greedy {
        prompt: Vec<u32>,
        tokens: Vec<u32>,
    }
    #[derive(serde::Deserialize)]
    struct Expected {
        greedy: Greedy,
    }
    let name = "phi3_longrope_partial";
    let model = fixture(name);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../rlvr-model/tests/fixtures/{name}/expected.json"));
    let g: Expected = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let g = g.greedy;
    let n = g.tokens.len();
    assert!(g.prompt.len() < 16 && g.prompt.len() + n > 16);
    let out = Sampler::new(&model, 0)
        .sample(std::slice::from_ref(&g.prompt), 0, &params(1, 0.0, n), 0)
        .unwrap();
    assert_eq!(
        out[0].token_ids, g.tokens,
        "sampler vs transformers generate"
    );
    let prompts: Vec<Vec<u32>> = [3usize, 9, 15, 16]
        .iter()
        .map(|&len| {
            (0..len as u32)
                .map(|i| (i * 37 + len as u32) % 512)
                .collect()
        })
        .collect();
    let out = Sampler::new(&model, 0)
        .sample(&prompts, 0, &params(2, 1.0, 14), 3)
        .unwrap();
    let mut crossed = 0;
    for c in &out {
        let prompt = &prompts[c.prompt_index];
        let mut seq = prompt.clone();
        for (i, &tok) in c.token_ids.iter().enumerate() {
            let logits = full_logits(&model, &seq);
            let last = logits.last().unwrap();
            let m = last.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let lse = m + last.iter().map(|x| (x - m).exp()).sum::<f32>().ln();
            let want = last[tok as usize] - lse;
            let got = c.behaviour_logprobs[i];
            assert!(
                (got - want).abs() < 1e-4,
                "prompt {} token {i} (position {}): ℓ_old {got} vs full forward {want}",
                c.prompt_index,
                seq.len()
            );
            crossed += usize::from(seq.len() == 16);
            seq.push(tok);
        }
    }
    assert!(crossed >= 4, "{crossed} rows crossed the switch");
}
