//! Helpers shared by the tests that run the real `rlvr` binary: the binary itself and a tiny
//! character-level tokenizer for the small random checkpoints they train.
#![allow(dead_code)]

use std::process::Command;

/// The `rlvr` binary cargo built for these tests.
pub fn rlvr() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rlvr"))
}

/// A character-level WordLevel tokenizer (digits, operators, space, newline; `<|endoftext|>`).
pub fn tokenizer_json() -> String {
    let chars = "0123456789+-*= #\n";
    let mut vocab = serde_json::Map::new();
    for (i, ch) in chars.chars().enumerate() {
        vocab.insert(ch.to_string(), i.into());
    }
    let unk = chars.chars().count();
    vocab.insert("<unk>".into(), unk.into());
    vocab.insert("<|endoftext|>".into(), (unk + 1).into());
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": unk + 1, "content": "<|endoftext|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?s)."}, "behavior": "Isolated", "invert": false},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
    .to_string()
}
