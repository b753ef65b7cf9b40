//! `GET /cache/conversations` and `DELETE /cache/conversations/{id}`: the conversations the
//! server finished for the request's tenant ([`super::cache_admin::tenant`], as pins are
//! kept), behind the API key like every endpoint but the public ones. The web page lists
//! them; any client may.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::cache_admin::tenant;
use super::{AppState, ClientKey};
use crate::conversations::{self, Conversation, TurnFigures};
use crate::error::{Result, ServerError};
use crate::scheduler::Finish;

/// `GET /cache/conversations`: `{"conversations": [...]}`, the most recently continued first,
/// each with its `id`, `title` (its first user message, cut), `messages` (its last reply
/// included), `tokens`, `bytes` (the KV those tokens take in the cache, at the server's
/// cache types), `created_unix`, `last_used_unix` and its last turn's `timings` (`cache_n`,
/// `prompt_n`, `prompt_ms`, `predicted_n`, `predicted_ms`).
pub async fn list(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
) -> Result<Json<Value>> {
    let owner = tenant(&st, &client);
    let found = st
        .conversations
        .lock()
        .map(|c| c.list(owner.as_deref()))
        .unwrap_or_default();
    let per_token = engine::KvLayout::with_types(
        st.model.hparams(),
        st.config.args.cache_type_k,
        st.config.args.cache_type_v,
    )
    .map_or(0, |l| l.bytes_per_token() as u64);
    let items: Vec<Value> = found.iter().map(|c| shape(c, per_token)).collect();
    Ok(Json(json!({ "object": "list", "conversations": items })))
}

/// `DELETE /cache/conversations/{id}`: takes the conversation off the list (its cached prompt
/// stays: `POST /cache/clear` clears a namespace's). 404 when the request's tenant has no
/// such conversation.
pub async fn forget(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let owner = tenant(&st, &client);
    let gone = conversations::id_ok(&id)
        && st
            .conversations
            .lock()
            .is_ok_and(|mut c| c.forget(owner.as_deref(), &id));
    if gone {
        Ok(Json(json!({ "id": id, "deleted": true })))
    } else {
        Err(ServerError::NotFound(format!("no conversation {id:?}")))
    }
}

/// Records a finished turn: `messages` then `reply` (the reply's text outside reasoning and
/// tool calls) in `client`'s list, with the tokens of prompt and reply.
pub(super) fn record(
    st: &AppState,
    client: &ClientKey,
    messages: &[Value],
    reply: &str,
    f: &Finish,
) {
    let mut all = messages.to_vec();
    all.push(json!({ "role": "assistant", "content": reply }));
    let figures = TurnFigures {
        cache_n: f.cache_n,
        prompt_n: f.prompt_n,
        prompt_ms: f.prompt_ms,
        predicted_n: f.predicted_n,
        predicted_ms: f.predicted_ms,
    };
    let owner = tenant(st, client);
    if let Ok(mut list) = st.conversations.lock() {
        list.record(
            owner.as_deref(),
            all,
            f.n_prompt + f.tokens.len(),
            figures,
            super::unix_now(),
        );
    }
}

/// The most characters of a title.
const TITLE_CHARS: usize = 80;

/// One conversation as JSON.
fn shape(c: &Conversation, bytes_per_token: u64) -> Value {
    let title: String = c
        .messages
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(conversations::text)
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(TITLE_CHARS)
        .collect();
    json!({
        "id": c.id,
        "title": title,
        "messages": c.messages,
        "tokens": c.tokens,
        "bytes": (c.tokens as u64).saturating_mul(bytes_per_token),
        "created_unix": c.created_unix,
        "last_used_unix": c.last_used_unix,
        "timings": c.last,
    })
}
