//! The web page at `/` (unless `--no-ui`): a chat that streams through the server's own
//! `/v1/chat/completions`, lists the conversations the server kept (`/cache/conversations`)
//! and charts the prompt cache (`/cache`), asking for an API key when a call answers 401.
//!
//! One self-contained document: the markup, style and script (`ui/page.html`, `ui/app.css`,
//! `ui/app.js`) are joined at compile time, so the page needs no other request, no network
//! beyond the server, and finds the API next to itself under any `--api-prefix`. It holds no
//! secret and is served without a key; every call it makes is checked as any client's.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// The page: its markup with the style and the script put in their places.
const PAGE: &str = concat!(
    include_str!("ui/page.html"),
    "<style>\n",
    include_str!("ui/app.css"),
    "</style>\n<script>\n",
    include_str!("ui/app.js"),
    "</script>\n</body>\n</html>\n"
);

/// The page's routes (`GET /`), for any router state: the server's app merges them unless
/// `--no-ui`, and an app without [`super::AppState`] can merge them too.
pub(crate) fn assets<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/", get(page))
}

/// `GET /`.
async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        PAGE,
    )
}
