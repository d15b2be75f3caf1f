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
            if !matches!(k.as_str(), "role" | "content" | "name" | "tool_call_id") {
                return Err(format!(
                    "a message has the key {k:?} (known: role, content, name, tool_call_id)"
                ));
            }
        }
        Ok(Message {
            role,
            content: text("content")?.unwrap_or_default(),
            tool_calls: Vec::new(),
            name: text("name")?,
            tool_call_id: text("tool_call_id")?,
        })
    }
}
