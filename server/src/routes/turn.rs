//! What the Anthropic Messages and OpenAI Responses endpoints share: one assistant turn of a
//! checked chat, from the rendered prompt to the reply read as reasoning, text and tool calls
//! (whole, or piece by piece as it streams, then as the API's named events).

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::response::Response;
use engine::chat::harmony::{self, HarmonyStream};
use engine::chat::tools::{
    detect_tool_format, tool_grammar, ToolCall, ToolCallEvent, ToolCallStream, ToolChoice,
    ToolFormat,
};
use engine::chat::{ReasoningFormat, ReasoningStream};
use serde_json::Value;

use super::generate::{self, Run};
use super::sse::{self, Named};
use super::AppState;
use crate::error::{Result, ServerError};
use crate::request::ChatRequest;
use crate::scheduler::{Event, Finish, FinishReason, GenParams};

/// A turn ready to generate: its prompt, settings and how its reply is read.
pub(super) struct Turn {
    /// The rendered prompt.
    pub text: String,
    /// Its tokens.
    pub prompt: Vec<u32>,
    /// How to generate (the tool grammar included).
    pub params: GenParams,
    reasoning: ReasoningFormat,
    opened: bool,
    /// How tool calls are written, when the reply is parsed for them.
    tools: Option<ToolFormat>,
    /// The template writes gpt-oss's harmony messages: the reply is read as them (reasoning,
    /// content and calls alike, [`HarmonyStream`]).
    harmony: bool,
    /// The conversation rendered (for the reply's warm-up, see [`super::warm`]).
    pub chat: crate::request::Chat,
}

/// Renders and tokenizes `req`'s chat; `tool_choice` `required` or a named tool constrains the
/// reply with the template family's tool-call grammar.
pub(super) async fn prepare(st: &Arc<AppState>, req: &ChatRequest) -> Result<Turn> {
    let mut params = generate::resolve(st, req.params.clone())?;
    let chat = &req.chat;
    let choice = match &chat.tool_choice {
        None => ToolChoice::Auto,
        Some(v) => ToolChoice::from_openai(v).ok_or_else(|| {
            ServerError::BadRequest(format!("\"tool_choice\" {v} is not understood"))
        })?,
    };
    let format = detect_tool_format(st.template().source());
    let harmony = harmony::is_harmony(st.template().source());
    if harmony && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        // No grammar of harmony calls yet: refused rather than constrained to another
        // family's syntax that the reply is not read in.
        return Err(ServerError::BadRequest(
            "\"tool_choice\" \"required\" or a named function is not supported with this \
             model's harmony (gpt-oss) format yet; use \"auto\""
                .into(),
        ));
    }
    let tools = match (&chat.tools, &choice) {
        (None, _) | (_, ToolChoice::None) => None,
        (Some(_), _) => Some(format),
    };
    if let Some(list) = &chat.tools {
        if let ToolChoice::Named(name) = &choice {
            let known = list.iter().any(|t| {
                t.get("function")
                    .unwrap_or(t)
                    .get("name")
                    .and_then(Value::as_str)
                    == Some(name)
            });
            if !known {
                return Err(ServerError::BadRequest(format!(
                    "\"tool_choice\" names {name:?}, which is not among the tools"
                )));
            }
        }
        if let Some(g) = tool_grammar(list, choice.clone(), chat.parallel_tool_calls, format) {
            if params.grammar.is_some() {
                return Err(ServerError::BadRequest(
                    "a forced tool call and an output format cannot both constrain the reply"
                        .into(),
                ));
            }
            params.grammar = Some(g);
        }
    } else if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(ServerError::BadRequest(
            "\"tool_choice\" asks for a tool call but no tools were given".into(),
        ));
    }
    let text = super::render_chat(st, chat).await?;
    let prompt = generate::chat_tokens(st, text.clone()).await?;
    let opened = engine::chat::prompt_opens_thinking(&text);
    // A grammar decides every token itself: the budget's end tag is not forced into it.
    if let Ok(tokens) = usize::try_from(st.config.args.reasoning_budget) {
        if tokens > 0 && params.grammar.is_none() {
            // Harmony's reasoning is an `analysis` message: closed by ending it and opening
            // the final answer's.
            let (start, end, close) = match harmony {
                true => (
                    harmony::ANALYSIS_START,
                    harmony::END,
                    harmony::CLOSE_ANALYSIS,
                ),
                false => (
                    engine::chat::THINK_START,
                    engine::chat::THINK_END,
                    engine::chat::THINK_END,
                ),
            };
            let close = st.model.tokenizer().encode(close, false, true)?;
            params.reasoning_budget = Some(crate::scheduler::ReasoningBudget {
                tokens,
                close,
                opened,
                start,
                end,
            });
        }
    }
    let name = chat
        .reasoning_format
        .as_deref()
        .unwrap_or(&st.config.args.reasoning_format);
    Ok(Turn {
        reasoning: ReasoningFormat::parse(name).unwrap_or_default(),
        opened,
        text,
        prompt,
        params,
        tools,
        harmony,
        chat: chat.clone(),
    })
}

impl Turn {
    /// Queues the generation.
    pub fn start(&self, st: &Arc<AppState>, client: &super::ClientKey) -> Result<Run> {
        let limits = st.limits();
        let mut runs = generate::submit_all(
            st,
            client,
            &limits,
            std::slice::from_ref(&self.prompt),
            &self.params,
            1,
        )?;
        runs.pop().ok_or(ServerError::ShuttingDown)
    }

    /// Remembers the tokens of prompt and reply, so that the next turn of the conversation
    /// keeps them (as the chat endpoint does), and starts the reply's warm-up for clients that
    /// send it back without its reasoning ([`super::warm`]), in `client`'s cache; the turn is
    /// listed among `client`'s conversations ([`super::conversations`]).
    pub fn remember(&self, st: &Arc<AppState>, client: &super::ClientKey, reply: &str, f: &Finish) {
        if matches!(
            f.reason,
            FinishReason::EndOfGeneration | FinishReason::Length
        ) {
            let mut tokens = self.prompt.clone();
            tokens.extend_from_slice(&f.tokens);
            super::generate::remember_text(st, format!("{}{reply}", self.text), tokens);
            let content = self.read(reply).content;
            super::conversations::record(st, client, &self.chat.messages, &content, f);
            super::warm::after_reply(st, client, self, reply);
        }
    }

    /// A finished reply read whole.
    pub fn read(&self, text: &str) -> Parsed {
        let mut r = self.reader();
        let mut pieces = r.feed(text);
        pieces.extend(r.finish());
        let mut out = Parsed::default();
        for p in pieces {
            match p {
                Piece::Reasoning(s) => out.reasoning.push_str(&s),
                Piece::Reply(ToolCallEvent::Content(s)) => out.content.push_str(&s),
                Piece::Reply(_) => {}
            }
        }
        out.calls = r.calls();
        out
    }

    /// Streams `run`'s reply as `state`'s named events; the finished reply is remembered for
    /// the next turn.
    pub async fn stream<S: NamedStream>(
        self,
        st: &Arc<AppState>,
        client: &super::ClientKey,
        run: Run,
        mut state: S,
    ) -> Result<Response> {
        let st = Arc::clone(st);
        let client = *client;
        let format = move |_, ev: Event| {
            if let Event::Done(f) = &ev {
                self.remember(&st, &client, state.reader().text(), f);
            }
            state.event(ev, &st)
        };
        sse::stream(vec![run], format, Vec::<Named>::new()).await
    }

    /// A reader for the reply as it streams.
    pub fn reader(&self) -> Reader {
        let parse = match self.harmony {
            true => Parse::Harmony(HarmonyStream::new(self.reasoning, self.tools.is_some())),
            false => Parse::Think {
                reasoning: ReasoningStream::new(self.reasoning, self.opened),
                tools: self.tools.map(ToolCallStream::new),
            },
        };
        Reader {
            parse,
            text: String::new(),
        }
    }
}

/// A reply read: its reasoning, its text and its tool calls.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    /// The reasoning split out (empty when none).
    pub reasoning: String,
    /// The text outside reasoning and calls.
    pub content: String,
    /// The tool calls.
    pub calls: Vec<ToolCall>,
}

/// A piece of a streamed reply, in order: reasoning split out, or the rest as the tool-call
/// reader gives it (all of it [`ToolCallEvent::Content`] when tools are not read).
#[derive(Debug)]
pub(super) enum Piece {
    /// More reasoning.
    Reasoning(String),
    /// More answer text (never empty), or a tool call's start or more of its arguments.
    Reply(ToolCallEvent),
}

/// Reads a reply as it streams: reasoning first split out, then tool calls out of the rest;
/// or a harmony reply's messages.
pub(super) struct Reader {
    parse: Parse,
    /// The reply's text fed so far.
    text: String,
}

/// How a [`Reader`] reads.
enum Parse {
    /// `<think>` reasoning split out, then tool calls (when read) out of the rest.
    Think {
        reasoning: ReasoningStream,
        tools: Option<ToolCallStream>,
    },
    /// gpt-oss's harmony messages.
    Harmony(HarmonyStream),
}

impl Reader {
    /// The pieces a delta settles.
    pub fn feed(&mut self, delta: &str) -> Vec<Piece> {
        self.text.push_str(delta);
        match &mut self.parse {
            Parse::Think { reasoning, .. } => {
                let (r, c) = reasoning.feed(delta);
                self.pieces(r, c, false)
            }
            Parse::Harmony(h) => harmony_pieces(h.feed(delta)),
        }
    }

    /// The pieces held back until the end.
    pub fn finish(&mut self) -> Vec<Piece> {
        match &mut self.parse {
            Parse::Think { reasoning, .. } => {
                let (r, c) = reasoning.finish();
                self.pieces(r, c, true)
            }
            Parse::Harmony(h) => harmony_pieces(h.finish()),
        }
    }

    /// The reply's text fed so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The calls read so far.
    pub fn calls(&self) -> Vec<ToolCall> {
        match &self.parse {
            Parse::Think { tools, .. } => tools
                .as_ref()
                .map(|t| t.calls().to_vec())
                .unwrap_or_default(),
            Parse::Harmony(h) => h.calls().to_vec(),
        }
    }

    fn pieces(&mut self, reasoning: String, content: String, end: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        if !reasoning.is_empty() {
            out.push(Piece::Reasoning(reasoning));
        }
        let Parse::Think {
            tools: Some(tools), ..
        } = &mut self.parse
        else {
            if !content.is_empty() {
                out.push(Piece::Reply(ToolCallEvent::Content(content)));
            }
            return out;
        };
        let mut events = tools.push(&content);
        if end {
            events.extend(tools.finish());
        }
        let empty = |e: &ToolCallEvent| matches!(e, ToolCallEvent::Content(s) if s.is_empty());
        out.extend(events.into_iter().filter(|e| !empty(e)).map(Piece::Reply));
        out
    }
}

/// The pieces of what a harmony reader settled: its reasoning, then its content and calls.
fn harmony_pieces((reasoning, events): (String, Vec<ToolCallEvent>)) -> Vec<Piece> {
    let mut out = Vec::new();
    if !reasoning.is_empty() {
        out.push(Piece::Reasoning(reasoning));
    }
    let empty = |e: &ToolCallEvent| matches!(e, ToolCallEvent::Content(s) if s.is_empty());
    out.extend(events.into_iter().filter(|e| !empty(e)).map(Piece::Reply));
    out
}

/// A reply streamed as an API's named events, output blocks or items opened, filled and closed
/// one after the other (the Anthropic Messages and Responses streams).
pub(super) trait NamedStream: Send + 'static {
    /// The reader of the reply.
    fn reader(&mut self) -> &mut Reader;

    /// The named events for `pieces` of the reply, added to `out`.
    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Named>);

    /// The named events for one event of the generation.
    fn event(&mut self, ev: Event, st: &Arc<AppState>) -> Vec<Named>;

    /// Reads `text`, more of the reply: the events of the pieces it settles, added to `out`.
    fn feed(&mut self, text: &str, out: &mut Vec<Named>) {
        let pieces = self.reader().feed(text);
        self.pieces(pieces, out);
    }

    /// Reads the reply's end: the events of the pieces held back until then, added to `out`.
    fn finish(&mut self, out: &mut Vec<Named>) {
        let pieces = self.reader().finish();
        self.pieces(pieces, out);
    }
}

/// A random id: `prefix`, `_`, and 32 hexadecimal digits.
pub(super) fn random_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let word = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
        h.write_u128(kvstore::since_epoch().as_nanos());
        h.finish()
    };
    format!("{prefix}_{:016x}{:016x}", word(), word())
}

/// llama-server's own generation fields that the Anthropic and Responses bodies may carry
/// too: they reach the sampler as they do on `/v1/chat/completions`.
pub(super) const LLAMA_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repeat_penalty",
    "repeat_last_n",
    "frequency_penalty",
    "presence_penalty",
    "typical_p",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "top_n_sigma",
    "dynatemp_range",
    "dynatemp_exponent",
    "samplers",
    "cache_prompt",
    "id_slot",
    "ignore_eos",
    "t_max_predict_ms",
    "n_keep",
    "min_keep",
    "logit_bias",
    "grammar",
    "json_schema",
    "chat_template_kwargs",
    "reasoning_format",
    "timings_per_token",
    "return_progress",
];

/// Parses an OpenAI chat body built from another API's request, with the server's checks.
/// An empty conversation is rendered as is (llama-server accepts one).
pub(super) fn chat_request(st: &AppState, mut body: Value) -> Result<ChatRequest> {
    let mut limits = st.limits();
    // The body was held to the size limit as sent; its conversion is not.
    limits.max_body = usize::MAX;
    let empty = body["messages"].as_array().is_some_and(Vec::is_empty);
    if empty {
        body["messages"] = serde_json::json!([{ "role": "user", "content": "" }]);
    }
    let bytes = serde_json::to_vec(&body).map_err(|e| ServerError::BadRequest(e.to_string()))?;
    let mut req = crate::request::chat(&bytes, &limits)?;
    if empty {
        req.chat.messages.clear();
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of harmony replies, as a turn of a gpt-oss template makes it.
    fn harmony_reader(tools: bool) -> Reader {
        Reader {
            parse: Parse::Harmony(HarmonyStream::new(ReasoningFormat::Auto, tools)),
            text: String::new(),
        }
    }

    /// `reply` fed to `r` in pieces of 5 bytes: its reasoning, its content and the names of
    /// the calls that started.
    fn read(r: &mut Reader, reply: &str) -> (String, String, Vec<String>) {
        let mut pieces = Vec::new();
        for chunk in reply.as_bytes().chunks(5) {
            pieces.extend(r.feed(std::str::from_utf8(chunk).unwrap()));
        }
        pieces.extend(r.finish());
        let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        for p in pieces {
            match p {
                Piece::Reasoning(s) => reasoning.push_str(&s),
                Piece::Reply(ToolCallEvent::Content(s)) => {
                    assert!(!s.is_empty(), "an empty content piece");
                    content.push_str(&s)
                }
                Piece::Reply(ToolCallEvent::CallStart { name, .. }) => calls.push(name),
                Piece::Reply(ToolCallEvent::Arguments { .. }) => {}
            }
        }
        (reasoning, content, calls)
    }

    #[test]
    fn a_harmony_reply_reads_as_reasoning_content_and_calls() {
        let answer = "<|channel|>analysis<|message|>A greeting.<|end|>\
                      <|start|>assistant<|channel|>final<|message|>Hello!";
        let mut r = harmony_reader(false);
        let (reasoning, content, calls) = read(&mut r, answer);
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("A greeting.", "Hello!")
        );
        assert!(calls.is_empty());
        assert_eq!(r.text(), answer);

        let call = "<|channel|>analysis<|message|>Need the weather.<|end|>\
                    <|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        let mut r = harmony_reader(true);
        let (reasoning, content, calls) = read(&mut r, call);
        assert_eq!(
            (reasoning.as_str(), content.as_str()),
            ("Need the weather.", "")
        );
        assert_eq!(calls, ["get_weather"]);
        let read_calls = r.calls();
        assert_eq!(read_calls.len(), 1);
        assert_eq!(read_calls[0].arguments, "{\"city\":\"Paris\"}");
    }
}
