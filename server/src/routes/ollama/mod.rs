//! Ollama's API: `/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`, `/api/tags`,
//! `/api/show`, `/api/ps` and `/api/version`, so that tools written for Ollama (its Python
//! client, LangChain's `ChatOllama`, Open WebUI, Continue) reach this server unchanged.
//!
//! Each request is translated onto the internal request of the OpenAI chat (`options` become
//! the sampler's fields, `format` the JSON grammar, `think` the template's `enable_thinking`,
//! `tool_calls` arguments strings), then generated through the same [`super::turn`] path as the
//! Anthropic and Responses dialects. Answers stream as NDJSON (`application/x-ndjson`, one
//! object a line; `stream` is true unless the request says false), the last object with
//! `done: true` and the figures in nanoseconds. Errors answer `{"error": "..."}`. The
//! model-management endpoints (`pull`, `push`, `create`, `copy`, `delete`, `blobs`) are refused:
//! this server serves the model it was started with.

mod chat;
mod embed;
mod generate;
mod models;
mod options;
mod template;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use engine::chat::tools::{ToolCall, ToolCallEvent};
use engine::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use super::sse::Frame;
use super::turn::Piece;
use super::AppState;
use crate::error::ServerError;
use crate::scheduler::{Finish, FinishReason, TokenProbs};

/// The Ollama version `/api/version` reports: the API level these endpoints follow (that of
/// the `ollama` Python client 0.6.3), not this server's own version.
pub const OLLAMA_VERSION: &str = "0.13.0";

/// The routes of Ollama's API, merged into the server's router.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/chat", post(chat::chat))
        .route("/api/generate", post(generate::generate))
        .route("/api/embed", post(embed::embed))
        .route("/api/embeddings", post(embed::embeddings))
        .route("/api/tags", get(models::tags))
        .route("/api/show", post(models::show))
        .route("/api/ps", get(models::ps))
        .route("/api/version", get(version))
        .route("/api/pull", post(refused))
        .route("/api/push", post(refused))
        .route("/api/create", post(refused))
        .route("/api/copy", post(refused))
        .route("/api/delete", delete(refused))
        .route("/api/blobs/{digest}", post(refused).head(refused))
        .route("/api/{*rest}", any(unknown))
}

/// Whether `path` (after the API prefix) is one of Ollama's, whose errors (a missing API key
/// included) answer in Ollama's shape.
pub fn is_ollama_path(path: &str) -> bool {
    path.starts_with("/api/")
}

/// The answer to a request without a valid API key, in Ollama's shape.
pub fn unauthorized() -> Response {
    OllamaError::from(ServerError::Unauthorized).into_response()
}

/// An error in Ollama's shape, `{"error": "..."}`, with its status.
#[derive(Debug)]
pub struct OllamaError {
    status: StatusCode,
    message: String,
}

impl OllamaError {
    /// A request that cannot be served as sent: 400.
    fn bad(message: impl Into<String>) -> OllamaError {
        OllamaError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// Images need a multimodal model: 400, naming the field that carried them.
    fn no_images(field: &str) -> OllamaError {
        OllamaError::bad(format!(
            "{field}: this server runs a text-only model and reads no images; send text only"
        ))
    }

    /// The error as the JSON object clients read.
    fn json(&self) -> Value {
        json!({ "error": self.message })
    }
}

impl From<ServerError> for OllamaError {
    fn from(e: ServerError) -> OllamaError {
        OllamaError {
            status: e.status(),
            message: e.to_string(),
        }
    }
}

impl From<engine::Error> for OllamaError {
    fn from(e: engine::Error) -> OllamaError {
        OllamaError::from(ServerError::from(e))
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        (self.status, Json(self.json())).into_response()
    }
}

/// A request body as a JSON object; anything else is 400 in Ollama's shape.
fn parse_body(
    body: Result<super::RawBody, ServerError>,
) -> Result<Map<String, Value>, OllamaError> {
    let bytes = body?.0;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(OllamaError::bad("the request body must be a JSON object")),
        Err(e) => Err(OllamaError::bad(format!("invalid request body: {e}"))),
    }
}

/// Logs the fields of `body` that are not among `known` (an endpoint's fields), which are
/// then ignored, as Ollama's server ignores fields it does not know.
fn log_unknown(st: &AppState, endpoint: &str, body: &Map<String, Value>, known: &[&str]) {
    for name in body.keys().filter(|k| !known.contains(&k.as_str())) {
        st.metrics.log(format!(
            "ollama: {endpoint}: field {name:?} is not known; ignored"
        ));
    }
}

/// A request's `stream`: true unless it says false (Ollama's default).
fn stream_flag(body: &Map<String, Value>) -> Result<bool, OllamaError> {
    match body.get("stream") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(OllamaError::bad(format!("stream: {v} is not a boolean"))),
    }
}

/// A string field that must be empty or absent, refused by name when set: what this server
/// cannot do with it is `why`.
fn refuse_set(body: &Map<String, Value>, field: &str, why: &str) -> Result<(), OllamaError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(OllamaError::bad(format!("{field}: {why}"))),
    }
}

/// `GET /api/version`.
async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_VERSION }))
}

/// The model-management endpoints: this server serves the model it was started with.
async fn refused(uri: Uri) -> OllamaError {
    let what = match uri.path().rsplit("/api/").next().unwrap_or("") {
        "pull" => "pulling a model",
        "push" => "pushing a model",
        "create" => "creating a model",
        "copy" => "copying a model",
        "delete" => "deleting a model",
        _ => "uploading a model file",
    };
    OllamaError {
        status: StatusCode::NOT_IMPLEMENTED,
        message: format!(
            "{what} is not supported: this server serves the one model it was started with \
             (-m); start it with another model to serve that one"
        ),
    }
}

/// Any other path under `/api/`.
async fn unknown(uri: Uri) -> OllamaError {
    OllamaError {
        status: StatusCode::NOT_FOUND,
        message: format!("no such endpoint: {}", uri.path()),
    }
}

/// What every object of one answer shares: the model's name, and when the request came.
struct Meta {
    /// The name the request gave (Ollama echoes it), else the server's alias.
    model: String,
    /// When the handler started.
    started: Instant,
    /// How long the request took before its generation was queued (template, tokens,
    /// grammar): `load_duration`, since the model itself is loaded at start.
    queued: Duration,
}

impl Meta {
    fn new(st: &AppState, body: &Map<String, Value>, started: Instant) -> Meta {
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map_or_else(|| st.config.alias.clone(), str::to_owned);
        Meta {
            model,
            started,
            queued: Duration::ZERO,
        }
    }

    /// `model` and `created_at`, and `done: false`: the start of every streamed object.
    fn head(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("model".into(), json!(self.model));
        m.insert("created_at".into(), json!(rfc3339_now()));
        m.insert("done".into(), json!(false));
        m
    }

    /// The last object's fields: `done`, `done_reason` and the figures, in nanoseconds.
    fn done(&self, f: &Finish) -> Map<String, Value> {
        let ns = |ms: f64| (ms * 1e6).max(0.0) as u64;
        let mut m = self.head();
        m.insert("done".into(), json!(true));
        m.insert("done_reason".into(), json!(done_reason(f)));
        m.insert(
            "total_duration".into(),
            json!(self.started.elapsed().as_nanos() as u64),
        );
        m.insert("load_duration".into(), json!(self.queued.as_nanos() as u64));
        m.insert("prompt_eval_count".into(), json!(f.prompt_n));
        m.insert("prompt_eval_duration".into(), json!(ns(f.prompt_ms)));
        m.insert("eval_count".into(), json!(f.predicted_n));
        m.insert("eval_duration".into(), json!(ns(f.predicted_ms)));
        m
    }

    /// The answer to a request with nothing to generate (an empty chat or prompt), which
    /// Ollama's clients send to load a model: `done_reason` `load`, with `extra`'s fields.
    fn loaded(&self, extra: Map<String, Value>) -> Response {
        let mut m = self.head();
        m.extend(extra);
        m.insert("done".into(), json!(true));
        m.insert("done_reason".into(), json!("load"));
        Json(Value::Object(m)).into_response()
    }
}

/// Ollama's `done_reason`: `length` when `num_predict` or the context cut the reply.
fn done_reason(f: &Finish) -> &'static str {
    match f.reason {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// One line of an NDJSON stream.
struct Line(Value);

impl Frame for Line {
    const CONTENT_TYPE: &'static str = "application/x-ndjson";

    fn frame(&self) -> String {
        format!("{}\n", self.0)
    }
}

/// The text and the thinking of `pieces` of a reply, each joined (tool calls are read whole
/// at the end).
fn split(pieces: Vec<Piece>) -> (String, String) {
    let (mut content, mut thinking) = (String::new(), String::new());
    for p in pieces {
        match p {
            Piece::Reasoning(s) => thinking.push_str(&s),
            Piece::Reply(ToolCallEvent::Content(s)) => content.push_str(&s),
            Piece::Reply(_) => {}
        }
    }
    (content, thinking)
}

/// Tool calls as Ollama writes them: arguments as an object (`{}` when the model wrote no
/// valid JSON object), with the call's id and index.
fn tool_calls(calls: &[ToolCall]) -> Value {
    let list = calls
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let arguments = serde_json::from_str::<Value>(&c.arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            json!({
                "id": c.id,
                "function": { "index": index, "name": c.name, "arguments": arguments },
            })
        })
        .collect();
    Value::Array(list)
}

/// Ollama's `logprobs`: each generated token's text, log-probability and bytes, with the most
/// likely alternatives.
fn logprobs(tok: &Tokenizer, probs: &[TokenProbs]) -> Value {
    let entry = |id: u32, logprob: f32| {
        let bytes = tok.token_bytes(id);
        // JSON has no -inf: an impossible token shows as a very unlikely one.
        let logprob = if logprob.is_finite() {
            logprob
        } else {
            -9999.0
        };
        json!({ "token": String::from_utf8_lossy(bytes), "logprob": logprob, "bytes": bytes })
    };
    let list = probs
        .iter()
        .map(|p| {
            let mut v = entry(p.prob.id, p.prob.logprob);
            let top: Vec<Value> = p.top.iter().map(|t| entry(t.id, t.logprob)).collect();
            v["top_logprobs"] = Value::Array(top);
            v
        })
        .collect();
    Value::Array(list)
}

/// Now as RFC 3339 in UTC with microseconds (`2025-01-02T03:04:05.678901Z`).
fn rfc3339_now() -> String {
    rfc3339(kvstore::since_epoch())
}

/// `since_epoch` as RFC 3339 in UTC with microseconds.
pub(crate) fn rfc3339(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since_epoch.subsec_micros()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's method).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000000Z");
        // 2024-02-29 (a leap day) 12:34:56.789012.
        let t = Duration::from_secs(1_709_210_096) + Duration::from_micros(789_012);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.789012Z");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn paths_under_api_are_ollamas() {
        assert!(is_ollama_path("/api/chat"));
        assert!(!is_ollama_path("/v1/chat/completions"));
        assert!(!is_ollama_path("/apiary"));
    }
}
