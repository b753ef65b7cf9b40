//! The web page at `/` (unless `--no-ui`): one self-contained page that chats with the server
//! through its own `/v1/chat/completions`, streamed.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;

const PAGE: &str = include_str!("ui.html");

/// `GET /`.
pub async fn page(State(st): State<Arc<AppState>>) -> Response {
    if !st.config.ui {
        return super::not_found().await;
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        PAGE,
    )
        .into_response()
}
