//! Long-context model coverage against transformers: YaRN and dynamic NTK rope, sliding-window
//! attention (Qwen2's `max_window_layers`, Mistral's every-layer window) and `model_type`
//! mistral, on the tiny fixtures `scripts/make_model_fixtures.py` builds (`qwen2_yarn_window`,
//! `mistral_window`, `llama_dynamic_rope`; and Gemma's windows, `gemma2_softcap`,
//! `gemma3_local_global`, whose own parity tests are in `gemma.rs`): per-token log-probs, entropies and logits within the
//! parity bound of `parity.rs`, greedy generation with the KV cache equal to transformers'
//! `generate` past the window (and, for dynamic rope, past `max_position_embeddings`), and
//! config.json errors that name the file and the field.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlvr_model::{KvCache, Model, ModelConfig, RopeScaling};
use serde::Deserialize;

const FIXTURES: [&str; 5] = [
    "qwen2_yarn_window",
    "mistral_window",
    "llama_dynamic_rope",
    "gemma2_softcap",
    "gemma3_local_global",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[derive(Deserialize)]
struct Greedy {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    full_forward_argmax: Vec<u32>,
}

#[derive(Deserialize)]
struct Expected {
    greedy: Greedy,
    rope_inv_freq: Vec<f64>,
}

fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn qwen2_with_yarn_and_a_sliding_window_on_some_layers_matches_transformers() {
    let worst = crate::parity::check("qwen2_yarn_window", DType::F32, 1e-4);
    eprintln!("qwen2 yarn window worst abs err {worst:e}");
}

#[test]
fn mistral_with_a_sliding_window_matches_transformers() {
    let worst = crate::parity::check("mistral_window", DType::F32, 1e-4);
    eprintln!("mistral worst abs err {worst:e}");
}

#[test]
fn dynamic_rope_matches_transformers_within_and_past_max_position_embeddings() {
    // The 40-token case reaches position 39 with max_position_embeddings 32.
    let worst = crate::parity::check("llama_dynamic_rope", DType::F32, 1e-4);
    eprintln!("dynamic rope worst abs err {worst:e}");
}

#[test]
fn bf16_compute_of_a_window_model_is_close_to_transformers() {
    crate::parity::check("qwen2_yarn_window", DType::BF16, 0.25);
}

#[test]
fn configs_read_as_transformers_reads_them() {
    for name in FIXTURES {
        let dir = fixture(name);
        let v5 = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let v4 = ModelConfig::from_file(&dir.join("config.v4.json")).unwrap();
        let (mut a, mut b) = (v5.clone(), v4.clone());
        a.stored_dtype = None;
        b.stored_dtype = None;
        assert_eq!(a, b, "{name}: the v4 and v5 configs differ");
        // Inverse frequencies (of a forward within max_position_embeddings).
        let want = expected(name).rope_inv_freq;
        let ours = v5.rope_inv_freq();
        assert_eq!(ours.len(), want.len());
        for (o, w) in ours.iter().zip(&want) {
            assert!((o - w).abs() <= 1e-9 * w.abs(), "{name}: {o} vs {w}");
        }
    }
    let q = ModelConfig::from_file(&fixture("qwen2_yarn_window").join("config.json")).unwrap();
    let w = q.sliding_window.as_ref().unwrap();
    assert_eq!((w.size, w.layers.clone()), (6, vec![false, true, true]));
    match q.rope_scaling {
        Some(RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            mscale,
            mscale_all_dim,
            truncate,
        }) => {
            assert_eq!(
                (
                    factor,
                    original_max_position_embeddings,
                    beta_fast,
                    beta_slow
                ),
                (4.0, 32.0, 32.0, 1.0)
            );
            assert_eq!((attention_factor, mscale, mscale_all_dim), (None, 0.0, 0.0));
            assert!((q.rope_attention_factor() - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
            assert!(truncate);
        }
        ref other => panic!("{other:?}"),
    }
    let m = ModelConfig::from_file(&fixture("mistral_window").join("config.json")).unwrap();
    assert_eq!(m.arch, rlvr_model::Arch::Mistral);
    assert_eq!(m.sliding_window.as_ref().unwrap().layers, vec![true; 2]);
    assert!(!m.tie_word_embeddings && !m.qkv_bias && !m.o_bias);
    assert_eq!(m.head_dim, 16);
    let d = ModelConfig::from_file(&fixture("llama_dynamic_rope").join("config.json")).unwrap();
    assert_eq!(d.rope_scaling, Some(RopeScaling::Dynamic { factor: 2.0 }));
    // Past max_position_embeddings the base grows: theta·(2·40/32 − 1)^(16/14).
    let grown = d.rope_inv_freq_for(40);
    let theta = 10000.0 * (2.0f64 * 40.0 / 32.0 - 1.0).powf(16.0 / 14.0);
    assert!((grown[1] - 1.0 / theta.powf(2.0 / 16.0)).abs() < 1e-15);
    assert_eq!(d.rope_inv_freq_for(32), d.rope_inv_freq());
}

/// Greedy decoding through `forward_cached` (prefill, then one token a step against the cache).
fn greedy_cached(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = KvCache::new(model.config().num_hidden_layers);
    let (mut out, mut ids) = (vec![], vec![prompt.to_vec()]);
    let mut pos = vec![(0..prompt.len() as u32).collect::<Vec<_>>()];
    for _ in 0..n {
        let mask = vec![vec![1u32; cache.len() + ids[0].len()]];
        let logits: Vec<f32> = model
            .forward_cached(&ids, &pos, &mask, &mut cache)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        let next = argmax(&logits);
        out.push(next);
        pos = vec![vec![(prompt.len() + out.len() - 1) as u32]];
        ids = vec![vec![next]];
    }
    out
}

/// Greedy decoding by full forwards of the whole sequence (no cache), one token a step.
fn greedy_full(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let ids = candle_core::Tensor::new(seq.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let pos: Vec<u32> = (0..seq.len() as u32).collect();
        let bias = model
            .attention_bias(&[vec![1; seq.len()]], 0, seq.len())
            .unwrap();
        let h = model.forward(&ids, &pos, &bias, None, false).unwrap();
        let last = h.narrow(1, seq.len() - 1, 1).unwrap().squeeze(1).unwrap();
        let logits: Vec<f32> = model
            .lm_head(&last, false)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        seq.push(argmax(&logits));
    }
    seq[prompt.len()..].to_vec()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn greedy_generation_with_the_kv_cache_equals_transformers_generate() {
    for name in FIXTURES {
        let model = Model::load(&fixture(name), DType::F32, &Device::Cpu).unwrap();
        let g = expected(name).greedy;
        let n = g.tokens.len();
        let cached = greedy_cached(&model, &g.prompt, n);
        assert_eq!(cached, g.tokens, "{name}: cached greedy vs transformers");
        let full = greedy_full(&model, &g.prompt, n);
        assert_eq!(full, g.full_forward_argmax, "{name}: full-forward argmax");
        let window = model.config().sliding_window.as_ref().map(|w| w.size);
        if let Some(w) = window {
            // Past the window, and the cache agrees with the full forward.
            assert!(g.prompt.len() + n > 3 * w, "{name}");
            assert_eq!(cached, full, "{name}");
        }
    }
    // Dynamic rope: transformers' cached keys keep the base of the step that wrote them, so
    // generation and the full forward part past max_position_embeddings (32) — both matched.
    let g = expected("llama_dynamic_rope").greedy;
    let first_gap = (g.tokens.iter().zip(&g.full_forward_argmax)).position(|(a, b)| a != b);
    assert!(
        first_gap.is_some_and(|i| g.prompt.len() + i > 32),
        "{first_gap:?}"
    );
}

/// A copy of fixture `name` whose config.json is changed by `edit`.
fn edited(name: &str, edit: impl Fn(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture(name)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let path = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
    dir
}

fn logprobs(model: &Model, ids: &[u32]) -> Vec<f32> {
    model
        .token_logprobs(&[ids.to_vec()], &[vec![1; ids.len()]], 0, 1.0, false, false)
        .unwrap()
        .logprobs
        .to_vec2::<f32>()
        .unwrap()
        .remove(0)
}

fn max_gap(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The parity tests can fail: the window and YaRN each move the log-probs of a 30-token row,
/// the window only past its length.
#[test]
fn the_window_and_yarn_each_change_the_values() {
    let ids: Vec<u32> = (0..30).map(|i| (i * 53 + 7) % 500 + 3).collect();
    let with = Model::load(&fixture("qwen2_yarn_window"), DType::F32, &Device::Cpu).unwrap();
    let base = logprobs(&with, &ids);
    let no_window = edited("qwen2_yarn_window", |v| {
        v["use_sliding_window"] = false.into()
    });
    let full = logprobs(
        &Model::load(no_window.path(), DType::F32, &Device::Cpu).unwrap(),
        &ids,
    );
    // Positions 0..5 see at most 6 keys: the window hides nothing there.
    assert!(max_gap(&base[..5], &full[..5]) < 1e-6);
    assert!(max_gap(&base, &full) > 1e-2, "{}", max_gap(&base, &full));
    let no_yarn =
        edited(
            "qwen2_yarn_window",
            |v| {
                v["rope_parameters"] =
                    serde_json::json!({"rope_type": "default", "rope_theta": 10000.0})
            },
        );
    let plain = logprobs(
        &Model::load(no_yarn.path(), DType::F32, &Device::Cpu).unwrap(),
        &ids,
    );
    assert!(max_gap(&base, &plain) > 1e-2);
    // Mistral's window: absent from config.json means 4096 (MistralConfig), null means none.
    let absent = edited("mistral_window", |v| {
        v.as_object_mut().unwrap().remove("sliding_window");
    });
    let c = ModelConfig::from_file(&absent.path().join("config.json")).unwrap();
    assert_eq!(c.sliding_window.unwrap().size, 4096);
    let null = edited("mistral_window", |v| {
        v["sliding_window"] = serde_json::Value::Null
    });
    let c = ModelConfig::from_file(&null.path().join("config.json")).unwrap();
    assert!(c.sliding_window.is_none());
}

/// A checkpoint of a window or YaRN model writes a config.json that reads back the same (the
/// saved config is the loaded one with its dtype changed; a random model's is `to_json`'s).
#[test]
fn saved_configs_read_back_the_same() {
    for name in FIXTURES {
        let model = Model::load(&fixture(name), DType::F32, &Device::Cpu).unwrap();
        let cfg = model.config().clone();
        let from_json = ModelConfig::from_json(&cfg.to_json(), Path::new("config.json")).unwrap();
        let mut want = cfg.clone();
        want.stored_dtype = Some("float32".into());
        assert_eq!(from_json, want, "{name}");
        let dir = tempfile::tempdir().unwrap();
        model.save(dir.path(), DType::F32).unwrap();
        let back = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
        assert_eq!(back, want, "{name}");
    }
}

/// The error of reading `v` written as `dir/config.json`, and that path.
fn refused(dir: &Path, v: &serde_json::Value) -> (String, String) {
    let path = dir.join("config.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let e = ModelConfig::from_file(&path).unwrap_err().to_string();
    (e, path.display().to_string())
}

fn qwen2(extra: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::json!({
        "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2,
        "vocab_size": 256, "max_position_embeddings": 128,
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn window_and_rope_fields_out_of_range_are_refused_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let yarn = |extra: serde_json::Value| {
        let mut s = serde_json::json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32});
        for (k, x) in extra.as_object().unwrap() {
            s[k] = x.clone();
        }
        qwen2(serde_json::json!({"rope_scaling": s}))
    };
    let window = |extra: serde_json::Value| {
        let mut e = serde_json::json!({"use_sliding_window": true, "sliding_window": 8});
        for (k, x) in extra.as_object().unwrap() {
            e[k] = x.clone();
        }
        qwen2(e)
    };
    let cases = [
        (
            yarn(serde_json::json!({"factor": 0})),
            "field `rope_scaling.factor` = 0 is out of range",
        ),
        (
            yarn(serde_json::json!({"factor": null})),
            "rope scaling \"yarn\" needs the field `factor`",
        ),
        (
            yarn(serde_json::json!({"original_max_position_embeddings": -1})),
            "field `rope_scaling.original_max_position_embeddings` = -1 is out of range",
        ),
        (
            yarn(serde_json::json!({"beta_fast": 0})),
            "field `rope_scaling.beta_fast` = 0 is out of range",
        ),
        (
            yarn(serde_json::json!({"beta_slow": -1.5})),
            "field `rope_scaling.beta_slow` = -1.5 is out of range",
        ),
        (
            yarn(serde_json::json!({"beta_fast": 2, "beta_slow": 4})),
            "field `rope_scaling.beta_fast` = 2 must be greater than `rope_scaling.beta_slow` = 4",
        ),
        (
            yarn(serde_json::json!({"attention_factor": 0.0})),
            "field `rope_scaling.attention_factor` = 0.0 is out of range",
        ),
        (
            yarn(serde_json::json!({"mscale": -1})),
            "field `rope_scaling.mscale` = -1 is out of range",
        ),
        (
            yarn(serde_json::json!({"truncate": "yes"})),
            "field `rope_scaling.truncate` = \"yes\" is not a boolean",
        ),
        (
            qwen2(serde_json::json!({"rope_scaling": {"rope_type": "dynamic", "factor": -2}})),
            "field `rope_scaling.factor` = -2 is out of range",
        ),
        (
            qwen2(serde_json::json!({"rope_scaling": {"rope_type": "longrope", "factor": 2}})),
            "rope scaling \"longrope\" needs the field `rope_scaling.short_factor`",
        ),
        (
            qwen2(serde_json::json!({"rope_scaling": {"rope_type": "su", "factor": 2}})),
            "rope scaling type \"su\" is not supported (default, linear, llama3, yarn, \
             dynamic, longrope)",
        ),
        (
            window(serde_json::json!({"sliding_window": 0})),
            "field `sliding_window` = 0 is out of range: expected an integer from 1",
        ),
        (
            window(serde_json::json!({"sliding_window": -4})),
            "field `sliding_window` = -4 is out of range",
        ),
        (
            window(serde_json::json!({"sliding_window": 4.5})),
            "field `sliding_window` = 4.5 is out of range",
        ),
        (
            window(serde_json::json!({"max_window_layers": -1})),
            "field `max_window_layers` = -1 is out of range: expected an integer ≥ 0",
        ),
        (
            window(serde_json::json!({"layer_types": ["sliding_attention"]})),
            "field `layer_types` = [\"sliding_attention\"] must list 2 entries",
        ),
        (
            window(serde_json::json!({"layer_types": ["full_attention", "local"]})),
            "must list 2 entries (one per layer, `num_hidden_layers`), each \"full_attention\" or \
             \"sliding_attention\"",
        ),
        (
            window(serde_json::json!({"use_sliding_window": "true"})),
            "field `use_sliding_window` = \"true\" is not a boolean",
        ),
    ];
    for (v, want) in cases {
        let (e, path) = refused(dir.path(), &v);
        assert!(e.starts_with(&format!("{path}: ")), "{e}");
        assert!(e.contains(want), "{e}\n  wanted: {want}");
    }
    // transformers-5 keeps YaRN in `rope_parameters`: named so.
    let v = qwen2(
        serde_json::json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6,
        "factor": 4.0, "beta_fast": -32}}),
    );
    let (e, path) = refused(dir.path(), &v);
    assert!(
        e.starts_with(&format!(
            "{path}: field `rope_parameters.beta_fast` = -32 is out of range"
        )),
        "{e}"
    );
}

/// transformers' Qwen2Config, Qwen3Config, LlamaConfig and MistralConfig default
/// `tie_word_embeddings` to false: a config.json without the field has its own `lm_head.weight`.
#[test]
fn an_absent_tie_word_embeddings_is_untied_as_in_transformers() {
    for model_type in ["qwen2", "qwen3", "llama", "mistral"] {
        let mut v = qwen2(serde_json::json!({ "model_type": model_type }));
        let c = ModelConfig::from_json(&v, Path::new("config.json")).unwrap();
        assert!(!c.tie_word_embeddings, "{model_type}");
        v["tie_word_embeddings"] = true.into();
        let c = ModelConfig::from_json(&v, Path::new("config.json")).unwrap();
        assert!(c.tie_word_embeddings, "{model_type}");
    }
}

#[test]
fn window_layers_follow_transformers_defaults() {
    let read = |v: serde_json::Value| {
        ModelConfig::from_json(&v, Path::new("config.json"))
            .unwrap()
            .sliding_window
    };
    // use_sliding_window false (Qwen2.5's released configs): no window, whatever the rest says.
    assert!(read(qwen2(serde_json::json!({"sliding_window": 4}))).is_none());
    // max_window_layers defaults to 28: a 2-layer model has no sliding layer.
    assert!(read(qwen2(serde_json::json!({"use_sliding_window": true}))).is_none());
    let w = read(qwen2(
        serde_json::json!({"use_sliding_window": true, "max_window_layers": 1}),
    ))
    .unwrap();
    assert_eq!((w.size, w.layers), (4096, vec![false, true]));
    // layer_types wins over max_window_layers.
    let w = read(qwen2(
        serde_json::json!({"use_sliding_window": true, "sliding_window": 16,
        "max_window_layers": 1, "layer_types": ["sliding_attention", "full_attention"]}),
    ))
    .unwrap();
    assert_eq!((w.size, w.layers), (16, vec![true, false]));
    // YaRN's original length: the top-level field wins, else max_position_embeddings.
    let yarn = |extra: serde_json::Value| {
        let mut v = qwen2(serde_json::json!({"rope_scaling": {"type": "yarn", "factor": 2.0}}));
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        match c.rope_scaling {
            Some(RopeScaling::Yarn {
                original_max_position_embeddings,
                ..
            }) => (original_max_position_embeddings, c.rope_attention_factor()),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(yarn(serde_json::json!({})).0, 128.0);
    assert_eq!(
        yarn(serde_json::json!({"original_max_position_embeddings": 64})).0,
        64.0
    );
    // DeepSeek's mscale ratio.
    let v = qwen2(
        serde_json::json!({"rope_scaling": {"type": "yarn", "factor": 40.0,
        "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707}}),
    );
    let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
    let m = |x: f64| 0.1 * x * 40f64.ln() + 1.0;
    assert!((c.rope_attention_factor() - m(1.0) / m(0.707)).abs() < 1e-15);
    // An explicit attention_factor wins.
    let v = qwen2(
        serde_json::json!({"rope_scaling": {"type": "yarn", "factor": 40.0,
        "attention_factor": 0.5, "mscale": 1.0, "mscale_all_dim": 0.707}}),
    );
    let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
    assert_eq!(c.rope_attention_factor(), 0.5);
}
