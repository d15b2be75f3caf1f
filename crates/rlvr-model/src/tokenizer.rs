//! Tokenizer (`tokenizer.json` via the `tokenizers` crate), special tokens and chat template
//! (`tokenizer_config.json`), EOS ids (`generation_config.json`), and chat-template rendering with
//! minijinja, matching transformers' `apply_chat_template`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ModelError, Result};

/// One chat message, as in transformers' `messages` lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// "system", "user" or "assistant".
    pub role: String,
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A tokenizer with the special tokens and chat template of its model directory.
#[derive(Clone)]
pub struct TokenizerBundle {
    pub tokenizer: tokenizers::Tokenizer,
    /// The default chat template text, if the checkpoint has one.
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    /// Every id that ends a completion: generation_config.json's `eos_token_id` (int or list),
    /// else config.json's, else the id of `eos_token`. Deduplicated, in that order.
    pub eos_ids: Vec<u32>,
    /// Padding id: `pad_token`'s id, else the first EOS id, else 0. Padding positions are always
    /// masked, so the value never reaches a loss (DESIGN.md section 5: pad == EOS must not mask
    /// a real EOS).
    pub pad_id: u32,
    /// Where the tokenizer was read from (for error messages).
    pub path: PathBuf,
    /// The model directory's generation_config.json as it was (`None` when it had none, or the
    /// bundle came from no model directory): written back byte for byte with checkpoints, so a
    /// plain `generate()` on one uses the base model's decoding defaults.
    pub generation_config: Option<String>,
}

/// A special-token field of tokenizer_config.json: a string or an AddedToken object.
fn token_str(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

pub use crate::error::{read_model_text, MAX_TOKENIZER_FILE_BYTES};

/// How many times longer (in bytes) a tokenizer's normalizer may make a text. Released
/// tokenizers stay within 3 (SentencePiece's `▁` for a space; Unicode NFKC's longest expansion,
/// 18 characters for one, is not met by text as a whole); a `Replace` that turns one byte into a
/// kilobyte, or a `Sequence` of doubling replacements, made rlvr try to allocate terabytes.
pub const MAX_NORMALIZER_GROWTH: usize = 64;

/// The text a normalizer is tried on at load: ASCII words and punctuation, digits, spaces and
/// newlines, accented Latin, Greek, CJK, an emoji and a compatibility ligature.
const NORMALIZER_PROBE: &str = "The quick brown fox, 12 + 35 = 47.\n  Caf\u{e9} na\u{ef}ve \
     \u{3b1}\u{3b2}\u{3b3} \u{6f22}\u{5b57} \u{1f600} \u{fb01}ne\ttab";

/// Checks a tokenizer.json `normalizer` (`at` names it in errors) for the settings that grow text
/// without bound: a `Replace` of an empty string, a replacement or a `Prepend` over 1 KiB, or a
/// chain whose growth factors (a `Replace`'s replacement over its pattern's length, a
/// `Prepend`'s length plus one) multiply past [`MAX_NORMALIZER_GROWTH`]. The normalizers without
/// such settings count 1.
///
/// # Errors
/// The first offending setting, by its path in the JSON.
fn check_normalizer_growth(n: Option<&Value>, at: &str) -> std::result::Result<(), String> {
    fn growth(n: &Value, at: &str) -> std::result::Result<f64, String> {
        let ty = n.get("type").and_then(Value::as_str).unwrap_or("");
        let long = |what: &str, len: usize| {
            format!(
                "{at} ({ty}): its {what} is {len} bytes, more than the 1024 rlvr accepts \
                 (released tokenizers use a few)"
            )
        };
        match ty {
            "Sequence" => {
                let mut f = 1.0;
                let list = n.get("normalizers").and_then(Value::as_array);
                for (i, c) in list.into_iter().flatten().enumerate() {
                    f *= growth(c, &format!("{at}.normalizers[{i}]"))?;
                }
                Ok(f)
            }
            "Replace" => {
                let content = n.get("content").and_then(Value::as_str).unwrap_or("");
                if content.len() > 1024 {
                    return Err(long("replacement", content.len()));
                }
                let pattern = n.get("pattern");
                match pattern
                    .and_then(|p| p.get("String"))
                    .and_then(Value::as_str)
                {
                    Some("") => Err(format!(
                        "{at} (Replace): an empty pattern would insert its replacement between \
                         every two characters"
                    )),
                    Some(p) => Ok((content.len() as f64 / p.len() as f64).max(1.0)),
                    // A regex matches at least one byte or nothing (the probe at load sees an
                    // empty match's growth).
                    None => Ok((content.len() as f64).max(1.0)),
                }
            }
            "Prepend" => {
                let p = n.get("prepend").and_then(Value::as_str).unwrap_or("");
                if p.len() > 1024 {
                    return Err(long("prefix", p.len()));
                }
                Ok(1.0 + p.len() as f64)
            }
            _ => Ok(1.0),
        }
    }
    let Some(n) = n.filter(|n| !n.is_null()) else {
        return Ok(());
    };
    let f = growth(n, at)?;
    if f > MAX_NORMALIZER_GROWTH as f64 {
        return Err(format!(
            "{at}: its steps can make a text up to {f:.0} times as long (their replacements over \
             their patterns, multiplied), more than the {MAX_NORMALIZER_GROWTH} rlvr accepts"
        ));
    }
    Ok(())
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = read_model_text(path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::Config {
            file: path.to_path_buf(),
            msg: format!("not valid JSON: {e}"),
        })
}

impl TokenizerBundle {
    /// Loads `tokenizer.json` (required), and `tokenizer_config.json`, `generation_config.json`,
    /// `config.json` when present, from the model directory `dir`.
    ///
    /// Errors: tokenizer.json is missing or malformed; a JSON file is malformed. Each names the file.
    pub fn load(dir: &Path) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.exists() {
            return Err(ModelError::MissingFile {
                path: tok_path,
                what: "tokenizer".into(),
            });
        }
        let tokenizer = Self::read_tokenizer(&tok_path)?;
        let tc = read_json(&dir.join("tokenizer_config.json"))?;
        let gc_path = dir.join("generation_config.json");
        let gc_text = if gc_path.exists() {
            Some(read_model_text(&gc_path)?)
        } else {
            None
        };
        let gc = match &gc_text {
            Some(t) => Some(
                serde_json::from_str::<Value>(t).map_err(|e| ModelError::Config {
                    file: gc_path.clone(),
                    msg: format!("not valid JSON: {e}"),
                })?,
            ),
            None => None,
        };
        let mc = read_json(&dir.join("config.json"))?;
        let get = |k: &str| tc.as_ref().and_then(|v| v.get(k));
        let chat_template = match get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: take "default" (transformers' choice), else the first.
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or(list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        };
        // transformers >= 4.43 may keep the template in chat_template.jinja.
        let chat_template = match chat_template {
            Some(t) => Some(t),
            None => {
                let p = dir.join("chat_template.jinja");
                if p.exists() {
                    Some(read_model_text(&p)?)
                } else {
                    None
                }
            }
        };
        let bos_token = token_str(get("bos_token"));
        let eos_token = token_str(get("eos_token"));
        let pad_token = token_str(get("pad_token"));
        let mut eos_ids = crate::config::ids(gc.as_ref().and_then(|v| v.get("eos_token_id")));
        if eos_ids.is_empty() {
            eos_ids = crate::config::ids(mc.as_ref().and_then(|v| v.get("eos_token_id")));
        }
        if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let mut seen = std::collections::HashSet::new();
        eos_ids.retain(|x| seen.insert(*x));
        let pad_id = pad_token
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
            .or(eos_ids.first().copied())
            .unwrap_or(0);
        Ok(Self {
            tokenizer,
            chat_template,
            bos_token,
            eos_token,
            pad_token,
            eos_ids,
            pad_id,
            path: tok_path,
            generation_config: gc_text,
        })
    }

    /// Reads a `tokenizer.json` file alone.
    pub fn read_tokenizer(path: &Path) -> Result<tokenizers::Tokenizer> {
        let text = read_model_text(path)?;
        let terr = |msg: String| ModelError::Tokenizer {
            file: path.to_path_buf(),
            msg,
        };
        let tokenizer = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| terr(e.to_string()))?;
        // The parse above succeeded, so this one does too; it reads the normalizer's settings.
        let json: Value = serde_json::from_str(&text).map_err(|e| terr(e.to_string()))?;
        check_normalizer_growth(json.get("normalizer"), "normalizer").map_err(terr)?;
        if let Some(n) = tokenizer.get_normalizer() {
            use tokenizers::Normalizer;
            let mut probe = tokenizers::NormalizedString::from(NORMALIZER_PROBE);
            n.normalize(&mut probe).map_err(|e| terr(e.to_string()))?;
            let grown = probe.get().len();
            if grown > MAX_NORMALIZER_GROWTH * NORMALIZER_PROBE.len() {
                return Err(terr(format!(
                    "its normalizer turns a {}-byte probe text into {grown} bytes, more than \
                     {MAX_NORMALIZER_GROWTH} times as long: a text of a few MB would need GBs \
                     (released tokenizers grow text by 3 times at most)",
                    NORMALIZER_PROBE.len()
                )));
            }
        }
        Ok(tokenizer)
    }

    /// Encodes `text`; `add_special_tokens` applies the post-processor (e.g. Llama's BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ModelError::Tokenizer {
                file: self.path.clone(),
                msg: e.to_string(),
            })
    }

    /// Decodes ids to text; `skip_special_tokens` drops tokens marked special.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer {
                file: self.path.clone(),
                msg: e.to_string(),
            })
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Renders `messages` with this checkpoint's chat template.
    ///
    /// Errors: the checkpoint has no chat template, or it fails to render.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tpl = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::Template {
                // The model directory: the template is looked for beside tokenizer.json.
                source_name: self
                    .path
                    .parent()
                    .unwrap_or(&self.path)
                    .display()
                    .to_string(),
                msg: "the model directory has no chat template (neither `chat_template` in \
                      tokenizer_config.json nor chat_template.jinja), so chat messages cannot be \
                      rendered: add one (an instruct model's), or use plain prompts"
                    .into(),
            })?;
        render_chat_template(
            tpl,
            messages,
            add_generation_prompt,
            self.bos_token.as_deref(),
            self.eos_token.as_deref(),
        )
    }
}

/// The most template instructions one rendering may execute ([`render_chat_template`]'s fuel).
/// Released chat templates render a prompt of a few messages in a few thousand; a template that
/// loops without end (nested `range(100000)` loops) stops here with an error instead of hanging
/// start-up.
pub const TEMPLATE_FUEL: u64 = 1_000_000;

/// Renders a HuggingFace Jinja chat template as transformers' `apply_chat_template(...,
/// tokenize=False)` does, in the environment transformers compiles ([`rlvr_template::environment`],
/// the one rlvr-env's environment templates render in too: `trim_blocks` and `lstrip_blocks`,
/// `raise_exception(msg)`, a fixed `strftime_now(fmt)`, Python string methods (`.strip()`,
/// `.startswith()`, ...) and Python's `json.dumps` as `tojson`) with the variables `messages`,
/// `add_generation_prompt`, `bos_token` and `eos_token`. One rendering executes at most
/// [`TEMPLATE_FUEL`] instructions.
///
/// In the `rlvr` binary the rendering runs in a worker process whose memory, stack and output
/// are bounded (the `template_sandbox` module, which sets [`RENDERER`]), so that a hostile template fails its prompt instead
/// of aborting rlvr; the text is the same either way.
///
/// Errors: the template does not parse, raises while rendering, runs out of fuel, or (in the
/// worker) passes its memory, stack or output bound.
pub fn render_chat_template(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<String> {
    let rendered = match RENDERER.get() {
        Some(render) => render(
            template,
            messages,
            add_generation_prompt,
            bos_token,
            eos_token,
        ),
        None => render_in_process(
            template,
            messages,
            add_generation_prompt,
            bos_token,
            eos_token,
        ),
    };
    rendered.map_err(|msg| ModelError::Template {
        source_name: "chat_template".into(),
        msg,
    })
}

/// A chat-template renderer: `(template, messages, add_generation_prompt, bos_token, eos_token)`
/// to the rendered text or the error's message.
pub type Renderer =
    fn(&str, &[Message], bool, Option<&str>, Option<&str>) -> std::result::Result<String, String>;

/// The renderer [`render_chat_template`] hands every template to, once set (the `rlvr` binary's
/// bounded worker process); unset, templates render in this process ([`render_in_process`]).
pub(crate) static RENDERER: std::sync::OnceLock<Renderer> = std::sync::OnceLock::new();

/// [`render_chat_template`] in this process (what the worker runs); errors as message text.
pub(crate) fn render_in_process(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> std::result::Result<String, String> {
    let terr = |e: minijinja::Error| {
        if e.kind() == minijinja::ErrorKind::OutOfFuel {
            format!(
                "rendering one prompt ran past {TEMPLATE_FUEL} template instructions and was \
                 stopped (a loop that does not end, or loops nested too deep?): {e:#}"
            )
        } else {
            format!("{e:#}")
        }
    };
    let mut env = rlvr_template::environment(TEMPLATE_FUEL);
    env.add_template("chat", template).map_err(terr)?;
    let tpl = env.get_template("chat").map_err(terr)?;
    let ctx = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token.unwrap_or(""),
        eos_token => eos_token.unwrap_or(""),
    };
    tpl.render(ctx).map_err(terr)
}

/// A plain ChatML template (no default system prompt), written by `rlvr init` when the
/// tokenizer directory has none.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
