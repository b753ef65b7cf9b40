//! `/rerank`, `/v1/rerank`, `/reranking`, `/v1/reranking`: documents scored against a query,
//! as llama-server serves them. Each document's prompt is the model's rerank prompt
//! ([`engine::Model::rerank_tokens`]); the scheduler evaluates the prompts as it does
//! embeddings' inputs, each through the rank pooling ([`engine::Context::rank`]), whose first
//! output is the document's score.
//!
//! Two shapes, as llama-server: Jina's and Cohere's (`documents`: an object with `results`,
//! each `{index, relevance_score}`, and `usage`), and Hugging Face TEI's (`texts`: a bare list
//! of `{index, score}`, with `text` when `return_text` asks for it). Either way the results
//! are sorted by score, highest first, and cut to `top_n`.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::{AppState, RawBody};
use crate::error::{Result, ServerError};
use crate::scheduler::Command;

/// `POST /rerank` (and its other names).
pub async fn rerank(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    if !st.config.args.embeddings.reranking() {
        return Err(ServerError::NotEnabled {
            what: "reranking",
            how: "start the server with --rerank",
        });
    }
    let req = Request::parse(&body)?;
    let n_ctx = st.limits().n_ctx;
    let mut inputs = Vec::with_capacity(req.documents.len());
    for (i, doc) in req.documents.iter().enumerate() {
        let tokens = st.model.rerank_tokens(&req.query, doc)?;
        if tokens.is_empty() {
            return Err(ServerError::BadRequest(format!(
                "document {i}: the query and the document make an empty prompt"
            )));
        }
        if tokens.len() > n_ctx {
            return Err(ServerError::BadRequest(format!(
                "document {i}: its prompt ({} tokens) is too large to process: a slot's \
                 context holds {n_ctx} tokens",
                tokens.len()
            )));
        }
        inputs.push(tokens);
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let (reply, rx) = oneshot::channel();
    st.tx
        .send(Command::Rank { inputs, reply })
        .map_err(|_| ServerError::ShuttingDown)?;
    let outputs = rx.await.map_err(|_| ServerError::ShuttingDown)??;
    let scores: Vec<f32> = outputs
        .iter()
        .map(|o| o.first().copied().unwrap_or(f32::NAN))
        .collect();
    let model = req.model.clone().unwrap_or_else(|| st.config.alias.clone());
    Ok(Json(req.respond(&scores, n_tokens, &model)))
}

/// A rerank request, checked.
#[derive(Debug, PartialEq)]
struct Request {
    query: String,
    documents: Vec<String>,
    /// TEI's shape (the body has `texts`).
    tei: bool,
    /// How many results to keep (default: all).
    top_n: usize,
    /// TEI's `return_text`.
    return_text: bool,
    /// The body's `model`, echoed back.
    model: Option<String>,
}

impl Request {
    /// Reads a body as llama-server does: `query` a string, `documents` (else `texts`) a
    /// non-empty list of strings, `top_n` a count.
    fn parse(bytes: &[u8]) -> Result<Request> {
        let body: Map<String, Value> = match serde_json::from_slice(bytes) {
            Ok(Value::Object(map)) => map,
            Ok(_) => {
                return Err(ServerError::BadRequest(
                    "the request body must be a JSON object".into(),
                ))
            }
            Err(e) => {
                return Err(ServerError::BadJson {
                    reason: e.to_string(),
                })
            }
        };
        let query = match body.get("query") {
            Some(Value::String(q)) => q.clone(),
            Some(_) => return Err(bad("\"query\" must be a string")),
            None => return Err(bad("\"query\" must be provided")),
        };
        let tei = body.contains_key("texts");
        let docs = match body.get("documents") {
            None | Some(Value::Null) => body.get("texts"),
            some => some,
        };
        let documents: Vec<String> = match docs {
            Some(Value::Array(items)) if !items.is_empty() => items
                .iter()
                .map(|d| d.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("\"documents\" must be a non-empty string array"))?,
            _ => return Err(bad("\"documents\" must be a non-empty string array")),
        };
        let top_n = match body.get("top_n") {
            None | Some(Value::Null) => documents.len(),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad("\"top_n\" must be a non-negative integer"))?,
        };
        let return_text = match body.get("return_text") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("\"return_text\" must be a boolean")),
        };
        let model = match body.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(m)) => Some(m.clone()),
            Some(_) => return Err(bad("\"model\" must be a string")),
        };
        Ok(Request {
            query,
            documents,
            tei,
            top_n,
            return_text: tei && return_text,
            model,
        })
    }

    /// The response for the documents' `scores` (in request order), the prompts having taken
    /// `n_tokens` tokens in all.
    fn respond(&self, scores: &[f32], n_tokens: usize, model: &str) -> Value {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        // Highest first; equal scores keep the documents' order.
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        order.truncate(self.top_n);
        let label = if self.tei { "score" } else { "relevance_score" };
        let results: Vec<Value> = order
            .iter()
            .map(|&i| {
                let mut r = json!({ "index": i, label: scores[i] });
                if self.return_text {
                    r["text"] = json!(self.documents[i]);
                }
                r
            })
            .collect();
        if self.tei {
            return Value::Array(results);
        }
        json!({
            "model": model,
            "object": "list",
            "usage": { "prompt_tokens": n_tokens, "total_tokens": n_tokens },
            "results": results,
        })
    }
}

fn bad(message: &str) -> ServerError {
    ServerError::BadRequest(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<Request> {
        Request::parse(body.to_string().as_bytes())
    }

    #[test]
    fn bodies_are_read_as_llama_server_reads_them() {
        let r = parse(json!({ "query": "q", "documents": ["a", "b"] })).unwrap();
        assert_eq!((r.tei, r.top_n, r.return_text), (false, 2, false));
        let r = parse(json!({ "query": "q", "texts": ["a"], "return_text": true, "top_n": 5 }))
            .unwrap();
        assert_eq!((r.tei, r.top_n, r.return_text), (true, 5, true));
        // `return_text` is TEI's alone.
        let r = parse(json!({ "query": "q", "documents": ["a"], "return_text": true })).unwrap();
        assert!(!r.return_text);
        for bad in [
            json!({ "documents": ["a"] }),
            json!({ "query": 1, "documents": ["a"] }),
            json!({ "query": "q" }),
            json!({ "query": "q", "documents": [] }),
            json!({ "query": "q", "documents": null }),
            json!({ "query": "q", "documents": 123 }),
            json!({ "query": "q", "documents": [1, 2, 3] }),
            json!({ "query": "q", "documents": ["a"], "top_n": -1 }),
            json!({ "query": "q", "documents": ["a"], "top_n": "2" }),
            json!(["q"]),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn results_are_sorted_cut_and_shaped() {
        let r = parse(json!({ "query": "q", "documents": ["a", "b", "c"], "top_n": 2 })).unwrap();
        let v = r.respond(&[0.1, 0.7, 0.7], 9, "m");
        assert_eq!(
            v,
            json!({
                "model": "m",
                "object": "list",
                "usage": { "prompt_tokens": 9, "total_tokens": 9 },
                "results": [
                    { "index": 1, "relevance_score": 0.7f32 },
                    { "index": 2, "relevance_score": 0.7f32 },
                ],
            })
        );
        let r = parse(json!({ "query": "q", "texts": ["a", "b"], "return_text": true })).unwrap();
        assert_eq!(
            r.respond(&[-1.0, 2.0], 4, "m"),
            json!([
                { "index": 1, "score": 2.0, "text": "b" },
                { "index": 0, "score": -1.0, "text": "a" },
            ])
        );
    }
}
