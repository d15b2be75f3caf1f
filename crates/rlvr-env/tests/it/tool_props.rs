//! Tool-call parsers never panic on any text and read back the calls they render.

use proptest::prelude::*;
use rlvr_env::json::Json;
use rlvr_env::protocol::ToolCall;
use rlvr_env::tools::{parse_tool_calls, render_tool_calls, ToolFormat};

const FORMATS: [ToolFormat; 3] = [ToolFormat::Hermes, ToolFormat::Llama3Json, ToolFormat::None];

/// Text built from the parsers' own delimiters and JSON punctuation, so that the interesting
/// paths (unclosed tags, half objects, nested braces) are reached often.
fn tricky_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("<tool_call>".to_string()),
        Just("</tool_call>".to_string()),
        Just("<|python_tag|>".to_string()),
        Just("{\"name\": \"f\", \"arguments\": ".to_string()),
        Just("{\"name\": ".to_string()),
        Just("\"parameters\": {}".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("\"".to_string()),
        Just("\\".to_string()),
        Just("\n".to_string()),
        "[a-z0-9 ,:\\[\\]]{0,6}",
        any::<String>(),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

fn leaf() -> impl Strategy<Value = Json> {
    prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(Json::Int),
        // Few digits: serde_json (built without `float_roundtrip`) may read a 17-digit decimal
        // 1 ulp off (json.rs's docs).
        (-1e4f64..1e4).prop_map(|x| Json::Float((x * 16.0).round() / 16.0)),
        any::<String>().prop_map(Json::Str),
    ]
}

fn value() -> impl Strategy<Value = Json> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4).prop_map(|kv| {
                // Distinct keys: a repeated key would keep its first place with its last value.
                let mut seen = std::collections::HashSet::new();
                Json::Object(
                    kv.into_iter()
                        .filter(|(k, _)| seen.insert(k.clone()))
                        .collect(),
                )
            }),
        ]
    })
}

fn calls() -> impl Strategy<Value = Vec<ToolCall>> {
    let call = (
        "[a-zA-Z_][a-zA-Z0-9_.-]{0,12}",
        prop::collection::vec(("[a-z_]{1,8}", value()), 0..4),
    );
    prop::collection::vec(call, 1..4).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (name, kv))| {
                let mut seen = std::collections::HashSet::new();
                ToolCall {
                    id: format!("call_{i}"),
                    name,
                    arguments: Json::Object(
                        kv.into_iter()
                            .filter(|(k, _)| seen.insert(k.clone()))
                            .collect(),
                    ),
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic_and_account_for_every_opened_call(text in tricky_text()) {
        for f in FORMATS {
            let p = parse_tool_calls(f, &text);
            for (i, c) in p.calls.iter().enumerate() {
                prop_assert_eq!(&c.id, &format!("call_{i}"));
                prop_assert!(!c.name.is_empty());
                prop_assert!(matches!(c.arguments, Json::Object(_)));
            }
            if f == ToolFormat::Hermes {
                // Every `<tool_call>` before the last closed one yields a call or an error.
                prop_assert!(p.calls.len() + p.errors.len() <= text.matches("<tool_call>").count());
            }
            if f == ToolFormat::None {
                prop_assert!(p.calls.is_empty() && p.errors.is_empty());
            }
        }
    }

    #[test]
    fn rendered_calls_parse_back(cs in calls(), before in "[a-zA-Z .]{0,20}") {
        let text = format!("{before}{}", render_tool_calls(ToolFormat::Hermes, &cs));
        let p = parse_tool_calls(ToolFormat::Hermes, &text);
        prop_assert!(p.errors.is_empty(), "{:?}", p.errors);
        prop_assert_eq!(&p.calls, &cs);
        let one = &cs[..1];
        let text = format!("<|python_tag|>{}", render_tool_calls(ToolFormat::Llama3Json, one));
        let p = parse_tool_calls(ToolFormat::Llama3Json, &text);
        prop_assert!(p.errors.is_empty(), "{:?}", p.errors);
        prop_assert_eq!(&p.calls[..], one);
    }
}

#[test]
fn parsing_is_linear_in_the_text() {
    // 200k unclosed-looking openings and braces: a quadratic parser would take minutes.
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>{".repeat(20_000)
        + &"<tool_call".repeat(20_000);
    let t0 = std::time::Instant::now();
    let p = parse_tool_calls(ToolFormat::Hermes, &text);
    assert_eq!((p.calls.len(), p.errors.len()), (20_000, 0));
    let p = parse_tool_calls(ToolFormat::Llama3Json, &"{".repeat(200_000));
    assert_eq!(p.errors.len(), 1);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t0.elapsed()
    );
}
