//! Endpoints that do not generate: health, models, props, tokenize, detokenize and
//! apply-template. They run on the handlers' threads; the scheduler never sees them.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::generate::{chat_messages, ChatMessage};
use super::{AppState, JsonBody};
use crate::error::{Result, ServerError};

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

/// `GET /props`: default generation settings, slots, model and template.
pub async fn props(State(st): State<Arc<AppState>>) -> Json<Value> {
    let tok = st.model.tokenizer();
    let (text_hits, retokenize_mismatches) = st
        .texts
        .lock()
        .map_or((0, 0), |t| (t.hits, t.retokenize_mismatches));
    let args = &st.config.args;
    Json(json!({
        "default_generation_settings": {
            "n_ctx": st.n_ctx,
            "params": {
                "n_predict": args.n_predict,
                "temperature": args.temp,
                "seed": args.seed,
            },
        },
        "total_slots": st.n_slots,
        "model_path": args.model.display().to_string(),
        "model_alias": st.config.alias,
        "chat_template": st.model.chat_template().source(),
        "bos_token": tok.bos().map(|b| tok.token_text(b).to_owned()),
        "eos_token": tok.eos().map(|e| tok.token_text(e).to_owned()),
        "cache_dir": st.cache_dir.as_ref().map(|d| d.display().to_string()),
        "chat_prefix_hits": text_hits,
        "chat_retokenize_mismatches": retokenize_mismatches,
        "cache_errors": st.metrics.cache_errors.load(std::sync::atomic::Ordering::Relaxed),
        "last_cache_error": st.metrics.last_cache_error.lock().ok().and_then(|e| e.clone()),
        "build_info": concat!("llama-hdd-server ", env!("CARGO_PKG_VERSION")),
    }))
}

/// `POST /tokenize` body.
#[derive(Deserialize)]
pub struct TokenizeRequest {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default = "yes")]
    parse_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /tokenize`.
pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    JsonBody(req): JsonBody<TokenizeRequest>,
) -> Result<Json<Value>> {
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

/// `POST /detokenize` body.
#[derive(Deserialize)]
pub struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    JsonBody(req): JsonBody<DetokenizeRequest>,
) -> Result<Json<Value>> {
    let n_vocab = st.model.hparams().n_vocab;
    if let Some(&id) = req.tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ServerError::BadToken { id, n_vocab });
    }
    Ok(Json(
        json!({ "content": st.model.tokenizer().decode(&req.tokens) }),
    ))
}

/// `POST /apply-template` body.
#[derive(Deserialize)]
pub struct TemplateRequest {
    messages: Vec<ChatMessage>,
}

/// `POST /apply-template`: the chat template's prompt for `messages`.
pub async fn apply_template(
    State(st): State<Arc<AppState>>,
    JsonBody(req): JsonBody<TemplateRequest>,
) -> Result<Json<Value>> {
    let messages = chat_messages(&req.messages)?;
    let prompt = st.model.chat_template().render(&messages, true)?;
    Ok(Json(json!({ "prompt": prompt })))
}
