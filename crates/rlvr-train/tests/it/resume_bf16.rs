//! A bf16 run (f32 master weights in the optimizer) resumed from a checkpoint ends with the same
//! bf16 weights, f32 masters and non-time metrics as the uninterrupted run: the checkpoint's
//! weights are bf16 (the dtype asked for) and `trainer_state/optimizer.safetensors` holds the
//! masters (`w.NNNNN`) beside the moments.

use crate::common;

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rlvr_train::config::{RawConfig, ResolvedConfig};
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::metrics::{read_metrics, TIME_KEYS};

fn sets(model: &Path, run: &Path) -> Vec<String> {
    let mut s = common::arithmetic_sets(model, run);
    s.extend([
        "model.dtype=\"bf16\"".to_string(),
        "train.steps=4".into(),
        "train.save_every=2".into(),
        "train.keep_last=0".into(),
        "train.lr=1e-3".into(),
    ]);
    s
}

fn tensors(path: &Path) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap()
        .into_iter()
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn bits(t: &Tensor) -> Vec<f32> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn bf16_resume_equals_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 1);
    let ra = tmp.path().join("a");
    let cfg = RawConfig::load(None, &sets(&model, &ra))
        .unwrap()
        .resolve()
        .unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let a4 = ra.join("checkpoints/step-4");
    // The checkpoint keeps the dtype asked for, and the masters.
    let weights = tensors(&a4.join("model.safetensors"));
    assert!(weights.iter().all(|(_, t)| t.dtype() == DType::BF16));
    let opt = tensors(&a4.join("trainer_state/optimizer.safetensors"));
    let masters: Vec<&(String, Tensor)> = opt.iter().filter(|(k, _)| k.starts_with("w.")).collect();
    assert_eq!(masters.len(), weights.len(), "one master per weight");
    assert!(masters.iter().all(|(_, t)| t.dtype() == DType::F32));

    // Run b: a copy of run a cut back to its step-2 checkpoint, then resumed.
    let rb = tmp.path().join("b");
    copy_dir(&ra, &rb);
    std::fs::remove_dir_all(rb.join("checkpoints/step-4")).unwrap();
    std::fs::write(rb.join("checkpoints/latest"), "step-2\n").unwrap();
    let mut cfg = ResolvedConfig::from_run_dir(&rb, &[]).unwrap();
    cfg.raw.output.dir = rb.clone();
    let s = train(
        &cfg,
        &RunOptions {
            resume: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.steps, 4);
    let b4 = rb.join("checkpoints/step-4");
    for file in ["model.safetensors", "trainer_state/optimizer.safetensors"] {
        let (ta, tb) = (tensors(&a4.join(file)), tensors(&b4.join(file)));
        assert_eq!(ta.len(), tb.len(), "{file}");
        for ((ka, xa), (kb, xb)) in ta.iter().zip(&tb) {
            assert_eq!(ka, kb);
            assert_eq!(bits(xa), bits(xb), "{file}: {ka}");
        }
    }
    // The weights moved between step 2 and step 4 (the comparison is not vacuous).
    let a2 = tensors(&ra.join("checkpoints/step-2/model.safetensors"));
    let a4w = tensors(&a4.join("model.safetensors"));
    assert!(a2.iter().zip(&a4w).any(|(x, y)| bits(&x.1) != bits(&y.1)));
    let (ma, mb) = (
        read_metrics(&ra.join("metrics.jsonl")).unwrap(),
        read_metrics(&rb.join("metrics.jsonl")).unwrap(),
    );
    assert_eq!(ma.len(), mb.len());
    for (la, lb) in ma.iter().zip(&mb) {
        for (k, va) in la {
            if !TIME_KEYS.contains(&k.as_str()) {
                assert_eq!(va, &lb[k], "step {}: {k}", la["step"]);
            }
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}
