//! `POST /api/chat`: Ollama's messages as the OpenAI chat the template renders (`thinking` as
//! `reasoning_content`, `tool_calls` with their arguments as strings and ids given where the
//! client sent none, `tool` messages matched to the calls they answer), the reply read as
//! thinking, text and tool calls, whole or as NDJSON lines.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use engine::chat::tools::ToolCall;
use serde_json::{json, Map, Value};

use super::options::{self, Extras};
use super::{parse_body, stream_flag, Line, Meta, OllamaError};
use crate::error::ServerError;
use crate::routes::turn::{self, Piece};
use crate::routes::{generate, sse, AppState, ClientKey, RawBody};
use crate::scheduler::Event;

/// `POST /api/chat`.
pub async fn chat(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    body: Result<RawBody, ServerError>,
) -> Response {
    match create(st, client, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn create(
    st: Arc<AppState>,
    client: ClientKey,
    body: Result<RawBody, ServerError>,
) -> Result<Response, OllamaError> {
    let started = Instant::now();
    let body = parse_body(body)?;
    super::log_unknown(&st, "/api/chat", &body, KNOWN);
    let mut meta = Meta::new(&st, &body, started);
    let stream = stream_flag(&body)?;
    let messages = match body.get("messages") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(m)) => m.as_slice(),
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "messages: {other} is not a list of messages"
            )))
        }
    };
    let (openai, extras) = convert(&st, &body, messages)?;
    if messages.is_empty() {
        let mut extra = Map::new();
        extra.insert("message".into(), message("", "", &[]));
        return Ok(meta.loaded(extra));
    }
    let req = turn::chat_request(&st, openai)?;
    let mut turn = turn::prepare(&st, &req).await?;
    options::cap_to_num_ctx(
        &mut turn.params.max_tokens,
        turn.prompt.len(),
        extras.num_ctx,
    );
    let run = turn.start(&st, &client)?;
    meta.queued = started.elapsed();
    let model = Arc::clone(&st.model);
    if !stream {
        let reply = generate::collect_all(vec![run])
            .await?
            .pop()
            .ok_or(ServerError::ShuttingDown)?;
        turn.remember(&st, &client, &reply.text, &reply.finish);
        let parsed = turn.read(&reply.text);
        let mut v = meta.done(&reply.finish);
        v.insert(
            "message".into(),
            message(&parsed.content, &parsed.reasoning, &parsed.calls),
        );
        if extras.logprobs {
            let probs = super::logprobs(model.tokenizer(), &reply.finish.probs);
            v.insert("logprobs".into(), probs);
        }
        return Ok(Json(Value::Object(v)).into_response());
    }
    let mut reader = turn.reader();
    let want_probs = extras.logprobs;
    let format = move |_, ev: Event| -> Vec<Line> {
        match ev {
            Event::Progress(_) => Vec::new(),
            Event::Text(chunk) => {
                let probs = want_probs.then(|| super::logprobs(model.tokenizer(), &chunk.probs));
                line(&meta, reader.feed(&chunk.text), probs)
                    .into_iter()
                    .collect()
            }
            Event::Done(f) => {
                let mut out: Vec<Line> = line(&meta, reader.finish(), None).into_iter().collect();
                let calls = reader.calls();
                if !calls.is_empty() {
                    let mut m = meta.head();
                    m.insert("message".into(), message("", "", &calls));
                    out.push(Line(Value::Object(m)));
                }
                turn.remember(&st, &client, reader.text(), &f);
                let mut last = meta.done(&f);
                last.insert("message".into(), message("", "", &[]));
                out.push(Line(Value::Object(last)));
                out
            }
            Event::Failed(e) => vec![Line(OllamaError::from(e).json())],
        }
    };
    Ok(sse::stream(vec![run], format, Vec::new()).await?)
}

/// The fields of a chat request.
const KNOWN: &[&str] = &[
    "model",
    "messages",
    "tools",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
    "logprobs",
    "top_logprobs",
];

/// The assistant's message: its text, its thinking and its tool calls (the last two only when
/// there are some).
fn message(content: &str, thinking: &str, calls: &[ToolCall]) -> Value {
    let mut m = json!({ "role": "assistant", "content": content });
    if !thinking.is_empty() {
        m["thinking"] = json!(thinking);
    }
    if !calls.is_empty() {
        m["tool_calls"] = super::tool_calls(calls);
    }
    m
}

/// The streamed line of `pieces` of the reply (their thinking and text; tool calls come whole
/// at the end), with the tokens' probabilities when asked for; none when there is nothing to
/// say.
fn line(meta: &Meta, pieces: Vec<Piece>, probs: Option<Value>) -> Option<Line> {
    let (content, thinking) = super::split(pieces);
    if content.is_empty() && thinking.is_empty() && probs.is_none() {
        return None;
    }
    let mut m = meta.head();
    m.insert("message".into(), message(&content, &thinking, &[]));
    if let Some(p) = probs {
        m.insert("logprobs".into(), p);
    }
    Some(Line(Value::Object(m)))
}

/// The OpenAI chat body of an Ollama chat request, and what its options say beyond it.
fn convert(
    st: &AppState,
    body: &Map<String, Value>,
    messages: &[Value],
) -> Result<(Value, Extras), OllamaError> {
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(convert_messages(messages)?));
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) if list.is_empty() => {}
        Some(Value::Array(list)) => {
            out.insert("tools".into(), convert_tools(list)?);
            // Ollama's models may call several tools in one reply.
            out.insert("parallel_tool_calls".into(), json!(true));
        }
        Some(other) => return Err(OllamaError::bad(format!("tools: {other} is not a list"))),
    }
    let extras = options::apply(st, body, &mut out)?;
    Ok((Value::Object(out), extras))
}

/// Ollama's tools are OpenAI's function tools.
fn convert_tools(list: &[Value]) -> Result<Value, OllamaError> {
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            match t.get("type") {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if s == "function" => {}
                Some(other) => {
                    return Err(OllamaError::bad(format!(
                        "tools[{i}].type: {other} is not \"function\""
                    )))
                }
            }
            match t.get("function") {
                Some(f) if f.get("name").is_some_and(Value::is_string) => {
                    Ok(json!({ "type": "function", "function": f }))
                }
                _ => Err(OllamaError::bad(format!(
                    "tools[{i}].function: an object with a name is required"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// Ollama's messages as OpenAI's. Calls get ids where the client sent none (`call_I_J`), and a
/// `tool` message answers the call it names by `tool_call_id`, else the first unanswered
/// call of its `tool_name`, else the first unanswered call.
fn convert_messages(list: &[Value]) -> Result<Vec<Value>, OllamaError> {
    let mut out = Vec::with_capacity(list.len());
    // Calls not answered yet: (id, name).
    let mut pending: Vec<(String, String)> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let obj = m
            .as_object()
            .ok_or_else(|| OllamaError::bad(format!("messages[{i}]: an object is required")))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| OllamaError::bad(format!("messages[{i}].role: a string is required")))?;
        if obj
            .get("images")
            .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
        {
            return Err(OllamaError::no_images(&format!("messages[{i}].images")));
        }
        let content = match obj.get("content") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(OllamaError::bad(format!(
                    "messages[{i}].content: {other} is not a string"
                )))
            }
        };
        let mut msg = json!({ "role": role, "content": content });
        if let Some(t) = obj.get("thinking").and_then(Value::as_str) {
            if !t.is_empty() {
                msg["reasoning_content"] = json!(t);
            }
        }
        let calls = convert_calls(i, obj.get("tool_calls"), &mut pending)?;
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if role == "tool" {
            let name = obj
                .get("tool_name")
                .or_else(|| obj.get("name"))
                .and_then(Value::as_str);
            let id = match obj.get("tool_call_id").and_then(Value::as_str) {
                Some(id) => {
                    pending.retain(|(p, _)| p != id);
                    Some(id.to_owned())
                }
                None => pending
                    .iter()
                    .position(|(_, n)| Some(n.as_str()) == name)
                    .or_else(|| (!pending.is_empty()).then_some(0))
                    .map(|k| pending.remove(k).0),
            };
            if let Some(id) = id {
                msg["tool_call_id"] = json!(id);
            }
            if let Some(name) = name {
                msg["name"] = json!(name);
            }
        }
        out.push(msg);
    }
    Ok(out)
}

/// Message `i`'s `tool_calls` as OpenAI's (arguments as a JSON string), each added to
/// `pending`.
fn convert_calls(
    i: usize,
    calls: Option<&Value>,
    pending: &mut Vec<(String, String)>,
) -> Result<Vec<Value>, OllamaError> {
    let list = match calls {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "messages[{i}].tool_calls: {other} is not a list"
            )))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let f = c.get("function");
        let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str) else {
            return Err(OllamaError::bad(format!(
                "messages[{i}].tool_calls[{j}].function: an object with a name is required"
            )));
        };
        let arguments = match f.and_then(|f| f.get("arguments")) {
            None | Some(Value::Null) => "{}".to_owned(),
            Some(Value::String(s)) => s.clone(),
            Some(v @ Value::Object(_)) => v.to_string(),
            Some(other) => {
                return Err(OllamaError::bad(format!(
                    "messages[{i}].tool_calls[{j}].function.arguments: {other} is not an object"
                )))
            }
        };
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(|| format!("call_{i}_{j}"), str::to_owned);
        pending.push((id.clone(), name.to_owned()));
        out.push(json!({
            "id": id,
            "type": "function",
            "function": { "name": name, "arguments": arguments },
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_get_ids_and_results_answer_them() {
        let msgs = [
            json!({ "role": "user", "content": "Weather in Paris and Rome?" }),
            json!({ "role": "assistant", "content": "", "thinking": "Two calls.", "tool_calls": [
                { "function": { "name": "weather", "arguments": { "city": "Paris" } } },
                { "function": { "name": "time", "arguments": {} } },
            ] }),
            json!({ "role": "tool", "tool_name": "time", "content": "noon" }),
            json!({ "role": "tool", "content": "sunny" }),
        ];
        let out = convert_messages(&msgs).unwrap();
        assert_eq!(out[1]["reasoning_content"], "Two calls.");
        let calls = &out[1]["tool_calls"];
        assert_eq!(calls[0]["id"], "call_1_0");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(out[2]["tool_call_id"], "call_1_1");
        assert_eq!(out[2]["name"], "time");
        assert_eq!(out[3]["tool_call_id"], "call_1_0");
    }

    #[test]
    fn bad_messages_are_refused_by_name() {
        for (m, field) in [
            (json!("hi"), "messages[0]"),
            (json!({ "content": "hi" }), "messages[0].role"),
            (
                json!({ "role": "user", "content": 3 }),
                "messages[0].content",
            ),
            (
                json!({ "role": "user", "content": "x", "images": ["AAAA"] }),
                "messages[0].images",
            ),
            (
                json!({ "role": "assistant", "tool_calls": [{ "function": {} }] }),
                "messages[0].tool_calls[0]",
            ),
        ] {
            let e = convert_messages(&[m]).unwrap_err();
            assert!(e.message.starts_with(field), "{}", e.message);
        }
        // An empty list of images is no image.
        let ok = json!({ "role": "user", "content": "x", "images": [] });
        assert!(convert_messages(&[ok]).is_ok());
    }
}
