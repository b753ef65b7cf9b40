//! Tool calls: a model's reply turned into OpenAI `tool_calls`, whole or as it streams, and
//! grammars that force a reply to be a valid call.
//!
//! Each model family writes its calls its own way ([`ToolFormat`], found from the chat template
//! by [`detect_tool_format`]). [`parse_tool_calls`] splits a finished reply into its content and
//! its calls; [`ToolCallStream`] does the same on text deltas, with events shaped as OpenAI's
//! streamed deltas ([`ToolCallEvent::to_openai_delta`]). A parse of the whole text and the
//! stream agree on every chunking of it: the whole parse is the stream fed once.
//!
//! Text that looks like the start of a call but is not one stays content. Whitespace next to a
//! call is dropped. A call cut off (length limit) keeps the arguments it got, as OpenAI's do.
//! Arguments are the JSON text the model wrote (a string of JSON when the model wrote one).
//!
//! The parser reads the text of the reply: markers that are control tokens (Mistral's
//! `[TOOL_CALLS]`, Llama's `<|python_tag|>`) must be in it, detokenized with their text.
//!
//! [`tool_grammar`] builds a Lark grammar (with `%json` schemas for the arguments) that allows
//! only calls in the family's syntax, for `tool_choice` `required` or a named function. Its
//! markers are plain text: a family whose marker is a control token gets the marker's text
//! spelled with ordinary tokens, which the parser reads just as well.

#![forbid(unsafe_code)]

use serde_json::{json, Value};

mod grammar;
mod object;
mod parse;
mod stream;
#[cfg(test)]
mod tests;

pub use grammar::tool_grammar;
pub(crate) use stream::call_id;
pub use stream::ToolCallStream;

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    /// `<tool_call>{"name": .., "arguments": {..}}</tool_call>`, one block per call: Hermes 2/3,
    /// Qwen 2.5/3, SmolLM3 and other ChatML tool templates.
    Hermes,
    /// XML calls inside `<tool_call>`: Qwen3-Coder, Qwen 3.5, Nemotron 3 Nano:
    /// `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>`.
    /// A value that parses as JSON other than a string (`3`, `true`, `[1]`) is taken as that
    /// JSON, anything else as a string. Hermes' JSON calls are parsed too.
    QwenXml,
    /// Llama 3.x: `{"name": .., "parameters": {..}}` (or with `"type": "function"` first), and
    /// `<|python_tag|>` followed by such a call, a builtin tool's `name.call(key="value")`, or
    /// code for the `python` tool. Several calls may follow each other, separated by `;` or
    /// whitespace.
    Llama3,
    /// Mistral Nemo: `[TOOL_CALLS][{"name": .., "arguments": {..}, "id": ".."}, ..]`. The
    /// newer form ([`ToolFormat::MistralArgs`]) is parsed too.
    Mistral,
    /// Newer Mistral (Small 3.2, Devstral, Magistral, Ministral 3):
    /// `[TOOL_CALLS]name[ARGS]{..}` per call, optionally `[CALL_ID]id` before `[ARGS]`. The
    /// Nemo form is parsed too.
    MistralArgs,
    /// llama-server's generic form, for templates with no tool syntax: the whole reply is one
    /// JSON object, `{"tool_call": {"name": .., "arguments": {..}}}`,
    /// `{"tool_calls": [{"name": .., "arguments": {..}}, ..]}` or `{"response": ".."}`.
    Generic,
}

/// The tool-call format of the chat template `template_source`, from the markers it writes:
/// `[TOOL_CALLS]` (Mistral; with `[ARGS]` the newer form), `<tool_call>` (Hermes; with
/// `<function=` and `<parameter=` Qwen's XML calls),
/// `<|python_tag|>` or an `ipython` header (Llama 3.x); [`ToolFormat::Generic`] otherwise.
pub fn detect_tool_format(template_source: &str) -> ToolFormat {
    let has = |s: &str| template_source.contains(s);
    if has("[TOOL_CALLS]") {
        if has("[ARGS]") {
            ToolFormat::MistralArgs
        } else {
            ToolFormat::Mistral
        }
    } else if has("<tool_call>") && has("<function=") && has("<parameter=") {
        ToolFormat::QwenXml
    } else if has("<tool_call>") {
        ToolFormat::Hermes
    } else if has("<|python_tag|>")
        || (has("<|start_header_id|>") && has("ipython") && has("\"parameters\""))
    {
        ToolFormat::Llama3
    } else {
        ToolFormat::Generic
    }
}

/// One tool call, as OpenAI's `tool_calls` entries hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id: the model's own when it wrote one (Mistral), else 9 random letters and
    /// digits (Mistral's templates require 9).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The call as an entry of OpenAI's `message.tool_calls`.
    pub fn to_openai(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// Splits a model's finished reply in `format` into its content (the text outside the calls)
/// and its tool calls, with random ids. Text that is not a valid call stays content.
pub fn parse_tool_calls(text: &str, format: ToolFormat) -> (String, Vec<ToolCall>) {
    let mut stream = ToolCallStream::new(format);
    stream.push(text);
    stream.finish();
    stream.into_parts()
}

/// What a [`ToolCallStream`] gives for a delta of text, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolCallEvent {
    /// Content text (never a piece that may still turn out to start a call).
    Content(String),
    /// Call `index` (counting from 0 in the reply) starts: its id and name.
    CallStart {
        /// The call's position among the reply's calls.
        index: usize,
        /// Its id.
        id: String,
        /// The function's name.
        name: String,
    },
    /// More of call `index`'s arguments text.
    Arguments {
        /// The call's position among the reply's calls.
        index: usize,
        /// The next piece of the arguments text.
        fragment: String,
    },
}

impl ToolCallEvent {
    /// The event as an OpenAI chat-completion chunk's `delta`: `{"content": ..}`, or
    /// `{"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments":
    /// ""}}]}` when a call starts, then `{"tool_calls": [{"index", "function": {"arguments"}}]}`.
    pub fn to_openai_delta(&self) -> Value {
        match self {
            ToolCallEvent::Content(text) => json!({ "content": text }),
            ToolCallEvent::CallStart { index, id, name } => json!({"tool_calls": [{
                "index": index,
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            ToolCallEvent::Arguments { index, fragment } => json!({"tool_calls": [{
                "index": index,
                "function": {"arguments": fragment},
            }]}),
        }
    }
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may call tools or answer (no grammar: the reply is parsed afterwards).
    Auto,
    /// The model must not call tools.
    None,
    /// The model must call one of the tools.
    Required,
    /// The model must call this function.
    Named(String),
}

impl ToolChoice {
    /// OpenAI's `tool_choice` value: `"auto"`, `"none"`, `"required"` or
    /// `{"type": "function", "function": {"name": ..}}`; `None` for anything else.
    pub fn from_openai(v: &Value) -> Option<ToolChoice> {
        match v {
            Value::String(s) => match s.as_str() {
                "auto" => Some(ToolChoice::Auto),
                "none" => Some(ToolChoice::None),
                "required" => Some(ToolChoice::Required),
                _ => None,
            },
            Value::Object(o) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|n| ToolChoice::Named(n.into())),
            _ => None,
        }
    }
}
