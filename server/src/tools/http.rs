//! `GET /tools` and `POST /tools` as routes of any state, so the single-model server and the
//! router serve the same ones; 403 for both when the tools are off, as llama-server answers.
//! A stream sends an SSE comment after each second of silence, so that a client gone is
//! noticed (and its command killed) while the command prints nothing.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt as _;

use super::{Call, Tools};
use crate::error::ServerError;

/// The `/tools` routes over `tools` (off when `None`).
pub fn routes<S: Clone + Send + Sync + 'static>(tools: Option<Arc<Tools>>) -> Router<S> {
    let Some(tools) = tools else {
        return Router::new().route("/tools", get(disabled).post(disabled));
    };
    let listed = Arc::clone(&tools);
    Router::new().route(
        "/tools",
        get(move || {
            let tools = Arc::clone(&listed);
            async move { Json(Value::Array(tools.list().await)) }
        })
        .post(move |headers: HeaderMap, body: Bytes| {
            let tools = Arc::clone(&tools);
            async move { post(tools, headers, body).await }
        }),
    )
}

async fn disabled() -> Response {
    let body =
        json!({"error": {"message": "this feature is disabled", "type": "feature_disabled"}});
    (StatusCode::FORBIDDEN, Json(body)).into_response()
}

/// A header's value, when given and not empty.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The call a request makes.
fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Call, ServerError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ServerError::BadJson {
        reason: e.to_string(),
    })?;
    let tool = v
        .get("tool")
        .and_then(Value::as_str)
        .ok_or_else(|| ServerError::BadRequest("\"tool\" must be a string".into()))?;
    let mut params = v.get("params").cloned().unwrap_or_else(|| json!({}));
    // What the headers say is the client's; the model's parameters cannot set it.
    if let Some(map) = params.as_object_mut() {
        for key in ["cwd", "runtime", "resp_type"] {
            map.remove(key);
        }
    }
    Ok(Call {
        tool: tool.to_owned(),
        params,
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        cwd: header_text(headers, "x-tool-cwd"),
        runtime: header_text(headers, "x-tool-runtime"),
        resp_type: header_text(headers, "x-resp-type"),
    })
}

async fn post(tools: Arc<Tools>, headers: HeaderMap, body: Bytes) -> Response {
    let call = match parse(&headers, &body) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    if !call.stream {
        return match tools.call(call, None).await {
            Ok(v) => Json(v).into_response(),
            Err(e) => ServerError::from(e).into_response(),
        };
    }
    if let Err(e) = tools.check(&call).await {
        return ServerError::from(e).into_response();
    }
    let (frames, body) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let (sink, mut chunks) = mpsc::channel::<String>(16);
        let forward = async {
            loop {
                // A quiet command still writes now and then: only a write finds a client gone.
                let next = match tokio::time::timeout(HEARTBEAT, chunks.recv()).await {
                    Ok(Some(chunk)) => frame(&json!({ "chunk": chunk })),
                    Ok(None) => break,
                    Err(_) => Bytes::from_static(b": keep-alive\n\n"),
                };
                if frames.send(next).await.is_err() {
                    // The client is gone: dropping the receiver stops the tool.
                    break;
                }
            }
            drop(chunks);
        };
        let (reply, ()) = tokio::join!(tools.call(call, Some(sink)), forward);
        let done = match reply {
            Ok(v) => match v.get("error") {
                Some(e) => json!({ "done": true, "error": e }),
                None => json!({ "done": true }),
            },
            Err(e) => json!({ "done": true, "error": ServerError::from(e).to_string() }),
        };
        let _ = frames.send(frame(&done)).await;
    });
    let stream = ReceiverStream::new(body).map(Ok::<Bytes, Infallible>);
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// How long a stream stays silent before a comment line is sent.
const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}
