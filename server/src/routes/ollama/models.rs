//! `GET /api/tags`, `POST /api/show` and `GET /api/ps`: the one model this server runs, as
//! Ollama describes a model. Its facts come from the GGUF's header (architecture, parameter
//! count, the type that holds most of its bytes, metadata); its digest is the model's
//! fingerprint (every byte of every tensor), the one the prompt cache keys on.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::gguf::{Gguf, MetaArray, MetaValue};
use serde_json::{json, Map, Value};

use super::{parse_body, rfc3339, OllamaError};
use crate::args::Pooling;
use crate::error::ServerError;
use crate::routes::{AppState, RawBody};

/// What Ollama says of a model, read from its file.
struct Facts {
    /// The file's size in bytes.
    size: u64,
    /// When the file was last modified, RFC 3339.
    modified_at: String,
    /// `sha256:` and the model's fingerprint in hexadecimal.
    digest: String,
    /// Ollama's `details`.
    details: Value,
    /// Every metadata key (arrays as `null` unless `verbose`).
    model_info: Map<String, Value>,
}

/// `GET /api/tags`: the model under each of its names.
pub async fn tags(State(st): State<Arc<AppState>>) -> Response {
    match facts(&st, false).await {
        Ok(f) => {
            let models: Vec<Value> = st
                .config
                .aliases
                .iter()
                .map(|name| {
                    json!({
                        "name": name,
                        "model": name,
                        "modified_at": f.modified_at,
                        "size": f.size,
                        "digest": f.digest,
                        "details": f.details,
                    })
                })
                .collect();
            Json(json!({ "models": models })).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `GET /api/ps`: the model, loaded for as long as the server runs.
pub async fn ps(State(st): State<Arc<AppState>>) -> Response {
    match facts(&st, false).await {
        Ok(f) => {
            let hp = st.model.hparams();
            let offloaded = st.model.n_offloaded_layers().min(hp.n_layer) as u64;
            let size_vram = f.size * offloaded / (hp.n_layer.max(1) as u64);
            // Never unloaded: a century from now stands for Ollama's "forever".
            let expires = kvstore::since_epoch() + Duration::from_secs(100 * 365 * 86_400);
            let model = json!({
                "name": st.config.alias,
                "model": st.config.alias,
                "size": f.size,
                "digest": f.digest,
                "details": f.details,
                "expires_at": rfc3339(expires),
                "size_vram": size_vram,
                "context_length": st.n_ctx,
            });
            Json(json!({ "models": [model] })).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `POST /api/show`: the model's details, metadata, chat template, default parameters and
/// capabilities, whatever name the request gives (the server has one model).
pub async fn show(State(st): State<Arc<AppState>>, body: Result<RawBody, ServerError>) -> Response {
    let answer = async {
        let body = parse_body(body)?;
        super::log_unknown(&st, "/api/show", &body, &["model", "name", "verbose"]);
        let verbose = match body.get("verbose") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(OllamaError::bad(format!(
                    "verbose: {other} is not a boolean"
                )))
            }
        };
        let f = facts(&st, verbose).await?;
        let template = st.template().source().to_owned();
        let parameters = parameters(&st);
        let modelfile = format!(
            "# The model llama-hdd-server was started with.\nFROM {}\nTEMPLATE \"\"\"{template}\"\"\"\n{}",
            st.config.args.model.display(),
            parameters
                .lines()
                .map(|l| format!("PARAMETER {l}\n"))
                .collect::<String>()
        );
        Ok::<_, OllamaError>(json!({
            "license": "",
            "modelfile": modelfile,
            "parameters": parameters,
            "template": template,
            "system": "",
            "details": f.details,
            "model_info": f.model_info,
            "capabilities": capabilities(&st, &template),
            "modified_at": f.modified_at,
        }))
    };
    match answer.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The request defaults in a Modelfile's `PARAMETER` syntax, one a line.
fn parameters(st: &AppState) -> String {
    let s = &st.config.sampler;
    let mut lines = vec![
        format!("num_ctx {}", st.n_ctx),
        format!("temperature {}", s.temperature),
        format!("top_k {}", s.top_k),
        format!("top_p {}", s.top_p),
        format!("min_p {}", s.min_p),
        format!("repeat_penalty {}", s.repeat_penalty),
        format!("repeat_last_n {}", s.repeat_last_n),
    ];
    if st.config.args.n_predict >= 0 {
        lines.push(format!("num_predict {}", st.config.args.n_predict));
    }
    if st.config.args.seed >= 0 {
        lines.push(format!("seed {}", st.config.args.seed));
    }
    lines.join("\n")
}

/// What the model can do here: complete always; tools and thinking when its chat template
/// reads them; embeddings when the server computes them.
fn capabilities(st: &AppState, template: &str) -> Vec<&'static str> {
    let mut out = vec!["completion"];
    if template.contains("tools") || template.contains("tool_calls") {
        out.push("tools");
    }
    if ["<think>", "enable_thinking", "reasoning_content"]
        .iter()
        .any(|m| template.contains(m))
    {
        out.push("thinking");
    }
    if st.config.args.embeddings.embedding
        && !matches!(st.config.pooling, Pooling::None | Pooling::Rank)
    {
        out.push("embedding");
    }
    out
}

/// The model file's facts, read on a blocking thread (the fingerprint may still need hashing).
async fn facts(st: &Arc<AppState>, verbose: bool) -> Result<Facts, OllamaError> {
    let st = Arc::clone(st);
    tokio::task::spawn_blocking(move || read_facts(&st, verbose))
        .await
        .map_err(|_| ServerError::ShuttingDown)?
}

fn read_facts(st: &AppState, verbose: bool) -> Result<Facts, OllamaError> {
    let path = &st.config.args.model;
    let gguf = Gguf::open(path).map_err(ServerError::from)?;
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    let n_params: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
    // The element type that holds most of the bytes: the file's quantization.
    let mut by_type: Vec<(engine::gguf::GgmlType, u64)> = Vec::new();
    for t in gguf.tensors() {
        match by_type.iter_mut().find(|(d, _)| *d == t.dtype) {
            Some((_, n)) => *n += t.n_bytes,
            None => by_type.push((t.dtype, t.n_bytes)),
        }
    }
    let quantization = by_type
        .iter()
        .max_by_key(|(_, n)| *n)
        .map_or_else(String::new, |(d, _)| d.name().to_uppercase());
    let family = st.model.hparams().arch.name();
    let mut model_info: Map<String, Value> = gguf
        .metadata()
        .map(|(k, v)| (k.to_owned(), meta_json(v, verbose)))
        .collect();
    model_info
        .entry("general.parameter_count")
        .or_insert_with(|| json!(n_params));
    let digest: String = st
        .model
        .fingerprint()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(Facts {
        size: gguf.len(),
        modified_at: rfc3339(modified),
        digest: format!("sha256:{digest}"),
        details: json!({
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family],
            "parameter_size": parameter_size(n_params),
            "quantization_level": quantization,
        }),
        model_info,
    })
}

/// A parameter count as Ollama writes it: `134.52M`, `8.0B`.
fn parameter_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else {
        format!("{:.2}K", n / 1e3)
    }
}

/// A metadata value as JSON; an array is `null` unless `verbose` (Ollama's way: vocabularies
/// are large).
fn meta_json(v: &MetaValue, verbose: bool) -> Value {
    match v {
        MetaValue::Array(a) if verbose => array_json(a),
        MetaValue::Array(_) => Value::Null,
        MetaValue::Str(s) => json!(s),
        MetaValue::Bool(b) => json!(b),
        MetaValue::F32(x) => json!(x),
        MetaValue::F64(x) => json!(x),
        other => other
            .as_i64()
            .map(|i| json!(i))
            .or_else(|| other.as_u64().map(|u| json!(u)))
            .unwrap_or(Value::Null),
    }
}

fn array_json(a: &MetaArray) -> Value {
    match a {
        MetaArray::Str(s) => json!(s.iter().collect::<Vec<_>>()),
        MetaArray::Bool(b) => json!(b),
        MetaArray::Array(items) => Value::Array(items.iter().map(array_json).collect()),
        MetaArray::F32(_) | MetaArray::F64(_) => json!(a.to_f64s()),
        other => json!(other.to_i64s()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_sizes_read_as_ollamas() {
        assert_eq!(parameter_size(134_515_008), "134.52M");
        assert_eq!(parameter_size(8_030_261_248), "8.0B");
        assert_eq!(parameter_size(20_480), "20.48K");
    }
}
