//! Model files that would hang or poison a run are refused at load naming the file (issue 49,
//! item 12): rope scaling numbers 0, negative or not numbers in config.json, and a FIFO (or any
//! file that is not regular) in place of a weights file.

use rlvr_model::weights::WeightFiles;
use rlvr_model::ModelConfig;
use std::path::Path;
use std::time::Duration;

/// A small llama config.json with `rope_scaling` set to `scaling`.
fn llama_config(scaling: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2,
        "vocab_size": 256, "rope_theta": 500000.0, "rope_scaling": scaling,
    })
}

/// The error of reading `v` written as `dir/config.json`, and that path.
fn refused(dir: &Path, v: &serde_json::Value) -> (String, String) {
    let path = dir.join("config.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let e = ModelConfig::from_file(&path).unwrap_err().to_string();
    (e, path.display().to_string())
}

#[test]
fn rope_scaling_numbers_zero_negative_or_not_numbers_are_refused_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let llama3 = |factor: serde_json::Value| {
        serde_json::json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        })
    };
    let cases = [
        (llama3(0.into()), "rope_scaling.factor", "0"),
        (llama3((-8.0).into()), "rope_scaling.factor", "-8.0"),
        (llama3("8".into()), "rope_scaling.factor", "\"8\""),
        (
            serde_json::json!({"type": "linear", "factor": 0.0}),
            "rope_scaling.factor",
            "0.0",
        ),
    ];
    for (scaling, key, shown) in cases {
        let (e, path) = refused(dir.path(), &llama_config(scaling));
        assert!(
            e.starts_with(&format!(
                "{path}: field `{key}` = {shown} is out of range: expected a finite number > 0 \
                 (rope scaling divides"
            )),
            "{e}"
        );
    }
    // transformers-5 keeps it in `rope_parameters`: named so.
    let mut v = llama_config(serde_json::Value::Null);
    v.as_object_mut().unwrap().remove("rope_scaling");
    v["rope_parameters"] = serde_json::json!({"rope_type": "linear", "factor": -2});
    let (e, path) = refused(dir.path(), &v);
    assert!(
        e.starts_with(&format!(
            "{path}: field `rope_parameters.factor` = -2 is out of range"
        )),
        "{e}"
    );
    // llama3 divides by high_freq_factor - low_freq_factor.
    let mut s = llama3(8.into());
    s["high_freq_factor"] = 1.0.into();
    let (e, path) = refused(dir.path(), &llama_config(s));
    assert!(
        e.starts_with(&format!(
            "{path}: field `rope_scaling.high_freq_factor` = 1 must be greater than \
             `rope_scaling.low_freq_factor` = 1"
        )),
        "{e}"
    );
    // Llama 3.1's own values load.
    std::fs::write(
        dir.path().join("config.json"),
        llama_config(llama3(8.into())).to_string(),
    )
    .unwrap();
    let c = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
    assert_eq!(
        c.rope_scaling,
        Some(rlvr_model::RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        })
    );
}

/// Every size field of config.json is an integer from 1 to its bound in `MAX_SIZES`: 0 and past
/// the bound are refused naming the file, the field and the bound (absurd sizes made `rlvr plan`
/// overflow and a load try to allocate them); the bound itself and the released shapes load.
#[test]
fn sizes_zero_or_absurd_in_config_json_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(rlvr_model::config::MAX_SIZES.len(), 8);
    for &(key, max) in &rlvr_model::config::MAX_SIZES {
        for bad in [0u64, max as u64 + 1, u64::MAX] {
            let mut v = llama_config(serde_json::Value::Null);
            v[key] = bad.into();
            let (e, path) = refused(dir.path(), &v);
            assert!(
                e.contains(&path)
                    && e.contains(&format!("field `{key}` = {bad} is outside 1..={max}")),
                "{key} = {bad}: {e}"
            );
        }
    }
    // At the bound: accepted (the head counts kept consistent with the other fields).
    let mut v = llama_config(serde_json::Value::Null);
    v["vocab_size"] = (1u64 << 23).into();
    v["max_position_embeddings"] = (1u64 << 26).into();
    v["num_hidden_layers"] = (1u64 << 12).into();
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    let c = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
    assert_eq!(
        (c.vocab_size, c.max_position_embeddings, c.num_hidden_layers),
        (1 << 23, 1 << 26, 1 << 12)
    );
}

#[cfg(unix)]
#[test]
fn a_fifo_as_a_weights_file_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.safetensors");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    // Opening a FIFO with no writer blocks: run the load beside a deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(WeightFiles::open(&d).err().map(|e| e.to_string()));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("loading a FIFO hung")
        .expect("a FIFO loaded");
    assert_eq!(
        e,
        format!(
            "{}: is a FIFO (named pipe), not a regular file: rlvr reads model files from regular \
             files only",
            fifo.display()
        )
    );
    // config.json likewise.
    let cfg = dir.path().join("config.json");
    std::process::Command::new("mkfifo")
        .arg(&cfg)
        .status()
        .unwrap();
    let e = ModelConfig::from_file(&cfg).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{}: is a FIFO", cfg.display())),
        "{e}"
    );
}

/// Issue 49 item 12: the tokenizer's files were read without the weights' regular-file check, so
/// a FIFO named tokenizer.json, tokenizer_config.json or chat_template.jinja hung the load for
/// ever. Each is now refused at once, naming the file.
#[cfg(unix)]
#[test]
fn a_fifo_as_a_tokenizer_file_is_refused_not_waited_on() {
    let tok =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/qwen2.5/tokenizer.json");
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        let dir = tempfile::tempdir().unwrap();
        if name != "tokenizer.json" {
            std::fs::copy(&tok, dir.path().join("tokenizer.json")).unwrap();
        }
        let fifo = dir.path().join(name);
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let r = rlvr_model::TokenizerBundle::load(&d);
            let _ = tx.send(r.err().map(|e| e.to_string()));
        });
        let e = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("loading a FIFO {name} hung"))
            .unwrap_or_else(|| panic!("a FIFO {name} loaded"));
        assert!(
            e.starts_with(&format!(
                "{}: is a FIFO (named pipe), not a regular file",
                fifo.display()
            )),
            "{name}: {e}"
        );
    }
}

/// Qwen2.5's tokenizer.json (vendored) with its normalizer replaced by `normalizer`, loaded: the
/// error, or `None` when it loads.
fn with_normalizer(normalizer: serde_json::Value) -> Option<String> {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/qwen2.5/tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    tok["normalizer"] = normalizer;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, tok.to_string()).unwrap();
    rlvr_model::TokenizerBundle::read_tokenizer(&path)
        .err()
        .map(|e| e.to_string())
}

/// A tokenizer normalizer that grows text without bound is refused at load naming its setting
/// (issue 49, item 12: a `Replace` blow-up made rlvr try to allocate 16 TB on its first
/// prompt), by its settings and by a probe text; released normalizers load.
#[test]
fn a_normalizer_that_grows_text_without_bound_is_refused_at_load() {
    use serde_json::json;
    let replace = |pattern: serde_json::Value, content: &str| json!({"type": "Replace", "pattern": pattern, "content": content});
    // Released ones: Qwen2.5's NFC, SentencePiece-style (Llama 2, Gemma), none.
    for ok in [
        json!({"type": "NFC"}),
        json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u{2581}"},
            replace(json!({"String": " "}), "\u{2581}"),
        ]}),
        serde_json::Value::Null,
    ] {
        assert_eq!(with_normalizer(ok.clone()), None, "{ok}");
    }
    let kib = "x".repeat(2000);
    let doubling: Vec<_> = (0..10)
        .map(|_| replace(json!({"String": "a"}), "aa"))
        .collect();
    let empty_regex = |n: usize| replace(json!({"Regex": ""}), &"y".repeat(n));
    for (bad, says) in [
        (
            replace(json!({"String": "a"}), &kib),
            "normalizer (Replace): its replacement is 2000 bytes",
        ),
        (
            json!({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Prepend", "prepend": kib}]}),
            "normalizer.normalizers[1] (Prepend): its prefix is 2000 bytes",
        ),
        (
            replace(json!({"String": ""}), "z"),
            "normalizer (Replace): an empty pattern",
        ),
        (
            json!({"type": "Sequence", "normalizers": doubling}),
            "normalizer: its steps can make a text up to 1024 times as long",
        ),
        // Within the settings' bound (8 × 8), but an empty regex match inserts its replacement
        // between every two characters: the probe sees 81 times the text.
        (
            json!({"type": "Sequence", "normalizers": [empty_regex(8), empty_regex(8)]}),
            "its normalizer turns a",
        ),
    ] {
        let e = with_normalizer(bad.clone()).unwrap_or_else(|| panic!("{bad} loaded"));
        assert!(e.contains(says) && e.contains("tokenizer.json"), "{e}");
    }
}

/// The streamed checkpoint writer produces the bytes of the safetensors crate's own
/// `serialize` (the reference implementation): every supported dtype, a transposed (strided) and
/// a narrowed (offset) tensor, names that need JSON escaping; the file reads back equal.
#[test]
fn streamed_safetensors_are_the_bytes_of_safetensors_serialize() {
    use candle_core::{DType, Device, Tensor};
    let dev = Device::Cpu;
    let base = Tensor::arange(0f32, 24.0, &dev)
        .unwrap()
        .reshape((4, 6))
        .unwrap();
    let tensors: Vec<(String, Tensor)> = vec![
        ("z.f32".into(), base.clone()),
        ("a.transposed".into(), base.t().unwrap()),
        ("m.narrowed".into(), base.narrow(0, 1, 2).unwrap()),
        ("b.bf16".into(), base.to_dtype(DType::BF16).unwrap()),
        (
            "c.f16 \"quoted\" é".into(),
            base.to_dtype(DType::F16).unwrap(),
        ),
        ("d.f64".into(), base.to_dtype(DType::F64).unwrap()),
        ("e.u8".into(), base.to_dtype(DType::U8).unwrap()),
        ("f.u32".into(), base.to_dtype(DType::U32).unwrap()),
        ("g.i64".into(), base.to_dtype(DType::I64).unwrap()),
        ("h.scalar".into(), Tensor::new(7f32, &dev).unwrap()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    rlvr_model::weights::write_safetensors(&path, &tensors).unwrap();
    let written = std::fs::read(&path).unwrap();
    let reference = rlvr_model::weights::safetensors_bytes(&tensors).unwrap();
    assert_eq!(written.len(), reference.len());
    assert!(
        written == reference,
        "the streamed file differs from safetensors::serialize"
    );
    let back = candle_core::safetensors::load(&path, &dev).unwrap();
    for (name, t) in &tensors {
        let b = &back[name];
        assert_eq!((b.dims(), b.dtype()), (t.dims(), t.dtype()), "{name}");
        let diff = (b.to_dtype(DType::F64).unwrap() - t.to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(diff, 0.0, "{name}");
    }
    // Only the file itself is left (no temporary).
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
