//! Chat templates: a GGUF's `tokenizer.chat_template` (Jinja) rendered with minijinja, or ChatML
//! when the file has none.
//!
//! The environment mirrors what Hugging Face `transformers` gives templates: `trim_blocks` and
//! `lstrip_blocks` on, Python string/dict/list methods (`.strip()`, `.startswith()`, `.items()`,
//! ...) through minijinja-contrib's pycompat layer, a `raise_exception(message)` function, and the
//! variables `messages`, `add_generation_prompt`, `bos_token` and `eos_token`; Python's
//! `json.dumps` as `tojson`, and `strftime_now(format)` in local time.
//!
//! [`ChatTemplate::render_request`] renders OpenAI-style requests ([`RenderRequest`]) as
//! llama-server does: tools, tool calls and results, `chat_template_kwargs`, reasoning on or off,
//! assistant prefill. [`ChatTemplate::builtin`] gives llama-server's named templates
//! ([`builtin_names`]); [`split_reasoning`] and [`ReasoningStream`] split the reasoning out of
//! a reply, and [`harmony`] reads gpt-oss's replies (reasoning, content and tool calls).
//!
//! Templates come from model files, which are untrusted: rendering is bounded. Each render gets
//! fuel (minijinja instructions) and an output budget that grow with the conversation
//! ([`render_limits`]), and minijinja's recursion limit applies; a template that exceeds them
//! fails with [`Error::ChatTemplate`] instead of running away.
//!
//! Fuel does not bound what one instruction costs (a concatenation doubles a string; a few dozen
//! of them ask for terabytes), so a process that calls [`sandbox::init`] renders every template
//! it has not reviewed ([`ChatTemplate::is_reviewed`]) in a child process with a memory and a time
//! limit. A process must choose: one that called neither `init` nor
//! [`sandbox::render_in_process`] cannot render an unreviewed template
//! ([`Error::NoSandboxChoice`]).

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};

use crate::gguf::Gguf;
use crate::{Error, Result};

mod builtin;
mod clock;
pub mod harmony;
mod reasoning;
mod render;
pub mod sandbox;
pub mod tools;

pub use reasoning::{split_reasoning, ReasoningFormat, ReasoningStream, THINK_END, THINK_START};
pub use render::{prompt_opens_thinking, Reasoning, RenderRequest};

/// The names [`ChatTemplate::builtin`] knows, sorted: llama-server's `--chat-template` names.
pub fn builtin_names() -> &'static [&'static str] {
    builtin::names()
}

/// ChatML, used when a GGUF has no template: `<|im_start|>{role}\n{content}<|im_end|>\n` per
/// message, then `<|im_start|>assistant\n` when a generation prompt is asked for.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\
{%- endfor -%}\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

const TEMPLATE_NAME: &str = "chat";

/// BLAKE3 hashes of templates read and found to cost time and memory linear in the conversation:
/// they render in the calling process even when [`sandbox`] is on.
const REVIEWED: &[&str] = &[
    // SmolLM2-135M-Instruct (a ChatML variant with a default system message).
    "2ff3b438de276e44f744a575e323cd7c32a47e72d91baf30d965df0c307af35b",
];

/// Recursion depth (macros, includes, nested blocks) a template may reach.
const RECURSION_LIMIT: usize = 100;

/// The fuel (minijinja instructions) and output bytes a render of `messages` may use: a fixed
/// allowance plus a share per message and per byte of message text, far above what real chat
/// templates need (they spend tens of instructions per message and copy each text once or twice).
pub fn render_limits(messages: &[Message]) -> (u64, usize) {
    let text: usize = messages
        .iter()
        .map(|m| m.role.len() + m.content.len())
        .sum();
    limits_for(messages.len(), text)
}

/// [`render_limits`] for `items` messages and tools holding `text` bytes. Tools printed with
/// `tojson(indent=...)` grow by their indentation, hence the wider output allowance per byte.
fn limits_for(items: usize, text: usize) -> (u64, usize) {
    let fuel = 200_000 + 5_000 * items as u64 + text as u64 / 4;
    let output = 256 * 1024 + 8 * text;
    (fuel, output)
}

/// A `Vec` that refuses to grow past a limit.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            return Err(std::io::Error::other(format!(
                "rendered text exceeds {} bytes",
                self.limit
            )));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

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

/// A chat template, compiled in this process when it is reviewed or the sandbox is off, else
/// checked by the renderer and compiled here only if [`render_here`](Self::render_here) is
/// called (minijinja folds constants while compiling, which a hostile template makes take
/// minutes).
pub struct ChatTemplate {
    env: OnceLock<Environment<'static>>,
    source: String,
    bos_token: String,
    eos_token: String,
    reviewed: bool,
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

/// The environment transformers gives templates, with `source` compiled in it.
fn compile(source: &str) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_recursion_limit(RECURSION_LIMIT);
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", render::strftime_now);
    // transformers' `tojson` (Python's `json.dumps`), not minijinja's HTML-safe one.
    env.add_filter("tojson", render::tojson);
    let source = without_generation_tags(source);
    contain(|| env.add_template_owned(TEMPLATE_NAME, source)).map_err(Error::ChatTemplate)?;
    Ok(env)
}

/// `source` with transformers' `{% generation %}` ... `{% endgeneration %}` (which marks the
/// assistant's tokens for training masks and renders its body unchanged) as an always-true
/// `if`, keeping the tags' whitespace control.
fn without_generation_tags(source: &str) -> String {
    static TAGS: OnceLock<fancy_regex::Regex> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        fancy_regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("the pattern")
    });
    if !source.contains("generation") {
        return source.to_string();
    }
    tags.replace_all(source, |c: &fancy_regex::Captures| {
        let (open, close) = (&c[1], &c[3]);
        match c.get(2) {
            Some(_) => format!("{{%{open} endif {close}%}}"),
            None => format!("{{%{open} if true {close}%}}"),
        }
    })
    .into_owned()
}

/// Runs a minijinja call, turning a panic inside it into a template error. minijinja 2.24
/// multiplies lengths unchecked (`[x] * n * m`), which panics where overflow checks are on, in
/// constant folding at compile time as well as at render. The environment involved is fresh
/// (compile) or a per-render clone sharing only the immutable compiled template, so nothing
/// half-updated outlives the panic. The panic hook still reports it on stderr.
fn contain<T>(
    f: impl FnOnce() -> std::result::Result<T, JinjaError>,
) -> std::result::Result<T, JinjaError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("the template engine panicked: {message}"),
        ))
    })
}

fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Compiles a Jinja chat template; `bos_token` and `eos_token` are the texts the template sees
    /// under those names.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let hash = blake3::hash(source.as_bytes()).to_hex();
        let reviewed = source == CHATML_TEMPLATE || REVIEWED.contains(&hash.as_str());
        ChatTemplate::with_review(source, bos_token, eos_token, reviewed)
    }

    /// The built-in template `name` (one of [`builtin_names`]), reproducing the prompt format
    /// of llama.cpp's C++ template of that name; reviewed, so it renders in this process.
    pub fn builtin(name: &str, bos_token: &str, eos_token: &str) -> Option<ChatTemplate> {
        let source = builtin::source(name)?;
        ChatTemplate::with_review(&source, bos_token, eos_token, true).ok()
    }

    fn with_review(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        reviewed: bool,
    ) -> Result<ChatTemplate> {
        let t = ChatTemplate {
            env: OnceLock::new(),
            reviewed,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        };
        match sandbox::active() {
            Some(renderer) if !t.reviewed => renderer.check(&t)?,
            // Without a choice an unreviewed template is compiled nowhere: rendering it fails
            // with `Error::NoSandboxChoice`.
            _ if !t.reviewed && !sandbox::chosen() => {}
            _ => {
                let _ = t.env.set(compile(source)?);
            }
        }
        Ok(t)
    }

    /// The template in `tokenizer.chat_template`, or [`chatml`](Self::chatml) when it is absent.
    /// `bos_token`/`eos_token` are the texts of the tokens named by
    /// `tokenizer.ggml.bos_token_id`/`eos_token_id` (empty when absent).
    pub fn from_gguf(g: &Gguf) -> Result<ChatTemplate> {
        let token_text = |key: &str| -> String {
            let id = g.get(key).and_then(|v| v.as_u64());
            let tokens = g
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .and_then(|a| a.as_strs());
            match (id, tokens) {
                (Some(id), Some(tokens)) => usize::try_from(id)
                    .ok()
                    .and_then(|i| tokens.get(i))
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

    /// Whether this template is ChatML or one of the model templates reviewed for linear cost;
    /// others render in the [`sandbox`] when it is on.
    pub fn is_reviewed(&self) -> bool {
        self.reviewed
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's reply
    /// starts.
    ///
    /// Fails with [`Error::ChatTemplate`] when the template fails, or runs out of the fuel or
    /// output budget of [`render_limits`]; with [`Error::TemplateRenderer`] when the template
    /// rendered in the [`sandbox`] and failed there or ran past its limits.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        if self.reviewed {
            return self.render_here(messages, add_generation_prompt);
        }
        match sandbox::placement()? {
            Some(renderer) => renderer.render(self, messages, add_generation_prompt),
            None => self.render_here(messages, add_generation_prompt),
        }
    }

    /// Renders an OpenAI-style request: the template sees `messages` (text parts joined, tool
    /// calls' JSON-text `arguments` as mappings unless the template fails on those), `tools`
    /// (when non-empty), `add_generation_prompt`, `bos_token`, `eos_token`, `enable_thinking`
    /// (from the kwargs, else whether reasoning is not off), `date_string` and `datetime`
    /// (today, as llama-server provides them), and the request's kwargs.
    ///
    /// With `continue_final_message` and a final assistant message, the text ends where that
    /// message's content does. Otherwise, with reasoning off and a generation prompt that leaves
    /// a thinking block open (`<think>\n`, Command R7B's `<|START_THINKING|>`), the block is
    /// closed. Unreviewed templates render in the [`sandbox`] when it is on; errors as for
    /// [`render`](Self::render).
    pub fn render_request(&self, req: &RenderRequest) -> Result<String> {
        if self.reviewed {
            return self.render_request_here(req);
        }
        match sandbox::placement()? {
            Some(renderer) => renderer.render_request(self, req),
            None => self.render_request_here(req),
        }
    }

    /// The compiled environment, compiling the template here if it was not yet.
    fn compiled(&self) -> Result<&Environment<'static>> {
        match self.env.get() {
            Some(env) => Ok(env),
            None => {
                let env = compile(&self.source)?;
                Ok(self.env.get_or_init(|| env))
            }
        }
    }

    /// Renders the template with `ctx`, bounded by `fuel` and `limit` output bytes.
    fn render_value(&self, ctx: Value, fuel: u64, limit: usize) -> Result<String> {
        // Fuel is set per environment; a clone of the environment shares the compiled template.
        let mut env = self.compiled()?.clone();
        env.set_fuel(Some(fuel));
        let mut out = Bounded {
            out: Vec::new(),
            limit,
        };
        contain(|| {
            env.get_template(TEMPLATE_NAME)
                .and_then(|t| t.render_captured_to(ctx, &mut out))
        })
        .map_err(Error::ChatTemplate)?;
        Ok(String::from_utf8_lossy(&out.out).into_owned())
    }

    /// [`render`](Self::render) in this process, bounded by fuel and output only.
    pub fn render_here(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let (fuel, limit) = render_limits(messages);
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
        self.render_value(ctx, fuel, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_render_their_body() {
        let source =
            "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration %}\
                      {% endfor %}";
        let t = ChatTemplate::new(source, "", "").unwrap();
        let chat = [Message::new("user", "a"), Message::new("assistant", "b")];
        assert_eq!(t.render_here(&chat, false).unwrap(), "[a][b]");
    }
}
