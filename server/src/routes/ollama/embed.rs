//! `POST /api/embed` (one unit-length vector an input, `truncate`, `dimensions`) and the older
//! `POST /api/embeddings` (one vector, as the model gives it), on the scheduler's embedding
//! path: the server must run with `--embedding` and a pooling other than `none`, as for
//! OpenAI's `/v1/embeddings`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::{options, parse_body, Meta, OllamaError};
use crate::args::Pooling;
use crate::error::ServerError;
use crate::routes::embeddings::{embed_tokens, normalized, pool};
use crate::routes::{AppState, RawBody};

/// `POST /api/embed`.
pub async fn embed(
    State(st): State<Arc<AppState>>,
    body: Result<RawBody, ServerError>,
) -> Response {
    match create(st, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /api/embeddings`: `{"embedding": [...]}` of `prompt`, not normalised (an empty
/// prompt gives an empty vector, as Ollama answers it).
pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    body: Result<RawBody, ServerError>,
) -> Response {
    let answer = async {
        let body = parse_body(body)?;
        super::log_unknown(
            &st,
            "/api/embeddings",
            &body,
            &["model", "prompt", "options", "keep_alive"],
        );
        check(&st, &body)?;
        let prompt = match body.get("prompt") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(OllamaError::bad(format!("prompt: {other} is not a string")))
            }
        };
        if prompt.is_empty() {
            return Ok(json!({ "embedding": [] }));
        }
        let (mut vectors, _) = vectors(&st, &[prompt], false, -1).await?;
        Ok(json!({ "embedding": vectors.pop() }))
    };
    match answer.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn create(
    st: Arc<AppState>,
    body: Result<RawBody, ServerError>,
) -> Result<Value, OllamaError> {
    let started = Instant::now();
    let body = parse_body(body)?;
    let meta = Meta::new(&st, &body, started);
    super::log_unknown(
        &st,
        "/api/embed",
        &body,
        &[
            "model",
            "input",
            "truncate",
            "options",
            "keep_alive",
            "dimensions",
        ],
    );
    check(&st, &body)?;
    let inputs: Vec<&str> = match body.get("input") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(|| OllamaError::bad(format!("input[{i}]: {v} is not a string")))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "input: {other} is neither a string nor a list of strings"
            )))
        }
    };
    let truncate = match body.get("truncate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "truncate: {other} is not a boolean"
            )))
        }
    };
    let n_embd = st.model.hparams().n_embd;
    let dimensions = match body.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(d) => match d.as_u64() {
            Some(n) if n >= 1 && n <= n_embd as u64 => Some(n as usize),
            _ => {
                return Err(OllamaError::bad(format!(
                    "dimensions: {d} is not from 1 to the model's {n_embd}"
                )))
            }
        },
    };
    let (mut vectors, n_tokens) = vectors(&st, &inputs, truncate, 2).await?;
    if let Some(d) = dimensions {
        // Ollama's `dimensions`: the leading components, at unit length again.
        for v in &mut vectors {
            v.truncate(d);
            *v = normalized(std::mem::take(v), 2);
        }
    }
    let mut m = meta.head();
    m.remove("done");
    m.remove("created_at");
    m.insert("embeddings".into(), json!(vectors));
    m.insert(
        "total_duration".into(),
        json!(meta.started.elapsed().as_nanos() as u64),
    );
    m.insert("load_duration".into(), json!(0));
    m.insert("prompt_eval_count".into(), json!(n_tokens));
    Ok(Value::Object(m))
}

/// Embeddings are served (`--embedding`, a pooling that gives one vector an input), and the
/// body's options are well-formed (none changes an embedding).
fn check(st: &AppState, body: &Map<String, Value>) -> Result<(), OllamaError> {
    if !st.config.args.embeddings.embedding {
        return Err(ServerError::NotEnabled {
            what: "embeddings",
            how: "start the server with --embedding",
        }
        .into());
    }
    if matches!(st.config.pooling, Pooling::None | Pooling::Rank) {
        return Err(OllamaError::bad(
            "pooling 'none' (one vector a token) and 'rank' (relevance scores) give nothing \
             Ollama's embeddings carry: start the server with --pooling mean, cls or last",
        ));
    }
    options::apply(st, body, &mut Map::new())?;
    Ok(())
}

/// One pooled vector an input, normalised as `normalize` says (llama.cpp's `embd_normalize`),
/// and the tokens read in all. An input longer than a slot's context is cut to it when
/// `truncate`, else refused.
async fn vectors(
    st: &Arc<AppState>,
    inputs: &[&str],
    truncate: bool,
    normalize: i32,
) -> Result<(Vec<Vec<f32>>, usize), OllamaError> {
    let tok = st.model.tokenizer();
    let n_ctx = st.n_ctx;
    let mut tokens = Vec::with_capacity(inputs.len());
    for (i, text) in inputs.iter().enumerate() {
        let mut t = tok.encode(text, true, true)?;
        if t.is_empty() {
            return Err(OllamaError::bad(format!(
                "input[{i}] is empty: there is no token to embed"
            )));
        }
        if t.len() > n_ctx {
            if !truncate {
                return Err(OllamaError::bad(format!(
                    "input[{i}] has {} tokens, more than the context of {n_ctx}; send \
                     truncate: true to cut it",
                    t.len()
                )));
            }
            t.truncate(n_ctx);
        }
        tokens.push(t);
    }
    let n_tokens = tokens.iter().map(Vec::len).sum();
    if tokens.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let rows = embed_tokens(st, tokens).await?;
    let n_embd = st.model.hparams().n_embd;
    let pooling = st.config.pooling;
    let vectors = rows
        .iter()
        .map(|r| pool(r, n_embd, pooling, normalize).swap_remove(0))
        .collect();
    Ok((vectors, n_tokens))
}
