//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request is turned into the OpenAI chat the template renders: `system` becomes a system
//! message, `tool_use` blocks an assistant's `tool_calls`, `tool_result` blocks `tool`
//! messages, `thinking` blocks `reasoning_content`, and the tools OpenAI function tools. The
//! reply is read as thinking, text and `tool_use` blocks, whole or as Anthropic's stream of
//! events. Errors answer in Anthropic's shape, `{"type": "error", "error": {"type",
//! "message"}}`. Fields for capabilities this server lacks are refused, never ignored.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine::chat::tools::ToolCallEvent;
use serde_json::{json, Map, Value};

use super::sse::Named;
use super::turn::{self, NamedStream, Parsed, Piece};
use super::{AppState, RawBody};
use crate::error::ServerError;
use crate::scheduler::{Event, Finish, FinishReason};

/// An error in Anthropic's shape, with its status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
        }
    }

    /// Images need a multimodal model: llama-server answers 500 with this message.
    fn no_images() -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "api_error",
            message: "image input is not supported: this server runs a text-only model".into(),
        }
    }

    fn json(&self) -> Value {
        json!({ "type": "error", "error": { "type": self.kind, "message": self.message } })
    }
}

impl From<ServerError> for ApiError {
    fn from(e: ServerError) -> ApiError {
        let status = e.status();
        let kind = match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            400..=499 | 501 => "invalid_request_error",
            _ => "api_error",
        };
        ApiError {
            status,
            kind,
            message: e.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.json())).into_response()
    }
}

/// Whether `path` (after the API prefix) is one of this module's, whose errors (a missing API
/// key included) answer in Anthropic's shape.
pub fn is_anthropic_path(path: &str) -> bool {
    path.starts_with("/v1/messages") || path.starts_with("/messages")
}

/// The answer to a request without a valid API key, in Anthropic's shape.
pub fn unauthorized() -> Response {
    ApiError::from(ServerError::Unauthorized).into_response()
}

/// `POST /v1/messages`.
pub async fn messages(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<super::ClientKey>,
    body: Result<RawBody, ServerError>,
) -> Response {
    match create(st, client, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}` of the prompt the request renders to.
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<RawBody, ServerError>,
) -> Response {
    let count = async {
        super::info::rouse(&st).await;
        let body = parse_body(&body?.0)?;
        let (chat, _) = convert(&body, false)?;
        let req = turn::chat_request(&st, chat)?;
        let turn = turn::prepare(&st, &req).await?;
        Ok::<_, ApiError>(json!({ "input_tokens": turn.prompt.len() }))
    };
    match count.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad(format!("invalid request body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    Ok(v)
}

async fn create(
    st: Arc<AppState>,
    client: super::ClientKey,
    body: Result<RawBody, ServerError>,
) -> Result<Response, ApiError> {
    let body = parse_body(&body?.0)?;
    let (chat, stream) = convert(&body, true)?;
    let mut req = turn::chat_request(&st, chat)?;
    req.params.cache_salt = crate::request::cache_salt(&body).map_err(ApiError::bad)?;
    req.params.cache_ttl = crate::request::cache_ttl(&body).map_err(ApiError::bad)?;
    // The prompt's cached part is known from the first progress report, for `message_start`.
    req.params.return_progress |= stream;
    let turn = turn::prepare(&st, &req).await?;
    let run = turn.start(&st, &client)?;
    let id = turn::random_id("msg");
    let model = st.config.alias.clone();
    if !stream {
        let reply = super::generate::collect_all(vec![run])
            .await?
            .pop()
            .ok_or(ServerError::ShuttingDown)?;
        turn.remember(&st, &client, &reply.text, &reply.finish);
        let parsed = turn.read(&reply.text);
        return Ok(Json(whole(&id, &model, &parsed, &reply.finish)).into_response());
    }
    let state = Stream {
        id,
        model,
        n_prompt: turn.prompt.len(),
        reader: turn.reader(),
        started: false,
        open: None,
        next_block: 0,
        calls: HashMap::new(),
    };
    Ok(turn.stream(&st, &client, run, state).await?)
}

/// The fields of a Messages request this server reads or accepts; any other is refused, as
/// Anthropic refuses fields it does not know.
const KNOWN: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "tools",
    "tool_choice",
    "stop_sequences",
    "stream",
    "thinking",
    "metadata",
    "service_tier",
    "context_management",
    "mcp_servers",
    "container",
    "output_format",
    "output_config",
];

/// The OpenAI chat body of a Messages request, and whether it streams. `generating` is false
/// for `count_tokens`, which needs no `max_tokens`.
fn convert(body: &Value, generating: bool) -> Result<(Value, bool), ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad("the body must be an object"))?;
    let mut out = Map::new();
    for (k, v) in obj {
        if turn::LLAMA_FIELDS.contains(&k.as_str()) {
            out.insert(k.clone(), v.clone());
        } else if !KNOWN.contains(&k.as_str()) {
            return Err(ApiError::bad(format!(
                "{k}: Extra inputs are not permitted"
            )));
        }
    }
    if obj
        .get("mcp_servers")
        .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
    {
        return Err(ServerError::Unsupported(
            "\"mcp_servers\": this server connects to no MCP servers".into(),
        )
        .into());
    }
    if obj.get("container").is_some_and(|v| !v.is_null()) {
        return Err(ServerError::Unsupported(
            "\"container\": this server runs no code containers".into(),
        )
        .into());
    }
    let messages = match obj.get("messages") {
        Some(Value::Array(m)) => m,
        Some(_) => return Err(ApiError::bad("messages: a list of messages is required")),
        None => return Err(ApiError::bad("messages: Field required")),
    };
    out.insert(
        "messages".into(),
        Value::Array(convert_messages(obj.get("system"), messages)?),
    );
    if let Some(tools) = obj.get("tools").filter(|t| !t.is_null()) {
        out.insert("tools".into(), convert_tools(tools)?);
    }
    if let Some(choice) = obj.get("tool_choice").filter(|c| !c.is_null()) {
        let (choice, parallel) = convert_tool_choice(choice)?;
        out.insert("tool_choice".into(), choice);
        out.insert("parallel_tool_calls".into(), json!(parallel));
    } else {
        out.insert("parallel_tool_calls".into(), json!(true));
    }
    match obj.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(s)) if s.iter().all(Value::is_string) => {
            out.insert("stop".into(), Value::Array(s.clone()));
        }
        Some(_) => {
            return Err(ApiError::bad(
                "stop_sequences: a list of strings is required",
            ))
        }
    }
    match obj.get("max_tokens") {
        // llama-server is permissive: Anthropic requires the field.
        None | Some(Value::Null) => {
            out.insert("max_tokens".into(), json!(4096));
        }
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 || (!generating && n >= 0) => {
                out.insert("max_tokens".into(), json!(n));
            }
            _ => {
                return Err(ApiError::bad(format!(
                    "max_tokens: {v} is not an integer of at least 1"
                )))
            }
        },
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(ApiError::bad(format!("stream: {v} is not a boolean"))),
    };
    out.insert("stream".into(), json!(stream));
    if let Some(thinking) = obj.get("thinking").filter(|t| !t.is_null()) {
        let on = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::bad(format!(
                    "thinking: {thinking} is not enabled, adaptive or disabled"
                )))
            }
        };
        // Templates that can think without being asked read `enable_thinking`.
        let kwargs = out
            .entry("chat_template_kwargs")
            .or_insert_with(|| json!({}));
        if let Some(k) = kwargs.as_object_mut() {
            k.entry("enable_thinking").or_insert(json!(on));
        }
    }
    let format = obj
        .get("output_format")
        .filter(|f| !f.is_null())
        .or_else(|| {
            obj.get("output_config")
                .and_then(|c| c.get("format"))
                .filter(|f| !f.is_null())
        });
    if let Some(format) = format {
        match (
            format.get("type").and_then(Value::as_str),
            format.get("schema"),
        ) {
            (Some("json_schema"), Some(schema)) if schema.is_object() => {
                out.insert("json_schema".into(), schema.clone());
            }
            _ => {
                return Err(ApiError::bad(format!(
                    "output_format: {format} is not a json_schema format with a schema"
                )))
            }
        }
    }
    Ok((Value::Object(out), stream))
}

/// The text of a `system` value: a string, or text blocks.
fn system_text(system: &Value) -> Result<String, ApiError> {
    match system {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => Ok(t),
                    _ => Err(ApiError::bad(format!("system: {b} is not a text block"))),
                }
            })
            .collect(),
        other => Err(ApiError::bad(format!(
            "system: {other} is neither text nor text blocks"
        ))),
    }
}

/// The text of a `tool_result`'s content: a string, text blocks, or nothing.
fn tool_result_text(content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|b| match b.get("type").and_then(Value::as_str) {
                Some("text") => b
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad("tool_result: a text block without text")),
                Some("image") => Err(ApiError::no_images()),
                _ => Err(ApiError::bad(format!(
                    "tool_result: unsupported content block {b}"
                ))),
            })
            .collect(),
        Some(other) => Err(ApiError::bad(format!(
            "tool_result: content {other} is neither text nor blocks"
        ))),
    }
}

/// Anthropic's messages as OpenAI's. A user message's tool results come first, as `tool`
/// messages answering the calls before them, then its text.
fn convert_messages(system: Option<&Value>, messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(system) = system.filter(|s| !s.is_null()) {
        out.push(json!({ "role": "system", "content": system_text(system)? }));
    }
    for (i, m) in messages.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant")) => r,
            _ => {
                return Err(ApiError::bad(format!(
                    "messages.{i}.role: user or assistant is required"
                )))
            }
        };
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(json!({ "role": role, "content": s }));
                continue;
            }
            Some(Value::Array(b)) => b,
            _ => {
                return Err(ApiError::bad(format!(
                    "messages.{i}.content: text or content blocks are required"
                )))
            }
        };
        let mut parts = Vec::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        let mut reasoning = String::new();
        for b in blocks {
            let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "text" => {
                    let text = b
                        .get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::bad(format!("messages.{i}: a text block without text")))?;
                    parts.push(json!({ "type": "text", "text": text }));
                }
                "image" => return Err(ApiError::no_images()),
                "document" => {
                    return Err(ServerError::Unsupported("document blocks are not supported: send their text".into()).into())
                }
                "thinking" => {
                    reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""));
                }
                // Encrypted reasoning of another model: nothing to render.
                "redacted_thinking" => {}
                "tool_use" if role == "assistant" => {
                    let (Some(id), Some(name)) = (
                        b.get("id").and_then(Value::as_str),
                        b.get("name").and_then(Value::as_str),
                    ) else {
                        return Err(ApiError::bad(format!("messages.{i}: a tool_use block needs an id and a name")));
                    };
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({
                        "id": id,
                        "type": "function",
                        "function": { "name": name, "arguments": input.to_string() },
                    }));
                }
                "tool_result" if role == "user" => {
                    let id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::bad(format!("messages.{i}: a tool_result block needs tool_use_id")))?;
                    results.push(json!({
                        "role": "tool",
                        "tool_call_id": id,
                        "content": tool_result_text(b.get("content"))?,
                    }));
                }
                other => {
                    return Err(ApiError::bad(format!(
                        "messages.{i}: content blocks of type {other:?} are not supported in a {role} message"
                    )))
                }
            }
        }
        out.extend(results);
        if !parts.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
            let content = if parts.is_empty() {
                json!("")
            } else {
                Value::Array(parts)
            };
            let mut msg = json!({ "role": role, "content": content });
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            if !reasoning.is_empty() {
                msg["reasoning_content"] = json!(reasoning);
            }
            out.push(msg);
        }
    }
    Ok(out)
}

/// Anthropic's custom tools as OpenAI function tools; server tools are refused.
fn convert_tools(tools: &Value) -> Result<Value, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad("tools: a list is required"))?;
    list.iter()
        .enumerate()
        .map(|(i, t)| -> Result<Value, ApiError> {
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(kind) => {
                    return Err(ServerError::Unsupported(format!(
                        "tools.{i}: tools of type {kind:?} are not supported; only custom tools with an input_schema"
                    ))
                    .into())
                }
            }
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad(format!("tools.{i}.name: Field required")))?;
            let schema = match t.get("input_schema") {
                Some(s) if s.is_object() => s.clone(),
                None | Some(Value::Null) => json!({ "type": "object" }),
                Some(_) => return Err(ApiError::bad(format!("tools.{i}.input_schema: an object is required"))),
            };
            let mut function = json!({ "name": name, "parameters": schema });
            if let Some(d) = t.get("description").and_then(Value::as_str) {
                function["description"] = json!(d);
            }
            Ok(json!({ "type": "function", "function": function }))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// Anthropic's `tool_choice` as OpenAI's, and whether several calls may be made.
fn convert_tool_choice(choice: &Value) -> Result<(Value, bool), ApiError> {
    let parallel = !choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let openai = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(name) => json!({ "type": "function", "function": { "name": name } }),
            None => return Err(ApiError::bad("tool_choice: type tool needs a name")),
        },
        _ => {
            return Err(ApiError::bad(format!(
                "tool_choice: {choice} is not auto, any, tool or none"
            )))
        }
    };
    Ok((openai, parallel))
}

/// Anthropic's `stop_reason` and `stop_sequence`.
fn stop_reason(f: &Finish, called: bool) -> (&'static str, Value) {
    match f.reason {
        FinishReason::Length => ("max_tokens", Value::Null),
        FinishReason::StopString => ("stop_sequence", json!(f.stopping_word)),
        _ if called => ("tool_use", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

/// Anthropic's `usage`: `input_tokens` are the prompt tokens not read from the cache.
fn usage(f: &Finish) -> Value {
    json!({
        "input_tokens": f.n_prompt.saturating_sub(f.cache_n),
        "cache_read_input_tokens": f.cache_n,
        "cache_creation_input_tokens": 0,
        "output_tokens": f.predicted_n,
    })
}

/// A tool call's arguments as the `input` object (`{}` when the model wrote no valid JSON).
fn input_of(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The whole message.
fn whole(id: &str, model: &str, p: &Parsed, f: &Finish) -> Value {
    let mut content = Vec::new();
    if !p.reasoning.is_empty() {
        content.push(json!({ "type": "thinking", "thinking": p.reasoning, "signature": "" }));
    }
    if !p.content.is_empty() || (p.reasoning.is_empty() && p.calls.is_empty()) {
        content.push(json!({ "type": "text", "text": p.content }));
    }
    for c in &p.calls {
        content.push(json!({ "type": "tool_use", "id": c.id, "name": c.name, "input": input_of(&c.arguments) }));
    }
    let (reason, sequence) = stop_reason(f, !p.calls.is_empty());
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(f),
    })
}

/// Which kind of block is open.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    Tool(usize),
}

/// A streamed message: blocks are opened, filled and closed one after the other.
struct Stream {
    id: String,
    model: String,
    n_prompt: usize,
    reader: turn::Reader,
    started: bool,
    open: Option<(Block, usize)>,
    next_block: usize,
    /// Block index of each tool call.
    calls: HashMap<usize, usize>,
}

fn ev(name: &'static str, data: Value) -> Named {
    (name, data)
}

impl NamedStream for Stream {
    fn reader(&mut self) -> &mut turn::Reader {
        &mut self.reader
    }

    fn event(&mut self, event: Event, _: &Arc<AppState>) -> Vec<Named> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let cached = match &event {
                Event::Progress(p) => p.cache,
                _ => 0,
            };
            out.push(ev(
                "message_start",
                json!({ "type": "message_start", "message": {
                    "id": self.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": {
                        "input_tokens": self.n_prompt - cached.min(self.n_prompt),
                        "cache_read_input_tokens": cached,
                        "cache_creation_input_tokens": 0,
                        "output_tokens": 0,
                    },
                }}),
            ));
        }
        match event {
            Event::Progress(_) => {}
            Event::Text(chunk) => self.feed(&chunk.text, &mut out),
            Event::Done(f) => {
                self.finish(&mut out);
                if self.next_block == 0 {
                    // An empty reply still has its (empty) text block.
                    self.open(Block::Text, &mut out);
                }
                self.close(&mut out);
                let (reason, sequence) = stop_reason(&f, !self.calls.is_empty());
                out.push(ev(
                    "message_delta",
                    json!({
                        "type": "message_delta",
                        "delta": { "stop_reason": reason, "stop_sequence": sequence },
                        "usage": usage(&f),
                    }),
                ));
                out.push(ev("message_stop", json!({ "type": "message_stop" })));
            }
            Event::Failed(e) => out.push(ev("error", ApiError::from(e).json())),
        }
        out
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Named>) {
        for p in pieces {
            match p {
                Piece::Reasoning(s) => {
                    let index = self.ensure(Block::Thinking, out);
                    out.push(delta(
                        index,
                        json!({ "type": "thinking_delta", "thinking": s }),
                    ));
                }
                Piece::Reply(ToolCallEvent::Content(s)) => {
                    let index = self.ensure(Block::Text, out);
                    out.push(delta(index, json!({ "type": "text_delta", "text": s })));
                }
                Piece::Reply(ToolCallEvent::CallStart { index, id, name }) => {
                    self.close(out);
                    let block = self.next_block;
                    self.next_block += 1;
                    self.open = Some((Block::Tool(index), block));
                    self.calls.insert(index, block);
                    out.push(ev(
                        "content_block_start",
                        json!({ "type": "content_block_start", "index": block,
                                "content_block": { "type": "tool_use", "id": id, "name": name, "input": {} } }),
                    ));
                }
                Piece::Reply(ToolCallEvent::Arguments { index, fragment }) => {
                    if let Some(&block) = self.calls.get(&index) {
                        out.push(delta(
                            block,
                            json!({ "type": "input_json_delta", "partial_json": fragment }),
                        ));
                    }
                }
            }
        }
    }
}

impl Stream {
    /// The index of the open block of `kind`, opening one (and closing another) when needed.
    fn ensure(&mut self, kind: Block, out: &mut Vec<Named>) -> usize {
        match self.open {
            Some((k, index)) if k == kind => index,
            _ => self.open(kind, out),
        }
    }

    fn open(&mut self, kind: Block, out: &mut Vec<Named>) -> usize {
        self.close(out);
        let index = self.next_block;
        self.next_block += 1;
        self.open = Some((kind, index));
        let block = match kind {
            Block::Thinking => json!({ "type": "thinking", "thinking": "" }),
            _ => json!({ "type": "text", "text": "" }),
        };
        out.push(ev(
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": block }),
        ));
        index
    }

    fn close(&mut self, out: &mut Vec<Named>) {
        if let Some((kind, index)) = self.open.take() {
            if kind == Block::Thinking {
                // Anthropic's clients expect a signature; a local model has none.
                out.push(delta(
                    index,
                    json!({ "type": "signature_delta", "signature": "" }),
                ));
            }
            out.push(ev(
                "content_block_stop",
                json!({ "type": "content_block_stop", "index": index }),
            ));
        }
    }
}

fn delta(index: usize, delta: Value) -> Named {
    ev(
        "content_block_delta",
        json!({ "type": "content_block_delta", "index": index, "delta": delta }),
    )
}
