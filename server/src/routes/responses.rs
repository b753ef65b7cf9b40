//! OpenAI's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`.
//!
//! A request's `input` items (messages, `function_call`, `function_call_output`, `reasoning`)
//! become the chat the template renders, after the conversation of `previous_response_id`
//! when one is given. Each stored response (`store`, on by default) keeps its whole
//! conversation, input and output items as JSON, in a file of its own under `responses/` in
//! the cache directory (in memory with `--no-cache`), so a conversation continues by id after
//! a restart; its prompt's KV comes from the prompt cache then, and only the new tokens are
//! computed. Errors answer in OpenAI's shape.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::turn::{self, Named, Parsed, Piece};
use super::{AppState, RawBody};
use crate::error::ServerError;
use crate::scheduler::{Event, Finish, FinishReason, Progress};

/// A failed request's answer.
struct Fail(Box<Response>);

impl Fail {
    fn new(r: Response) -> Fail {
        Fail(Box::new(r))
    }
}

impl From<ServerError> for Fail {
    fn from(e: ServerError) -> Fail {
        Fail::new(e.into_response())
    }
}

fn bad(message: impl Into<String>) -> Fail {
    Fail::new(ServerError::BadRequest(message.into()).into_response())
}

/// 404 in OpenAI's error shape.
fn not_found(message: String, param: Option<&str>) -> Fail {
    let body = json!({ "error": {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": 404,
    }});
    Fail::new((StatusCode::NOT_FOUND, Json(body)).into_response())
}

/// `POST /v1/responses`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    body: Result<RawBody, ServerError>,
) -> Response {
    match respond(st, body).await {
        Ok(r) => r,
        Err(Fail(r)) => *r,
    }
}

/// `GET /v1/responses/{id}`: a stored response.
pub async fn fetch(State(st): State<Arc<AppState>>, UrlPath(id): UrlPath<String>) -> Response {
    match load(&st, &id).await {
        Ok(Some(record)) => Json(record["response"].clone()).into_response(),
        Ok(None) => not_found(format!("Response with id '{id}' not found."), None)
            .0
            .into_response(),
        Err(Fail(r)) => *r,
    }
}

/// `DELETE /v1/responses/{id}`: forgets a stored response.
pub async fn remove(State(st): State<Arc<AppState>>, UrlPath(id): UrlPath<String>) -> Response {
    match delete(&st, &id).await {
        Ok(true) => {
            Json(json!({ "id": id, "object": "response", "deleted": true })).into_response()
        }
        Ok(false) => not_found(format!("Response with id '{id}' not found."), None)
            .0
            .into_response(),
        Err(Fail(r)) => *r,
    }
}

/// The fields of a Responses request this server reads or accepts as harmless; any other is
/// refused, as OpenAI refuses unknown parameters.
const KNOWN: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "stream",
    "previous_response_id",
    "store",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "truncation",
    "include",
    "reasoning",
    "text",
    "stream_options",
    "max_tool_calls",
    "background",
    "conversation",
    "prompt",
];

/// What a request asks beyond the chat.
struct Asked {
    stream: bool,
    store: bool,
    instructions: Value,
    previous: Option<String>,
    /// The request's input as items.
    input: Vec<Value>,
    /// The request's fields echoed in the response object.
    echo: Map<String, Value>,
}

async fn respond(st: Arc<AppState>, body: Result<RawBody, ServerError>) -> Result<Response, Fail> {
    let body: Value = serde_json::from_slice(&body?.0).map_err(|e| {
        Fail::new(
            ServerError::BadJson {
                reason: e.to_string(),
            }
            .into_response(),
        )
    })?;
    let obj = body
        .as_object()
        .ok_or_else(|| bad("the request body must be a JSON object"))?;
    let (mut chat, asked) = convert(obj)?;
    let mut conversation = Vec::new();
    if let Some(prev) = &asked.previous {
        let record = load(&st, prev).await?.ok_or_else(|| {
            not_found(
                format!("Previous response with id '{prev}' not found."),
                Some("previous_response_id"),
            )
        })?;
        if let Some(items) = record["conversation"].as_array() {
            conversation.extend(items.iter().cloned());
        }
    }
    conversation.extend(asked.input.iter().cloned());
    let mut messages = Vec::new();
    if let Some(text) = asked.instructions.as_str() {
        messages.push(json!({ "role": "system", "content": text }));
    }
    messages.extend(to_messages(&conversation)?);
    chat["messages"] = Value::Array(messages);
    let req = turn::chat_request(&st, chat)?;
    let timings_per_token = req.output.timings_per_token;
    let turn = turn::prepare(&st, &req).await?;
    let run = turn.start(&st)?;
    let head = Head {
        id: turn::random_id("resp"),
        created_at: turn::unix_now(),
        model: st.config.alias.clone(),
        asked,
    };
    if !head.asked.stream {
        let reply = super::generate::collect_all(vec![run])
            .await?
            .pop()
            .ok_or(ServerError::ShuttingDown)?;
        turn.remember(&st, &reply.text, &reply.finish);
        let output = output_items(&turn.read(&reply.text), &reply.finish);
        let response = head.response(&output, Some(&reply.finish));
        keep(&st, &head, &response, conversation, &output).await?;
        return Ok(Json(response).into_response());
    }
    let mut state = Stream {
        seq: 0,
        head,
        reader: turn.reader(),
        text: String::new(),
        started: false,
        items: Vec::new(),
        open: None,
        timings_per_token,
        n_prompt: turn.prompt.len(),
        t0: Instant::now(),
        first_token: None,
        n_generated: 0,
        progress: None,
        conversation,
    };
    let st2 = Arc::clone(&st);
    Ok(turn::sse(run, move |ev| {
        if let Event::Done(f) = &ev {
            turn.remember(&st2, &state.text, f);
        }
        state.event(ev, &st2)
    })
    .await?)
}

/// Stores a finished response with its conversation, unless the request said `store: false`.
async fn keep(
    st: &Arc<AppState>,
    head: &Head,
    response: &Value,
    mut conversation: Vec<Value>,
    output: &[Value],
) -> Result<(), Fail> {
    if !head.asked.store {
        return Ok(());
    }
    conversation.extend(output.iter().cloned());
    let record = json!({ "response": response, "conversation": conversation });
    let st = Arc::clone(st);
    let id = head.id.clone();
    tokio::task::spawn_blocking(move || save(&st, &id, &record))
        .await
        .map_err(|e| {
            Fail::new(io_error(
                "the store task failed",
                std::io::Error::other(e.to_string()),
            ))
        })?
        .map_err(|e| Fail::new(io_error("storing the response", e)))
}

fn io_error(what: &str, e: std::io::Error) -> Response {
    ServerError::Io {
        what: what.into(),
        source: e,
    }
    .into_response()
}

/// The chat body of a request (messages set by the caller) and what else it asks.
fn convert(obj: &Map<String, Value>) -> Result<(Value, Asked), Fail> {
    let mut chat = Map::new();
    for (k, v) in obj {
        if turn::LLAMA_FIELDS.contains(&k.as_str()) {
            chat.insert(k.clone(), v.clone());
        } else if !KNOWN.contains(&k.as_str()) {
            return Err(bad(format!("Unknown parameter: '{k}'.")));
        }
    }
    let unsupported = |what: &str| Fail::new(ServerError::Unsupported(what.into()).into_response());
    if obj.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(
            "\"background\": responses are generated while the request waits",
        ));
    }
    if obj.get("conversation").is_some_and(|c| !c.is_null()) {
        return Err(unsupported(
            "\"conversation\": this server keeps no conversation objects; use previous_response_id",
        ));
    }
    if obj.get("prompt").is_some_and(|c| !c.is_null()) {
        return Err(unsupported(
            "\"prompt\": this server has no stored prompt templates",
        ));
    }
    let input = match obj.get("input") {
        Some(Value::String(s)) => vec![json!({
            "type": "message",
            "role": "user",
            "content": [{ "type": "input_text", "text": s }],
        })],
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err(bad("'input' must be a string or a list of items")),
        None => return Err(bad("'input' is required")),
    };
    let instructions = match obj.get("instructions") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) => json!(s),
        Some(_) => return Err(bad("'instructions' must be a string")),
    };
    let previous = match obj.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("'previous_response_id' must be a string")),
    };
    let mut tools = Vec::new();
    if let Some(list) = obj.get("tools").filter(|t| !t.is_null()) {
        let list = list
            .as_array()
            .ok_or_else(|| bad("'tools' must be a list"))?;
        for t in list {
            tools.push(convert_tool(t)?);
        }
    }
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools.clone()));
    }
    let choice = obj.get("tool_choice").filter(|c| !c.is_null());
    if let Some(c) = choice {
        let openai = match c {
            Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => c.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let name = o
                    .get("name")
                    .or_else(|| o.get("function").and_then(|f| f.get("name")))
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("'tool_choice' of type function needs a name"))?;
                json!({ "type": "function", "function": { "name": name } })
            }
            other => {
                return Err(unsupported(&format!(
                    "'tool_choice' {other} is not supported: auto, none, required or a function"
                )))
            }
        };
        chat.insert("tool_choice".into(), openai);
    }
    let parallel = obj
        .get("parallel_tool_calls")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    chat.insert("parallel_tool_calls".into(), json!(parallel));
    match obj.get("max_output_tokens") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => {
                chat.insert("max_tokens".into(), json!(n));
            }
            _ => {
                return Err(bad(format!(
                    "'max_output_tokens' is {v}; an integer of at least 1 is required"
                )))
            }
        },
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad(format!("'stream' is {v}; a boolean is required"))),
    };
    chat.insert("stream".into(), json!(stream));
    let store = obj.get("store").and_then(Value::as_bool).unwrap_or(true);
    if let Some(format) = obj
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null())
    {
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                chat.insert("response_format".into(), json!({ "type": "json_object" }));
            }
            Some("json_schema") => {
                let schema = format
                    .get("schema")
                    .filter(|s| s.is_object())
                    .ok_or_else(|| bad("'text.format' json_schema needs a 'schema' object"))?;
                chat.insert("json_schema".into(), schema.clone());
            }
            _ => {
                return Err(bad(format!(
                    "'text.format' {format} is not text, json_object or json_schema"
                )))
            }
        }
    }
    if let Some(effort) = obj
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        // Templates that take an effort (gpt-oss) read `reasoning_effort`.
        let kwargs = chat
            .entry("chat_template_kwargs")
            .or_insert_with(|| json!({}));
        if let Some(k) = kwargs.as_object_mut() {
            k.entry("reasoning_effort").or_insert(json!(effort));
        }
    }
    let mut echo = Map::new();
    for key in [
        "max_output_tokens",
        "temperature",
        "top_p",
        "metadata",
        "user",
        "reasoning",
        "text",
    ] {
        echo.insert(key.into(), obj.get(key).cloned().unwrap_or(Value::Null));
    }
    echo.insert(
        "tools".into(),
        Value::Array(
            obj.get("tools")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        ),
    );
    echo.insert(
        "tool_choice".into(),
        choice.cloned().unwrap_or_else(|| json!("auto")),
    );
    echo.insert("parallel_tool_calls".into(), json!(parallel));
    echo.insert("store".into(), json!(store));
    echo.insert("instructions".into(), instructions.clone());
    echo.insert(
        "truncation".into(),
        obj.get("truncation")
            .cloned()
            .unwrap_or_else(|| json!("disabled")),
    );
    Ok((
        Value::Object(chat),
        Asked {
            stream,
            store,
            instructions,
            previous,
            input,
            echo,
        },
    ))
}

/// A Responses function tool as an OpenAI chat tool; other kinds of tools are refused.
fn convert_tool(t: &Value) -> Result<Value, Fail> {
    match t.get("type").and_then(Value::as_str) {
        Some("function") => {}
        other => {
            return Err(Fail::new(
                ServerError::Unsupported(format!(
                    "tools of type {} are not supported; only function tools",
                    other.unwrap_or("(none)")
                ))
                .into_response(),
            ))
        }
    }
    // The chat form (`function: {...}`) is read too.
    let f = t.get("function").unwrap_or(t);
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("a function tool needs a 'name'"))?;
    let mut function = json!({
        "name": name,
        "parameters": f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({ "type": "object" })),
    });
    if let Some(d) = f.get("description").and_then(Value::as_str) {
        function["description"] = json!(d);
    }
    Ok(json!({ "type": "function", "function": function }))
}

/// The text of a message's content: a string, or text parts (`input_text`, `output_text`,
/// `text`, `refusal`); images and files are for multimodal models.
fn content_parts(content: &Value) -> Result<Value, Fail> {
    let parts = match content {
        Value::String(s) => return Ok(json!(s)),
        Value::Array(parts) => parts,
        Value::Null => return Ok(json!("")),
        other => {
            return Err(bad(format!(
                "message content {other} is neither text nor parts"
            )))
        }
    };
    let mut out = Vec::new();
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                let text = p
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("content part {p} has no 'text'")))?;
                out.push(json!({ "type": "text", "text": text }));
            }
            Some("refusal") => {
                let text = p.get("refusal").and_then(Value::as_str).unwrap_or("");
                out.push(json!({ "type": "text", "text": text }));
            }
            Some("input_image" | "input_file" | "input_audio") => return Err(Fail::new(
                ServerError::Unsupported(
                    "image, file and audio input need a multimodal model; this server reads text"
                        .into(),
                )
                .into_response(),
            )),
            _ => return Err(bad(format!("content part {p} is not understood"))),
        }
    }
    Ok(Value::Array(out))
}

/// The plain text of converted content.
fn flat(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// A conversation's items as OpenAI chat messages. An assistant's reasoning, text and calls
/// of one turn (consecutive items) make one assistant message.
fn to_messages(items: &[Value]) -> Result<Vec<Value>, Fail> {
    let mut out: Vec<Value> = Vec::new();
    for item in items {
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        let last_assistant = out.last().is_some_and(|m| m["role"] == "assistant");
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer") => "system",
                    Some(r @ ("user" | "system" | "assistant")) => r,
                    other => {
                        return Err(bad(format!(
                            "a message's role is {other:?}: user, system, developer or assistant"
                        )))
                    }
                };
                let content = content_parts(item.get("content").unwrap_or(&Value::Null))?;
                if role != "assistant" {
                    out.push(json!({ "role": role, "content": content }));
                    continue;
                }
                let text = flat(&content);
                match out.last_mut() {
                    Some(m) if last_assistant && m.get("tool_calls").is_none() => {
                        let joined = format!("{}{text}", flat(&m["content"]));
                        m["content"] = json!(joined);
                    }
                    _ => out.push(json!({ "role": "assistant", "content": text })),
                }
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (
                    item.get("call_id").and_then(Value::as_str),
                    item.get("name").and_then(Value::as_str),
                ) else {
                    return Err(bad("a function_call item needs 'call_id' and 'name'"));
                };
                let arguments = match item.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    None | Some(Value::Null) => "{}".into(),
                    Some(v) => v.to_string(),
                };
                let call = json!({
                    "id": call_id,
                    "type": "function",
                    "function": { "name": name, "arguments": arguments },
                });
                match out.last_mut() {
                    Some(m) if last_assistant => match m["tool_calls"].as_array_mut() {
                        Some(calls) => calls.push(call),
                        None => m["tool_calls"] = json!([call]),
                    },
                    _ => out
                        .push(json!({ "role": "assistant", "content": "", "tool_calls": [call] })),
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a function_call_output item needs 'call_id'"))?;
                let content = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => flat(&content_parts(v)?),
                    _ => return Err(bad("a function_call_output item needs an 'output'")),
                };
                out.push(json!({ "role": "tool", "tool_call_id": call_id, "content": content }));
            }
            "reasoning" => {
                let texts = |key: &str| -> String {
                    item.get(key)
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(|p| p["text"].as_str()).collect())
                        .unwrap_or_default()
                };
                let mut text = texts("content");
                if text.is_empty() {
                    text = texts("summary");
                }
                out.push(json!({ "role": "assistant", "content": "", "reasoning_content": text }));
            }
            other => {
                return Err(Fail::new(
                    ServerError::Unsupported(format!(
                        "input items of type {other:?} are not supported"
                    ))
                    .into_response(),
                ))
            }
        }
    }
    Ok(out)
}

/// The output items of a finished reply: reasoning, message, function calls.
fn output_items(p: &Parsed, f: &Finish) -> Vec<Value> {
    let mut out = Vec::new();
    if !p.reasoning.is_empty() {
        out.push(reasoning_item(
            &turn::random_id("rs"),
            &p.reasoning,
            "completed",
        ));
    }
    let status = item_status(f);
    if !p.content.is_empty() || (out.is_empty() && p.calls.is_empty()) {
        out.push(message_item(&turn::random_id("msg"), &p.content, status));
    }
    for c in &p.calls {
        out.push(call_item(&c.id, &c.name, &c.arguments, "completed"));
    }
    out
}

fn item_status(f: &Finish) -> &'static str {
    if f.reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    }
}

fn output_text(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    })
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "reasoning",
        "summary": [],
        "content": [{ "type": "reasoning_text", "text": text }],
        "status": status,
    })
}

fn call_item(call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "id": format!("fc_{call_id}"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// What a response object holds besides its output.
struct Head {
    id: String,
    created_at: u64,
    model: String,
    asked: Asked,
}

impl Head {
    /// The response object: in progress until `finish` is known.
    fn response(&self, output: &[Value], finish: Option<&Finish>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "in_progress",
            "error": null,
            "incomplete_details": null,
            "model": self.model,
            "output": output,
            "previous_response_id": self.asked.previous,
            "usage": null,
        });
        if let Some(o) = v.as_object_mut() {
            for (k, e) in &self.asked.echo {
                o.insert(k.clone(), e.clone());
            }
        }
        if let Some(f) = finish {
            let incomplete = f.reason == FinishReason::Length;
            v["status"] = json!(if incomplete {
                "incomplete"
            } else {
                "completed"
            });
            v["completed_at"] = json!(turn::unix_now());
            if incomplete {
                v["incomplete_details"] = json!({ "reason": "max_output_tokens" });
            }
            v["usage"] = json!({
                "input_tokens": f.n_prompt,
                "input_tokens_details": { "cached_tokens": f.cache_n },
                "output_tokens": f.predicted_n,
                "output_tokens_details": { "reasoning_tokens": 0 },
                "total_tokens": f.n_prompt + f.predicted_n,
            });
        }
        v
    }
}

/// The output item being streamed.
enum Open {
    Reasoning {
        index: usize,
        id: String,
        text: String,
    },
    Message {
        index: usize,
        id: String,
        text: String,
    },
    Call {
        index: usize,
        call: usize,
        id: String,
        name: String,
        args: String,
    },
}

/// A streamed response: output items are opened, filled and closed one after the other.
struct Stream {
    seq: u64,
    head: Head,
    reader: turn::Reader,
    text: String,
    started: bool,
    items: Vec<Value>,
    open: Option<Open>,
    timings_per_token: bool,
    n_prompt: usize,
    t0: Instant,
    first_token: Option<Instant>,
    n_generated: usize,
    progress: Option<Progress>,
    conversation: Vec<Value>,
}

impl Stream {
    fn push(&mut self, out: &mut Vec<Named>, name: &'static str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push((name, data));
    }

    fn event(&mut self, ev: Event, st: &Arc<AppState>) -> Vec<Named> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let r = self.head.response(&[], None);
            self.push(&mut out, "response.created", json!({ "response": r }));
            self.push(&mut out, "response.in_progress", json!({ "response": r }));
        }
        match ev {
            Event::Progress(p) => {
                self.progress = Some(p);
                let r = self.head.response(&[], None);
                let mut data = json!({ "response": r });
                data["prompt_progress"] = super::shape::progress(&p);
                self.push(&mut out, "response.in_progress", data);
            }
            Event::Text(chunk) => {
                self.first_token.get_or_insert_with(Instant::now);
                self.n_generated += chunk.tokens.len();
                self.text.push_str(&chunk.text);
                let pieces = self.reader.feed(&chunk.text);
                self.pieces(pieces, &mut out);
            }
            Event::Done(f) => {
                let pieces = self.reader.finish();
                self.pieces(pieces, &mut out);
                if self.items.is_empty() && self.open.is_none() {
                    self.open_message(&mut out);
                }
                self.close(&mut out, item_status(&f));
                let response = self.head.response(&self.items, Some(&*f));
                if self.head.asked.store {
                    let mut conversation = std::mem::take(&mut self.conversation);
                    conversation.extend(self.items.iter().cloned());
                    let record = json!({ "response": response, "conversation": conversation });
                    if let Err(e) = save(st, &self.head.id, &record) {
                        let e = ServerError::Io {
                            what: "storing the response".into(),
                            source: e,
                        };
                        self.error(&mut out, &e);
                        return out;
                    }
                }
                let mut data = json!({ "response": response });
                data["timings"] = super::shape::timings(&f);
                self.push(&mut out, "response.completed", data);
            }
            Event::Failed(e) => self.error(&mut out, &e),
        }
        out
    }

    fn error(&mut self, out: &mut Vec<Named>, e: &ServerError) {
        let data = json!({ "code": e.kind(), "message": e.to_string(), "param": null });
        self.push(out, "error", data);
    }

    /// Timings so far, measured here (llama-server's `timings_per_token`).
    fn live_timings(&self) -> Value {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let (prompt_n, cache_n) = match self.progress {
            Some(p) => (p.processed.saturating_sub(p.cache), p.cache),
            None => (self.n_prompt, 0),
        };
        let prompt_ms = first.duration_since(self.t0).as_secs_f64() * 1e3;
        let predicted_ms = now.duration_since(first).as_secs_f64() * 1e3;
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        json!({
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_second": rate(prompt_n, prompt_ms),
            "predicted_n": self.n_generated,
            "predicted_ms": predicted_ms,
            "predicted_per_second": rate(self.n_generated.saturating_sub(1), predicted_ms),
        })
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Named>) {
        for p in pieces {
            match p {
                Piece::Reasoning(s) => {
                    if !matches!(self.open, Some(Open::Reasoning { .. })) {
                        self.close(out, "completed");
                        let index = self.items.len();
                        let id = turn::random_id("rs");
                        let item = json!({ "id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress" });
                        self.push(
                            out,
                            "response.output_item.added",
                            json!({ "output_index": index, "item": item }),
                        );
                        self.open = Some(Open::Reasoning {
                            index,
                            id,
                            text: String::new(),
                        });
                    }
                    let data = match &mut self.open {
                        Some(Open::Reasoning { index, id, text }) => {
                            text.push_str(&s);
                            json!({ "item_id": id, "output_index": index, "content_index": 0, "delta": s })
                        }
                        _ => continue,
                    };
                    self.push(out, "response.reasoning_text.delta", data);
                }
                Piece::Text(s) => {
                    if !matches!(self.open, Some(Open::Message { .. })) {
                        self.open_message(out);
                    }
                    let timings = self.timings_per_token.then(|| self.live_timings());
                    let mut data = match &mut self.open {
                        Some(Open::Message { index, id, text }) => {
                            text.push_str(&s);
                            json!({ "item_id": id, "output_index": index, "content_index": 0, "delta": s, "logprobs": [] })
                        }
                        _ => continue,
                    };
                    if let Some(t) = timings {
                        data["timings"] = t;
                    }
                    self.push(out, "response.output_text.delta", data);
                }
                Piece::CallStart {
                    index: call,
                    id,
                    name,
                } => {
                    self.close(out, "completed");
                    let index = self.items.len();
                    let item = call_item(&id, &name, "", "in_progress");
                    self.push(
                        out,
                        "response.output_item.added",
                        json!({ "output_index": index, "item": item }),
                    );
                    self.open = Some(Open::Call {
                        index,
                        call,
                        id,
                        name,
                        args: String::new(),
                    });
                }
                Piece::Arguments {
                    index: which,
                    fragment,
                } => {
                    let data = match &mut self.open {
                        Some(Open::Call {
                            index,
                            call,
                            id,
                            args,
                            ..
                        }) if *call == which => {
                            args.push_str(&fragment);
                            json!({ "item_id": format!("fc_{id}"), "output_index": index, "delta": fragment })
                        }
                        _ => continue,
                    };
                    self.push(out, "response.function_call_arguments.delta", data);
                }
            }
        }
    }

    fn open_message(&mut self, out: &mut Vec<Named>) {
        self.close(out, "completed");
        let index = self.items.len();
        let id = turn::random_id("msg");
        let item = json!({ "id": id, "type": "message", "role": "assistant", "status": "in_progress", "content": [] });
        self.push(
            out,
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
        );
        let part = json!({ "type": "output_text", "text": "", "annotations": [] });
        let data =
            json!({ "item_id": id, "output_index": index, "content_index": 0, "part": part });
        self.push(out, "response.content_part.added", data);
        self.open = Some(Open::Message {
            index,
            id,
            text: String::new(),
        });
    }

    /// Closes the open item; a message takes `status` (incomplete when cut by the length).
    fn close(&mut self, out: &mut Vec<Named>, status: &str) {
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { index, id, text }) => {
                let data = json!({ "item_id": id, "output_index": index, "content_index": 0, "text": text });
                self.push(out, "response.reasoning_text.done", data);
                (index, reasoning_item(&id, &text, "completed"))
            }
            Some(Open::Message { index, id, text }) => {
                let data = json!({ "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": [] });
                self.push(out, "response.output_text.done", data);
                let data = json!({ "item_id": id, "output_index": index, "content_index": 0, "part": output_text(&text) });
                self.push(out, "response.content_part.done", data);
                (index, message_item(&id, &text, status))
            }
            Some(Open::Call {
                index,
                id,
                name,
                args,
                ..
            }) => {
                let data = json!({ "item_id": format!("fc_{id}"), "output_index": index, "name": name, "arguments": args });
                self.push(out, "response.function_call_arguments.done", data);
                (index, call_item(&id, &name, &args, "completed"))
            }
        };
        let (index, item) = item;
        self.push(
            out,
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        );
        self.items.push(item);
    }
}

/// Where stored responses live: `responses/` in the cache directory, or memory.
fn store_dir(st: &AppState) -> Option<PathBuf> {
    st.cache_dir.as_ref().map(|d| d.join("responses"))
}

/// Stored responses of servers without a cache directory, by server, oldest first.
type Memory = HashMap<usize, (HashMap<String, Value>, VecDeque<String>)>;

/// Responses kept in memory per server at most (the oldest are forgotten first).
const MAX_IN_MEMORY: usize = 1024;

fn memory() -> &'static Mutex<Memory> {
    static MEMORY: OnceLock<Mutex<Memory>> = OnceLock::new();
    MEMORY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// This server's key in [`memory`].
fn server_key(st: &AppState) -> usize {
    std::ptr::from_ref(st) as usize
}

/// An id this server could have made: `resp_` and letters, digits, `-` or `_` (never a path).
fn valid_id(id: &str) -> bool {
    id.len() <= 100
        && id.strip_prefix("resp_").is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// Writes `record` as the response `id`: a temporary file, synced, renamed over the name.
fn save(st: &AppState, id: &str, record: &Value) -> std::io::Result<()> {
    let Some(dir) = store_dir(st) else {
        let mut mem = memory().lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = mem.entry(server_key(st)).or_default();
        if map.insert(id.to_owned(), record.clone()).is_none() {
            order.push_back(id.to_owned());
        }
        while order.len() > MAX_IN_MEMORY {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        return Ok(());
    };
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".{id}.json.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(record.to_string().as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, file_of(&dir, id))?;
    // The rename itself survives a crash once the directory is synced.
    std::fs::File::open(&dir)?.sync_all()
}

fn file_of(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.json"))
}

/// The stored record of response `id` (`{"response", "conversation"}`), if there is one.
async fn load(st: &Arc<AppState>, id: &str) -> Result<Option<Value>, Fail> {
    if !valid_id(id) {
        return Ok(None);
    }
    let Some(dir) = store_dir(st) else {
        let mem = memory().lock().unwrap_or_else(|e| e.into_inner());
        return Ok(mem
            .get(&server_key(st))
            .and_then(|(m, _)| m.get(id))
            .cloned());
    };
    let path = file_of(&dir, id);
    let read = tokio::task::spawn_blocking(move || std::fs::read(path))
        .await
        .map_err(|e| {
            Fail::new(io_error(
                "the store task failed",
                std::io::Error::other(e.to_string()),
            ))
        })?;
    match read {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Fail::new(io_error(
                &format!("reading stored response {id}"),
                std::io::Error::other(e),
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Fail::new(io_error(
            &format!("reading stored response {id}"),
            e,
        ))),
    }
}

/// Forgets response `id`; false when there was none.
async fn delete(st: &Arc<AppState>, id: &str) -> Result<bool, Fail> {
    if !valid_id(id) {
        return Ok(false);
    }
    let Some(dir) = store_dir(st) else {
        let mut mem = memory().lock().unwrap_or_else(|e| e.into_inner());
        let Some((map, order)) = mem.get_mut(&server_key(st)) else {
            return Ok(false);
        };
        order.retain(|o| o != id);
        return Ok(map.remove(id).is_some());
    };
    let path = file_of(&dir, id);
    match tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await {
        Ok(Ok(())) => Ok(true),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Ok(Err(e)) => Err(Fail::new(io_error(
            &format!("deleting stored response {id}"),
            e,
        ))),
        Err(e) => Err(Fail::new(io_error(
            "the store task failed",
            std::io::Error::other(e.to_string()),
        ))),
    }
}
