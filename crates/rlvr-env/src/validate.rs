//! Checks rlvr applies to every environment's replies: a group's `reset` replies are identical,
//! and observations carry no special-token strings.

use crate::protocol::{EpisodeResult, Message, ResetEpisode, ResetReply};
use crate::EnvError;

/// Checks that the episodes of each group got the same `reset` reply (messages and tools);
/// episodes whose reply is an error are left out of the comparison.
///
/// # Errors
/// [`EnvError::Group`] naming the group, two of its episodes and what differs.
pub fn check_groups(
    episodes: &[ResetEpisode],
    replies: &[EpisodeResult<ResetReply>],
) -> Result<(), EnvError> {
    let mut first: Vec<(&str, &str, &ResetReply)> = Vec::new();
    for (e, r) in episodes.iter().zip(replies) {
        let Ok(r) = r else { continue };
        match first.iter().find(|(g, _, _)| *g == e.group) {
            None => first.push((&e.group, &e.id, r)),
            Some((g, id, r0)) => {
                let what = if r0.messages != r.messages {
                    "messages"
                } else if r0.tools != r.tools {
                    "tools"
                } else {
                    continue;
                };
                return Err(EnvError::Group(format!(
                    "the reset replies of group {g:?} differ: episodes {id:?} and {:?} got \
                     different {what}. The K episodes of a group share the seed and must start \
                     from one state (a group-relative baseline compares them): make reset depend \
                     on the row and the seed only",
                    e.id
                )));
            }
        }
    }
    Ok(())
}

/// The first of `specials` (the tokenizer's special tokens, as text) that occurs in the
/// content, name or tool call id of `messages`, or in the id, name or arguments (as compact
/// JSON) of an assistant message's tool calls (a reset `dialogue`'s), with where:
/// `(token, "messages[1].content")`, `(token, "messages[2].tool_calls[0].arguments")`.
/// Encoded as part of a bridge or a prompt, such a string would become the control token itself.
pub fn find_special_token<'a>(
    messages: &[Message],
    specials: &'a [String],
) -> Option<(&'a str, String)> {
    for (i, m) in messages.iter().enumerate() {
        let mut fields: Vec<(String, Option<std::borrow::Cow<'_, str>>)> = vec![
            ("content".into(), Some(m.content.as_str().into())),
            ("name".into(), m.name.as_deref().map(Into::into)),
            (
                "tool_call_id".into(),
                m.tool_call_id.as_deref().map(Into::into),
            ),
        ];
        for (j, c) in m.tool_calls.iter().enumerate() {
            fields.push((format!("tool_calls[{j}].id"), Some(c.id.as_str().into())));
            fields.push((
                format!("tool_calls[{j}].name"),
                Some(c.name.as_str().into()),
            ));
            fields.push((
                format!("tool_calls[{j}].arguments"),
                Some(c.arguments.to_compact().into()),
            ));
        }
        for (field, text) in &fields {
            let Some(text) = text else { continue };
            if let Some(t) = specials
                .iter()
                .find(|t| !t.is_empty() && text.contains(t.as_str()))
            {
                return Some((t, format!("messages[{i}].{field}")));
            }
        }
    }
    None
}

/// [`find_special_token`] as an episode's error message.
///
/// # Errors
/// The message naming the token and the field.
pub fn refuse_special_tokens(messages: &[Message], specials: &[String]) -> Result<(), String> {
    match find_special_token(messages, specials) {
        None => Ok(()),
        Some((t, at)) => Err(format!(
            "the observation holds the special token {t:?} (at {at}); it would be encoded as that \
             control token, so rlvr refuses it: the environment must escape or drop it"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Json;

    fn ep(id: &str, group: &str) -> ResetEpisode {
        ResetEpisode {
            id: id.into(),
            group: group.into(),
            sample: 0,
            seed: 1,
            row: Json::Object(vec![]),
            prompt: None,
        }
    }

    #[test]
    fn groups_must_agree_and_errors_are_skipped() {
        let eps = [
            ep("1:0", "1"),
            ep("1:1", "1"),
            ep("2:0", "2"),
            ep("1:2", "1"),
        ];
        let a = ResetReply {
            messages: Some(vec![Message::new("user", "a")]),
            tools: None,
        };
        let b = ResetReply {
            messages: Some(vec![Message::new("user", "b")]),
            tools: None,
        };
        let ok = [Ok(a.clone()), Err("x".into()), Ok(b.clone()), Ok(a.clone())];
        check_groups(&eps, &ok).unwrap();
        let bad = [Ok(a.clone()), Ok(a), Ok(b.clone()), Ok(b)];
        let e = check_groups(&eps, &bad).unwrap_err().to_string();
        assert!(
            e.contains("group \"1\"")
                && e.contains("\"1:0\" and \"1:2\"")
                && e.contains("messages"),
            "{e}"
        );
    }

    #[test]
    fn special_tokens_are_named_with_their_field() {
        let specials = vec!["<|im_end|>".to_string(), "<|im_start|>".to_string()];
        let mut m = Message::new("tool", "fine");
        assert_eq!(
            find_special_token(std::slice::from_ref(&m), &specials),
            None
        );
        m.name = Some("x<|im_start|>".into());
        let e = refuse_special_tokens(&[Message::new("user", "ok"), m], &specials).unwrap_err();
        assert!(
            e.contains("\"<|im_start|>\"") && e.contains("messages[1].name"),
            "{e}"
        );
    }
}
