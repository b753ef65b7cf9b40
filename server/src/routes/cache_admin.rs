//! The operator's side of the prompt cache, behind the API key like every other endpoint:
//! `POST /cache/pin` (a prompt computed if need be, then kept: its full blocks are never
//! dropped by the disk budget, until unpinned or expired), `DELETE /cache/pin/{id}` and
//! `GET /cache` (what each tier holds, the pins, where prompts came from).
//!
//! Pins are kept per tenant ([`tenant`]): a client sees, replaces and deletes only its own
//! key's, and another key's pin id answers as one that does not exist.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{generate, AppState, ClientKey, RawBody};
use crate::cache::{pin_key, pin_of};
use crate::error::{Result, ServerError};
use crate::request;
use crate::scheduler::Command;
use promptcache::StoreExt as _;

/// The tenant a request acts for, when the server has API keys and `--cache-isolation` is
/// not `none`: a hash of its key's hash (neither the key nor its cache namespace can be read
/// from it), as 32 hex digits. `None` (every client one tenant, as without keys) otherwise.
/// Pins, stored responses and `/slots` saves are kept per tenant.
pub(super) fn tenant(st: &AppState, client: &ClientKey) -> Option<String> {
    if st.config.args.cache_isolation == crate::args::CacheIsolation::None {
        return None;
    }
    let key = client.0?;
    let tag = blake3::derive_key("llama-hdd 2026 tenant of an API key", &key);
    Some(blake3::Hash::from(tag).to_hex()[..32].to_owned())
}

/// `POST /cache/pin`: `{"prompt": TEXT}` (tokenized as `/completion` does), `{"tokens": [..]}`
/// or `{"messages": [..]}` (rendered with the chat template, as a chat request would be),
/// with `cache_salt` (the request's namespace, as for generation), `ttl_seconds` and `id`
/// (default: derived from the namespace and the tokens, so pinning the same prompt again
/// gives the same pin; pin ids are the key's own, see [`tenant`]). Answers `{"id", "tokens",
/// "expires_unix"}`.
pub async fn pin(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    let v: Value = serde_json::from_slice(&body).map_err(|e| ServerError::BadJson {
        reason: e.to_string(),
    })?;
    let bad = |m: &str| ServerError::BadRequest(m.to_owned());
    let tokens: Vec<u32> = if let Some(t) = v.get("tokens") {
        serde_json::from_value(t.clone())
            .map_err(|_| bad("tokens must be an array of token ids"))?
    } else if let Some(p) = v.get("prompt").and_then(Value::as_str) {
        st.model.tokenizer().encode(p, true, true)?
    } else if v.get("messages").is_some() {
        let req = request::chat(&body, &st.limits())?;
        super::turn::prepare(&st, &req).await?.prompt
    } else {
        return Err(bad("give the prompt as prompt, tokens or messages"));
    };
    let n_vocab = st.model.hparams().n_vocab;
    if tokens.iter().any(|&t| t as usize >= n_vocab) {
        return Err(bad("a token id is outside the vocabulary"));
    }
    let salt = request::cache_salt(&v).map_err(bad)?;
    let ttl = match v.get("ttl_seconds") {
        None | Some(Value::Null) => None,
        Some(t) => Some(
            t.as_u64()
                .filter(|&t| t > 0)
                .ok_or_else(|| bad("ttl_seconds must be a positive integer"))?,
        ),
    };
    let namespace = st.namespace(&client, salt.as_deref());
    let id = match v.get("id") {
        None | Some(Value::Null) => {
            let mut h = blake3::Hasher::new();
            h.update(namespace.as_ref().map_or(&[0u8; 32], |n| n.as_bytes()));
            for t in &tokens {
                h.update(&t.to_le_bytes());
            }
            h.finalize().to_hex()[..16].to_owned()
        }
        Some(Value::String(s))
            if !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            s.clone()
        }
        Some(_) => return Err(bad("id must be 1 to 64 letters, digits, '-' or '_'")),
    };
    let limits = st.limits();
    request::check_prompt(&tokens, &limits)?;
    if tokens.len() < engine::PAGE_TOKENS {
        return Err(bad(&format!(
            "a pin keeps whole blocks of {} tokens; this prompt has {}",
            engine::PAGE_TOKENS,
            tokens.len()
        )));
    }
    // Computed, or found cached, by a generation of no token: its sequence stays in memory.
    let (mut params, _) = request::defaults(&limits)?;
    params.max_tokens = 0;
    params.cache_prompt = true;
    params.cache_salt = salt;
    let runs = generate::submit_all(
        &st,
        &client,
        &limits,
        std::slice::from_ref(&tokens),
        &params,
        1,
    )?;
    generate::collect_all(runs).await?;
    let expires_unix = ttl.map(|t| super::unix_now() + t);
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Pin {
            id: pin_key(tenant(&st, &client).as_deref(), &id),
            tokens,
            namespace,
            expires_unix,
            reply,
        })
        .map_err(|_| ServerError::ShuttingDown)?;
    let pinned = rx
        .await
        .map_err(|_| ServerError::ShuttingDown)?
        .map_err(ServerError::Cache)?;
    Ok(Json(json!({
        "id": id,
        "tokens": pinned,
        "expires_unix": expires_unix,
    })))
}

/// `DELETE /cache/pin/{id}`: 404 when the request's key has no such pin.
pub async fn unpin(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let store = st.store.as_ref().ok_or(ServerError::NotEnabled {
        what: "the prompt cache on disk",
        how: "leave out --no-cache",
    })?;
    if ckptfmt_name_ok(&id)
        && store
            .prompt_cache()
            .unpin(&pin_key(tenant(&st, &client).as_deref(), &id))?
    {
        Ok(Json(json!({ "id": id, "deleted": true })))
    } else {
        Err(ServerError::NotFound(format!("no pin {id:?}")))
    }
}

fn ckptfmt_name_ok(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `GET /cache`: bytes and blocks in RAM and on disk, the disk budget, evictions (blocks
/// dropped from RAM, blocks and bytes collected from disk), the remote tier's traffic (null
/// without one), the request's key's pins, and where prompt tokens came from since the start.
pub async fn show(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
) -> Result<Json<Value>> {
    let m = &st.metrics;
    let prompts = json!({
        "total": m.prompt_tokens.load(Ordering::Relaxed),
        "from_ram": m.prompt_tokens_from_ram.load(Ordering::Relaxed),
        "from_store": m.prompt_tokens_from_store.load(Ordering::Relaxed),
        "computed": m.prompt_tokens_computed.load(Ordering::Relaxed),
    });
    let Some(store) = st.store.clone() else {
        return Ok(Json(json!({ "disk": null, "prompt_tokens": prompts })));
    };
    let pins = tokio::task::spawn_blocking({
        let store = Arc::clone(&store);
        move || store.prompt_cache().pins()
    })
    .await
    .map_err(|e| ServerError::Busy(format!("listing the pins failed: {e}")))??;
    let tenant = tenant(&st, &client);
    let pins = pins.iter().filter_map(|p| {
        pin_of(tenant.as_deref(), &p.id).map(|id| {
            json!({
                "id": id,
                "tokens": p.tokens,
                "expires_unix": p.expires_unix,
                "created_unix": p.created_unix,
                "namespaced": p.namespaced,
            })
        })
    });
    let s = store.metrics();
    Ok(Json(json!({
        "ram": { "bytes": s.ram_bytes, "blocks": s.ram_blocks },
        "disk": {
            "bytes": s.disk_bytes,
            "blocks": s.disk_blocks,
            "budget": st.config.cache_disk,
            "dir": st.cache_dir,
        },
        "hits": { "ram": s.ram_hits, "disk": s.disk_hits, "misses": s.misses },
        "evictions": { "ram_blocks": s.evictions, "disk_blocks": s.gc_blocks, "disk_bytes": s.gc_bytes },
        "remote": store.remote_figures().map(|r| json!({
            "up": r.up,
            "hits": r.hits,
            "misses": r.misses,
            "bytes_read": r.bytes_read,
            "bytes_written": r.bytes_written,
            "errors": r.errors,
        })),
        "pins": pins.collect::<Vec<_>>(),
        "prompt_tokens": prompts,
    })))
}

/// `POST /cache/clear`: deletes everything cached in the request's namespace (its API key's,
/// with the body's `cache_salt` if it gives one): sequences in memory, tails, pins and blocks
/// on disk; of the pins only the request's key's (another key's that share the namespace, by
/// a `cache_salt` under `--cache-isolation salt`, stay, with their blocks). Requests of the
/// namespace still running store their prompts afterwards. The shared cache (no key and no
/// salt, or `--cache-isolation none`) is not cleared this way: `ckpt rm` and `ckpt gc` do
/// that.
pub async fn clear(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    let v: Value = match body.is_empty() {
        true => json!({}),
        false => serde_json::from_slice(&body).map_err(|e| ServerError::BadJson {
            reason: e.to_string(),
        })?,
    };
    let salt = request::cache_salt(&v).map_err(|e| ServerError::BadRequest(e.to_owned()))?;
    let namespace = st.namespace(&client, salt.as_deref()).ok_or_else(|| {
        ServerError::BadRequest(
            "this request is in the shared cache (no API key namespace, no cache_salt): \
             nothing of its own to clear"
                .into(),
        )
    })?;
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Clear(crate::cache::ClearWork {
            namespace,
            tenant: tenant(&st, &client),
            reply,
        }))
        .map_err(|_| ServerError::ShuttingDown)?;
    let cleared = rx
        .await
        .map_err(|_| ServerError::ShuttingDown)?
        .map_err(ServerError::Cache)?;
    Ok(Json(json!({
        "checkpoints": cleared.checkpoints.len(),
        "blocks": cleared.blocks,
        "busy": cleared.busy,
    })))
}
