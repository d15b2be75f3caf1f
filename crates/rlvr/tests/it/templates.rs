//! Hostile chat templates through the real `rlvr` binary (issue 49, item 9): a template that
//! doubles a string or a list, grows one with `indent` or `replace`, or nests a value 100,000 deep
//! asked rlvr's own process for terabytes or overflowed its stack (an abort, rc 134). The binary
//! renders templates in a worker process with bounded memory, stack and output
//! (`rlvr_model::template_sandbox`): each is now an error naming the bounds, rc 1, and a released
//! template on the same model still renders.
#![cfg(unix)]

use crate::common::{ok, rlvr, tiny_model};

/// Held by the tests that render through this test process's own worker, one of which stops it
/// on purpose (a hostile template), so that another's count of worker starts is its own.
static IN_PROCESS_WORKER: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn hostile_chat_templates_are_errors_never_aborts() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let cfg_path = model.join("tokenizer_config.json");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let logprobs = || {
        rlvr()
            .args([
                "logprobs",
                "--chat",
                "--prompt",
                "1+2=",
                "--completion",
                "3",
            ])
            .arg("--model")
            .arg(&model)
            .output()
            .unwrap()
    };
    let loop_ = |init: &str, step: &str, n: u32, show: &str| {
        format!(
            "{{% set ns = namespace(v={init}) %}}{{% for i in range({n}) %}}{{% set ns.v = {step} %}}\
             {{% endfor %}}{{{{ {show} }}}}"
        )
    };
    let cases = [
        (
            "string doubling",
            loop_("'xxxxxxxx'", "ns.v ~ ns.v", 45, "ns.v|length"),
        ),
        (
            "list doubling",
            loop_("[1, 2, 3, 4]", "ns.v + ns.v", 45, "ns.v|length"),
        ),
        (
            "indent",
            loop_(
                "'a\\nb'",
                "(ns.v ~ '\\n' ~ ns.v)|indent(100000)",
                30,
                "ns.v|length",
            ),
        ),
        (
            "replace",
            loop_(
                "'aaaa'",
                "ns.v|replace('a', 'aaaaaaaaaaaaaaaa')",
                30,
                "ns.v|length",
            ),
        ),
        ("deep tojson", loop_("[]", "[ns.v]", 100_000, "ns.v|tojson")),
    ];
    for (name, template) in cases {
        let mut cfg = base.clone();
        cfg["chat_template"] = template.into();
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let out = logprobs();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {:?} {err}", out.status);
        assert!(
            err.contains("rendering the chat template failed") && err.contains("2 GiB of memory"),
            "{name}: {err}"
        );
    }
    // The model's own (ChatML) template still renders, through a fresh worker.
    std::fs::write(&cfg_path, base.to_string()).unwrap();
    ok(&logprobs(), "logprobs with the model's own template");
}

/// The worker renders the 64 chat templates of rlvr-model's fixture (transformers'
/// `apply_chat_template` output recorded for each) byte for byte, as the in-process renderer
/// does: the worker protocol driven directly, one JSON line per rendering.
#[test]
fn the_template_worker_renders_released_templates_as_transformers_does() {
    use std::io::{BufRead, BufReader, Write};
    let fixture =
        crate::common::repo_root().join("crates/rlvr-model/tests/fixtures/chat_templates.json");
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    assert_eq!(cases.len(), 64);
    let mut worker = rlvr()
        .arg("__rlvr-render")
        .arg(std::process::id().to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = worker.stdin.take().unwrap();
    let mut stdout = BufReader::new(worker.stdout.take().unwrap());
    for c in &cases {
        let request = serde_json::json!({
            "template": c["template"], "messages": c["messages"],
            "add_generation_prompt": c["add_generation_prompt"],
            "bos_token": c["bos_token"], "eos_token": c["eos_token"],
        });
        writeln!(stdin, "{request}").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
        match c["error"].as_str() {
            // Gemma 2's template raising on a system message: its message comes back.
            Some(msg) => {
                let err = answer["error"].as_str().unwrap_or_default();
                assert!(err.contains(msg), "{}: {answer}", c["name"]);
            }
            None => assert_eq!(answer["text"], c["expected"], "{}: {answer}", c["name"]),
        }
    }
    drop(stdin); // the worker exits at the end of its input
    assert!(worker.wait().unwrap().success());
}

/// The worker's parent-death signal follows the thread that forks it, so workers are forked by
/// one lasting thread: a worker first asked for by a thread that has since ended (an explorer
/// thread after its last batch) lives on and serves the next rendering (before, the kernel killed
/// it when that thread ended, and a rendering in flight on another thread failed as if its
/// template were hostile: the flaky `environment_templates_render_in_the_bounded_worker`).
#[cfg(target_os = "linux")]
#[test]
fn a_worker_outlives_the_thread_that_started_it() {
    use rlvr_model::template_sandbox::worker_starts;
    let _one = IN_PROCESS_WORKER.lock().unwrap_or_else(|e| e.into_inner());
    use rlvr_model::tokenizer::{render_chat_template, Message, CHATML_TEMPLATE};
    rlvr_model::template_sandbox::enable(env!("CARGO_BIN_EXE_rlvr").into());
    let messages = vec![Message::new("user", "1+2=")];
    let m = messages.clone();
    let first =
        std::thread::spawn(move || render_chat_template(CHATML_TEMPLATE, &m, true, None, None))
            .join()
            .unwrap()
            .unwrap();
    assert_eq!(
        first,
        "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n"
    );
    let starts = worker_starts();
    // The kernel's SIGKILL would reach a worker forked by the ended thread by now.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let again = render_chat_template(CHATML_TEMPLATE, &messages, true, None, None).unwrap();
    assert_eq!(again, first);
    // The same worker served (the test that stops a worker on purpose waits for this one).
    assert_eq!(worker_starts(), starts);
}

/// Environments' tool-calling chat templates (rlvr-env's renderer) go through the same bounded
/// worker once the binary sets `rlvr_env::template::RENDERER` (as `rlvr`'s main does): the four
/// official templates of rlvr-env's fixture (Qwen2.5, Qwen3, Llama 3.1, ... with tools and tool
/// calls) render through the worker as transformers did, byte for byte; a hostile one fails its
/// turn with the bounds named instead of aborting.
#[cfg(target_os = "linux")]
#[test]
fn environment_templates_render_in_the_bounded_worker() {
    use rlvr_env::json::Json;
    let _one = IN_PROCESS_WORKER.lock().unwrap_or_else(|e| e.into_inner());
    use rlvr_env::template::ChatTemplate;
    rlvr_model::template_sandbox::enable(env!("CARGO_BIN_EXE_rlvr").into());
    let _ = rlvr_env::template::RENDERER
        .set(|payload| rlvr_model::template_sandbox::call("env", payload));
    let root = crate::common::repo_root();
    let f = Json::parse(
        &std::fs::read_to_string(root.join("crates/rlvr-env/tests/fixtures/conversations.json"))
            .unwrap(),
    )
    .unwrap();
    let Some(Json::Array(cases)) = f.get("cases") else {
        panic!("conversations.json has cases")
    };
    assert_eq!(cases.len(), 4);
    for c in cases {
        let name = c.get("template").and_then(Json::as_str).unwrap();
        let source = std::fs::read_to_string(root.join("data/chat_templates").join(name)).unwrap();
        let Some(Json::Object(vars)) = c.get("vars") else {
            panic!("{name}: vars")
        };
        let vars: Vec<(String, Json)> = vars
            .iter()
            .filter(|(_, v)| *v != Json::Null)
            .cloned()
            .collect();
        let tools = match c.get("tools") {
            Some(Json::Array(t)) => Some(t.clone()),
            _ => None,
        };
        let Some(Json::Array(messages)) = c.get("messages") else {
            panic!("{name}: messages")
        };
        let t = ChatTemplate::new(&source, vars).unwrap();
        let full = t.render_json(messages, tools.as_deref(), false).unwrap();
        assert_eq!(
            Some(full.as_str()),
            c.get("full_text").and_then(Json::as_str),
            "{name}"
        );
    }
    let hostile = ChatTemplate::new(
        "{% set ns = namespace(v='xxxxxxxx') %}{% for i in range(45) %}{% set ns.v = ns.v ~ ns.v %}{% endfor %}{{ ns.v|length }}",
        vec![],
    )
    .unwrap();
    let e = hostile
        .render_json(&[], None, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 GiB of memory"), "{e}");
}
