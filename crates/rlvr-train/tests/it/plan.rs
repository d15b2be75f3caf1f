//! `rlvr plan`: parameter counts equal the published ones of the Qwen2.5 shapes and the model's
//! own tensors; the JSON line and the table agree with the components; memory fits are monotone
//! and consistent with the peaks; sizes parse.

use crate::common::repo;

use rlvr_model::ModelConfig;
use rlvr_train::cli::{run_plan, PlanArgs};
use rlvr_train::config::plan::{parse_size, plan, Shape};
use rlvr_train::config::RawConfig;

fn shape(name: &str) -> Shape {
    let p = repo().join("configs/shapes").join(name).join("config.json");
    Shape::of(&ModelConfig::from_file(&p).unwrap())
}

#[test]
fn parameter_counts_match_the_published_qwen2_5_models() {
    // transformers' `num_parameters()` of Qwen2.5-{0.5,1.5,3,7}B-Instruct.
    assert_eq!(shape("qwen2.5-0.5b").params, 494_032_768);
    assert_eq!(shape("qwen2.5-1.5b").params, 1_543_714_304);
    assert_eq!(shape("qwen2.5-3b").params, 3_085_938_688);
    assert_eq!(shape("qwen2.5-7b").params, 7_615_616_512);
}

#[test]
fn parameter_count_equals_the_model_tensors() {
    for (arch, tied) in [("qwen2", true), ("qwen3", false), ("llama", false)] {
        let c = ModelConfig::from_json(
            &serde_json::json!({"model_type": arch, "vocab_size": 50, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
                "tie_word_embeddings": tied}),
            "inline".as_ref(),
        )
        .unwrap();
        let m = rlvr_model::Model::random(
            c.clone(),
            0.02,
            0,
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let n: usize = m
            .named_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .sum();
        assert_eq!(Shape::of(&c).params, n as u64, "{arch}");
    }
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("80GB").unwrap(), 80 << 30);
    assert_eq!(parse_size("24GiB").unwrap(), 24 << 30);
    assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
    assert_eq!(parse_size("16000MiB").unwrap(), 16000 << 20);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert!(parse_size("lots").is_err());
    assert!(parse_size("3 parsecs").is_err());
}

fn raw(sets: &[&str]) -> RawConfig {
    let cfg = repo().join("configs/gsm8k_off_policy_grpo_qwen2.5-0.5b.toml");
    let mut s: Vec<String> = vec![format!(
        "model.path={}",
        repo().join("configs/shapes/qwen2.5-0.5b").display()
    )];
    s.extend(sets.iter().map(|x| x.to_string()));
    RawConfig::load(Some(cfg.as_path()), &s).unwrap()
}

#[test]
fn components_add_up_and_fits_are_consistent() {
    let r = raw(&[]);
    let p = plan(&r, false, Some(80 << 30)).unwrap();
    let n = p.shape.params;
    // The config's device and dtype are `auto`: a plan is for a GPU whatever this machine has.
    assert_eq!((p.device.as_str(), p.dtype.as_str()), ("cuda", "bf16"));
    assert_eq!(p.weights, 2 * n, "bf16 weights");
    assert_eq!(p.master_weights, 4 * n);
    assert_eq!(p.adamw_moments, 8 * n);
    assert_eq!(
        p.explorer_weights,
        2 * n,
        "online sampling keeps a second copy"
    );
    assert_eq!(p.reference_model, 0, "kl_coef = 0");
    assert!(p.activations_per_row_checkpointed < p.activations_per_row / 4);
    // train.gradient_checkpointing = true: the peak keeps the checkpointed activations instead.
    let ck = plan(
        &raw(&["train.gradient_checkpointing=true"]),
        false,
        Some(80 << 30),
    )
    .unwrap();
    assert_eq!(
        p.train_peak - ck.train_peak,
        p.activations_per_micro_batch - ck.activations_per_micro_batch
    );
    assert!(p.share_prompt && p.activations_per_micro_batch < 4 * p.activations_per_row);
    // Without the shared prompt, 4 rows (micro_batch_size 4) of the per-row difference.
    let u = plan(&raw(&["train.share_prompt=false"]), false, None).unwrap();
    let uck = plan(
        &raw(&[
            "train.share_prompt=false",
            "train.gradient_checkpointing=true",
        ]),
        false,
        None,
    )
    .unwrap();
    assert_eq!(
        u.train_peak - uck.train_peak,
        4 * (p.activations_per_row - p.activations_per_row_checkpointed),
        "micro_batch_size 4"
    );
    assert_eq!(u.activations_per_micro_batch, 4 * p.activations_per_row);
    // The largest micro-batch fits and one more row does not.
    let rows = p.max_micro_batch_rows.unwrap();
    assert!(rows >= 1);
    let at = |rows: u64| {
        let r = raw(&[&format!("train.micro_batch_size={rows}")]);
        plan(&r, false, Some(80 << 30)).unwrap()
    };
    assert!(at(rows).train_peak <= 80 << 30);
    assert!(at(rows + 1).train_peak > 80 << 30);
    // f32 drops the masters; KL adds the reference; an experiences file drops the explorer.
    let f = plan(&raw(&["model.dtype=\"f32\""]), true, None).unwrap();
    assert_eq!((f.master_weights, f.reference_model), (0, 4 * n));
    assert!(f.fits.is_none());
    let off = plan(&raw(&["data.experiences=\"x.jsonl\""]), false, None).unwrap();
    assert_eq!(off.explorer_weights, 0);
    // Asynchronous sampling keeps one more copy in flight and the KV cache during training.
    let asy = plan(&raw(&["sync.offset=1"]), false, None).unwrap();
    assert_eq!(asy.explorer_weights, 4 * n);
    assert!(asy.train_peak >= p.train_peak + p.kv_cache);
}

#[test]
fn a_cpu_only_build_says_so_naming_the_flag() {
    use rlvr_model::DeviceSpec;
    use rlvr_train::cli::cpu_build_note;
    let auto = cpu_build_note(&DeviceSpec::Auto, false).unwrap();
    assert!(
        auto.contains("built without CUDA")
            && auto.contains("--features cuda")
            && auto.contains("would run it on the CPU")
            && auto.contains("model.device=\"cpu\""),
        "{auto}"
    );
    let cuda = cpu_build_note(&DeviceSpec::Cuda(0), false).unwrap();
    assert!(cuda.contains("would refuse it"), "{cuda}");
    assert_eq!(cpu_build_note(&DeviceSpec::Cpu, false), None);
    assert_eq!(cpu_build_note(&DeviceSpec::Auto, true), None);
}

#[test]
fn json_is_one_object_on_the_last_line_and_the_table_names_every_component() {
    let cfg = repo().join("configs/gsm8k_off_policy_grpo_qwen2.5-0.5b.toml");
    let mp = format!(
        "model.path={}",
        repo().join("configs/shapes/qwen2.5-0.5b").display()
    );
    let mut args = PlanArgs {
        config: cfg,
        set: vec![mp],
        gpu_memory: Some("24GB".into()),
        json: true,
        world_size: 1,
        zero: None,
    };
    let mut out = Vec::new();
    run_plan(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(v["shape"]["params"], 494_032_768u64);
    assert_eq!(v["memory"], 24u64 << 30);
    // This test binary's build: a note when it has no CUDA, none when it has.
    assert_eq!(v["note"].is_string(), !cfg!(feature = "cuda"), "{v}");
    assert!(v["max_micro_batch_rows"].as_u64().is_some());
    args.json = false;
    let mut out = Vec::new();
    run_plan(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    for k in [
        "weights",
        "master weights",
        "gradients",
        "AdamW moments",
        "explorer weights",
        "reference model",
        "activations per row",
        "with checkpointing",
        "logits buffer",
        "activations/micro-batch",
        "KV cache",
        "largest micro-batch",
        "largest rollout batch",
    ] {
        assert!(text.contains(k), "table lacks {k}:\n{text}");
    }
}

/// The per-layer activation bytes of a small shape, term by term by hand (hidden 16, 4 heads of 8,
/// 2 KV heads, MLP 24, q/k/v bias, T = 10): f32 (b = 4) and bf16 (b = 2, reductions in f32).
#[test]
fn layer_activation_bytes_match_a_hand_count() {
    let c = ModelConfig::from_json(
        &serde_json::json!({"model_type": "qwen2", "vocab_size": 50, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
            "tie_word_embeddings": true}),
        "inline".as_ref(),
    )
    .unwrap();
    let s = Shape::of(&c);
    // f32: norms 2·3·16·4 = 384; q/k/v with bias (32+16+16)·4·2 = 512; rotary (11·32+13·16)·4/2 =
    // 1120, plus the two rotations' cos and sin leaf copies and their gradients 8·8·4 = 256;
    // scores 4 heads·10·(2·4+4·4) = 960, plus the mask row's leaf copy and gradient 2·10·4 = 80
    // and the row maxima's 2·4 heads·4 = 32; p·v, copy, o-proj, residual 2·32·4+2·16·4 = 384;
    // MLP 4·24·4+2·16·4 = 512.
    assert_eq!(
        s.layer_bytes_per_token(4, 10),
        384 + 512 + (1120 + 256) + (960 + 80 + 32) + 384 + 512
    );
    // bf16: norms 2·(3·16·4+2·16·2) = 512; q/k/v 64·2·2 = 256; rotary 560·2/2 = 560 + 8·8·2 =
    // 128; scores 4·10·(2·2+4·4+4+2) = 1040 + 80 + 32 (the mask and maxima in f32); 2·32·2+2·16·2
    // = 192; MLP 4·24·2+2·16·2 = 256.
    assert_eq!(
        s.layer_bytes_per_token(2, 10),
        512 + 256 + (560 + 128) + (1040 + 80 + 32) + 192 + 256
    );
    // Fused attention keeps the kernel's output and its log-sum-exp per head instead of the
    // scores, p·v and its copy: f32 32·4 + 4·4 = 144 (for 960 + 2·32·4), bf16 32·2 + 4·4 = 80.
    use rlvr_train::config::plan::AttentionPath;
    assert_eq!(
        s.layer_bytes_per_token_with(4, 10, AttentionPath::Fused),
        384 + 512 + (1120 + 256) + 144 + 2 * 16 * 4 + 512
    );
    assert_eq!(
        s.layer_bytes_per_token_with(2, 10, AttentionPath::Fused),
        512 + 256 + (560 + 128) + 80 + 2 * 16 * 2 + 256
    );
    assert_eq!(
        s.layer_bytes_per_token_with(2, 10, AttentionPath::Eager),
        s.layer_bytes_per_token(2, 10)
    );
    // Parameters by hand: embedding 50·16 (tied) + 3 layers × (2 norms 2·16 + q 16·32 + k, v
    // 2·16·16 + o 32·16 + MLP 3·16·24 + q/k/v bias 32+16+16) + final norm 16.
    let layer = 2 * 16 + 16 * 32 + 2 * 16 * 16 + 32 * 16 + 3 * 16 * 24 + (32 + 16 + 16);
    assert_eq!(s.params, 50 * 16 + 3 * layer + 16);
}

/// What the trainer holds of the gradients (rlvr_train::config::plan's module docs): from an
/// update's second micro-batch on, the f32 sum and a whole backward's gradients (P·4 + P·b),
/// with the embedding's gradient summed anew at the backward's end (E·b, E = V·H); an update of
/// one micro-batch in f32 holds only its backward's gradients, which are the sum (P·4 + E·4 at
/// the backward's end; before, the plan counted P·8 there); one in bf16 makes the f32 copy
/// beside them (P·6). The micro-batches per update are this rank's rows of one update (whole
/// groups of K = 8 over the mini-batches and ranks) over the micro-batch rows. The shipped
/// config: 32 prompts × 8, Qwen2.5-0.5B (E = 151,936 × 896).
#[test]
fn gradients_count_one_backward_beside_the_sum_only_when_an_update_has_two_micro_batches() {
    let n: u64 = 494_032_768;
    let e: u64 = 151_936 * 896;
    let case = |sets: &[&str], world: u64| {
        let mut s = vec!["model.device=\"cpu\""];
        s.extend(sets);
        let p = rlvr_train::config::plan::plan_ranks(&raw(&s), false, None, world, 0).unwrap();
        (p.micro_batches_per_update, p.gradients)
    };
    let f32 = "model.dtype=\"f32\"";
    let bf16 = "model.dtype=\"bf16\"";
    // 256 rows in micro-batches of 4: 64 of them.
    assert_eq!(case(&[f32], 1), (64, 8 * n + 4 * e));
    assert_eq!(case(&[bf16], 1), (64, 6 * n + 2 * e));
    // One micro-batch of all 256 rows.
    let all = "train.micro_batch_size=256";
    assert_eq!(case(&[f32, all], 1), (1, 4 * n + 4 * e));
    assert_eq!(case(&[bf16, all], 1), (1, 6 * n));
    // Two mini-batches of 16 groups (128 rows), over 2 ranks (64 rows each), in micro-batches of
    // 64 rows: one each; of 63: two.
    let two = "train.mini_batches=2";
    assert_eq!(
        case(&[f32, two, "train.micro_batch_size=64"], 2),
        (1, 4 * n + 4 * e)
    );
    assert_eq!(
        case(&[f32, two, "train.micro_batch_size=63"], 2),
        (2, 8 * n + 4 * e)
    );
}

/// The Qwen2.5-0.5B plan of the shipped GSM8K config, by hand: 512 + 512 tokens, bf16 on a GPU.
#[test]
fn qwen2_5_0_5b_plan_matches_a_hand_count() {
    let p = plan(&raw(&[]), false, Some(80 << 30)).unwrap();
    let n: u64 = 494_032_768;
    assert_eq!((p.prompt_tokens, p.completion_tokens), (512, 512));
    // The f32 sum, one backward's bf16 gradients, and the embedding's gradient summed anew at
    // the backward's end (64 micro-batches per update; the plan's module docs).
    assert_eq!(p.gradients, 4 * n + 2 * n + 151_936 * 896 * 2);
    // KV cache per row: 1024 tokens × 24 layers × (k, v) × 2 KV heads × 64 × 2 bytes = 12 MiB.
    assert_eq!(p.kv_cache, p.kv_cache_rows * 1024 * 24 * 2 * 2 * 64 * 2);
    assert_eq!(1024 * 24 * 2 * 2 * 64 * 2, 12 << 20);
    // Chunked logits: 6 chunks of 32 Mi f32 logits (the GPU chunk) + the head's [V, H] gradient
    // chunks in bf16.
    assert_eq!(p.logits_buffer, 6 * (32 << 20) * 4 + 151_936 * 896 * 2);
    // Activations per row: 25 layers' worth (24 + one of backward working set) + embedding and
    // final norm, 896·(2 + 16) bytes per token.
    let layer = p.shape.layer_bytes_per_token(2, 1024);
    assert_eq!(p.activations_per_row, 1024 * (25 * layer + 896 * 18));
    assert_eq!(
        p.activations_per_row_checkpointed,
        1024 * (896 * 2 * 24 + 2 * layer + 896 * 18)
    );
    // The largest micro-batch: what is left after the fixed part, in whole rows.
    let fixed = p.weights
        + p.master_weights
        + p.adamw_moments
        + p.explorer_weights
        + p.gradients
        + p.logits_buffer
        + p.overhead;
    let free = (80u64 << 30) - fixed;
    // train.share_prompt (default): a micro-batch of r rows of groups of K = 8 runs ⌈r / 8⌉ prompts
    // of 512 and r completions of 512 through the decoder, and every row keeps its gathered copy of
    // the prompt's keys and values (512 × (k, v) × 2 KV heads × 64 × 2 bytes) and that copy joined
    // to its own ((512 + 512) × (k, v) × 2 × 64 × 2) in 25 layers.
    let per_position = 25 * layer + 896 * 18;
    let kept = |r: u64| {
        (r.div_ceil(8) * 512 + r * 512) * per_position + r * (512 + 512 + 512) * 2 * 2 * 64 * 2 * 25
    };
    assert_eq!(
        p.micro_batch_positions,
        512 + 4 * 512,
        "micro_batch_size 4: half a group"
    );
    assert_eq!(p.activations_per_micro_batch, kept(4));
    let r = p.max_micro_batch_rows.unwrap();
    assert!(kept(r) <= free && kept(r + 1) > free, "{r} rows");
    assert_eq!(
        p.max_micro_batch_tokens.unwrap(),
        r.div_ceil(8) * 512 + r * 512
    );
    // Every row computing its prompt: whole rows of the per-row activations, fewer of them.
    let u = plan(&raw(&["train.share_prompt=false"]), false, Some(80 << 30)).unwrap();
    assert_eq!(
        u.max_micro_batch_rows.unwrap(),
        free / p.activations_per_row
    );
    assert_eq!(u.micro_batch_positions, 4 * 1024);
    assert!(r > u.max_micro_batch_rows.unwrap());
}

/// `Shape::param_sizes` lists the model's own tensors (as a multiset), for each architecture.
#[test]
fn param_sizes_are_the_model_tensors() {
    for (arch, tied) in [("qwen2", true), ("qwen3", false), ("llama", false)] {
        let c = ModelConfig::from_json(
            &serde_json::json!({"model_type": arch, "vocab_size": 50, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
                "tie_word_embeddings": tied}),
            "inline".as_ref(),
        )
        .unwrap();
        let m = rlvr_model::Model::random(
            c.clone(),
            0.02,
            0,
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let mut want: Vec<u64> = m
            .named_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count() as u64)
            .collect();
        let mut got = Shape::of(&c).param_sizes();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{arch}");
    }
}

/// Per rank: ZeRO-1 divides the masters and moments by the owners' largest share (within one
/// parameter of 1/W) and leaves every other term; a world above 1 adds the reduction buffer; the
/// 7B shape on 8 × 80 GB does not fit as full fine-tuning at ZeRO-1 and the plan names what does.
#[test]
fn world_size_and_zero_1_per_rank() {
    use rlvr_train::config::plan::{plan_ranks, suggestions};
    let r = RawConfig::load(
        None,
        &[
            format!(
                "model.path=\"{}\"",
                repo().join("configs/shapes/qwen2.5-7b").display()
            ),
            "model.dtype=\"bf16\"".into(),
            "model.device=\"cuda:0\"".into(),
            "data.max_prompt_len=256".into(),
            "rollout.max_new_tokens=512".into(),
            "train.micro_batch_size=4".into(),
        ],
    )
    .unwrap();
    let one = plan_ranks(&r, false, None, 1, 0).unwrap();
    let z0 = plan_ranks(&r, false, None, 8, 0).unwrap();
    let z1 = plan_ranks(&r, false, None, 8, 1).unwrap();
    let p = shape("qwen2.5-7b").params;
    assert_eq!(
        (one.reduction_buffer, one.optimizer_params_per_rank),
        (0, p)
    );
    assert_eq!(z0.adamw_moments, one.adamw_moments);
    assert_eq!(z0.reduction_buffer, 256 << 20);
    // The largest tensor (the 152064 × 3584 embedding, 545 M) is below p/8 = 952 M: balanced.
    let share = z1.optimizer_params_per_rank;
    assert!(share >= p / 8 && share <= p / 8 + 152_064 * 3584, "{share}");
    assert_eq!(z1.adamw_moments, 8 * share);
    assert_eq!(z1.master_weights, 4 * share);
    assert_eq!((z1.weights, z1.gradients), (one.weights, one.gradients));
    assert_eq!(
        z0.train_peak - z1.train_peak,
        (z0.adamw_moments + z0.master_weights + z0.reduction_buffer)
            - (z1.adamw_moments + z1.master_weights + z1.reduction_buffer)
    );
    // ZeRO-2 with activation checkpointing fits too (since 2026-12-08), named first.
    let fit = suggestions(&r, false, 80 << 30, 8, 1).unwrap();
    assert_eq!(
        fit.first().map(String::as_str),
        Some("distributed.zero=2 train.gradient_checkpointing=true"),
        "{fit:?}"
    );
    assert!(
        fit[1..].iter().all(|s| s.contains("model.lora_rank=16")),
        "{fit:?}"
    );
}

/// ZeRO-2 per rank: the f32 gradient sum becomes the most-loaded owner's share (one backward's
/// gradients in bf16 and the embedding's re-sum stay whole), every other term is ZeRO-1's; with
/// one micro-batch per update the sum is the reduced share itself (no separate sum). The advice:
/// where ZeRO-1 does not fit and ZeRO-2 does, `distributed.zero=2` is listed (alone, first);
/// where ZeRO-1 fits, ZeRO-2 is not listed beside it; `--zero 3` is refused.
#[test]
fn zero_2_shards_the_gradient_sum_and_the_advice_names_it() {
    use rlvr_train::config::plan::{plan_ranks, suggestions};
    let load = |mb: &str| {
        RawConfig::load(
            None,
            &[
                format!(
                    "model.path=\"{}\"",
                    repo().join("configs/shapes/qwen2.5-7b").display()
                ),
                "model.dtype=\"bf16\"".into(),
                "model.device=\"cuda:0\"".into(),
                "data.max_prompt_len=256".into(),
                "rollout.max_new_tokens=512".into(),
                format!("train.micro_batch_size={mb}"),
            ],
        )
        .unwrap()
    };
    let r = load("4");
    let p = shape("qwen2.5-7b").params;
    let (v, h) = (152_064u64, 3584u64);
    let z1 = plan_ranks(&r, false, None, 8, 1).unwrap();
    let z2 = plan_ranks(&r, false, None, 8, 2).unwrap();
    assert!(
        z2.micro_batches_per_update > 1,
        "{}",
        z2.micro_batches_per_update
    );
    let share = z2.optimizer_params_per_rank;
    assert_eq!(share, z1.optimizer_params_per_rank);
    // bf16: one backward's gradients (2 bytes), the embedding's re-sum, the f32 share.
    assert_eq!(z1.gradients, p * 4 + p * 2 + v * h * 2);
    assert_eq!(z2.gradients, share * 4 + p * 2 + v * h * 2);
    assert_eq!(
        (
            z2.adamw_moments,
            z2.master_weights,
            z2.reduction_buffer,
            z2.weights
        ),
        (
            z1.adamw_moments,
            z1.master_weights,
            z1.reduction_buffer,
            z1.weights
        )
    );
    assert_eq!(z1.train_peak - z2.train_peak, (p - share) * 4);
    // One process or one rank: the stage changes nothing.
    let one = plan_ranks(&r, false, None, 1, 2).unwrap();
    assert_eq!(
        one.gradients,
        plan_ranks(&r, false, None, 1, 0).unwrap().gradients
    );
    // One micro-batch per update (128 rows): the reduced share is the sum.
    let big = load("128");
    let b2 = plan_ranks(&big, false, None, 8, 2).unwrap();
    assert_eq!(b2.micro_batches_per_update, 1);
    assert_eq!(b2.gradients, p * 2 + v * h * 2);
    // Memory between the two peaks: ZeRO-2 fits, ZeRO-1 does not; the advice says so first.
    let mid = (z1.train_peak.max(z1.rollout_peak) + z2.train_peak.max(z2.rollout_peak)) / 2;
    assert_eq!(
        plan_ranks(&r, false, Some(mid), 8, 1).unwrap().fits,
        Some(false)
    );
    assert_eq!(
        plan_ranks(&r, false, Some(mid), 8, 2).unwrap().fits,
        Some(true)
    );
    for from in [0u8, 1] {
        let fit = suggestions(&r, false, mid, 8, from).unwrap();
        assert_eq!(
            fit.first().map(String::as_str),
            Some("distributed.zero=2"),
            "{fit:?}"
        );
    }
    // Enough for ZeRO-1: it is listed, ZeRO-2 alone is not.
    let m1 = z1.train_peak.max(z1.rollout_peak) + (1 << 20);
    let fit = suggestions(&r, false, m1, 8, 0).unwrap();
    assert_eq!(
        fit.first().map(String::as_str),
        Some("distributed.zero=1"),
        "{fit:?}"
    );
    assert!(!fit.iter().any(|s| s == "distributed.zero=2"), "{fit:?}");
    let e = plan_ranks(&r, false, None, 8, 3).unwrap_err().to_string();
    assert!(e.contains("expected 0, 1 or 2"), "{e}");
}

#[test]
fn a_model_path_without_config_json_says_to_set_it_and_where_shapes_are() {
    // The shipped GPU configs name a placeholder checkpoint (configs/README.md, "Paths").
    let dir = tempfile::tempdir().unwrap();
    let r = raw(&[&format!("model.path={}", dir.path().display())]);
    let e = format!("{:#}", plan(&r, false, None).unwrap_err());
    let want = format!(
        "model.path {} has no readable config.json (rlvr plan reads the model's shape from it, no \
         weights needed; configs/shapes/ holds Qwen2.5's): pass --set model.path=DIR",
        dir.path().display()
    );
    assert!(e.starts_with(&want), "{e}");
}

/// Absurd sizes are refused by name, never overflow (issue 49, item 12): config.json at every
/// size bound with the longest rows the run's keys allow would need ~10²³ bytes per row, which
/// `rlvr plan` once computed in wrapping u64 arithmetic (a panic in debug builds); the largest
/// micro-batch search with a memory to fit stops below the overflow; a real shape with 16M-token
/// rows is refused the same way, and at the bound of what fits it still plans.
#[test]
fn absurd_sizes_are_refused_naming_the_figure_never_overflow() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type":"qwen2","hidden_size":131072,"num_attention_heads":4096,
            "num_key_value_heads":4096,"head_dim":8192,"intermediate_size":524288,
            "num_hidden_layers":4096,"vocab_size":8388608,"max_position_embeddings":67108864}"#,
    )
    .unwrap();
    let path = format!("model.path=\"{}\"", dir.path().display());
    let huge = raw(&[
        &path,
        "rollout.max_new_tokens=16777216",
        "data.max_prompt_len=16777216",
        "train.micro_batch_size=65536",
    ]);
    for memory in [None, Some(80u64 << 30)] {
        let e = plan(&huge, true, memory).unwrap_err().to_string();
        assert!(
            e.contains("the activations of one row would take")
                && e.contains("(4096 layers, hidden 131072, vocabulary 8388608)"),
            "{e}"
        );
    }
    // The same shape with short rows: the weights alone pass the bound (4e15 parameters).
    let e = plan(
        &raw(&[&path, "rollout.max_new_tokens=1", "data.max_prompt_len=1"]),
        false,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("the weights and optimizer state would take"),
        "{e}"
    );
    // A released shape: 16M-token rows are refused, a million-token row still plans, and the
    // largest micro-batch search with a memory to fit stays in range.
    let qwen = format!(
        "model.path=\"{}\"",
        repo().join("configs/shapes/qwen2.5-1.5b").display()
    );
    let e = plan(
        &raw(&[&qwen, "rollout.max_new_tokens=16777216"]),
        false,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("the activations of one row"), "{e}");
    let p = plan(
        &raw(&[&qwen, "rollout.max_new_tokens=1000000"]),
        false,
        Some(1 << 50),
    )
    .unwrap();
    assert!(p.activations_per_row > 1 << 40, "{}", p.activations_per_row);
    assert!(p.max_micro_batch_rows.unwrap() < 1 << 24);
}

#[test]
fn a_multi_turn_episode_is_planned_as_one_row_of_its_turns_and_bridges() {
    // Issue 45: a row holds the episode (turns and bridges), so the plan of [env] with 3 turns of
    // 512 tokens and 64-token bridges is the single-turn plan of 3 × 512 + 2 × 64 = 1664 tokens.
    let env = [
        "env.builtin=\"retry\"",
        "env.max_turns=3",
        "env.max_observation_tokens=64",
    ];
    let multi = plan(&raw(&env), false, Some(80 << 30)).unwrap();
    assert_eq!(multi.completion_tokens, 1664);
    assert_eq!(multi.max_turns, Some(3));
    let single = plan(
        &raw(&["rollout.max_new_tokens=1664"]),
        false,
        Some(80 << 30),
    )
    .unwrap();
    assert_eq!(single.max_turns, None);
    let json = |p: &rlvr_train::config::plan::Plan| {
        let mut v = serde_json::to_value(p).unwrap();
        v.as_object_mut().unwrap().remove("max_turns");
        v
    };
    // Sampling differs: a later turn without a turn-cache entry prefills every row's whole
    // context (eager attention: [rows, heads, T, T] scores), not ⌈rows / K⌉ prompts.
    let training = |p: &rlvr_train::config::plan::Plan| {
        let mut v = json(p);
        for k in ["prefill_scores", "rollout_peak", "max_rollout_rows", "fits"] {
            v.as_object_mut().unwrap().remove(k);
        }
        v
    };
    assert_eq!(training(&multi), training(&single));
    assert_eq!(
        multi.prefill_scores,
        multi.kv_cache_rows * 14 * (512 + 1664) * (512 + 1664) * 10
    );
    assert_eq!(
        multi.rollout_peak - single.rollout_peak,
        multi.prefill_scores - single.prefill_scores
    );
    // The KV cache holds the last turn's whole context: prompt 512 + episode 1664 tokens.
    assert_eq!(
        multi.kv_cache,
        multi.kv_cache_rows * (512 + 1664) * 24 * 2 * 2 * 64 * 2
    );
    // env.max_episode_tokens, when set, is the row.
    let capped = plan(
        &raw(&[env[0], env[1], "env.max_episode_tokens=900"]),
        false,
        None,
    )
    .unwrap();
    assert_eq!(capped.completion_tokens, 900);
    // One turn: the single-turn plan.
    let one = plan(&raw(&[env[0], "env.max_turns=1"]), false, Some(80 << 30)).unwrap();
    let base = plan(&raw(&[]), false, Some(80 << 30)).unwrap();
    assert_eq!(json(&one), json(&base));
    let mut table = Vec::new();
    rlvr_train::config::plan::write_table(&multi, &mut table).unwrap();
    let table = String::from_utf8(table).unwrap();
    assert!(
        table.contains("rows of 512 prompt + 1664 completion tokens (episodes of up to 3 turns"),
        "{table}"
    );
}

/// `rlvr plan` knows the fused attention path (issue 44, item 7): with `kernels.attention = "on"`
/// on the GPU it plans, no `[heads, T, T]` scores and no gathered prompt keys and values are
/// counted; on the CPU, with `"off"`, and with `"auto"` before the kernel passed the GPU check,
/// the plan is the eager one.
#[test]
fn the_plan_counts_no_scores_under_fused_attention() {
    use rlvr_train::config::plan::AttentionPath;
    let eager = plan(&raw(&[]), false, Some(80 << 30)).unwrap();
    let fused = plan(&raw(&["kernels.attention=\"on\""]), false, Some(80 << 30)).unwrap();
    assert_eq!(
        eager.attention,
        AttentionPath::Eager,
        "auto is off until verified"
    );
    assert_eq!(fused.attention, AttentionPath::Fused);
    // Per 1024-token row of the 0.5B shape: 25 layers' worth + embedding and final norm, each
    // layer keeping 896·2 (o, bf16) + 14·4 (LSE) bytes per token instead of the scores.
    let layer = fused
        .shape
        .layer_bytes_per_token_with(2, 1024, AttentionPath::Fused);
    assert_eq!(fused.activations_per_row, 1024 * (25 * layer + 896 * 18));
    let eager_layer = eager.shape.layer_bytes_per_token(2, 1024);
    assert_eq!(
        eager_layer - layer,
        14 * 1024 * 26 + 2 * 1024 * 4 + 2 * 14 * 4 + 896 * 2 - 14 * 4,
        "the scores' bytes (14 heads × 1024 keys × 26 bytes in bf16), the mask row's and the row \
         maxima's leaf copies and gradients (f32), and p·v's copy, less the LSE"
    );
    // The shared prompt's micro-batch: no gathered copy of the prompt's keys and values.
    let per_position = 25 * layer + 896 * 18;
    assert_eq!(
        fused.activations_per_micro_batch,
        (512 + 4 * 512) * per_position
    );
    // 9.5 of the 11.2 GiB per row were the scores: the fused plan fits several times the rows.
    assert!(fused.activations_per_row * 4 < eager.activations_per_row);
    assert!(fused.max_micro_batch_rows.unwrap() > 4 * eager.max_micro_batch_rows.unwrap());
    for sets in [
        &["kernels.attention=\"on\"", "model.device=\"cpu\""][..],
        &["kernels.attention=\"off\""][..],
    ] {
        let p = plan(&raw(sets), false, Some(80 << 30)).unwrap();
        assert_eq!(p.attention, AttentionPath::Eager, "{sets:?}");
    }
    let mut table = Vec::new();
    rlvr_train::config::plan::write_table(&fused, &mut table).unwrap();
    let table = String::from_utf8(table).unwrap();
    assert!(
        table.contains("fused attention: no score tensors"),
        "{table}"
    );
    assert!(
        table.contains("prefill scores") && table.contains("none (fused attention)"),
        "{table}"
    );
}

/// The sampling peak counts the prefill's attention scores beside the KV cache: eager attention
/// materialises `[P, heads, L, L]` in f32 twice and once in bf16 for the wave's ⌈rows / K⌉
/// prompts (with `[env]`, every row's whole context); the fused attention none, and the largest
/// rollout batch grows accordingly.
#[test]
fn the_sampling_peak_counts_the_prefill_scores() {
    let eager = plan(&raw(&[]), false, Some(80 << 30)).unwrap();
    let fused = plan(&raw(&["kernels.attention=\"on\""]), false, Some(80 << 30)).unwrap();
    let prompts = eager.kv_cache_rows.div_ceil(eager.group_size);
    let l = eager.prompt_tokens;
    assert_eq!(eager.prefill_scores, prompts * 14 * l * l * 10);
    assert_eq!(fused.prefill_scores, 0);
    assert_eq!(
        eager.rollout_peak - fused.rollout_peak,
        eager.prefill_scores
    );
    assert!(fused.max_rollout_rows.unwrap() > eager.max_rollout_rows.unwrap());
    // At the largest rollout batch the eager sampling peak fits, one row more does not.
    let at = |rows: u64| {
        let r = raw(&[&format!("rollout.max_batch_rows={rows}")]);
        plan(&r, false, Some(80 << 30)).unwrap().rollout_peak
    };
    let most = eager.max_rollout_rows.unwrap();
    assert!(at(most) <= 80 << 30 && at(most + 1) > 80 << 30, "{most}");
    // Multi-turn: every row's context, prompt and episode, prefilled whole.
    let env = plan(
        &raw(&["env.builtin=\"retry\"", "env.max_turns=2"]),
        false,
        None,
    )
    .unwrap();
    let t = env.prompt_tokens + env.completion_tokens;
    assert_eq!(env.prefill_scores, env.kv_cache_rows * 14 * t * t * 10);
}

/// The shared prompt's key/value copies and the eager attention's leaf copies, for SmolLM2-135M's
/// shape (hidden 576, 9 heads of 64, 3 KV heads, MLP 1536, no bias) at docs/memory.md's GSM8K
/// rows (253 prompt + 16 completion tokens, f32), term by term by hand. The plan used to count
/// only the gathered copy of the prompt's keys and values (253 positions) and none of the leaf
/// copies; the measured peak was 11% above it (docs/memory.md, "Prompt length").
#[test]
fn shared_prompt_copies_match_a_hand_count_at_smollm2s_shape() {
    let c = ModelConfig::from_json(
        &serde_json::json!({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "max_position_embeddings": 8192,
            "tie_word_embeddings": true}),
        "inline".as_ref(),
    )
    .unwrap();
    let s = Shape::of(&c);
    assert_eq!((s.heads, s.kv_heads, s.head_dim), (9, 3, 64));
    // Per completion row and layer: the gathered prompt (253) and the joined keys (253 + 16),
    // each for k and v: 522 × 2 × 3 KV heads × 64 × 4 bytes.
    assert_eq!(
        s.shared_kv_bytes_per_row_layer(4, 253, 16),
        522 * 2 * 3 * 64 * 4
    );
    assert_eq!(s.shared_kv_bytes_per_row_layer(4, 253, 16), 801_792);
    // Per token and layer at T = 269, f32: norms 2·3·576·4 = 13824; q/k/v 960·4 = 3840; rotary
    // (11·576 + 13·192)·4/2 = 17664 + cos/sin leaf copies and gradients 8·64·4 = 2048; scores
    // 9·269·24 = 58104 + the mask row's copy and gradient 2·269·4 = 2152 + the row maxima's
    // 2·9·4 = 72; p·v and its copy 2·576·4 = 4608; o-proj and residual 4608; MLP 4·1536·4 +
    // 2·576·4 = 29184.
    assert_eq!(
        s.layer_bytes_per_token(4, 269),
        13824 + 3840 + (17664 + 2048) + (58104 + 2152 + 72) + 4608 + 4608 + 29184
    );
}
