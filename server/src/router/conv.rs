//! Conversation streams through the router: a streamed request with `X-Conversation-Id` is
//! recorded by the model process that serves it, and `GET /v1/stream?conv_id=` (resume) or
//! `DELETE /v1/stream?conv_id=` (stop) must reach that process. The router remembers which model
//! each conversation went to; while that model loads, a resume is told to retry (503) and a stop
//! cancels the request that waits for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use super::pool::Status;
use super::RouterState;
use crate::error::ServerError;
use crate::routes::ClientKey;

/// The header naming a request's conversation.
pub const HEADER: &str = "x-conversation-id";

/// Conversations remembered at most; past it the oldest is forgotten (its stream then answers
/// 404 through the router, as an expired one does).
const MAX_CONVERSATIONS: usize = 4096;

struct Conv {
    model: String,
    ticket: u64,
    stop: watch::Sender<bool>,
}

/// A request's news of a stop of its conversation.
pub struct Stopped(watch::Receiver<bool>);

impl Stopped {
    /// Completes when the request is stopped (never, once a newer request of the conversation
    /// took its place).
    pub async fn wait(mut self) {
        if self.0.wait_for(|&s| s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Which model serves each conversation, and the stops asked of requests still waiting.
#[derive(Default)]
pub struct Conversations {
    /// By the API key that sent the conversation (another key's are not its to resume or
    /// stop), and the id.
    map: Mutex<HashMap<(ClientKey, String), Conv>>,
    next: AtomicU64,
}

impl Conversations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(ClientKey, String), Conv>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `client`'s conversation `id`'s newest request goes to `model`; what tells
    /// that request it was stopped.
    pub fn remember(&self, client: ClientKey, id: &str, model: &str) -> Stopped {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let key = (client, id.to_owned());
        let mut map = self.lock();
        if map.len() >= MAX_CONVERSATIONS && !map.contains_key(&key) {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, c)| c.ticket)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        let (stop, rx) = watch::channel(false);
        map.insert(
            key,
            Conv {
                model: model.to_owned(),
                ticket,
                stop,
            },
        );
        Stopped(rx)
    }

    fn model(&self, client: ClientKey, id: &str) -> Option<String> {
        self.lock()
            .get(&(client, id.to_owned()))
            .map(|c| c.model.clone())
    }

    /// Forgets `client`'s conversation `id`, stopping its request if it still waits; its model.
    fn forget(&self, client: ClientKey, id: &str) -> Option<String> {
        let c = self.lock().remove(&(client, id.to_owned()))?;
        c.stop.send_replace(true);
        Some(c.model)
    }
}

#[derive(serde::Deserialize)]
struct ConvQuery {
    conv_id: Option<String>,
}

fn conv_id(req: &Request) -> Option<String> {
    axum::extract::Query::<ConvQuery>::try_from_uri(req.uri())
        .ok()
        .and_then(|q| q.0.conv_id)
        .filter(|id| !id.is_empty())
}

/// `POST /v1/streams/lookup` with `{"conversation_ids": [...]}`: each loaded model that serves
/// some of the ids is asked about those, and the answers are joined.
pub async fn lookup(State(st): State<Arc<RouterState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let client = parts
        .extensions
        .get::<ClientKey>()
        .copied()
        .unwrap_or_default();
    let Ok(body) = axum::body::to_bytes(body, st.config.max_body).await else {
        return ServerError::BodyTooLarge {
            limit: st.config.max_body,
        }
        .into_response();
    };
    let asked: Vec<String> = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v) => v["conversation_ids"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|i| i.as_str())
                    .filter(|i| !i.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        Err(e) => return ServerError::BadRequest(format!("invalid body: {e}")).into_response(),
    };
    // The ids each model serves (an id also names its `ID::model` variants).
    let mut by_model: HashMap<String, Vec<String>> = HashMap::new();
    {
        let map = st.convs.lock();
        for id in &asked {
            let variant = format!("{id}::");
            for ((key, conv), c) in map.iter() {
                if *key == client && (conv == id || conv.starts_with(&variant)) {
                    let ids = by_model.entry(c.model.clone()).or_default();
                    if !ids.contains(id) {
                        ids.push(id.clone());
                    }
                }
            }
        }
    }
    let mut found = Vec::new();
    for (model, ids) in by_model {
        if st.pool.status(&model).port().is_none() {
            continue;
        }
        let one = serde_json::json!({ "conversation_ids": ids }).to_string();
        let uri = parts
            .extensions
            .get::<axum::extract::OriginalUri>()
            .map_or(&parts.uri, |o| &o.0);
        let mut ask = axum::http::Request::builder()
            .method(parts.method.clone())
            .uri(uri.clone());
        for (name, value) in &parts.headers {
            ask = ask.header(name, value);
        }
        let Ok(ask) = ask.body(()) else { continue };
        let (ask, ()) = ask.into_parts();
        let resp = super::pass(&st, &model, false, ask, one.into()).await;
        if resp.status() != StatusCode::OK {
            continue;
        }
        if let Ok(bytes) = axum::body::to_bytes(resp.into_body(), usize::MAX).await {
            if let Ok(serde_json::Value::Array(items)) = serde_json::from_slice(&bytes) {
                found.extend(items);
            }
        }
    }
    axum::Json(serde_json::Value::Array(found)).into_response()
}

fn missing() -> Response {
    ServerError::BadRequest("Missing conversation id in path".into()).into_response()
}

/// The API key a request came with (as the router's key check found it).
fn client_of(req: &Request) -> ClientKey {
    req.extensions()
        .get::<ClientKey>()
        .copied()
        .unwrap_or_default()
}

fn not_found() -> Response {
    ServerError::NotFound("Stream not found or expired".into()).into_response()
}

/// `GET /v1/stream?conv_id=ID&from=N`: passed on to the process serving the conversation.
pub async fn resume(State(st): State<Arc<RouterState>>, req: Request) -> Response {
    let Some(id) = conv_id(&req) else {
        return missing();
    };
    let Some(model) = st.convs.model(client_of(&req), &id) else {
        return not_found();
    };
    match st.pool.status(&model) {
        Status::Loaded(_) | Status::Sleeping(_) => {
            let (parts, _) = req.into_parts();
            super::pass(&st, &model, false, parts, Default::default()).await
        }
        Status::Loading => {
            ServerError::ModelUnavailable("Stream owner model is loading, retry later".into())
                .into_response()
        }
        _ => not_found(),
    }
}

/// `DELETE /v1/stream?conv_id=ID`: stops the conversation's generation, in its process or
/// while it waits for its model.
pub async fn stop(State(st): State<Arc<RouterState>>, req: Request) -> Response {
    let Some(id) = conv_id(&req) else {
        return missing();
    };
    // As llama-server's router: 204 whether or not the conversation is known.
    let Some(model) = st.convs.forget(client_of(&req), &id) else {
        return StatusCode::NO_CONTENT.into_response();
    };
    if st.pool.status(&model).port().is_some() {
        let (parts, _) = req.into_parts();
        return super::pass(&st, &model, false, parts, Default::default()).await;
    }
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_id_is_read_decoded() {
        let req = Request::get("/v1/stream?from=3&conv_id=conv%3A%3Aorg%2Fm%3AQ8_0+x")
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(conv_id(&req).as_deref(), Some("conv::org/m:Q8_0 x"));
        let req = Request::get("/v1/stream?conv_id=")
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(conv_id(&req), None);
    }

    #[tokio::test]
    async fn a_stop_reaches_the_waiting_request_only() {
        let c = Conversations::default();
        let me = ClientKey::default();
        let old = c.remember(me, "x", "m");
        let new = c.remember(me, "x", "m");
        assert_eq!(c.forget(me, "x").as_deref(), Some("m"));
        new.wait().await;
        // The older request was replaced: it is never told.
        assert!(!*old.0.borrow());
        assert_eq!(c.forget(me, "x"), None);
        // Another key neither finds nor stops a conversation of the same id.
        let theirs = c.remember(ClientKey::of("b"), "y", "m");
        assert_eq!(c.forget(me, "y"), None);
        assert_eq!(c.model(me, "y"), None);
        assert!(!*theirs.0.borrow());
        assert_eq!(c.model(ClientKey::of("b"), "y").as_deref(), Some("m"));
    }
}
