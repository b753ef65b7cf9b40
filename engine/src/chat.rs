//! Chat templates: a GGUF's `tokenizer.chat_template` (Jinja) rendered with minijinja, or ChatML
//! when the file has none.
//!
//! The environment mirrors what Hugging Face `transformers` gives templates: `trim_blocks` and
//! `lstrip_blocks` on, Python string/dict/list methods (`.strip()`, `.startswith()`, `.items()`,
//! ...) through minijinja-contrib's pycompat layer, a `raise_exception(message)` function, and the
//! variables `messages`, `add_generation_prompt`, `bos_token` and `eos_token`.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};

use crate::gguf::Gguf;
use crate::{Error, Result};

/// ChatML, used when a GGUF has no template: `<|im_start|>{role}\n{content}<|im_end|>\n` per
/// message, then `<|im_start|>assistant\n` when a generation prompt is asked for.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

const TEMPLATE_NAME: &str = "chat";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant` (templates may accept others, e.g. `tool`).
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Compiles a Jinja chat template; `bos_token` and `eos_token` are the texts the template sees
    /// under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(Error::ChatTemplate)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template in `tokenizer.chat_template`, or [`chatml`](Self::chatml) when it is absent.
    /// `bos_token`/`eos_token` are the texts of the tokens named by
    /// `tokenizer.ggml.bos_token_id`/`eos_token_id` (empty when absent).
    pub fn from_gguf(g: &Gguf) -> Result<ChatTemplate> {
        let token_text = |key: &str| -> String {
            let id = g.get(key).and_then(|v| v.as_u64());
            let tokens = g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array());
            match (id, tokens) {
                (Some(id), Some(tokens)) => usize::try_from(id)
                    .ok()
                    .and_then(|i| tokens.get(i))
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string(),
                _ => String::new(),
            }
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        match g.get("tokenizer.chat_template") {
            None => ChatTemplate::new(CHATML_TEMPLATE, &bos, &eos),
            Some(_) => ChatTemplate::new(g.get_str("tokenizer.chat_template")?, &bos, &eos),
        }
    }

    /// The ChatML template (with empty BOS/EOS texts).
    pub fn chatml() -> ChatTemplate {
        ChatTemplate::new(CHATML_TEMPLATE, "", "").expect("the ChatML template compiles")
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's reply
    /// starts.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role", Value::from(m.role.as_str()));
                map.insert("content", Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(ctx))
            .map_err(Error::ChatTemplate)
    }
}
