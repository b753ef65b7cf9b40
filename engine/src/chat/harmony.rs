//! gpt-oss's harmony format: a reply read as its messages, whole ([`parse_harmony`]) or as it
//! streams ([`HarmonyStream`]), as llama-server's gpt-oss parser reads it.
//!
//! The prompt ends with `<|start|>assistant`; the reply is one message or more, each a header
//! up to `<|message|>` (its channel, `<|channel|>NAME`, and perhaps a recipient, ` to=NAME`,
//! before or after the channel, and a content type, ` <|constrain|>json`), then its body up to
//! `<|end|>`; the next one opens with `<|start|>assistant`. The last message ends where
//! generation stopped (at `<|return|>` or `<|call|>`, end-of-generation tokens that are not in
//! the text), or at one of them if the text holds it.
//!
//! - `analysis` messages are the reasoning (`reasoning_content`); with
//!   [`ReasoningFormat::None`] they stay in the content as written (channel marker to
//!   `<|end|>`), with [`ReasoningFormat::DeepseekLegacy`] they go to both;
//! - a message to `functions.NAME` is a call of NAME, its body the arguments, when the request
//!   has tools; without tools, or to another recipient (a built-in tool), it is dropped, as
//!   llama-server drops it;
//! - `final` and `commentary` messages without a recipient (the latter, preambles) are the
//!   content.
//!
//! Text before any header (a reply that does not speak harmony) is content as it is.

use super::tools::{call_id, ToolCall, ToolCallEvent};
use super::ReasoningFormat;

/// Whether the chat template `template_source` writes harmony messages (gpt-oss), as
/// llama-server recognises it.
pub fn is_harmony(template_source: &str) -> bool {
    template_source.contains("<|channel|>")
}

/// The header of an analysis message (the reasoning), as the reply writes it first.
pub const ANALYSIS_START: &str = "<|channel|>analysis<|message|>";
/// The end of a message that another follows.
pub const END: &str = "<|end|>";
/// What closes the reasoning and opens the final answer (a reasoning budget's end).
pub const CLOSE_ANALYSIS: &str = "<|end|><|start|>assistant<|channel|>final<|message|>";

const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const START: &str = "<|start|>";
/// The markers that end a message's body: `<|end|>` between messages, `<|call|>` and
/// `<|return|>` after the last (when the text holds them).
const ENDS: [&str; 3] = [END, "<|call|>", "<|return|>"];

/// Splits a finished reply into `(reasoning, content, calls)`, as [`HarmonyStream`] does fed
/// at once; `tools`: the request has tools, so calls of `functions.NAME` are read.
pub fn parse_harmony(
    text: &str,
    format: ReasoningFormat,
    tools: bool,
) -> (Option<String>, String, Vec<ToolCall>) {
    let mut s = HarmonyStream::new(format, tools);
    let mut reasoning = String::new();
    let mut content = String::new();
    let (r1, e1) = s.feed(text);
    let (r2, e2) = s.finish();
    reasoning.push_str(&r1);
    reasoning.push_str(&r2);
    for e in e1.into_iter().chain(e2) {
        if let ToolCallEvent::Content(c) = e {
            content.push_str(&c);
        }
    }
    let reasoning = (!reasoning.is_empty()).then_some(reasoning);
    (reasoning, content, s.calls)
}

/// What the body of the message being read is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    /// Reasoning (an `analysis` message).
    Reasoning,
    /// Content.
    Content,
    /// The arguments of call `index`.
    Call(usize),
    /// Nothing the reply shows (a built-in tool's call).
    Dropped,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Reading a header, up to `<|message|>`.
    Header,
    /// Reading a body.
    Body(Body),
    /// The reply does not speak harmony: all of it is content.
    Plain,
}

/// [`parse_harmony`] as the reply streams: [`feed`](Self::feed) each piece, then
/// [`finish`](Self::finish). Each returns the reasoning it settles and the content and call
/// events (as [`ToolCallStream`](super::tools::ToolCallStream)'s); a piece that may be the
/// start of a marker is held back until the text after it decides.
#[derive(Clone, Debug)]
pub struct HarmonyStream {
    format: ReasoningFormat,
    tools: bool,
    state: State,
    /// Text received and not yet settled.
    pending: String,
    calls: Vec<ToolCall>,
    rng: u64,
}

impl HarmonyStream {
    /// A stream for a reply in `format`; `tools` as for [`parse_harmony`].
    pub fn new(format: ReasoningFormat, tools: bool) -> HarmonyStream {
        use std::hash::{BuildHasher, Hasher};
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        HarmonyStream {
            format,
            tools,
            state: State::Header,
            pending: String::new(),
            calls: Vec::new(),
            rng: seed,
        }
    }

    /// The calls read so far (the last one's arguments may be incomplete before
    /// [`finish`](Self::finish)).
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// Takes the next piece of the reply; returns the reasoning and the events it settles.
    pub fn feed(&mut self, chunk: &str) -> (String, Vec<ToolCallEvent>) {
        self.pending.push_str(chunk);
        self.step(false)
    }

    /// Ends the reply: settles what was held back.
    pub fn finish(&mut self) -> (String, Vec<ToolCallEvent>) {
        self.step(true)
    }

    fn step(&mut self, eof: bool) -> (String, Vec<ToolCallEvent>) {
        let mut out = Out::default();
        loop {
            match self.state.clone() {
                State::Plain => {
                    out.content(std::mem::take(&mut self.pending));
                    break;
                }
                State::Header => {
                    if let Some(i) = self.pending.find(MESSAGE) {
                        let header = self.pending[..i].to_string();
                        self.pending.drain(..i + MESSAGE.len());
                        self.open(&header, &mut out);
                    } else if eof || !could_be_header(&self.pending) {
                        // Not harmony (or a header cut off): the text as it is.
                        self.state = State::Plain;
                    } else {
                        break;
                    }
                }
                State::Body(body) => {
                    let end = ENDS
                        .iter()
                        .filter_map(|m| self.pending.find(m).map(|i| (i, m.len())))
                        .min();
                    let (take, rest) = match end {
                        Some((i, len)) => (i, Some(i + len)),
                        // Hold back what may be the start of an end marker.
                        None if !eof => (held_back(&self.pending), None),
                        None => (self.pending.len(), None),
                    };
                    let text: String = self.pending[..take].to_string();
                    self.emit(&body, text, &mut out);
                    match rest {
                        Some(r) => {
                            let marker = self.pending[take..r].to_string();
                            self.pending.drain(..r);
                            if self.raw_reasoning() && body == Body::Reasoning {
                                out.content(marker);
                            }
                            self.state = State::Header;
                        }
                        None => {
                            self.pending.drain(..take);
                            break;
                        }
                    }
                }
            }
        }
        (out.reasoning, out.events)
    }

    /// Whether analysis messages also stay in the content as written.
    fn raw_reasoning(&self) -> bool {
        matches!(
            self.format,
            ReasoningFormat::None | ReasoningFormat::DeepseekLegacy
        )
    }

    /// Starts the body of the message whose header (without `<|message|>`) is `header`.
    fn open(&mut self, header: &str, out: &mut Out) {
        let header = header
            .strip_prefix(START)
            .map_or(header, |h| h.strip_prefix("assistant").unwrap_or(h));
        let channel = header
            .find(CHANNEL)
            .map(|i| word(&header[i + CHANNEL.len()..]));
        let recipient = header.find("to=").map(|i| word(&header[i + 3..]));
        let body = match (recipient, channel) {
            (Some(r), _) => match r.strip_prefix("functions.") {
                Some(name) if self.tools && !name.is_empty() => {
                    let index = self.calls.len();
                    let id = call_id(&mut self.rng);
                    self.calls.push(ToolCall {
                        id: id.clone(),
                        name: name.to_string(),
                        arguments: String::new(),
                    });
                    out.events.push(ToolCallEvent::CallStart {
                        index,
                        id,
                        name: name.to_string(),
                    });
                    Body::Call(index)
                }
                _ => Body::Dropped,
            },
            (None, Some("analysis")) => {
                if self.raw_reasoning() {
                    out.content(format!("{header}{MESSAGE}"));
                }
                Body::Reasoning
            }
            (None, _) => Body::Content,
        };
        self.state = State::Body(body);
    }

    fn emit(&mut self, body: &Body, text: String, out: &mut Out) {
        if text.is_empty() {
            return;
        }
        match body {
            Body::Reasoning => match self.format {
                ReasoningFormat::None => out.content(text),
                ReasoningFormat::DeepseekLegacy => {
                    out.content(text.clone());
                    out.reasoning.push_str(&text);
                }
                ReasoningFormat::Auto | ReasoningFormat::Deepseek => out.reasoning.push_str(&text),
            },
            Body::Content => out.content(text),
            Body::Call(index) => {
                self.calls[*index].arguments.push_str(&text);
                out.events.push(ToolCallEvent::Arguments {
                    index: *index,
                    fragment: text,
                });
            }
            Body::Dropped => {}
        }
    }
}

/// What a step settles.
#[derive(Default)]
struct Out {
    reasoning: String,
    events: Vec<ToolCallEvent>,
}

impl Out {
    /// More content, joined to the last event when it is content too.
    fn content(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        match self.events.last_mut() {
            Some(ToolCallEvent::Content(c)) => c.push_str(&text),
            _ => self.events.push(ToolCallEvent::Content(text)),
        }
    }
}

/// The name at the start of `s`: up to whitespace or a marker.
fn word(s: &str) -> &str {
    let end = s
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(s.len());
    &s[..end]
}

/// Whether `s` (no `<|message|>` in it yet) may still be a message's header: it starts with a
/// marker (`<|channel|>`, `<|start|>`) or a recipient (` to=`), or with the start of one.
fn could_be_header(s: &str) -> bool {
    let t = s.trim_start();
    ["<|", "to="]
        .iter()
        .any(|p| t.starts_with(p) || p.starts_with(t))
}

/// How much of `s` can be settled: all of it but a tail that may start an end marker.
fn held_back(s: &str) -> usize {
    let mut cut = s.len();
    for m in ENDS {
        for k in (1..m.len()).rev() {
            if s.ends_with(&m[..k]) {
                cut = cut.min(s.len() - k);
                break;
            }
        }
    }
    cut
}

#[cfg(test)]
mod tests;
