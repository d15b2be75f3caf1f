//! Chat templates with tools, rendered as transformers' `apply_chat_template(..., tokenize=False)`
//! renders them (transformers `utils/chat_template_utils.py`, read at 5.25.0).
//!
//! The environment is the one transformers compiles, built by [`rlvr_template::environment`] (the
//! same one rlvr-model renders prompts in): `trim_blocks` and `lstrip_blocks`, Python string
//! methods, `raise_exception(msg)`, a fixed `strftime_now(fmt)` (pass `date_string` in the kwargs
//! where a template prints one), and a `tojson` that is Python's `json.dumps` with transformers'
//! defaults. Tool schemas, tool-call arguments and messages reach the template as maps that keep
//! their key order, as Python dicts do.
//!
//! The variables are those transformers passes: `messages`, `tools` (none when there are none),
//! `add_generation_prompt`, the special tokens (`bos_token`, `eos_token`, ...) and the
//! `template_kwargs` (`env.template_kwargs`, e.g. `enable_thinking`).
//!

use crate::json::Json;
use crate::protocol::Message;
use crate::EnvError;
use minijinja::value::Value;
pub use rlvr_template::to_value;

/// The most template instructions one rendering may execute (a template that loops without end
/// stops with an error).
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// A renderer of a rendering's payload ([`render_payload`]'s input, JSON text) to the text or the
/// error's message.
pub type Renderer = fn(&str) -> Result<String, String>;

/// Where [`ChatTemplate::render_json`] sends every rendering, once set: the `rlvr` binary's
/// template worker, a process with bounded memory and stack (rlvr-model's `template_sandbox`), so
/// that a hostile template fails its turn instead of aborting rlvr. Unset (tests, library users),
/// templates render in this process.
pub static RENDERER: std::sync::OnceLock<Renderer> = std::sync::OnceLock::new();

/// One rendering as data: what [`render_payload`] reads (JSON objects keep their key order).
#[derive(serde::Serialize, serde::Deserialize)]
struct Payload {
    source: String,
    vars: Vec<(String, Json)>,
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    add_generation_prompt: bool,
}

/// Renders a payload written by [`ChatTemplate::render_json`] in this process: what the template
/// worker runs for it.
///
/// # Errors
/// A malformed payload; the template's own errors, as [`ChatTemplate::render_json`] words them.
pub fn render_payload(payload: &str) -> Result<String, String> {
    let p: Payload =
        serde_json::from_str(payload).map_err(|e| format!("a malformed rendering payload: {e}"))?;
    let t = ChatTemplate::new(&p.source, p.vars).map_err(|e| e.to_string())?;
    t.render_here(&p.messages, p.tools.as_deref(), p.add_generation_prompt)
        .map_err(|e| match e {
            EnvError::Template(m) => m,
            other => other.to_string(),
        })
}

/// A compiled chat template and the variables it renders with besides the conversation.
pub struct ChatTemplate {
    /// The template's source, sent with each rendering to a [`RENDERER`].
    source: String,
    env: minijinja::Environment<'static>,
    /// Special tokens and template kwargs: (name, value), passed as variables.
    vars: Vec<(String, Json)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("vars", &self.vars)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` (a chat template) with the variables `vars`: the special tokens
    /// (`("bos_token", "<s>")`, ...) and the template kwargs (`("enable_thinking", false)`).
    ///
    /// # Errors
    /// [`EnvError::Template`] when the template does not parse.
    pub fn new(source: &str, vars: Vec<(String, Json)>) -> Result<Self, EnvError> {
        let mut env = rlvr_template::environment(TEMPLATE_FUEL);
        env.add_template_owned("chat".to_string(), source.to_string())
            .map_err(|e| EnvError::Template(format!("{e:#}")))?;
        Ok(ChatTemplate {
            source: source.to_string(),
            env,
            vars,
        })
    }

    /// Whether the template reads the `tools` variable at all (minijinja's undeclared variables
    /// of the template). One that does not (SmolLM2's, for one) renders no tool schemas: the
    /// model never sees the tools an environment gives.
    pub fn reads_tools(&self) -> bool {
        self.env
            .get_template("chat")
            .is_ok_and(|t| t.undeclared_variables(false).contains("tools"))
    }

    /// Renders `messages` with `tools` (OpenAI-style schemas, or `None`) and the generation
    /// prompt when `add_generation_prompt`.
    ///
    /// # Errors
    /// [`EnvError::Template`]: the template raised, failed, or ran out of fuel.
    pub fn render(
        &self,
        messages: &[Message],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
    ) -> Result<String, EnvError> {
        let msgs: Vec<Json> = messages.iter().map(Message::to_json).collect();
        self.render_json(&msgs, tools, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] over messages given as JSON objects (any keys, e.g.
    /// `reasoning_content`).
    ///
    /// # Errors
    /// As [`ChatTemplate::render`].
    pub fn render_json(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
    ) -> Result<String, EnvError> {
        match RENDERER.get() {
            Some(render) => {
                let payload = serde_json::to_string(&Payload {
                    source: self.source.clone(),
                    vars: self.vars.clone(),
                    messages: messages.to_vec(),
                    tools: tools.map(<[Json]>::to_vec),
                    add_generation_prompt,
                })
                .map_err(|e| EnvError::Template(e.to_string()))?;
                render(&payload).map_err(EnvError::Template)
            }
            None => self.render_here(messages, tools, add_generation_prompt),
        }
    }

    /// [`ChatTemplate::render_json`] in this process.
    fn render_here(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
    ) -> Result<String, EnvError> {
        let tpl = self
            .env
            .get_template("chat")
            .map_err(|e| EnvError::Template(format!("{e:#}")))?;
        let mut ctx: Vec<(String, Value)> = self
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), to_value(v)))
            .collect();
        ctx.push((
            "messages".into(),
            Value::from(messages.iter().map(to_value).collect::<Vec<_>>()),
        ));
        ctx.push((
            "tools".into(),
            tools.map_or(Value::from(()), |t| {
                Value::from(t.iter().map(to_value).collect::<Vec<_>>())
            }),
        ));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let ctx: std::collections::BTreeMap<String, Value> = ctx.into_iter().collect();
        tpl.render(ctx).map_err(|e| {
            EnvError::Template(if e.kind() == minijinja::ErrorKind::OutOfFuel {
                format!(
                    "rendering ran past {TEMPLATE_FUEL} template instructions (a loop that does \
                     not end?): {e:#}"
                )
            } else {
                format!("{e:#}")
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_is_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ tools[0] | tojson(sort_keys=true, separators=[',', ':']) }}|{% for k in tools[0] %}{{ k }}{% endfor %}",
            vec![],
        )
        .unwrap();
        let tool = Json::parse(r#"{"z": "<a&b>'é", "a": [1.0, 2, null, true]}"#).unwrap();
        let out = t.render(&[], Some(&[tool]), false).unwrap();
        assert_eq!(
            out,
            "{\"z\": \"<a&b>'é\", \"a\": [1.0, 2, null, true]}|{\n  \"z\": \"<a&b>'é\",\n  \"a\": [\n    1.0,\n    2,\n    null,\n    true\n  ]\n}|{\"a\":[1.0,2,null,true],\"z\":\"<a&b>'é\"}|za"
        );
    }

    #[test]
    fn messages_carry_tool_fields_and_kwargs_reach_the_template() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls is defined %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% if m.name is defined %}[{{ m.name }}/{{ m.tool_call_id }}]{% endif %};{% endfor %}{{ flag }}{{ bos_token }}{% if tools is none %}N{% endif %}",
            vec![("flag".into(), Json::Bool(false)), ("bos_token".into(), Json::from("<s>"))],
        )
        .unwrap();
        let mut a = Message::new("assistant", "");
        a.tool_calls.push(crate::protocol::ToolCall {
            id: "call_0".into(),
            name: "calc".into(),
            arguments: Json::parse(r#"{"x": 1, "b": 2}"#).unwrap(),
        });
        let mut tool = Message::new("tool", "3");
        tool.name = Some("calc".into());
        tool.tool_call_id = Some("call_0".into());
        let out = t.render(&[a, tool], None, false).unwrap();
        assert_eq!(
            out,
            "assistant:{\"x\": 1, \"b\": 2};tool:3[calc/call_0];False<s>N"
        );
        let e = ChatTemplate::new("{{ raise_exception('no') }}", vec![])
            .unwrap()
            .render(&[], None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no"), "{e}");
    }
}
