//! Bridges and rows against transformers: the official Qwen2.5, Qwen3 and Llama-3.1 chat
//! templates (data/chat_templates/, vendored from TRL) render conversations with tools
//! byte-identical to transformers' `apply_chat_template`, and the row built from the prompt,
//! the sampled turns (stop id kept) and the bridges equals transformers' tokens of the whole
//! conversation when the turns are canonical. Fixtures: tests/fixtures/conversations.json, made
//! by scripts/make_env_fixtures.py. Tokenizer: data/tokenizers/qwen2.5 (for Llama 3.1 the same
//! with Llama 3's special tokens added, as the script does: no Llama tokenizer is in data/).

use rlvr_env::bridge::{assemble, bridge, Bridge};
use rlvr_env::json::Json;
use rlvr_env::protocol::{Message, ToolCall};
use rlvr_env::template::ChatTemplate;
use std::path::{Path, PathBuf};
use tokenizers::{AddedToken, Tokenizer};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> Json {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conversations.json");
    Json::parse(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn tokenizer(name: &str, specials: &Json) -> Tokenizer {
    let mut t =
        Tokenizer::from_file(root().join("data/tokenizers/qwen2.5/tokenizer.json")).unwrap();
    if name == "qwen2.5+llama3" {
        let Json::Array(s) = specials else { panic!() };
        let added: Vec<AddedToken> = s
            .iter()
            .map(|x| AddedToken::from(x.as_str().unwrap().to_string(), true))
            .collect();
        assert_eq!(t.add_special_tokens(added).unwrap(), 6);
    } else {
        assert_eq!(name, "qwen2.5");
    }
    t
}

fn encode(t: &Tokenizer, text: &str) -> Vec<u32> {
    t.encode(text, false).unwrap().get_ids().to_vec()
}

fn s<'a>(j: &'a Json, k: &str) -> &'a str {
    j.get(k)
        .and_then(Json::as_str)
        .unwrap_or_else(|| panic!("no {k}"))
}

fn arr<'a>(j: &'a Json, k: &str) -> &'a [Json] {
    match j.get(k) {
        Some(Json::Array(a)) => a,
        other => panic!("{k}: {other:?}"),
    }
}

/// A fixture message (transformers' dict, OpenAI tool calls) as a protocol message.
fn message(m: &Json) -> Message {
    let mut out = Message::new(s(m, "role"), s(m, "content"));
    if let Some(Json::Array(calls)) = m.get("tool_calls") {
        for c in calls {
            let f = c.get("function").unwrap();
            out.tool_calls.push(ToolCall {
                id: s(c, "id").into(),
                name: s(f, "name").into(),
                arguments: f.get("arguments").unwrap().clone(),
            });
        }
    }
    out.name = m.get("name").and_then(Json::as_str).map(str::to_string);
    out.tool_call_id = m
        .get("tool_call_id")
        .and_then(Json::as_str)
        .map(str::to_string);
    out
}

struct Case {
    name: String,
    template: ChatTemplate,
    tok: Tokenizer,
    eot: String,
    tools: Option<Vec<Json>>,
    messages: Vec<Message>,
    prompt_len: usize,
    turns: Vec<String>,
    prompt_text: String,
    full_text: String,
    full_ids: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let f = fixtures();
    arr(&f, "cases")
        .iter()
        .map(|c| {
            let source =
                std::fs::read_to_string(root().join("data/chat_templates").join(s(c, "template")))
                    .unwrap();
            let Some(Json::Object(vars)) = c.get("vars") else {
                panic!()
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
            Case {
                name: s(c, "name").into(),
                template: ChatTemplate::new(&source, vars).unwrap(),
                tok: tokenizer(s(c, "tokenizer"), f.get("llama3_specials").unwrap()),
                eot: s(c, "end_of_turn").into(),
                tools,
                messages: arr(c, "messages").iter().map(message).collect(),
                prompt_len: arr(c, "prompt_messages").len(),
                turns: arr(c, "turns")
                    .iter()
                    .map(|t| t.as_str().unwrap().to_string())
                    .collect(),
                prompt_text: s(c, "prompt_text").into(),
                full_text: s(c, "full_text").into(),
                full_ids: arr(c, "full_ids")
                    .iter()
                    .map(|i| u32::try_from(i.as_f64().unwrap() as u64).unwrap())
                    .collect(),
            }
        })
        .collect()
}

/// The row of `c` built as rlvr builds it: prompt ids, then each canonical turn's ids with the
/// end-of-turn id (log-prob −(turn) per token), then each environment reply's bridge.
/// Returns (prompt ids, completion, the bridges).
fn build_row(c: &Case) -> (Vec<u32>, rlvr_env::bridge::EpisodeTokens, Vec<Bridge>) {
    let enc = |t: &str| -> Result<Vec<u32>, String> { Ok(encode(&c.tok, t)) };
    let eot_id = encode(&c.tok, &c.eot);
    assert_eq!(eot_id.len(), 1, "{}", c.name);
    let prompt = encode(&c.tok, &c.prompt_text);
    let mut turns = Vec::new();
    let mut bridges = Vec::new();
    let mut pending: Vec<Message> = Vec::new();
    for m in &c.messages[c.prompt_len..] {
        if m.role == "assistant" {
            if !turns.is_empty() {
                let b = bridge(&c.template, &c.eot, &pending, c.tools.as_deref(), &enc)
                    .unwrap_or_else(|e| panic!("{}: {e}", c.name));
                bridges.push(b);
                pending.clear();
            }
            let k = turns.len();
            let mut ids = encode(&c.tok, &c.turns[k]);
            ids.push(eot_id[0]);
            let lps = vec![-(k as f32 + 1.0); ids.len()];
            turns.push((ids, lps));
        } else {
            pending.push(m.clone());
        }
    }
    assert!(pending.is_empty(), "a row never ends in a bridge");
    let ids: Vec<Vec<u32>> = bridges.iter().map(|b| b.ids.clone()).collect();
    (prompt, assemble(&turns, &ids).unwrap(), bridges)
}

#[test]
fn the_official_templates_render_tools_and_tool_calls_as_transformers_does() {
    let cs = cases();
    assert_eq!(cs.len(), 4);
    for c in &cs {
        let full = c
            .template
            .render(&c.messages, c.tools.as_deref(), false)
            .unwrap();
        assert_eq!(full, c.full_text, "{}: the whole conversation", c.name);
        let prompt = c
            .template
            .render(&c.messages[..c.prompt_len], c.tools.as_deref(), true)
            .unwrap();
        assert_eq!(prompt, c.prompt_text, "{}: the prompt", c.name);
    }
}

#[test]
fn canonical_turns_and_bridges_rebuild_transformers_tokens_of_the_whole_conversation() {
    for c in &cases() {
        let (prompt, row, _) = build_row(c);
        let eot = encode(&c.tok, &c.eot)[0];
        // transformers' tokens up to the last end-of-turn (Qwen writes a `\n` after it, which
        // belongs to no turn of the row: a row never ends in a bridge).
        let last = c.full_ids.iter().rposition(|&i| i == eot).unwrap();
        let want = &c.full_ids[..=last];
        let mut got = prompt.clone();
        got.extend_from_slice(&row.completion_ids);
        assert_eq!(got, want, "{}", c.name);
        // Every sampled id (stop ids included) is unmasked with its log-prob; bridges are 0/0.0.
        let sampled: usize = row.completion_mask.iter().map(|&m| usize::from(m)).sum();
        let turn_tokens: usize = c.turns.iter().map(|t| encode(&c.tok, t).len() + 1).sum();
        assert_eq!(sampled, turn_tokens, "{}", c.name);
        let m = &row.completion_mask;
        for i in 0..m.len() {
            if m[i] == 1 && m.get(i + 1) != Some(&1) {
                assert_eq!(
                    row.completion_ids[i], eot,
                    "{}: each turn ends in its sampled stop id",
                    c.name
                );
            }
            assert_eq!(
                m[i] == 0,
                row.behaviour_logprobs[i] == 0.0,
                "{}: position {i}",
                c.name
            );
        }
        assert_eq!(*row.completion_ids.last().unwrap(), eot, "{}", c.name);
        assert_eq!(*row.completion_mask.last().unwrap(), 1, "{}", c.name);
    }
}

#[test]
fn qwen_bridges_hold_the_newline_after_im_end_grouped_tool_messages_and_the_generation_prompt() {
    let cs = cases();
    // Hand-checked Qwen2.5 ids: 198 "\n", 151644 <|im_start|>, 151645 <|im_end|>, 872 "user",
    // 77091 "assistant".
    let (_, row, bridges) = build_row(cs.iter().find(|c| c.name == "qwen2.5_tools").unwrap());
    assert_eq!(bridges.len(), 1);
    let b = &bridges[0];
    assert_eq!(
        b.text,
        "\n<|im_start|>user\n<tool_response>\n21\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(&b.ids[..4], &[198, 151644, 872, 198]);
    assert_eq!(
        &b.ids[b.ids.len() - 5..],
        &[151645, 198, 151644, 77091, 198]
    );
    // The bridge sits right after turn 1's stop id, all masked.
    let start = row
        .completion_ids
        .iter()
        .position(|&i| i == 151645)
        .unwrap()
        + 1;
    assert_eq!(&row.completion_ids[start..start + b.ids.len()], &b.ids[..]);
    assert!(row.completion_mask[start..start + b.ids.len()]
        .iter()
        .all(|&m| m == 0));
    assert_eq!(row.completion_mask[start - 1], 1);

    let (_, _, bridges) = build_row(cs.iter().find(|c| c.name == "qwen3_tools").unwrap());
    assert_eq!(
        bridges[0].ids, b.ids,
        "Qwen3 bridges tool results as Qwen2.5 does"
    );
    let (_, _, bridges) = build_row(cs.iter().find(|c| c.name == "qwen2.5_retry").unwrap());
    assert_eq!(
        bridges[0].text,
        "\n<|im_start|>user\nThat is not correct. Please try again.<|im_end|>\n<|im_start|>assistant\n"
    );
    let (_, _, bridges) = build_row(cs.iter().find(|c| c.name == "llama3.1_tools").unwrap());
    assert_eq!(
        bridges[0].text,
        "<|start_header_id|>ipython<|end_header_id|>\n\n\"21\"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn a_non_canonical_split_keeps_the_sampled_ids() {
    let c = cases()
        .into_iter()
        .find(|c| c.name == "qwen2.5_retry")
        .unwrap();
    let (he, llo) = (encode(&c.tok, "he"), encode(&c.tok, "llo"));
    let mut sampled: Vec<u32> = he.iter().chain(&llo).copied().collect();
    sampled.push(151645);
    assert_ne!(
        &sampled[..sampled.len() - 1],
        &encode(&c.tok, "hello")[..],
        "the split is non-canonical"
    );
    let enc = |t: &str| -> Result<Vec<u32>, String> { Ok(encode(&c.tok, t)) };
    let b = bridge(
        &c.template,
        &c.eot,
        &[Message::new("user", "again")],
        None,
        &enc,
    )
    .unwrap();
    let turns = vec![
        (sampled.clone(), vec![-0.5; sampled.len()]),
        (vec![19, 151645], vec![-0.25, -0.125]),
    ];
    let row = assemble(&turns, std::slice::from_ref(&b.ids)).unwrap();
    assert_eq!(&row.completion_ids[..sampled.len()], &sampled[..]);
    assert_eq!(
        &row.completion_ids[sampled.len()..sampled.len() + b.ids.len()],
        &b.ids[..]
    );
    assert_eq!(
        &row.completion_ids[sampled.len() + b.ids.len()..],
        &[19, 151645]
    );
}

fn refused(source: &str, eot: &str, messages: &[Message]) -> String {
    let tok = tokenizer("qwen2.5", &Json::Null);
    let enc = |t: &str| -> Result<Vec<u32>, String> { Ok(encode(&tok, t)) };
    let t = ChatTemplate::new(source, vec![]).unwrap();
    bridge(&t, eot, messages, None, &enc)
        .unwrap_err()
        .to_string()
}

#[test]
fn templates_that_cannot_bridge_are_refused_with_the_reason() {
    let user = [Message::new("user", "again")];
    let e = refused(
        "{% for m in messages %}{{ m.content }}<eot>{% endfor %}",
        "<eot>",
        &user,
    );
    assert!(
        e.contains("\"<eot>\" encodes as") && e.contains("not one"),
        "{e}"
    );
    let e = refused(
        "{% for m in messages %}{{ m.content }}.<|im_end|>{% endfor %}",
        "<|im_end|>",
        &user,
    );
    assert!(e.contains("writes \".\" between"), "{e}");
    let e = refused(
        "{% for m in messages %}{{ m.content }}<|im_end|>{% if m.role == 'user' and not loop.first %}{{ messages[1].content | length }}{% endif %}{% endfor %}",
        "<|im_end|>",
        &user,
    );
    assert!(e.contains("depends on the assistant turn"), "{e}");
    // `.` is one token, but `.\n` is one too: the token at the turn's end straddles the cut.
    let e = refused(
        "{% for m in messages %}{{ m.content }}.\n{% endfor %}",
        ".",
        &user,
    );
    assert!(
        e.contains("not extend the context as a token prefix"),
        "{e}"
    );
}

#[test]
fn qwen3_bridges_a_user_reply_despite_rewriting_history_and_passes_template_kwargs() {
    // After a user message Qwen3 renders earlier assistant turns without their think block, so
    // the context rendered alone is not a prefix of the whole; the bridge is read off the whole
    // rendering and still holds only what follows the turn. `enable_thinking = false` puts the
    // empty think block into the generation prompt, hence into the bridge.
    let tok = tokenizer("qwen2.5", &Json::Null);
    let enc = |t: &str| -> Result<Vec<u32>, String> { Ok(encode(&tok, t)) };
    let source = std::fs::read_to_string(root().join("data/chat_templates/qwen3.jinja")).unwrap();
    let again = [Message::new("user", "Try again.")];
    let want_tail = "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n";
    let plain = ChatTemplate::new(&source, vec![]).unwrap();
    let b = bridge(&plain, "<|im_end|>", &again, None, &enc).unwrap();
    assert_eq!(b.text, want_tail);
    let no_think =
        ChatTemplate::new(&source, vec![("enable_thinking".into(), Json::Bool(false))]).unwrap();
    let b = bridge(&no_think, "<|im_end|>", &again, None, &enc).unwrap();
    assert_eq!(b.text, format!("{want_tail}<think>\n\n</think>\n\n"));
    assert_eq!(b.ids, encode(&tok, &b.text));
    assert_eq!(&b.ids[..2], &[198, 151644]);
}

/// `reads_tools` tells a template that prints tool schemas from one that never reads `tools`
/// (SmolLM2-135M-Instruct's ChatML template, which drops them without a word; rlvr warns).
#[test]
fn reads_tools_tells_templates_that_print_tools_from_those_that_drop_them() {
    for name in ["qwen2_5.jinja", "qwen3.jinja", "llama3_1.jinja"] {
        let source =
            std::fs::read_to_string(root().join("data/chat_templates").join(name)).unwrap();
        assert!(
            ChatTemplate::new(&source, Vec::new())
                .unwrap()
                .reads_tools(),
            "{name}"
        );
    }
    // SmolLM2-135M-Instruct's template (tokenizer_config.json), which has no tools branch.
    let smol = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
                {{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}\
                {{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}\
                {% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    let t = ChatTemplate::new(smol, Vec::new()).unwrap();
    assert!(!t.reads_tools());
    // A tool name in a string is not a read of the variable; `tools is defined` is.
    let t = ChatTemplate::new(
        "{{ 'tools' }}{% for m in messages %}{{ m.content }}{% endfor %}",
        Vec::new(),
    )
    .unwrap();
    assert!(!t.reads_tools());
    let t = ChatTemplate::new("{% if tools is defined %}T{% endif %}", Vec::new()).unwrap();
    assert!(t.reads_tools());
}

/// `env.observation_truncation` on a real byte-level BPE (Qwen2.5's tokenizer and template): a
/// tool reply of multi-byte text cut to fit 60 tokens keeps whole tokens of its own encoding
/// (the head's ids are the original's first ids), the marker, and a bridge that is the template's
/// rendering of exactly that, at most 60 tokens and as long as fits.
#[test]
fn a_long_tool_reply_is_cut_at_token_boundaries_of_a_byte_level_bpe() {
    use rlvr_env::truncate::{fit, Truncation, MARKER};
    let tok = tokenizer("qwen2.5", &Json::Null);
    let enc = |t: &str| -> Result<Vec<u32>, String> { Ok(encode(&tok, t)) };
    let spans = |t: &str| -> Result<Vec<(usize, usize)>, String> {
        Ok(tok.encode(t, false).unwrap().get_offsets().to_vec())
    };
    let source = std::fs::read_to_string(root().join("data/chat_templates/qwen2_5.jinja")).unwrap();
    let t = ChatTemplate::new(&source, vec![]).unwrap();
    let content = "行 7: 価格は¥1,234です 🚀 ok\n".repeat(20);
    let ms = [Message::new("tool", content.clone())];
    let mut render = |m: &[Message]| bridge(&t, "<|im_end|>", m, None, &enc);
    let whole = render(&ms).unwrap().ids.len();
    assert!(whole > 200, "{whole}");
    let ids = encode(&tok, &content);
    for side in [
        Truncation::KeepHead,
        Truncation::KeepTail,
        Truncation::KeepEnds,
    ] {
        let f = fit(&mut render, &ms, 60, side, &spans).unwrap().unwrap();
        let cut = &f.messages[0].content;
        assert!(f.bridge.ids.len() <= 60, "{side:?}: {}", f.bridge.ids.len());
        assert_eq!(f.bridge, render(&f.messages).unwrap());
        let (head, tail) = cut.split_once(MARKER).expect("the marker is written");
        // Each kept part is a run of whole tokens of the original's encoding.
        let (h, tl) = (encode(&tok, head), encode(&tok, tail));
        assert_eq!(f.cut_tokens + h.len() + tl.len(), ids.len(), "{side:?}");
        assert_eq!(&ids[..h.len()], &h[..], "{side:?}: {cut:?}");
        assert_eq!(&ids[ids.len() - tl.len()..], &tl[..], "{side:?}: {cut:?}");
        match side {
            Truncation::KeepHead => assert!(tail.is_empty() && !head.is_empty()),
            Truncation::KeepTail => assert!(head.is_empty() && !tail.is_empty()),
            _ => assert!(h.len() == tl.len() || h.len() == tl.len() + 1, "{cut:?}"),
        }
        // As long as fits: one more token kept would not.
        let one_more = spans(&content).unwrap();
        if side == Truncation::KeepHead {
            let longer = format!("{}{MARKER}", &content[..one_more[h.len()].1]);
            let b = render(&[Message::new("tool", longer)]).unwrap();
            assert!(b.ids.len() > 60, "{side:?}: {}", b.ids.len());
        }
    }
}

/// A reset `dialogue` may show the model calling a tool (an assistant message's `tool_calls`,
/// in the chat-template form rlvr renders the model's own calls in) and the tool answering
/// (`tool` messages): Qwen2.5's template renders it into the prompt exactly as transformers
/// renders those messages (`<tool_call>` blocks, grouped `<tool_response>`s in a user turn),
/// with the episode's tools and the generation prompt. A call's `id` defaults to `call_<i>`,
/// `arguments` may be a string holding an object; a tool message that answers no call, or names
/// another call's id, and `tool_calls` on a non-assistant message are refused.
#[test]
fn a_reset_dialogue_with_tool_calls_renders_them_into_the_prompt() {
    use rlvr_env::protocol::parse_reset;
    let source = std::fs::read_to_string(root().join("data/chat_templates/qwen2_5.jinja")).unwrap();
    let t = ChatTemplate::new(&source, Vec::new()).unwrap();
    let reply = Json::parse(
        r#"{"id": "0:0", "dialogue": [
            {"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": "What is 6*7?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": {"expr": "6*7"}}}]},
            {"role": "tool", "name": "calc", "tool_call_id": "call_0", "content": "42"},
            {"role": "assistant", "content": "42"},
            {"role": "user", "content": "What is 3+5?"},
            {"role": "assistant", "content": "Both ways:", "tool_calls": [
                {"id": "a1", "function": {"name": "calc", "arguments": "{\"expr\": \"3+5\"}"}},
                {"id": "a2", "type": "function", "function": {"name": "calc", "arguments": {"expr": "5+3"}}}]},
            {"role": "tool", "tool_call_id": "a1", "content": "8"},
            {"role": "tool", "tool_call_id": "a2", "content": "8"},
            {"role": "assistant", "content": "8"},
            {"role": "user", "content": "What is 2+2?"}],
          "tools": [{"type": "function", "function": {"name": "calc",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]}"#,
    )
    .unwrap();
    let r = parse_reset(&reply, "0:0").unwrap();
    let dialogue = r.messages.unwrap();
    assert_eq!(dialogue[2].tool_calls[0].id, "call_0");
    assert_eq!(
        dialogue[6].tool_calls[0].arguments,
        Json::parse(r#"{"expr": "3+5"}"#).unwrap()
    );
    let text = t.render(&dialogue, r.tools.as_deref(), true).unwrap();
    let want = "<|im_start|>system\nUse the calculator.\n\n# Tools\n\nYou may call one or more \
        functions to assist with the user query.\n\nYou are provided with function signatures \
        within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": \
        {\"name\": \"calc\", \"parameters\": {\"type\": \"object\", \"properties\": {\"expr\": \
        {\"type\": \"string\"}}}}}\n</tools>\n\nFor each function call, return a json object \
        with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
        {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
        <|im_start|>user\nWhat is 6*7?<|im_end|>\n\
        <|im_start|>assistant\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \
        \"6*7\"}}\n</tool_call><|im_end|>\n\
        <|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n\
        <|im_start|>assistant\n42<|im_end|>\n\
        <|im_start|>user\nWhat is 3+5?<|im_end|>\n\
        <|im_start|>assistant\nBoth ways:\n<tool_call>\n{\"name\": \"calc\", \"arguments\": \
        {\"expr\": \"3+5\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calc\", \"arguments\": \
        {\"expr\": \"5+3\"}}\n</tool_call><|im_end|>\n\
        <|im_start|>user\n<tool_response>\n8\n</tool_response>\n<tool_response>\n8\n\
        </tool_response><|im_end|>\n\
        <|im_start|>assistant\n8<|im_end|>\n\
        <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
        <|im_start|>assistant\n";
    assert_eq!(text, want);

    let err = |dialogue: &str| {
        let v = Json::parse(&format!(r#"{{"id": "0:0", "dialogue": {dialogue}}}"#)).unwrap();
        parse_reset(&v, "0:0").unwrap_err().to_string()
    };
    let q = r#"{"role": "user", "content": "q"}"#;
    let call = r#"{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}"#;
    let e = err(&format!(
        r#"[{q}, {{"role": "tool", "content": "1"}}, {q}]"#
    ));
    assert!(
        e.contains("dialogue[1]") && e.contains("must answer the tool_calls"),
        "{e}"
    );
    let e = err(&format!(
        r#"[{q}, {call}, {{"role": "tool", "tool_call_id": "call_1", "content": "1"}}, {q}]"#
    ));
    assert!(
        e.contains("dialogue[2]") && e.contains("\"call_1\" names none"),
        "{e}"
    );
    let e = err(r#"[{"role": "user", "content": "q", "tool_calls": []}]"#);
    assert!(
        e.contains("dialogue[0]") && e.contains("only on an assistant message"),
        "{e}"
    );
    let e = err(&format!(
        r#"[{q}, {{"role": "assistant", "tool_calls": [{{"function": {{"name": "f", "arguments": "[1]"}}}}]}}, {q}]"#
    ));
    assert!(
        e.contains("tool_calls[0]") && e.contains("does not hold a JSON object"),
        "{e}"
    );
    // `messages` stays system and user messages only.
    let v = Json::parse(&format!(r#"{{"id": "0:0", "messages": [{q}, {call}]}}"#)).unwrap();
    assert!(parse_reset(&v, "0:0").is_err());
}
