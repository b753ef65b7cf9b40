//! OpenAI's Responses API: `POST /v1/responses`, `GET /v1/responses/{id}`,
//! `DELETE /v1/responses/{id}` and `POST /v1/responses/input_tokens`.
//!
//! A request's `input` items (messages, `function_call`, `function_call_output`, `reasoning`)
//! become the chat the template renders, after the conversation of `previous_response_id`
//! when one is given. Each stored response (`store`, on by default) keeps its whole
//! conversation, input and output items as JSON, in a file of its own under `responses/` in
//! the cache directory (in memory with `--no-cache`), so a conversation continues by id after
//! a restart; its prompt's KV comes from the prompt cache then, and only the new tokens are
//! computed. Errors answer in OpenAI's shape. A stored response is its API key's: another
//! key reads, continues and deletes it no more than an id that does not exist (`store.rs`).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::cache_admin::tenant;
use super::turn;
use super::{AppState, ClientKey, RawBody};
use crate::error::ServerError;

mod convert;
mod output;
mod store;
mod stream;

use convert::{convert, to_messages};
use output::{output_items, Head};
use store::{delete, load, record, save};
use stream::Stream;

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
    Extension(client): Extension<ClientKey>,
    body: Result<RawBody, ServerError>,
) -> Response {
    match respond(st, client, body).await {
        Ok(r) => r,
        Err(Fail(r)) => *r,
    }
}

/// `GET /v1/responses/{id}`: a stored response of the request's key.
pub async fn fetch(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    match load(&st, tenant(&st, &client).as_deref(), &id).await {
        Ok(Some(record)) => Json(record["response"].clone()).into_response(),
        Ok(None) => not_found(format!("Response with id '{id}' not found."), None)
            .0
            .into_response(),
        Err(Fail(r)) => *r,
    }
}

/// `DELETE /v1/responses/{id}`: forgets a stored response of the request's key.
pub async fn remove(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    match delete(&st, tenant(&st, &client).as_deref(), &id).await {
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
    "cache_salt",
    "cache_ttl",
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

/// A request as parsed: its body, what it asks, the conversation so far (after that of
/// `previous_response_id`), its key's tenant and the chat it renders.
struct Parsed {
    body: Value,
    asked: Asked,
    conversation: Vec<Value>,
    tenant: Option<String>,
    chat: Value,
}

async fn parse(
    st: &Arc<AppState>,
    client: &ClientKey,
    body: Result<RawBody, ServerError>,
) -> Result<Parsed, Fail> {
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
    let tenant = tenant(st, client);
    if let Some(prev) = &asked.previous {
        let record = load(st, tenant.as_deref(), prev).await?.ok_or_else(|| {
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
    Ok(Parsed {
        body,
        asked,
        conversation,
        tenant,
        chat,
    })
}

/// `POST /v1/responses/input_tokens`: how many tokens the request's prompt takes; nothing is
/// generated or stored.
pub async fn input_tokens(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    body: Result<RawBody, ServerError>,
) -> Response {
    super::info::rouse(&st).await;
    let count = async {
        let parsed = parse(&st, &client, body).await?;
        let req = turn::chat_request(&st, parsed.chat)?;
        Ok::<_, Fail>(turn::prepare(&st, &req).await?.prompt.len())
    };
    match count.await {
        Ok(n) => {
            Json(json!({ "object": "response.input_tokens", "input_tokens": n })).into_response()
        }
        Err(Fail(r)) => *r,
    }
}

async fn respond(
    st: Arc<AppState>,
    client: ClientKey,
    body: Result<RawBody, ServerError>,
) -> Result<Response, Fail> {
    let Parsed {
        body,
        asked,
        conversation,
        tenant,
        chat,
    } = parse(&st, &client, body).await?;
    let mut req = turn::chat_request(&st, chat)?;
    req.params.cache_salt = crate::request::cache_salt(&body).map_err(bad)?;
    req.params.cache_ttl = crate::request::cache_ttl(&body).map_err(bad)?;
    let timings_per_token = req.output.timings_per_token;
    let turn = turn::prepare(&st, &req).await?;
    let run = turn.start(&st, &client)?;
    let head = Head {
        id: turn::random_id("resp"),
        created_at: kvstore::unix_now(),
        model: st.config.alias.clone(),
        asked,
        tenant,
    };
    if !head.asked.stream {
        let reply = super::generate::collect_all(vec![run])
            .await?
            .pop()
            .ok_or(ServerError::ShuttingDown)?;
        turn.remember(&st, &client, &reply.text, &reply.finish);
        let output = output_items(&turn.read(&reply.text), &reply.finish);
        let response = head.response(&output, Some(&reply.finish));
        keep(&st, &head, &response, conversation, &output).await?;
        return Ok(Json(response).into_response());
    }
    let state = Stream {
        seq: 0,
        head,
        reader: turn.reader(),
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
    Ok(turn.stream(&st, &client, run, state).await?)
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
    let record = record(response, conversation, head.tenant.as_deref());
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
