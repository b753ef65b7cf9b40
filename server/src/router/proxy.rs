//! Passing a request on to a model's process and its reply back, streamed as it comes.

use axum::body::Body;
use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio_stream::StreamExt;

use super::pool::Lease;
use crate::error::ServerError;

/// The HTTP client the router reaches its processes with.
pub type HttpClient = Client<HttpConnector, Body>;

/// A client for loopback connections to the model processes.
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Headers that belong to one connection and are not passed on.
const HOP_BY_HOP: &[header::HeaderName] = &[
    header::CONNECTION,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::PROXY_AUTHORIZATION,
];

/// Sends `method uri` with `headers` and `body` to the process behind `lease` and answers with
/// its reply; the lease is held until the reply's body has been sent (or the client left).
pub async fn forward(
    client: &HttpClient,
    lease: Lease,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let target = format!("http://127.0.0.1:{}{path}", lease.port);
    let mut req = axum::http::Request::builder().method(method).uri(target);
    for (name, value) in headers {
        if !HOP_BY_HOP.contains(name) && name != header::CONTENT_LENGTH {
            req = req.header(name, value);
        }
    }
    let req = match req
        .header(header::CONTENT_LENGTH, HeaderValue::from(body.len()))
        .body(Body::from(body))
    {
        Ok(r) => r,
        Err(e) => return ServerError::BadRequest(format!("request: {e}")).into_response(),
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            return ServerError::ModelUnavailable(format!(
                "the model's process did not answer: {e}"
            ))
            .into_response()
        }
    };
    let (mut parts, incoming) = resp.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    let stream = incoming.into_data_stream().map(move |chunk| {
        // The lease goes with the stream: dropped when the body ends or the client leaves.
        let _held = &lease;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}
