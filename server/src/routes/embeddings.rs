//! `/embedding` and `/embeddings` (llama-server's shape) and `/v1/embeddings` (OpenAI's).
//! Inputs are read and tokenized here, the scheduler computes every token's embedding, and
//! pooling and normalisation happen here, as llama-server does them.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::{generate, AppState, RawBody};
use crate::args::Pooling;
use crate::error::{Result, ServerError};
use crate::request;
use crate::scheduler::Command;

/// `POST /embedding`, `POST /embeddings`: `[{"index", "embedding": [[f32; n_embd]; rows]}]`,
/// one row per token without pooling, else the pooled row.
pub async fn native(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    let body = parse(&st, &body)?;
    let input = body.get("content").or_else(|| body.get("input"));
    let normalize = normalize_field(&body, &st)?;
    let (rows, _) = embed(&st, input).await?;
    let pooling = st.config.pooling;
    let out: Vec<Value> = rows
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let rows = pool(r, st.model.hparams().n_embd, pooling, normalize);
            json!({ "index": index, "embedding": rows })
        })
        .collect();
    Ok(Json(Value::Array(out)))
}

/// `POST /v1/embeddings`: OpenAI's list of embeddings, floats or base64 (little-endian f32),
/// with the tokens read in `usage`. Pooling `none` is refused: OpenAI's shape has one vector
/// an input.
pub async fn openai(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    let body = parse(&st, &body)?;
    let base64 = match body.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(other) => {
            return Err(ServerError::BadRequest(format!(
                "\"encoding_format\" is {other}; \"float\" or \"base64\" expected"
            )))
        }
    };
    let normalize = normalize_field(&body, &st)?;
    let n_embd = st.model.hparams().n_embd;
    // OpenAI's `dimensions` shortens vectors of models trained for it; this server gives the
    // model's own width and refuses any other rather than ignore the field.
    match body.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(d) if d.as_u64() == Some(n_embd as u64) => {}
        Some(d) => {
            return Err(ServerError::Unsupported(format!(
                "\"dimensions\": {d}: this model's embeddings have {n_embd} dimensions"
            )))
        }
    }
    let pooling = st.config.pooling;
    if pooling == Pooling::None {
        return Err(ServerError::BadRequest(
            "pooling 'none' gives one vector a token, which OpenAI's embeddings cannot carry: \
             start the server with --pooling mean, cls or last, or use /embedding"
                .into(),
        ));
    }
    let input = body.get("input").or_else(|| body.get("content"));
    let (rows, n_tokens) = embed(&st, input).await?;
    let data: Vec<Value> = rows
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let v = pool(r, n_embd, pooling, normalize).swap_remove(0);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "model": st.config.alias,
        "data": data,
        "usage": { "prompt_tokens": n_tokens, "total_tokens": n_tokens },
    })))
}

/// The body as an object, once the endpoints are known to be on.
fn parse(st: &AppState, bytes: &[u8]) -> Result<Map<String, Value>> {
    if !st.config.args.embeddings.embedding {
        return Err(ServerError::NotEnabled {
            what: "embeddings",
            how: "start the server with --embedding",
        });
    }
    if st.config.pooling == Pooling::Rank {
        return Err(ServerError::BadRequest(
            "pooling 'rank' gives relevance scores, not embeddings: POST /rerank, or start the \
             server with --pooling mean, cls or last"
                .into(),
        ));
    }
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ServerError::BadRequest(
            "the request body must be a JSON object".into(),
        )),
        Err(e) => Err(ServerError::BadJson {
            reason: e.to_string(),
        }),
    }
}

/// The request's `embd_normalize`, else `--embd-normalize`.
fn normalize_field(body: &Map<String, Value>, st: &AppState) -> Result<i32> {
    match body.get("embd_normalize") {
        None | Some(Value::Null) => Ok(st.config.args.embeddings.embd_normalize),
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| ServerError::BadRequest(format!("\"embd_normalize\" is {v}"))),
    }
}

/// Every token's embedding of each input, and the tokens read in all.
async fn embed(st: &Arc<AppState>, input: Option<&Value>) -> Result<(Vec<Vec<f32>>, usize)> {
    let Some(input) = input else {
        return Err(ServerError::BadRequest("\"input\" is required".into()));
    };
    let limits = st.limits();
    let prompts = request::prompts(Some(&content_parts(input)?), &limits)?;
    let mut inputs = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let tokens = generate::prompt_tokens(st, p)?;
        if tokens.is_empty() {
            return Err(ServerError::BadRequest(
                "an input is empty: there is no token to embed".into(),
            ));
        }
        if tokens.len() > limits.n_ctx {
            return Err(ServerError::BadRequest(format!(
                "input ({} tokens) is too large to process: a slot's context holds {} tokens",
                tokens.len(),
                limits.n_ctx
            )));
        }
        inputs.push(tokens);
    }
    let n_tokens = inputs.iter().map(Vec::len).sum();
    Ok((embed_tokens(st, inputs).await?, n_tokens))
}

/// Every token's embedding of each input (tokens already checked against the context), from
/// the scheduler.
pub(super) async fn embed_tokens(st: &AppState, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>> {
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Embed { inputs, reply })
        .map_err(|_| ServerError::ShuttingDown)?;
    rx.await.map_err(|_| ServerError::ShuttingDown)?
}

/// `input` with its `{"content": [parts]}` objects (text parts only: the model reads no images,
/// audio or video) turned into the `{"prompt_string"}` form the prompt reader knows.
fn content_parts(input: &Value) -> Result<Value> {
    let one = |v: &Value| -> Result<Value> {
        let Some(content) = v.as_object().and_then(|m| m.get("content")) else {
            return Ok(v.clone());
        };
        let Value::Array(parts) = content else {
            return Err(ServerError::BadRequest(
                "an input object's \"content\" is a list of parts".into(),
            ));
        };
        let mut text = String::new();
        for part in parts {
            match part.get("type").and_then(Value::as_str) {
                Some("text") => match part.get("text") {
                    Some(Value::String(t)) => text.push_str(t),
                    _ => {
                        return Err(ServerError::BadRequest(
                            "a text part needs a string \"text\"".into(),
                        ))
                    }
                },
                Some("image_url" | "input_audio" | "input_video" | "image" | "audio") => {
                    return Err(ServerError::NotEnabled {
                        what: "multimodal input",
                        how: "this server reads text only",
                    })
                }
                _ => {
                    return Err(ServerError::BadRequest(format!(
                        "{part} is not a content part this server reads"
                    )))
                }
            }
        }
        Ok(json!({ "prompt_string": text }))
    };
    match input {
        Value::Array(items) => Ok(Value::Array(items.iter().map(one).collect::<Result<_>>()?)),
        v => one(v),
    }
}

/// One input's rows (`n_embd` floats a token) pooled as `pooling` says and normalised as
/// `normalize` says (llama.cpp's `embd_normalize`); without pooling, every row as it is.
pub(super) fn pool(rows: &[f32], n_embd: usize, pooling: Pooling, normalize: i32) -> Vec<Vec<f32>> {
    let n = rows.len() / n_embd;
    let row = |i: usize| rows[i * n_embd..(i + 1) * n_embd].to_vec();
    let v = match pooling {
        Pooling::None => return (0..n).map(row).collect(),
        Pooling::Cls => row(0),
        // Rank is refused before pooling (`parse`); its pooled row is the last token's.
        Pooling::Last | Pooling::Rank => row(n - 1),
        Pooling::Mean => {
            let mut sum = vec![0f32; n_embd];
            for r in rows.chunks_exact(n_embd) {
                for (s, x) in sum.iter_mut().zip(r) {
                    *s += x;
                }
            }
            sum.iter().map(|s| s / n as f32).collect()
        }
    };
    vec![normalized(v, normalize)]
}

/// llama.cpp's normalisations: -1 none, 0 the largest magnitude scaled to 32760 (int16's
/// range), 2 Euclidean, any other p the p-norm.
pub(super) fn normalized(v: Vec<f32>, p: i32) -> Vec<f32> {
    let norm = match p {
        p if p < 0 => return v,
        0 => v.iter().fold(0f64, |m, x| m.max(f64::from(x.abs()))) / 32760.0,
        2 => v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|x| f64::from(x.abs()).powi(p))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    v.iter().map(|x| (f64::from(*x) * scale) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_and_norms() {
        // Two tokens of three dimensions.
        let rows = [3.0, 0.0, -4.0, 1.0, 2.0, 2.0];
        assert_eq!(pool(&rows, 3, Pooling::Cls, -1), vec![vec![3.0, 0.0, -4.0]]);
        assert_eq!(pool(&rows, 3, Pooling::Last, -1), vec![vec![1.0, 2.0, 2.0]]);
        assert_eq!(
            pool(&rows, 3, Pooling::Mean, -1),
            vec![vec![2.0, 1.0, -1.0]]
        );
        assert_eq!(pool(&rows, 3, Pooling::None, 2).len(), 2);
        assert_eq!(pool(&rows, 3, Pooling::Cls, 2), vec![vec![0.6, 0.0, -0.8]]);
        // Taxicab: |3| + |0| + |-4| = 7.
        let l1 = pool(&rows, 3, Pooling::Cls, 1).swap_remove(0);
        assert!((l1[0] - 3.0 / 7.0).abs() < 1e-6 && (l1[2] + 4.0 / 7.0).abs() < 1e-6);
        // int16 range: the largest magnitude becomes 32760.
        let i16 = pool(&rows, 3, Pooling::Cls, 0).swap_remove(0);
        assert!((i16[2] + 32760.0).abs() < 1e-2 && (i16[0] - 24570.0).abs() < 1e-2);
        // A zero vector stays zero rather than becoming NaN.
        assert_eq!(normalized(vec![0.0, 0.0], 2), vec![0.0, 0.0]);
    }

    #[test]
    fn content_parts_become_prompt_strings() {
        let v = json!([
            "a",
            { "content": [{ "type": "text", "text": "b " }, { "type": "text", "text": "c" }] },
            [1, 2]
        ]);
        assert_eq!(
            content_parts(&v).unwrap(),
            json!(["a", { "prompt_string": "b c" }, [1, 2]])
        );
        for bad in [
            json!({ "content": "string" }),
            json!({ "content": [{ "type": "unknown" }] }),
            json!({ "content": [{ "type": "image_url", "image_url": { "url": "x" } }] }),
        ] {
            assert!(content_parts(&bad).is_err(), "{bad}");
        }
    }
}
