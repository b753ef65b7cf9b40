//! Stored responses: one file each under `responses/` in the cache directory, or memory.
//!
//! Each record names the tenant that stored it ([`crate::routes::cache_admin::tenant`]: a
//! hash, never the API key) when there was one, and is found only by that tenant: another
//! tenant's id answers as one that does not exist. A record that names none (stored without
//! keys, or by an older version) is found only by requests without a tenant.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use super::{io_error, Fail};
use crate::routes::AppState;

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

/// The record's field naming the tenant that stored it.
const TENANT: &str = "tenant";

/// The record of a response: `{"response", "conversation"}`, and `"tenant"` when it has one.
pub(super) fn record(response: &Value, conversation: Vec<Value>, tenant: Option<&str>) -> Value {
    let mut record = serde_json::json!({ "response": response, "conversation": conversation });
    if let Some(t) = tenant {
        record[TENANT] = Value::from(t);
    }
    record
}

/// Whether `record` is `tenant`'s: it names that tenant, or names none and `tenant` is none.
fn owned_by(record: &Value, tenant: Option<&str>) -> bool {
    record.get(TENANT).and_then(Value::as_str) == tenant
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
pub(super) fn save(st: &AppState, id: &str, record: &Value) -> std::io::Result<()> {
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

/// The stored record of response `id` ([`record`]), if `tenant` has one of that id.
pub(super) async fn load(
    st: &Arc<AppState>,
    tenant: Option<&str>,
    id: &str,
) -> Result<Option<Value>, Fail> {
    Ok(read(st, id).await?.filter(|r| owned_by(r, tenant)))
}

/// The stored record of response `id`, whoever stored it.
async fn read(st: &Arc<AppState>, id: &str) -> Result<Option<Value>, Fail> {
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

/// Forgets response `id`; false when `tenant` has none of that id.
pub(super) async fn delete(
    st: &Arc<AppState>,
    tenant: Option<&str>,
    id: &str,
) -> Result<bool, Fail> {
    if !valid_id(id) {
        return Ok(false);
    }
    let Some(dir) = store_dir(st) else {
        let mut mem = memory().lock().unwrap_or_else(|e| e.into_inner());
        let Some((map, order)) = mem.get_mut(&server_key(st)) else {
            return Ok(false);
        };
        if !map.get(id).is_some_and(|r| owned_by(r, tenant)) {
            return Ok(false);
        }
        order.retain(|o| o != id);
        return Ok(map.remove(id).is_some());
    };
    // Ids are random and never reused: the record read is the one removed.
    if load(st, tenant, id).await?.is_none() {
        return Ok(false);
    }
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
