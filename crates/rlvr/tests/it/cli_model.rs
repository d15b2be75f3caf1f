//! `rlvr init` and `rlvr logprobs` end to end through the binary.

use crate::common::rlvr;
use std::path::Path;

fn tokenizer() -> &'static str {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/tokenizers/qwen2.5/tokenizer.json"
    )
}

fn init(dir: &Path, arch: &str) {
    let out = rlvr()
        .args([
            "init", "--arch", arch, "--hidden", "32", "--layers", "1", "--heads", "2",
        ])
        .args([
            "--kv-heads",
            "1",
            "--intermediate",
            "64",
            "--tokenizer",
            tokenizer(),
            "--out",
        ])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["vocab_size"], 151680); // 151665 tokens rounded up to a multiple of 64
}

/// `rlvr init --arch gemma2|gemma3_text`: a tied Gemma with transformers' defaults (gemma2's
/// softcapping) and no window (every layer global, the window written as the whole context, since
/// transformers' Gemma refuses a null one), which loads back as written.
#[test]
fn init_writes_gemma_models() {
    for (arch, cap) in [("gemma2", Some(30.0)), ("gemma3_text", None)] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        init(&dir, arch);
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["model_type"], arch);
        assert_eq!(cfg["tie_word_embeddings"], true);
        assert_eq!(cfg["hidden_activation"], "gelu_pytorch_tanh");
        assert_eq!(
            cfg["query_pre_attn_scalar"], 16,
            "head_dim: hidden 32 / 2 heads"
        );
        assert_eq!(cfg["sliding_window"], cfg["max_position_embeddings"]);
        let m = rlvr_model::Model::load(&dir, candle_core::DType::F32, &candle_core::Device::Cpu)
            .unwrap();
        assert_eq!(m.final_logit_softcap(), cap, "{arch}");
        assert!(m.config().sliding_window.is_none());
    }
}

/// `rlvr init --arch phi3`: an untied Phi-3 whose file holds the fused `qkv_proj` and
/// `gate_up_proj` (transformers' names) and whose config.json has no pad id (Phi3Config's 32000
/// would be outside the vocabulary), which loads back as written.
#[test]
fn init_writes_phi3_models() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    init(&dir, "phi3");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "phi3");
    assert_eq!(cfg["architectures"][0], "Phi3ForCausalLM");
    assert_eq!(cfg["tie_word_embeddings"], false);
    assert!(cfg["pad_token_id"].is_null());
    let st =
        candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    assert!(st.contains_key("model.layers.0.self_attn.qkv_proj.weight"));
    assert!(st.contains_key("model.layers.0.mlp.gate_up_proj.weight"));
    assert!(!st
        .keys()
        .any(|k| k.contains("q_proj") || k.contains("gate_proj.")));
    let m =
        rlvr_model::Model::load(&dir, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    assert_eq!(m.config().arch, rlvr_model::Arch::Phi3);
}

#[test]
fn init_writes_a_complete_model_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    init(&dir, "qwen2");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "qwen2");
    assert_eq!(cfg["tie_word_embeddings"], true);
    assert!(cfg.get("rope_theta").is_some(), "transformers-4 style");
    let tc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert!(
        tc["bos_token"].is_null(),
        "<s> is an ordinary token in Qwen's vocabulary"
    );
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    let gc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(gc["eos_token_id"], 151645);
    // The tokenizer is shipped byte for byte.
    assert_eq!(
        std::fs::read(dir.join("tokenizer.json")).unwrap(),
        std::fs::read(tokenizer()).unwrap()
    );
}

#[test]
fn logprobs_prints_one_value_per_completion_token() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    init(&dir, "llama");
    let run = |t: &str, chat: bool| -> serde_json::Value {
        let mut c = rlvr();
        c.args(["logprobs", "--model"]).arg(&dir);
        c.args([
            "--prompt",
            "What is 2+2?",
            "--completion",
            " 4<|im_end|>",
            "--temperature",
            t,
        ]);
        if chat {
            c.arg("--chat");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = run("1", true);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["logprobs", "tokens"]);
    assert_eq!(v["tokens"], serde_json::json!([220, 19, 151645]));
    let lp: Vec<f64> = serde_json::from_value(v["logprobs"].clone()).unwrap();
    assert_eq!(lp.len(), 3);
    // A random model is close to uniform over 151680 tokens: log(1/151680) = -11.93.
    for x in &lp {
        assert!((x + 11.93).abs() < 1.5, "{x}");
    }
    // Temperature changes the values; the chat template changes the context.
    let hot: Vec<f64> = serde_json::from_value(run("2", true)["logprobs"].clone()).unwrap();
    assert!(lp.iter().zip(&hot).any(|(a, b)| (a - b).abs() > 1e-6));
    let plain: Vec<f64> = serde_json::from_value(run("1", false)["logprobs"].clone()).unwrap();
    assert!(lp.iter().zip(&plain).any(|(a, b)| (a - b).abs() > 1e-6));
    // `--fused` (the GPU check's A/B): a no-op on the CPU, bit for bit; an unknown op is refused.
    let fused = |list: &str| {
        rlvr()
            .args(["logprobs", "--model"])
            .arg(&dir)
            .args(["--prompt", "What is 2+2?", "--completion", " 4<|im_end|>"])
            .args(["--chat", "--fused", list])
            .output()
            .unwrap()
    };
    let all = fused("all");
    assert!(
        all.status.success(),
        "{}",
        String::from_utf8_lossy(&all.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(all, v);
    let bad = fused("attention,flash");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--fused flash: not a fused op"), "{err}");
}

#[test]
fn errors_name_the_missing_file() {
    let tmp = tempfile::tempdir().unwrap();
    let out = rlvr()
        .args(["logprobs", "--model"])
        .arg(tmp.path())
        .args(["--prompt", "a", "--completion", "b"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.json"), "{err}");
}

/// `rlvr bench sample` and `rlvr bench train` run on the CPU and report consistent figures: every
/// completion has exactly --new-tokens tokens (checked inside), tok/s = batch · new tokens / wall,
/// the step breakdown sums to its total, and TFLOP/s = 6 · parameters · tok/s.
#[test]
fn bench_reports_consistent_throughput() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    init(&dir, "qwen2");
    let run = |args: &[&str]| -> Vec<serde_json::Value> {
        let out = rlvr()
            .arg("bench")
            .args(args)
            .arg("--model")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let s = run(&[
        "sample",
        "--batch",
        "2",
        "--batch",
        "5",
        "--prompt-len",
        "3",
        "--new-tokens",
        "4",
        "--runs",
        "1",
    ]);
    assert_eq!(s.len(), 2);
    for (v, b) in s.iter().zip([2.0, 5.0]) {
        assert_eq!(v["batch"].as_f64().unwrap(), b);
        let (tps, wall) = (
            v["tok_per_s"].as_f64().unwrap(),
            v["wall_s"].as_f64().unwrap(),
        );
        assert!((tps * wall - b * 4.0).abs() < 1e-6 * b * 4.0, "{v}");
        let st = &v["step_ms"];
        let parts: f64 = ["forward", "to_host", "select", "compact"]
            .iter()
            .map(|k| st[*k].as_f64().unwrap())
            .sum();
        assert!((parts - st["total"].as_f64().unwrap()).abs() < 1e-9, "{v}");
        assert!(st["forward"].as_f64().unwrap() > 0.0);
        // host part + device wait = the forward; on the CPU the wait is the no-op synchronise
        let (host, wait) = (
            st["forward_host"].as_f64().unwrap(),
            st["forward_device_wait"].as_f64().unwrap(),
        );
        assert!(host > 0.0 && wait >= 0.0, "{v}");
        assert!(
            (host + wait - st["forward"].as_f64().unwrap()).abs() < 1e-9,
            "{v}"
        );
        assert!(host >= 0.5 * st["forward"].as_f64().unwrap(), "{v}");
        assert_eq!(v["decode_path"], "candle", "{v}");
        assert_eq!(v["triton_launches_per_step"].as_f64().unwrap(), 0.0, "{v}");
    }
    let t = run(&["train", "--rows", "2", "--seq-len", "6", "--steps", "1"]);
    let v = &t[0];
    // Qwen2 1 layer, hidden 32, heads 2 / KV 1 (head dim 16), intermediate 64, tied, vocab 151680.
    let params = 151680 * 32 + (32 * 32 + 32) + 2 * (16 * 32 + 16) + 32 * 32 + 3 * 32 * 64 + 3 * 32;
    assert_eq!(v["params"].as_u64().unwrap(), params as u64);
    let tps = v["tok_per_s"].as_f64().unwrap();
    assert!((v["step_s"].as_f64().unwrap() * tps - 12.0).abs() < 1e-6);
    let tf = v["tflop_per_s"].as_f64().unwrap();
    assert!((tf - 6.0 * params as f64 * tps / 1e12).abs() < 1e-12 * (1.0 + tf));
    // `rlvr plan`'s estimate of the same step, by hand (f32 on the CPU, eager attention): weights,
    // one backward's gradients and two moments (16 bytes per parameter), 2 × 6 positions × (2
    // layers' worth + embedding and final norm 32 · 20 bytes), the f32 logits stash of the 2 × 5
    // scored positions, and the 300 MiB process overhead.
    assert_eq!(v["attention"], "eager", "{v}");
    let cfg = rlvr_model::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let layer = rlvr_train::config::plan::Shape::of(&cfg).layer_bytes_per_token(4, 6);
    let want = 16 * params as u64 + 2 * 6 * (2 * layer + 32 * 20) + 10 * 151680 * 4 + (300 << 20);
    assert_eq!(
        v["plan_peak_mib"].as_f64().unwrap(),
        want as f64 / 1048576.0,
        "{v}"
    );
    // Multi-turn: 3 episodes × 3 turns of 4 tokens, bridges of 2: every later turn finds its
    // entry and prefills its last sampled id and its bridge only (the re-prefill path: the whole
    // context, 5 + 6 then 5 + 12 ids).
    let t = run(&[
        "turns",
        "--batch",
        "3",
        "--prompt-len",
        "5",
        "--turns",
        "3",
        "--new-tokens",
        "4",
        "--bridge-len",
        "2",
        "--runs",
        "1",
    ]);
    let v = &t[0];
    let c = &v["cache"];
    assert_eq!(
        (
            c["hits"].as_u64(),
            c["misses"].as_u64(),
            c["evictions"].as_u64()
        ),
        (Some(6), Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(c["prefilled_tokens"].as_u64(), Some(3 * 2 * 3), "{v}");
    assert_eq!(
        c["reused_tokens"].as_u64(),
        Some(3 * (11 + 17) - 3 * 2 * 3),
        "{v}"
    );
    assert!(v["re_prefill_s"].as_f64().unwrap() > 0.0 && v["kept_s"].as_f64().unwrap() > 0.0);
    assert!(v["max_abs_logprob_diff"].as_f64().unwrap() < 1e-4, "{v}");
    assert!(
        v["same_tokens"].is_boolean() && v["same_bits"].is_boolean(),
        "{v}"
    );
}

/// What killed `rlvr eval`/`rlvr generate` runs left is removed by the next start of either,
/// on the native backend too: their private directories under `$TMPDIR` (`rlvr-eval-vllm-PID-*`,
/// `rlvr-generate-vllm-PID-*`) and `rlvr eval --out FILE`'s own temporary (`.FILE.tmp-PID`),
/// as far as their processes are gone; a live process's and other files stay. (They used to go
/// only at a start that used the vLLM backend, and only that command's prefix.)
#[cfg(target_os = "linux")]
#[test]
fn eval_and_generate_remove_what_killed_runs_left() {
    let tmp = tempfile::tempdir().unwrap();
    let model = crate::common::tiny_model(tmp.path());
    let tmpdir = tmp.path().join("tmp");
    std::fs::create_dir_all(&tmpdir).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let me = std::process::id();
    let leave = |names: &[String]| {
        for n in names {
            std::fs::create_dir_all(tmpdir.join(n).join("version-00000000")).unwrap();
        }
    };
    let stale = [
        format!("rlvr-eval-vllm-{dead}-a1b2c3"),
        format!("rlvr-generate-vllm-{dead}-d4e5f6"),
    ];
    let live = format!("rlvr-generate-vllm-{me}-a1b2c3");
    leave(&stale);
    leave(std::slice::from_ref(&live));
    let exps = tmp.path().join("exps.jsonl");
    let half_exps = tmp.path().join(format!(".exps.jsonl.tmp-{dead}"));
    std::fs::write(&half_exps, "{\"prompt_ids\"").unwrap();
    let out = rlvr()
        .args(["generate", "--model"])
        .arg(&model)
        .args(["--prompt", "1+1=", "--max-new-tokens", "2", "--out"])
        .arg(&exps)
        .env("TMPDIR", &tmpdir)
        .output()
        .unwrap();
    crate::common::ok(&out, "generate");
    for n in &stale {
        assert!(!tmpdir.join(n).exists(), "generate left {n}");
    }
    assert!(tmpdir.join(&live).is_dir());
    // generate --out is written atomically now; a killed one's temporary goes at the next start.
    assert!(!half_exps.exists(), "generate left its --out temporary");
    let text = std::fs::read_to_string(&exps).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    // eval: the same, and its --out file's temporary.
    leave(&stale);
    let items = tmp.path().join("items.jsonl");
    let half = tmp.path().join(format!(".items.jsonl.tmp-{dead}"));
    let other = tmp.path().join(format!(".notes.jsonl.tmp-{dead}"));
    std::fs::write(&half, "{\"index\"").unwrap();
    std::fs::write(&other, "x").unwrap();
    let out = rlvr()
        .args(["eval", "--model"])
        .arg(&model)
        .args([
            "--task",
            "arithmetic",
            "--limit",
            "2",
            "--max-new-tokens",
            "2",
        ])
        .arg("--out")
        .arg(&items)
        .env("TMPDIR", &tmpdir)
        .output()
        .unwrap();
    crate::common::ok(&out, "eval");
    for n in &stale {
        assert!(!tmpdir.join(n).exists(), "eval left {n}");
    }
    assert!(!half.exists(), "eval left its --out temporary");
    assert!(other.exists() && items.is_file() && tmpdir.join(&live).is_dir());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("removed {}", half.display())),
        "{err}"
    );
}
