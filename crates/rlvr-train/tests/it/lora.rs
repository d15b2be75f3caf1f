//! LoRA runs (`model.lora_rank` ≥ 1) on a tiny random model: at staleness 0 the explorer's ℓ_old
//! equals the trainer's ℓ (ratio 1); checkpoints hold PEFT's adapter files and no base weights;
//! the KL reference is the base with the adapters off; a stopped and resumed run ends with the
//! same adapters as an uninterrupted one; `rlvr merge` writes a full model with the same
//! log-probs; invalid keys are refused by name.

use crate::common;

use std::path::Path;

use candle_core::{DType, Device};
use rlvr_model::Model;
use rlvr_train::config::{RawConfig, ResolvedConfig};
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::read_metrics;

fn sets(model: &Path, run: &Path, extra: &[&str]) -> Vec<String> {
    let mut s = common::arithmetic_sets(model, run);
    s.extend(["model.lora_rank=4".to_string(), "train.lr=2e-2".into()]);
    s.extend(extra.iter().map(|x| x.to_string()));
    s
}

fn logprobs(m: &Model) -> Vec<f32> {
    let ids = vec![vec![1u32, 5, 7, 3, 9, 2], vec![4, 8, 6, 10, 12, 1]];
    let mask = vec![vec![1u32; 6]; 2];
    let out = m.token_logprobs(&ids, &mask, 0, 1.0, false, false).unwrap();
    out.logprobs.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn lora_run_is_on_policy_and_checkpoints_peft_adapters() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let rd = tmp.path().join("run");
    let s = sets(
        &model,
        &rd,
        &[
            "train.steps=3",
            "train.save_every=3",
            "train.skip_zero_gradient_rows=false",
            // A gradient even where every reward of a group is equal (a fresh model's usual case).
            "algorithm.entropy_coef=0.05",
            "algorithm.exclude_zero_std=false",
        ],
    );
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    assert_eq!(cfg.raw.model.lora_alpha, Some(8.0), "α defaults to 2r");
    train(&cfg, &RunOptions::default()).unwrap();
    let m = read_metrics(&rd.join("metrics.jsonl")).unwrap();
    for l in &m[1..] {
        if let Some(r) = l["ratio/mean"].as_f64() {
            assert!((r - 1.0).abs() < 1e-4, "ratio/mean at staleness 0 = {r}");
        }
    }
    let diag = std::fs::read_to_string(rd.join("diagnostics.jsonl")).unwrap();
    for line in diag.lines() {
        let d: serde_json::Value = serde_json::from_str(line).unwrap();
        let x = d["logprob_diff/staleness0"].as_f64().unwrap();
        assert!(x < 1e-4, "|ℓ_old − ℓ| at staleness 0 = {x}");
    }
    let ck = rd.join("checkpoints/step-3");
    assert!(ck.join("adapter/adapter_config.json").is_file());
    assert!(ck.join("adapter/adapter_model.safetensors").is_file());
    assert!(
        !ck.join("model.safetensors").exists(),
        "the frozen base is not copied"
    );
    // The checkpoint loads as base + adapter; the base is unchanged and the adapters moved.
    let base = Model::load(&model, DType::F32, &Device::Cpu).unwrap();
    let trained = Model::load(&ck, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(trained.lora_config().unwrap().rank, 4);
    for ((n, a), (_, b)) in base.base_vars().iter().zip(trained.base_vars()) {
        let (a, b) = (a.as_tensor(), b.as_tensor());
        let d: f32 = (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(d, 0.0, "{n} changed");
    }
    assert_eq!(logprobs(&trained.without_adapters()), logprobs(&base));
    let bsum: f32 = trained
        .named_vars()
        .iter()
        .filter(|(n, _)| n.contains("lora_B"))
        .map(|(_, v)| {
            v.as_tensor()
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        })
        .sum();
    let gn: Vec<_> = m.iter().map(|l| l["grad_norm"].clone()).collect();
    assert!(bsum > 0.0, "B moved: {bsum}; grad norms {gn:?}");
    assert_ne!(
        logprobs(&trained),
        logprobs(&base),
        "the adapters learned nothing"
    );
    // trainer_state holds one (m, v) pair per adapter tensor and no masters.
    let opt = candle_core::safetensors::load(
        ck.join("trainer_state/optimizer.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    assert_eq!(opt.len(), 2 * trained.named_vars().len());
    assert!(opt.keys().all(|k| !k.starts_with("w.")));

    // rlvr merge: a full model with the same log-probs (merged in f32).
    let out = tmp.path().join("merged");
    let mut buf = Vec::new();
    let args = rlvr_train::lora::MergeArgs {
        checkpoint: ck.clone(),
        out: out.clone(),
        force: false,
    };
    rlvr_train::lora::run_merge(&args, &mut buf).unwrap();
    let merged = Model::load(&out, DType::F32, &Device::Cpu).unwrap();
    assert!(merged.lora_config().is_none());
    for (a, b) in logprobs(&merged).iter().zip(logprobs(&trained)) {
        assert!((a - b).abs() < 1e-5, "merged {a} vs adapted {b}");
    }
    assert!(out.join("tokenizer.json").is_file());
    // A second merge into the now non-empty --out is refused without --force.
    let e = rlvr_train::lora::run_merge(&args, &mut buf)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--force"), "{e}");
    // Merging into the adapter's base model is refused even with --force, and the base's
    // weights are left as they were.
    let before = std::fs::read(model.join("model.safetensors")).unwrap();
    let e = rlvr_train::lora::run_merge(
        &rlvr_train::lora::MergeArgs {
            checkpoint: ck.clone(),
            out: model.clone(),
            force: true,
        },
        &mut buf,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("is the adapter's base model"), "{e}");
    assert!(e.contains("base_model_name_or_path"), "{e}");
    assert_eq!(
        std::fs::read(model.join("model.safetensors")).unwrap(),
        before
    );
}

#[test]
fn lora_kl_reference_is_the_base_and_resume_is_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 4);
    let extra = [
        "train.steps=4",
        "train.save_every=2",
        "algorithm.kl_coef=0.1",
        "algorithm.exclude_zero_std=false",
    ];
    let ra = tmp.path().join("a");
    let cfg = RawConfig::load(None, &sets(&model, &ra, &extra))
        .unwrap()
        .resolve()
        .unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let m = read_metrics(&ra.join("metrics.jsonl")).unwrap();
    let kl: Vec<f64> = m.iter().map(|l| l["kl_ref"].as_f64().unwrap()).collect();
    assert!(kl[0].abs() < 1e-6, "{kl:?}");
    assert!(kl[3] > 1e-7, "{kl:?}");

    // Stopped after step 1 and resumed: the same adapters at step 4.
    let rb = tmp.path().join("b");
    let cfg = RawConfig::load(None, &sets(&model, &rb, &extra))
        .unwrap()
        .resolve()
        .unwrap();
    let opts = RunOptions::default();
    opts.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(train(&cfg, &opts).unwrap().steps, 1);
    let cfg = ResolvedConfig::from_run_dir(&rb, &[]).unwrap();
    let resumed = RunOptions {
        resume: true,
        ..Default::default()
    };
    assert_eq!(train(&cfg, &resumed).unwrap().steps, 4);
    let a = Model::load(&ra.join("checkpoints/step-4"), DType::F32, &Device::Cpu).unwrap();
    let b = Model::load(&rb.join("checkpoints/step-4"), DType::F32, &Device::Cpu).unwrap();
    for ((n, x), (_, y)) in a.named_vars().iter().zip(b.named_vars()) {
        let x: Vec<f32> = x.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let y: Vec<f32> = y.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(x, y, "{n} differs after resume");
    }
}

/// With `model.lora_dropout` > 0 a stopped and resumed run draws the dropout masks an
/// uninterrupted one draws (the stream position is in trainer_state), so it ends with the same
/// adapters; and the masks are really drawn (a run without dropout ends elsewhere).
#[test]
fn lora_dropout_resume_is_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 4);
    let run = |name: &str, dropout: &str, stop_after_one: bool| {
        let dir = tmp.path().join(name);
        // Every row goes through a training forward (and the KL term gives a gradient even when
        // all rewards of a group agree), so each step draws masks.
        let extra = [
            "train.steps=3",
            "train.save_every=1",
            "train.skip_zero_gradient_rows=false",
            "algorithm.kl_coef=0.1",
            dropout,
        ];
        let cfg = RawConfig::load(None, &sets(&model, &dir, &extra))
            .unwrap()
            .resolve()
            .unwrap();
        if stop_after_one {
            let opts = RunOptions::default();
            opts.stop.store(true, std::sync::atomic::Ordering::SeqCst);
            assert_eq!(train(&cfg, &opts).unwrap().steps, 1);
            let cfg = ResolvedConfig::from_run_dir(&dir, &[]).unwrap();
            let resumed = RunOptions {
                resume: true,
                ..Default::default()
            };
            assert_eq!(train(&cfg, &resumed).unwrap().steps, 3);
        } else {
            assert_eq!(train(&cfg, &RunOptions::default()).unwrap().steps, 3);
        }
        let m = Model::load(&dir.join("checkpoints/step-3"), DType::F32, &Device::Cpu).unwrap();
        let vars: Vec<Vec<f32>> = m
            .named_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
            .collect();
        (dir, vars)
    };
    let (da, a) = run("a", "model.lora_dropout=0.25", false);
    let (_, b) = run("b", "model.lora_dropout=0.25", true);
    let (_, c) = run("c", "model.lora_dropout=0.0", false);
    assert!(a == b, "adapters differ after a resume with LoRA dropout");
    assert!(a != c, "LoRA dropout changed nothing");
    let st: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(da.join("checkpoints/step-3/trainer_state/state.json")).unwrap(),
    )
    .unwrap();
    // The round: one per optimizer update (the file's key is the format's older name).
    assert_eq!(st["lora_dropout_draws"], st["optimizer_step"], "{st}");
    assert!(st["lora_dropout_draws"].as_u64().unwrap() >= 3, "{st}");
}

#[test]
fn invalid_lora_keys_are_refused_by_name() {
    let base = ["model.path=\"m\"".to_string()];
    for (set, key) in [
        ("model.lora_dropout=1.0", "model.lora_dropout"),
        ("model.lora_alpha=-1.0", "model.lora_alpha"),
        ("model.lora_targets=[]", "model.lora_targets"),
        ("model.lora_targets=[\"q\",\"q\"]", "model.lora_targets"),
    ] {
        let mut s = base.to_vec();
        s.extend(["model.lora_rank=8".to_string(), set.to_string()]);
        let e = RawConfig::load(None, &s)
            .and_then(|c| c.resolve())
            .map(|_| ())
            .unwrap_err();
        assert!(format!("{e:#}").contains(key), "{set}: {e:#}");
    }
    let mut s = base.to_vec();
    s.push("model.lora_targets=[\"fc1\"]".into());
    let e = RawConfig::load(None, &s).map(|_| ()).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("lora_targets") && e.contains("valid: q, k, v"),
        "{e}"
    );
    // all-linear is every projection: not beside others.
    let mut s = base.to_vec();
    s.extend([
        "model.lora_rank=8".to_string(),
        "model.lora_targets=[\"all-linear\",\"q\"]".into(),
    ]);
    let e = RawConfig::load(None, &s)
        .and_then(|c| c.resolve())
        .map(|_| ())
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("model.lora_targets: all-linear stands alone"),
        "{e:#}"
    );
    // α without a rank: LoRA is off, so the key would do nothing.
    let mut s = base.to_vec();
    s.push("model.lora_alpha=16".into());
    let e = RawConfig::load(None, &s).unwrap().resolve().unwrap_err();
    assert!(format!("{e:#}").contains("model.lora_rank"), "{e:#}");
}

/// peft's `target_modules="all-linear"` is accepted as it is written there (every projection of
/// the architecture, the default), and as the one-item list the resolved config writes; a single
/// other string, or "all-linear" beside other names, is refused saying what to write. It was refused with serde's "invalid type: string \"all-linear\", expected a sequence".
#[test]
fn lora_targets_take_pefts_all_linear() {
    let load = |set: &str| {
        let s = [
            "model.path=\"m\"".to_string(),
            "model.lora_rank=8".into(),
            set.to_string(),
        ];
        RawConfig::load(None, &s).and_then(|c| c.resolve())
    };
    let all = load("model.lora_targets=\"all-linear\"").unwrap();
    assert_eq!(
        all.raw.model.lora_targets,
        [rlvr_model::LoraTarget::AllLinear]
    );
    let listed = load("model.lora_targets=[\"all-linear\"]").unwrap();
    assert_eq!(listed.raw.model.lora_targets, all.raw.model.lora_targets);
    let two = load("model.lora_targets=[\"q_proj\", \"v\"]").unwrap();
    assert_eq!(
        two.raw.model.lora_targets,
        [rlvr_model::LoraTarget::Q, rlvr_model::LoraTarget::V]
    );
    let e = format!(
        "{:#}",
        load("model.lora_targets=\"q_proj\"")
            .map(|_| ())
            .unwrap_err()
    );
    assert!(
        e.contains("model.lora_targets") && e.contains("write a list, e.g. [\"q_proj\"]"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        load("model.lora_targets=[\"all-linear\", \"q\"]")
            .map(|_| ())
            .unwrap_err()
    );
    assert!(
        e.contains("model.lora_targets") && e.contains("stands alone"),
        "{e}"
    );
    // The resolved config writes the one-item list, which reads back the same.
    let text = toml::to_string(&all.raw).unwrap();
    assert!(text.contains("lora_targets = [\"all-linear\"]"), "{text}");
}

/// A full fine-tuning run resumed with `--set model.lora_rank=4`: the checkpoint's optimizer
/// state (one pair of moments per full weight) does not fit the adapters; the error names the
/// optimizer file and the keys that change the trained parameters, not only the counts.
#[test]
fn resuming_with_another_lora_rank_names_the_optimizer_file_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 4);
    let mut s = common::arithmetic_sets(&model, &tmp.path().join("run"));
    s.extend(["train.steps=1".to_string(), "train.eval_every=0".into()]);
    let rd = tmp.path().join("run");
    let cfg = RawConfig::load(None, &s).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let mut cfg =
        ResolvedConfig::from_run_dir(&rd, &["model.lora_rank=4".into(), "train.steps=2".into()])
            .unwrap();
    cfg.raw.output.dir = rd.clone();
    let e = format!(
        "{:#}",
        train(
            &cfg,
            &RunOptions {
                resume: true,
                ..Default::default()
            }
        )
        .unwrap_err()
    );
    let file = rd.join("checkpoints/step-1/trainer_state/optimizer.safetensors");
    assert!(e.contains(&format!("restoring {}", file.display())), "{e}");
    assert!(e.contains("model.lora_rank"), "{e}");
}

/// On a phi3 model `all-linear` (the default) adapts the checkpoint's four modules (the fused
/// `qkv_proj` and `gate_up_proj`), and a split projection is refused naming
/// `model.lora_targets`, the fused module and phi3's valid names.
#[test]
fn phi3_lora_targets_are_resolved_and_checked_by_name() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../rlvr-model/tests/fixtures/phi3_longrope_partial");
    let load = || {
        rlvr_model::Model::load(&dir, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap()
    };
    let cfg = |targets: Vec<rlvr_model::LoraTarget>| rlvr_model::LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets,
        dropout: 0.0,
    };
    use rlvr_model::LoraTarget as T;
    let mut m = load();
    rlvr_train::lora::attach(&mut m, Some(cfg(vec![T::AllLinear])), &dir, 0).unwrap();
    assert_eq!(
        m.lora_config().unwrap().targets,
        [T::Qkv, T::O, T::GateUp, T::Down]
    );
    // Resuming with the same setting (the adapter lists the four modules) is accepted.
    rlvr_train::lora::attach(&mut m, Some(cfg(vec![T::AllLinear])), &dir, 0).unwrap();
    let mut m = load();
    let e = rlvr_train::lora::attach(&mut m, Some(cfg(vec![T::Q, T::O])), &dir, 0).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("model.lora_targets")
            && e.contains("`q_proj`")
            && e.contains("qkv_proj, o_proj, gate_up_proj, down_proj"),
        "{e}"
    );
}
