//! `/slots` (list, save, restore, erase) and `/metrics`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;
use tokio::sync::oneshot;

use super::{AppState, RawBody};
use crate::error::{Result, ServerError};
use crate::metrics::StoreBytes;
use crate::request;
use crate::scheduler::Command;

/// `GET /slots`.
pub async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Value>> {
    if !st.config.slots_endpoint {
        return Err(ServerError::NotEnabled {
            what: "the /slots endpoint",
            how: "start the server without --no-slots",
        });
    }
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Slots(reply))
        .map_err(|_| ServerError::ShuttingDown)?;
    Ok(Json(rx.await.map_err(|_| ServerError::ShuttingDown)?))
}

/// `POST /slots/{id}?action=save|restore|erase`.
pub async fn action(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    let action = query.get("action").map(String::as_str);
    let (id, action) = request::slot_action(&id, action, &body, &st.limits())?;
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Slot { id, action, reply })
        .map_err(|_| ServerError::ShuttingDown)?;
    Ok(Json(rx.await.map_err(|_| ServerError::ShuttingDown)??))
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
