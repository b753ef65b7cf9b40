//! Google Cloud Vertex AI's custom-container protocol, as llama-server serves it when
//! `AIP_MODE=PREDICTION` ([`crate::args::GcpArgs`]): `POST` to the predict route (`/predict`
//! or `AIP_PREDICT_ROUTE`) with `{"instances": [...]}` answers `{"predictions": [...]}`, one
//! prediction an instance, in order. Each instance names the endpoint it is for in
//! `@requestFormat`, by a camelCase alias of its path (`chatCompletions` for
//! `/v1/chat/completions`, `applyTemplate` for `/apply-template`) or by the path itself, and is
//! that endpoint's request body otherwise; the instances run at once, and each prediction is
//! the endpoint's JSON answer, an error object included (the response is 200 all the same).
//! Streaming is turned off in each instance. `AIP_HEALTH_ROUTE` answers as `/health`.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{AppState, ClientKey};
use crate::args::Gcp;
use crate::error::ServerError;

/// Most instances one request may hold (llama-server's limit).
const MAX_INSTANCES: usize = 128;

/// The endpoints an instance may name, with the method each is called with. Where two paths
/// share an alias (`/v1/embeddings` and `/embeddings`), the first here takes it.
const ENDPOINTS: &[(&str, Method)] = &[
    ("/v1/chat/completions", Method::POST),
    ("/chat/completions", Method::POST),
    ("/v1/chat/completions/input_tokens", Method::POST),
    ("/chat/completions/input_tokens", Method::POST),
    ("/v1/completions", Method::POST),
    ("/completions", Method::POST),
    ("/completion", Method::POST),
    ("/v1/embeddings", Method::POST),
    ("/embeddings", Method::POST),
    ("/embedding", Method::POST),
    ("/v1/messages", Method::POST),
    ("/messages", Method::POST),
    ("/v1/messages/count_tokens", Method::POST),
    ("/messages/count_tokens", Method::POST),
    ("/v1/responses", Method::POST),
    ("/responses", Method::POST),
    ("/v1/responses/input_tokens", Method::POST),
    ("/responses/input_tokens", Method::POST),
    ("/tokenize", Method::POST),
    ("/detokenize", Method::POST),
    ("/apply-template", Method::POST),
    ("/health", Method::GET),
    ("/v1/health", Method::GET),
    ("/v1/models", Method::GET),
    ("/models", Method::GET),
    ("/props", Method::GET),
    ("/metrics", Method::GET),
    ("/slots", Method::GET),
    ("/cache", Method::GET),
];

/// Paths served otherwise that the predict route may not take (besides [`ENDPOINTS`]).
const OTHER_PATHS: &[&str] = &["/", "/cache/pin", "/cache/clear"];

/// Why `path` cannot be the predict route, if it is one of the server's own.
pub fn conflict(path: &str) -> Option<String> {
    let taken = ENDPOINTS.iter().any(|(p, _)| *p == path)
        || OTHER_PATHS.contains(&path)
        || [
            "/slots/",
            "/cache/pin/",
            "/responses/",
            "/v1/responses/",
            "/api/",
        ]
        .iter()
        .any(|p| path.starts_with(p));
    taken.then(|| format!("{path} is one of the server's own routes"))
}

/// llama-server's alias of a path: the `/v1` and the leading slash dropped, `/`, `-` and `_`
/// starting a capital (`/v1/chat/completions` is `chatCompletions`).
pub fn alias(path: &str) -> String {
    let p = path
        .strip_prefix("/v1")
        .filter(|p| !p.is_empty())
        .unwrap_or(path);
    let p = p.strip_prefix('/').unwrap_or(p);
    let mut out = String::with_capacity(p.len());
    let mut cap = false;
    for c in p.chars() {
        match c {
            ':' => break,
            '/' | '-' | '_' => cap = true,
            c if cap => {
                out.extend(c.to_uppercase());
                cap = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// The endpoint an instance's `@requestFormat` names: an alias or a path.
fn endpoint(format: &str) -> Option<&'static (&'static str, Method)> {
    ENDPOINTS
        .iter()
        .find(|(p, _)| alias(p) == format)
        .or_else(|| ENDPOINTS.iter().find(|(p, _)| *p == format))
}

/// Adds Vertex AI's routes to `routes` (every endpoint, under the prefix when there is one)
/// when prediction mode is on.
pub fn mount(
    routes: Router<Arc<AppState>>,
    st: &Arc<AppState>,
    prefix: &str,
) -> Router<Arc<AppState>> {
    let Some(gcp) = st.config.args.gcp.routes() else {
        return routes;
    };
    let inner = routes
        .clone()
        .layer(axum::extract::DefaultBodyLimit::max(st.config.max_body))
        .with_state(Arc::clone(st));
    let ctx = Arc::new((gcp, prefix.to_owned(), st.config.max_body, inner));
    routes.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let ctx = Arc::clone(&ctx);
            async move {
                let (gcp, prefix, limit, inner) = &*ctx;
                intercept(gcp, prefix, *limit, inner, req, next).await
            }
        },
    ))
}

/// Answers the predict and health routes; passes anything else on.
async fn intercept(
    gcp: &Gcp,
    prefix: &str,
    limit: usize,
    inner: &Router,
    req: Request,
    next: Next,
) -> Response {
    let Some(path) = req.uri().path().strip_prefix(prefix) else {
        return next.run(req).await;
    };
    if req.method() == Method::GET && gcp.health.as_deref() == Some(path) {
        return super::info::health().await.into_response();
    }
    if req.method() != Method::POST || path != gcp.predict {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let body = match to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => return ServerError::BodyTooLarge { limit }.into_response(),
    };
    let instances = match instances(&body) {
        Ok(i) => i,
        Err(message) => return ServerError::BadRequest(message).into_response(),
    };
    // Every instance starts at once; the predictions come back in the instances' order.
    let tasks: Vec<_> = instances
        .into_iter()
        .map(|instance| {
            let base = Base {
                headers: parts.headers.clone(),
                client: parts.extensions.get::<ClientKey>().copied(),
                prefix: prefix.to_owned(),
            };
            tokio::spawn(predict(inner.clone(), base, instance))
        })
        .collect();
    let mut predictions = Vec::with_capacity(tasks.len());
    for task in tasks {
        predictions.push(
            task.await
                .unwrap_or_else(|e| server_error(&format!("the instance's task failed: {e}"))),
        );
    }
    axum::Json(json!({ "predictions": predictions })).into_response()
}

/// The request's `instances`, or why the body is refused.
fn instances(body: &[u8]) -> Result<Vec<Value>, String> {
    let data: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(obj) = data.as_object() else {
        return Err("request body must be a JSON object".into());
    };
    let Some(instances) = obj.get("instances").and_then(Value::as_array) else {
        return Err("request body must include an array field named instances".into());
    };
    if instances.len() > MAX_INSTANCES {
        return Err(format!(
            "instances array exceeds maximum size of {MAX_INSTANCES}"
        ));
    }
    Ok(instances.clone())
}

/// What each instance's request takes from the predict request.
struct Base {
    headers: axum::http::HeaderMap,
    client: Option<ClientKey>,
    prefix: String,
}

/// An error prediction, as llama-server writes one.
fn bad_instance(message: &str) -> Value {
    ServerError::BadRequest(message.to_owned()).to_json()
}

fn server_error(message: &str) -> Value {
    json!({ "error": { "message": message, "type": "server_error", "code": 500 } })
}

/// One instance's prediction: its endpoint's answer.
async fn predict(inner: Router, base: Base, instance: Value) -> Value {
    let Value::Object(mut payload) = instance else {
        return bad_instance("each instance must be a JSON object");
    };
    let Some(format) = payload
        .remove("@requestFormat")
        .and_then(|f| f.as_str().map(str::to_owned))
    else {
        return bad_instance("each instance must include a string @requestFormat");
    };
    let Some((path, method)) = endpoint(&format) else {
        return bad_instance(&format!(
            "no handler registered for @requestFormat: {format}"
        ));
    };
    if payload.contains_key("stream") {
        payload.insert("stream".into(), Value::Bool(false));
    }
    let body = Value::Object(payload).to_string();
    let mut req = Request::new(Body::from(body));
    *req.method_mut() = method.clone();
    *req.headers_mut() = base.headers;
    req.headers_mut().remove(header::CONTENT_LENGTH);
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    match format!("{}{path}", base.prefix).parse() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(e) => return server_error(&format!("bad path: {e}")),
    }
    if let Some(client) = base.client {
        req.extensions_mut().insert(client);
    }
    let res = match inner.oneshot(req).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    let streamed = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if streamed {
        return bad_instance("predict route does not support streaming responses");
    }
    // The answer is taken whole, whatever its status: an error answer is the prediction.
    match to_bytes(res.into_body(), usize::MAX).await {
        Ok(b) if b.is_empty() => Value::Null,
        Ok(b) => serde_json::from_slice(&b)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&b).into_owned())),
        Err(e) => server_error(&format!("reading the answer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_llama_servers() {
        assert_eq!(alias("/v1/chat/completions"), "chatCompletions");
        assert_eq!(
            alias("/chat/completions/input_tokens"),
            "chatCompletionsInputTokens"
        );
        assert_eq!(alias("/apply-template"), "applyTemplate");
        assert_eq!(alias("/v1/models"), "models");
        assert_eq!(alias("/slots/:id"), "slots");
        assert_eq!(
            endpoint("chatCompletions").unwrap().0,
            "/v1/chat/completions"
        );
        assert_eq!(endpoint("embeddings").unwrap().0, "/v1/embeddings");
        assert_eq!(endpoint("/embeddings").unwrap().0, "/embeddings");
        assert!(endpoint("nothing").is_none());
        assert!(conflict("/predict").is_none());
        assert!(conflict("/completion").is_some());
        assert!(conflict("/slots/0").is_some());
    }
}
