//! Prompt templates: plain text, or chat messages rendered by a caller-supplied chat template.
//!
//! A template is text with `{name}` placeholders ([`crate::placeholders`]) filled from the
//! problem's variables. Plain style joins the system prompt, each few-shot example (its rendered question, a newline, its
//! answer) and the rendered question with blank lines. Chat style builds messages — system (if any),
//! then a user/assistant pair per few-shot example, then the user question — and hands them to the
//! renderer with `add_generation_prompt = true` (so this crate needs no tokenizer or model).

use crate::config::{DataConfig, FewShotExample, PromptStyle};
pub use crate::placeholders::{check_template, fill};
use crate::{DataError, Result};
use serde::{Deserialize, Serialize};

/// One chat message (the shape HF chat templates take).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.into(),
        }
    }
}

/// A chat template renderer: `(messages, add_generation_prompt) -> prompt text`, usually the
/// model's HF chat template.
pub type ChatRenderer<'a> = &'a dyn Fn(&[ChatMessage], bool) -> anyhow::Result<String>;

/// Builds prompts from problems (the template part of [`DataConfig`]).
#[derive(Debug, Clone)]
pub struct PromptBuilder {
    /// Plain or chat.
    pub style: PromptStyle,
    /// The template text.
    pub template: String,
    /// Optional system prompt.
    pub system_prompt: Option<String>,
    /// Few-shot examples.
    pub few_shot: Vec<FewShotExample>,
}

impl PromptBuilder {
    /// The builder a `[data]` config describes.
    pub fn from_config(cfg: &DataConfig) -> Self {
        PromptBuilder {
            style: cfg.style,
            template: cfg.template().to_string(),
            system_prompt: cfg.system_prompt.clone(),
            few_shot: cfg.few_shot.clone(),
        }
    }

    /// The chat messages of a problem with variables `vars` (also used for plain style's layout).
    ///
    /// # Errors
    /// As [`fill`].
    pub fn messages(&self, vars: &[(String, String)]) -> Result<Vec<ChatMessage>> {
        let mut msgs = Vec::new();
        if let Some(s) = &self.system_prompt {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        for ex in &self.few_shot {
            let mut ex_vars = vars.to_vec();
            ex_vars.retain(|(k, _)| k != "question");
            ex_vars.push(("question".into(), ex.question.clone()));
            msgs.push(ChatMessage::new("user", fill(&self.template, &ex_vars)?));
            msgs.push(ChatMessage::new("assistant", ex.answer.clone()));
        }
        msgs.push(ChatMessage::new("user", fill(&self.template, vars)?));
        Ok(msgs)
    }

    /// The prompt text of a problem.
    ///
    /// # Errors
    /// [`DataError::Template`] as [`fill`], or in chat style when `renderer` is `None` or fails.
    pub fn render(
        &self,
        vars: &[(String, String)],
        renderer: Option<ChatRenderer<'_>>,
    ) -> Result<String> {
        let msgs = self.messages(vars)?;
        match self.style {
            PromptStyle::Plain => {
                let mut parts: Vec<String> = Vec::new();
                let mut it = msgs.iter().peekable();
                while let Some(m) = it.next() {
                    if m.role == "user" && it.peek().is_some_and(|n| n.role == "assistant") {
                        let a = it.next().expect("peeked");
                        parts.push(format!("{}\n{}", m.content, a.content));
                    } else {
                        parts.push(m.content.clone());
                    }
                }
                Ok(parts.join("\n\n"))
            }
            PromptStyle::Chat => chat(&msgs, renderer),
        }
    }

    /// The prompt text of a row that carries its own chat messages (TRL GRPOTrainer's
    /// conversational `prompt`, verl's `prompt` column): `messages` rendered by the chat template
    /// with the generation prompt, as they are — exactly what [`PromptBuilder::render`] gives in
    /// chat style for the same messages built from a question, a system prompt and few-shot
    /// examples. The builder's template, system prompt and few-shot examples are not used
    /// ([`crate::dataset::load_file`] refuses such rows when they are set).
    ///
    /// # Errors
    /// [`DataError::Template`] in plain style (messages need a chat template), or when `renderer`
    /// is `None` or fails.
    pub fn render_messages(
        &self,
        messages: &[ChatMessage],
        renderer: Option<ChatRenderer<'_>>,
    ) -> Result<String> {
        match self.style {
            PromptStyle::Plain => Err(DataError::Template(
                "the row holds chat messages, which need data.style = \"chat\"".into(),
            )),
            PromptStyle::Chat => chat(messages, renderer),
        }
    }
}

/// `messages` rendered by `renderer` with the generation prompt.
fn chat(messages: &[ChatMessage], renderer: Option<ChatRenderer<'_>>) -> Result<String> {
    let r = renderer.ok_or_else(|| {
        DataError::Template(
            "data.style = \"chat\" needs the model's chat template (none was given); use style = \"plain\" for models without one".into(),
        )
    })?;
    r(messages, true).map_err(|e| DataError::Template(format!("chat template failed: {e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(q: &str) -> Vec<(String, String)> {
        vec![("question".into(), q.into())]
    }

    #[test]
    fn plain_and_chat() {
        let b = PromptBuilder {
            style: PromptStyle::Plain,
            template: "Q: {question}".into(),
            system_prompt: Some("Be brief.".into()),
            few_shot: vec![FewShotExample {
                question: "1+1".into(),
                answer: "2".into(),
            }],
        };
        assert_eq!(
            b.render(&vars("2+2"), None).unwrap(),
            "Be brief.\n\nQ: 1+1\n2\n\nQ: 2+2"
        );
        let chat = PromptBuilder {
            style: PromptStyle::Chat,
            ..b
        };
        let r = |m: &[ChatMessage], g: bool| -> anyhow::Result<String> {
            Ok(m.iter()
                .map(|m| format!("<{}>{}", m.role, m.content))
                .collect::<String>()
                + if g { "<assistant>" } else { "" })
        };
        assert_eq!(
            chat.render(&vars("2+2"), Some(&r)).unwrap(),
            "<system>Be brief.<user>Q: 1+1<assistant>2<user>Q: 2+2<assistant>"
        );
        assert!(chat.render(&vars("2+2"), None).is_err());
        // A row's own messages render as the same messages built from the question.
        let own = chat.messages(&vars("2+2")).unwrap();
        assert_eq!(
            chat.render_messages(&own, Some(&r)).unwrap(),
            chat.render(&vars("2+2"), Some(&r)).unwrap()
        );
        let plain = PromptBuilder {
            style: PromptStyle::Plain,
            ..chat
        };
        let e = plain.render_messages(&own, Some(&r)).unwrap_err();
        assert!(e.to_string().contains("need data.style = \"chat\""), "{e}");
    }
}
