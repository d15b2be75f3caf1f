//! Chat templates rendered by minijinja equal transformers' `apply_chat_template(...,
//! tokenize=False)` on the same template text (fixtures from
//! `scripts/make_chat_template_fixtures.py`, transformers 5.24): ChatML, a Qwen2.5-Instruct-style
//! template with a default system prompt, Llama-3, a template that relies on
//! `trim_blocks`/`lstrip_blocks`, and Gemma 2- and Gemma 3-style templates (`<start_of_turn>`
//! turns, the assistant as "model"; Gemma 2's raises on a system message, and the error carries
//! its message as transformers' does), and Phi-3- and Phi-4-mini-style templates
//! (`<|user|>…<|end|><|assistant|>`, with and without newlines).

use rlvr_model::tokenizer::render_chat_template;
use rlvr_model::Message;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    name: String,
    template: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    /// `None` where transformers' rendering raised: then `error` is its message.
    expected: Option<String>,
    error: Option<String>,
}

#[test]
fn templates_render_as_transformers_does() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates.json"
    );
    let cases: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(cases.len() >= 48);
    let mut families = std::collections::BTreeSet::new();
    let mut raised = 0;
    for c in &cases {
        let got = render_chat_template(
            &c.template,
            &c.messages,
            c.add_generation_prompt,
            c.bos_token.as_deref(),
            c.eos_token.as_deref(),
        );
        match (&c.expected, &c.error) {
            (Some(want), None) => {
                let got = got.unwrap_or_else(|e| panic!("{}: {e}", c.name));
                assert_eq!(&got, want, "{}", c.name);
            }
            // The template's own message reaches the error (Gemma 2's "System role not
            // supported"), with the template named.
            (None, Some(msg)) => {
                let err = got.err().unwrap_or_else(|| panic!("{}: rendered", c.name));
                let err = err.to_string();
                assert!(err.contains(msg.as_str()), "{}: {err}", c.name);
                assert!(err.starts_with("chat template"), "{}: {err}", c.name);
                raised += 1;
            }
            _ => panic!("{}: expected text or an error", c.name),
        }
        families.insert(c.name.split('/').next().unwrap().to_string());
    }
    assert_eq!(
        raised, 3,
        "Gemma 2's template raises on each system message case"
    );
    for f in [
        "chatml",
        "qwen2.5_style",
        "llama3",
        "gemma2_style",
        "gemma3_style",
        "phi3_style",
        "phi4_mini_style",
    ] {
        assert!(families.contains(f), "no {f} cases");
    }
}

#[test]
fn qwen_style_template_injects_the_default_system_prompt_only_without_one() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates.json"
    );
    let cases: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let tpl = &cases
        .iter()
        .find(|c| c.name.starts_with("qwen2.5_style"))
        .unwrap()
        .template;
    let without =
        render_chat_template(tpl, &[Message::new("user", "2+2?")], true, None, None).unwrap();
    assert!(
        without.starts_with("<|im_start|>system\nYou are Qwen"),
        "{without}"
    );
    assert!(without.ends_with("<|im_start|>assistant\n"));
    let with = render_chat_template(
        tpl,
        &[
            Message::new("system", "Be terse."),
            Message::new("user", "2+2?"),
        ],
        false,
        None,
        None,
    )
    .unwrap();
    assert!(
        with.starts_with("<|im_start|>system\nBe terse.<|im_end|>"),
        "{with}"
    );
    assert!(!with.contains("You are Qwen"));
    assert!(!with.contains("assistant"));
}

#[test]
fn a_template_that_raises_reports_its_message() {
    let tpl = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok";
    let err = render_chat_template(tpl, &[Message::new("assistant", "x")], false, None, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("first message must be from the user"), "{err}");
}

#[test]
fn a_template_that_loops_without_end_stops_with_an_error_not_a_hang() {
    // 10^10 iterations unbounded; the fuel stops it after TEMPLATE_FUEL instructions. Rendered on
    // a thread so that a renderer without fuel fails this test instead of hanging it.
    let tpl = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = render_chat_template(tpl, &[Message::new("user", "2+2?")], true, None, None);
        let _ = tx.send(r.map(|s| s.len()).map_err(|e| e.to_string()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the template still renders after 60 s: no fuel limit");
    let err = got.unwrap_err();
    assert!(
        err.contains(&format!(
            "ran past {} template instructions",
            rlvr_model::tokenizer::TEMPLATE_FUEL
        )),
        "{err}"
    );
    assert!(err.starts_with("chat template (chat_template):"), "{err}");
}

#[test]
fn the_fuel_leaves_room_for_long_conversations_in_real_templates() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates.json"
    );
    let cases: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // 500 turns of a conversation, each family's template: far more than a training prompt holds.
    let messages: Vec<Message> = (0..500)
        .map(|i| Message::new(if i % 2 == 0 { "user" } else { "assistant" }, "2+2?"))
        .collect();
    for f in ["chatml", "qwen2.5_style", "llama3"] {
        let c = cases.iter().find(|c| c.name.starts_with(f)).unwrap();
        let out = render_chat_template(
            &c.template,
            &messages,
            true,
            c.bos_token.as_deref(),
            c.eos_token.as_deref(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(out.matches("2+2?").count(), 500, "{}", c.name);
    }
}

#[test]
fn a_model_without_a_chat_template_says_where_one_is_looked_for() {
    // A base model's tokenizer_config.json has no `chat_template`, and no chat_template.jinja.
    let dir = tempfile::tempdir().unwrap();
    let tok = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/tokenizers/qwen2.5/tokenizer.json"
    );
    std::fs::copy(tok, dir.path().join("tokenizer.json")).unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "<|endoftext|>"}"#,
    )
    .unwrap();
    let bundle = rlvr_model::TokenizerBundle::load(dir.path()).unwrap();
    let msg = [Message {
        role: "user".into(),
        content: "2 + 2?".into(),
    }];
    let e = bundle
        .apply_chat_template(&msg, true)
        .unwrap_err()
        .to_string();
    let want = format!(
        "chat template ({}): the model directory has no chat template (neither `chat_template` in \
         tokenizer_config.json nor chat_template.jinja), so chat messages cannot be rendered: \
         add one (an instruct model's), or use plain prompts",
        dir.path().display()
    );
    assert_eq!(e, want);
}
