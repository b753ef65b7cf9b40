//! Endpoints that do not generate: health, models, props, tokenize, detokenize and
//! apply-template. They run on the handlers' threads; the scheduler sees them only to wake up
//! from `--sleep-idle-seconds` (see [`rouse`]).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::{AppState, RawBody};
use crate::error::Result;
use crate::request;

/// Wakes a sleeping scheduler and waits until it is awake, as llama-server wakes for every
/// request but the read-only ones (health, models, props, metrics); nothing when awake.
pub(super) async fn rouse(st: &AppState) {
    use std::sync::atomic::Ordering;
    if st.metrics.sleeping.load(Ordering::Relaxed) == 0 {
        return;
    }
    let (done, awake) = tokio::sync::oneshot::channel();
    if st.tx.send(crate::scheduler::Command::Rouse(done)).is_ok() {
        let _ = awake.await;
    }
}

/// `GET /health`.
pub async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /v1/models`: the one model, under its alias.
pub async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let hp = st.model.hparams();
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.config.alias,
            "aliases": st.config.aliases,
            "tags": st.config.tags,
            "object": "model",
            "created": st.started_unix,
            "owned_by": "llama-hdd",
            "meta": {
                "n_vocab": hp.n_vocab,
                "n_ctx_train": hp.n_ctx_train,
                "n_embd": hp.n_embd,
            },
        }],
    }))
}

/// `POST /props`, served with `--props` as llama-server serves it: no property can be changed
/// yet, so an empty object succeeds and any field is refused by name rather than ignored.
pub async fn change_props(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    if !st.config.args.props {
        return Err(crate::error::ServerError::NotEnabled {
            what: "changing properties through POST /props",
            how: "start the server with --props",
        });
    }
    let fields: serde_json::Map<String, Value> = request::json_body(&body, st.config.max_body)?;
    rouse(&st).await;
    if let Some(name) = fields.keys().next() {
        return Err(crate::error::ServerError::BadRequest(format!(
            "property {name:?} cannot be changed: no property can be changed through POST /props"
        )));
    }
    Ok(Json(json!({ "success": true })))
}

/// `GET /props`: llama-server's shape (default generation settings, slots, model, template),
/// plus the prompt cache's figures.
pub async fn props(State(st): State<Arc<AppState>>) -> Result<Json<Value>> {
    let tok = st.model.tokenizer();
    let (text_hits, retokenize_mismatches, text_remote_hits) =
        st.texts.lock().map_or((0, 0, 0), |t| {
            (t.hits, t.retokenize_mismatches, t.remote_hits)
        });
    let args = &st.config.args;
    let (params, output) = request::defaults(&st.limits())?;
    let mut settings = super::shape::generation_settings(&params, &output, &st);
    // The configured seed as given (-1: a random one per request).
    settings["seed"] = json!(args.seed);
    Ok(Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": st.n_ctx,
            "speculative": false,
            "is_processing": false,
            "params": settings,
            "prompt": "",
            "next_token": { "has_next_token": true, "has_new_line": false, "n_remain": -1, "n_decoded": 0, "stopping_word": "" },
        },
        "total_slots": st.n_slots,
        "model_path": args.model.display().to_string(),
        "model_alias": st.config.alias,
        "modalities": { "vision": false, "audio": false },
        "chat_template": st.template().source(),
        "bos_token": tok.bos().map(|b| tok.token_text(b).to_owned()),
        "eos_token": tok.eos().map(|e| tok.token_text(e).to_owned()),
        "build_info": super::shape::FINGERPRINT,
        "webui": st.config.ui,
        "is_sleeping": st.metrics.sleeping.load(std::sync::atomic::Ordering::Relaxed) == 1,
        "cache_dir": st.cache_dir.as_ref().map(|d| d.display().to_string()),
        "chat_prefix_hits": text_hits,
        "chat_retokenize_mismatches": retokenize_mismatches,
        "chat_prefix_remote_hits": text_remote_hits,
        "cache_errors": st.metrics.cache_errors.load(std::sync::atomic::Ordering::Relaxed),
        "last_cache_error": st.metrics.last_cache_error.lock().ok().and_then(|e| e.clone()),
    })))
}

/// `POST /tokenize`.
pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    rouse(&st).await;
    let req = request::tokenize(&body, &st.limits())?;
    let tok = st.model.tokenizer();
    let ids = tok.encode(&req.content, req.add_special, req.parse_special)?;
    let tokens: Vec<Value> = if req.with_pieces {
        ids.iter()
            .map(|&id| json!({ "id": id, "piece": String::from_utf8_lossy(tok.token_bytes(id)) }))
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    rouse(&st).await;
    let tokens = request::detokenize(&body, &st.limits())?;
    Ok(Json(
        json!({ "content": st.model.tokenizer().decode(&tokens) }),
    ))
}

/// `POST /apply-template`: the chat template's prompt for `messages`.
pub async fn apply_template(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    rouse(&st).await;
    let chat = request::apply_template(&body, &st.limits())?;
    let prompt = super::render_chat(&st, &chat).await?;
    Ok(Json(json!({ "prompt": prompt })))
}
