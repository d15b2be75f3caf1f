//! Chat messages and tool calls: what the protocol carries, the chat template renders and the
//! tool-call parsers produce (re-exported by [`crate::protocol`]).

use crate::json::Json;

/// One tool call of an assistant turn, as rlvr parsed it (`env.tool_format`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// `call_0`, `call_1`, ... in the order of the turn's text.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments object, keys in the order the model wrote them.
    pub arguments: Json,
}

impl ToolCall {
    /// The step request's form: `{"id", "name", "arguments"}`.
    pub fn to_json(&self) -> Json {
        Json::object([
            ("id", Json::from(self.id.as_str())),
            ("name", Json::from(self.name.as_str())),
            ("arguments", self.arguments.clone()),
        ])
    }

    /// The chat-template form (OpenAI's, which HF templates read):
    /// `{"id", "type": "function", "function": {"name", "arguments"}}`.
    pub fn to_template_json(&self) -> Json {
        Json::object([
            ("id", Json::from(self.id.as_str())),
            ("type", Json::from("function")),
            (
                "function",
                Json::object([
                    ("name", Json::from(self.name.as_str())),
                    ("arguments", self.arguments.clone()),
                ]),
            ),
        ])
    }
}

impl ToolCall {
    /// A tool call in the chat-template form ([`ToolCall::to_template_json`]), as an assistant
    /// message of a reset `dialogue` gives it: `{"id", "type": "function", "function": {"name",
    /// "arguments"}}`, `id` optional (`call_<index>`, `index` its place in the message, as rlvr
    /// numbers a turn's calls), `type` optional (only `"function"`), `arguments` an object or a
    /// string holding one (read as that object, keys in their order; absent: `{}`).
    ///
    /// # Errors
    /// Why `v` is not such a call (which field, what it was).
    pub fn from_template_json(v: &Json, index: usize) -> Result<ToolCall, String> {
        let Json::Object(kv) = v else {
            return Err(format!("a tool call must be an object, not {}", v.kind()));
        };
        for (k, _) in kv {
            if !matches!(k.as_str(), "id" | "type" | "function") {
                return Err(format!(
                    "a tool call has the key {k:?} (known: id, type, function)"
                ));
            }
        }
        let id = match v.get("id") {
            None | Some(Json::Null) => format!("call_{index}"),
            Some(Json::Str(s)) => s.clone(),
            Some(other) => return Err(format!("\"id\" must be a string, not {}", other.kind())),
        };
        match v.get("type") {
            None | Some(Json::Null) => {}
            Some(Json::Str(t)) if t == "function" => {}
            Some(other) => {
                return Err(format!(
                    "\"type\" must be \"function\", not {}",
                    other.to_compact()
                ))
            }
        }
        let f = match v.get("function") {
            Some(f @ Json::Object(fkv)) => {
                if let Some((k, _)) = fkv.iter().find(|(k, _)| k != "name" && k != "arguments") {
                    return Err(format!(
                        "its function has the key {k:?} (known: name, arguments)"
                    ));
                }
                f
            }
            Some(other) => {
                return Err(format!(
                    "\"function\" must be an object {{\"name\", \"arguments\"}}, not {}",
                    other.kind()
                ))
            }
            None => return Err("a tool call needs \"function\": {\"name\", \"arguments\"}".into()),
        };
        let name = match f.get("name") {
            Some(Json::Str(n)) if !n.is_empty() => n.clone(),
            Some(Json::Str(_)) => return Err("its function's \"name\" is empty".into()),
            Some(other) => {
                return Err(format!(
                    "its function's \"name\" must be a string, not {}",
                    other.kind()
                ))
            }
            None => return Err("its function needs a \"name\"".into()),
        };
        let arguments = match f.get("arguments") {
            None | Some(Json::Null) => Json::Object(Vec::new()),
            Some(a @ Json::Object(_)) => a.clone(),
            Some(Json::Str(text)) => match Json::parse(text) {
                Ok(a @ Json::Object(_)) => a,
                _ => {
                    return Err(format!(
                        "its function's \"arguments\" string does not hold a JSON object: \
                         {:?}",
                        text.chars().take(80).collect::<String>()
                    ))
                }
            },
            Some(other) => {
                return Err(format!(
                    "its function's \"arguments\" must be an object (or a string holding \
                     one), not {}",
                    other.kind()
                ))
            }
        };
        Ok(ToolCall {
            id,
            name,
            arguments,
        })
    }
}

/// One chat message: a prompt's, an assistant turn's, or an environment's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (empty for an assistant turn that only calls tools).
    pub content: String,
    /// An assistant turn's tool calls (rendered by the template as `tool_calls`).
    pub tool_calls: Vec<ToolCall>,
    /// A tool message's function name.
    pub name: Option<String>,
    /// A tool message's answer to this call id.
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with `role` and `content` and nothing else.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Message {
            role: role.to_string(),
            content: content.into(),
            tool_calls: Vec::new(),
            name: None,
            tool_call_id: None,
        }
    }

    /// The message as the chat template sees it (transformers' message dict): `role`, `content`,
    /// then `tool_calls`, `name`, `tool_call_id` where set.
    pub fn to_json(&self) -> Json {
        let mut kv = vec![
            ("role".to_string(), Json::from(self.role.as_str())),
            ("content".to_string(), Json::from(self.content.as_str())),
        ];
        if !self.tool_calls.is_empty() {
            kv.push((
                "tool_calls".into(),
                Json::Array(
                    self.tool_calls
                        .iter()
                        .map(ToolCall::to_template_json)
                        .collect(),
                ),
            ));
        }
        if let Some(n) = &self.name {
            kv.push(("name".into(), Json::from(n.as_str())));
        }
        if let Some(id) = &self.tool_call_id {
            kv.push(("tool_call_id".into(), Json::from(id.as_str())));
        }
        Json::Object(kv)
    }

    /// A message of an environment's reply, `allowed` naming the roles it may have.
    ///
    /// # Errors
    /// Why `v` is not such a message (which field, what it was).
    pub fn from_reply(v: &Json, allowed: &[&str]) -> Result<Message, String> {
        let Json::Object(kv) = v else {
            return Err(format!("a message must be an object, not {}", v.kind()));
        };
        let text = |key: &str| -> Result<Option<String>, String> {
            match v.get(key) {
                None | Some(Json::Null) => Ok(None),
                Some(Json::Str(s)) => Ok(Some(s.clone())),
                Some(other) => Err(format!(
                    "a message's \"{key}\" must be a string, not {}",
                    other.kind()
                )),
            }
        };
        let role = text("role")?.ok_or("a message needs a \"role\"")?;
        if !allowed.contains(&role.as_str()) {
            return Err(format!(
                "a message's role is {role:?}; here it must be one of {allowed:?}"
            ));
        }
        for (k, _) in kv {
            let known = matches!(k.as_str(), "role" | "content" | "name" | "tool_call_id")
                || (k == "tool_calls" && role == "assistant");
            if !known {
                let more = if k == "tool_calls" {
                    " (tool_calls only on an assistant message)"
                } else {
                    ""
                };
                return Err(format!(
                    "a message has the key {k:?} (known: role, content, name, tool_call_id,                      and tool_calls on an assistant message){more}"
                ));
            }
        }
        let tool_calls = match v.get("tool_calls") {
            None | Some(Json::Null) => Vec::new(),
            Some(Json::Array(calls)) => calls
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    ToolCall::from_template_json(c, i)
                        .map_err(|why| format!("its tool_calls[{i}]: {why}"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(format!(
                    "a message's \"tool_calls\" must be a list or null, not {}",
                    other.kind()
                ))
            }
        };
        Ok(Message {
            role,
            content: text("content")?.unwrap_or_default(),
            tool_calls,
            name: text("name")?,
            tool_call_id: text("tool_call_id")?,
        })
    }
}
