//! Tool calls parsed out of an assistant turn's text (`env.tool_format`).
//!
//! - [`ToolFormat::Hermes`]: Qwen2.5/Qwen3 (and NousResearch Hermes) write each call as
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, several per turn (the
//!   format their chat templates describe in the system prompt and render in history).
//! - [`ToolFormat::Llama3Json`]: Llama 3.1/3.2's JSON tool calling: the whole turn is one JSON
//!   object `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>` (Meta's
//!   llama-models prompt format docs; `arguments` is accepted for `parameters`).
//! - [`ToolFormat::None`]: no tools (games, user-feedback environments).
//!
//! Parsing reads the text once (each search starts where the last ended, and serde_json reads
//! each body once), so it is linear in the text's length; it never panics on any input
//! (property-tested), and returns the calls that parsed with one message per call that did not.

use crate::json::{dumps, DumpOptions, Json};
use crate::protocol::ToolCall;

/// How tool calls are written in assistant turns (`env.tool_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolFormat {
    /// `<tool_call>{json}</tool_call>`, several per turn (Qwen2.5, Qwen3, Hermes).
    Hermes,
    /// One `{"name", "parameters"}` object per turn, optionally after `<|python_tag|>` (Llama 3.1).
    Llama3Json,
    /// No tool calls are parsed.
    #[default]
    None,
}

impl ToolFormat {
    /// The format named `name` (`hermes`, `llama3_json`, `none`).
    ///
    /// # Errors
    /// An unknown name, listing the valid ones.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "hermes" => Ok(ToolFormat::Hermes),
            "llama3_json" => Ok(ToolFormat::Llama3Json),
            "none" => Ok(ToolFormat::None),
            other => Err(format!(
                "env.tool_format = {other:?} is not a tool-call format (valid: \"hermes\", \
                 \"llama3_json\", \"none\")"
            )),
        }
    }
}

/// The calls of one turn and the errors of those that did not parse.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedCalls {
    /// Calls in text order, with ids `call_0`, `call_1`, ... (numbered over calls that parsed).
    pub calls: Vec<ToolCall>,
    /// One message per call that did not parse, in text order.
    pub errors: Vec<String>,
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// The tool calls of `text` in `format` (see the module docs).
pub fn parse_tool_calls(format: ToolFormat, text: &str) -> ParsedCalls {
    match format {
        ToolFormat::Hermes => parse_hermes(text),
        ToolFormat::Llama3Json => parse_llama3(text),
        ToolFormat::None => ParsedCalls::default(),
    }
}

fn short(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// A call from a parsed body: `name` a non-empty string, arguments (under `args_key`, or
/// `alt_key`) an object or a string holding one; missing arguments are `{}`.
fn call_from(body: &str, args_key: &str, alt_key: &str, n: usize) -> Result<ToolCall, String> {
    let v = Json::parse(body).map_err(|e| format!("not JSON ({e}): {:?}", short(body)))?;
    if !matches!(v, Json::Object(_)) {
        return Err(format!("not a JSON object: {:?}", short(body)));
    }
    let name = match v.get("name") {
        Some(Json::Str(s)) if !s.is_empty() => s.clone(),
        Some(other) => {
            return Err(format!(
                "\"name\" must be a non-empty string, not {}",
                short(&other.to_compact())
            ))
        }
        None => return Err(format!("no \"name\": {:?}", short(body))),
    };
    let arguments = match v.get(args_key).or_else(|| v.get(alt_key)) {
        None | Some(Json::Null) => Json::Object(Vec::new()),
        Some(a @ Json::Object(_)) => a.clone(),
        Some(Json::Str(s)) => match Json::parse(s) {
            Ok(a @ Json::Object(_)) => a,
            _ => {
                return Err(format!(
                    "\"{args_key}\" of {name:?} is a string that is not a JSON object: {:?}",
                    short(s)
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "\"{args_key}\" of {name:?} must be an object, not {}",
                other.kind()
            ))
        }
    };
    Ok(ToolCall {
        id: format!("call_{n}"),
        name,
        arguments,
    })
}

fn parse_hermes(text: &str) -> ParsedCalls {
    let mut out = ParsedCalls::default();
    let mut rest = text;
    while let Some(i) = rest.find(OPEN) {
        let after = &rest[i + OPEN.len()..];
        let Some(j) = after.find(CLOSE) else {
            out.errors.push(format!(
                "`{OPEN}` without `{CLOSE}`: {:?}",
                short(after.trim())
            ));
            break;
        };
        let body = after[..j].trim();
        match call_from(body, "arguments", "parameters", out.calls.len()) {
            Ok(c) => out.calls.push(c),
            Err(e) => out.errors.push(format!(
                "tool call {}: {e}",
                out.calls.len() + out.errors.len() + 1
            )),
        }
        rest = &after[j + CLOSE.len()..];
    }
    out
}

fn parse_llama3(text: &str) -> ParsedCalls {
    let mut out = ParsedCalls::default();
    let t = text.trim_start();
    let (tagged, body) = match t.strip_prefix(PYTHON_TAG) {
        Some(b) => (true, b.trim()),
        None => (false, t.trim_end()),
    };
    // A plain answer is not a failed call; a tagged turn or one that opens an object is a call.
    if !tagged && !body.starts_with('{') {
        return out;
    }
    match call_from(body, "parameters", "arguments", 0) {
        Ok(c) => out.calls.push(c),
        Err(e) => out.errors.push(format!("tool call 1: {e}")),
    }
    out
}

/// The text a model writes for `calls` in `format` (the inverse of [`parse_tool_calls`] for
/// calls with object arguments): Hermes blocks joined by newlines as Qwen2.5's template renders
/// them, or Llama 3's one object (only the first call). Empty for [`ToolFormat::None`].
pub fn render_tool_calls(format: ToolFormat, calls: &[ToolCall]) -> String {
    let py = DumpOptions::python();
    let body = |c: &ToolCall, key: &str| {
        format!(
            "{{\"name\": {}, \"{key}\": {}}}",
            dumps(&Json::from(c.name.as_str()), &py),
            dumps(&c.arguments, &py)
        )
    };
    match format {
        ToolFormat::Hermes => calls
            .iter()
            .map(|c| format!("{OPEN}\n{}\n{CLOSE}", body(c, "arguments")))
            .collect::<Vec<_>>()
            .join("\n"),
        ToolFormat::Llama3Json => calls
            .first()
            .map(|c| body(c, "parameters"))
            .unwrap_or_default(),
        ToolFormat::None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_several_calls_and_errors() {
        let text = "I'll compute.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"3*7\", \"a\": 1}}\n</tool_call>\n\
                    <tool_call>{\"name\": \"calc\"}</tool_call><tool_call>{oops}</tool_call>\
                    <tool_call>{\"name\": \"s\", \"arguments\": \"{\\\"q\\\": 2}\"}</tool_call><tool_call>{\"name\":";
        let p = parse_tool_calls(ToolFormat::Hermes, text);
        let names: Vec<_> = p
            .calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [("call_0", "calc"), ("call_1", "calc"), ("call_2", "s")]
        );
        assert_eq!(p.calls[0].arguments.to_compact(), r#"{"expr":"3*7","a":1}"#);
        assert_eq!(p.calls[1].arguments, Json::Object(vec![]));
        assert_eq!(p.calls[2].arguments.to_compact(), r#"{"q":2}"#);
        assert_eq!(p.errors.len(), 2, "{:?}", p.errors);
        assert!(p.errors[0].contains("not JSON"), "{:?}", p.errors);
        assert!(
            p.errors[1].contains("without `</tool_call>`"),
            "{:?}",
            p.errors
        );
    }

    #[test]
    fn llama3_json_with_and_without_python_tag() {
        let p = parse_tool_calls(
            ToolFormat::Llama3Json,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        );
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].arguments.to_compact(), r#"{"city":"Paris"}"#);
        let p = parse_tool_calls(
            ToolFormat::Llama3Json,
            " {\"name\": \"f\", \"arguments\": {}} ",
        );
        assert_eq!((p.calls.len(), p.errors.len()), (1, 0));
        let p = parse_tool_calls(ToolFormat::Llama3Json, "The answer is 4.");
        assert_eq!(p, ParsedCalls::default());
        let p = parse_tool_calls(ToolFormat::Llama3Json, "{\"parameters\": {}}");
        assert!(p.errors[0].contains("no \"name\""), "{:?}", p.errors);
        assert_eq!(
            parse_tool_calls(ToolFormat::None, OPEN),
            ParsedCalls::default()
        );
    }
}
