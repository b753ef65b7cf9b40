//! `/slots` (list, save, restore, erase) and `/metrics`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::oneshot;

use super::{AppState, JsonBody};
use crate::error::{Result, ServerError};
use crate::metrics::StoreBytes;
use crate::scheduler::{Command, SlotAction};

/// Longest slot filename.
const MAX_NAME: usize = 100;

/// `GET /slots`.
pub async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Value>> {
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Slots(reply))
        .map_err(|_| ServerError::ShuttingDown)?;
    Ok(Json(rx.await.map_err(|_| ServerError::ShuttingDown)?))
}

/// `POST /slots/{id}` body.
#[derive(Default, Deserialize)]
pub struct SlotRequest {
    filename: Option<String>,
}

/// `POST /slots/{id}?action=save|restore|erase`.
pub async fn action(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    JsonBody(body): JsonBody<Option<SlotRequest>>,
) -> Result<Json<Value>> {
    let id: usize = id
        .parse()
        .map_err(|_| ServerError::BadRequest(format!("slot id {id:?} is not a number")))?;
    if id >= st.n_slots {
        return Err(ServerError::UnknownSlot {
            id,
            n_slots: st.n_slots,
        });
    }
    let body = body.unwrap_or_default();
    let filename = || -> Result<String> {
        let name = body
            .filename
            .clone()
            .ok_or_else(|| ServerError::BadRequest("\"filename\" is required".into()))?;
        check_filename(&name)?;
        Ok(name)
    };
    let action = match query.get("action").map(String::as_str) {
        Some("save") => SlotAction::Save(filename()?),
        Some("restore") => SlotAction::Restore(filename()?),
        Some("erase") => SlotAction::Erase,
        Some(other) => {
            return Err(ServerError::BadRequest(format!(
                "unknown action {other:?}: save, restore or erase"
            )))
        }
        None => return Err(ServerError::BadRequest("the query needs ?action=".into())),
    };
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Slot { id, action, reply })
        .map_err(|_| ServerError::ShuttingDown)?;
    Ok(Json(rx.await.map_err(|_| ServerError::ShuttingDown)??))
}

/// A slot filename is a checkpoint name: no path separators, no `..`, nothing absolute, and not
/// a name of the prompt cache's own tails.
fn check_filename(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && !name.starts_with(engine::store::TAIL_PREFIX)
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ServerError::BadFilename { name: name.into() })
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
    let text = st.metrics.render(bytes);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::check_filename;

    #[test]
    fn slot_filenames_cannot_leave_the_store() {
        for bad in ["", "../x", "a/b", "/abs", "a\\b", "..", ".hidden", "a..b"] {
            assert!(check_filename(bad).is_err(), "{bad:?} was accepted");
        }
        for good in ["chat1", "agent.v2", "a-b_c"] {
            assert!(check_filename(good).is_ok(), "{good:?} was refused");
        }
    }
}
