//! `/slots` (list, save, restore, erase) and `/metrics`.
//!
//! With API keys, a slot action is scoped to the request's key ([`crate::scheduler::SlotScope`],
//! [`crate::scheduler::slot_file`]).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::Value;
use tokio::sync::oneshot;

use super::cache_admin::tenant;
use super::{AppState, ClientKey, RawBody};
use crate::error::{Result, ServerError};
use crate::metrics::StoreBytes;
use crate::request;
use crate::scheduler::{slot_file, Command, SlotAction, SlotScope};

/// `GET /slots`: with API keys, a slot whose conversation is not in the request's namespace
/// shows no tokens (its key's, without a salt).
pub async fn list(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
) -> Result<Json<Value>> {
    if !st.config.slots_endpoint {
        return Err(ServerError::NotEnabled {
            what: "the /slots endpoint",
            how: "start the server without --no-slots",
        });
    }
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Slots {
            scope: scope(&st, &client, None),
            reply,
        })
        .map_err(|_| ServerError::ShuttingDown)?;
    Ok(Json(rx.await.map_err(|_| ServerError::ShuttingDown)?))
}

/// `POST /slots/{id}?action=save|restore|erase`, within the request's key: its own saves, and
/// conversations in its namespace (its key's, with the body's `cache_salt`).
pub async fn action(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    let action = query.get("action").map(String::as_str);
    let (id, action) = request::slot_action(&id, action, &body, &st.limits())?;
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let salt = request::cache_salt(&v).map_err(|e| ServerError::BadRequest(e.into()))?;
    let scope = scope(&st, &client, salt.as_deref());
    let tenant = tenant(&st, &client);
    let file = |name: &str| slot_file(tenant.as_deref(), name);
    let action = match action {
        SlotAction::Save { name, overwrite } => SlotAction::Save {
            name: file(&name),
            overwrite,
        },
        SlotAction::Restore(name) => SlotAction::Restore(file(&name)),
        SlotAction::Erase => SlotAction::Erase,
    };
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Slot {
            id,
            action,
            scope,
            reply,
        })
        .map_err(|_| ServerError::ShuttingDown)?;
    Ok(Json(rx.await.map_err(|_| ServerError::ShuttingDown)??))
}

/// Whose slot conversations a request of `client` with `salt` reaches: every one without a
/// tenant ([`tenant`]); under `--cache-isolation key` those of its namespace; none under
/// `salt`, where a namespace does not tell keys apart.
fn scope(st: &AppState, client: &ClientKey, salt: Option<&str>) -> SlotScope {
    if tenant(st, client).is_none() {
        return SlotScope::All;
    }
    let keyed = st.config.args.cache_isolation == crate::args::CacheIsolation::Key;
    match st.namespace(client, salt) {
        Some(ns) if keyed => SlotScope::Namespace(ns),
        _ => SlotScope::Nothing,
    }
}

/// `GET /metrics` (with `--metrics`): Prometheus text.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Result<Response> {
    if !st.config.args.metrics {
        return Err(ServerError::NotEnabled {
            what: "/metrics",
            how: "start the server with --metrics",
        });
    }
    let bytes = st.store.as_ref().map_or_else(StoreBytes::default, |s| {
        let m = s.metrics();
        StoreBytes {
            read: m.bytes_read,
            written: m.bytes_written,
            on_disk: m.disk_bytes,
        }
    });
    let mut text = st.metrics.render(bytes);
    if let Some(remote) = st.store.as_ref().and_then(|s| s.remote_figures()) {
        crate::metrics::render_remote(&remote, &mut text);
    }
    Ok((
        [
            (header::CONTENT_TYPE, "text/plain; version=0.0.4".to_owned()),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                st.started_unix.to_string(),
            ),
        ],
        text,
    )
        .into_response())
}
