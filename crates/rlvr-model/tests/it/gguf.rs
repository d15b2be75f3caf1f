//! `rlvr_model::gguf`: a GGUF file converted into a HuggingFace checkpoint (issue 46).
//!
//! The files here are written with candle's GGUF writer from a random model: its weights renamed
//! to llama.cpp's names, Q/K rows permuted as llama.cpp's converter does, stored as F32 (so the
//! round trip is exact) or quantised. The conversion must give back the model bit for bit, and
//! bad files must be refused naming the key or tensor. Parity with transformers' own GGUF loader
//! on a real model is `crates/rlvr/tests/it/gguf.rs`.

use std::io::Cursor;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use rlvr_model::gguf::{permute_rotary, read, unpermute_rotary, write_checkpoint};
use rlvr_model::{Arch, Model, ModelConfig};

/// GPT-2's byte → character table (bytes_to_unicode): printable bytes stay, the rest map to
/// U+0100 upwards in byte order.
fn byte_char(b: u8) -> char {
    let kept = |b: u32| {
        (33..=126).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if kept(b as u32) {
        return char::from(b);
    }
    let n = (0..b as u32).filter(|&x| !kept(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

/// A byte-level vocabulary: the 256 byte tokens, merges building "he", "ll", "hell", "12", and
/// three control tokens. Returns (tokens, token types, merges).
fn vocabulary() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![1; 256];
    for t in ["he", "ll", "hell", "12"] {
        tokens.push(t.into());
        types.push(1);
    }
    for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(t.into());
        types.push(3);
    }
    let merges = ["h e", "l l", "he ll", "1 2"].map(String::from).to_vec();
    (tokens, types, merges)
}

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn config(arch: Arch, vocab: usize) -> ModelConfig {
    ModelConfig {
        arch,
        vocab_size: vocab,
        hidden_size: 64,
        intermediate_size: 96,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        rms_norm_eps: 1e-5,
        rope_theta: 100000.0,
        rope_scaling: None,
        max_position_embeddings: 512,
        sliding_window: None,
        tie_word_embeddings: arch != Arch::Llama,
        qkv_bias: arch == Arch::Qwen2,
        o_bias: false,
        mlp_bias: false,
        stored_dtype: None,
        bos_token_id: None,
        eos_token_ids: vec![],
        gemma: None,
        partial_rotary_factor: 1.0,
    }
}

/// llama.cpp's name of a HuggingFace weight name.
fn gguf_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (l, tail) = rest.split_once('.').unwrap();
    let t = match tail {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        o => panic!("unmapped {o}"),
    };
    format!("blk.{l}.{t}")
}

/// Options of [`gguf_bytes`].
struct Opts {
    quant: GgmlDType,
    pre: &'static str,
    tokenizer_model: &'static str,
    drop_key: Option<&'static str>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            quant: GgmlDType::F32,
            pre: "smollm",
            tokenizer_model: "gpt2",
            drop_key: None,
        }
    }
}

/// A GGUF file of `model` as llama.cpp's converter writes one (Q/K permuted for Llama), every
/// 2-D weight stored as `o.quant` (norms stay F32).
fn gguf_bytes(model: &Model, o: &Opts) -> Vec<u8> {
    let c = model.config();
    let arch = c.arch.model_type();
    let (tokens, types, merges) = vocabulary();
    let strs = |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
    let k = |s: &str| format!("{arch}.{s}");
    let md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (k("block_count"), Value::U32(c.num_hidden_layers as u32)),
        (
            k("context_length"),
            Value::U32(c.max_position_embeddings as u32),
        ),
        (k("embedding_length"), Value::U32(c.hidden_size as u32)),
        (
            k("feed_forward_length"),
            Value::U32(c.intermediate_size as u32),
        ),
        (
            k("attention.head_count"),
            Value::U32(c.num_attention_heads as u32),
        ),
        (
            k("attention.head_count_kv"),
            Value::U32(c.num_key_value_heads as u32),
        ),
        (k("attention.key_length"), Value::U32(c.head_dim as u32)),
        (k("rope.freq_base"), Value::F32(c.rope_theta as f32)),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(c.rms_norm_eps as f32),
        ),
        (
            "tokenizer.ggml.model".into(),
            Value::String(o.tokenizer_model.into()),
        ),
        ("tokenizer.ggml.pre".into(), Value::String(o.pre.into())),
        ("tokenizer.ggml.tokens".into(), strs(&tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strs(&merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(261)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(262)),
        ("tokenizer.ggml.padding_token_id".into(), Value::U32(260)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Value::String(TEMPLATE.into()),
        ),
    ];
    let md: Vec<(String, Value)> = md
        .into_iter()
        .filter(|(key, _)| Some(key.as_str()) != o.drop_key)
        .collect();
    let mut qs = Vec::new();
    for (name, var) in model.base_vars() {
        let mut t = var.as_tensor().clone();
        if c.arch == Arch::Llama {
            if name.contains("q_proj") {
                t = permute_rotary(&t, c.num_attention_heads).unwrap();
            } else if name.contains("k_proj") {
                t = permute_rotary(&t, c.num_key_value_heads).unwrap();
            }
        }
        let dt = if t.rank() == 2 {
            o.quant
        } else {
            GgmlDType::F32
        };
        qs.push((gguf_name(&name), QTensor::quantize(&t, dt).unwrap()));
    }
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut w = Cursor::new(Vec::new());
    gguf_file::write(&mut w, &md_refs, &t_refs).unwrap();
    w.into_inner()
}

fn random_model(arch: Arch) -> Model {
    let vocab = vocabulary().0.len();
    Model::random(config(arch, vocab), 0.05, 7, DType::F32, &Device::Cpu).unwrap()
}

fn write(dir: &std::path::Path, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join("m.gguf");
    std::fs::write(&p, bytes).unwrap();
    p
}

fn err_of(dir: &std::path::Path, bytes: &[u8]) -> String {
    match read(&write(dir, bytes)) {
        Ok(_) => panic!("the file was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn permutation_direction_matches_llama_cpp() {
    // One head of width 4: llama.cpp stores HF rows [r0, r1, r2, r3] as [r0, r2, r1, r3]
    // (row 2i + s holds half s, pair i).
    let hf = Tensor::new(&[[0f32, 0.], [1., 1.], [2., 2.], [3., 3.]], &Device::Cpu).unwrap();
    let gg = permute_rotary(&hf, 1).unwrap();
    assert_eq!(
        gg.to_vec2::<f32>().unwrap(),
        vec![vec![0., 0.], vec![2., 2.], vec![1., 1.], vec![3., 3.]]
    );
    // Two heads of width 6, and a bias: un-permuting inverts it exactly.
    let w = Tensor::arange(0f32, 12. * 5., &Device::Cpu)
        .unwrap()
        .reshape((12, 5))
        .unwrap();
    let back = unpermute_rotary(&permute_rotary(&w, 2).unwrap(), 2).unwrap();
    assert_eq!(back.to_vec2::<f32>().unwrap(), w.to_vec2::<f32>().unwrap());
    let b = Tensor::arange(0f32, 12., &Device::Cpu).unwrap();
    let gb = permute_rotary(&b, 2).unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(gb, vec![0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.]);
    assert!(unpermute_rotary(&w, 5).is_err());
}

/// Every architecture: the converted weights equal the model's bit for bit (F32 storage), the
/// config equals it, and the written directory loads and computes the same log-probs.
#[test]
fn f32_files_convert_back_to_the_same_model_for_each_architecture() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let model = random_model(arch);
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &gguf_bytes(&model, &Opts::default()));
        let g = read(&path).unwrap();
        let c = &g.config;
        let want = model.config();
        assert_eq!(
            (
                c.arch,
                c.vocab_size,
                c.hidden_size,
                c.intermediate_size,
                c.num_hidden_layers
            ),
            (
                want.arch,
                want.vocab_size,
                want.hidden_size,
                want.intermediate_size,
                want.num_hidden_layers
            )
        );
        assert_eq!(
            (
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                c.tie_word_embeddings,
                c.qkv_bias
            ),
            (4, 2, 16, arch != Arch::Llama, arch == Arch::Qwen2)
        );
        assert_eq!(c.rope_theta, 100000.0);
        assert_eq!(c.rms_norm_eps, 1e-5f32 as f64);
        assert_eq!(c.eos_token_ids, vec![262]);
        assert_eq!(g.tensors.len(), model.base_vars().len(), "{arch:?}");
        for (name, t) in &g.tensors {
            let v = model
                .var(name)
                .unwrap_or_else(|| panic!("{arch:?}: {name}"));
            let a = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let b = v
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert!(a == b, "{arch:?}: {name} differs after the round trip");
        }
        let out = dir.path().join("hf");
        write_checkpoint(&g, &out, DType::F32).unwrap();
        let p = rlvr_model::checkpoint::Policy::load(&out, DType::F32, &Device::Cpu).unwrap();
        let ids = vec![vec![261u32, 104, 101, 108, 108, 111, 262, 49, 50]];
        let mask = vec![vec![1u32; 9]];
        let a = model
            .token_logprobs(&ids, &mask, 0, 1.0, false, false)
            .unwrap();
        let b = p
            .model
            .token_logprobs(&ids, &mask, 0, 1.0, false, false)
            .unwrap();
        assert_eq!(
            a.logprobs.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            b.logprobs.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            "{arch:?}"
        );
        let gc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("generation_config.json")).unwrap())
                .unwrap();
        assert_eq!(gc["eos_token_id"], 262);
        assert_eq!(gc["bos_token_id"], 261);
        let tc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("tokenizer_config.json")).unwrap())
                .unwrap();
        assert_eq!(tc["chat_template"], TEMPLATE);
        assert_eq!(tc["eos_token"], "<|im_end|>");
        assert_eq!(tc["pad_token"], "<|endoftext|>");
    }
}

/// Q8_0, Q4_1 and Q5_0 storage (K-quants need rows of 256, more than this model has): the converted weight is the dequantized stored weight, un-permuted
/// (not the permuted one: Q differs from it).
#[test]
fn quantized_weights_are_dequantized_and_unpermuted() {
    for quant in [GgmlDType::Q8_0, GgmlDType::Q4_1, GgmlDType::Q5_0] {
        let model = random_model(Arch::Llama);
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            &gguf_bytes(
                &model,
                &Opts {
                    quant,
                    ..Opts::default()
                },
            ),
        );
        let g = read(&path).unwrap();
        let q = model
            .var("model.layers.1.self_attn.q_proj.weight")
            .unwrap()
            .as_tensor();
        let stored = QTensor::quantize(&permute_rotary(q, 4).unwrap(), quant)
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap();
        let want = unpermute_rotary(&stored, 4)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let got = g
            .tensors
            .iter()
            .find(|(n, _)| n == "model.layers.1.self_attn.q_proj.weight")
            .unwrap();
        let got = got.1.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(got, want, "{quant:?}");
        let orig = q.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let err = got
            .iter()
            .zip(&orig)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err > 0.0 && err < 0.05,
            "{quant:?}: quantisation error {err}"
        );
    }
}

#[test]
fn the_tokenizer_follows_the_vocabulary_merges_and_pre_tokenizer() {
    let model = random_model(Arch::Qwen3);
    let dir = tempfile::tempdir().unwrap();
    let enc = |pre: &'static str, text: &str| {
        let path = write(
            dir.path(),
            &gguf_bytes(
                &model,
                &Opts {
                    pre,
                    ..Opts::default()
                },
            ),
        );
        read(&path).unwrap().tokenizer.encode(text, false).unwrap()
    };
    // "hello" → "hell" + "o"; "12" merges under gpt2's split, stays two digits under smollm's.
    // Ids: bytes 0..=255 in byte order, then "he" 256, "ll" 257, "hell" 258, "12" 259.
    assert_eq!(enc("gpt2", "hello 12"), vec![258, 111, 32, 259]);
    assert_eq!(enc("gpt2", "12"), vec![259]);
    assert_eq!(enc("smollm", "12"), vec![49, 50]);
    assert_eq!(enc("qwen2", "12"), vec![49, 50]);
    // Control tokens are whole; multi-byte text round-trips through the byte alphabet.
    let path = write(dir.path(), &gguf_bytes(&model, &Opts::default()));
    let tok = read(&path).unwrap().tokenizer;
    let ids = tok
        .encode("<|im_start|>héllo 日本<|im_end|>", false)
        .unwrap();
    assert_eq!(ids[0], 261);
    assert_eq!(*ids.last().unwrap(), 262);
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>héllo 日本<|im_end|>"
    );
    let text = tok
        .apply_chat_template(&[rlvr_model::Message::new("user", "hi")], true)
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn unsupported_files_are_refused_by_name() {
    let model = random_model(Arch::Llama);
    let dir = tempfile::tempdir().unwrap();
    let e = err_of(
        dir.path(),
        &gguf_bytes(
            &model,
            &Opts {
                tokenizer_model: "llama",
                ..Opts::default()
            },
        ),
    );
    assert!(
        e.contains("tokenizer.ggml.model") && e.contains("\"llama\""),
        "{e}"
    );
    let e = err_of(
        dir.path(),
        &gguf_bytes(
            &model,
            &Opts {
                pre: "chatglm-bpe",
                ..Opts::default()
            },
        ),
    );
    assert!(
        e.contains("tokenizer.ggml.pre") && e.contains("chatglm-bpe"),
        "{e}"
    );
    let e = err_of(
        dir.path(),
        &gguf_bytes(
            &model,
            &Opts {
                drop_key: Some("llama.block_count"),
                ..Opts::default()
            },
        ),
    );
    assert!(
        e.contains("`llama.block_count`") && e.contains("missing"),
        "{e}"
    );
    // Another architecture: the key is rewritten in place (same length, so offsets hold).
    let mut b = gguf_bytes(&model, &Opts::default());
    let at = find(&b, b"\x05\x00\x00\x00\x00\x00\x00\x00llama").unwrap() + 8;
    b[at..at + 5].copy_from_slice(b"gemma");
    let e = err_of(dir.path(), &b);
    assert!(
        e.contains("general.architecture") && e.contains("gemma"),
        "{e}"
    );
    // A tensor quantised as IQ2_XXS (ggml type 16): its type id patched in the tensor table.
    let mut b = gguf_bytes(
        &model,
        &Opts {
            quant: GgmlDType::Q8_0,
            ..Opts::default()
        },
    );
    let name = b"blk.1.ffn_up.weight";
    let at = find(&b, name).unwrap() + name.len();
    let dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * dims;
    assert_eq!(
        u32::from_le_bytes(b[ty..ty + 4].try_into().unwrap()),
        8,
        "Q8_0"
    );
    b[ty..ty + 4].copy_from_slice(&16u32.to_le_bytes());
    let e = err_of(dir.path(), &b);
    assert!(
        e.contains("`blk.1.ffn_up.weight`") && e.contains("IQ2_XXS"),
        "{e}"
    );
}

#[test]
fn truncated_and_corrupt_files_are_errors_naming_file_tensor_or_key() {
    let model = random_model(Arch::Llama);
    let dir = tempfile::tempdir().unwrap();
    let b = gguf_bytes(&model, &Opts::default());
    // Cut inside the tensor data: the last tensor (by offset) is short.
    let e = err_of(dir.path(), &b[..b.len() - 100]);
    assert!(
        e.contains("m.gguf") && e.contains("tensor `") && e.contains("bytes"),
        "{e}"
    );
    // Cut inside the header, at many points: always an error naming the file, never a panic.
    for cut in [0, 3, 4, 8, 23, 24, 100, 1000, 5000] {
        let e = err_of(dir.path(), &b[..cut]);
        assert!(e.contains("m.gguf"), "cut {cut}: {e}");
    }
    // A string length of 2^60 in the first key: refused before any allocation.
    let mut c = b.clone();
    c[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = err_of(dir.path(), &c);
    assert!(e.contains("m.gguf") && e.contains("string length"), "{e}");
    // A tensor shape of 2^40 × 2^40 elements: refused naming the tensor.
    let mut c = b.clone();
    let name = b"blk.0.ffn_up.weight";
    let at = find(&c, name).unwrap() + name.len() + 4;
    c[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    c[at + 8..at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = err_of(dir.path(), &c);
    assert!(
        e.contains("`blk.0.ffn_up.weight`") && e.contains("2^34"),
        "{e}"
    );
    // A token id beyond the vocabulary.
    let mut c = b.clone();
    let key = b"tokenizer.ggml.eos_token_id";
    let at = find(&c, key).unwrap() + key.len() + 4;
    c[at..at + 4].copy_from_slice(&100000u32.to_le_bytes());
    let e = err_of(dir.path(), &c);
    assert!(
        e.contains("tokenizer.ggml.eos_token_id") && e.contains("100000"),
        "{e}"
    );
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Gemma 2 and Gemma 3 GGUF files are refused by architecture, with the advice to load the
/// HuggingFace checkpoint (which rlvr supports).
#[test]
fn gemma_files_are_refused_with_the_checkpoint_advice() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["gemma2", "gemma3", "phi3"] {
        let arch_v = Value::String(arch.into());
        let md = vec![("general.architecture", &arch_v)];
        let mut w = Cursor::new(Vec::new());
        gguf_file::write(&mut w, &md, &[]).unwrap();
        let e = err_of(dir.path(), &w.into_inner());
        assert!(
            e.contains("general.architecture")
                && e.contains(&format!("\"{arch}\""))
                && e.contains("HuggingFace checkpoint"),
            "{e}"
        );
    }
}
