//! GGUF files (llama.cpp's single-file model format) read into a HuggingFace checkpoint:
//! `config.json` from the file's metadata, weights dequantized to f32, `tokenizer.json` built
//! from the vocabulary and merges, the chat template and special tokens (`rlvr convert
//! --from-gguf`).
//!
//! Sources (read to understand, not copied): the GGUF specification
//! (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>) for the metadata keys and
//! tensor names; llama.cpp's `convert_hf_to_gguf.py` (`LlamaModel.permute`) for the rotary
//! permutation of Llama's Q/K rows; llama.cpp's `llama-vocab.cpp` for the pre-tokenizer each
//! `tokenizer.ggml.pre` value names; transformers' `integrations/gguf` for the loader this
//! conversion is checked against (`scripts/make_gguf_fixtures.py`). The file itself is parsed and
//! dequantized by candle-core's reader (`candle_core::quantized::gguf_file`), which bounds every
//! length it reads by the file's size.
//!
//! Supported: architectures `llama`, `qwen2` and `qwen3` (Gemma 2 and 3 and Phi-3 load from their
//! HuggingFace checkpoints only: refused here with that advice); every quantisation candle dequantizes
//! (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K);
//! byte-level BPE vocabularies (`tokenizer.ggml.model` = `gpt2`). Anything else is refused by
//! name: another architecture, a quantisation such as IQ2_XXS, a SentencePiece vocabulary
//! (`llama`), an unknown pre-tokenizer, Llama-3.1-style rope scaling (a `rope_freqs.weight`
//! tensor).

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};
use serde_json::json;

use crate::config::{Arch, ModelConfig, RopeScaling};
use crate::error::{ModelError, Result};
use crate::tokenizer::TokenizerBundle;

/// A GGUF file converted in memory: what [`write_checkpoint`] writes.
pub struct GgufModel {
    /// The model's hyper-parameters, from the file's metadata and tensor shapes.
    pub config: ModelConfig,
    /// Every weight under its HuggingFace name (`model.layers.0.self_attn.q_proj.weight`), f32,
    /// in HuggingFace's `[out, in]` layout, Q/K rows of Llama un-permuted.
    pub tensors: Vec<(String, Tensor)>,
    /// The tokenizer built from the vocabulary, with its special tokens, EOS ids and chat
    /// template (`path` is the GGUF file).
    pub tokenizer: TokenizerBundle,
}

/// The ggml type names by type id (ggml.h's `enum ggml_type`), for naming a quantisation the
/// reader does not handle.
fn ggml_type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("unknown type {id}"),
    };
    name.to_string()
}

/// The most bytes [`first_unsupported_tensor`] reads of one string (a key or a tensor name).
const SCAN_MAX_STRING: u64 = 1 << 20;
/// The most array elements and tensors [`first_unsupported_tensor`] walks.
const SCAN_MAX_COUNT: u64 = 1 << 26;

/// Walks the header of a GGUF (v2/v3) file to its tensor table and returns the first tensor
/// whose ggml type candle cannot read, as `(tensor name, type name)`. Used only to name that
/// tensor when candle's reader refused the file; `None` when the walk finds none or the header
/// is unreadable (the reader's own error is reported then). Every length is bounded.
fn first_unsupported_tensor(path: &Path) -> Option<(String, String)> {
    fn u32_(f: &mut impl Read) -> Option<u32> {
        let mut b4 = [0u8; 4];
        f.read_exact(&mut b4).ok()?;
        Some(u32::from_le_bytes(b4))
    }
    fn u64_(f: &mut impl Read, b8: &mut [u8; 8]) -> Option<u64> {
        f.read_exact(b8).ok()?;
        Some(u64::from_le_bytes(*b8))
    }
    fn string(f: &mut (impl Read + Seek), b8: &mut [u8; 8], keep: bool) -> Option<String> {
        let n = u64_(f, b8)?;
        if n > SCAN_MAX_STRING {
            return None;
        }
        if !keep {
            f.seek(SeekFrom::Current(n as i64)).ok()?;
            return Some(String::new());
        }
        let mut v = vec![0u8; n as usize];
        f.read_exact(&mut v).ok()?;
        Some(String::from_utf8_lossy(&v).into_owned())
    }
    fn skip_value(f: &mut (impl Read + Seek), b8: &mut [u8; 8], ty: u32, depth: u32) -> Option<()> {
        let size = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => return string(f, b8, false).map(|_| ()),
            9 if depth < 4 => {
                let inner = u32_(f)?;
                let n = u64_(f, b8)?;
                if n > SCAN_MAX_COUNT {
                    return None;
                }
                for _ in 0..n {
                    skip_value(f, b8, inner, depth + 1)?;
                }
                return Some(());
            }
            _ => return None,
        };
        f.seek(SeekFrom::Current(size)).ok()?;
        Some(())
    }
    let mut f = std::io::BufReader::new(std::fs::File::open(path).ok()?);
    let mut b8 = [0u8; 8];
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic).ok()?;
    if &magic != b"GGUF" {
        return None;
    }
    let version = u32_(&mut f)?;
    if version < 2 {
        return None;
    }
    let tensors = u64_(&mut f, &mut b8)?;
    let kvs = u64_(&mut f, &mut b8)?;
    if tensors > SCAN_MAX_COUNT || kvs > SCAN_MAX_COUNT {
        return None;
    }
    for _ in 0..kvs {
        string(&mut f, &mut b8, false)?;
        let ty = u32_(&mut f)?;
        skip_value(&mut f, &mut b8, ty, 0)?;
    }
    for _ in 0..tensors {
        let name = string(&mut f, &mut b8, true)?;
        let dims = u32_(&mut f)?;
        if dims > 8 {
            return None;
        }
        for _ in 0..dims {
            u64_(&mut f, &mut b8)?;
        }
        let ty = u32_(&mut f)?;
        u64_(&mut f, &mut b8)?;
        if !matches!(ty, 0..=3 | 6..=15 | 30) {
            return Some((name, ggml_type_name(ty)));
        }
    }
    None
}

/// The metadata of one GGUF file with typed, key-naming getters.
struct Meta<'a> {
    file: &'a Path,
    md: &'a HashMap<String, Value>,
}

impl Meta<'_> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> ModelError {
        ModelError::Config {
            file: self.file.to_path_buf(),
            msg: format!("GGUF metadata key `{key}`: {msg}"),
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.md.get(key)
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::U8(x) => *x as u64,
            Value::U16(x) => *x as u64,
            Value::U32(x) => *x as u64,
            Value::U64(x) => *x,
            Value::I8(x) if *x >= 0 => *x as u64,
            Value::I16(x) if *x >= 0 => *x as u64,
            Value::I32(x) if *x >= 0 => *x as u64,
            Value::I64(x) if *x >= 0 => *x as u64,
            other => {
                return Err(self.err(
                    key,
                    format!("expected a non-negative integer, found {other:?}"),
                ))
            }
        };
        Ok(Some(n))
    }

    /// A size: an integer in 1..=2^31 (larger values are typos or a corrupt file).
    fn size(&self, key: &str) -> Result<usize> {
        let n = self
            .opt_u64(key)?
            .ok_or_else(|| self.err(key, "missing (required)"))?;
        if n == 0 || n > (1 << 31) {
            return Err(self.err(key, format!("{n} is out of range 1..=2^31")));
        }
        Ok(n as usize)
    }

    fn opt_size(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.size(key).map(Some),
        }
    }

    fn opt_id(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| self.err(key, format!("token id {n} is out of range"))),
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        let v = match self.get(key) {
            None => return Ok(None),
            Some(Value::F32(x)) => *x as f64,
            Some(Value::F64(x)) => *x,
            Some(other) => {
                return Err(self.err(key, format!("expected a float, found {other:?}")));
            }
        };
        if !v.is_finite() {
            return Err(self.err(key, format!("{v} is not finite")));
        }
        Ok(Some(v))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.err(key, format!("expected a bool, found {other:?}"))),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.err(
                key,
                format!("expected a string, found a {:?}", other.value_type()),
            )),
        }
    }

    fn str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = v else {
            return Err(self.err(key, "expected an array of strings"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(s.as_str()),
                _ => Err(self.err(key, format!("element {i} is not a string"))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = v else {
            return Err(self.err(key, "expected an array of integers"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::I32(n) => Ok(*n as i64),
                Value::U32(n) => Ok(*n as i64),
                Value::I8(n) => Ok(*n as i64),
                Value::U8(n) => Ok(*n as i64),
                Value::I16(n) => Ok(*n as i64),
                Value::U16(n) => Ok(*n as i64),
                _ => Err(self.err(key, format!("element {i} is not an integer"))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// Llama 3's split pattern (Llama 3's tokenizer.json; llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3`):
/// numbers in runs of up to three digits.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split pattern (Qwen2's tokenizer.json): single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizers` pre-tokenizer for a byte-level vocabulary whose `tokenizer.ggml.pre` is
/// `pre`, following the split llama.cpp's `llama-vocab.cpp` applies for it:
/// - `gpt2`, `mpt`, `olmo`, `jais` (and a file without the key, as older converters wrote):
///   GPT-2's pattern (the ByteLevel pre-tokenizer's own);
/// - `smollm`, `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva`: every
///   digit split off first, then GPT-2's pattern (as SmolLM's own tokenizer.json does);
/// - `llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `smaug-bpe`, `dbrx`, `pixtral`: Llama 3's
///   pattern (numbers in runs of up to 3 digits);
/// - `qwen2`, `deepseek-r1-qwen`: Qwen2's pattern (single digits).
///
/// # Errors
/// Any other value, naming it.
fn pre_tokenizer(pre: Option<&str>, meta: &Meta) -> Result<serde_json::Value> {
    let byte_level = |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex});
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    Ok(match pre.unwrap_or("gpt2") {
        "gpt2" | "default" | "mpt" | "olmo" | "jais" => byte_level(true),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true),
            ]})
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" | "dbrx" | "pixtral" => {
            split(LLAMA3_SPLIT)
        }
        "qwen2" | "deepseek-r1-qwen" => split(QWEN2_SPLIT),
        other => {
            return Err(meta.err(
                "tokenizer.ggml.pre",
                format!(
                    "pre-tokenizer {other:?} is not supported (supported: gpt2, mpt, olmo, jais, \
                     smollm, starcoder, refact, command-r, codeshell, exaone, minerva, llama3, \
                     llama-bpe, falcon3, smaug-bpe, dbrx, pixtral, qwen2, deepseek-r1-qwen)"
                ),
            ))
        }
    })
}

/// GPT-2's byte-to-character table: bytes that are printable stay themselves, the others map
/// to U+0100 upwards, in byte order.
fn byte_alphabet() -> HashSet<char> {
    let mut keep: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut n = 0;
    let kept: HashSet<u32> = keep.iter().copied().collect();
    for b in 0..256u32 {
        if !kept.contains(&b) {
            keep.push(256 + n);
            n += 1;
        }
    }
    keep.into_iter().filter_map(char::from_u32).collect()
}

/// Builds the tokenizer of `meta`: tokenizer.json's JSON (a `tokenizers` byte-level BPE) and
/// the bundle with special tokens, EOS ids and chat template.
fn build_tokenizer(meta: &Meta, vocab_rows: usize) -> Result<TokenizerBundle> {
    let model = meta.opt_str("tokenizer.ggml.model")?.ok_or_else(|| {
        meta.err(
            "tokenizer.ggml.model",
            "missing: the file carries no tokenizer",
        )
    })?;
    if model != "gpt2" {
        return Err(meta.err(
            "tokenizer.ggml.model",
            format!(
                "vocabulary type {model:?} is not supported: only byte-level BPE (\"gpt2\") \
                 vocabularies convert (SentencePiece \"llama\", \"t5\" and others do not yet)"
            ),
        ));
    }
    let tokens = meta
        .str_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta.err("tokenizer.ggml.tokens", "missing (required)"))?;
    if tokens.is_empty() || tokens.len() > vocab_rows {
        return Err(meta.err(
            "tokenizer.ggml.tokens",
            format!(
                "{} tokens, but token_embd.weight has {vocab_rows} rows",
                tokens.len()
            ),
        ));
    }
    let types = meta.int_array("tokenizer.ggml.token_type")?;
    if let Some(t) = &types {
        if t.len() != tokens.len() {
            return Err(meta.err(
                "tokenizer.ggml.token_type",
                format!("{} entries for {} tokens", t.len(), tokens.len()),
            ));
        }
    }
    let merges = meta.str_array("tokenizer.ggml.merges")?.ok_or_else(|| {
        meta.err(
            "tokenizer.ggml.merges",
            "missing (a BPE vocabulary needs them)",
        )
    })?;
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let mut parts = m.split(' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => {
                merge_pairs.push(json!([a, b]))
            }
            _ => {
                return Err(meta.err(
                    "tokenizer.ggml.merges",
                    format!("merge {i} ({m:?}) is not two tokens separated by one space"),
                ))
            }
        }
    }
    let alphabet = byte_alphabet();
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        // 3 = control (special), 4 = user-defined (added, not special): llama.cpp's
        // `llama_token_type`. A control token outside the byte alphabet is a mislabel in some
        // converters' output and stays a plain entry (as transformers' loader does).
        let ty = types.as_ref().map_or(1, |t| t[id]);
        let in_alphabet = tok.chars().all(|c| alphabet.contains(&c));
        if (ty == 3 && in_alphabet) || ty == 4 {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": ty == 4, "special": ty == 3,
            }));
        }
        if vocab.insert(tok.to_string(), json!(id)).is_some() {
            return Err(meta.err(
                "tokenizer.ggml.tokens",
                format!("token {tok:?} appears twice (the second time as id {id})"),
            ));
        }
    }
    let token_of = |key: &str| -> Result<Option<String>> {
        match meta.opt_id(key)? {
            None => Ok(None),
            Some(id) => tokens
                .get(id as usize)
                .map(|t| Some(t.to_string()))
                .ok_or_else(|| {
                    meta.err(
                        key,
                        format!("id {id} is not in the vocabulary of {}", tokens.len()),
                    )
                }),
        }
    };
    let bos = token_of("tokenizer.ggml.bos_token_id")?;
    let eos = token_of("tokenizer.ggml.eos_token_id")?;
    let pad = token_of("tokenizer.ggml.padding_token_id")?;
    let add_bos = meta
        .opt_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(false);
    let post_processor = match (&bos, add_bos) {
        (Some(b), true) => {
            let id = tokens.iter().position(|t| t == b).expect("bos is a token");
            json!({"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": b, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {b.as_str(): {"id": b, "ids": [id], "tokens": [b]}}})
        }
        _ => {
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
        }
    };
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer(meta.opt_str("tokenizer.ggml.pre")?, meta)?,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merge_pairs,
        },
    });
    let text = serde_json::to_string(&doc).expect("JSON serialises");
    let tokenizer: tokenizers::Tokenizer = text.parse().map_err(|e| ModelError::Tokenizer {
        file: meta.file.to_path_buf(),
        msg: format!("the tokenizer built from the GGUF vocabulary does not load: {e}"),
    })?;
    // EOS ids: the EOS, then end-of-turn and end-of-message tokens where the file names them
    // (Llama 3's `<|eot_id|>`, `<|eom_id|>`).
    let mut eos_ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = meta.opt_id(key)? {
            if (id as usize) >= tokens.len() {
                return Err(meta.err(key, format!("id {id} is not in the vocabulary")));
            }
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    let pad_id = pad
        .as_deref()
        .and_then(|p| tokens.iter().position(|t| *t == p))
        .map(|i| i as u32)
        .or(eos_ids.first().copied())
        .unwrap_or(0);
    Ok(TokenizerBundle {
        tokenizer,
        chat_template: meta.opt_str("tokenizer.chat_template")?.map(str::to_string),
        bos_token: bos,
        eos_token: eos,
        pad_token: pad,
        eos_ids,
        pad_id,
        path: meta.file.to_path_buf(),
        generation_config: None,
    })
}

/// HuggingFace's name of the GGUF tensor `name` (llama.cpp's `tensor_mapping.py` names), or
/// `None` for a tensor this conversion does not know.
fn hf_name(name: &str) -> Option<String> {
    let top = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = match tail {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_output.bias" => "self_attn.o_proj.bias",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Undoes llama.cpp's rotary permutation of a Llama Q or K projection (`[heads·head_dim, in]`
/// weights or `[heads·head_dim]` biases). llama.cpp's converter stores, within each head, row
/// `2i + s` (pair `i`, half `s`) where HuggingFace's layout has row `s·head_dim/2 + i`, so that
/// its rotary embedding rotates adjacent pairs; this returns HuggingFace's layout.
///
/// # Errors
/// A first dimension that is not `heads · head_dim` with `head_dim` even.
pub fn unpermute_rotary(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(ModelError::Invalid(format!(
            "rotary un-permutation: {rows} rows are not {heads} heads of an even width"
        )));
    }
    let half = rows / heads / 2;
    let cols: usize = dims[1..].iter().product();
    Ok(t.reshape((heads, half, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// The inverse of [`unpermute_rotary`] (llama.cpp's permutation), for tests.
pub fn permute_rotary(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(ModelError::Invalid(format!(
            "rotary permutation: {rows} rows are not {heads} heads of an even width"
        )));
    }
    let half = rows / heads / 2;
    let cols: usize = dims[1..].iter().product();
    Ok(t.reshape((heads, 2, half, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// The most elements of one tensor (2^34): larger shapes are a corrupt header.
const MAX_TENSOR_ELEMENTS: u64 = 1 << 34;

/// Reads the GGUF file `path` into a [`GgufModel`]: metadata → config, every tensor
/// dequantized to f32 and renamed, Llama's Q/K rows un-permuted, the tokenizer built.
///
/// # Errors
/// Each names the file and the key or tensor: an unreadable or truncated file; an
/// architecture other than llama/qwen2/qwen3; a missing or malformed metadata key; a tensor of
/// a quantisation candle does not dequantize (named, e.g. `IQ2_XXS`); an unknown tensor; a
/// tensor whose shape disagrees with the metadata; a tokenizer that cannot be built.
pub fn read(path: &Path) -> Result<GgufModel> {
    let io = |e: std::io::Error| ModelError::Io {
        path: path.to_path_buf(),
        err: e,
    };
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let content = Content::read(&mut file).map_err(|e| {
        let msg = match first_unsupported_tensor(path) {
            Some((name, ty)) => format!(
                "tensor `{name}` is quantised as {ty}, which rlvr cannot dequantize (supported: \
                 F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, \
                 Q6_K, Q8_K)"
            ),
            None => format!("not a readable GGUF file: {e}"),
        };
        ModelError::Config {
            file: path.to_path_buf(),
            msg,
        }
    })?;
    let meta = Meta {
        file: path,
        md: &content.metadata,
    };
    let arch_name = meta
        .opt_str("general.architecture")?
        .ok_or_else(|| meta.err("general.architecture", "missing (required)"))?
        .to_string();
    let arch = match arch_name.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        // Not mapped (their norms, softcapping and local rope need tensor and metadata
        // conventions this reader has not been checked against): the safetensors checkpoint is.
        // Phi-3's GGUF (llama.cpp's `attn_qkv`, a fused `ffn_up`, `rope_factors_long` /
        // `rope_factors_short` tensors and a partial `rope.dimension_count`) likewise.
        other @ ("gemma2" | "gemma3" | "phi3") => {
            return Err(meta.err(
                "general.architecture",
                format!(
                    "architecture {other:?} is not supported in GGUF files (llama, qwen2 or \
                     qwen3); load the HuggingFace checkpoint (config.json and safetensors, \
                     model_type \"{other}\"), which rlvr supports"
                ),
            ))
        }
        other => {
            return Err(meta.err(
                "general.architecture",
                format!("architecture {other:?} is not supported (llama, qwen2 or qwen3)"),
            ))
        }
    };
    let k = |s: &str| format!("{arch_name}.{s}");
    let layers = meta.size(&k("block_count"))?;
    let hidden = meta.size(&k("embedding_length"))?;
    let intermediate = meta.size(&k("feed_forward_length"))?;
    let heads = meta.size(&k("attention.head_count"))?;
    let kv_heads = meta
        .opt_size(&k("attention.head_count_kv"))?
        .unwrap_or(heads);
    if heads % kv_heads != 0 {
        return Err(meta.err(
            &k("attention.head_count_kv"),
            format!("{kv_heads} does not divide the {heads} attention heads"),
        ));
    }
    let head_dim = match meta.opt_size(&k("attention.key_length"))? {
        Some(d) => d,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(meta.err(
                &k("attention.key_length"),
                format!("missing, and {hidden} is not divisible by {heads} heads"),
            ))
        }
    };
    if let Some(v) = meta.opt_size(&k("attention.value_length"))? {
        if v != head_dim {
            return Err(meta.err(
                &k("attention.value_length"),
                format!("{v} differs from the key length {head_dim} (not supported)"),
            ));
        }
    }
    if let Some(r) = meta.opt_size(&k("rope.dimension_count"))? {
        if r != head_dim {
            return Err(meta.err(
                &k("rope.dimension_count"),
                format!("partial rotary ({r} of {head_dim} dims) is not supported"),
            ));
        }
    }
    if head_dim % 2 != 0 {
        return Err(meta.err(
            &k("attention.key_length"),
            format!("head dim {head_dim} must be even (rotary)"),
        ));
    }
    let eps = meta
        .opt_f64(&k("attention.layer_norm_rms_epsilon"))?
        .ok_or_else(|| meta.err(&k("attention.layer_norm_rms_epsilon"), "missing (required)"))?;
    let rope_theta = meta.opt_f64(&k("rope.freq_base"))?.unwrap_or(10000.0);
    if rope_theta <= 0.0 {
        return Err(meta.err(&k("rope.freq_base"), format!("{rope_theta} must be > 0")));
    }
    let rope_scaling = match meta.opt_str(&k("rope.scaling.type"))? {
        None | Some("none") => None,
        Some("linear") => {
            let factor = meta
                .opt_f64(&k("rope.scaling.factor"))?
                .ok_or_else(|| meta.err(&k("rope.scaling.factor"), "missing for linear scaling"))?;
            if factor <= 0.0 {
                return Err(meta.err(&k("rope.scaling.factor"), "must be > 0"));
            }
            (factor != 1.0).then_some(RopeScaling::Linear { factor })
        }
        Some(other) => {
            return Err(meta.err(
                &k("rope.scaling.type"),
                format!("rope scaling {other:?} is not supported (none or linear)"),
            ))
        }
    };
    let context = meta.opt_size(&k("context_length"))?.unwrap_or(4096);

    // Tensors: every one known and of a sane size, before any is read.
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in &names {
        let info = &content.tensor_infos[*name];
        let mut n: u64 = 1;
        for &d in info.shape.dims() {
            n = n.saturating_mul(d as u64);
        }
        if n > MAX_TENSOR_ELEMENTS {
            return Err(ModelError::Config {
                file: path.to_path_buf(),
                msg: format!(
                    "tensor `{name}` has shape {:?}: more than 2^34 elements (a corrupt header)",
                    info.shape.dims()
                ),
            });
        }
        if name.as_str() == "rope_freqs.weight" {
            return Err(ModelError::Config {
                file: path.to_path_buf(),
                msg: "tensor `rope_freqs.weight` (Llama-3.1-style rope scaling) is not supported"
                    .into(),
            });
        }
        if hf_name(name).is_none() {
            return Err(ModelError::Config {
                file: path.to_path_buf(),
                msg: format!("tensor `{name}` is not one rlvr knows for {arch_name}"),
            });
        }
    }
    let embd = content
        .tensor_infos
        .get("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor {
            file: path.to_path_buf(),
            tensor: "token_embd.weight".into(),
        })?;
    let (vocab_rows, embd_cols) = match embd.shape.dims() {
        [v, h] => (*v, *h),
        d => {
            return Err(ModelError::Config {
                file: path.to_path_buf(),
                msg: format!(
                    "tensor `token_embd.weight` has shape {d:?}, expected [vocab, hidden]"
                ),
            })
        }
    };
    if embd_cols != hidden {
        return Err(ModelError::Config {
            file: path.to_path_buf(),
            msg: format!(
                "tensor `token_embd.weight` has {embd_cols} columns, but `{}` is {hidden}",
                k("embedding_length")
            ),
        });
    }
    let has = |n: &str| content.tensor_infos.contains_key(n);
    let tie = !has("output.weight");
    let qkv_bias = has("blk.0.attn_q.bias");
    let o_bias = has("blk.0.attn_output.bias");
    if arch == Arch::Qwen2 && !qkv_bias {
        return Err(ModelError::MissingTensor {
            file: path.to_path_buf(),
            tensor: "blk.0.attn_q.bias (Qwen2 has Q/K/V biases)".into(),
        });
    }
    if o_bias {
        return Err(ModelError::Config {
            file: path.to_path_buf(),
            msg: "tensor `blk.0.attn_output.bias`: an output-projection bias is not supported"
                .into(),
        });
    }
    let tokenizer = build_tokenizer(&meta, vocab_rows)?;
    let bos_token_id = meta.opt_id("tokenizer.ggml.bos_token_id")?;
    let config = ModelConfig {
        arch,
        vocab_size: vocab_rows,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: eps,
        rope_theta,
        rope_scaling,
        max_position_embeddings: context,
        sliding_window: None,
        tie_word_embeddings: tie,
        qkv_bias,
        o_bias: false,
        mlp_bias: false,
        stored_dtype: None,
        bos_token_id,
        eos_token_ids: tokenizer.eos_ids.clone(),
        gemma: None,
        partial_rotary_factor: 1.0,
    };

    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let hf = hf_name(name).expect("checked above");
        let wrap = |e: candle_core::Error| ModelError::Config {
            file: path.to_path_buf(),
            msg: format!("tensor `{name}`: {e}"),
        };
        let q = content
            .tensor(&mut file, name, &Device::Cpu)
            .map_err(wrap)?;
        let mut t = q.dequantize(&Device::Cpu).map_err(wrap)?;
        if t.dtype() != DType::F32 {
            t = t.to_dtype(DType::F32)?;
        }
        if arch == Arch::Llama {
            if name.ends_with(".attn_q.weight") || name.ends_with(".attn_q.bias") {
                t = unpermute_rotary(&t, heads).map_err(|e| ModelError::Config {
                    file: path.to_path_buf(),
                    msg: format!("tensor `{name}`: {e}"),
                })?;
            } else if name.ends_with(".attn_k.weight") || name.ends_with(".attn_k.bias") {
                t = unpermute_rotary(&t, kv_heads).map_err(|e| ModelError::Config {
                    file: path.to_path_buf(),
                    msg: format!("tensor `{name}`: {e}"),
                })?;
            }
        }
        tensors.push((hf, t));
    }
    Ok(GgufModel {
        config,
        tensors,
        tokenizer,
    })
}

/// Writes `model` into `dir` as a HuggingFace checkpoint: config.json and model.safetensors
/// (weights as `dtype`, f32 or bf16) through the same writers as [`crate::Model::save`], and
/// tokenizer.json, tokenizer_config.json and generation_config.json through
/// [`crate::checkpoint::write_tokenizer_files`]. Then loads the directory back with
/// [`crate::checkpoint::Policy::load`], so a conversion whose names or shapes disagree with the
/// config fails here, naming the tensor, rather than in a later command.
///
/// # Errors
/// I/O errors; a tensor that does not match the model the config describes.
pub fn write_checkpoint(model: &GgufModel, dir: &Path, dtype: DType) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::Io {
        path: dir.to_path_buf(),
        err: e,
    })?;
    let tensors: Vec<(String, Tensor)> = model
        .tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_dtype(dtype)?)))
        .collect::<Result<_>>()?;
    crate::weights::write_safetensors(&dir.join("model.safetensors"), &tensors)?;
    drop(tensors);
    crate::weights::atomic_write(
        &dir.join("config.json"),
        &model.config.json_bytes_for(dtype),
    )?;
    crate::checkpoint::write_tokenizer_files(dir, &model.tokenizer)?;
    crate::checkpoint::Policy::load(dir, DType::F32, &Device::Cpu)?;
    Ok(())
}
