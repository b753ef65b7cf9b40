//! `/cors-proxy` (with `--ui-mcp-proxy`): llama-server's proxy through which its web page reaches
//! MCP servers that send no CORS headers. `GET` or `POST /cors-proxy?url=URL` fetches `URL` with
//! the request's body and only the headers the page names explicitly, as
//! `x-llama-server-proxy-header-NAME: VALUE` (sent as `NAME: VALUE`): the page's own cookies,
//! API key and proxy credentials never reach the target. `https` targets are checked against
//! the system's certificate roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

use crate::error::ServerError;

/// The prefix of the headers passed on, less the prefix.
const PREFIX: &str = "x-llama-server-proxy-header-";

/// The proxy's answer to `req`, or 403 when `enabled` is false; a body over `max_body` is 413.
pub async fn answer(enabled: bool, max_body: usize, req: Request) -> Response {
    if !enabled {
        let body =
            json!({"error": {"message": "this feature is disabled", "type": "feature_disabled"}});
        return (StatusCode::FORBIDDEN, Json(body)).into_response();
    }
    match fetch(max_body, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

#[derive(serde::Deserialize)]
struct UrlQuery {
    url: Option<String>,
}

async fn fetch(max_body: usize, req: Request) -> Result<Response, ServerError> {
    let (parts, body) = req.into_parts();
    if parts.method != Method::GET && parts.method != Method::POST {
        return Err(ServerError::BadRequest(
            "only GET and POST are proxied".into(),
        ));
    }
    let url = axum::extract::Query::<UrlQuery>::try_from_uri(&parts.uri)
        .ok()
        .and_then(|q| q.0.url)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ServerError::BadRequest("the url parameter is missing".into()))?;
    let target: axum::http::Uri = url
        .parse()
        .map_err(|e| ServerError::BadRequest(format!("url {url:?}: {e}")))?;
    match target.scheme_str() {
        Some("http" | "https") => {}
        other => {
            return Err(ServerError::BadRequest(format!(
                "unsupported URL scheme in target URL: {}",
                other.unwrap_or("none")
            )))
        }
    }
    if target.host().is_none_or(str::is_empty) {
        return Err(ServerError::BadRequest("the url has no host".into()));
    }
    if target.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(ServerError::BadRequest(
            "credentials in the url are refused".into(),
        ));
    }
    let body = axum::body::to_bytes(body, max_body)
        .await
        .map_err(|_| ServerError::BodyTooLarge { limit: max_body })?;
    let mut out = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(target);
    for (name, value) in &parts.headers {
        if let Some(n) = name.as_str().strip_prefix(PREFIX) {
            if let Ok(n) = HeaderName::from_bytes(n.as_bytes()) {
                out = out.header(n, value);
            }
        }
    }
    let out = out
        .header(header::CONTENT_LENGTH, HeaderValue::from(body.len()))
        .body(Body::from(body))
        .map_err(|e| ServerError::BadRequest(e.to_string()))?;
    let resp = client()?
        .request(out)
        .await
        .map_err(|e| ServerError::ModelUnavailable(format!("the target did not answer: {e}")))?;
    let (rparts, incoming) = resp.into_parts();
    let mut answer = Response::builder().status(rparts.status);
    for name in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(v) = rparts.headers.get(&name) {
            answer = answer.header(name, v);
        }
    }
    answer
        .body(Body::from_stream(incoming.into_data_stream()))
        .map_err(|e| ServerError::BadRequest(e.to_string()))
}

/// The proxy's HTTP and HTTPS client, built at its first use (the system's roots are read
/// once); why it could not be built, if it could not.
fn client() -> Result<&'static Client<HttpsConnector<HttpConnector>, Body>, ServerError> {
    static CLIENT: std::sync::OnceLock<
        Result<Client<HttpsConnector<HttpConnector>, Body>, String>,
    > = std::sync::OnceLock::new();
    let built = CLIENT.get_or_init(|| {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider)
            .map_err(|e| format!("no certificate roots for https targets: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Client::builder(TokioExecutor::new()).build(https))
    });
    built
        .as_ref()
        .map_err(|e| ServerError::Unsupported(e.clone()))
}
